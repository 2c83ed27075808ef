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

A mapping that gives a key twice is an error too (:class:`DuplicateKeyError` for YAML,
:class:`DuplicateJSONKeyError` for JSON), naming both lines: PyYAML and :func:`json.loads` keep
the last value silently, while the Kubernetes API server's strict decoding refuses the object — a
later ``validationActions: [Audit]`` must not quietly downgrade an earlier ``[Deny]``.

A :class:`Snapshot` (:func:`read_snapshot`) holds every file's bytes read once: it is
fingerprinted (:attr:`Snapshot.digest`) and parsed (:func:`file_documents`) from the same bytes,
so what was fingerprinted is what is built.

Must not interpret objects (GPU facts, policies): it only parses.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
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

import orjson
import yaml
from yaml.reader import ReaderError

from policies.json_roundtrip import reencodes_as
from policies.value_words import described

try:  # libyaml's loader is ~10x faster; fall back to pure Python where it is missing.
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader



class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives the same key twice (``validationActions: [Deny]``, later
    ``validationActions: [Audit]``).

    PyYAML keeps the last value silently; the Kubernetes API server's strict decoding refuses
    such an object ("duplicate field"), and a policy whose later key downgrades enforcement must
    not lint clean. A :class:`yaml.MarkedYAMLError`: ``problem_mark`` is the second key,
    :attr:`first_mark` the first (both 0-based lines into the text given to :func:`load_yaml`;
    :func:`yaml_problem` renders them as file lines).
    """

    def __init__(self, key: Any, first_mark: yaml.Mark, second_mark: yaml.Mark) -> None:
        self.key = key
        self.first_mark = first_mark
        super().__init__(None, None, duplicate_key_message(key, first_mark.line + 1),
                         second_mark)


def duplicate_key_message(key: Any, first_line: int) -> str:
    """``duplicate key 'name' (first at line N)``: the one wording for YAML and JSON."""
    return f"duplicate key {shortened(printable(str(key)))!r} (first at line {first_line})"


class _StrictLoader(_Loader):  # type: ignore[misc]  # a base picked at import: libyaml's or not
    """The safe loader, refusing a mapping that gives a key twice (:class:`DuplicateKeyError`).

    Keys brought in by a YAML merge (``<<: *base``) may be overridden, as YAML merge keys
    intend; only keys written in the mapping itself count.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        """The mapping of ``node``, after checking its written keys are distinct."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[bool, Any], yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or \
                        not isinstance(key_node, yaml.ScalarNode):
                    continue  # merges are allowed to be overridden; complex keys: the base
                key = self.construct_object(key_node)
                try:  # True == 1 in Python; as YAML keys they are different
                    first = seen.setdefault((type(key) is bool, key), key_node.start_mark)
                except TypeError:
                    continue  # unhashable: the base constructor reports it
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep)


class _LocatingLoader(_StrictLoader):
    """The strict loader, naming the node whose scalar cannot be converted (slow: errors only)."""

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
    """A document (or whole file) that could not be read; ``str()`` gives the one-line message.

    ``line`` (1-based, in the file) is set where the message does not say it itself (a duplicate
    key); it is rendered ``file:LINE: document N: message``.
    """

    source: str
    index: int | None
    message: str
    line: int | None = None

    def __str__(self) -> str:
        """Render as ``file: document N: message`` (or ``file: message`` for whole-file errors).

        Control characters (a newline in a file name) are escaped: one error, one line.
        """
        source = printable(self.source)
        if self.line is not None:
            source += f":{self.line}"
        if self.index is None:
            return f"{source}: {printable(self.message)}"
        return f"{source}: document {self.index}: {printable(self.message)}"


def _os_error(exc: OSError) -> str:
    """An OSError in words, without Python's repr of the path (the caller names the file)."""
    return exc.strerror or type(exc).__name__


