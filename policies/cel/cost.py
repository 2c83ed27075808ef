"""CEL cost: a worst-case estimate of a checked expression, and its cost on one request's data.

Owns gpuguard's answer to Kubernetes' two CEL cost limits (``k8s.io/apiserver/pkg/apis/cel/
config.go``): ``PerCallLimit`` (1,000,000, the runtime cost of one expression evaluation; cel-go
cancels the evaluation with ``operation cancelled: actual cost limit exceeded``) and
``RuntimeCELCostBudget`` (10,000,000 for all expressions of one policy binding on one request;
``validation failed due to running out of cost budget, no further validation rules will be
run``), plus the estimated-cost limit a CRD's validation rules are held to at creation
(apiextensions-apiserver ``StaticEstimatedCostLimit``, 10,000,000).

The CEL runtime (cel-expr-python 0.1.3) has no cost tracker and no estimator. What it does give is
the checked AST (``Expression.serialize()``: a ``google.protobuf.Any`` holding a
``cel.expr.CheckedExpr``); this module decodes it (:func:`checked_ast`, a protobuf wire reader
for just the fields used) and walks it with cel-go's runtime cost model
(``interpreter/runtimecost.go``) and Kubernetes' library costs (``pkg/cel/library/cost.go``,
``CallCost``), calibrated with the CEL oracle of the control-plane tier (docs/cel.md "Cost" has
the table and the differences).

One walk serves three questions, with different values bound to the variables:

* **estimate** (:func:`estimate`, at load): every variable is a document of at most
  :attr:`CostLimits.max_request_bytes` (the API server's 3 MiB request limit): strings of up to
  that many bytes, lists and maps of up to half as many elements, and no comprehension runs more
  than the runtime's iteration budget allows (9,999 iterations,
  :data:`policies.cel.runtime.ITERATION_BUDGET`). A comprehension or string function over a part
  *of the enclosing comprehension's element* (``containers.all(c, c.env.all(e, ...))``) is
  charged once for all elements together: the elements are disjoint parts of one document, so
  their sizes sum to at most the document's;
* **bound for a size class** (:func:`estimate_within`, per request, cached by the caller): the
  same with the request's own totals (:func:`profile`, rounded by :func:`sizes`);
* **runtime cost** (:func:`runtime_cost`): the variables are the request's actual values;
  comprehensions over them are walked element by element. Both branches of ``?:``, ``&&`` and
  ``||`` and every iteration are charged (the walk does not evaluate conditions), so the figure
  is at least what cel-go counts on the same data.

Must not evaluate expressions, do I/O or import the CEL runtime (:mod:`policies.cel.runtime`
passes the serialized AST in).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from policies.cel.checked_expr import Node

PER_CALL_LIMIT: Final = 1_000_000
"""``PerCallLimit``: the runtime cost one expression evaluation may reach (k8s.io/apiserver
``pkg/apis/cel/config.go``)."""
RUNTIME_BUDGET: Final = 10_000_000
"""``RuntimeCELCostBudget``: the runtime cost all expressions of one policy (binding) may reach on
one request (same file)."""
ESTIMATED_LIMIT: Final = 10_000_000
"""``StaticEstimatedCostLimit``: the estimated cost of one validation rule a CRD may have
(apiextensions-apiserver ``pkg/apiserver/schema/cel/model`` / ``validation.go``); gpuguard
refuses a GPUPolicy expression above it at load."""
MAX_REQUEST_BYTES: Final = 3 * 1024 * 1024
"""``MaxRequestSizeBytes``, the largest request body the API server accepts (config.go)."""
FACT_BYTES: Final = 512.0
"""The longest string the estimate assumes in ``gpu`` facts: gpuguard builds them (container
names, field paths, resource names, quantities as written; qualified names are at most 317
bytes, 253 + "/" + 63). ``variables`` are not facts: a variable may hold any part of the
request (``variables.items`` bound to ``object.spec.items``), so the estimate bounds them as a
document, as the request's own values."""
EXCEEDED: Final = "operation cancelled: actual cost limit exceeded"
"""cel-go's error when an evaluation passes its cost limit (``interpreter``)."""
OUT_OF_BUDGET: Final = ("validation failed due to running out of cost budget, no further "
                        "validation rules will be run")
