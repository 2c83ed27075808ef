"""Snapshot files as a stream of objects, with flat memory for huge ``kubectl get -A`` output.

Owns reading what ``kubectl get … -A -o yaml|json`` writes (a ``kind: List``), multi-document YAML,
directories and ``.gz`` files, one object at a time. Small files go through
:func:`policies.sources.iter_documents` (the core's reader, same messages as ``gpuguard gpus``).
Files above ``stream_above`` bytes are parsed item by item so that a 100k-pod List never sits in
memory as one parsed tree, and so are files above :data:`policies.sources.EXACT_LIMIT` (1 MiB),
in their place among the small ones (orjson decodes their items; a whole file of that size would
go to the standard library, see ``load_json``):

- JSON: the top-level object is walked key by key with :meth:`json.JSONDecoder.raw_decode` over a
  sliding buffer; each element of ``items`` is decoded, yielded and dropped.
- YAML: the block sequence under a top-level ``items:`` key is split at its ``- `` entries (the
  layout kubectl and every YAML emitter write), and each entry is loaded with
  :func:`policies.sources.load_yaml` (the safe loader, alias bombs refused).

Every problem becomes a :class:`~policies.sources.LoadError` naming the file, the document and the
item (``file: document 0: items[12]: …``); reading continues with the next item (a JSON item with
a key given twice is complete and skipped alone; after a JSON syntax error the next item cannot be
found, and the error says that it and every item after it were not read).

Must not interpret objects.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import struct
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import yaml

from policies.sources import (
    EXACT_LIMIT,
    Document,
    DuplicateJSONKeyError,
    LoadError,
    decode_json_value,
    iter_documents,
    iter_paths,
    load_yaml,
    yaml_problem,
)
from policies.value_words import described

_CHUNK = 1 << 20  # characters read at a time
_MAX_VALUE = 64 << 20  # characters one JSON value may span before it is declared broken
_WS = re.compile(r"[ \t\r\n]*")
_SEPARATOR = re.compile(r"^(?:---|\.\.\.)(?:[ \t].*)?$")
_ITEMS_KEY = re.compile(r"^items:[ \t]*(?:#.*)?$")


def _size(path: str) -> int:
    """Bytes the file holds once decompressed (gzip's ISIZE trailer; 0 when unknown, and for a
    stream such as ``/dev/stdin`` or a pipe: peeking at it would consume what it holds)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return 0
        with open(path, "rb") as handle:
            if handle.read(2) != b"\x1f\x8b":
                handle.seek(0, os.SEEK_END)
                return handle.tell()
            handle.seek(-4, os.SEEK_END)
            return int(struct.unpack("<I", handle.read(4))[0])
    except OSError:
        return 0  # the core reader reports it


