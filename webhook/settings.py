"""The admission server's settings: one frozen value built once by the CLI and passed down.

Owns the names, units and defaults of every server knob (address, workers, request deadline,
body limits, connection limits and timeouts, client-certificate authentication, reload
intervals, shutdown timing, logging). Must not read the command line, the
environment or files: :mod:`gpuguard.serve_command` builds a :class:`ServerSettings` from those.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    """How the admission server runs.

    Attributes:
        host / port: the listening address (``0.0.0.0`` / 8443 in a pod; port 0 picks a free
            port, for tests).
        workers: worker processes sharing the port (SO_REUSEPORT); each is a full server.
        deadline_ms: time budget of one evaluation, in milliseconds. Keep it below the webhook
            configuration's ``timeoutSeconds``: past it the answer follows the matching
            policies' failurePolicy instead of letting the API server time out.
        max_body_bytes: largest accepted request body (bytes), before and after
            ``Content-Encoding`` decoding; larger is answered 413. The API server's own request
            limit is 3 MiB.
        max_depth: deepest accepted JSON nesting (objects and arrays); deeper is answered 400.
        inline_max_bytes: request bodies up to this size (bytes) are decoded (JSON) and first
            evaluated on the event loop; larger ones — and every compressed body — are decoded
            in the decode threads (``decode_threads``) and evaluated in the thread pool
            (``eval_threads``), so that the loop keeps answering health probes and reading
            other requests; 0 sends every request to the threads. Inline saves the hand-off
            to a thread and back (more than the webhook's whole cost around an empty policy
            set) and loses nothing: the engine holds the GIL either way (see
            :mod:`webhook.admission`).
        inline_slice_ms: the longest an evaluation runs on the event loop (milliseconds); one
            still running then is done again in the thread pool, so slow policies cannot starve
            health probes and other requests. The engine checks it before each policy and each
            rule evaluated on its own.
        eval_threads: threads evaluating policies of bodies over ``inline_max_bytes`` (the
            deadline can abandon a stuck one).
        max_large_requests: requests with a large body (over ``inline_max_bytes``, of
            unknown length, or compressed) read, decoded and evaluated at once per worker. The
            others wait with their body unread (TCP holds it); one whose deadline passes while
            it waits is answered 429 without being decoded. Reading many bodies at once would
            fill each turn of the event loop with TLS reads, and every read makes the loop take
            the GIL back from the threads that decode and evaluate: a burst of large reviews
            would starve the health probes (see :mod:`webhook.app`).
        eval_processes: worker processes per server worker that decode and evaluate large
            requests (as ``max_large_requests`` says which) whose policy set needs no cluster
            call of this process (quota ledger, SubjectAccessReview): JSON decoding and CEL hold
            the GIL, so in threads they slow the event loop (see :mod:`webhook.evaluators`).
            Each holds one request at a time; 0: large requests stay in this process's threads.
        decode_threads: threads decoding (``Content-Encoding``, JSON, envelope) bodies over
            ``inline_max_bytes``. Few are enough: JSON decoding holds the GIL.
        header_timeout_s: the longest a connection may take, from its TCP accept or from the
            first byte of its next request, to complete the TLS handshake and a request's
            header block; slower ones are closed (slowloris). Idle keep-alive connections are
            not affected (see ``keepalive_s``).
        body_timeout_s: the longest the body of a request may take to arrive once its header
            has; past it the answer is 408.
        keepalive_s: seconds an idle keep-alive connection is kept. Longer than kube-apiserver
            keeps its idle connections (90 s, Go's ``http.Transport`` default), so the client
            closes first: a request racing the server's close would fail the webhook call.
        max_connections: the most connections one worker keeps open; at the limit a new one
            evicts the oldest that is stuck before its request header, else the longest idle,
            else it is closed. Each idle TLS connection holds about 130 KiB.
        max_idle_connections: the most connections kept idle between requests per worker;
            the longest-idle ones beyond it are closed (within a second), which gives their
            memory back after a burst.
        client_auth: require a client certificate on ``POST /validate`` and ``/mutate``
            (``gpuguard serve --client-ca``; the TLS context verifies any certificate a client
            presents against that CA, so here only its presence is checked).
        policy_reload_s / tls_reload_s: seconds between checks of the policy files and of the
            certificate files for changes.
        policy_removal_quiet_s: seconds a change to the policy files that removes content from
            a document (a field, a list entry, the end of a string: what a truncated or
            half-written file looks like) must read the same before it is served
            (:mod:`webhook.policy_store`); 0: as any other change.
        shutdown_delay_s: after SIGTERM, seconds spent answering while reporting not ready, so
            that endpoints stop sending before the listener closes.
        drain_timeout_s: after the listener closes, the longest wait (seconds) for requests in
            flight to finish.
        log_objects: include ``object`` / ``oldObject`` in the decision log lines.
        benchmark_routes: also serve ``POST /null-validate`` (parses the AdmissionReview and
            allows it without evaluation), used only by ``benchmarks/webhook.py``.
    """

    host: str = "0.0.0.0"
    port: int = 8443
    workers: int = 1
    deadline_ms: int = 2500
    max_body_bytes: int = 3 * MiB
    max_depth: int = 100
    inline_max_bytes: int = 64 * 1024
    inline_slice_ms: int = 10
    eval_threads: int = 4
    max_large_requests: int = 1
    decode_threads: int = 2
    eval_processes: int = 0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keepalive_s: float = 120.0
    max_connections: int = 256
    max_idle_connections: int = 32
    client_auth: bool = False
    policy_reload_s: float = 5.0
    policy_removal_quiet_s: float = 60.0
    tls_reload_s: float = 10.0
    shutdown_delay_s: float = 2.0
    drain_timeout_s: float = 20.0
    log_objects: bool = False
    benchmark_routes: bool = False

    def __post_init__(self) -> None:
        """Reject values the server cannot run with.

        Raises:
            ValueError: a count or duration out of range; the message names the field.
        """
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not a TCP port (0-65535)")
        for name in ("workers", "deadline_ms", "max_body_bytes", "max_depth", "eval_threads",
                     "inline_slice_ms", "decode_threads", "max_connections",
                     "max_large_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("max_idle_connections", "inline_max_bytes", "eval_processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must not be negative, got {getattr(self, name)}")
        for name in ("policy_reload_s", "tls_reload_s", "header_timeout_s", "body_timeout_s",
                     "keepalive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be above 0 seconds, got {getattr(self, name)}")
        for name in ("shutdown_delay_s", "drain_timeout_s", "policy_removal_quiet_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must not be negative, got {getattr(self, name)}")

    @property
    def deadline_s(self) -> float:
        """The evaluation deadline in seconds."""
        return self.deadline_ms / 1000.0

    @property
    def inline_slice_s(self) -> float:
        """``inline_slice_ms`` in seconds."""
        return self.inline_slice_ms / 1000.0
