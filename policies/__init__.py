"""gpuguard's pure core: GPU facts, the MIG catalog, policy model, CEL environment and engine.

Owns everything that decides: how much GPU (of which kind) a pod or workload asks for, which GPU
resources a node offers (:mod:`policies.facts`), the CEL environment (:mod:`policies.cel`), the
policy model (:mod:`policies.policy`), how policies evaluate (:mod:`policies.engine`) and the policy
test suites (:mod:`policies.suites`); the layers inside are in ``docs/ARCHITECTURE.md``. It must
not import aiohttp, the ``kubernetes`` client, sockets or NVML, and must not read the clock or the
environment; the only module that reads files is :mod:`policies.sources`.
"""
