r"""gpuguard's CEL environment: Kubernetes-compatible, compile once, evaluate many.

Owns the one place that talks to the CEL runtime, ``cel-expr-python`` (``cel_expr_python``, the CEL
team's wrapper of the C++ runtime; no other module may import it): the environment, compilation
with located errors, evaluation to plain Python values, and per-request activations with lazily
evaluated, cached ``variables``. Must not do I/O, read the clock or the environment.

Environment: Kubernetes 1.37's ValidatingAdmissionPolicy environment at compatibility version 1.36
(docs/cel.md has the status per library). Variables ``object oldObject request params
namespaceObject variables authorizer gpu quota``, all ``dyn``; a variable missing from the
activation data is ``null``. Extensions: the runtime's strings v2 (``charAt indexOf lastIndexOf
lowerAscii upperAscii replace split substring trim join format strings.quote``; no v3
``reverse``, as Kubernetes), optional (``obj.?field``, ``m[?'k']``, ``orValue``,
``optional.of/none``), ext lists and two-variable comprehensions (through the runtime's
environment config, :data:`_RUNTIME_LIBRARIES`), and gpuguard's extras math (``math.greatest``
...), encoders (``base64.encode/decode``) and bindings (``cel.bind``); plus the Kubernetes
libraries of :mod:`policies.cel.library` (quantity, lists, regex, sets, semver, IP/CIDR, URL,
format, ``jsonpatch.escapeKey``, the ``authorizer`` checks of
:mod:`policies.cel.library.authz`). Not supported: typed object construction for
MutatingAdmissionPolicy (``Object{...}``, ``JSONPatch{...}``), ``<Quantity>.div``/``divInt``
and ``transformMap``/``transformMapEntry`` (the runtime lacks their helper ``cel.@mapInsert``).
Cross-type numeric ordering (``1 < 1.5``) is declared as in Kubernetes
(:func:`_runtime_libraries`).

Runtime behaviour, measured on cel-expr-python 0.1.3 (``tests/core/test_cel.py`` pins it):

* Compile errors are raised as ``RuntimeError`` with text such as ``INVALID_ARGUMENT: ERROR:
  <input>:1:40: Syntax error: mismatched input ')' expecting {...}\n | <line>\n | ....^
  [INVALID_ARGUMENT]``; several errors follow each other as ``\nERROR: <input>:L:C: ...``. Line and
  column are 1-based, the column counted in code points. :class:`CelCompileError` carries them.
* Most evaluation errors are *returned* as a value of type ``error`` whose plain value is
  ``"<CODE>: <message>"`` (``NOT_FOUND: Key not found in map : "x"``, ``INVALID_ARGUMENT: divide
  by zero``); some are *raised* as ``RuntimeError`` (``INTERNAL: Iteration budget exceeded
  [INTERNAL]``). Both become :class:`CelEvaluationError`, the commonest messages in Kubernetes'
  (cel-go's) words: ``no such key: x``, ``division by zero``, ``index out of bounds: 5``. A
  Python function raising ``ValueError`` arrives as ``OUT_OF_RANGE``, ``TypeError`` as
  ``INVALID_ARGUMENT``, others as ``UNKNOWN``.
* Comprehension budget: the C++ ``RuntimeOptions.comprehension_max_iterations`` keeps its default
  of 10,000 (the Python API does not expose it). It counts every iteration of every comprehension
  in one evaluation, nested ones included: 9,999 iterations evaluate, 10,000 fail. See
  :data:`ITERATION_BUDGET`. Kubernetes has no such cap, so the error is reworded to say it is
  gpuguard's runtime limit (:data:`ITERATION_LIMIT_TEXT`), or is cel-go's cost-limit error when
  the evaluation's cost is found over the per-call limit (as Kubernetes answers).
* An ``Activation`` converts each top-level variable from Python on first use and keeps it, so one
  activation shared by a request's expressions converts the object once (about 2 µs per later
  evaluation against 9 µs for a fresh one on a small Pod). Conversion copies the whole value: one
  unsupported value anywhere (a ``datetime``, a tuple, an int beyond int64) makes every use of
  that variable fail, and values nested about 5,900 deep crash the process (C++ stack overflow).
  Hence :func:`to_cel_data` runs on all inputs: it converts those values and refuses nesting
  deeper than :data:`MAX_NESTING`.
* The runtime cannot call back into Python to produce a variable, and ``datetime`` / ``timedelta``
  values are not accepted back as input. ``variables`` are therefore evaluated lazily *per
  expression*: :class:`RequestActivation` finds which ``variables.<name>`` an expression mentions
  (a conservative scan of its source), evaluates those once in declaration order, caches them for
  the request, and rebuilds the runtime activation only when the set of known variables grows.
  A variable whose value holds a timestamp or duration fails with a message saying so.
"""

from __future__ import annotations

import datetime
import functools
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

from policies.cel import checked_expr, instantiation
from policies.cel import cost as cel_cost
from policies.cel import scanner as cel_scanner
from policies.cel.library import authz
from policies.cel.library.declarations import FunctionSpec
from policies.cel.library.libraries import LIBRARY, SOURCE_CHECKS, SOURCE_REWRITES
from policies.cel.library.quantity import quantity_value

VARIABLE_NAMES: Final = (
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
    "authorizer",
    "gpu",
    "quota",
)
ITERATION_BUDGET: Final = 10_000
"""Comprehension iterations per evaluation; an evaluation needing this many or more fails.

cel-expr-python's own limit (the C++ ``RuntimeOptions.comprehension_max_iterations``, default
10,000): the binding builds its runtime with that default and exposes no option for it (0.1.3's
``NewEnv``/``Env``/``Expression`` take none; its C++ extension hook ``ConfigureRuntime`` gets the
options read-only), so gpuguard cannot raise or remove it. Kubernetes has no iteration cap, only
the cost limits: see :data:`ITERATION_LIMIT_TEXT`."""
ITERATION_LIMIT_TEXT: Final = (
    f"{ITERATION_BUDGET:,} or more comprehension iterations in one evaluation: a limit of "
    "gpuguard's CEL runtime (cel-expr-python's fixed comprehension budget), not of Kubernetes, "
    "which has none, only its cost limits; split the loop into variables or bound the list "
    "(docs/cel.md 'Limits')")