def _walk(root: str) -> Iterator[str | LoadError]:
    """Manifest files under a directory, sorted; unreadable directories and broken links are
    reported, never skipped silently; hidden entries (``.`` first) are left out (see
    :func:`iter_paths`)."""
    errors: list[LoadError] = []
    found: list[str] = []

    def report(exc: OSError) -> None:
        errors.append(LoadError(exc.filename or root, None, f"cannot read: {_os_error(exc)}"))

    for directory, dirs, files in os.walk(root, onerror=report):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            child = os.path.join(directory, name)
            if not name.lower().removesuffix(".gz").endswith(_SUFFIXES) or name.startswith("."):
                continue
            if os.path.islink(child) and not os.path.exists(child):
                errors.append(LoadError(child, None, "broken symbolic link (its target is "
                                                     "missing or a link loop)"))
            else:
                found.append(child)
    yield from sorted(found)
    yield from errors


def iter_paths(paths: Sequence[str]) -> Iterator[str | LoadError]:
    """Expand files and directories into the files to read, in a stable (sorted) order: the one
    directory walker of every command and the server.

    In directories, files and directories whose name starts with ``.`` are left out: a ConfigMap
    or Secret volume holds each key twice, the visible ``name`` (a symlink through ``..data``)
    and the kubelet's ``..<timestamp>/name`` copy, and each key must be read once. A path given
    explicitly is read whatever its name. Files count when they end in ``.yaml``, ``.yml`` or
    ``.json``, optionally followed by ``.gz``.

    Yields:
        Each file path (``-`` and streams such as ``/dev/stdin`` or a named pipe pass
        through), or a LoadError for a path that cannot be read (missing, unreadable, a broken
        link, a block device, an empty path).
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
        elif stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or \
                stat.S_ISSOCK(mode):
            # a stream named by path (/dev/stdin, /dev/fd/N of a shell's <(...), a named pipe)
            # is read to its end as ``-`` is
            yield raw
        else:
            yield LoadError(raw, None, "not a regular file, directory or stream (a pipe, "
                                       "/dev/stdin)")


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


def read_bytes(source: str, stdin: BinaryIO | TextIO | None = None) -> bytes:
    """The bytes of one file (or ``-``, standard input), as stored (gzip not yet expanded).

    Raises:
        OSError: the file cannot be opened or read, or standard input is closed.
    """
    if source == "-":
        stream = stdin if stdin is not None else sys.stdin
        if stream is None or stream.closed:
            raise OSError(0, "standard input is closed")
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
        return data.encode("utf-8") if isinstance(data, str) else data
    return Path(source).read_bytes()


def decode(raw: bytes) -> str:
    """A file's bytes as UTF-8 text (a BOM dropped); gzip data is decompressed first.

    Raises:
        OSError: the gzip stream is corrupt or too large (EOFError when truncated).
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(raw)
    return raw.decode("utf-8-sig")


def read_text(source: str, stdin: BinaryIO | TextIO | None = None) -> str:
    """Read one file (or ``-``, standard input) as UTF-8 text; gzip data is decompressed.

    Raises:
        OSError: the file cannot be opened or read, standard input is closed, or the gzip stream
            is corrupt or too large.
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    return decode(read_bytes(source, stdin))


@dataclass(frozen=True)
class SourceFile:
    """One file's bytes, read once: what is parsed is what is fingerprinted.

    Attributes:
        path: the file as named (``-`` for standard input).
        data: its bytes as stored (gzip not yet expanded).
        name: what the snapshot's digest calls it: the path relative to the directory given
            (``team-llm/limits.yaml``), or the file name of a file given itself — so the same
            files give the same digest wherever they are mounted or installed.
    """

    path: str
    data: bytes
    name: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Every file under some paths, each read once, and what could not be read.

    A directory read as one snapshot: its documents are built from these bytes, and its
    :attr:`digest` is taken from the same bytes, so what is served is what was fingerprinted
    (a file rewritten between the fingerprint and the parse cannot slip in).

    Attributes:
        paths: the paths as given.
        files: each file read, in :func:`iter_paths` order.
        errors: paths that could not be read (missing, unreadable, broken links).
    """

    paths: tuple[str, ...]
    files: tuple[SourceFile, ...]
    errors: tuple[LoadError, ...] = ()

    @functools.cached_property
    def digest(self) -> str:
        """``sha256:<64 hex>`` of every file's name (:attr:`SourceFile.name`) and bytes and of
        every read error, in order: equal digests, equal inputs."""
        digest = hashlib.sha256()
        for file in self.files:
            name = (file.name or file.path).encode("utf-8", "surrogateescape")
            digest.update(b"%d:%s%d:" % (len(name), name, len(file.data)))
            digest.update(file.data)
        for error in self.errors:
            digest.update(b"error:" + str(error).encode("utf-8", "surrogateescape") + b"\n")
        return f"sha256:{digest.hexdigest()}"


