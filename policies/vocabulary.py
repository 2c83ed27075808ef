"""The closed word sets of admission policies: validation actions, failure policies, points.

Owns the values the Kubernetes ``admissionregistration.k8s.io/v1`` API spells as fixed strings
(``validationActions``, ``failurePolicy``) and the two points gpuguard evaluates at. Each is a
:class:`enum.StrEnum`, so a member is the very string the API uses: it compares equal to it, and
JSON, log lines and messages read exactly as before.

Shared by the policy model (:mod:`policies.policy.model`), the quota model
(:mod:`policies.policy.quota`) and the engine; kept apart from the model so the quota model need
not import the CEL layer. Must not import anything of gpuguard.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

StrEnumT = TypeVar("StrEnumT", bound=StrEnum)


class ValidationAction(StrEnum):
    """What a failed validation does (``validationActions``): deny the request, return a
    warning, or write an audit annotation (Kubernetes API reference, ValidatingAdmissionPolicy
    Binding)."""

    DENY = "Deny"
    WARN = "Warn"
    AUDIT = "Audit"


class FailurePolicy(StrEnum):
    """What an evaluation error does (``failurePolicy``): ``Fail`` denies, ``Ignore`` allows.

    GPUQuota uses the same words for a quota whose usage cannot be read or reserved.
    """

    FAIL = "Fail"
    IGNORE = "Ignore"


class EvaluationPoint(StrEnum):
    """Where a policy set is evaluated: an admission request (the webhook, ``gpuguard check``)
    or an existing object judged as if created (``gpuguard audit``: nothing is denied and
    mutations are reported as what admission would change)."""

    ADMISSION = "admission"
    AUDIT = "audit"


def parsed(kind: type[StrEnumT], value: object, default: StrEnumT) -> StrEnumT:
    """``value`` as a member of ``kind``; ``default`` when it is missing or not one.

    For the loader only, where the schema has already reported a wrong value (an ``enum`` in
    ``policies/data/*.schema.json``) and the document is then not served: the default keeps the
    model's fields typed while the error is collected, and never decides anything.
    """
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    return default


class EvaluationMode(StrEnum):
    """How the engine evaluates a policy set (:class:`policies.engine.evaluation.Engine`).

    ``fast`` is what the webhook, ``gpuguard check`` and the audit run: variables and params
    compiled into the expressions, one CEL program per policy's validation pass, one evaluation
    for all matching policies (:mod:`policies.engine.compiled`). ``reference`` evaluates every
    policy as written, rule by rule, each on its own activation: the unoptimised semantics the
    fast path is tested against on the corpus (it must decide, say and patch the same).
    """

    FAST = "fast"
    REFERENCE = "reference"