"""The error of an evaluation that passes the runtime's iteration budget while its cost is not
found over the per-call limit (Kubernetes would evaluate it, or stop it at the cost limit); one
whose cost is found over the limit gets cel-go's ``operation cancelled: actual cost limit
exceeded``, as in Kubernetes (:meth:`CompiledExpression.iteration_error`)."""
_RUNTIME_ITERATIONS: Final = "Iteration budget exceeded"  # cel-cpp's text
MAX_NESTING: Final = 100
"""Deepest map/list nesting accepted in activation data (the runtime crashes near 5,900)."""

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_STATUS = re.compile(r"^([A-Z_]+): (.*?)(?: \[[A-Z_]+\])?$", re.S)
_ISSUE = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*?)(?=\nERROR: <input>:|\Z)", re.S)
_MISSING_KEY = re.compile(r"^no such key: (.*)$", re.S)
# cel-cpp's texts for the errors a policy author meets most, in cel-go's (Kubernetes') words, so
# that the message a user searches for is the API server's (cases from tests/data/k8s-cel).
_KUBERNETES_TEXTS: Final = (
    (re.compile(r'^Key not found in map : "(.*)"$', re.S), r"no such key: \1"),
    # a non-string key (object["in"][0] on a map) is written without quotes
    (re.compile(r"^Key not found in map : ([^\"].*)$", re.S), r"no such key: \1"),
    (re.compile(r"^divide by zero$"), "division by zero"),
    (re.compile(r"^Index error: index=(-?[0-9]+) size=[0-9]+$"), r"index out of bounds: \1"),
    (re.compile(r"^flatten\(\): (level must be non-negative)$"), r"\1"),
    (re.compile(r"^No matching overloads found : (.*)$", re.S),
     lambda m: _overload_text(m[1])),
    (re.compile(r"^Index error: expected integer type, got (\w+)$"),
     lambda m: f"unsupported index type '{_type_word(m[1])}' in list"),
    # a CEL type conversion (int('x')); not the quantity library's "value to integer"
    (re.compile(r"^cannot convert (string|int|uint|double|bool|bytes|int64|uint64) to "
                r"(int|uint|double|bool|bytes|string|int64|uint64)$"),
     lambda m: f"type conversion error from '{_type_word(m[1])}' to '{_type_word(m[2])}'"),
    # range errors of int()/uint() (cel-go common/types/overflow.go)
    (re.compile(r"^(?:int64|double) out of uint64 range$"), "unsigned integer overflow"),
    (re.compile(r"^(?:uint64|double) out of int64 range$"), "integer overflow"),
    (re.compile(r"^Type conversion error from 'string' to 'bool'$"),
     "type conversion error from 'string' to 'bool'"),
    (re.compile(r"^String to Duration conversion failed$"),
     "type conversion error from 'string' to 'google.protobuf.Duration'"),
    (re.compile(r"^Duration \".*\" (?:below minimum|above maximum) allowed duration .*$"),
     "type conversion error from 'string' to 'google.protobuf.Duration'"),
    (re.compile(r"^String to Timestamp conversion failed$"),
     "type conversion error from 'string' to 'google.protobuf.Timestamp'"),
    (re.compile(r"^malformed UTF-8 bytes$"), "invalid UTF-8 in bytes, cannot convert to string"),
    # cel-cpp's lists.range(-3) fails inside std::vector; cel-go also names the size
    (re.compile(r"^vector::reserve$"), "lists.range: size must be non-negative"),
    # cel-go names the key; cel-cpp's text does not, so the kind of mistake is said instead
    (re.compile(r"^Applying SELECT to non-message type$"),
     "no such key (a field selected on a value that is not a map or an object)"),
    (re.compile(r"^Invalid container type: '(\w+)'$"),
     lambda m: f"no such key (an index into {_type_word(m[1])}, not a list or a map)"),
)
_CPP_TYPES: Final = {"int64": "int", "uint64": "uint", "null_type": "null",
                     "google.protobuf.Timestamp": "timestamp",
                     "google.protobuf.Duration": "duration"}
_RECEIVER_CALL = re.compile(r"^\((.*?)\)\.(\w+)\((.*)\)$", re.S)


def _type_word(name: str) -> str:
    """A cel-cpp type name as CEL writes it (``int64`` → ``int``, ``null_type`` → ``null``)."""
    return _CPP_TYPES.get(name.strip(), name.strip())


def _overload_text(signature: str) -> str:
    """cel-cpp's ``No matching overloads found : <signature>`` in cel-go's words: ``no such
    overload`` (the text Kubernetes answers), then the call in cel-go's form
    (``lowerAscii(int)``, ``_+_(string, int)``) where cel-cpp names one; cel-cpp's internal
    steps (``<iter_range>``, ``<jump_condition>``) are said in words."""
    if signature == "<iter_range>":
        return "expected iterable type: a comprehension over a value that is not a list or a map"
    if signature == "<jump_condition>":
        return "no such overload: a conditional whose condition is not a bool"
    receiver = _RECEIVER_CALL.match(signature)
    if receiver:
        args = [receiver[1], *filter(None, (a.strip() for a in receiver[3].split(",")))]
        signature = f"{receiver[2]}({', '.join(args)})"
    name, paren, rest = signature.partition("(")
    if paren and rest.endswith(")"):
        args = [_type_word(a) for a in rest[:-1].split(",") if a.strip()]
        signature = f"{name}({', '.join(args)})"
    return f"no such overload: {signature}"


_PLAIN_SCALARS: Final = (bool, int, float, str, type(None))
_JSON_SCALARS: Final = frozenset({bool, type(None)})
_CONTAINERS: Final = frozenset({dict, list})


class CelError(Exception):
    """Base of this module's errors; ``field_path`` names the policy field of the expression."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}" if field_path else message)
        self.field_path = field_path
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field_path, self.message))


@dataclass(frozen=True)
class CompileIssue:
    """One compiler diagnostic: 1-based ``line`` and ``column`` (code points); 0 when unknown."""

    line: int
    column: int
    message: str


class CelCompileError(CelError):
    """An expression does not compile.

    Attributes: ``field_path``; ``expression`` (the source); ``issues`` (every diagnostic); and,
    from the first issue, ``message`` (the CEL message, e.g. ``Syntax error: mismatched input ')'
    expecting {...}``), ``line`` and ``column``.
    """

    def __init__(self, field_path: str, expression: str, issues: Sequence[CompileIssue]) -> None:
        first = issues[0]
        super().__init__(field_path, f"line {first.line}, column {first.column}: {first.message}")
        self.message = first.message
        self.expression = expression
        self.issues = tuple(issues)
        self.line = first.line
        self.column = first.column

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field_path, self.expression, self.issues))


class CelEvaluationError(CelError):
    """An evaluation failed.

    ``message`` is the CEL message, ``code`` the runtime's status code (``NOT_FOUND``,
    ``INVALID_ARGUMENT``, ``OUT_OF_RANGE``, ``INTERNAL``, ``UNKNOWN``, ``UNIMPLEMENTED``, ...).
    """

    def __init__(self, field_path: str, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(field_path, message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field_path, self.message, self.code))


class _IterationsSpent(CelEvaluationError):
    """The runtime stopped an evaluation at :data:`ITERATION_BUDGET`; the caller that has the
    request's data turns it into :meth:`CompiledExpression.iteration_error`."""


_UNCAPPED: Final = 1 << 62  # the cost measure's iteration cap when Kubernetes' has none
_TEXT_WALK_STEPS: Final = 4 * ITERATION_BUDGET
"""The most comprehension iterations :meth:`CompiledExpression.iteration_error` walks to tell
cel-go's cost error from the iteration limit's (a few tenths of a second at most)."""