def read_snapshot(paths: Sequence[str], stdin: BinaryIO | TextIO | None = None) -> Snapshot:
    """Read every file under ``paths`` (:func:`iter_paths`) into memory, once each.

    Args:
        stdin: stream read for ``-`` (defaults to ``sys.stdin``).

    Returns:
        The snapshot; a path that cannot be read is a LoadError in ``errors``, never skipped.
    """
    files: list[SourceFile] = []
    errors: list[LoadError] = []
    for root in paths:
        for entry in iter_paths([root]):
            if isinstance(entry, LoadError):
                errors.append(entry)
                continue
            name = os.path.basename(entry) if entry == root else os.path.relpath(entry, root)
            try:
                files.append(SourceFile(entry, read_bytes(entry, stdin), name))
            except OSError as exc:
                errors.append(LoadError(entry, None, f"cannot read: {_os_error(exc)}"))
    return Snapshot(tuple(paths), tuple(files), tuple(errors))


def _split_yaml(text: str) -> Iterator[tuple[int, str]]:
    """Split a multi-document YAML stream into (first line number, chunk) at ``---`` lines.

    Splitting before parsing lets one broken document be reported while the others still load.
    """
    start = 1
    lines: list[str] = []
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
    # (added after it, mark, name) per alias; the mark is PyYAML's or libyaml's (same fields).
    crossings: list[tuple[int, Any, str]] = []
    anchor: str | None  # the current event's anchor name
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            anchor = str(event.anchor)
            if anchor in opened:
                raise AliasExpansionError(
                    None, None, f"alias *{anchor} is inside the node &{anchor} it names (a "
                    "recursive structure, which a Kubernetes object cannot be)",
                    # types-PyYAML: the mark is PyYAML's; libyaml's CParser passes its own.
                    event.start_mark)  # type: ignore[arg-type]
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
        DuplicateKeyError: a mapping gives a key twice.
        yaml.YAMLError: any other YAML error (syntax, an undefined alias, several documents, a
            scalar its tag cannot hold: ``2026-13-45``, an int of more than 4300 digits).
        RecursionError: nesting too deep for the parser.
    """
    # An alias needs an anchor ('&') and a reference ('*'): most documents have neither and skip
    # the extra parse.
    if "*" in text and "&" in text:
        _check_aliases(text)
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except ValueError:
        # The constructor cannot convert a scalar; it does not say which: load again, naming it.
        return yaml.load(text, Loader=_LocatingLoader)


class _DuplicateJSONKey(ValueError):
    """Raised inside :func:`json.loads` by :func:`_distinct_keys` (no position known there)."""


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing an object that gives a key twice (``json.loads`` keeps
    the last one silently). Costs about 1.5x ``json.loads`` alone on object-heavy input."""
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _DuplicateJSONKey
    return result


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def _duplicate_json_key(text: str, start: int = 0) -> tuple[str, int, int] | None:
    """The first key given twice in one JSON object of the value at ``text[start:]``:
    ``(key, first offset, second offset)``.

    A token scan (strings and punctuation), run only once a duplicate is known to exist, to
    find where both keys are.
    """
    frames: list[dict[str, int] | None] = []  # per open object its keys; None for an array
    last: tuple[str, int] | None = None  # the string just read, a key if ':' follows
    for token in _JSON_TOKEN.finditer(text, start):
        value = token.group()
        if value == ":":
            keys = frames[-1] if frames else None
            if last is not None and keys is not None:
                first = keys.setdefault(last[0], last[1])
                if first != last[1]:
                    return last[0], first, last[1]
            last = None
        elif value in "{[":
            frames.append({} if value == "{" else None)
            last = None
        elif value in "}]":
            if frames:
                frames.pop()
            last = None
        else:
            last = (json.loads(value), token.start())
    return None


