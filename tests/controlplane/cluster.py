"""A real Kubernetes control plane for the test tier: etcd + kube-apiserver on loopback, no kubelet.

Owns building the binaries (``tests/controlplane/build.sh``, cached by version under
``~/.cache/gpuguard/controlplane``), starting etcd and kube-apiserver on 127.0.0.1 with free
ports, generated certificates (:mod:`tests.controlplane.pki`), a service-account key pair, RBAC
authorization and the admission plugins gpuguard meets in a cluster (ValidatingAdmissionWebhook,
MutatingAdmissionWebhook, ValidatingAdmissionPolicy, MutatingAdmissionPolicy), waiting for
``/readyz``, writing an admin kubeconfig, and tearing it all down (process groups killed, the
temporary directory removed). The convention is controller-runtime's envtest: the API server and
its storage are real, nothing runs pods.

Facts taken from the k8s.io/kubernetes v1.37.2 sources (Go module cache):

- MutatingAdmissionPolicy is GA since 1.36 (``pkg/features/kube_features.go``:
  ``{Version: 1.36, Default: true, PreRelease: GA}``) and ``admissionregistration.k8s.io/v1``
  serves ``mutatingadmissionpolicies`` (``pkg/registry/admissionregistration/rest/
  storage_apiserver.go``), so no ``--feature-gates`` or ``--runtime-config`` is needed; the four
  plugins are listed in ``--enable-admission-plugins`` anyway, so that a default change would
  not silently drop one.
- The ServiceAccount admission plugin (on by default) refuses pods in namespaces without a
  ``default`` ServiceAccount, which only kube-controller-manager creates; it is disabled here.
- The watch cache answers a watch from a resourceVersion older than its window with
  ``410 Gone`` ("too old resource version", ``staging/.../cacher/watch_cache_history.go``);
  without a watch cache the watch goes to etcd, which refuses a compacted revision the same
  way. :meth:`ControlPlane.compact_etcd` compacts etcd through its v3 JSON gateway.

Must not fake anything: when a binary cannot be built the tier is skipped (or fails under
``CI=true``, see ``conftest.py``), never replaced.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.controlplane.pki import ControlPlanePKI, make_pki

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
ADMISSION_PLUGINS = ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook",
                     "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")
START_DEADLINE_S = 120.0  # etcd + kube-apiserver to /readyz; ~10 s on an idle 2-core machine
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                    "ALL_PROXY")

T = TypeVar("T")


GPUGUARD_CRDS = ("gpupolicies.gpuguard.io", "gpuquotas.gpuguard.io",
                 "gpupolicyexceptions.gpuguard.io")
"""The CRDs of deploy/crds."""


class BuildError(Exception):
    """``build.sh`` failed or is unusable; the message has the reason and the log's tail."""


class StartError(Exception):
    """etcd or kube-apiserver did not come up; the message has the logs' tails."""


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def build_binaries(log: Path | None = None) -> tuple[Path, float]:
    """Run ``build.sh`` (a no-op when the binaries of this version are cached).

    Args:
        log: where the build's output goes (default: a temporary file).

    Returns:
        ``(bin folder holding etcd, kube-apiserver, kubectl, seconds the script took)``.

    Raises:
        BuildError: Go is missing, or the script failed (with the last lines of its log).
    """
    if shutil.which("go") is None:
        raise BuildError("Go toolchain not found on PATH (the control-plane tier builds "
                         "kube-apiserver and etcd from Go modules)")
    log = log or Path(tempfile.mkstemp(prefix="gpuguard-cp-build-", suffix=".log")[1])
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=out,
                              text=True, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise BuildError(f"tests/controlplane/build.sh exited {done.returncode} after "
                         f"{took:.0f} s; log {log}:\n{tail(log)}")
    folder = Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    missing = [name for name in ("etcd", "kube-apiserver", "kubectl")
               if folder is None or not (folder / name).is_file()]
    if folder is None or missing:
        raise BuildError(f"tests/controlplane/build.sh printed {done.stdout!r}: missing "
                         f"{', '.join(missing)}")
    return folder, took


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_environment() -> dict[str, str]:
    """``os.environ`` without proxy settings: every server here is on loopback."""
    environ = {k: v for k, v in os.environ.items() if k not in _PROXY_VARIABLES}
    environ["NO_PROXY"] = environ["no_proxy"] = "127.0.0.1,localhost"
    return environ


