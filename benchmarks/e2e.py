"""End-to-end admission benchmark: pod creates through a real kube-apiserver, side by side.

Run: .venv/bin/python benchmarks/e2e.py [--duration 15] [--concurrency 16] [--rate N]

Builds (or reuses, tests/controlplane/build.sh) etcd and kube-apiserver 1.37, starts them on
loopback (tests/controlplane/cluster.py) and, in one run on this machine, creates GPU pods in a
namespace through the API server under four configurations:

- (a) no admission policy or webhook: the API server's own cost (authn, RBAC, built-in
  admission plugins, validation, etcd write);
- (b) the built-in library's rules written as in-tree admission policies
  (tests/data/native-admission/library: 9 ValidatingAdmissionPolicies and 1
  MutatingAdmissionPolicy; see each file's header for what could not be expressed without
  gpuguard's GPU facts), evaluated by kube-apiserver itself;
- (c) ``gpuguard serve`` with the built-in library, registered with deploy/base/webhooks.yaml
  (pointed at a loopback URL, caBundle injected by ``gpuguard certs inject --live``);
- (d) ``gpuguard serve`` with 50 policies: the library's (11) and synthetic GPUPolicies for the rest
  (benchmarks/webhook.py's templates);

each at saturation (``--concurrency`` keep-alive connections creating pods as fast as they are
answered) and at a fixed rate (``--rate`` pods/s, default half the lowest saturation throughput of
the four), printing throughput, p50 and p99 create latency and the ratio of each to (a). The pod
is an admitted GPU pod (1 nvidia.com/gpu, no toleration: the library's mutation adds it), stored
for real; the pods are deleted between runs. The load generator (aiohttp, client-certificate
TLS), etcd, kube-apiserver and gpuguard share this machine's cores: the figures are ratios on one
machine, not capacities. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from benchmarks.webhook import synthetic_policies  # noqa: E402
from tests.controlplane.admission_differential import ApiServer, Probe  # noqa: E402
from tests.controlplane.cluster import ControlPlane, build_binaries, wait_until  # noqa: E402
from tests.controlplane.webhook_process import (  # noqa: E402
    GpuguardServer,
    generate_certs,
    register_webhooks,
    unregister_webhooks,
    wait_webhook_active,
)

NAMESPACE = "bench"
LIBRARY_AS_VAP = ROOT / "tests" / "data" / "native-admission" / "library"
LIBRARY = ROOT / "policies" / "library"
POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"generateName": "bench-", "labels": {"app": "bench"}},
    "spec": {"restartPolicy": "Never", "containers": [{
        "name": "cuda", "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}}}]},
}


@dataclass
class Run:
    """One measured run: pods/s and latencies (ms) of the answered creates."""

    seconds: float
    latencies: list[float]
    errors: dict[str, int]
    handled: dict[str, list[float]] = field(default_factory=dict)
    """gpuguard's own handling time (ms) per endpoint, from its decision log (webhook runs)."""

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile(self, p: float) -> float:
        return percentile(self.latencies, p)


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank; 0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def load(cluster: ControlPlane, duration: float, concurrency: int,
               rate: float | None) -> Run:
    """Create pods for ``duration`` seconds: ``concurrency`` connections back to back, or, with
    ``rate``, one create every 1/rate s spread over the connections (open loop)."""
    url = f"{cluster.server}/api/v1/namespaces/{NAMESPACE}/pods"
    body = json.dumps(POD).encode()
    latencies: list[float] = []
    errors: dict[str, int] = {}
    connector = aiohttp.TCPConnector(ssl=cluster.ssl_context(), limit=concurrency)
    started = time.perf_counter()
    end = started + duration
    async with aiohttp.ClientSession(connector=connector, headers={
            "Content-Type": "application/json", "Accept": "application/json"}) as session:

        async def create() -> None:
            begin = time.perf_counter()
            async with session.post(url, data=body) as response:
                await response.read()
                if response.status == 201:
                    latencies.append((time.perf_counter() - begin) * 1000)
                else:
                    key = str(response.status)
                    errors[key] = errors.get(key, 0) + 1

        if rate is None:
            async def worker() -> None:
                while time.perf_counter() < end:
                    await create()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            pending = set()
            n = 0
            while (due := started + n / rate) < end:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                pending.add(asyncio.ensure_future(create()))
                pending = {t for t in pending if not t.done()}
                n += 1
            await asyncio.gather(*pending)
    return Run(time.perf_counter() - started, latencies, errors)