class DuplicateJSONKeyError(json.JSONDecodeError):
    """A JSON object that gives a key twice: ``pos`` is the second key, :attr:`first_pos` the
    first (offsets into ``doc``); ``msg`` names the first one's line in ``doc``."""

    def __init__(self, key: str, doc: str, first_pos: int, pos: int) -> None:
        super().__init__(duplicate_key_message(key, doc.count("\n", 0, first_pos) + 1), doc,
                         pos)
        self.key = key
        self.first_pos = first_pos


def _duplicate_error(text: str, start: int) -> json.JSONDecodeError:
    """The error for the JSON value at ``text[start:]``, known to give a key twice."""
    found = _duplicate_json_key(text, start)
    if found is None:  # pragma: no cover - the scan sees every key json.loads sees
        return json.JSONDecodeError("an object gives a key twice", text, start)
    key, first, second = found
    return DuplicateJSONKeyError(key, text, first, second)


_STRICT_JSON = json.JSONDecoder(object_pairs_hook=_distinct_keys)
_INDENT = re.compile(r"[ \t]*")
_CLOSERS = {"{": "}", "[": "]"}
_LINE_LIMIT = 1 << 18  # characters searched for the end of a value written on one line
#: The longest text orjson decodes here (characters). orjson builds its own tree of a large
#: document before the Python values: decoding a 5 MB List held 87 MiB at its peak, the
#: standard library 30 MiB; the 1M-pod audit's peak RSS went 485 -> 501 MiB.
EXACT_LIMIT = 1 << 20


def _decode_by_layout(text: str, pos: int) -> tuple[Any, int] | None:
    r"""``(value, end)`` of the object or array at ``text[pos]`` when its layout shows where it
    ends and orjson decodes it exactly; None otherwise (the caller decodes it as it always did).

    Two layouts show the end without parsing (JSON strings hold no raw newline):

    - indented (``kubectl get -o json``, ``json.dumps(indent=…)``): the opener ends its line,
      and the container closes on a line of its own, indented as the line that opened it — the
      first such line after ``pos``;
    - one value to a line (a List written an item per line): the value ends where its line
      does, before a comma.

    The slice up to the candidate end is handed to orjson: if it is one complete value, the
    standard library would end the value there too (a container ends at the bracket that
    matches its first). orjson's value is the standard library's when orjson writes it back as
    the slice, whitespace aside (:func:`policies.json_roundtrip.reencodes_as`: no key given
    twice, no number read inexactly); ``\u`` escapes, other number spellings, NaN or a lone
    surrogate make it None, as does any other layout (compact JSON of a whole List on one line
    after :data:`_LINE_LIMIT` characters without a line break) and a value longer than
    :data:`EXACT_LIMIT`.
    """
    closer = _CLOSERS.get(text[pos:pos + 1])
    if closer is None:
        return None
    if text[pos + 1:pos + 2] in ("\n", "\r"):
        line = text.rfind("\n", 0, pos) + 1
        indent = _INDENT.match(text, line).group()  # type: ignore[union-attr]  # always matches
        # bounded: a layout without such a line must not scan the whole buffer per value
        end = text.find(f"\n{indent}{closer}", pos, pos + EXACT_LIMIT)
        if end < 0:
            return None
        end += len(indent) + 2
    else:
        end = text.find("\n", pos, pos + _LINE_LIMIT)
        if end < 0:
            return None
        end = pos + len(text[pos:end].rstrip(" \t\r,"))
        if text[end - 1] != closer:
            return None
    if end - pos > EXACT_LIMIT:
        return None
    exact, value = _decode_exactly(text[pos:end])
    return (value, end) if exact else None


