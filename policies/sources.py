"""The pure core's only file reader: Kubernetes objects from YAML / JSON files, and package data.

Owns turning paths into parsed documents: multi-document YAML (``---``), JSON, ``kind: List``
(``kubectl get -o yaml`` output), directories (sorted, ``.yaml`` / ``.yml`` / ``.json`` and their
``.gz`` forms), ``-`` for standard input, and the YAML files shipped inside the package
(:func:`load_package_yaml`). A bad document never hides the good ones: each problem becomes a
:class:`LoadError` that names the file, the document index (0-based) and, for YAML syntax errors,
the line, and reading goes on with the next document.

YAML is read with the safe loader only, and every YAML document goes through :func:`load_yaml`,
which refuses alias bombs before anything walks the result. PyYAML shares an aliased node instead of
copying it, so a few hundred bytes (9 anchors, each a list of 9 aliases of the previous one) load
at once into a value whose expansion has 9^9 nodes; everything that walks it afterwards (GPU facts,
CEL conversion, JSON) is exponential. A document is refused when its aliases add more than
:data:`ALIAS_RATIO` (100) nodes per node written in it, or more than :data:`MAX_ALIAS_NODES`
(1,000,000) in all. The ratio keeps the work linear in the input size however many small documents
or files an input holds; the cap bounds one large document (a million nodes take about a second to
walk). Ordinary anchors (a shared ``env`` or ``resources`` block) add a few nodes per node written.
The error names the file, the document and the line of the alias where the bound is crossed. A
recursive alias (one inside the node it names) is refused too: Kubernetes objects are trees.
go-yaml, which kubectl uses, has a similar guard ("document contains excessive aliasing": alias
expansion may be at most 99% of a small document's decoded nodes and about 400,000 in a large one).

Must not interpret objects (GPU facts, policies): it only parses.
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



class _LocatingLoader(_Loader):  # type: ignore[misc, valid-type]
    """The safe loader, naming the node whose scalar cannot be converted (slow: errors only)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Construct ``node``; a ValueError (a timestamp like 2026-13-45, ``!!float abc``, an int
        of more than 4300 digits) becomes a ConstructorError marked at the node."""
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, _unconvertible(node, exc), node.start_mark) from None


def _unconvertible(node: yaml.Node, exc: ValueError) -> str:
    """Why a scalar cannot be converted, in words (not Python's advice to raise a limit)."""
    tag = str(node.tag).rsplit(":", 1)[-1]
    value = str(node.value) if isinstance(node, yaml.ScalarNode) else ""
    if "integer string conversion" in str(exc):
        return f"a number with more than {sys.get_int_max_str_digits()} digits"
    return f"cannot read {shortened(value)!r} as a {tag} ({exc})"


_SUFFIXES = (".yaml", ".yml", ".json")
_SEPARATOR = re.compile(r"^(?:---|\.\.\.)(?:[ \t].*)?$")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shortened(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters with ``...``: a value quoted in a message (a
    5000-digit label, an object fragment) stays readable."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


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


MAX_ALIAS_NODES = 1_000_000
"""The most nodes aliases may add to one YAML document (see the module docstring)."""
ALIAS_RATIO = 100
"""The most nodes aliases may add to a YAML document per node written in it."""


class AliasExpansionError(yaml.MarkedYAMLError):
    """A YAML document whose aliases expand too far (an alias bomb) or into themselves.

    A :class:`yaml.MarkedYAMLError`, so it is reported like any other YAML error: ``problem``
    says what, ``problem_mark`` is the offending alias (0-based line in the text given).
    """


def _check_aliases(text: str) -> None:
    """Refuse ``text`` (one YAML document) when its aliases expand past the bound.

    Walks the parser's events once, without building anything: each anchored node's expanded
    size is remembered by anchor name, so an alias costs one addition (linear time whatever the
    expansion). Sizes saturate just above :data:`MAX_ALIAS_NODES`, keeping the sums small ints.

    Raises:
        AliasExpansionError: at the alias where the nodes added cross the allowed number, or at
            an alias inside the node it names.
        yaml.YAMLError: the text does not parse (the same error the loader would raise).
    """
    saturated = MAX_ALIAS_NODES + 1
    sizes: dict[str, int] = {}  # anchor -> nodes of its node, aliases expanded
    stack: list[list[Any]] = []  # open collections: [anchor, expanded nodes so far]
    opened: set[str] = set()  # anchors of the open collections
    written = 0  # nodes in the text (aliases excluded)
    added = 0  # nodes the aliases add, so far
    crossings: list[tuple[int, yaml.Mark, str]] = []  # (added after it, mark, name) per alias
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            anchor = str(event.anchor)
            if anchor in opened:
                raise AliasExpansionError(
                    None, None, f"alias *{anchor} is inside the node &{anchor} it names (a "
                    "recursive structure, which a Kubernetes object cannot be)", event.start_mark)
            size = sizes.get(anchor)
            if size is None:
                continue  # an undefined alias: the loader reports it
            added = min(added + size, saturated)
            if stack:
                stack[-1][1] = min(stack[-1][1] + size, saturated)
            crossings.append((added, event.start_mark, anchor))
            continue
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None and \
                (str(event.anchor) in sizes or str(event.anchor) in opened):
            return  # a duplicate anchor: the loader refuses it, naming both
        if isinstance(event, yaml.ScalarEvent):
            written += 1
            if stack:
                stack[-1][1] = min(stack[-1][1] + 1, saturated)
            if event.anchor is not None:
                sizes[str(event.anchor)] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            written += 1
            anchor = None if event.anchor is None else str(event.anchor)
            stack.append([anchor, 1])
            if anchor is not None:
                opened.add(anchor)
        elif isinstance(event, yaml.CollectionEndEvent) and stack:
            anchor, size = stack.pop()
            if stack:
                stack[-1][1] = min(stack[-1][1] + size, saturated)
            if anchor is not None:
                opened.discard(anchor)
                sizes[anchor] = size
        elif isinstance(event, yaml.DocumentStartEvent):
            sizes.clear()  # anchors do not cross documents
    allowed = min(MAX_ALIAS_NODES, ALIAS_RATIO * written)
    if added <= allowed:
        return
    # The first alias after which the added nodes exceed the bound: the one to point at.
    _, mark, anchor = next(c for c in crossings if c[0] > allowed)
    raise AliasExpansionError(
        None, None, f"alias *{anchor}: aliases would add more than {allowed:,} nodes (at most "
        f"{ALIAS_RATIO} per node written, {written:,} here, and {MAX_ALIAS_NODES:,} in all); "
        "refused as a YAML alias bomb", mark)


def load_yaml(text: str) -> Any:
    """Load one YAML document with the safe loader, refusing alias bombs (module docstring).

    Args:
        text: the document's text (line numbers in errors are 0-based marks into it).

    Returns:
        The parsed value (None for an empty document).

    Raises:
        AliasExpansionError: the aliases expand past the bound, or into themselves.
        yaml.YAMLError: any other YAML error (syntax, an undefined alias, several documents, a
            scalar its tag cannot hold: ``2026-13-45``, an int of more than 4300 digits).
        RecursionError: nesting too deep for the parser.
    """
    # An alias needs an anchor ('&') and a reference ('*'): most documents have neither and skip
    # the extra parse.
    if "*" in text and "&" in text:
        _check_aliases(text)
    try:
        return yaml.load(text, Loader=_Loader)
    except ValueError:
        # The constructor cannot convert a scalar; it does not say which: load again, naming it.
        return yaml.load(text, Loader=_LocatingLoader)


def load_json(text: str) -> Any:
    """:func:`json.loads`, every failure a :class:`json.JSONDecodeError`.

    ``json.loads`` raises a bare ValueError for an int of more than 4300 digits (Python's limit
    on int() of text); callers that catch JSONDecodeError would show a traceback. Here it is a
    JSONDecodeError at the number (``msg``: a number with more than 4300 digits).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError:
        limit = sys.get_int_max_str_digits()
        # The first such number outside strings (JSON in a JSON string does not count).
        tokens = re.finditer(f'"(?:[^"\\\\]|\\\\.)*"|([0-9]{{{limit + 1}}})', text)
        where = next((m.start(1) for m in tokens if m.group(1)), 0)
        raise json.JSONDecodeError(f"a number with more than {limit} digits", text,
                                   where) from None


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
            value = load_json(text)
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
            value = load_yaml(chunk)
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
        yaml.YAMLError: the shipped file is malformed (a packaging bug), or an alias bomb.
    """
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return load_yaml(text)
