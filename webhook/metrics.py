"""Prometheus metrics of the admission server (``prometheus-client``), served on ``/metrics``.

Owns the metric names, labels and buckets, and the exposition: a private registry per server
(tests build several), or — with several worker processes — prometheus-client's multiprocess
mode, so that one scrape sums every worker (:func:`enable_multiprocess` must run before the
workers start; :func:`mark_worker_dead` when one exits).

Metrics (``endpoint`` is ``validate`` or ``mutate``):

- ``gpuguard_admission_requests_total{endpoint, decision}``: ``allowed``, ``denied``,
  ``not_evaluated`` (``pods/status``), ``bad_request`` (4xx), ``unauthorized`` (no client
  certificate under ``--client-ca``), ``throttled`` (429: no turn for a large body before the
  deadline), ``unavailable`` (no policy set), ``disconnected`` (the
  client went away before the body was read: not an error of the server), ``internal_error``
  (a bug in gpuguard).
- ``gpuguard_admission_policy_decisions_total{endpoint, policy, decision}``: per policy and
  request: ``deny``, ``warn``, ``audit``, ``mutate``, ``error``, ``exempt``.
- ``gpuguard_admission_duration_seconds{endpoint}``: request latency, buckets from 0.1 ms.
- ``gpuguard_admission_evaluation_errors_total{endpoint, policy}``: rules that failed to evaluate.
- ``gpuguard_admission_fallbacks_total{endpoint, cause}``: answers decided by failurePolicy
  because the evaluation hit the ``deadline`` or raised an ``exception``.
- ``gpuguard_admission_inline_handoffs_total``: evaluations that outlasted their slice on the
  event loop and were done again in the thread pool (a slow policy set shows here first).
- ``gpuguard_admission_requests_in_flight``; ``gpuguard_policy_reloads_total{outcome}``
  (``success``, ``rejected``, ``held``: an update that removes content, counted once when it
  begins to wait for ``--policy-removal-quiet-s``); ``gpuguard_tls_reloads_total{outcome}``
  (``success``, ``failure``); ``gpuguard_policies_loaded``.
- ``gpuguard_policy_set_generation`` and ``gpuguard_policy_set_hash``: which policy set is
  served — its generation (1 at start, +1 per accepted reload) and its content hash as a number,
  the first 48 bits of the ``sha256:`` hash that ``/readyz`` and the decision log show
  (``int(hash[7:19], 16)``; exact in a float). A value, not a label, as Alertmanager's
  ``alertmanager_config_hash``: one series however many reloads. With several workers each
  worker's value is kept (a ``pid`` label), so a worker serving another set shows.
- ``gpuguard_http_connections_open``; ``gpuguard_http_connections_closed_total{reason}``:
  connections the server closed itself: ``header_timeout`` (no complete request header, or no
  TLS handshake, in time: slow clients), ``idle_limit`` (the longest-idle keep-alive connections
  beyond ``--max-idle-connections``), ``connection_limit`` (evicted or refused at
  ``--max-connections``), ``malformed`` (bytes that are not HTTP/1.1, answered 400).
- ``gpuguard_memory_trims_total``: times freed heap memory was handed back to the operating
  system after a burst of large requests.

Must not decide anything: callers say what happened.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess

#: The ``reason`` labels of ``gpuguard_http_connections_closed_total`` (the module docstring says
#: what each means); :mod:`webhook.connections` closes connections under these names, and the
#: metric's HELP lists them from here.
CLOSE_REASONS = ("header_timeout", "idle_limit", "connection_limit", "malformed")

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable_multiprocess(directory: str) -> None:
    """Make worker processes started from now on share metrics through files in ``directory``.

    Sets ``PROMETHEUS_MULTIPROC_DIR``, which prometheus-client reads when a process imports it:
    call this in the parent before starting (spawning) the workers.
    """
    os.environ[_MULTIPROC_ENV] = directory


def mark_worker_dead(pid: int) -> None:
    """Drop the live gauges of a worker process that exited (multiprocess mode only)."""
    if os.environ.get(_MULTIPROC_ENV):
        _multiprocess.mark_process_dead(pid)


class Metrics:
    """The server's metrics, registered in a private registry (see module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "gpuguard_admission_requests", "Admission requests by endpoint and decision.",
            ["endpoint", "decision"], registry=registry)
        self.policy_decisions = Counter(
            "gpuguard_admission_policy_decisions",
            "Policy outcomes per admission request (deny, warn, audit, mutate, error, exempt).",
            ["endpoint", "policy", "decision"], registry=registry)
        self.duration = Histogram(
            "gpuguard_admission_duration_seconds",
            "Admission request latency from body read to response, in seconds.",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
        self.evaluation_errors = Counter(
            "gpuguard_admission_evaluation_errors",
            "Policy rules that failed to evaluate (handled by the policy's failurePolicy).",
            ["endpoint", "policy"], registry=registry)
        self.fallbacks = Counter(
            "gpuguard_admission_fallbacks",
            "Answers decided by the matching policies' failurePolicy because the evaluation "
            "hit the deadline or raised.", ["endpoint", "cause"], registry=registry)
        self.inline_handoffs = Counter(
            "gpuguard_admission_inline_handoffs",
            "Evaluations that outlasted their time slice on the event loop and were done again "
            "in the thread pool.", registry=registry)
        self.in_flight = Gauge(
            "gpuguard_admission_requests_in_flight", "Admission requests being handled.",
            registry=registry, multiprocess_mode="livesum")
        self.policy_reloads = Counter(
            "gpuguard_policy_reloads", "Policy set (re)loads by outcome (success, rejected; "
            "held: an update that removes content, waiting for --policy-removal-quiet-s).",
            ["outcome"], registry=registry)
        self.tls_reloads = Counter(
            "gpuguard_tls_reloads", "Serving certificate reloads by outcome (success, failure).",
            ["outcome"], registry=registry)
        self.policies_loaded = Gauge(
            "gpuguard_policies_loaded", "Policies in the policy set being served.",
            registry=registry, multiprocess_mode="max")
        self.policy_set_generation = Gauge(
            "gpuguard_policy_set_generation",
            "Generation of the policy set being served (1 at start, +1 per accepted reload).",
            registry=registry, multiprocess_mode="liveall")
        self.policy_set_hash = Gauge(
            "gpuguard_policy_set_hash",
            "First 48 bits of the sha256 content hash of the policy set being served, as a "
            "number (the hash /readyz shows).", registry=registry, multiprocess_mode="liveall")
        self.connections_open = Gauge(
            "gpuguard_http_connections_open", "Open HTTP connections (TLS handshake done).",
            registry=registry, multiprocess_mode="livesum")
        self.connections_closed = Counter(
            "gpuguard_http_connections_closed",
            f"Connections closed by the server itself, by reason ({', '.join(CLOSE_REASONS)}).",
            ["reason"], registry=registry)
        self.memory_trims = Counter(
            "gpuguard_memory_trims",
            "Times freed heap memory was returned to the operating system after a burst of "
            "large requests.", registry=registry)
        self._requests: dict[tuple[str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        self._decisions: dict[tuple[str, str, str], Counter] = {}
        self._errors: dict[tuple[str, str], Counter] = {}

    def policy_set_served(self, identity: Mapping[str, Any]) -> None:
        """Show the served set: ``identity`` is
        :attr:`webhook.policy_store.PolicySnapshot.identity` (generation, hash, policies)."""
        self.policies_loaded.set(identity["policies"])
        self.policy_set_generation.set(identity["generation"])
        digest = str(identity["hash"]).removeprefix("sha256:")
        self.policy_set_hash.set(int(digest[:12], 16) if digest else 0)

    def observe(self, endpoint: str, decision: str, seconds: float) -> None:
        """Count one answered request and its latency (label children cached: hot path)."""
        key = (endpoint, decision)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(endpoint, decision)
        child.inc()
        histogram = self._durations.get(endpoint)
        if histogram is None:
            histogram = self._durations[endpoint] = self.duration.labels(endpoint)
        histogram.observe(seconds)

    def policy_outcomes(self, endpoint: str, outcomes: Iterable[tuple[str, str]]) -> None:
        """Count ``(policy, decision)`` pairs of one request (label children cached)."""
        for policy, decision in outcomes:
            key = (endpoint, policy, decision)
            child = self._decisions.get(key)
            if child is None:
                child = self._decisions[key] = self.policy_decisions.labels(*key)
            child.inc()
            if decision == "error":
                errors = self._errors.get((endpoint, policy))
                if errors is None:
                    errors = self._errors[endpoint, policy] = \
                        self.evaluation_errors.labels(endpoint, policy)
                errors.inc()

    def exposition(self) -> bytes:
        """The text exposition format of every metric (all workers in multiprocess mode)."""
        if os.environ.get(_MULTIPROC_ENV):
            registry = CollectorRegistry()
            _multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
