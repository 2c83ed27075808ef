"""The audit controller (``gpuguard audit --watch``) over a simulated cluster: first report, churn
latency, memory.

Run: .venv/bin/python benchmarks/audit_watch.py [--pods N] [--nodes N] [--churn-s S]
     [--rate N] [--memory-pods N]

The cluster is the batch benchmark's generated snapshot (benchmarks/audit.py ``generate``: the
example cluster's mix, 40 team namespaces), handed to the controller as the lists a watch would
deliver; reports go to a sink that counts writes (the API server's write time is not in the
figures). Measured, in this process:

1. **first full report**: every resource listed, then the first ``step()`` (the full evaluation
   and every report queued) — wall time;
2. **churn**: ``--rate`` pod changes per second for ``--churn-s`` seconds on the real clock
   (creates of GPU pods, a quarter of them privileged: violations; modifies; deletes), in random
   namespaces (seed 18), each followed by ``step()``: the latency of each change is from the
   event to the write of the report it changed (``--report-interval-s`` 0 here: the default 5 s
   fold would add up to 5 s), p50 / p99 over the writes, each from the oldest change it
   carries (an upper bound for the changes folded into it);
3. **peak RSS** of the process (``ru_maxrss``) after the churn;
4. **per-pod memory**: tracemalloc over the controller's state (store, memo, reports) for a
   cluster of ``--memory-pods`` pods, divided by the pods (tracemalloc slows Python ~3x, hence a
   separate, smaller run).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import importlib.util
import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.settings import AuditSettings  # noqa: E402
from audit.sources.files import iter_snapshot  # noqa: E402
from audit.watch.controller import PolicyUpdate, WatchController, WatchSettings  # noqa: E402
from gpuguard import policy_set  # noqa: E402
from policies.facts.resource_names import DEFAULT_SETTINGS  # noqa: E402
from policies.sources import Document  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_audit", ROOT / "benchmarks" / "audit.py")
assert _spec is not None and _spec.loader is not None
bench_audit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_audit)


class Outcome:
    def __init__(self, action: str) -> None:
        self.action = action
        self.message = ""


class CountingSink:
    """Counts writes; stores nothing (the API server's time is not measured)."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, report: Any) -> Outcome:
        self.writes += 1
        return Outcome("replaced")

    def delete(self, kind: str, namespace: str | None, name: str) -> Outcome:
        self.writes += 1
        return Outcome("deleted")

    def prune(self, written: Any, *, name: str, labels: Any) -> list[Any]:
        return []


def objects(pods: int, nodes: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gpuguard-watch-bench-") as tmp:
        directory = Path(tmp)
        bench_audit.generate(directory, pods, nodes)
        return [item.body for item in iter_snapshot([str(directory)])
                if isinstance(item, Document)]


def kinds_of(items: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    by_kind: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in items:
        obj.setdefault("metadata", {}).setdefault("resourceVersion", "1")
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        by_kind.setdefault((group, obj["kind"]), []).append(obj)
    return by_kind


def build(update: PolicyUpdate, by_kind: dict, sink: CountingSink,
          pacing: WatchSettings) -> tuple[WatchController, float]:
    wall = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    controller = WatchController(AuditSettings(now=wall), update, sink, list(by_kind),
                                 clock=time.monotonic, wall=lambda: wall, watch=pacing)
    start = time.perf_counter()
    for (group, kind), items in by_kind.items():
        controller.listed(group, kind, items)
    controller.step()
    return controller, time.perf_counter() - start


def churn(controller: WatchController, by_kind: dict, rate: float, seconds: float
          ) -> list[float]:
    rng = random.Random(18)
    pods = by_kind[("", "Pod")]
    namespaces = sorted({p["metadata"]["namespace"] for p in pods
                         if p["metadata"].get("namespace", "").startswith("team-")})
    template = next(p for p in pods if p["metadata"].get("namespace", "").startswith("team-")
                    and "nvidia.com/gpu" in str(p["spec"]))
    created: list[dict[str, Any]] = []
    start = time.monotonic()
    done = 0
    version = 10
    while time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * rate)
        while done < due:
            done += 1
            at = start + done / rate  # when this change happened: latency counts from here
            version += 1
            roll = rng.random()
            if roll < 0.5 or not created:
                pod = copy.deepcopy(template)
                pod["metadata"] = {"name": f"churn-{done}", "namespace": rng.choice(namespaces),
                                   "resourceVersion": str(version), "uid": f"churn-{done}",
                                   "labels": {"kai.scheduler/queue": "q"}}
                if rng.random() < 0.25:
                    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
                created.append(pod)
                controller.event("ADDED", pod, at)
            elif roll < 0.8:
                pod = rng.choice(created)
                pod["metadata"]["resourceVersion"] = str(version)
                pod["status"] = {"phase": rng.choice(["Pending", "Running"])}
                controller.event("MODIFIED", pod, at)
            else:
                pod = created.pop(rng.randrange(len(created)))
                controller.event("DELETED", pod, at)
        controller.step()
    controller.step()
    return list(controller.counts.latencies)


def per_pod_memory(update: PolicyUpdate, pods: int, nodes: int) -> tuple[float, int]:
    by_kind = kinds_of(objects(pods, nodes))
    count = len(by_kind[("", "Pod")])
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    controller, _ = build(update, by_kind, CountingSink(), WatchSettings(report_interval_s=0))
    controller.last_report = None  # the last full report is transient (handed to the metrics)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # the input lists are the benchmark's, not the controller's: they were allocated before
    del by_kind
    return held / count, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=100.0, help="pod changes per second")
    parser.add_argument("--churn-s", type=float, default=30.0)
    parser.add_argument("--memory-pods", type=int, default=10_000)
    args = parser.parse_args()
    loaded = policy_set.load(None, DEFAULT_SETTINGS)
    update = PolicyUpdate(loaded.engine, (), loaded.engine.policies.digest)

    per_pod, counted = per_pod_memory(update, args.memory_pods, max(args.memory_pods // 20, 1))
    print(f"memory: {per_pod / 1024:.2f} KiB per pod held (tracemalloc, {counted:,} pods)",
          flush=True)

    start = time.perf_counter()
    by_kind = kinds_of(objects(args.pods, args.nodes))
    pods = len(by_kind[("", "Pod")])
    print(f"cluster: {pods:,} pods, {len(by_kind[('', 'Node')]):,} nodes, "
          f"{sum(map(len, by_kind.values())):,} objects (generated in "
          f"{time.perf_counter() - start:.1f} s)", flush=True)
    sink = CountingSink()
    pacing = WatchSettings(report_interval_s=0.0, full_every_s=60.0, writes_per_s=1000.0)
    controller, first = build(update, by_kind, sink, pacing)
    print(f"first full report: {first:.1f} s ({sink.writes} reports queued and written); "
          f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} "
          "MiB", flush=True)
    controller.counts.latencies.clear()
    latencies = churn(controller, by_kind, args.rate, args.churn_s)
    if len(latencies) >= 2:
        cuts = statistics.quantiles(latencies, n=100, method="inclusive")
        print(f"churn: {args.rate:.0f} pod changes/s for {args.churn_s:.0f} s: {len(latencies)} "
              f"report writes, change -> report p50 {statistics.median(latencies) * 1000:.0f} ms,"
              f" p99 {cuts[98] * 1000:.0f} ms; {controller.counts.namespace_evaluations} "
              f"namespace and {controller.counts.full_evaluations} full evaluations")
    else:
        print(f"churn: only {len(latencies)} report write(s) in {args.churn_s:.0f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss:,.0f} MiB (this process: generator and input lists included)")


if __name__ == "__main__":
    main()