def wait_until(condition: Callable[[], T], what: str, *, deadline_s: float = 30.0,
               interval_s: float = 0.05, logs: Callable[[], str] | None = None) -> T:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises:
        AssertionError: ``deadline_s`` passed; the message names ``what`` and carries ``logs()``
            (the API server's and webhook's log tails) and the condition's last exception.
    """
    end = time.monotonic() + deadline_s
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the condition's own failure is retried until the deadline
            last_error = exc
        if time.monotonic() >= end:
            detail = f"; last error: {type(last_error).__name__}: {last_error}" \
                if last_error else ""
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}"
                                 f"{detail}\n{logs() if logs else ''}")
        time.sleep(interval_s)


def _tied_to_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` under util-linux ``setpriv --pdeathsig KILL`` where it exists (Linux): the child
    gets SIGKILL when the process that started it dies, by any signal. A SIGTERM'd or SIGKILL'd
    pytest left etcd and kube-apiserver running; no finalizer runs then. (``setpriv`` rather
    than a ``preexec_fn``, which is unsafe in a process with threads.) Processes are started
    from the main thread: the signal follows the thread that forked."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else list(argv)


class Process:
    """A child process in its own process group, its output in a log file; it does not outlive
    the test process (:func:`_tied_to_parent`)."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = log.open("ab")
        self.popen = subprocess.Popen(_tied_to_parent(argv), stdout=self._out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=child_environment(), start_new_session=True)

    def running(self) -> bool:
        """Whether the process has not exited yet."""
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s`` seconds."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if self.popen.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait_s)
        with contextlib.suppress(ProcessLookupError):  # stragglers of the group
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._out.close()


