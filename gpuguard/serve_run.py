"""``gpuguard serve``'s run: the admission webhook (the composition root of the server; its flags
are :mod:`gpuguard.serve_command`, which imports this module only when the command runs: the
server, aiohttp, the kubernetes client and the policy engine cost ~0.5 s of CPU that ``--help``
must not pay).

Builds the settings once from the command line, checks the inputs (certificate, policies' paths,
namespace-labels file, cluster configuration) before anything starts so that mistakes exit 2 with
one clear line, then wires :mod:`certs` (``ReloadingTLS``), :mod:`kube` (namespace watch cache or
standalone file) and :mod:`webhook` together in each worker process. With ``--workers N`` the
parent spawns N workers sharing the port (``SO_REUSEPORT``), forwards SIGTERM / SIGINT to them,
restarts one that dies unexpectedly, and exposes their summed metrics (prometheus-client
multiprocess mode). ``--client-ca FILE`` makes ``/validate`` and ``/mutate`` require a client
certificate signed by that CA (kube-apiserver presents one when its admission configuration's
kubeconfig for the webhook names a client certificate); the health and metrics endpoints stay
open. ``--dev`` makes a throw-away CA and serving certificate in a temporary
directory and prints a ready-to-paste ``curl`` command. ``--cluster-policies`` serves the
cluster's gpuguard.io objects with the files (:mod:`webhook.cluster_store`, fed by
:class:`kube.policy_objects.PolicyObjectWatch`; status written by the holder of the Lease
:data:`kube.policy_status.LEASE_NAME`, elected by :class:`kube.lease.LeaseElector`).

GPUQuota documents (loaded from the ``--policies`` paths with the policies, reloaded with them)
are enforced on ``/validate``: with a cluster, usage comes from a pod watch
(:class:`kube.pod_cache.PodCache`) and reservations go to ConfigMap ledgers in
``--quota-namespace`` (default: the pod's own namespace, else ``gpuguard-system``); standalone,
there is no pod usage to count — the ledger is in memory and only this process's own admissions
(for the reservation TTL) and per-pod limits count, which start-up logs as a warning.

Exit codes: 0 after a graceful shutdown; 1 the server could not start (port taken) or a worker
failed; 2 bad usage or input (missing certificate, refused TLS material, unreadable namespace
labels, unusable kubeconfig).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from types import FrameType
from typing import Any

from certs.files import CA_CERT, TLS_CERT, TLS_KEY
from certs.generate import generate_ca, generate_serving_cert
from certs.material import utc_now
from certs.tls import ReloadingTLS, TLSError, describe
from gpuguard import policy_set
from gpuguard.bundled_examples import ADMISSION_REVIEW
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_OK, EXIT_SOFTWARE, EXIT_USAGE
from gpuguard.serve_command import DEV_NAMESPACE, DEV_SERVICE
from kube.config import ClusterConfigError, detect
from kube.lease import LeaseElector
from kube.namespaces import (
    NamespaceFileError,
    NamespaceWatch,
    StaticNamespaces,
    read_namespace_file,
)
from kube.pod_cache import PodCache, PodUsageIndex
from kube.policy_objects import PolicyObjectWatch
from kube.policy_status import LEASE_NAME, StatusPublisher
from kube.quota_ledger import ConfigMapLedgerStore, MemoryLedgerStore, QuotaLedger
from kube.runtime_classes import RuntimeClassWatch
from kube.subject_access_reviews import (
    SARSettings,
    SubjectAccessReviewAuthorizer,
    api_create_review,
)
from policies.authorization import Authorizer, Unavailable
from policies.facts.resource_names import GPUSettings
from policies.sources import read_documents
from webhook import logs
from webhook.cluster_store import ClusterPolicyStore
from webhook.metrics import enable_multiprocess, mark_worker_dead
from webhook.policy_store import PolicyStore
from webhook.quota import QuotaGate
from webhook.server import Server, run
from webhook.settings import ServerSettings

LOG = logging.getLogger("gpuguard.serve")
SAMPLE_REVIEW = ADMISSION_REVIEW  # also in a wheel install (package data)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class ServeConfig:
    """Everything a worker needs, built once by :func:`run` (picklable: sent to workers).

    Attributes:
        server: the server settings.
        gpu: GPU naming and sharing.
        policies: policy files / directories, or None for the built-in library.
        cert_file / key_file: the serving certificate chain and key (PEM).
        client_ca: CA certificates (PEM) client certificates must chain to; None: no client
            certificate is asked for.
        namespace_labels: a namespace-labels file (standalone namespaces), or None.
        kubeconfig: an explicit kubeconfig, or None to detect.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        quota_namespace: where the GPUQuota ledgers (ConfigMaps) live.
        skip_broken: serve the policies that load, leaving out (and naming in ``/readyz`` and
            each decision log line) those that cannot; default: refuse the whole set.
        cluster_policies: also serve the cluster's GPUPolicy / GPUQuota / GPUPolicyException
            objects (:mod:`webhook.cluster_store`).
        status_lease_namespace: where the Lease picking the replica that writes those objects'
            status lives (:mod:`kube.policy_status`).
        dev: ``--dev``'s throw-away TLS material: the worker that has it prints the curl
            commands once it listens (the supervisor gives it to worker 0 only).
    """

    server: ServerSettings
    gpu: GPUSettings
    policies: tuple[str, ...] | None
    cert_file: str
    key_file: str
    namespace_labels: str | None
    kubeconfig: str | None
    log_level: str = "info"
    quota_namespace: str = DEV_NAMESPACE
    client_ca: str | None = None
    skip_broken: bool = False
    cluster_policies: bool = False
    status_lease_namespace: str = DEV_NAMESPACE
    dev: DevMaterial | None = None


def default_quota_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """Where the ledgers live: the service account's namespace, else ``gpuguard-system``."""
    try:
        name = Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return DEV_NAMESPACE
    return name or DEV_NAMESPACE


