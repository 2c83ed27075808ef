"""The policy model: gpuguard policy documents, as read from YAML and checked before serving.

Owns the typed documents (:mod:`~policies.policy.model`), loading and validating them from files
(:mod:`~policies.policy.loader`), the one applicability decision "does this policy apply to this
request" (:mod:`~policies.policy.matching`), mutations as RFC 6902 patches
(:mod:`~policies.policy.mutation`) and GPU quota semantics (:mod:`~policies.policy.quota`).

Sits above :mod:`policies.cel` and :mod:`policies.facts`; must not import the engine or the
suites.
"""
