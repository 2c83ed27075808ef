"""The engine: a loaded policy set evaluated on one admission request.

Owns :class:`policies.engine.evaluation.Engine` (verdicts, warnings, patches, audit
annotations) and its fast path: inlined variables and params (:mod:`~policies.engine.inlining`)
and fused validation programs (:mod:`~policies.engine.fused`).

Sits above the policy model; must not import :mod:`policies.suites`.
"""