class ControlPlane:
    """etcd + kube-apiserver on loopback; use as a context manager or call start/stop.

    Args:
        bin_dir: the folder :func:`build_binaries` returned.
        apiserver_args: extra kube-apiserver flags (``--watch-cache=false``, …).
        workdir: where data, certificates, logs and the kubeconfig go (default: a new temporary
            directory, removed by :meth:`stop`).

    Attributes (after :meth:`start`):
        server: ``https://127.0.0.1:PORT``.
        kubeconfig: the admin kubeconfig (client certificate in ``system:masters``).
        pki: the certificate files.
        etcd_url: ``http://127.0.0.1:PORT`` (plain HTTP, loopback only).
    """

    def __init__(self, bin_dir: Path, *, apiserver_args: Sequence[str] = (),
                 workdir: Path | None = None) -> None:
        self.bin_dir = bin_dir
        self.apiserver_args = tuple(apiserver_args)
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuguard-controlplane-"))
        self.pki: ControlPlanePKI = make_pki(self.workdir / "pki")
        self.kubeconfig = self.workdir / "kubeconfig"
        self.etcd_log = self.workdir / "etcd.log"
        self.apiserver_log = self.workdir / "kube-apiserver.log"
        self.server = ""
        self.etcd_url = ""
        self.started_in_s = 0.0
        self._etcd: Process | None = None
        self._apiserver: Process | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd and kube-apiserver and wait for ``/readyz`` (tries fresh ports 3 times).

        Raises:
            StartError: a process exited or ``/readyz`` stayed unready for
                ``START_DEADLINE_S`` seconds; the message has both logs' tails.
        """
        started = time.monotonic()
        for attempt in range(3):
            try:
                self._start_once()
                self.started_in_s = time.monotonic() - started
                return
            except StartError:
                self._stop_processes()
                if attempt == 2 or "address already in use" not in self.logs():
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        client_port, peer_port, secure_port = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        data = self.workdir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        self._etcd = Process("etcd", [
            str(self.bin_dir / "etcd"), "--name", "gpuguard-test", "--data-dir", str(data),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"gpuguard-test={peer}", "--initial-cluster-state", "new",
            "--unsafe-no-fsync",  # throw-away data on a shared disk: durability buys nothing
            "--log-level", "warn",
        ], self.etcd_log)
        self.server = f"https://127.0.0.1:{secure_port}"
        self._apiserver = Process("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={secure_port}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=RBAC",
            f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
            "--disable-admission-plugins=ServiceAccount",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none",  # no Endpoints for a loopback address
            "--allow-privileged=true",  # the policies judge privileged pods; the API must admit them
            "--profiling=false",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            *self.apiserver_args,
        ], self.apiserver_log)
        self._write_kubeconfig()
        end = time.monotonic() + START_DEADLINE_S
        while True:
            for process in (self._etcd, self._apiserver):
                if not process.running():
                    raise StartError(f"{process.name} exited with {process.popen.returncode} "
                                     f"during start-up\n{self.logs()}")
            status, _ = self.get_raw("/readyz")
            if status == 200:
                return
            if time.monotonic() >= end:
                detail = self.get_raw("/readyz?verbose")[1]
                raise StartError(f"kube-apiserver not ready after {START_DEADLINE_S:.0f} s:\n"
                                 f"{detail}\n{self.logs()}")
            time.sleep(0.2)

    def _stop_processes(self) -> None:
        for process in (self._apiserver, self._etcd):
            if process is not None:
                process.stop()
        self._apiserver = self._etcd = None

    def stop(self) -> None:
        """Stop kube-apiserver then etcd (process groups) and remove the working directory."""
        self._stop_processes()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- clients ------------------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpuguard-test",
            "clusters": [{"name": "gpuguard-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.pki.admin_cert),
                "client-key": str(self.pki.admin_key)}}],
            "contexts": [{"name": "gpuguard-test", "context": {
                "cluster": "gpuguard-test", "user": "admin"}}],
        }
        self.kubeconfig.write_text(json.dumps(config, indent=1), encoding="utf-8")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting the cluster CA and presenting the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get_raw(self, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """``GET path`` as admin: ``(HTTP status, body)``; ``(0, reason)`` when unreachable."""
        try:
            with urllib.request.urlopen(self.server + path, context=self.ssl_context(),
                                        timeout=timeout_s) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8", "replace")
        except (OSError, ssl.SSLError) as exc:
            return 0, str(exc)

    def kubectl(self, *args: str, input: str | None = None,
                timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster (admin); never raises on a non-zero exit."""
        return subprocess.run([str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig),
                               *args], input=input, capture_output=True, text=True,
                              timeout=timeout_s, env=child_environment(), check=False)

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the admin kubeconfig."""
        from kubernetes import config as k8s_config

        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    # --- etcd ---------------------------------------------------------------------------------

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def etcd_revision(self) -> int:
        """etcd's current revision (what kube-apiserver calls resourceVersion)."""
        key = base64.b64encode(b"/gpuguard-test/revision-probe").decode()
        return int(self._etcd_post("/v3/kv/range", {"key": key})["header"]["revision"])

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history up to ``revision`` (default: the current one); returns it.

        A watch from an older resourceVersion that reaches etcd is then answered ``410 Gone``.
        """
        revision = revision or self.etcd_revision()
        self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # --- diagnostics --------------------------------------------------------------------------

    def wait_established(self, *names: str) -> None:
        """Wait (up to 60 s) until the API server serves the CRDs ``names`` (condition
        Established); an assertion error with the server's log when it does not."""
        waited = self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              *(f"crd/{name}" for name in names), timeout_s=90)
        assert waited.returncode == 0, waited.stderr + self.logs()

    def apply_gpuguard_crds(self) -> None:
        """Apply deploy/crds (GPUPolicy, GPUQuota, GPUPolicyException and their RBAC) as the
        docs say (server-side) and wait until the three CRDs are served."""
        applied = self.kubectl("apply", "--server-side", "-k",
                               str(Path(__file__).resolve().parents[2] / "deploy" / "crds"))
        assert applied.returncode == 0, applied.stderr
        self.wait_established(*GPUGUARD_CRDS)

    def logs(self, lines: int = 40) -> str:
        """The last lines of kube-apiserver's and etcd's logs, for failure messages."""
        return (f"--- kube-apiserver log ({self.apiserver_log}) ---\n"
                f"{tail(self.apiserver_log, lines)}\n"
                f"--- etcd log ({self.etcd_log}) ---\n{tail(self.etcd_log, lines // 2)}")


def started(cluster: ControlPlane) -> ControlPlane:
    """``cluster``, started; the test fails (not errors) with the start-up logs when it does
    not start, after its processes are stopped."""
    try:
        cluster.start()
    except StartError as exc:
        cluster.stop()
        pytest.fail(f"control plane did not start: {exc}", pytrace=False)
    return cluster
