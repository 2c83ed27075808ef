"""The engine: a loaded policy set evaluated on one admission request.

Owns :class:`policies.engine.evaluation.Engine` (verdicts, warnings, patches, audit
annotations), the failure-message rule (:mod:`~policies.engine.messages`) and its fast path,
contained behind :class:`policies.engine.compiled.CompiledPolicy`: inlined variables and params
(:mod:`~policies.engine.inlining`) and fused validation programs (:mod:`~policies.engine.fused`),
which nothing else imports (an import-linter contract).

Sits above the policy model; must not import :mod:`policies.suites`.
"""