def _labels_of(namespaces: StaticNamespaces | NamespaceWatch) -> Any:
    def labels(name: str) -> Any:
        metadata = namespaces.get(name).get("metadata")
        return (metadata.get("labels") if isinstance(metadata, dict) else None) or {}
    return labels


def quota_gate(config: ServeConfig, namespaces: StaticNamespaces | NamespaceWatch,
               ) -> tuple[QuotaGate, PodCache | None]:
    """The GPUQuota step and, with a cluster, the pod watch feeding it (not started).

    Raises:
        ClusterConfigError: a cluster configuration was found but cannot be used.
    """
    labels = _labels_of(namespaces)
    index = PodUsageIndex(labels, config.gpu)
    cluster = detect(config.kubeconfig)
    if cluster is None:
        return QuotaGate(QuotaLedger(MemoryLedgerStore(), index), labels, config.gpu,
                         source="none (standalone): in-memory ledger, no pod watch"), None
    cache = PodCache(cluster.api_client, index)
    store = ConfigMapLedgerStore(cluster.api_client, config.quota_namespace)
    gate = QuotaGate(QuotaLedger(store, cache), labels, config.gpu,
                     source=f"pod watch and ConfigMap ledgers in {config.quota_namespace} "
                     f"({cluster.source})", usage_status=cache.status)
    return gate, cache


STANDALONE_AUTHORIZER = ("gpuguard serve runs standalone (no cluster connection), so it cannot "
                         "ask SubjectAccessReviews")
"""Why every ``authorizer`` check is an errored decision without a cluster."""


def authorizer_of(config: ServeConfig) -> Authorizer:
    """What CEL ``authorizer`` checks ask: SubjectAccessReviews through the cluster (cached,
    :class:`~kube.subject_access_reviews.SARSettings`), or, standalone, an authorizer whose every
    check is an errored decision saying so (the policy's failurePolicy then decides).

    Raises:
        ClusterConfigError: a cluster configuration was found but cannot be used.
    """
    cluster = detect(config.kubeconfig)
    if cluster is None:
        return Unavailable(STANDALONE_AUTHORIZER)
    settings = SARSettings()
    return SubjectAccessReviewAuthorizer(api_create_review(cluster.api_client,
                                                           settings.timeout_s), settings)


