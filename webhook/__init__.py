"""Admission webhook (to be filled by the webhook issue).

Will own the aiohttp HTTPS app: AdmissionReview ``admission.k8s.io/v1`` wire types, the
``/validate``, ``/mutate``, ``/healthz``, ``/readyz`` and ``/metrics`` handlers, middlewares, the
policy store with atomic hot reload, and Prometheus metrics. Must not evaluate policy logic itself
(that is :mod:`policies`).
"""