class _InputError(ValueError):
    """Activation data the runtime cannot take (unsupported type, too deep)."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason = reason
        self.where = where

    def within(self, step: str) -> _InputError:
        return _InputError(self.reason, step + self.where)


def to_cel_data(value: Any, *, path: str = "value") -> Any:
    """Return ``value`` in a form the CEL runtime converts without failing or crashing.

    JSON-shaped data comes back as the same objects when nothing needs converting; containers are
    copied only where something inside changes. Converted: ``datetime`` -> RFC 3339 string
    (``...Z``), ``date`` -> ``YYYY-MM-DD``, ints beyond int64 -> float (as a JSON decoder into
    float64 would; beyond a double's range: ValueError; so are inf and NaN), tuples -> lists,
    ``Fraction``/``Decimal`` -> quantity maps, map keys other than str/int/bool -> strings,
    ``bytearray`` -> bytes. A value named by an open :func:`checked_json` block comes back as it
    is, unwalked.

    Raises:
        ValueError: nesting deeper than :data:`MAX_NESTING`, or a value of another type; the
            message gives the path, e.g. ``object.spec.containers[0].x: values of type set ...``.
    """
    if type(value) in _CONTAINERS and ((_CHECKED and _is_checked(value)) or _is_clean(value, 0)):
        return value
    try:
        return _convert(value, 0)
    except _InputError as exc:
        raise exc.within(path) from None


# id -> (value, how many open checked_json blocks name it); the value is held, so its id is not
# reused while it is here.
_CHECKED: dict[int, tuple[Any, int]] = {}
_CHECKED_LOCK = threading.Lock()


class checked_json:  # used as a function: ``with checked_json(obj, old):``
    """While the ``with`` block runs, :func:`to_cel_data` takes each of ``values`` as it is,
    unwalked.

    For JSON whose decoder already guarantees what the walk checks: only dicts, lists, ``str``
    keys and values that are valid Unicode (no lone surrogate), finite floats, ints within int64,
    bools and None, nested at most :data:`MAX_NESTING` levels. The webhook's decoder gives that
    for the bodies orjson decodes (``webhook.wire.Envelope.checked``); re-walking a 3 MiB pod
    with 60,000 env vars cost ~20 ms of CPU per request. The caller vouches that the values
    are not changed while the block runs (gpuguard's mutations copy the object; they never
    edit it).

    ``values`` that are not dicts or lists (None: no oldObject) are ignored. Thread-safe; blocks
    naming the same value may nest or overlap (it stays checked until the last one ends). An
    evaluation still running after the block (abandoned at its deadline) walks the values again:
    slower, never wrong. A class, not a generator: it runs on every admission request.
    """

    __slots__ = ("_held",)

    def __init__(self, *values: Any) -> None:
        self._held = [value for value in values if type(value) in _CONTAINERS]

    def __enter__(self) -> None:
        if self._held:
            with _CHECKED_LOCK:
                for value in self._held:
                    entry = _CHECKED.get(id(value))
                    _CHECKED[id(value)] = (value, entry[1] + 1 if entry is not None else 1)

    def __exit__(self, *exc_info: object) -> None:
        if self._held:
            with _CHECKED_LOCK:
                for value in self._held:
                    _, count = _CHECKED[id(value)]
                    if count > 1:
                        _CHECKED[id(value)] = (value, count - 1)
                    else:
                        del _CHECKED[id(value)]


def _is_checked(value: Any) -> bool:
    """Whether ``value`` itself is named by an open :func:`checked_json` block."""
    entry = _CHECKED.get(id(value))
    return entry is not None and entry[0] is value


def _is_clean(value: dict[Any, Any] | list[Any], depth: int,
              counts: list[int] | None = None) -> bool:
    """Fast path: JSON-shaped (str keys, int64 ints), not too deep; walks without allocating.

    ``counts``: ``[chars, elements, longest]`` to add this value's
    :func:`policies.cel.cost.profile` to, in the same pass (the cost limits' size class of the
    request, counted where the check walks anyway); complete only when the answer is True."""
    if depth >= MAX_NESTING:
        return False
    chars = 0
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _unicode(key)):
                return False
            chars += len(key)  # cheaper than one sum() per map: most maps hold a few keys
            kind = type(item)
            if kind is str:
                if not (item.isascii() or _unicode(item)):
                    return False
                chars += len(item)
            elif not (
                kind in _JSON_SCALARS
                or (kind is float and item - item == 0.0)  # finite: inf - inf is NaN
                or (kind is int and _INT64_MIN <= item <= _INT64_MAX)
                or (kind in _CONTAINERS and _is_clean(item, depth + 1, counts))
            ):
                return False
    else:
        for item in value:
            kind = type(item)
            if kind is str:
                if not (item.isascii() or _unicode(item)):
                    return False
                chars += len(item)
            elif not (
                kind in _JSON_SCALARS
                or (kind is float and item - item == 0.0)
                or (kind is int and _INT64_MIN <= item <= _INT64_MAX)
                or (kind in _CONTAINERS and _is_clean(item, depth + 1, counts))
            ):
                return False
    if counts is not None:
        size = len(value)
        counts[0] += chars
        counts[1] += size
        counts[2] = max(counts[2], size)
    return True


def _unicode(text: str) -> bool:
    r"""Whether ``text`` is valid Unicode: no lone surrogate (a JSON ``\\ud800`` escape decodes
    to one; the runtime cannot take it, and the API server never sends one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str) -> str:
    if not (text.isascii() or _unicode(text)):
        raise _InputError("text with a lone UTF-16 surrogate (an escape such as \\ud800 "
                          "without its pair) is not valid Unicode")
    return text


def _convert(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str:
        return _check_text(value)
    if kind is float:
        if value - value != 0.0:  # JSON's 1e400 decodes to inf, which no API server sends
            raise _InputError(f"number out of the range of a double ({value})")
        return value
    if kind is bool or value is None:
        return value
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        try:
            return float(value)
        except OverflowError:  # a JSON decoder into float64 refuses it too
            raise _InputError("integer out of the range of a double") from None
    if isinstance(value, Mapping | list | tuple):
        if depth >= MAX_NESTING:
            raise _InputError(f"nested deeper than {MAX_NESTING} levels")
        if isinstance(value, Mapping):
            return _convert_map(value, depth)
        changed = kind is not list
        items = []
        for i, item in enumerate(value):
            try:
                converted = _convert(item, depth + 1)
            except _InputError as exc:
                raise exc.within(f"[{i}]") from None
            changed = changed or converted is not item
            items.append(converted)
        return items if changed else value
    return _scalar_to_cel(value)


def _convert_map(value: Mapping[Any, Any], depth: int) -> Any:
    out: dict[Any, Any] | None = None if type(value) is dict else {}
    for key, item in value.items():
        good_key = key if type(key) in (str, int, bool) else _key_to_str(key)
        try:
            if type(good_key) is str:
                _check_text(good_key)
            converted = _convert(item, depth + 1)
        except _InputError as exc:
            shown = good_key if type(good_key) is not str or good_key.isascii() or \
                _unicode(good_key) else good_key.encode("utf-8", "backslashreplace").decode()
            raise exc.within(f".{shown}") from None
        if out is None:
            if converted is item and good_key is key:
                continue
            out = {}
            for earlier, earlier_item in value.items():  # unchanged so far: copy as they are
                if earlier is key:
                    break
                out[earlier] = earlier_item
        out[good_key] = converted
    return value if out is None else out


def _key_to_str(key: object) -> str:
    return "null" if key is None else str(key)


def _scalar_to_cel(value: Any) -> Any:
    if isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return _convert(int(value), 0)
    if isinstance(value, datetime.datetime):
        moment = value.astimezone(datetime.UTC) if value.tzinfo else value
        text = moment.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{text}.{moment.microsecond:06d}Z" if moment.microsecond else f"{text}Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, Fraction | Decimal):
        return quantity_value(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise _InputError(f"values of type {type(value).__name__} are not supported in CEL")


class PreparedData(dict[str, Any]):
    """Activation data already checked by :func:`prepare`; activations take it without a re-walk.

    Build one per request with :func:`prepare` and derive per-policy data with :meth:`with_` or
    :meth:`replaced`, so a large object is checked once, not once per policy. ``profiles``: name
    -> (value, :func:`policies.cel.cost.profile` of it) for the values the check walked, so the
    cost limits' size class needs no second walk of them (an entry counts only while the name
    still holds that very value).
    """

    profiles: Mapping[str, tuple[Any, tuple[int, int, int]]] = MappingProxyType({})

    def with_(self, **values: Any) -> PreparedData:
        """A copy with more names set (each value prepared)."""
        extra = _prepare(values, allow_variables=False)
        return self.replaced(**{k: v for k, v in extra.items() if k in values})

    def replaced(self, **values: Any) -> PreparedData:
        """A copy with ``values`` set as they are (already prepared, e.g. a policy's params
        prepared at load), keeping :attr:`profiles`."""
        copy = PreparedData({**self, **values})
        copy.profiles = self.profiles
        return copy


def prepare(data: Mapping[str, Any], *, sized: bool = True) -> PreparedData:
    """Check and convert activation data once (see :func:`to_cel_data`); with ``sized``,
    counting the :attr:`PreparedData.profiles` of what the check walks (for a policy set
    with an expression the cost limits measure, :attr:`CompiledExpression.measured`).

    Raises:
        ValueError: undeclared names, or ``variables`` (those come from the policy).
        CelEvaluationError: a value the runtime cannot take (unsupported type, too deep).
    """
    profiles: dict[str, tuple[Any, tuple[int, int, int]]] | None = {} if sized else None
    try:
        prepared = PreparedData(_prepare(data, allow_variables=False, profiles=profiles))
    except _InputError as exc:
        raise CelEvaluationError("", str(exc), "INVALID_ARGUMENT") from None
    if profiles:
        prepared.profiles = profiles
    return prepared


def _prepare(data: Mapping[str, Any], *, allow_variables: bool = True,
             profiles: dict[str, tuple[Any, tuple[int, int, int]]] | None = None
             ) -> dict[str, Any]:
    if isinstance(data, PreparedData):
        return data
    unknown = set(data) - set(VARIABLE_NAMES)
    if unknown or (not allow_variables and "variables" in data):
        bad = sorted(unknown) or ["variables"]
        raise ValueError(f"activation data has names the environment does not declare: {bad}")
    prepared = dict.fromkeys(VARIABLE_NAMES)
    for name, value in data.items():
        if profiles is not None and type(value) in _CONTAINERS \
                and not (_CHECKED and _is_checked(value)):
            counts = [0, 0, 0]  # the check and the size class in one walk (to_cel_data's check)
            if _is_clean(value, 0, counts):
                prepared[name] = value
                profiles[name] = (value, (counts[0], counts[1], counts[2]))
                continue
        prepared[name] = value if value is None else to_cel_data(value, path=name)
    return prepared


def _kubernetes_text(message: str) -> str:
    """A runtime error message in Kubernetes' words where :data:`_KUBERNETES_TEXTS` has them."""
    for pattern, replacement in _KUBERNETES_TEXTS:
        if pattern.match(message):
            return pattern.sub(replacement, message)
    return message


def _line_column(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column (code points) of ``offset``, as the compiler reports them."""
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def _split_status(text: str) -> tuple[str, str]:
    match = _STATUS.match(text.strip())
    return (match[1], match[2]) if match else ("UNKNOWN", text)


def _parse_compile_error(text: str) -> list[CompileIssue]:
    body = _split_status(text)[1]
    issues = [
        CompileIssue(int(m[1]), int(m[2]), m[3].split("\n | ", 1)[0].strip())
        for m in _ISSUE.finditer(body)
    ]
    return issues or [CompileIssue(0, 0, body.strip())]


def variable_references(expression: str) -> frozenset[str] | None:
    """Names used as ``variables.<name>`` / ``variables['<name>']`` (also inside ``has()`` or
    as optional selections) in ``expression``, outside strings and comments.

    ``None`` when ``variables`` also appears some other way (``variables[k]``, ``variables``
    alone), meaning "possibly all".
    """
    names: set[str] = set()
    for reference in cel_scanner.references(expression, "variables"):
        if reference.field is None:
            return None
        names.add(reference.field)
    return frozenset(names)


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return value
    if kind is list:
        return [_plain(v) for v in value]
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is bytearray:
        return bytes(value)
    if isinstance(value, cel.Type):
        return value.name().lower()
    return value


def _holds_time(value: Any) -> bool:
    if isinstance(value, datetime.datetime | datetime.timedelta):
        return True
    if isinstance(value, list):
        return any(_holds_time(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_time(v) for v in value.values())
    return False


@dataclass(frozen=True, eq=False)
class CompiledExpression:
    """A checked, ready-to-run expression (thread-safe, reusable across requests).

    ``output_type`` is the checked type in lower case (``bool``, ``string``, ``dyn``,
    ``list<int>``, ``map<string, string>``); ``variable_refs`` is what
    :func:`variable_references` finds in ``expression``.
    """

    expression: str
    field_path: str
    output_type: str
    variable_refs: frozenset[str] | None
    _program: Any = field(repr=False)
    _environment: CelEnvironment = field(repr=False)
    estimated_cost: int = 0
    """The worst-case cost over any request (:func:`policies.cel.cost.estimate`)."""
    _cost_tree: checked_expr.Node | None = field(default=None, repr=False)
    _bounds: dict[tuple[int, int, int], int] = field(default_factory=dict, repr=False)
    _checks: bool = field(default=False, repr=False)
    _written: bool = field(default=True, repr=False)
    _rewritten: bool = field(default=False, repr=False)  # SOURCE_REWRITES changed the text
    # False for programs gpuguard generates (fused, combined): not Kubernetes expressions, not
    # measured when they meet the iteration budget (their policies then run rule by rule)
    # whether it calls authorizer check(): then the bounds leave checks out and each evaluation
    # adds AUTHORIZER_CHECK for every check it made (Kubernetes' 350,000 each)
    # the checked AST, kept only when the estimate is over the per-call limit: then each
    # evaluation first measures its cost on the request's data (none otherwise: it cannot pass)

    def checked(self) -> tuple[checked_expr.Node, dict[int, int], dict[int, str]] | None:
        """The checked tree of ``expression`` with each id's offset in ``expression`` and its
        checked type (:mod:`policies.cel.checked_expr`); None when the environment's source
        rewrites changed the text before it compiled (the offsets would not be its)."""
        if self._rewritten:
            return None
        serialized = self._program.serialize()
        return (checked_expr.checked_ast(serialized), checked_expr.positions(serialized),
                checked_expr.types(serialized))

    @property
    def measured(self) -> bool:
        """Whether the cost limits measure this expression per request (its estimate is over
        the per-call limit): then evaluations need the request's size class."""
        return self._cost_tree is not None

    def runtime_cost(self, data: Mapping[str, Any], limit: int | None = None) -> int | None:
        """The cost of evaluating this on ``data`` (variable name -> plain value): the estimate
        when that is within the per-call limit (nothing is measured), else the measure of
        :func:`policies.cel.cost.runtime_cost` (None: over ``limit``)."""
        if self._cost_tree is None:
            return self.estimated_cost
        return cel_cost.runtime_cost(self._cost_tree, data, self._environment.cost_limits,
                                     limit=limit, iteration_cap=ITERATION_BUDGET - 1)

    def estimate(self, known: Mapping[str, Any]) -> int:
        """The worst-case cost with the variables of ``known`` (name -> plain value) fixed,
        e.g. a GPUPolicy's inline ``params`` (:func:`policies.cel.cost.estimate`)."""
        return cel_cost.estimate(checked_expr.checked_ast(self._program.serialize()),
                                 self._environment.cost_limits,
                                 iteration_cap=ITERATION_BUDGET - 1, known=known).cost

    def bound_within(self, sizes: tuple[int, int, int]) -> int:
        """The worst-case cost over any request of at most ``sizes`` (a
        :func:`policies.cel.cost.profile`), cached per sizes."""
        if self._cost_tree is None:
            return self.estimated_cost
        known = self._bounds.get(sizes)
        if known is None:
            known = cel_cost.estimate_within(self._cost_tree, *sizes,
                                             iteration_cap=ITERATION_BUDGET - 1,
                                             checks=not self._checks)
            if len(self._bounds) < 64:  # requests of a few sizes: a handful of entries
                self._bounds[sizes] = known
        return known

    def _check_cost(self, data: Mapping[str, Any] | None,
                    sizes: tuple[int, int, int] | None = None,
                    activation: RequestActivation | None = None) -> None:
        """Raise cel-go's cost-limit error when this evaluation would pass the per-call limit:
        first the bound for requests of this size (cached), then, only when that is over the
        limit, the cost measured on the request's values (``data``, or ``activation``'s)."""
        if self._cost_tree is None:
            return
        limit = self._environment.cost_limits.per_call
        if data is None and activation is not None:
            sizes = activation._sizes()
        elif sizes is None and data is not None:
            sizes = cel_cost.sizes(*cel_cost.profile(data.values()))
        if sizes is not None and self.bound_within(sizes) <= limit:
            return  # (with checks left out: _checked_run adds those made)
        measured = data if data is not None else (
            activation.cost_data() if activation is not None else {})
        if self.runtime_cost(measured, limit) is None:
            raise CelEvaluationError(self.field_path, cel_cost.EXCEEDED, "RESOURCE_EXHAUSTED")

    def evaluate(self, activation_data: Mapping[str, Any]) -> Any:
        """Evaluate against ``activation_data``, a fresh activation per call.

        ``activation_data`` maps names from :data:`VARIABLE_NAMES` to values (``variables`` as a
        plain dict); absent names are ``null``. For several expressions on one request use
        :class:`RequestActivation`, which converts the data once.

        Returns:
            A plain value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
            ``dict`` (quantities and other Kubernetes types as their maps); timestamps and
            durations as ``datetime`` / ``timedelta``; a type as its name (``"int"``).

        Raises:
            CelEvaluationError: any evaluation failure (``operation cancelled: actual cost limit
                exceeded`` past the per-call cost limit), or data the runtime cannot take.
            ValueError: ``activation_data`` has names the environment does not declare.
        """
        try:
            prepared = _prepare(activation_data)
        except _InputError as exc:
            raise CelEvaluationError(self.field_path, str(exc), "INVALID_ARGUMENT") from None
        try:
            if self._cost_tree is not None:
                self._check_cost(prepared)
                return self._checked_run(self._environment._runtime_activation(prepared),
                                         cel_cost.sizes(*cel_cost.profile(prepared.values())))
            return self._run(self._environment._runtime_activation(prepared))
        except _IterationsSpent:
            raise self.iteration_error(
                prepared, cel_cost.sizes(*cel_cost.profile(prepared.values()))) from None

    def _checked_run(self, activation: Any, sizes: tuple[int, int, int]) -> Any:
        """:meth:`_run`, then, for an expression calling ``check()``, its bound plus
        AUTHORIZER_CHECK per check made held to the per-call limit (cel-go cancels at the check
        that passes it; here the value is dropped after: the same answer, the checks made)."""
        if not self._checks:
            return self._run(activation)
        before = authz.checks_made()
        value = self._run(activation)
        made = authz.checks_made() - before
        limit = self._environment.cost_limits.per_call
        if made and self.bound_within(sizes) + made * cel_cost.AUTHORIZER_CHECK > limit:
            raise CelEvaluationError(self.field_path, cel_cost.EXCEEDED, "RESOURCE_EXHAUSTED")
        return value

    def iteration_error(self, data: Mapping[str, Any],
                        sizes: tuple[int, int, int]) -> CelEvaluationError:
        """The error of this expression when the runtime stopped it at its iteration budget, on
        ``data`` (variable name -> plain value, as a cost measure reads them) of size class
        ``sizes``: cel-go's cost-limit error when its cost on ``data`` is over the per-call
        limit (what Kubernetes answers), else :data:`ITERATION_LIMIT_TEXT` (Kubernetes would
        have evaluated it). The cost is bounded for the size class first and, only when that
        is over the limit, measured on the values (:func:`policies.cel.cost.runtime_cost`,
        which stops at the limit), both without the runtime's iteration cap. The measure walks
        at most :data:`_TEXT_WALK_STEPS` iterations: both answers are evaluation errors (the
        failurePolicy decides either way), so only the words depend on it, and undecided it is
        the iteration limit's, which is what stopped this evaluation."""
        if not self._written:
            return CelEvaluationError(self.field_path, ITERATION_LIMIT_TEXT,
                                      "RESOURCE_EXHAUSTED")
        tree = self._cost_tree if self._cost_tree is not None else \
            checked_expr.checked_ast(self._program.serialize())
        limits = self._environment.cost_limits
        if cel_cost.estimate_within(tree, *sizes, iteration_cap=_UNCAPPED) > limits.per_call:
            try:
                over = cel_cost.runtime_cost(tree, data, limits, limit=limits.per_call,
                                             iteration_cap=_UNCAPPED,
                                             max_steps=_TEXT_WALK_STEPS) is None
            except cel_cost.Undecided:
                over = False
            if over:
                return CelEvaluationError(self.field_path, cel_cost.EXCEEDED,
                                          "RESOURCE_EXHAUSTED")
        return CelEvaluationError(self.field_path, ITERATION_LIMIT_TEXT, "RESOURCE_EXHAUSTED")

    def _run(self, activation: Any) -> Any:
        try:
            value = self._program.eval(activation)
        except Exception as exc:  # the runtime raises RuntimeError for e.g. the iteration budget
            code, message = _split_status(str(exc))
            if message == _RUNTIME_ITERATIONS:
                raise _IterationsSpent(self.field_path, message, code) from None
            raise CelEvaluationError(self.field_path, _kubernetes_text(message), code) from None
        try:
            plain = value.plain_value()
        except Exception:  # an optional (its type() even says ERROR) has no Python form
            message = f"the result {value!r} has no plain value; unwrap optionals with orValue()"
            raise CelEvaluationError(self.field_path, message, "UNIMPLEMENTED") from None
        if value.type() == cel.Type.ERROR:
            code, message = _split_status(plain)
            raise CelEvaluationError(self.field_path, _kubernetes_text(message), code)
        return _plain(plain)


def _cel_type(name: str) -> Any:
    t = cel.Type
    return {
        "string": t.STRING,
        "int": t.INT,
        "double": t.DOUBLE,
        "bool": t.BOOL,
        "bytes": t.BYTES,
        "dyn": t.DYN,
        "list": t.List(t.DYN),
        "list_string": t.List(t.STRING),
        "list_list_string": t.List(t.List(t.STRING)),
        "list_opaque": t.List(t.Map(t.STRING, t.STRING)),
        "map": t.Map(t.STRING, t.List(t.STRING)),
        "opaque": t.Map(t.STRING, t.STRING),
    }[name]


def _declarations(specs: Sequence[FunctionSpec]) -> list[Any]:
    return [
        cel.FunctionDecl(
            spec.name,
            [
                cel.Overload(
                    o.overload_id,
                    return_type=_cel_type(o.result),
                    parameters=[_cel_type(p) for p in o.params],
                    is_member=o.member,
                    impl=o.impl,
                )
                for o in spec.overloads
            ],
        )
        for spec in specs
    ]


STRINGS_VERSION: Final = 2
"""The strings extension's version in Kubernetes' VAP environment (compatibility version 1.36:
strings v2, so no ``<string>.reverse()``)."""
# Ordering overloads: the standard library's (same type on both sides) plus the numeric pairs of
# Kubernetes' CrossTypeNumericComparisons (1.28+: ``1 < 1.5``, ``2u > 1``). The C++ runtime
# already evaluates mixed numeric pairs; only its checker lacks the declarations, and it refuses
# to extend a standard function, so the four operators are taken out of the standard library and
# declared whole here. ``==`` stays typed (``1 == 1.0`` does not compile, as in Kubernetes).
_ORDERING: Final = {"_<_": "less", "_<=_": "less_equals", "_>_": "greater",
                    "_>=_": "greater_equals"}
_ORDERED: Final = (("bool", "bool"), ("int64", "int"), ("uint64", "uint"), ("double", "double"),
                   ("string", "string"), ("bytes", "bytes"),
                   ("timestamp", "google.protobuf.Timestamp"),
                   ("duration", "google.protobuf.Duration"))
_NUMERIC: Final = (("int64", "int"), ("uint64", "uint"), ("double", "double"))


def _runtime_libraries() -> str:
    """The runtime's environment config (YAML): libraries of the C++ runtime that no Python class
    exposes, ext lists (``lists.range``, ``slice``, ``flatten``, ``sort``, ``sortBy``,
    ``distinct``, ``reverse``) and two-variable comprehensions (``all/exists/existsOne(i, v,
    ...)``, ``transformList``), both in Kubernetes' VAP environment since 1.34 / 1.32; and the
    ordering operators with cross-type numeric overloads."""
    lines = ["name: gpuguard", "extensions:", "  - name: lists", "  - name: two-var-comprehensions",
             "stdlib:", "  exclude_functions:",
             *(f"    - name: '{op}'" for op in _ORDERING), "functions:"]
    for op, stem in _ORDERING.items():
        pairs = [(f"{stem}_{a}", t, t) for a, t in _ORDERED] + [
            (f"{stem}_{a}_{b}", x, y) for a, x in _NUMERIC for b, y in _NUMERIC if a != b]
        lines += [f"  - name: '{op}'", "    overloads:"]
        for overload, left, right in pairs:
            lines += [f"      - id: {overload}", "        args:", f"          - type_name: {left}",
                      f"          - type_name: {right}", "        return:",
                      "          type_name: bool"]
    return "\n".join(lines) + "\n"


_RUNTIME_LIBRARIES: Final = _runtime_libraries()


class CelEnvironment:
    """The CEL environment: declarations, extensions and the Kubernetes libraries. Build once."""

    def __init__(self, functions: Sequence[FunctionSpec] = (),
                 cost_limits: cel_cost.CostLimits = cel_cost.DEFAULT_LIMITS) -> None:
        """Build the environment; ``functions`` adds libraries (e.g. the GPU library);
        ``cost_limits`` are the CEL cost limits its expressions are held to (Kubernetes')."""
        self.cost_limits = cost_limits
        self._env = cel.NewEnv(
            config=cel.NewEnvConfigFromYaml(_RUNTIME_LIBRARIES),
            variables=dict.fromkeys(VARIABLE_NAMES, cel.Type.DYN),
            extensions=[
                ext_strings.ExtStrings(STRINGS_VERSION),
                ext_optional.ExtOptional(),
                ext_math.ExtMath(),
                ext_encoders.ExtEncoders(),
                ext_bindings.ExtBindings(),
                cel.CelExtension("gpuguard.kubernetes", _declarations(LIBRARY)),
                *([cel.CelExtension("gpuguard.extra", _declarations(functions))]
                  if functions else []),
            ],
        )

    def compile(self, expression: str, *, field_path: str, written: str | None = None,
                typed_aggregates: bool = True) -> CompiledExpression:
        """Parse and type-check ``expression``.

        ``written`` is the expression as its author wrote it (``expression`` itself, or the text
        before a rewrite such as ``JSONPatch{...}`` literals); it gets the checks Kubernetes makes
        when a policy is created (:data:`~policies.cel.library.libraries.SOURCE_CHECKS`: regex
        literals that do not compile, mixed-type list and map literals; and
        :mod:`policies.cel.instantiation`: duration/timestamp literals, constant conversions that
        fail when cel-go builds the program). ``None`` for text gpuguard generates (inlined
        params are mixed-type literals by nature): no such checks. ``typed_aggregates``: also
        compare the checked types of aggregate elements, not only literals (Kubernetes' rule;
        off for GPUPolicy expressions, whose operation maps mix a string op with any value).

        Raises:
            CelCompileError: syntax or type errors, with line/column of each (of ``written`` for
                what its checks find).
        """
        compiled_text = functools.reduce(lambda text, rewrite: rewrite(text), SOURCE_REWRITES,
                                         expression)
        try:
            program = self._env.compile(compiled_text)
        except RuntimeError as exc:
            raise CelCompileError(field_path, expression, _parse_compile_error(str(exc))) from None
        if written is not None and (
                refused := [found for check in SOURCE_CHECKS for found in check(written)]):
            raise CelCompileError(field_path, written, [
                CompileIssue(*_line_column(written, offset), message)
                for offset, message in sorted(refused)])
        serialized = program.serialize()
        tree = checked_expr.checked_ast(serialized)
        same = compiled_text == written
        if written is not None and (refused_later := instantiation.refusals(
                tree, checked_expr.positions(serialized) if same else {}, written,
                checked_expr.types(serialized) if same and typed_aggregates else None)):
            raise CelCompileError(field_path, written, [
                CompileIssue(*_line_column(written, r.offset), r.message) if r.offset is not None
                else CompileIssue(0, 0, r.message) for r in refused_later])
        estimated = cel_cost.estimate(tree, self.cost_limits,
                                      iteration_cap=ITERATION_BUDGET - 1).cost
        return CompiledExpression(
            expression,
            field_path,
            program.return_type().name().lower(),
            variable_references(expression),
            program,
            self,
            estimated,
            guarded := tree if estimated > self.cost_limits.per_call and written is not None
            else None,
            _checks=guarded is not None and cel_cost.calls_check(tree),
            _written=written is not None,
            _rewritten=compiled_text != expression,
        )

    def activation(
        self,
        data: Mapping[str, Any],
        variables: Sequence[tuple[str, CompiledExpression]] = (),
    ) -> RequestActivation:
        """A :class:`RequestActivation` for one request; see there."""
        return RequestActivation(self, data, variables)

    def _runtime_activation(self, prepared: Mapping[str, Any]) -> Any:
        return self._env.Activation(prepared)


class CostGuard:
    """Expressions (as written) of one policy whose estimate is over the per-call limit, held
    to it on the policy's fast path: :meth:`over` tells, per request size class, whether one of
    them may pass it (then the policy is evaluated rule by rule, where each is measured).

    Build once per policy set; thread-safe (a race only computes a size class's bounds twice).

    Raises:
        ValueError: ``expressions`` is empty or they come from different environments.
    """

    __slots__ = ("_bounds", "_limit", "expressions")

    def __init__(self, expressions: Sequence[CompiledExpression]) -> None:
        self.expressions = tuple(expressions)
        if not self.expressions or any(e._environment is not self.expressions[0]._environment
                                       for e in self.expressions):
            raise ValueError("a CostGuard needs expressions of one environment")
        self._limit = self.expressions[0]._environment.cost_limits.per_call
        # size class -> (the largest bound of the expressions without check(), that of those
        # with, checks left out; -1: none), so a request costs one dict lookup per policy
        self._bounds: dict[tuple[int, int, int], tuple[int, int]] = {}

    def over(self, sizes: tuple[int, int, int], checks_made: int = 0) -> bool:
        """Whether an expression may pass the per-call limit on a request of size class
        ``sizes`` (:func:`policies.cel.cost.sizes`): its bound
        (:meth:`CompiledExpression.bound_within`), plus AUTHORIZER_CHECK per check made
        (``checks_made``) for one that calls ``check()``, over the limit."""
        bounds = self._bounds.get(sizes)
        if bounds is None:
            plain = [e.bound_within(sizes) for e in self.expressions if not e._checks]
            checking = [e.bound_within(sizes) for e in self.expressions if e._checks]
            bounds = (max(plain, default=-1), max(checking, default=-1))
            if len(self._bounds) < 64:  # requests of a few sizes: a handful of entries
                self._bounds[sizes] = bounds
        plain_bound, checking_bound = bounds
        return plain_bound > self._limit or (
            checking_bound >= 0
            and checking_bound + checks_made * cel_cost.AUTHORIZER_CHECK > self._limit)


class RequestActivation:
    """One request's bindings, shared by every expression evaluated for it (not thread-safe).

    ``data`` holds the request's values by name (``object``, ``oldObject``, ``request``, ``params``,
    ``namespaceObject``, ``authorizer``, ``gpu``, ``quota``); ``variables`` the policy's compiled
    variables in declaration order. ``variables.<name>`` is evaluated the first time an expression
    mentions it, at most once per request, and a variable sees only variables declared before it
    (ValidatingAdmissionPolicy semantics). A failing variable fails only the expressions that use
    it, with the variable's own error.

    Raises:
        ValueError: ``data`` has undeclared names or ``variables`` (pass variables separately),
            two variables share a name, or an expression comes from another environment.
    """

    def __init__(
        self,
        environment: CelEnvironment,
        data: Mapping[str, Any],
        variables: Sequence[tuple[str, CompiledExpression]] = (),
    ) -> None:
        self._environment = environment
        self._input_error: str | None = None
        try:
            self._data = _prepare(data, allow_variables=False)
        except _InputError as exc:
            self._data, self._input_error = {}, str(exc)
        self._declared = {name: (i, expr) for i, (name, expr) in enumerate(variables)}
        if len(self._declared) != len(variables):
            raise ValueError("variables must have distinct names")
        for _, expression in variables:
            self._check_environment(expression)
        self._values: dict[str, Any] = {}
        self._failures: dict[str, CelEvaluationError] = {}
        self._runtime: Any = None
        self._runtime_size = -1
        self._counted: list[int] | None = None  # cost.profile() of data and variables
        self._profiled = 0  # how many of the variables (in computed order) are counted
        self._charged: set[str] | None = None  # variables whose cost :meth:`cost` counted
        self._size_class: tuple[int, int, int] | None = None  # _sizes() while none is added

    def evaluate(self, expression: CompiledExpression) -> Any:
        """Evaluate ``expression`` with this request's data and variables.

        Returns and raises as :meth:`CompiledExpression.evaluate`.
        """
        self._check_environment(expression)
        if self._input_error is not None:
            raise CelEvaluationError(expression.field_path, self._input_error, "INVALID_ARGUMENT")
        self._require(expression.variable_refs, len(self._declared))
        try:
            try:
                if expression._cost_tree is not None:
                    expression._check_cost(None, activation=self)
                    return expression._checked_run(self._activation(), self._sizes())
                return expression._run(self._activation())
            except _IterationsSpent:
                raise expression.iteration_error(self.cost_data(), self._sizes()) from None
        except CelEvaluationError as err:
            raise self._explain(err, expression.variable_refs) from None

    def variable(self, name: str) -> Any:
        """The value of ``variables.<name>`` for this request (evaluated now if needed).

        Raises:
            KeyError: no such variable. CelEvaluationError: the variable failed.
        """
        _, expression = self._declared[name]
        if self._input_error is not None:
            raise CelEvaluationError(expression.field_path, self._input_error, "INVALID_ARGUMENT")
        self._compute(name)
        if name in self._failures:
            raise self._failures[name]
        return self._values[name]

    @property
    def cost_limits(self) -> cel_cost.CostLimits:
        """The cost limits of this activation's environment."""
        return self._environment.cost_limits

    def _sizes(self) -> tuple[int, int, int]:
        """:func:`policies.cel.cost.sizes` of this request's data and the variables known so
        far; each value is counted once (the data at the first call, a variable when known),
        and the size class is kept until a variable is added."""
        if self._size_class is not None and self._profiled == len(self._values):
            return self._size_class
        if self._counted is None:
            self._counted = self._data_profile()
            self._profiled = 0
        if self._profiled != len(self._values):
            for value in list(self._values.values())[self._profiled:]:
                chars, elements, longest = cel_cost.profile((value,))
                self._counted[0] += chars
                self._counted[1] += elements
                self._counted[2] = max(self._counted[2], longest)
            self._profiled = len(self._values)
        self._size_class = cel_cost.sizes(*self._counted)
        return self._size_class

    def _data_profile(self) -> list[int]:
        """:func:`policies.cel.cost.profile` of the request's data: the values :func:`prepare`
        counted as it checked them are not walked again (the others are: values checked by
        the wire's decoder, params)."""
        known = self._data.profiles if isinstance(self._data, PreparedData) else {}
        counted = [0, 0, 0]
        rest = []
        for name, value in self._data.items():
            entry = known.get(name)
            if entry is not None and entry[0] is value:
                chars, elements, longest = entry[1]
                counted[0] += chars
                counted[1] += elements
                counted[2] = max(counted[2], longest)
            elif value is not None:
                rest.append(value)
        chars, elements, longest = cel_cost.profile(rest)
        return [counted[0] + chars, counted[1] + elements, max(counted[2], longest)]

    def cost_bound_over(self, guard: CostGuard, checks_made: int = 0) -> bool:
        """Whether any of ``guard``'s expressions (as written) may pass the per-call limit on a
        request of this one's size class (:meth:`CostGuard.over`), an expression calling
        ``check()`` counted with ``checks_made`` checks (those a program holding it made)."""
        return guard.over(self._sizes(), checks_made)

    def cost_data(self) -> dict[str, Any]:
        """The request's data with the variables known so far, as a cost measure reads it."""
        return {**self._data, "variables": dict(self._values)}

    def cost(self, expression: CompiledExpression) -> int:
        """An upper bound of what evaluating ``expression`` on this request adds to its policy's
        budget: its own cost (its estimate when that is within the per-call limit; beyond the
        per-call limit, that limit plus one), measured with the values of the variables it reads
        (computed now if needed), plus the cost of each of those variables not charged before —
        Kubernetes' composition context reports a variable's cost into the policy's
        ``RuntimeCELCostBudget`` at its first evaluation."""
        if self._input_error is not None:
            return self._own_cost(expression)
        self._require(expression.variable_refs, len(self._declared))
        total = self._own_cost(expression)
        if self._charged is None:
            self._charged = set()
        for name in self._needed(expression.variable_refs, len(self._declared)):
            if name not in self._charged:
                self._charged.add(name)
                total += self._own_cost(self._declared[name][1])
        return total

    def _own_cost(self, expression: CompiledExpression) -> int:
        limit = self._environment.cost_limits.per_call
        bound = expression.bound_within(self._sizes()) if expression._cost_tree is not None \
            else expression.estimated_cost
        if bound <= limit:
            return bound
        measured = expression.runtime_cost(self.cost_data(), limit)
        return limit + 1 if measured is None else measured

    def _check_environment(self, expression: CompiledExpression) -> None:
        if expression._environment is not self._environment:
            raise ValueError(f"{expression.field_path}: compiled by another CelEnvironment")

    def _deps(self, name: str) -> list[str]:
        """Variables declared before ``name`` that its expression may mention."""
        index, expression = self._declared[name]
        refs = expression.variable_refs
        return [other for other, (j, _) in self._declared.items()
                if j < index and (refs is None or other in refs)]

    def _done(self, name: str) -> bool:
        return name in self._values or name in self._failures

    def _needed(self, refs: frozenset[str] | None, limit: int, *,
                skip_done: bool = False) -> set[str]:
        """The variables declared before index ``limit`` that an expression mentioning
        ``refs`` needs, and theirs (without those already computed, with ``skip_done``)."""
        needed: set[str] = set()
        stack = [name for name, (index, _) in self._declared.items()
                 if index < limit and (refs is None or name in refs)]
        while stack:
            name = stack.pop()
            if name in needed or (skip_done and self._done(name)):
                continue
            needed.add(name)
            stack.extend(self._deps(name))
        return needed

    def _require(self, refs: frozenset[str] | None, limit: int) -> None:
        """Compute the variables an expression needs (and theirs), in dependency layers.

        All variables of one layer are evaluated against the same runtime activation, so the
        request's data is converted once per layer, not once per variable.
        """
        if not self._declared:
            return
        needed = self._needed(refs, limit, skip_done=True)
        while needed:
            layer = [n for n in needed if all(self._done(d) for d in self._deps(n))]
            activation = self._activation()
            for name in sorted(layer, key=lambda n: self._declared[n][0]):
                self._evaluate_variable(name, activation)
                needed.discard(name)

    def _compute(self, name: str) -> None:
        if not self._done(name):
            self._require(frozenset({name}), len(self._declared))

    def _evaluate_variable(self, name: str, activation: Any) -> None:
        _, expression = self._declared[name]
        try:
            if expression.output_type in (
                "timestamp",
                "duration",
            ) or expression.output_type.startswith("type"):
                raise CelEvaluationError(expression.field_path, _NOT_CARRIED, "UNIMPLEMENTED")
            try:
                if expression._cost_tree is not None:
                    expression._check_cost(None, activation=self)
                    value = expression._checked_run(activation, self._sizes())
                else:
                    value = expression._run(activation)
            except _IterationsSpent:
                raise expression.iteration_error(self.cost_data(), self._sizes()) from None
            if _holds_time(value):
                raise CelEvaluationError(expression.field_path, _NOT_CARRIED, "UNIMPLEMENTED")
            self._values[name] = value
        except CelEvaluationError as err:
            self._failures[name] = self._explain(err, expression.variable_refs)

    def _activation(self) -> Any:
        if self._runtime is None or self._runtime_size != len(self._values):
            data = dict(self._data)
            data["variables"] = dict(self._values)
            self._runtime = self._environment._runtime_activation(data)
            self._runtime_size = len(self._values)
        return self._runtime

    def _explain(self, err: CelEvaluationError, refs: frozenset[str] | None) -> CelEvaluationError:
        missing = _MISSING_KEY.search(err.message)
        if missing is None or missing[1] not in self._failures:
            return err
        if refs is not None and missing[1] not in refs:
            return err
        cause = self._failures[missing[1]]
        return CelEvaluationError(
            err.field_path, f"variables.{missing[1]}: {cause.message}", cause.code
        )


_NOT_CARRIED: Final = (
    "a variable cannot hold a timestamp, duration or type value (the CEL runtime does not accept "
    "them back as input); convert it with string() and parse it where it is used"
)


@functools.cache
def default_environment() -> CelEnvironment:
    """The process-wide environment, built on first use."""
    return CelEnvironment()


def compile(expression: str, *, field_path: str, written: str | None = None
            ) -> CompiledExpression:
    """Compile with :func:`default_environment`; raises :class:`CelCompileError`."""
    return default_environment().compile(expression, field_path=field_path, written=written)
