"""The CEL layer: the Kubernetes CEL environment gpuguard's policies are written in.

Owns compiling and running CEL (:mod:`~policies.cel.runtime`, the only importer of the CEL
runtime), the Kubernetes CEL libraries (:mod:`policies.cel.library`, one module per library of
``k8s.io/apiserver/pkg/cel/library`` where it has its own), gpuguard's ``gpu`` functions and the
CEL view of the GPU facts (:mod:`~policies.cel.gpu`), the CEL source scanner
(:mod:`~policies.cel.scanner`) and CEL values back to JSON (:mod:`~policies.cel.json_values`).

Sits above :mod:`policies.facts`; must not import the policy model, the engine or the suites.
"""
