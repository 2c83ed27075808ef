"""The pure core's only file reader: Kubernetes objects from YAML / JSON files, and package data.

Owns turning paths into parsed documents: multi-document YAML (``---``), JSON, ``kind: List``
(``kubectl get -o yaml`` output), directories (sorted, ``.yaml`` / ``.yml`` / ``.json`` and their
``.gz`` forms), ``-`` for standard input, and the YAML files shipped inside the package
(:func:`load_package_yaml`). A bad document never hides the good ones: each problem becomes a
:class:`LoadError` that names the file, the document index (0-based) and, for YAML syntax errors,
the line, and reading goes on with the next document.

Must not interpret objects (GPU facts, policies): it only parses. YAML is read with the safe loader
only.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import yaml

try:  # libyaml's loader is ~10x faster; fall back to pure Python where it is missing.
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

_SUFFIXES = (".yaml", ".yml", ".json")
_SEPARATOR = re.compile(r"^(?:---|\.\.\.)(?:[ \t].*)?$")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters escaped (a newline becomes a visible backslash-n)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


@dataclass(frozen=True)
class Document:
    """One parsed Kubernetes object and where it came from.

    Attributes:
        source: the file path as given (``-`` for standard input).
        index: 0-based index of the YAML document in the file (JSON files have one, index 0).
        item: index inside ``items`` when the document was a ``kind: List``; else None.
        body: the parsed object (a mapping with at least ``kind``).
    """

    source: str
    index: int
    item: int | None
    body: dict[str, Any]
    lines: Mapping[str, int] | None = None

    def line_of(self, path: str) -> int | None:
        """1-based line of a field path (``spec.validations[2].expression``).

        Falls back to the nearest parent that has one; None when lines were not recorded.
        """
        if self.lines is None:
            return None
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[: max(path.rfind("."), path.rfind("["), 0)]
        return self.lines.get("")

    @property
    def location(self) -> str:
        """``file: document N`` (plus ``items[M]`` for List members), for messages."""
        where = f"{self.source}: document {self.index}"
        return where if self.item is None else f"{where} items[{self.item}]"


@dataclass(frozen=True)
class LoadError:
    """A document (or whole file) that could not be read; ``str()`` gives the one-line message."""

    source: str
    index: int | None
    message: str

    def __str__(self) -> str:
        """Render as ``file: document N: message`` (or ``file: message`` for whole-file errors).

        Control characters (a newline in a file name) are escaped: one error, one line.
        """
        source = printable(self.source)
        if self.index is None:
            return f"{source}: {printable(self.message)}"
        return f"{source}: document {self.index}: {printable(self.message)}"


def _os_error(exc: OSError) -> str:
    """An OSError in words, without Python's repr of the path (the caller names the file)."""
    return exc.strerror or type(exc).__name__


def _walk(root: str) -> Iterator[str | LoadError]:
    """Manifest files under a directory, sorted; unreadable directories and broken links are
    reported, never skipped silently."""
    errors: list[LoadError] = []
    found: list[str] = []

    def report(exc: OSError) -> None:
        errors.append(LoadError(exc.filename or root, None, f"cannot read: {_os_error(exc)}"))

    for directory, _, files in os.walk(root, onerror=report):
        for name in files:
            child = os.path.join(directory, name)
            if not name.lower().removesuffix(".gz").endswith(_SUFFIXES):
                continue
            if os.path.islink(child) and not os.path.exists(child):
                errors.append(LoadError(child, None, "broken symbolic link (its target is "
                                                     "missing or a link loop)"))
            else:
                found.append(child)
    yield from sorted(found)
    yield from errors


def iter_paths(paths: Sequence[str]) -> Iterator[str | LoadError]:
    """Expand files and directories into the files to read, in a stable (sorted) order.

    Yields:
        Each file path (``-`` passes through), or a LoadError for a path that cannot be read
        (missing, unreadable, a broken link, not a regular file, an empty path).
    """
    for raw in paths:
        if raw == "-":
            yield raw
            continue
        if not raw:
            yield LoadError("''", None, "empty path (expected a file, a directory or -)")
            continue
        try:
            mode = os.stat(raw).st_mode
        except OSError as exc:
            yield LoadError(raw, None, _os_error(exc).lower())
            continue
        if stat.S_ISDIR(mode):
            yield from _walk(raw)
        elif stat.S_ISREG(mode):
            yield raw
        else:
            yield LoadError(raw, None, "not a regular file or directory")