def _open_text(path: str) -> TextIO:
    """The file as UTF-8 text (a byte-order mark dropped), decompressing gzip on the fly."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the TextIOWrapper
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8-sig")
    return io.TextIOWrapper(raw, encoding="utf-8-sig")


def iter_snapshot(paths: Sequence[str], *,
                  stream_above: int = 8 << 20) -> Iterator[Document | LoadError]:
    """Every object under ``paths`` (files, directories, ``-``), streamed; see module docstring.

    Yields:
        Documents in file order — except that files streamed item by item come after the
        others — (List members with ``item`` set), and a LoadError for each unreadable file,
        document or item.
    """
    entries = list(iter_paths(paths))
    sizes = {e: _size(e) for e in entries if isinstance(e, str) and e != "-"}
    # Small files first (stable): Namespaces, Nodes and controllers are then known before the
    # big pod lists stream, so pods need not be kept for later.
    for entry in sorted(entries, key=lambda e: 0 if isinstance(e, LoadError) or e == "-"
                        or sizes[e] <= stream_above else 1):
        if isinstance(entry, LoadError):
            yield entry
        elif entry == "-" or sizes[entry] <= min(stream_above, EXACT_LIMIT):
            yield from iter_documents([entry])
        else:
            # in its place in the order; above EXACT_LIMIT, orjson decodes items, not the file
            yield from _stream(entry)


def _stream(path: str) -> Iterator[Document | LoadError]:
    try:
        with _open_text(path) as text:
            head = text.read(_CHUNK)
            if head.lstrip()[:1] in ("{", "["):
                yield from _JsonStream(path, text, head).objects()
            else:
                yield from _yaml_stream(path, text, head)
    except UnicodeDecodeError as exc:
        yield LoadError(path, None, f"not UTF-8 text (byte offset {exc.start})")
    except (EOFError, gzip.BadGzipFile) as exc:
        yield LoadError(path, None, f"cannot read: corrupt gzip data ({exc or 'truncated'})")
    except OSError as exc:
        yield LoadError(path, None, f"cannot read: {exc.strerror or type(exc).__name__}")


def _members(path: str, index: int, number: int, item: Any) -> Iterator[Document | LoadError]:
    """One ``items`` element as Documents (a nested List expands, like the core reader)."""
    if not isinstance(item, dict) or not isinstance(item.get("kind"), str) or not item["kind"]:
        yield LoadError(path, index, f"items[{number}] has no kind")
    elif item["kind"] == "List" and isinstance(item.get("items"), list):
        for nested in item["items"]:
            if isinstance(nested, dict) and isinstance(nested.get("kind"), str):
                yield Document(path, index, number, nested)
            else:
                yield LoadError(path, index, f"items[{number}] has an item without kind")
    else:
        yield Document(path, index, number, item)


def _whole(path: str, index: int, value: Any) -> Iterator[Document | LoadError]:
    """A document that was not streamed (no ``items``), as the core reader would give it."""
    if not isinstance(value, dict):
        yield LoadError(path, index, "expected a Kubernetes object (a mapping with apiVersion "
                        f"and kind), got {described(value)}")
    elif not isinstance(value.get("kind"), str) or not value["kind"]:
        yield LoadError(path, index, "object has no kind (expected e.g. kind: Pod)")
    else:
        yield Document(path, index, None, value)


class _BrokenJson(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RefusedValue(_BrokenJson):
    """A complete JSON value that is refused (a key given twice); reading can go on at
    ``end``."""

    def __init__(self, message: str, end: int) -> None:
        super().__init__(message)
        self.end = end


_PLAIN_JSON = json.JSONDecoder()  # finds where a refused value ends (it keeps the last key)


class _JsonStream:
    """Walks one JSON document over a sliding text buffer (see module docstring)."""

    def __init__(self, path: str, text: TextIO, head: str) -> None:
        self.path = path
        self.text = text
        self.buf = head
        self.pos = 0
        self.eof = False
        self.line = 1  # line number of buf[0]

    def _fill(self) -> bool:
        """Read more text; False at the end of the file."""
        if self.eof:
            return False
        chunk = self.text.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.line += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def _where(self, pos: int) -> str:
        line = self.line + self.buf.count("\n", 0, pos)
        column = pos - (self.buf.rfind("\n", 0, pos) + 1) + 1
        return f"line {line} column {column}"

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self._fill():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, char: str) -> None:
        """Consume ``char`` (after blanks) or raise _BrokenJson."""
        if self.peek() != char:
            found = self.buf[self.pos:self.pos + 1] or "end of file"
            raise _BrokenJson(f"invalid JSON at {self._where(self.pos)}: expected "
                              f"{char!r}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the next JSON value, reading more text until it is complete."""
        self.peek()
        while True:
            try:
                value, end = decode_json_value(self.buf, self.pos)
            except DuplicateJSONKeyError as exc:  # refused; the text after it may still be read
                message = (f"invalid JSON at {self._where(exc.pos)}: duplicate key {exc.key!r} "
                           f"(first at {self._where(exc.first_pos)})")
                try:
                    end = _PLAIN_JSON.raw_decode(self.buf, self.pos)[1]
                except json.JSONDecodeError:  # cut by the buffer's end, or broken further on
                    if len(self.buf) - self.pos < _MAX_VALUE and self._fill():
                        continue
                    raise _BrokenJson(message) from None
                raise _RefusedValue(message, end) from None
            except json.JSONDecodeError as exc:
                if len(self.buf) - self.pos < _MAX_VALUE and self._fill():
                    continue
                raise _BrokenJson(f"invalid JSON at {self._where(exc.pos)}: {exc.msg}") from None
            except RecursionError:
                raise _BrokenJson("JSON nested too deeply") from None
            if end >= len(self.buf) and self._fill():
                continue  # a number cut by the buffer's end: decode it whole
            self.pos = end
            return value

    def objects(self) -> Iterator[Document | LoadError]:
        """The document's objects: ``items`` one by one, or the whole object."""
        body: dict[str, Any] = {}
        first: dict[str, str] = {}  # key -> where it was, for a key given twice
        streamed = False
        try:
            if self.peek() != "{":
                yield from _whole(self.path, 0, self.value())
                return
            self.pos += 1
            if self.peek() == "}":
                self.pos += 1
            else:
                while True:
                    self.peek()
                    where = self._where(self.pos)
                    key = self.value()
                    if not isinstance(key, str):
                        raise _BrokenJson(f"invalid JSON at {self._where(self.pos)}: object "
                                          "keys must be strings")
                    if key in first:
                        raise _BrokenJson(f"invalid JSON at {where}: duplicate key {key!r} "
                                          f"(first at {first[key]})")
                    first[key] = where
                    self.expect(":")
                    if key == "items" and self.peek() == "[":
                        streamed = True
                        yield from self._items()
                    else:
                        body[key] = self.value()
                    separator = self.peek()
                    self.pos += 1
                    if separator == "}":
                        break
                    if separator != ",":
                        raise _BrokenJson(f"invalid JSON at {self._where(self.pos - 1)}: "
                                          "expected ',' or '}'")
            if self.peek():
                raise _BrokenJson(f"invalid JSON at {self._where(self.pos)}: extra data after "
                                  "the object")
        except _BrokenJson as exc:
            yield LoadError(self.path, 0, exc.message)
            return
        if not streamed:
            yield from _whole(self.path, 0, body)

    def _items(self) -> Iterator[Document | LoadError]:
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        number = 0
        while True:
            try:
                item = self.value()
            except _RefusedValue as exc:
                yield LoadError(self.path, 0, f"items[{number}]: {exc.message}")
                self.pos = exc.end
            except _BrokenJson as exc:  # where the next item starts is unknown: say what is lost
                raise _BrokenJson(f"items[{number}]: {exc.message}; it and every item after it "
                                  "were not read") from None
            else:
                yield from _members(self.path, 0, number, item)
            number += 1
            separator = self.peek()
            self.pos += 1
            if separator == "]":
                return
            if separator != ",":
                raise _BrokenJson(f"invalid JSON at {self._where(self.pos - 1)}: expected ',' "
                                  f"or ']' after items[{number - 1}]; the items after it were "
                                  "not read")


