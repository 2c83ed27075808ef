"""``gpuguard serve`` as kube-apiserver meets it: a subprocess on loopback, registered by the
project's own webhook configuration.

Owns, for the end-to-end tests:

- :func:`generate_certs`: ``gpuguard certs generate --san 127.0.0.1`` (the documented
  local-development recipe);
- :class:`GpuguardServer`: ``python -m gpuguard serve`` on 127.0.0.1 and a free port, its JSON
  log lines, ``/readyz`` and ``/metrics``;
- :func:`loopback_webhooks`: ``deploy/base/webhooks.yaml`` read from the checkout (not a copy,
  so what the deploy files say is what is tested) with each ``clientConfig.service`` turned into
  a ``url`` on the server's port; :func:`register_webhooks` applies it with kubectl and sets the
  caBundle with ``gpuguard certs inject --live``.

Must not change what the deploy files decide (rules, failurePolicy, namespaceSelector,
matchConditions, timeouts); only the address changes, as a Service becomes a URL.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.controlplane.cluster import ControlPlane, Process, free_port, tail, wait_until

REPO = Path(__file__).resolve().parents[2]
WEBHOOKS_FILE = REPO / "deploy" / "base" / "webhooks.yaml"
VALIDATING = "gpuguard-validating"
MUTATING = "gpuguard-mutating"


def gpuguard(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a gpuguard CLI command of this checkout in this process; never raises on exit.

    In-process (``gpuguard.cli.main`` with stdin, stdout and stderr swapped) rather than a
    subprocess: the same code path, without a Python start-up per call. ``serve`` is the one
    command that needs its own process (:class:`GpuguardServer`).
    """
    from gpuguard import cli

    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO(input or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(["gpuguard", *args], code, out.getvalue(),
                                       err.getvalue())


def generate_certs(out: Path) -> Path:
    """``gpuguard certs generate --service gpuguard --namespace gpuguard-system --san 127.0.0.1``.

    Returns:
        ``out`` (holding ca.crt, ca.key, tls.crt, tls.key).
    """
    done = gpuguard("certs", "generate", "--service", "gpuguard", "--namespace",
                    "gpuguard-system", "--san", "127.0.0.1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


class GpuguardServer:
    """One ``gpuguard serve`` process on 127.0.0.1 (its own process group).

    Args:
        certs: a folder from :func:`generate_certs`.
        log: where its stderr (JSON lines) goes.
        kubeconfig: the cluster to watch namespaces (and pods for quota) in; None: standalone.
        args: more ``serve`` flags (``--policies PATH``, ``--tls-reload-s 0.5``, …).
    """

    def __init__(self, certs: Path, log: Path, *, kubeconfig: Path | None = None,
                 args: Sequence[str] = ()) -> None:
        self.certs = certs
        self.log = log
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "gpuguard", "serve", "--cert", str(certs / "tls.crt"),
                "--key", str(certs / "tls.key"), "--host", "127.0.0.1", "--port",
                str(self.port), "--shutdown-delay-s", "0", "--drain-timeout-s", "5", *args]
        if kubeconfig is not None:
            argv += ["--kubeconfig", str(kubeconfig)]
        self.process = Process("gpuguard serve", argv, log)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the webhook's CA (``ca.crt``)."""
        return ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

    def get(self, path: str) -> tuple[int, str]:
        """``GET path``: ``(status, body)``; ``(0, reason)`` when it does not answer."""
        try:
            with urllib.request.urlopen(self.url + path, context=self.ssl_context(),
                                        timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (OSError, ssl.SSLError) as exc:
            return 0, str(exc)

    def served_certificate(self) -> bytes:
        """The DER certificate the server presents in a new TLS handshake right now."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                self.ssl_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            certificate = tls.getpeercert(binary_form=True)
        assert certificate is not None
        return certificate

    def wait_ready(self, deadline_s: float = 180.0) -> None:
        """Wait for ``/readyz`` 200 (policies loaded, TLS up, namespace cache synced)."""
        def ready() -> bool:
            assert self.process.running(), f"gpuguard serve exited:\n{self.logs()}"
            return self.get("/readyz")[0] == 200
        wait_until(ready, "gpuguard serve /readyz", deadline_s=deadline_s, interval_s=0.1,
                   logs=self.logs)

    def decisions(self) -> list[dict[str, Any]]:
        """The admission log lines so far (JSON objects with a ``decision`` field)."""
        out = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "decision" in record:
                out.append(record)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a Prometheus sample family in ``/metrics`` matching ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200, body
        total = 0.0
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    total += sample.value
        return total

    def logs(self, lines: int = 30) -> str:
        """The last lines of the server's log, for failure messages."""
        return f"--- gpuguard serve log ({self.log}) ---\n{tail(self.log, lines)}"

    def stop(self) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL if it hangs."""
        self.process.stop(timeout_s=10)


def loopback_webhooks(url: str, source: Path = WEBHOOKS_FILE) -> list[dict[str, Any]]:
    """The webhook configurations of ``source`` with each Service reference made ``url + path``.

    Raises:
        AssertionError: a webhook whose clientConfig is neither a Service nor a URL.
    """
    documents = [d for d in yaml.safe_load_all(source.read_text(encoding="utf-8")) if d]
    for document in documents:
        for webhook in document.get("webhooks") or []:
            client = webhook["clientConfig"]
            service = client.pop("service", None)
            assert service is not None or "url" in client, webhook["name"]
            if service is not None:
                client["url"] = url + str(service.get("path") or "/")
    return documents


def register_webhooks(cluster: ControlPlane, server: GpuguardServer, workdir: Path) -> Path:
    """Apply the loopback webhook configurations and inject the caBundle live.

    Returns:
        The YAML file applied (its caBundles set by ``certs inject`` too).
    """
    path = workdir / "webhooks.loopback.yaml"
    path.write_text(yaml.safe_dump_all(loopback_webhooks(server.url)), encoding="utf-8")
    applied = cluster.kubectl("apply", "-f", str(path))
    assert applied.returncode == 0, applied.stderr
    injected = gpuguard("certs", "inject", "--ca", str(server.certs / "ca.crt"), str(path),
                        "--live", f"validatingwebhookconfiguration/{VALIDATING}",
                        "--live", f"mutatingwebhookconfiguration/{MUTATING}",
                        "--kubeconfig", str(cluster.kubeconfig))
    assert injected.returncode == 0, injected.stderr
    return path


def unregister_webhooks(cluster: ControlPlane) -> None:
    """Delete gpuguard's webhook configurations (idempotent)."""
    cluster.kubectl("delete", "--ignore-not-found", "validatingwebhookconfiguration", VALIDATING,
                    "mutatingwebhookconfiguration", MUTATING)


def wait_webhook_active(cluster: ControlPlane, server: GpuguardServer, namespace: str,
                        *, deadline_s: float = 30.0) -> None:
    """Wait until kube-apiserver calls the webhook for ``namespace``: a server-side dry-run of a
    GPU pod shows up in the webhook's decision log (the API server's webhook informer lags the
    apply by a moment).
    """
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "webhook-probe", "namespace": namespace},
             "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                 "limits": {"nvidia.com/gpu": "1"}}}]}}

    def seen() -> bool:
        before = len(server.decisions())
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe))
        return len(server.decisions()) > before
    wait_until(seen, f"kube-apiserver to call the webhook for namespace {namespace}",
               deadline_s=deadline_s, interval_s=0.1,
               logs=lambda: f"{server.logs()}\n{cluster.logs()}")