def namespace_source(config: ServeConfig) -> StaticNamespaces | NamespaceWatch:
    """The namespace source: the labels file if given, else the cluster, else none.

    Raises:
        NamespaceFileError: the labels file cannot be used.
        ClusterConfigError: a cluster configuration was found but cannot be used.
    """
    if config.namespace_labels:
        return StaticNamespaces(read_namespace_file(config.namespace_labels),
                                f"file {config.namespace_labels}")
    cluster = detect(config.kubeconfig)
    if cluster is None:
        return StaticNamespaces({}, "none (standalone)")
    watch = NamespaceWatch(cluster.api_client)
    watch.source = f"cluster watch ({cluster.source})"
    return watch


def runtime_class_watch(config: ServeConfig) -> RuntimeClassWatch | None:
    """The RuntimeClass watch of the cluster, None standalone (RuntimeClasses then stay not
    known, and a setRuntimeClassName mutation applies as written: docs/policies.md).

    Raises:
        ClusterConfigError: a cluster configuration was found but cannot be used.
    """
    cluster = detect(config.kubeconfig)
    return RuntimeClassWatch(cluster.api_client) if cluster is not None else None


def _certificate_check(tls: ReloadingTLS) -> Callable[[], str | None]:
    def check() -> str | None:
        if tls.not_after <= utc_now():
            return (f"the serving certificate {tls.cert_file} expired at "
                    f"{tls.not_after:%Y-%m-%dT%H:%M:%SZ}")
        return None
    return check


def serve_worker(config: ServeConfig) -> int:
    """Run one server process until SIGTERM / SIGINT; returns its exit code."""
    logs.configure(config.log_level)
    try:
        tls = ReloadingTLS(config.cert_file, config.key_file, client_ca=config.client_ca)
        namespaces = namespace_source(config)
        quota, pod_cache = quota_gate(config, namespaces)
        authorizer = authorizer_of(config)
        cluster = detect(config.kubeconfig) if config.cluster_policies else None
        runtime_classes = runtime_class_watch(config)
    except (TLSError, NamespaceFileError, ClusterConfigError) as exc:
        LOG.error("cannot start", extra={"fields": {"error": str(exc)}})
        return EXIT_USAGE
    loader = functools.partial(policy_set.load, settings=config.gpu,
                               skip_broken=config.skip_broken)
    removal_quiet_s = config.server.policy_removal_quiet_s
    store: PolicyStore = PolicyStore(config.policies, loader, removal_quiet_s=removal_quiet_s)
    watch = None
    elector: LeaseElector | None = None
    if cluster is not None:
        watch = PolicyObjectWatch(cluster.api_client)
        # Renewed at each policy check: held for three check intervals (at least 15 s).
        elector = LeaseElector(cluster.api_client, config.status_lease_namespace, LEASE_NAME,
                               replica_identity(), lease_duration_s=max(
                                   15, math.ceil(3 * config.server.policy_reload_s)),
                               clock=time.monotonic)
        store = ClusterPolicyStore(config.policies, loader, watch,
                                   publisher=StatusPublisher(cluster.api_client, elector.leading),
                                   removal_quiet_s=removal_quiet_s)
    banner = functools.partial(_print_dev_help, config.dev, config.server.host) \
        if config.dev is not None else None
    server = Server(config.server, store, namespaces, tls,
                    certificate_check=_certificate_check(tls), quota=quota,
                    authorizer=authorizer, policy_objects=watch,
                    runtime_classes=runtime_classes.names if runtime_classes else None,
                    on_listening=banner)
    if pod_cache is not None:
        pod_cache.start()
    if runtime_classes is not None:
        runtime_classes.start()
    try:
        # a port that is taken or an address that is not this machine's: the environment (3)
        return EXIT_OK if run(server) else EXIT_ENVIRONMENT
    finally:
        if pod_cache is not None:
            pod_cache.stop()
        if runtime_classes is not None:
            runtime_classes.stop()
        if elector is not None:
            # A standby takes over the status writes now, not a lease duration later.
            elector.release()