def delete_pods(cluster: ControlPlane) -> None:
    """Remove the run's pods: one deletecollection (grace period 0: no kubelet to wait for),
    then wait until the namespace lists none."""
    server = ApiServer(cluster, timeout_s=600)  # thousands of pods: minutes on 2 cores
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    deleted = server.request("DELETE", path + "?gracePeriodSeconds=0", None, None)
    assert deleted.allowed, deleted.body
    wait_until(lambda: not server.request("GET", path + "?limit=1", None, None).body["items"],
               "the benchmark's pods to be gone", deadline_s=300, interval_s=0.5)


def admin(cluster: ControlPlane, *args: str, stdin: str | None = None) -> None:
    done = cluster.kubectl(*args, input=stdin, timeout_s=120)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"


def measure(cluster: ControlPlane, duration: float, concurrency: int,
            rate: float | None, log: Path | None = None) -> Run:
    """A warm-up at saturation (not counted), then the run; pods deleted after each.

    ``log``: gpuguard's decision log; the run's own lines (from the end of the warm-up) give
    gpuguard's handling time per endpoint (:attr:`Run.handled`)."""
    asyncio.run(load(cluster, 3, concurrency, None))
    delete_pods(cluster)
    offset = log.stat().st_size if log is not None else 0
    run = asyncio.run(load(cluster, duration, concurrency, rate))
    if log is not None:
        run.handled = handling_ms(log, offset)
    delete_pods(cluster)
    return run


def handling_ms(log: Path, offset: int) -> dict[str, list[float]]:
    """``latency_ms`` of each decision line from ``offset`` on, by endpoint: gpuguard's own
    time per review, from its arrival to its answer (webhook/app.py's decision log)."""
    found: dict[str, list[float]] = {}
    with log.open("rb") as handle:
        handle.seek(offset)
        for line in handle:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and "latency_ms" in entry:
                    found.setdefault(str(entry.get("endpoint")), []).append(
                        float(entry["latency_ms"]))
    return found


@contextlib.contextmanager
def in_tree(cluster: ControlPlane, generation: int) -> Iterator[None]:
    """Configuration (b): the library's rules as VAP/MAP files, in effect (probe) until exit."""
    files = sorted(LIBRARY_AS_VAP.glob("*.yaml"))
    for path in files:
        admin(cluster, "create", "-f", str(path))
    probe = Probe(ApiServer(cluster), generation)
    probe_text = "\n---\n".join(json.dumps(d) for d in probe.documents())
    admin(cluster, "create", "-f", "-", stdin=probe_text)
    probe.wait_active()
    try:
        yield None  # no gpuguard: no decision log
    finally:
        for path in files:
            admin(cluster, "delete", "-f", str(path), "--wait=true")
        admin(cluster, "delete", "-f", "-", "--wait=true", stdin=probe_text)
        probe.wait_gone()


