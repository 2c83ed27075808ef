"""The ``-o`` formats the commands share and the versioned documents their JSON / YAML outputs are.

Owns: the choices ``table|json|yaml`` (each command may add its own, e.g. ``audit``'s ``html``), the
``apiVersion`` / ``kind`` that open every machine-readable document (so a consumer can tell a
``gpus`` output from a ``check`` output and notice a change of shape), and YAML written without
anchors (``&id001`` / ``*id001`` are valid YAML but unreadable and refused by some tools), and
the JSON text of every document (:func:`json_text`, :func:`json_chunks`: the standard library's
output, written by orjson). Must not decide what a document holds: each command builds its body.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import orjson
import yaml

#: The version of gpuguard's output documents; the audit report's (audit/report/assemble.py)
#: is the same, tests/cli/test_cli_startup.py keeps them equal.
API_VERSION = "gpuguard.io/v1alpha1"

#: The formats every command that prints a document accepts.
DOCUMENT_FORMATS = ("table", "json", "yaml")


def add_output(parser: argparse.ArgumentParser, *, extra: Sequence[str] = (),
               aliases: Mapping[str, str] | None = None) -> None:
    """Add ``-o/--output`` with :data:`DOCUMENT_FORMATS` plus ``extra``; ``aliases`` maps an
    older name to its format (``lint -o text`` is ``table``), accepted but not listed."""
    aliases = dict(aliases or {})
    formats = (*DOCUMENT_FORMATS, *extra)

    def choice(text: str) -> str:
        value = aliases.get(text, text)
        if value not in formats:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(map(repr, formats))})")
        return value

    # choices: what the parser lists (docs/commands/*.md are checked against it); the aliases
    # are turned into a format by ``choice`` before argparse compares.
    parser.add_argument("-o", "--output", type=choice, choices=formats, default="table",
                        metavar="FORMAT",
                        help=f"what to print on stdout: {'|'.join(formats)} (default table; "
                        "json and yaml are the same document)")


def versioned(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` opened by ``apiVersion: gpuguard.io/v1alpha1`` and ``kind``."""
    return {"apiVersion": API_VERSION, "kind": kind, **body}


class _NoAliases(yaml.SafeDumper):
    """A SafeDumper that writes a repeated object out again instead of as an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def yaml_documents(documents: Iterable[Mapping[str, Any]]) -> str:
    """``documents`` as one multi-document YAML text: keys in order, no anchors or aliases (a
    dict repeated across results is written out again: PyYAML's ``&id001`` / ``*id001`` are
    valid YAML but unreadable, and some tools refuse them)."""
    return yaml.dump_all([dict(d) for d in documents], Dumper=_NoAliases, sort_keys=False,
                         allow_unicode=True)


# What json.dumps' ensure_ascii escapes that orjson writes as it is: DEL and every character past
# ASCII (orjson already escapes the control characters as json.dumps does).
_NOT_ASCII = re.compile("[\x7f-\U0010ffff]")
# Floats below 1e-4 are the one number orjson spells otherwise than Python's repr (0.00001 and
# 1e-7 for 1e-05 and 1e-07): where the text may hold one, each float outside a string is
# written as json.dumps writes it (rare: a report's figures are rounded).
_SMALL_FLOAT = re.compile(r"\de-|0\.0000")
_NUMBER_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?[eE][-+]?\d+|-?\d+\.\d+')
CHUNK_CHARS = 1 << 16
"""About how many characters each piece of :func:`json_chunks` holds."""


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as json.dumps writes a character past the BMP
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def json_text(value: Any, *, indent: bool = True) -> str:
    r"""``value`` as JSON text: what ``json.dumps(value, indent=2)`` writes (``indent=False``:
    ``separators=(",", ":")``), ASCII only, written by orjson.

    The standard library indents in Python, ~250 instructions a byte under callgrind (a
    6,000-pod audit report: 257 M); orjson writes the same text in 9 M, and its non-ASCII
    characters are escaped here as json.dumps escapes them (``\u2026``; a character past the
    BMP as a surrogate pair). What orjson does not take (a key that is not a string, an int past
    64 bits, a lone surrogate, nesting past 255 levels) goes to json.dumps, which writes it as
    before. Floats below 1e-4, which orjson spells otherwise (``0.00001``, ``1e-7``), are
    rewritten as Python's repr spells them (``1e-05``, ``1e-07``). One value differs: NaN or an
    infinity, which JSON cannot spell, is ``null`` (json.dumps wrote ``NaN``, which JSON parsers
    refuse).

    Raises:
        TypeError: a value neither writes (a set, an object of another class).
    """
    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, indent=2) if indent else json.dumps(value, separators=(",", ":"))
    if not text.isascii() or "\x7f" in text:
        text = _NOT_ASCII.sub(_escaped, text)
    if _SMALL_FLOAT.search(text):
        text = _NUMBER_OR_STRING.sub(_python_float, text)
    return text


def _python_float(match: re.Match[str]) -> str:
    token = match.group()
    return token if token[0] == '"' else repr(float(token))


def json_chunks(document: Mapping[str, Any], *, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """``json_text(document, indent=False)`` in pieces of about ``chunk_chars`` characters: the
    lists directly under the top level are written element by element, so a large report (a
    million pods) is never held as one text; joined, the pieces are that text.

    Raises:
        TypeError: as :func:`json_text`.
    """
    if any(type(key) is not str for key in document):  # rare: json.dumps decides those keys
        yield json_text(document, indent=False)
        return
    parts, held = ["{"], 1
    for number, (key, value) in enumerate(document.items()):
        parts.append(("," if number else "") + json_text(key, indent=False) + ":")
        if type(value) is list and value:
            parts.append("[")
            for index, item in enumerate(value):
                text = json_text(item, indent=False)
                parts.append("," + text if index else text)
                held += len(text)
                if held >= chunk_chars:
                    yield "".join(parts)
                    parts, held = [], 0
            parts.append("]")
        else:
            text = json_text(value, indent=False)
            parts.append(text)
            held += len(text)
        if held >= chunk_chars:
            yield "".join(parts)
            parts, held = [], 0
    parts.append("}")
    yield "".join(parts)


def write(document: Mapping[str, Any], output: str, stream: TextIO) -> None:
    """Write ``document`` as ``output`` (``json``: indented, one write, see :func:`json_text`;
    ``yaml``: block style, keys in order, no anchors). Raises ValueError for any other
    format."""
    if output == "json":
        stream.write(json_text(document) + "\n")
    elif output == "yaml":
        yaml.dump(dict(document), stream, Dumper=_NoAliases, sort_keys=False,
                  allow_unicode=True)
    else:
        raise ValueError(f"not a document format: {output!r}")
