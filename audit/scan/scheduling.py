"""The kube-scheduler's filters that decide whether a pod may go to a node, as pure functions.

Owns the rules, as the Kubernetes API reference states them, that the audit needs to explain
pending GPU pods and stranded GPUs: taints and tolerations (only ``NoSchedule`` and ``NoExecute``
taints keep pods off; ``Exists`` with an empty key tolerates everything; an empty effect matches
every effect), ``nodeSelector`` (every pair must equal a node label) and required node affinity
(terms ORed, expressions within a term ANDed; ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``,
``Gt``, ``Lt``; ``matchFields`` on ``metadata.name``; an empty term matches no node).

Must not read objects from anywhere or know about GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from audit.scan.pods import Expression, Term, Toleration
from policies.json_fields import mapping_at

Taint = tuple[str, str, str]  # (key, value, effect)
_BLOCKING = ("NoSchedule", "NoExecute")


def taints_of(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The node's ``NoSchedule`` / ``NoExecute`` taints (``PreferNoSchedule`` only prefers)."""
    spec = mapping_at(node, "spec")
    found = []
    taints = spec.get("taints")
    for taint in taints if isinstance(taints, list) else ():  # node_capacity reports others
        if not isinstance(taint, Mapping):
            continue
        effect = str(taint.get("effect") or "")
        if effect in _BLOCKING:
            found.append((str(taint.get("key") or ""), str(taint.get("value") or ""), effect))
    return tuple(found)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Whether one toleration tolerates one taint."""
    key, operator, value, effect = toleration
    taint_key, taint_value, taint_effect = taint
    if effect and effect != taint_effect:
        return False
    if operator == "Exists":
        return not key or key == taint_key
    return key == taint_key and value == taint_value


def untolerated(tolerations: Sequence[Toleration], taints: Iterable[Taint]) -> list[Taint]:
    """The taints that none of ``tolerations`` tolerates."""
    return [t for t in taints if not any(tolerates(x, t) for x in tolerations)]


def format_taint(taint: Taint) -> str:
    """``key=value:Effect`` (``key:Effect`` without a value), as kubectl prints taints."""
    key, value, effect = taint
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def _expression_holds(expression: Expression, value: str | None) -> bool:
    _, operator, values = expression
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_holds(term: Term, labels: Mapping[str, str], name: str) -> bool:
    expressions, fields = term
    if not expressions and not fields:
        return False
    return (all(_expression_holds(e, labels.get(e[0])) for e in expressions)
            and all(_expression_holds(f, name if f[0] == "metadata.name" else None)
                    for f in fields))


def selects(node_selector: Sequence[tuple[str, str]], affinity: Sequence[Term] | None,
            labels: Mapping[str, str], name: str) -> bool:
    """Whether a pod's ``nodeSelector`` and required node affinity admit the node."""
    if any(labels.get(key) != value for key, value in node_selector):
        return False
    if affinity is None:
        return True
    return any(_term_holds(term, labels, name) for term in affinity)