@contextlib.contextmanager
def webhook(cluster: ControlPlane, certs: Path, log: Path, policies: Path | None
            ) -> Iterator[Path]:
    """Configurations (c) and (d): ``gpuguard serve`` registered by deploy/base/webhooks.yaml;
    yields its decision log."""
    server = GpuguardServer(certs, log, kubeconfig=cluster.kubeconfig,
                            args=["--policies", str(policies)] if policies else [])
    try:
        server.wait_ready()
        register_webhooks(cluster, server, log.parent)
        wait_webhook_active(cluster, server, NAMESPACE)
        yield log
    finally:
        unregister_webhooks(cluster)
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, help="fixed-rate runs, pods/s (default: half the "
                        "lowest saturation throughput)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuguard-e2e-bench-"))
    bin_dir, took = build_binaries(work / "build.log")
    print(f"control plane binaries: {bin_dir} ({took:.0f} s)", flush=True)
    cluster = ControlPlane(bin_dir)
    saturated: dict[str, Run] = {}
    fixed: dict[str, Run] = {}
    try:
        cluster.start()
        admin(cluster, "apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuguard-system"}},
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
             "metadata": {"name": "nvidia"}, "handler": "nvidia"}]))
        certs = generate_certs(work / "certs")
        fifty = work / "fifty"
        fifty.mkdir()
        library = sorted(LIBRARY.glob("*.yaml"))
        for path in library:
            shutil.copy(path, fifty / path.name)
        (fifty / "synthetic.yaml").write_text(synthetic_policies(50 - len(library)),
                                              encoding="utf-8")
        logs = iter(range(100))
        # Each configuration yields gpuguard's decision log, or None when gpuguard is not in it.
        configurations: dict[str, Callable[[int], contextlib.AbstractContextManager[Path | None]]
                             ] = {
            "(a) no admission": lambda _: contextlib.nullcontext(None),
            "(b) library as in-tree VAP/MAP": lambda g: in_tree(cluster, g),
            "(c) gpuguard webhook, library": lambda _: webhook(
                cluster, certs, work / f"serve-{next(logs)}.log", None),
            "(d) gpuguard webhook, 50 policies": lambda _: webhook(
                cluster, certs, work / f"serve-{next(logs)}.log", fifty),
        }
        for n, (name, configure) in enumerate(configurations.items()):
            with configure(n) as log:
                saturated[name] = measure(cluster, args.duration, args.concurrency, None, log)
            print(f"{name}: {saturated[name].throughput:.0f} pods/s at saturation, not "
                  f"created: {saturated[name].errors}", flush=True)
        rate = args.rate or max(1.0, round(min(r.throughput for r in saturated.values()) / 2))
        for n, (name, configure) in enumerate(configurations.items()):
            with configure(len(configurations) + n) as log:
                fixed[name] = measure(cluster, args.duration, args.concurrency, rate, log)
            print(f"{name}: {fixed[name].throughput:.0f} pods/s at {rate:.0f}/s, not created: "
                  f"{fixed[name].errors}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(saturated, fixed, args.duration, args.concurrency, rate)
    return 0 if not any(r.errors for r in [*saturated.values(), *fixed.values()]) else 1


def print_table(saturated: dict[str, Run], fixed: dict[str, Run], duration: float,
                concurrency: int, rate: float) -> None:
    """The side-by-side table (Markdown), each figure with its ratio to (a)."""
    base, base_fixed = next(iter(saturated.values())), next(iter(fixed.values()))
    print(f"\npod creates through kube-apiserver 1.37, one machine, one run; {duration:.0f} s "
          f"per run; saturation = {concurrency} connections; fixed rate = {rate:.0f} pods/s")
    print("| configuration | pods/s (sat.) | /(a) | p50 ms (sat.) | /(a) | p99 ms (sat.) | /(a) "
          "| p50 ms (fixed) | /(a) | p99 ms (fixed) | /(a) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, sat in saturated.items():
        fix = fixed[name]
        cells = [f"{sat.throughput:.0f}", f"{sat.throughput / base.throughput:.2f}"]
        for run, reference in ((sat, base), (fix, base_fixed)):
            for p in (50, 99):
                cells += [f"{run.percentile(p):.1f}",
                          f"{run.percentile(p) / reference.percentile(p):.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nadded p50 at the fixed rate (ms over (a)), and gpuguard's own handling time per "
          "review from its decision log (p50 / p99 ms, arrival to answer):")
    for name, fix in fixed.items():
        line = f"- {name}: +{fix.percentile(50) - base_fixed.percentile(50):.1f} ms"
        for endpoint, values in sorted(fix.handled.items()):
            line += (f"; /{endpoint} {percentile(values, 50):.2f} / {percentile(values, 99):.2f}"
                     f" ms ({len(values)} reviews)")
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
