"""What a failed validation says: the one place a validation's failure message is decided.

Owns the ValidatingAdmissionPolicy rule (Kubernetes API reference, ``Validation.message`` and
``messageExpression``): the message is the ``messageExpression``'s value when that is a non-empty
string (stripped) of at most 5 KiB without a line break, else the static ``message``, else
``failed expression: <expression>`` with
the expression as the user wrote it. When a messageExpression gives no usable message (it failed,
or its value is not such a string), a native policy's message is that fallback alone, as the API
server answers (it only logs why); a GPUPolicy's adds why in parentheses, for its author
(:func:`fallback_message`). The rule-by-rule path (:mod:`policies.engine.evaluation`)
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


MAX_MESSAGE_BYTES = 5 * 1024
"""The longest messageExpression value used (``celconfig.MaxEvaluatedMessageExpressionSizeBytes``,
k8s.io/apiserver/pkg/apis/cel/config.go), in bytes of UTF-8 after stripping."""


def expression_message(value: object) -> str | None:
    """A messageExpression's value as the message (the string stripped), or None when the
    value is not a non-empty string of at most :data:`MAX_MESSAGE_BYTES` without a line break
    (the API server's ``validator.go`` falls back then): :func:`static_message` is the message."""
    if type(value) is str and (message := value.strip()) and "\n" not in message \
            and len(message.encode()) <= MAX_MESSAGE_BYTES:
        return message
    return None


def expression_problem(value: object) -> str:
    """Why a messageExpression's value (one :func:`expression_message` refused) was not used,
    for the message's ``(...)`` note."""
    if isinstance(value, str):
        message = value.strip()
        if not message:
            return "messageExpression returned an empty string"
        if "\n" in message:
            return "messageExpression returned a message with a line break"
        return f"messageExpression returned {len(message.encode())} bytes, more than " \
            f"{MAX_MESSAGE_BYTES}"
    return f"messageExpression returned {type(value).__name__}, not a string"


def fallback_message(rule: Rule, problem: str, *, native: bool) -> str:
    """The message of a failed validation whose messageExpression gave none (``problem``:
    why, from :func:`expression_problem` or the evaluation error): :func:`static_message`,
    with ``problem`` in parentheses for a GPUPolicy (``native`` False). kube-apiserver 1.37
    answers a ValidatingAdmissionPolicy's with the static message alone (measured: a
    messageExpression with a line break and one failing on a missing key)."""
    return static_message(rule) if native else f"{static_message(rule)} ({problem})"