MAX_DECOMPRESSED = 1 << 30  # bytes; a gzip bomb beyond this is refused, not expanded
_GZIP_MAGIC = b"\x1f\x8b"


def _gunzip(raw: bytes) -> bytes:
    """Decompress gzip data, refusing more than :data:`MAX_DECOMPRESSED` bytes.

    Raises:
        OSError: corrupt data, or output over the limit.
    """
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
        while chunk := stream.read(1 << 20):
            out += chunk
            if len(out) > MAX_DECOMPRESSED:
                raise OSError(0, f"decompresses to more than {MAX_DECOMPRESSED >> 20} MiB")
    return bytes(out)


def read_text(source: str, stdin: BinaryIO | TextIO | None = None) -> str:
    """Read one file (or ``-``, standard input) as UTF-8 text; gzip data is decompressed.

    Raises:
        OSError: the file cannot be opened or read, standard input is closed, or the gzip stream
            is corrupt or too large.
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    if source == "-":
        stream = stdin if stdin is not None else sys.stdin
        if stream is None or stream.closed:
            raise OSError(0, "standard input is closed")
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
        raw = data.encode("utf-8") if isinstance(data, str) else data
    else:
        raw = Path(source).read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(raw)
    return raw.decode("utf-8-sig")


def _split_yaml(text: str) -> Iterator[tuple[int, str]]:
    """Split a multi-document YAML stream into (first line number, chunk) at ``---`` lines.

    Splitting before parsing lets one broken document be reported while the others still load.
    """
    start, lines = 1, []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if _SEPARATOR.match(line.rstrip("\r\n")):
            yield start, "".join(lines)
            start, lines = number + 1, []
            # ``--- {a: 1}`` carries content on the separator line itself.
            rest = line[3:].strip()
            if line.startswith("---") and rest and not rest.startswith("#"):
                lines.append(rest + "\n")
                start = number
        else:
            lines.append(line)
    yield start, "".join(lines)


def _line_map(chunk: str, first_line: int) -> dict[str, int]:
    """Field path -> 1-based line of every node of one YAML document (for error locations)."""
    lines: dict[str, int] = {}
    root = yaml.compose(chunk, Loader=_Loader)
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, node = stack.pop()
        if node is None:
            continue
        lines.setdefault(path, first_line + node.start_mark.line)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value)
                child = f"{path}.{name}" if path else name
                lines[child] = first_line + key.start_mark.line
                stack.append((child, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(node.value))
    return lines


def parse_text(
    source: str, text: str, *, with_lines: bool = False
) -> Iterator[tuple[int, Any, dict[str, int] | None] | LoadError]:
    """Parse YAML or JSON text into documents; empty documents are skipped.

    Args:
        with_lines: also map each field path to its line (policy files; costs a second parse).

    Yields:
        ``(index, value, lines)`` for each non-empty document, or a LoadError naming the document
        and line.
    """
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            value = json.loads(text)
            yield 0, value, (_line_map(text, 1) if with_lines else None)
            return
        except json.JSONDecodeError as exc:
            # Flow-style YAML also starts with '{': only a .json file is judged as JSON alone.
            if source.endswith((".json", ".json.gz")):
                yield LoadError(
                    source, 0, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
                )
                return
        except RecursionError:
            yield LoadError(source, 0, "JSON nested too deeply")
            return
    index = -1
    for first_line, chunk in _split_yaml(text):
        # Comment-only chunks (a header before the first ``---``, a trailing ``---``) are not
        # documents, so they do not shift the index users count by.
        if all(not ln.strip() or ln.lstrip().startswith("#") for ln in chunk.splitlines()):
            continue
        index += 1
        try:
            value = yaml.load(chunk, Loader=_Loader)
        except yaml.MarkedYAMLError as exc:
            # The context mark is where the broken construct starts (an unclosed '['); the
            # problem mark is where the parser gave up, often the next document's '---'.
            mark = exc.context_mark or exc.problem_mark
            line = f" at line {first_line + mark.line}" if mark is not None else ""
            problem = "; ".join(filter(None, (exc.context, exc.problem))) or str(exc)
            yield LoadError(source, index, f"invalid YAML{line}: {problem}")
            continue
        except (yaml.YAMLError, RecursionError) as exc:
            yield LoadError(source, index, f"invalid YAML: {exc}")
            continue
        if value is not None:
            yield index, value, (_line_map(chunk, first_line) if with_lines else None)


def _objects(
    source: str, index: int, value: Any, lines: dict[str, int] | None
) -> Iterator[Document | LoadError]:
    """Turn one parsed document into Documents, expanding ``kind: List`` items."""
    if not isinstance(value, dict):
        yield LoadError(
            source, index,
            f"expected a Kubernetes object (a mapping with apiVersion and kind), got "
            f"{type(value).__name__}",
        )
        return
    kind = value.get("kind")
    if isinstance(kind, Mapping) and "operation" in value and "uid" in value:
        # A bare AdmissionRequest (as webhook test fixtures store them): wrap it in its envelope.
        value = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": value}
        kind = "AdmissionReview"
    if not isinstance(kind, str) or not kind:
        yield LoadError(source, index, "object has no kind (expected e.g. kind: Pod)")
        return
    if kind == "List" or (kind.endswith("List") and isinstance(value.get("items"), list)):
        items = value.get("items")
        if not isinstance(items, list):
            yield LoadError(source, index, "kind: List without an items list")
            return
        for number, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
                yield LoadError(source, index, f"items[{number}] has no kind")
                continue
            if item.get("kind") == "List":  # a List inside a List: its items are objects too
                for nested in _objects(source, index, item, None):
                    yield nested if isinstance(nested, LoadError) else Document(
                        source, index, number, nested.body)
                continue
            yield Document(source, index, number, item)
        return
    yield Document(source, index, None, value, lines)


def iter_documents(
    paths: Sequence[str], stdin: TextIO | None = None, *, with_lines: bool = False
) -> Iterator[Document | LoadError]:
    """Stream every Kubernetes object found under ``paths``, one file in memory at a time.

    Args:
        paths: files, directories or ``-``.
        stdin: stream read for ``-`` (defaults to ``sys.stdin``).

    Yields:
        Documents in file order, and a LoadError for each unreadable file or document.
    """
    for entry in iter_paths(paths):
        if isinstance(entry, LoadError):
            yield entry
            continue
        try:
            text = read_text(entry, stdin)
        except UnicodeDecodeError as exc:
            yield LoadError(entry, None, f"not UTF-8 text (byte offset {exc.start})")
            continue
        except (OSError, EOFError) as exc:
            reason = _os_error(exc) if isinstance(exc, OSError) else "truncated gzip data"
            yield LoadError(entry, None, f"cannot read: {reason}")
            continue
        except (gzip.BadGzipFile, zlib.error) as exc:
            yield LoadError(entry, None, f"cannot read: corrupt gzip data ({exc})")
            continue
        for parsed in parse_text(entry, text, with_lines=with_lines):
            if isinstance(parsed, LoadError):
                yield parsed
            else:
                yield from _objects(entry, *parsed)


def read_documents(
    paths: Sequence[str], stdin: TextIO | None = None, *, with_lines: bool = False
) -> tuple[list[Document], list[LoadError]]:
    """Read everything under ``paths``; see :func:`iter_documents`.

    Returns:
        ``(documents, errors)``, both in file order.
    """
    documents: list[Document] = []
    errors: list[LoadError] = []
    for entry in iter_documents(paths, stdin, with_lines=with_lines):
        (errors if isinstance(entry, LoadError) else documents).append(entry)  # type: ignore[arg-type]
    return documents, errors


def library_path() -> str:
    """The directory of the built-in policy library shipped in the package."""
    return str(resources.files("policies.library"))


def load_package_yaml(package: str, name: str) -> Any:
    """Load one YAML file shipped inside a package (e.g. ``policies.data``, ``mig_profiles.yaml``).

    Raises:
        FileNotFoundError: the file is not in the installed package.
        yaml.YAMLError: the shipped file is malformed (a packaging bug).
    """
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return yaml.load(text, Loader=_Loader)