def _yaml_error(exc: yaml.YAMLError, first_line: int, text: str | None = None) -> str:
    line, problem = yaml_problem(exc, first_line, text)
    return f"invalid YAML{f' at line {line}' if line is not None else ''}: {problem}"


class _YamlDocument:
    """One YAML document read line by line; the entries of a top-level ``items:`` are split."""

    def __init__(self, path: str, index: int) -> None:
        self.path = path
        self.index = index
        self.header: list[str] = []
        self.header_line = 0
        self.state = "header"  # header -> items -> after
        self.indent: int | None = None
        self.item: list[str] = []
        self.item_line = 0
        self.count = 0
        self.streamed = False

    def feed(self, number: int, line: str) -> Iterator[Document | LoadError]:
        """Take one line (without its newline); yield the items it completes."""
        if self.state == "items":
            stripped = line.lstrip(" ")
            indent = len(line) - len(stripped)
            if not stripped.strip() or stripped.startswith("#"):
                if self.item:
                    self.item.append(line)
                return
            entry = stripped.startswith("- ") or stripped.rstrip() == "-"
            if self.indent is None and entry:
                self.indent = indent
            if self.indent is not None and indent == self.indent and entry:
                yield from self.flush()
                self.item = [" " * (indent + 2) + stripped[2:]]
                self.item_line = number
                return
            if self.indent is not None and indent > self.indent:
                self.item.append(line)
                return
            yield from self.flush()
            self.state = "after"
        if self.state == "header" and _ITEMS_KEY.match(line):
            self.state = "items"
            self.streamed = True
            return
        if not self.header:
            self.header_line = number
        self.header.append(line)

    def flush(self) -> Iterator[Document | LoadError]:
        """Parse the item collected so far."""
        if not self.item:
            return
        cut = (self.indent or 0) + 2
        text = "\n".join(ln[cut:] if ln[:cut].strip() == "" else ln.lstrip() for ln in self.item)
        self.item = []
        number = self.count
        self.count += 1
        try:
            value = load_yaml(text)
        except (yaml.YAMLError, RecursionError) as exc:
            detail = _yaml_error(exc, self.item_line, text) if isinstance(exc, yaml.YAMLError) \
                else "invalid YAML: nested too deeply"
            if "undefined alias" in detail:
                detail += " (an anchor shared between List items: large files are read item " \
                          "by item, so each item must stand alone, as kubectl writes them)"
            yield LoadError(self.path, self.index, f"items[{number}]: {detail}")
            return
        yield from _members(self.path, self.index, number, value)

    def finish(self) -> Iterator[Document | LoadError]:
        """End of the document: the last item, then the rest (the whole object if no items)."""
        yield from self.flush()
        if self.streamed or not any(ln.strip() and not ln.lstrip().startswith("#")
                                    for ln in self.header):
            return
        header = "\n".join(self.header)
        try:
            value = load_yaml(header)
        except (yaml.YAMLError, RecursionError) as exc:
            detail = _yaml_error(exc, self.header_line, header) if isinstance(exc, yaml.YAMLError) \
                else "invalid YAML: nested too deeply"
            yield LoadError(self.path, self.index, detail)
            return
        if value is None:
            return
        if isinstance(value, dict) and isinstance(value.get("items"), list) and \
                str(value.get("kind", "")).endswith("List"):
            for number, item in enumerate(value["items"]):
                yield from _members(self.path, self.index, number, item)
            return
        yield from _whole(self.path, self.index, value)

    @property
    def empty(self) -> bool:
        """Nothing but blanks and comments so far (not a document: it takes no index)."""
        return not self.streamed and all(not ln.strip() or ln.lstrip().startswith("#")
                                         for ln in self.header)


def _yaml_stream(path: str, text: TextIO, head: str) -> Iterator[Document | LoadError]:
    index = 0
    document = _YamlDocument(path, index)
    pending = head
    number = 0
    while True:
        lines = pending.split("\n")
        chunk = text.read(_CHUNK)
        if chunk:
            pending = lines.pop()  # the last line may continue in the next chunk
        for line in lines:
            number += 1
            line = line.removesuffix("\r")
            if _SEPARATOR.match(line):
                if not document.empty:
                    yield from document.finish()
                    index += 1
                document = _YamlDocument(path, index)
                rest = line[3:].strip()
                if line.startswith("---") and rest and not rest.startswith("#"):
                    yield from document.feed(number, rest)
                continue
            yield from document.feed(number, line)
        if not chunk:
            break
        pending += chunk
    if not document.empty:
        yield from document.finish()
