"""Admission webhook: the aiohttp HTTPS server behind ``gpuguard serve``.

Owns serving admission over HTTPS: the AdmissionReview wire format (``admission.k8s.io/v1`` and
``v1beta1``), the ``/validate``, ``/mutate``, ``/healthz``, ``/readyz`` and ``/metrics`` handlers,
the request deadline with the failurePolicy fallback, the policy store with atomic hot reload
(files, directories, ConfigMap mounts), readiness, Prometheus metrics, structured logs and the
server lifecycle (certificate reload, graceful shutdown). Modules, by role:

- :mod:`webhook.settings`: :class:`~webhook.settings.ServerSettings`, built once by the CLI.
- :mod:`webhook.wire`: request bytes → envelope (every 4xx), response maps.
- :mod:`webhook.admission`: one decision (namespace object, engine passes per endpoint, thread
  pool under the deadline, failurePolicy fallback, dryRun).
- :mod:`webhook.policy_store`: the policy set being served and its hot reload.
- :mod:`webhook.health`: readiness checks. :mod:`webhook.metrics`: Prometheus metrics.
- :mod:`webhook.logs`: JSON log lines. :mod:`webhook.app`: routes and handlers.
- :mod:`webhook.server`: one worker's lifecycle.

Must not evaluate policy logic itself (that is :mod:`policies`), import :mod:`certs` (the TLS
object is passed in by :mod:`gpuguard.serve_command`) or the ``kubernetes`` client (namespace
objects come from :mod:`kube` through the source passed in).
"""
