"""``gpuguard serve``: its arguments — what ``gpuguard serve --help`` needs, and nothing heavier.

Owns the flags of ``gpuguard serve`` (TLS material, policy sources, the server's limits and
timeouts, with :class:`webhook.settings.ServerSettings`' defaults); the server is
:mod:`gpuguard.serve_run`, imported only when the command runs (aiohttp, the kubernetes client,
the certificates and the policy engine: ~0.5 s of start-up that ``--help`` must not pay;
``tests/cli/test_cli_startup.py`` pins the import set). Exit codes: see :mod:`gpuguard.serve_run`.
Must not import the server, aiohttp, the kubernetes client, the certificates or the policy engine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpuguard.settings import add_gpu_settings
from policies.facts.resource_names import GPUSettings
from webhook.settings import ServerSettings

#: ``--dev``'s Service and namespace (the names in its throw-away certificate), and the default
#: namespace of the quota ledgers and the status Lease outside a pod.
DEV_SERVICE, DEV_NAMESPACE = "gpuguard", "gpuguard-system"


def run_command(args: argparse.Namespace, settings: GPUSettings) -> int:
    """Run ``gpuguard serve`` (:func:`gpuguard.serve_run.run_command`); returns the exit code."""
    from gpuguard import serve_run  # noqa: PLC0415 - the server, only when it runs

    return serve_run.run_command(args, settings)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard serve``; returns (name, handler)."""
    parser = commands.add_parser(
        "serve", help="run the validating + mutating admission webhook (HTTPS)",
        description="Serve POST /validate and /mutate (AdmissionReview admission.k8s.io/v1, "
        "v1beta1), GET /healthz, /readyz and /metrics over HTTPS. Policies and the serving "
        "certificate are reloaded when their files change.",
    )
    parser.add_argument("--policies", action="append", metavar="PATH",
                        help="policy file or directory, e.g. a mounted ConfigMap (repeatable); "
                        "default: the built-in library")
    parser.add_argument("--skip-broken", action="store_true",
                        help="serve the policies that load and leave out any that cannot, "
                        "naming them in /readyz and each decision log line (default: a policy "
                        "that cannot load refuses the whole set)")
    parser.add_argument("--cluster-policies", action="store_true",
                        help="also serve the cluster's GPUPolicy, GPUQuota and "
                        "GPUPolicyException objects (watched; merged with --policies, which then "
                        "has no built-in default), each accepted or refused on its own, and "
                        "write their status conditions (one replica, chosen by a Lease)")
    parser.add_argument("--status-lease-namespace", metavar="NAME",
                        help="namespace of the Lease gpuguard-policy-status that picks the "
                        "replica writing the objects' status (default: gpuguard's own "
                        f"namespace, else {DEV_NAMESPACE})")
    parser.add_argument("--cert", metavar="FILE", help="serving certificate chain (PEM)")
    parser.add_argument("--key", metavar="FILE", help="its private key (PEM)")
    parser.add_argument("--client-ca", metavar="FILE",
                        help="CA bundle (PEM) of the client certificate kube-apiserver presents: "
                        "POST /validate and /mutate then require a client certificate signed by "
                        "it (401 without one); /healthz, /readyz and /metrics stay open to "
                        "probes and scrapers without one")
    parser.add_argument("--dev", action="store_true",
                        help="generate a throw-away CA and serving certificate, listen on "
                        "127.0.0.1 and print a curl command to try it")
    parser.add_argument("--host", help="listening address (default 0.0.0.0; 127.0.0.1 with "
                        "--dev)")
    parser.add_argument("--port", type=int, default=8443, help="listening port (default 8443)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="worker processes sharing the port (default 1)")
    parser.add_argument("--namespace-labels", metavar="FILE",
                        help="namespace labels (YAML: name -> labels map, or kubectl get ns -o "
                        "yaml) instead of watching the cluster")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig to watch namespaces with (default: in-cluster, then "
                        "$KUBECONFIG, then ~/.kube/config; none: standalone)")
    parser.add_argument("--quota-namespace", metavar="NAME",
                        help="namespace of the GPUQuota reservation ledgers (ConfigMaps "
                        "gpuguard-quota-<name>; default: gpuguard's own namespace, else "
                        f"{DEV_NAMESPACE})")
    parser.add_argument("--deadline-ms", type=int, default=ServerSettings.deadline_ms,
                        metavar="N", help="evaluation deadline in ms; keep it below the "
                        "webhook's timeoutSeconds (default %(default)s)")
    parser.add_argument("--inline-max-bytes", type=int,
                        default=ServerSettings.inline_max_bytes, metavar="N",
                        help="evaluate request bodies up to N bytes on the event loop first, "
                        "larger ones in the thread pool; 0: always the pool "
                        "(default %(default)s)")
    parser.add_argument("--inline-slice-ms", type=int,
                        default=ServerSettings.inline_slice_ms, metavar="MS",
                        help="an evaluation still running on the event loop after MS "
                        "milliseconds is done again in the thread pool (default %(default)s)")
    parser.add_argument("--eval-threads", type=int, default=ServerSettings.eval_threads,
                        metavar="N", help="threads evaluating policies of bodies over "
                        "--inline-max-bytes, per worker (default %(default)s)")
    parser.add_argument("--max-large-requests", type=int,
                        default=ServerSettings.max_large_requests, metavar="N",
                        help="requests with a body over --inline-max-bytes (or compressed) "
                        "read, decoded and evaluated at once per worker; the others wait unread, "
                        "and one whose deadline passes while waiting gets 429 "
                        "(default %(default)s)")
    parser.add_argument("--eval-processes", type=int, default=ServerSettings.eval_processes,
                        metavar="N", help="worker processes that decode and evaluate bodies "
                        "over --inline-max-bytes, per worker, one request each at a time (not "
                        "for policy sets with GPUQuota or authorizer checks); 0: threads "
                        "(default %(default)s)")
    parser.add_argument("--decode-threads", type=int, default=ServerSettings.decode_threads,
                        metavar="N", help="threads decoding request bodies over "
                        "--inline-max-bytes and compressed ones, per worker "
                        "(default %(default)s)")
    parser.add_argument("--header-timeout-s", type=float,
                        default=ServerSettings.header_timeout_s, metavar="S",
                        help="close a connection that takes longer than S seconds for its TLS "
                        "handshake or a request header (slow clients; default %(default)s)")
    parser.add_argument("--body-timeout-s", type=float, default=ServerSettings.body_timeout_s,
                        metavar="S", help="answer 408 to a request whose body takes longer than "
                        "S seconds to arrive (default %(default)s)")
    parser.add_argument("--max-connections", type=int, default=ServerSettings.max_connections,
                        metavar="N", help="most open connections per worker; at the limit a "
                        "new one evicts a stalled or the longest-idle one (default %(default)s)")
    parser.add_argument("--max-idle-connections", type=int,
                        default=ServerSettings.max_idle_connections, metavar="N",
                        help="most idle keep-alive connections per worker; the longest-idle "
                        "ones beyond N are closed (default %(default)s)")
    parser.add_argument("--policy-reload-s", type=float, default=ServerSettings.policy_reload_s,
                        metavar="S", help="seconds between policy file checks "
                        "(default %(default)s)")
    parser.add_argument("--policy-removal-quiet-s", type=float,
                        default=ServerSettings.policy_removal_quiet_s, metavar="S",
                        help="seconds a change that removes content from a policy (a field, a "
                        "validation, the end of an expression: what a truncated file looks "
                        "like) must hold still before it is served; 0: as any change "
                        "(default %(default)s)")
    parser.add_argument("--tls-reload-s", type=float, default=ServerSettings.tls_reload_s,
                        metavar="S", help="seconds between certificate file checks "
                        "(default %(default)s)")
    parser.add_argument("--shutdown-delay-s", type=float,
                        default=ServerSettings.shutdown_delay_s, metavar="S",
                        help="after SIGTERM, seconds answering while not ready "
                        "(default %(default)s)")
    parser.add_argument("--drain-timeout-s", type=float, default=ServerSettings.drain_timeout_s,
                        metavar="S", help="longest wait for requests in flight at shutdown "
                        "(default %(default)s)")
    parser.add_argument("--log-objects", action="store_true",
                        help="include object and oldObject in the decision log lines")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--benchmark-routes", action="store_true", help=argparse.SUPPRESS)
    add_gpu_settings(parser)
    return "serve", run_command

