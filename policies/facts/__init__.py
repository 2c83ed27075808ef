"""GPU facts: what a pod, workload, node or admission request asks for and offers, as data.

Owns reading Kubernetes objects into typed facts: GPU requests of every vendor and sharing mode
(:mod:`~policies.facts.gpu`), the NVIDIA MIG catalog (:mod:`~policies.facts.mig`), node GPU
capacity (:mod:`~policies.facts.nodes`), workload templates (:mod:`~policies.facts.workloads`,
kinds in :mod:`~policies.facts.workload_kinds`), the AdmissionRequest view
(:mod:`~policies.facts.review`), quantities (:mod:`~policies.facts.quantity`), GPU resource
naming (:mod:`~policies.facts.resource_names`) and the cheap "may this ask for a GPU" test
(:mod:`~policies.facts.prefilter`).

The bottom of the core: it must not import the CEL layer, the policy model or the engine
(import-linter's policies layers contract).
"""