def replica_identity() -> str:
    """The worker's name in the status Lease: the pod's (``POD_NAME``, else the host name) and
    the process id, as each worker process is a replica of its own."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}/{os.getpid()}"


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(EXIT_OK)


def _worker_entry(config: ServeConfig) -> None:  # the spawned process's target
    # A SIGTERM that arrives while the worker is still starting (nothing to drain yet) is a
    # clean stop too; once serving, the event loop's handler takes over (graceful shutdown).
    signal.signal(signal.SIGTERM, _exit_quietly)
    sys.exit(serve_worker(config))


def supervise(config: ServeConfig) -> int:
    """Run ``config.server.workers`` worker processes until SIGTERM / SIGINT (see module doc)."""
    context = multiprocessing.get_context("spawn")
    metrics_dir = tempfile.mkdtemp(prefix="gpuguard-metrics-")
    enable_multiprocess(metrics_dir)
    stopping = False

    def start(index: int) -> Any:
        # --dev's curl commands: once, from the first worker, when it listens
        worker = config if index == 0 else dataclasses.replace(config, dev=None)
        process = context.Process(target=_worker_entry, args=(worker,),
                                  name=f"gpuguard-worker-{index}", daemon=False)
        process.start()
        LOG.info("worker started", extra={"fields": {"worker": index, "worker_pid":
                                                     process.pid}})
        return process

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in workers.values():
            if process.is_alive():
                process.terminate()  # SIGTERM: each worker shuts down gracefully

    workers = {i: start(i) for i in range(config.server.workers)}
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    restarts: dict[int, int] = {}
    code = EXIT_OK  # the first worker failure decides: 2 bad input, 3 environment, else 70
    try:
        while workers:
            wait([p.sentinel for p in workers.values()], timeout=1.0)
            for index, process in list(workers.items()):
                if process.is_alive():
                    continue
                process.join()
                mark_worker_dead(process.pid)
                del workers[index]
                exitcode = process.exitcode
                if stopping:
                    if code == EXIT_OK and exitcode not in (EXIT_OK, -signal.SIGTERM):
                        code = exitcode if exitcode in (EXIT_USAGE, EXIT_ENVIRONMENT) \
                            else EXIT_SOFTWARE
                    continue
                if exitcode in (EXIT_USAGE, EXIT_ENVIRONMENT):
                    # bad input, or a port taken / an address not ours: restarting cannot help
                    code = code or exitcode
                    stop(signal.SIGTERM, None)
                    continue
                count = restarts.get(index, 0)
                delay = _RESTART_BACKOFF_S[min(count, len(_RESTART_BACKOFF_S) - 1)]
                LOG.error("worker exited unexpectedly; restarting", extra={"fields": {
                    "worker": index, "exitcode": process.exitcode, "restart_in_s": delay}})
                restarts[index] = count + 1
                time.sleep(delay)
                if not stopping:
                    workers[index] = start(index)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return code


@dataclass(frozen=True)
class DevMaterial:
    """Throw-away TLS material of ``--dev``: the directory and the three files in it."""

    directory: str
    ca_file: str
    cert_file: str
    key_file: str


def make_dev_material(directory: str, host: str = "127.0.0.1") -> DevMaterial:
    """A fresh CA and a serving certificate (localhost, 127.0.0.1, ::1, the Service names, and
    ``host`` when it is another address: the one :func:`curl_command` then posts to)."""
    ca_pem, ca_key = generate_ca("gpuguard dev CA (throw-away)", days=1)
    sans = ("localhost", "127.0.0.1", "::1", *(() if host in _LOOPBACK_OR_ANY else (host,)))
    cert_pem, key_pem = generate_serving_cert(ca_pem, ca_key, DEV_SERVICE, DEV_NAMESPACE, days=1,
                                              extra_sans=sans)
    paths = {}
    for name, data, mode in ((CA_CERT, ca_pem, 0o644), (TLS_CERT, cert_pem, 0o644),
                             (TLS_KEY, key_pem, 0o600)):
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        paths[name] = path
    return DevMaterial(directory, paths[CA_CERT], paths[TLS_CERT], paths[TLS_KEY])


#: Listening addresses that ``localhost`` reaches (the dev certificate names localhost).
_LOOPBACK_OR_ANY = frozenset({"127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""})


def curl_command(ca_file: str, port: int, endpoint: str = "validate",
                 review: Path = SAMPLE_REVIEW, *, host: str = "127.0.0.1") -> str:
    """The ``curl`` command posting the sample AdmissionReview to a ``--dev`` server listening
    on ``host``: ``localhost`` for a loopback or wildcard address, else ``host`` itself (in
    brackets for IPv6), which the dev certificate then names too (:func:`make_dev_material`)."""
    authority = "localhost" if host in _LOOPBACK_OR_ANY else f"[{host}]" if ":" in host else host
    return (f"curl --cacert {ca_file} -H 'Content-Type: application/json' "
            f"--data-binary @{review} https://{authority}:{port}/{endpoint}")


def build_config(args: argparse.Namespace, settings: GPUSettings, *,
                 cert_file: str, key_file: str) -> ServeConfig:
    """The :class:`ServeConfig` of the parsed arguments.

    Raises:
        ValueError: a setting out of range; the message names it.
    """
    host = args.host or ("127.0.0.1" if args.dev else "0.0.0.0")
    server = ServerSettings(
        host=host, port=args.port, workers=args.workers, deadline_ms=args.deadline_ms,
        inline_max_bytes=args.inline_max_bytes, inline_slice_ms=args.inline_slice_ms,
        eval_threads=args.eval_threads, decode_threads=args.decode_threads,
        max_large_requests=args.max_large_requests, eval_processes=args.eval_processes,
        header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        max_idle_connections=args.max_idle_connections, client_auth=bool(args.client_ca),
        policy_reload_s=args.policy_reload_s, policy_removal_quiet_s=args.policy_removal_quiet_s,
        tls_reload_s=args.tls_reload_s, shutdown_delay_s=args.shutdown_delay_s,
        drain_timeout_s=args.drain_timeout_s, log_objects=args.log_objects,
        benchmark_routes=args.benchmark_routes,
    )
    return ServeConfig(server=server, gpu=settings,
                       policies=tuple(args.policies) if args.policies else None,
                       cert_file=cert_file, key_file=key_file,
                       namespace_labels=args.namespace_labels, kubeconfig=args.kubeconfig,
                       log_level=args.log_level,
                       quota_namespace=args.quota_namespace or default_quota_namespace(),
                       client_ca=args.client_ca, skip_broken=args.skip_broken,
                       cluster_policies=args.cluster_policies,
                       status_lease_namespace=args.status_lease_namespace
                       or default_quota_namespace())


def _holds_quota(policies: tuple[str, ...] | None) -> bool:
    """Whether the policy files hold a ``GPUQuota`` document (the built-in library holds none);
    unreadable files are the policy store's to report."""
    if policies is None:
        return False
    documents, _errors = read_documents(list(policies))
    return any(isinstance(d.body, dict) and d.body.get("kind") == "GPUQuota" for d in documents)