def _decode_exactly(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when orjson decodes ``text`` as one value that the standard library's
    strict decoding would give too (:func:`policies.json_roundtrip.reencodes_as` proves it);
    ``(False, None)`` otherwise, and for text orjson refuses."""
    try:
        body = text.encode()
        value = orjson.loads(body)
    except (UnicodeEncodeError, orjson.JSONDecodeError):
        return False, None
    return (True, value) if reencodes_as(value, body)[0] else (False, None)


def decode_json_value(text: str, pos: int = 0) -> tuple[Any, int]:
    """The JSON value that starts at ``text[pos]`` and where it ends
    (:meth:`json.JSONDecoder.raw_decode`), refusing an object that gives a key twice.

    An object or array laid out indented (as ``kubectl get -o json`` writes a List's items) or
    on a line of its own is decoded by orjson where :func:`_decode_by_layout` can prove the
    result is the standard library's; everything else, and every error, is the standard
    library's.

    Raises:
        json.JSONDecodeError: not JSON there; a :class:`DuplicateJSONKeyError` for a key given
            twice.
    """
    fast = _decode_by_layout(text, pos)
    if fast is not None:
        return fast
    try:
        return _STRICT_JSON.raw_decode(text, pos)
    except _DuplicateJSONKey:
        raise _duplicate_error(text, pos) from None


def load_json(text: str) -> Any:
    """:func:`json.loads`, every failure a :class:`json.JSONDecodeError`.

    ``json.loads`` raises a bare ValueError for an int of more than 4300 digits (Python's limit
    on int() of text); callers that catch JSONDecodeError would show a traceback. Here it is a
    JSONDecodeError at the number (``msg``: a number with more than 4300 digits).

    An object that gives a key twice is a :class:`DuplicateJSONKeyError` at the second key
    (``msg``: duplicate key 'name' (first at line N)), as the Kubernetes API server's strict
    decoding refuses it.

    orjson decodes what it provably decodes as the standard library would
    (:func:`_decode_exactly`: compact or indented ASCII JSON, a few times faster) in a text of
    up to :data:`EXACT_LIMIT` characters; the standard library decodes the rest and words
    every error.
    """
    exact, value = _decode_exactly(text) if len(text) <= EXACT_LIMIT else (False, None)
    if exact:
        return value
    try:
        return json.loads(text, object_pairs_hook=_distinct_keys)
    except json.JSONDecodeError:
        raise
    except _DuplicateJSONKey:
        raise _duplicate_error(text, 0) from None
    except ValueError:
        limit = sys.get_int_max_str_digits()
        # The first such number outside strings (JSON in a JSON string does not count).
        tokens = re.finditer(f'"(?:[^"\\\\]|\\\\.)*"|([0-9]{{{limit + 1}}})', text)
        where = next((m.start(1) for m in tokens if m.group(1)), 0)
        raise json.JSONDecodeError(f"a number with more than {limit} digits", text,
                                   where) from None


def yaml_problem(exc: yaml.YAMLError, first_line: int,
                 text: str | None = None) -> tuple[int | None, str]:
    r"""``(file line, problem)`` of a YAML error in a chunk ``text`` that starts at file line
    ``first_line`` (1-based: a whole file is ``1``; both lines returned and named are 1-based
    file lines): the one place PyYAML's messages are put into words, on one line (PyYAML's
    own ``str()`` adds ``\n  in "<unicode string>", position N``, which names no file).

    The context mark is where a broken construct starts (an unclosed '['); the problem mark is
    where the parser gave up, often the next document's '---'. A duplicate key is at its second
    occurrence, and the problem names the first one's file line. A character YAML does not
    allow in a stream (a control character: YAML 1.1 §5.1) is at the line of its position in
    ``text`` (None without it).
    """
    if isinstance(exc, DuplicateKeyError):
        assert exc.problem_mark is not None
        return (first_line + exc.problem_mark.line,
                duplicate_key_message(exc.key, first_line + exc.first_mark.line))
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.context_mark or exc.problem_mark
        problem = "; ".join(filter(None, (exc.context, exc.problem))) or _one_line(str(exc))
        return (first_line + mark.line if mark is not None else None), problem
    if isinstance(exc, ReaderError):
        character = exc.character
        code = character if isinstance(character, int) else ord(character[:1] or "\0")
        problem = f"unacceptable character #x{code:04x}: {exc.reason}"
        if code < 0x100 and "not allowed" in str(exc.reason):  # not a byte that did not decode
            problem += (" (YAML allows no control character but tab, line feed and carriage "
                        f"return; in a double-quoted string write it as the escape \\x{code:02x})")
        line = first_line + text.count("\n", 0, exc.position) if text is not None else None
        return line, problem
    return None, _one_line(str(exc))


def _one_line(message: str) -> str:
    """A PyYAML message on one line, without its ``in "<unicode string>"`` marks."""
    return " ".join(re.sub(r'\s*in "<(unicode|byte) string>"(, (line \d+, column \d+|position '
                           r'\d+))?', "", message).split())


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
            if isinstance(exc, DuplicateJSONKeyError):  # valid JSON, so YAML too: refused here
                yield LoadError(source, 0, exc.msg, exc.lineno)
                return
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
        except DuplicateKeyError as exc:
            line, problem = yaml_problem(exc, first_line)
            yield LoadError(source, index, problem, line)
            continue
        except yaml.YAMLError as exc:
            line, problem = yaml_problem(exc, first_line, chunk)
            where = f" at line {line}" if line is not None else ""
            yield LoadError(source, index, f"invalid YAML{where}: {problem}")
            continue
        except RecursionError as exc:
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
            f"{described(value)}",
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
            raw = read_bytes(entry, stdin)
        except OSError as exc:
            yield LoadError(entry, None, f"cannot read: {_os_error(exc)}")
            continue
        yield from file_documents(SourceFile(entry, raw), with_lines=with_lines)


def file_documents(file: SourceFile, *, with_lines: bool = False
                   ) -> Iterator[Document | LoadError]:
    """Every Kubernetes object in one file's bytes (see :func:`iter_documents`).

    Yields:
        Documents in file order, and a LoadError for each document that cannot be read (or
        one for the whole file: not UTF-8, corrupt gzip data).
    """
    entry = file.path
    try:
        text = decode(file.data)
    except UnicodeDecodeError as exc:
        yield LoadError(entry, None, f"not UTF-8 text (byte offset {exc.start})")
        return
    except (OSError, EOFError) as exc:
        reason = _os_error(exc) if isinstance(exc, OSError) else "truncated gzip data"
        yield LoadError(entry, None, f"cannot read: {reason}")
        return
    except (gzip.BadGzipFile, zlib.error) as exc:
        yield LoadError(entry, None, f"cannot read: corrupt gzip data ({exc})")
        return
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


def load_package_json(package: str, name: str) -> Any:
    """Load one JSON file shipped inside a package (a large generated table: ``json`` parses it
    in milliseconds where the YAML loader takes about a second).

    Raises:
        FileNotFoundError: the file is not in the installed package.
        json.JSONDecodeError: the shipped file is malformed (a packaging bug).
    """
    return json.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))