"""The API server's error when a policy's expressions pass ``RuntimeCELCostBudget``
(``pkg/admission/plugin/cel/condition.go``)."""

_STRING_FACTOR: Final = 0.1  # common.StringTraversalCostFactor
_REGEX_FACTOR: Final = 0.25  # common.RegexStringLengthCostFactor
_LIST_LITERAL: Final = 10.0
_MAP_LITERAL: Final = 30.0
_OBJECT_LITERAL: Final = 40.0


@dataclass(frozen=True)
class CostLimits:
    """The cost limits in force (frozen settings; defaults are Kubernetes').

    ``per_call``: the most one evaluation may cost; ``per_policy``: the most all expressions of
    one policy may cost on one request; ``estimated``: the most a GPUPolicy expression may be
    estimated to cost at load (0, the default, turns the check off: the estimate of several
    built-in policies' messageExpressions is over :data:`ESTIMATED_LIMIT`, see docs/cel.md);
    ``max_request_bytes``: the size of the
    largest document the estimate assumes. Costs are cel-go cost units (about 0.1 µs each in
    cel-go, per config.go's "roughly 0.1 second" for PerCallLimit).

    Raises:
        ValueError: a limit below 1 (``estimated``: below 0).
    """

    per_call: int = PER_CALL_LIMIT
    per_policy: int = RUNTIME_BUDGET
    estimated: int = 0
    max_request_bytes: int = MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        for name in ("per_call", "per_policy", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.estimated < 0:
            raise ValueError(f"estimated must be at least 0, not {self.estimated}")


DEFAULT_LIMITS: Final = CostLimits()


# --- sizes ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sized:
    """A value not known exactly: at most ``length`` elements (list or map) and ``chars`` bytes
    (string or bytes); ``item`` is what its elements, values and fields may be; ``owners`` the
    comprehensions whose element it is a part of (innermost last)."""

    length: float
    chars: float
    owners: tuple[int, ...] = ()
    item: _Sized | _Known | None = None
    text: bool | None = None  # a string (True), a list or map (False), unknown (None)

    def element(self) -> _Sized:
        item = self.item
        if item is None:
            return _Sized(self.length, self.chars, self.owners)
        if isinstance(item, _Known):
            return _Sized(_length(item), _chars(item), self.owners)
        return item


@dataclass(frozen=True, slots=True)
class _Known:
    """A value known exactly (data of the request, a constant)."""

    value: Any


_Value = _Sized | _Known
_SCALAR: Final = _Sized(1.0, 8.0)


def _length(value: _Value) -> float:
    if isinstance(value, _Sized):
        return value.length
    v = value.value
    return float(len(v)) if isinstance(v, list | dict | tuple) else 1.0


def _chars(value: _Value) -> float:
    if isinstance(value, _Sized):
        return value.chars
    v = value.value
    return float(len(v)) if isinstance(v, str | bytes) else 1.0


def _owners(value: _Value) -> tuple[int, ...]:
    return value.owners if isinstance(value, _Sized) else ()


def _join(values: Sequence[_Value]) -> _Value:
    """What any of ``values`` may be."""
    if not values:
        return _SCALAR
    if len(values) == 1:
        return values[0]
    owners = _owners(values[0])
    if any(_owners(v) != owners for v in values):
        owners = ()
    return _Sized(max(map(_length, values)), max(map(_chars, values)), owners)


# --- cost ----------------------------------------------------------------------------------------


class _Over(Exception):
    """The running cost passed the limit: the walk stops."""


class Undecided(Exception):
    """:func:`runtime_cost` walked ``max_steps`` comprehension iterations without the cost
    passing the limit (it may or may not pass it later): the walk stops."""


@dataclass
class _Cost:
    """A cost: ``own`` plus parts ``shared`` per comprehension (charged once for all of that
    comprehension's elements together, see the module docstring)."""

    own: float = 0.0
    shared: dict[int, float] | None = None

    def add(self, other: _Cost) -> None:
        self.own += other.own
        if other.shared:
            if self.shared is None:
                self.shared = {}
            for token, cost in other.shared.items():
                self.shared[token] = self.shared.get(token, 0.0) + cost

    def charge(self, cost: float, owners: tuple[int, ...]) -> None:
        """Add ``cost``, proportional to the size of a part of the innermost of ``owners``."""
        if owners:
            if self.shared is None:
                self.shared = {}
            self.shared[owners[-1]] = self.shared.get(owners[-1], 0.0) + cost
        else:
            self.own += cost

    def total(self) -> float:
        return self.own + (sum(self.shared.values()) if self.shared else 0.0)


# Functions by how cel-go (interpreter/runtimecost.go) and Kubernetes
# (k8s.io/apiserver/pkg/cel/library/cost.go, CostEstimator.CallCost) charge them; a function in
# none of these costs 1. The unit costs below are theirs; the sizes are code points of a string,
# elements of a list or map, 1 for anything else (cel-go's actualSize).
_SCAN_FIRST: Final = frozenset({  # ceil(size(first argument) * 0.1)
    "url", "lowerAscii", "upperAscii", "substring", "trim", "cidr",
    "isIP", "isCIDR", "ip", "quantity", "isQuantity", "isURL", "semver", "isSemver", "bytes",
    "charAt", "strings.quote", "base64.encode", "base64.decode", "escapeKey",
    "jsonpatch.escapeKey", "format", "reverse",
})
_SCAN_TWICE: Final = frozenset({"replace", "split", "ip.isCanonical"})  # ceil(size * 0.2)
_TRAVERSE: Final = frozenset({"isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"})
_REGEX: Final = frozenset({"matches", "find", "findAll"})
_COMPARISONS: Final = frozenset({"_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"})
_AFFIXES: Final = frozenset({"startsWith", "endsWith"})  # ceil(size(affix) * 0.1)
_LIST_BUILDERS: Final = frozenset({"reverse", "slice", "flatten"})  # 11 + result's length
_SORTS: Final = frozenset({"sort", "sortBy"})
_BOOLEAN: Final = frozenset({"!_", "@not_strictly_false", "size", "int", "uint", "double",
                             "bool", "_-_", "_*_", "_/_", "_%_", "-_", "isGreaterThan",
                             "isLessThan", "compareTo", "allowed", "errored", "type"})
AUTHORIZER_CHECK: Final = 350_000
"""What one ``authorizer...check(verb)`` costs (Kubernetes: "allow for only two authorization
checks per expression")."""


class _Walk:
    """One walk of an expression tree (see the module docstring)."""

    def __init__(self, document: _Sized, iteration_cap: float, limit: float | None,
                 check_cost: float = AUTHORIZER_CHECK, elements: float | None = None,
                 max_steps: float | None = None) -> None:
        self.max_steps = max_steps
        self.document = document
        self.elements = document.length if elements is None else elements
        self.check_cost = check_cost
        self.iteration_cap = iteration_cap
        self.limit = limit
        self.spent = 0.0  # the walk's own work, bounded: a huge list stops it at the limit
        self.tokens = itertools.count(1)
        # For the second bound (iterations of all comprehensions together are capped): the
        # iteration parts of the comprehensions being walked, the outermost ones' sum, and the
        # most one iteration of any comprehension costs without its nested ones' iterations.
        self.nested: list[float] = []
        self.outer_iterations = 0.0
        self.costliest_iteration = 0.0

    def node(self, node: Node, scope: Mapping[str, _Value]) -> tuple[_Cost, _Value]:
        kind = node.kind
        if kind == "const":
            return _Cost(), _Known(node.value)
        if kind == "ident":
            value = scope.get(node.name)
            return _Cost(1.0), value if value is not None else self.document
        if kind == "select":
            cost, operand = self.node(node.children[0], scope)
            if node.test_only:  # has(): the operand's cost only (measured with the oracle)
                return cost, _SCALAR
            cost.own += 1.0
            return cost, _field(operand, node.name)
        if kind == "list":
            cost, items = self._all(node.children, scope)
            constant = all(child.kind == "const" for child in node.children)
            cost.own += 0.0 if constant else _LIST_LITERAL  # a constant list is planned once
            if all(isinstance(v, _Known) for v in items):
                return cost, _Known([v.value for v in items if isinstance(v, _Known)])
            return cost, _Sized(float(len(items)), sum(map(_chars, items)), (), _join(items),
                                text=False)
        if kind == "map":
            cost, items = self._all(node.children, scope)
            constant = all(child.kind == "const" for child in node.children)
            cost.own += 1.0 if constant else _OBJECT_LITERAL if node.name else _MAP_LITERAL
            values = items[1::2]
            return cost, _Sized(float(len(values)), sum(map(_chars, values)), (), _join(values),
                                text=False)
        if kind == "comprehension":
            return self._comprehension(node, scope)
        return self._call(node, scope)

    def _all(self, nodes: Sequence[Node], scope: Mapping[str, _Value]
             ) -> tuple[_Cost, list[_Value]]:
        cost, values = _Cost(), []
        for child in nodes:
            child_cost, value = self.node(child, scope)
            cost.add(child_cost)
            values.append(value)
        return cost, values

    def _call(self, node: Node, scope: Mapping[str, _Value]) -> tuple[_Cost, _Value]:
        name = node.name
        if name == "_?_:_":
            cost, (_, yes, no) = self._branches(node, scope)
            return cost, _either(yes, no)
        if name in ("_&&_", "_||_"):
            cost, _ = self._branches(node, scope)
            return cost, _SCALAR
        cost, args = self._all(node.children, scope)
        charge, value = _function(name, args)
        if name == "check":
            charge = self.check_cost
        elif name == "flatten" and isinstance(value, _Sized) and value.length > self.elements:
            # the elements of lists within the data are at most the data's elements
            value = _Sized(self.elements, value.chars, value.owners, value.item, value.text)
        cost.charge(charge, _common_owner(args))
        return cost, value

    def _branches(self, node: Node, scope: Mapping[str, _Value]
                  ) -> tuple[_Cost, list[_Value]]:
        """``&&``, ``||``, ``?:``: each operand charged (an upper bound of what short-circuit
        evaluation spends)."""
        return self._all(node.children, scope)

    def _comprehension(self, node: Node, scope: Mapping[str, _Value]) -> tuple[_Cost, _Value]:
        iter_var, iter_var2, accu_var = node.variables
        range_node, init_node, condition, step, result = node.children
        cost, iterated = self.node(range_node, scope)
        init_cost, init = self.node(init_node, scope)
        cost.add(init_cost)
        token = next(self.tokens)
        if isinstance(iterated, _Known) and isinstance(iterated.value, list | dict):
            data = iterated.value
            accumulator = init  # followed through the iterations: map/filter results stay exact
            pairs: Iterator[tuple[Any, Any]] = (
                enumerate(data) if isinstance(data, list) else iter(data.items()))
            for key, item in pairs:
                if isinstance(data, list):
                    first, second = (key, item) if iter_var2 else (item, None)
                else:
                    first, second = key, item
                inner = {**scope, accu_var: accumulator, iter_var: _Known(first)}
                if iter_var2:
                    inner[iter_var2] = _Known(second)
                part_cost, _ = self.node(condition, inner)
                cost.add(part_cost)
                part_cost, accumulator = self.node(step, inner)
                cost.add(part_cost)
                self.spent += 1.0
                self._check(cost.total() + self.spent)
                if self.max_steps is not None and self.spent > self.max_steps:
                    raise Undecided
            result_cost, produced = self.node(result, {**scope, accu_var: accumulator})
            cost.add(result_cost)
            return cost, produced
        sized = iterated if isinstance(iterated, _Sized) else _SCALAR
        # a list that is part of an enclosing comprehension's element is charged once for all
        # of them (below): the lengths of such parts sum to at most the data's elements
        count = min(self.elements if sized.owners else sized.length, self.iteration_cap)
        owners = (*sized.owners, token)
        element = _Sized(sized.element().length, sized.element().chars, owners,
                         sized.element().item)
        accumulator = _Sized(count, sized.chars, sized.owners, sized.element(), text=False)
        # the accumulator grows by at most one element per iteration: over all iterations its
        # length averages half the count (what a cost linear in it sums to)
        growing = _Sized(math.ceil(count / 2), sized.chars, sized.owners, sized.element(),
                         text=False)
        inner = {**scope, accu_var: growing, iter_var: element}
        if iter_var2:
            inner[iter_var2] = element
        body = _Cost()
        self.nested.append(0.0)
        for part in (condition, step):
            part_cost, _ = self.node(part, inner)
            body.add(part_cost)
        nested = self.nested.pop()
        once = body.shared.pop(token, 0.0) if body.shared else 0.0
        per_iteration = body.total()
        iterations = count * per_iteration + once
        self.costliest_iteration = max(self.costliest_iteration,
                                       per_iteration + once - nested)
        if self.nested:
            self.nested[-1] += iterations
        else:
            self.outer_iterations += iterations
        loop = _Cost()
        loop.charge(iterations, sized.owners)
        cost.add(loop)
        result_cost, _ = self.node(result, {**scope, accu_var: accumulator})
        cost.add(result_cost)
        self._check(cost.total())
        return cost, accumulator

    def _check(self, spent: float) -> None:
        if self.limit is not None and spent > self.limit:
            raise _Over


def _flattened(value: _Value) -> _Value:
    """What ``flatten()`` of ``value`` may be (one level)."""
    if isinstance(value, _Known) and isinstance(value.value, list):
        flat: list[Any] = []
        for item in value.value:
            flat.extend(item if isinstance(item, list) else [item])
        return _Known(flat) if len(flat) <= _KNOWN_LIST_CAP else _Sized(
            float(len(flat)), 1.0, (), None, text=False)
    sized = value if isinstance(value, _Sized) else _SCALAR
    inner = sized.element()
    return _Sized(sized.length * inner.length, sized.chars, sized.owners, inner.element(),
                  text=False)


def _either(yes: _Value, no: _Value) -> _Value:
    """What ``cond ? yes : no`` may be: the longer list when one extends the other (a filter's
    step, ``pred ? @result + [x] : @result``), else either."""
    if isinstance(yes, _Known) and isinstance(no, _Known) and isinstance(yes.value, list) \
            and isinstance(no.value, list):
        longer, shorter = (yes.value, no.value) if len(yes.value) >= len(no.value) \
            else (no.value, yes.value)
        if all(a is b for a, b in zip(longer, shorter, strict=False)):
            return _Known(longer)
    return _join([yes, no])


def _size(value: _Value) -> float:
    """cel-go's ``actualSize``: code points of a string or bytes, elements of a list or map."""
    return _chars(value) if _is_text(value) else _length(value)


def _traversal(value: _Value) -> float:
    """Kubernetes' ``traversalCost``: 0.1 per code point of every string in it, 1 per scalar."""
    if isinstance(value, _Known):
        return _traversed(value.value)
    return value.chars * _STRING_FACTOR + value.length


def _traversed(data: Any) -> float:
    if isinstance(data, str | bytes):
        return float(math.floor(len(data) * _STRING_FACTOR))
    if isinstance(data, list):
        return sum(_traversed(item) for item in data)
    if isinstance(data, dict):
        return sum(_traversed(k) + _traversed(v) for k, v in data.items())
    return 1.0


def _function(name: str, args: Sequence[_Value]) -> tuple[float, _Value]:
    """The cost of one call of ``name`` on ``args`` (receiver first) and what it returns."""
    first = args[0] if args else _SCALAR
    owners = _owners(first)
    if name in {"_[_]", "_[?_]"} and len(args) == 2:
        return 1.0, _index(first, args[1])
    if name in _COMPARISONS and len(args) == 2:
        return float(math.ceil(min(_size(args[0]), _size(args[1])) * _STRING_FACTOR)), _SCALAR
    if name == "_+_" and len(args) == 2:
        joined = _concatenated(args)
        if _is_text(args[0]) or _is_text(args[1]):
            return float(math.ceil((_size(args[0]) + _size(args[1])) * _STRING_FACTOR)), joined
        return 1.0, joined  # list concatenation is O(1) in cel-go
    if name == "@in" and len(args) == 2:
        # cel-go's runtime charges the call only, whatever the list's or map's size (measured
        # with the CEL oracle: `7 in object` costs 2 for 0 and for 100,000 elements)
        return 1.0, _SCALAR
    if name in _REGEX and len(args) == 2:
        scan = math.ceil((1.0 + _chars(first)) * _STRING_FACTOR)
        found = _Sized(_chars(first), _chars(first), owners, text=name != "findAll")
        return float(scan * math.ceil(_chars(args[1]) * _REGEX_FACTOR)), found
    if name == "contains" and len(args) == 2:
        return float(math.ceil(_chars(first) * _STRING_FACTOR)
                     * math.ceil(_chars(args[1]) * _STRING_FACTOR)), _SCALAR
    if name in _TRAVERSE:
        element = first.element() if isinstance(first, _Sized) else _element(first)
        return _traversal(first), element if not _is_text(first) else _SCALAR
    if name == "join":
        items = first.element() if isinstance(first, _Sized) else None
        if isinstance(first, _Known) and isinstance(first.value, list):
            size = sum(_chars(_Known(v)) for v in first.value)
        else:
            size = _length(first) * (items.chars if items is not None else 1.0)
        separators = _chars(args[1]) * max(_length(first) - 1, 0.0) if len(args) > 1 else 0.0
        total = size + separators
        return float(math.ceil(total * 2 * _STRING_FACTOR)), _Sized(1.0, total, owners,
                                                                    text=True)
    if name in _SCAN_TWICE:
        result = _Sized(_chars(first) + 1, _chars(first), owners,
                        _Sized(1.0, _chars(first), owners, text=True), text=False) \
            if name == "split" else _Sized(1.0, _chars(first) * 2, owners, text=True)
        return float(math.ceil(_chars(first) * 2 * _STRING_FACTOR)), result
    if name in _AFFIXES and len(args) == 2:
        return float(math.ceil(_chars(args[1]) * _STRING_FACTOR)), _SCALAR
    if name in ("validate", "validateAsList"):
        # format.<name>().validate(s) (gpuguard's rewrite: validateAsList(s).first()): measured
        # 8 for a short string with Kubernetes 1.37
        return 7.0 + math.ceil(_chars(args[-1]) * _STRING_FACTOR), _SCALAR
    if name in _SCAN_FIRST and (name != "reverse" or _is_text(first)):
        text = sum(map(_chars, args)) if name == "format" else _chars(first)
        return float(math.ceil(text * _STRING_FACTOR)), _Sized(1.0, text, owners, text=True)
    if name == "check":
        return float(AUTHORIZER_CHECK), _SCALAR
    if name == "lists.range":
        count = first.value if isinstance(first, _Known) and type(first.value) is int else None
        if count is not None and 0 <= count <= _KNOWN_LIST_CAP:
            return float(count + 11), _Known(list(range(count)))
        if count is not None and count < 0:  # fails; measured 12 with Kubernetes 1.37
            return 12.0, _Known([])
        size = float(count) if count is not None and count >= 0 else float(MAX_REQUEST_BYTES)
        return size + 11, _Sized(size, 1.0, (), _SCALAR, text=False)
    if name in _SORTS:
        n = _length(first)
        return n * max(1.0, math.ceil(math.log2(max(n, 2.0)))), first
    if name in _LIST_BUILDERS and not _is_text(first):
        built: _Value = first
        if name == "flatten":
            built = _flattened(first)
        elif name == "slice" and len(args) == 3 and isinstance(first, _Known) \
                and isinstance(first.value, list):
            bounds = [a.value if isinstance(a, _Known) else None for a in args[1:]]
            if type(bounds[0]) is int and type(bounds[1]) is int:
                built = _Known(first.value[bounds[0]:bounds[1]])
        return 11.0 + _length(built), built
    if name == "distinct":
        n = _length(first)
        return 2 * n * n + 2 * n + 11, first
    if name in ("sets.contains", "sets.intersects") and len(args) == 2:
        return _length(args[0]) * _length(args[1]) + 1, _SCALAR
    if name == "sets.equivalent" and len(args) == 2:
        return 2 * _length(args[0]) * _length(args[1]) + 1, _SCALAR
    if name in ("containsIP", "containsCIDR") and len(args) == 2:
        return 2.0 + math.ceil(_chars(args[1]) * _STRING_FACTOR), _SCALAR
    if name in ("math.greatest", "math.least"):
        return 1.0 + sum(_length(a) for a in args), _SCALAR
    if name in ("dyn", "optional.of", "optional.ofNonZeroValue", "value"):
        return 1.0, _join(args[-1:])
    if name == "orValue":
        return 1.0, _join(args)
    if name == "string" and args and _is_text(first):
        return float(math.ceil(_chars(first) * _STRING_FACTOR)), first
    if name in _BOOLEAN or not args:
        return 1.0, _SCALAR
    # anything else (getHost(), a quantity's string, ...): no longer than its longest argument
    return 1.0, _Sized(1.0, max(map(_chars, args)), _common_owner(args))


def _is_text(value: _Value) -> bool:
    if isinstance(value, _Known):
        return isinstance(value.value, str | bytes)
    return value.text if value.text is not None else value.chars > value.length


def _common_owner(values: Sequence[_Value]) -> tuple[int, ...]:
    owned = [_owners(v) for v in values if not isinstance(v, _Known)]
    return owned[0] if owned and all(o == owned[0] for o in owned) else ()


def _field(value: _Value, name: str) -> _Value:
    if isinstance(value, _Known):
        data = value.value
        return _Known(data.get(name)) if isinstance(data, dict) else _Known(None)
    return value.element()


def _element(value: _Known) -> _Value:
    data = value.value
    items = list(data.values()) if isinstance(data, dict) else list(data) \
        if isinstance(data, list) else []
    return _join([_Known(v) for v in items]) if items else _SCALAR


def _index(value: _Value, key: _Value) -> _Value:
    if isinstance(value, _Known) and isinstance(key, _Known):
        data, k = value.value, key.value
        if isinstance(data, dict):
            return _Known(data.get(k))
        if isinstance(data, list) and type(k) is int and -len(data) <= k < len(data):
            return _Known(data[k])
        return _Known(None)
    if isinstance(value, _Known):
        return _element(value)
    return value.element()


_KNOWN_LIST_CAP: Final = 256  # longer accumulated lists are followed by their sizes only


def _concatenated(args: Sequence[_Value]) -> _Value:
    if all(isinstance(a, _Known) for a in args):
        left, right = (a.value for a in args if isinstance(a, _Known))
        if (type(left) is type(right) and isinstance(left, str | bytes)) or (
                isinstance(left, list) and isinstance(right, list)
                and len(left) + len(right) <= _KNOWN_LIST_CAP):
            return _Known(left + right)
    texts = {_is_text(a) for a in args}
    return _Sized(sum(map(_length, args)), sum(map(_chars, args)), _common_owner(args),
                  _join([a.element() if isinstance(a, _Sized) else _element(a)
                         for a in args]), texts.pop() if len(texts) == 1 else None)


def document_bound(limits: CostLimits) -> _Sized:
    """Any part of a document of at most ``limits.max_request_bytes``: strings of that many
    bytes (less two quotes), lists and maps of half as many elements (cel-go's
    ``(MaxRequestSizeBytes - 2) / (minSize + 1)`` with one-byte elements)."""
    return _document(float(limits.max_request_bytes - 2),
                     float((limits.max_request_bytes - 2) // 2))


def _document(chars: float, elements: float) -> _Sized:
    """Any part of data holding at most ``chars`` code points of strings and ``elements`` list
    and map elements in all (so the parts of disjoint elements sum to at most that)."""
    return _Sized(elements, chars, (), _Sized(elements, chars))


def profile(values: Iterable[Any]) -> tuple[int, int, int]:
    """(code points of all strings, list and map elements, the longest list or map) in
    ``values``, map keys counted as strings: what :func:`sizes` rounds into the bounds
    :func:`estimate_within` takes.

    One pass per request on the admission path (``RequestActivation._sizes``): scalars are
    counted where they are met, only containers go on the stack, and a map's keys are summed
    in one call (all ``str`` but for the rare int or bool key)."""
    chars = elements = longest = 0
    stack: list[Any] = []
    for value in values:
        kind = type(value)
        if kind is dict or kind is list:
            stack.append(value)
        elif kind is str or kind is bytes:
            chars += len(value)
    pop, push = stack.pop, stack.append
    while stack:
        container = pop()
        size = len(container)
        elements += size
        longest = max(longest, size)
        items = container
        if type(container) is dict:
            try:
                chars += sum(map(len, container))
            except TypeError:  # an int or bool key: only string keys count
                chars += sum(len(key) for key in container if type(key) is str)
            items = container.values()
        for item in items:
            kind = type(item)
            if kind is str:
                chars += len(item)
            elif kind is dict or kind is list:
                push(item)
            elif kind is bytes:
                chars += len(item)
    return chars, elements, longest


def sizes(chars: int, elements: int, longest: int) -> tuple[int, int, int]:
    """Each of :func:`profile`'s figures rounded up to a power of two (at least 16), so that
    requests of similar size share one estimate."""
    return (1 << max(chars, 15).bit_length(), 1 << max(elements, 15).bit_length(),
            1 << max(longest, 15).bit_length())


def estimate_within(tree: Node, chars: int, elements: int, longest: int, *,
                    iteration_cap: int = 9_999, checks: bool = True) -> int:
    """The worst-case cost of ``tree`` over any data with at most ``chars`` code points of
    strings, ``elements`` elements in all and no list or map longer than ``longest`` in its
    variables (:func:`sizes` of a request): a
    bound of its cost on that request without walking the request's values. ``checks=False``
    leaves out the authorizer checks (the caller counts those made, see
    :func:`calls_check`)."""
    walk = _Walk(_document(float(chars), float(longest)), float(iteration_cap), None,
                 AUTHORIZER_CHECK if checks else 0.0, float(elements))
    cost, _ = walk.node(tree, {})
    total = cost.total()
    together = total - walk.outer_iterations + iteration_cap * walk.costliest_iteration
    return math.ceil(min(total, together))


@dataclass(frozen=True)
class Estimate:
    """An expression's worst-case cost (cel-go cost units) over any document within the limits."""

    cost: int


def estimate(tree: Node, limits: CostLimits = DEFAULT_LIMITS, *,
             iteration_cap: int = 9_999, known: Mapping[str, Any] | None = None) -> Estimate:
    """The worst-case cost of ``tree`` (see the module docstring); ``iteration_cap`` is the most
    iterations the comprehensions of one evaluation may run together (the runtime's iteration
    budget less one); ``known``: variables whose value is known at load (a GPUPolicy's inline
    ``params``).

    The lesser of two bounds: each comprehension's iterations times its costliest iteration,
    and all comprehensions' iterations together (at most ``iteration_cap``) times the costliest
    iteration of any of them."""
    walk = _Walk(document_bound(limits), float(iteration_cap), None)
    scope = _scope(iteration_cap, known or {})
    cost, _ = walk.node(tree, scope)
    total = cost.total()
    together = total - walk.outer_iterations + iteration_cap * walk.costliest_iteration
    return Estimate(math.ceil(min(total, together)))


def calls_check(tree: Node) -> bool:
    """Whether ``tree`` calls ``check()`` (an authorizer check)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.kind == "call" and node.name == "check":
            return True
        stack.extend(node.children)
    return False


def _scope(iteration_cap: int, known: Mapping[str, Any]) -> dict[str, _Value]:
    """The variables of a walk: ``known`` as they are, ``gpu`` otherwise bounded as gpuguard's
    facts (:data:`FACT_BYTES`), the rest (``variables`` included) as a document."""
    facts = _Sized(float(iteration_cap), FACT_BYTES, (), _Sized(float(iteration_cap), FACT_BYTES))
    scope: dict[str, _Value] = {"gpu": facts}
    scope.update({name: _Known(value) for name, value in known.items()})
    return scope


def runtime_cost(tree: Node, data: Mapping[str, Any], limits: CostLimits = DEFAULT_LIMITS, *,
                 limit: int | None = None, iteration_cap: int = 9_999,
                 max_steps: int | None = None) -> int | None:
    """The cost of ``tree`` on ``data`` (variable name -> plain value, as the activation has
    them): an upper bound of cel-go's actual cost on the same data. Returns None as soon as the
    cost passes ``limit`` (the walk stops there, so a huge list costs the walk no more than the
    limit). A variable missing from ``data`` is bounded as at load.

    Raises:
        Undecided: ``max_steps`` comprehension iterations walked over ``data`` before the cost
            passed ``limit`` (bounds the walk's own work where cheap iterations would take it
            hundreds of thousands of steps to reach the limit).
    """
    walk = _Walk(document_bound(limits), float(iteration_cap), None if limit is None
                 else float(limit), max_steps=None if max_steps is None else float(max_steps))
    scope = _scope(iteration_cap, data)
    try:
        cost, _ = walk.node(tree, scope)
    except _Over:
        return None
    total = math.ceil(cost.total())
    return None if limit is not None and total > limit else total