def _preflight(config: ServeConfig) -> str | None:
    """Check the inputs once, in the parent; returns the first problem, or None."""
    try:
        tls = ReloadingTLS(config.cert_file, config.key_file, client_ca=config.client_ca)
        source = namespace_source(config)
        cluster = detect(config.kubeconfig)
    except (TLSError, NamespaceFileError, ClusterConfigError) as exc:
        return str(exc)
    for path in config.policies or ():
        if not Path(path).exists():
            return f"--policies {path}: no such file or directory"
    if config.cluster_policies and cluster is None:
        return ("--cluster-policies: no cluster configured (no kubeconfig, not in a pod): give "
                "--kubeconfig FILE")
    standalone = isinstance(source, StaticNamespaces) and not config.namespace_labels
    LOG.info("starting gpuguard serve", extra={"fields": {
        "certificate": describe(tls), "client_ca": config.client_ca,
        "policies": ", ".join(config.policies or ())
        or ("no files" if config.cluster_policies else "built-in library"),
        "cluster_policies": config.cluster_policies, "namespaces": source.source,
        "workers": config.server.workers,
        "port": config.server.port}})
    if standalone:
        LOG.warning("no cluster configured (no kubeconfig, not in a pod): running standalone; "
                    "namespaces carry only their kubernetes.io/metadata.name label (use "
                    "--namespace-labels FILE to give their labels)")
    elif isinstance(source, StaticNamespaces):
        LOG.info("namespace labels from a file, not from the cluster",
                 extra={"fields": {"file": config.namespace_labels}})
    if cluster is None and _holds_quota(config.policies):
        LOG.warning("GPUQuota enforcement needs a cluster: no pod watch, so pods already "
                    "running are not counted; quotas count only this process's own admissions "
                    "(in-memory ledger, 60 s reservations) and per-pod limits")
    elif cluster is None:  # said once, quietly: a GPUQuota may be added to the files later
        LOG.info("no GPUQuota in the policy set; one added later is enforced standalone "
                 "(in-memory ledger, no pod watch)")
    else:
        LOG.info("GPUQuota usage from the cluster pod watch", extra={"fields": {
            "ledger_namespace": config.quota_namespace}})
    return None


