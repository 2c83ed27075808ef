"""The admission server's settings: one frozen value built once by the CLI and passed down.

Owns the names, units and defaults of every server knob (address, workers, request deadline,
body limits, reload intervals, shutdown timing, logging). Must not read the command line, the
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
        max_body_bytes: largest accepted request body (bytes); larger is answered 413. The API
            server's own request limit is 3 MiB.
        max_depth: deepest accepted JSON nesting (objects and arrays); deeper is answered 400.
        inline_max_bytes: request bodies up to this size (bytes) are first evaluated on the
            event loop; larger ones in the thread pool (``eval_threads``); 0 sends every request
            to the pool. Inline saves the hand-off to a thread and back (more than the webhook's
            whole cost around an empty policy set) and loses nothing: the engine holds the GIL
            either way (see :mod:`webhook.admission`).
        inline_slice_ms: the longest an evaluation runs on the event loop (milliseconds); one
            still running then is done again in the thread pool, so slow policies cannot starve
            health probes and other requests. The engine checks it before each policy and each
            rule evaluated on its own.
        eval_threads: threads evaluating policies of bodies over ``inline_max_bytes`` (the
            deadline can abandon a stuck one).
        policy_reload_s / tls_reload_s: seconds between checks of the policy files and of the
            certificate files for changes.
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
    policy_reload_s: float = 5.0
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
                     "inline_slice_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.inline_max_bytes < 0:
            raise ValueError(f"inline_max_bytes: must not be negative, got "
                             f"{self.inline_max_bytes}")
        for name in ("policy_reload_s", "tls_reload_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be above 0 seconds, got {getattr(self, name)}")
        for name in ("shutdown_delay_s", "drain_timeout_s"):
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
