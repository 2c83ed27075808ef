"""What a failed validation says: the one place a validation's failure message is decided.

Owns the ValidatingAdmissionPolicy rule (Kubernetes API reference, ``Validation.message`` and
``messageExpression``): the message is the ``messageExpression``'s value when that is a non-empty
string (stripped), else the static ``message``, else ``failed expression: <expression>`` with
the expression as the user wrote it. The rule-by-rule path (:mod:`policies.engine.evaluation`)
and the reader of fused programs (:mod:`policies.engine.fused`) both build messages here, so the
two cannot drift apart.

Must not evaluate anything: callers pass the messageExpression's value.
"""

from __future__ import annotations

from policies.policy.model import Rule


def static_message(rule: Rule) -> str:
    """The message of a failed validation without a usable messageExpression value: its
    ``message``, else ``failed expression: <expression>`` (``rule`` as written: an inlined
    rule's expression is not what the user wrote)."""
    return rule.message or f"failed expression: {rule.expression.expression.strip()}"


def expression_message(value: object) -> str | None:
    """A messageExpression's value as the message (the string stripped), or None when the
    value is not a non-empty string: :func:`static_message` is then the message."""
    if type(value) is str and value.strip():
        return value.strip()
    return None


def expression_problem(value: object) -> str:
    """Why a messageExpression's value (one :func:`expression_message` refused) was not used,
    for the message's ``(...)`` note."""
    if isinstance(value, str):
        return "messageExpression returned an empty string"
    return f"messageExpression returned {type(value).__name__}, not a string"