def run_command(args: argparse.Namespace, settings: GPUSettings) -> int:
    """Handle ``gpuguard serve`` (see module docstring for the exit codes)."""
    try:
        logs.configure(args.log_level)
    except ValueError as exc:
        print(f"gpuguard serve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.dev and not (args.cert and args.key):
        print("gpuguard serve: error: --cert and --key are required (or --dev for a throw-away "
              "certificate)", file=sys.stderr)
        return EXIT_USAGE
    dev_dir = tempfile.mkdtemp(prefix="gpuguard-dev-") if args.dev else None
    try:
        cert_file, key_file = args.cert, args.key
        if dev_dir is not None:
            material = make_dev_material(dev_dir, args.host or "127.0.0.1")
            cert_file, key_file = material.cert_file, material.key_file
        try:
            config = build_config(args, settings, cert_file=cert_file, key_file=key_file)
        except ValueError as exc:
            print(f"gpuguard serve: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        problem = _preflight(config)
        if problem is not None:
            print(f"gpuguard serve: error: {problem}", file=sys.stderr)
            return EXIT_USAGE
        if dev_dir is not None:  # its curl commands are printed once the server listens
            config = dataclasses.replace(config, dev=material)
        if config.server.workers == 1:
            return serve_worker(config)
        return supervise(config)
    finally:
        if dev_dir is not None:
            shutil.rmtree(dev_dir, ignore_errors=True)


def _print_dev_help(material: DevMaterial, host: str, port: int) -> None:
    """``--dev``'s banner, once the server listens on ``host``:``port``."""
    review = SAMPLE_REVIEW if SAMPLE_REVIEW.is_file() else Path("REVIEW.json")
    lines = [
        f"gpuguard serve --dev: throw-away CA and serving certificate in {material.directory} "
        "(removed on exit).",
        "Post the sample GPU pod AdmissionReview:",
        "  " + curl_command(material.ca_file, port, "validate", review, host=host),
        "  " + curl_command(material.ca_file, port, "mutate", review, host=host),
    ]
    print("\n".join(lines), flush=True)
