"""Audit throughput and memory: a 100k-pod / 5k-node snapshot built from the example cluster's mix.

Run: .venv/bin/python benchmarks/audit.py [--pods N] [--nodes N] [--jobs N] [--skip-live]
[--snapshot DIR]

``--snapshot DIR`` keeps the generated snapshot in DIR and reuses it when DIR already holds one
(a 1M-pod snapshot is ~2.5 GiB of JSON and minutes to write: generate it once, delete it and
the ``DIR.counts`` file beside it after).

Writes the snapshot as ``kubectl get … -A -o json`` would (one ``kind: List`` file per resource,
pods.json holding every pod) into a temporary directory, then runs ``gpuguard audit`` in a child
process — so the generator's memory is not measured — twice:

1. file input: ``gpuguard audit -f DIR``;
2. live input: the same objects served by the fake kube-apiserver of
   ``tests/fakes/fake_kube_api.py`` (pages of 500, through the real ``kubernetes`` client).

For each it prints wall time, pods/s and the child's peak RSS (``wait4`` rusage: the largest
resident set of the audit process and of the policy workers it forks); the file audit runs
``--repeat`` times (best and median shown: shared machines are noisy). Targets for the file input:
15 s and 400 MiB.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.sources.files import iter_snapshot  # noqa: E402
from policies.sources import Document  # noqa: E402

EXAMPLE = ROOT / "examples" / "cluster"
TEAMS = 40
TARGET_S = 15.0
TARGET_MIB = 400.0


def example_objects() -> dict[str, list[dict]]:
    by_kind: dict[str, list[dict]] = {}
    for item in iter_snapshot([str(EXAMPLE)]):
        if isinstance(item, Document):
            by_kind.setdefault(item.body["kind"], []).append(item.body)
    return by_kind


class Writer:
    """Streams one ``kind: List`` JSON file, items first (as kubectl writes it)."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("w", encoding="utf-8")
        self.handle.write('{\n    "apiVersion": "v1",\n    "items": [\n')
        self.first = True
        self.count = 0

    def add(self, obj: dict) -> None:
        if not self.first:
            self.handle.write(",\n")
        self.first = False
        self.handle.write(json.dumps(obj, indent=None))
        self.count += 1

    def close(self) -> None:
        self.handle.write('\n    ],\n    "kind": "List",\n'
                          '    "metadata": {"resourceVersion": ""}\n}\n')
        self.handle.close()


def generate(directory: Path, pods_wanted: int, nodes_wanted: int) -> dict[str, int]:
    """Write the snapshot; returns object counts."""
    example = example_objects()
    writers = {name: Writer(directory / f"{name}.json") for name in
               ("namespaces", "nodes", "deployments", "replicasets", "statefulsets",
                "daemonsets", "jobs", "pytorchjobs", "rayclusters", "pods")}
    # --- nodes: the example's 15 node kinds, cycled --------------------------------------------
    node_names = []
    for i, template in zip(range(nodes_wanted), itertools.cycle(example["Node"]), strict=False):
        node = copy.deepcopy(template)
        name = f"{template['metadata']['name']}-{i:05d}"
        node["metadata"]["name"] = name
        labels = node["metadata"].setdefault("labels", {})
        if "kubernetes.io/hostname" in labels:
            labels["kubernetes.io/hostname"] = name
        writers["nodes"].add(node)
        node_names.append(name)
    usable = [n for n in node_names if "a100-0" not in n]  # keep the broken nodes empty
    # --- namespaces -----------------------------------------------------------------------------
    namespaces = [f"team-{t:02d}" for t in range(TEAMS)]
    for t, name in enumerate(namespaces):
        writers["namespaces"].add({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": {"gpuguard.io/team": f"t{t % 12}"}}})
    writers["namespaces"].add({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "gpu-operator"}})
    # --- pod and controller templates from the example -----------------------------------------
    pods = {p["metadata"]["name"]: p for p in example["Pod"]}

    def pod_like(prefix: str) -> dict:
        return next(p for name, p in pods.items() if name.startswith(prefix))

    deployment_kinds = [
        (next(d for d in example["Deployment"] if d["metadata"]["name"] == name), pod_like(pod))
        for name, pod in (("mistral-7b", "mistral-7b"), ("flower", "flower-5f8d"),
                          ("nvidia-plugin-mps-test", "nvidia-plugin-mps-test"),
                          ("notebooks", "notebooks"), ("vllm-cross-vgpu", "vllm-cross-vgpu"),
                          ("flower-single", "flower-single"))]
    counter = itertools.count()
    node_cycle = itertools.cycle(usable)
    made = {"pods": 0}

    def add_pod(template: dict, namespace: str, name: str, owner: tuple[str, str, str] | None,
                index: int) -> None:
        pod = dict(template)
        metadata = {k: v for k, v in template["metadata"].items()
                    if k not in ("ownerReferences", "name", "namespace", "uid")}
        metadata.update(name=name, namespace=namespace, uid=f"uid-{next(counter)}")
        if owner:
            metadata["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1],
                                            "name": owner[2], "uid": f"uid-{owner[2]}",
                                            "controller": True}]
        pod["metadata"] = metadata
        spec = dict(template["spec"])
        status = dict(template.get("status") or {})
        if index % 50 == 49:  # 2 %: pending
            spec.pop("nodeName", None)
            status = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        elif index % 33 == 32:  # 3 %: finished
            spec["nodeName"] = next(node_cycle)
            status["phase"] = "Succeeded"
        else:
            spec["nodeName"] = next(node_cycle)
            status["phase"] = "Running"
        pod["spec"] = spec
        pod["status"] = status
        writers["pods"].add(pod)
        made["pods"] += 1

    # DaemonSets: 3 per node
    gfd_pod = pod_like("gpu-feature-discovery")
    gfd = next(d for d in example["DaemonSet"])
    for d in range(3):
        name = f"{gfd['metadata']['name']}-{d}"
        ds = copy.deepcopy(gfd)
        ds["metadata"]["name"] = name
        writers["daemonsets"].add(ds)
        for i, node in enumerate(node_names):
            pod = dict(gfd_pod)
            pod["spec"] = {**gfd_pod["spec"], "nodeName": node}
            add_pod(pod, "gpu-operator", f"{name}-{i:05d}", ("apps/v1", "DaemonSet", name), 0)
    # the rest: Deployments (via ReplicaSets), Jobs, StatefulSets, PyTorchJobs, RayClusters, pods
    job = next(j for j in example["Job"] if j["metadata"]["name"] == "j-e2e-1")
    job_pod = pod_like("j-e2e-1")
    sts = next(s for s in example["StatefulSet"] if s["metadata"]["name"] == "ollama-cpu")
    sts_pod = pod_like("ollama-cpu")
    pytorch = example["PyTorchJob"][0]
    pytorch_pod = pods["pytorch-dist-mnist-nccl-worker-0"]
    ray = example["RayCluster"][0]
    ray_pod = pod_like("raycluster-half-gpu-shared")
    bare = [pods["hami-gpu-pod"], pods["debug-shell"], pods["cuda-vector-add"]]
    replicas = itertools.cycle((8, 16, 32, 64, 68))
    w = 0
    while made["pods"] < pods_wanted:
        namespace = namespaces[w % TEAMS]
        kind = w % 10
        if kind < 4:
            template, pod = deployment_kinds[w % len(deployment_kinds)]
            name = f"{template['metadata']['name']}-{w}"
            count = next(replicas)
            deployment = copy.deepcopy(template)
            deployment["metadata"].update(name=name, namespace=namespace)
            deployment["spec"]["replicas"] = count
            writers["deployments"].add(deployment)
            rs_name = f"{name}-7c9d8"
            writers["replicasets"].add({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": rs_name, "namespace": namespace, "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                     "controller": True}]},
                "spec": {"replicas": count, "template": deployment["spec"]["template"]}})
            for r in range(count):
                add_pod(pod, namespace, f"{rs_name}-{r:04d}", ("apps/v1", "ReplicaSet", rs_name),
                        r)
        elif kind < 7:
            name = f"j-{w}"
            parallelism = (1, 2, 4, 8)[w % 4]
            obj = copy.deepcopy(job)
            obj["metadata"].update(name=name, namespace=namespace)
            obj["spec"]["parallelism"] = obj["spec"]["completions"] = parallelism
            writers["jobs"].add(obj)
            for r in range(parallelism):
                add_pod(job_pod, namespace, f"{name}-{r}", ("batch/v1", "Job", name), r)
        elif kind == 7:
            name = f"kv-{w}"
            obj = copy.deepcopy(sts)
            obj["metadata"].update(name=name, namespace=namespace)
            writers["statefulsets"].add(obj)
            for r in range(3):
                add_pod(sts_pod, namespace, f"{name}-{r}", ("apps/v1", "StatefulSet", name), r)
        elif kind == 8:
            if w % 20 == 8:
                name = f"train-{w}"
                obj = copy.deepcopy(pytorch)
                obj["metadata"].update(name=name, namespace=namespace)
                writers["pytorchjobs"].add(obj)
                for r in range(3):
                    add_pod(pytorch_pod, namespace, f"{name}-worker-{r}",
                            ("kubeflow.org/v1", "PyTorchJob", name), r)
            else:
                name = f"ray-{w}"
                obj = copy.deepcopy(ray)
                obj["metadata"].update(name=name, namespace=namespace)
                writers["rayclusters"].add(obj)
                for r in range(3):
                    add_pod(ray_pod, namespace, f"{name}-worker-{r}",
                            ("ray.io/v1", "RayCluster", name), r)
        else:
            pod = bare[w % len(bare)]
            add_pod(pod, namespace, f"{pod['metadata']['name']}-{w}", None, w)
        w += 1
    counts = {name: writer.count for name, writer in writers.items()}
    for writer in writers.values():
        writer.close()
    return counts


def run_child(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit code) of one child process."""
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    stderr = process.stderr.read().decode() if process.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        print(stderr[-2000:], file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, code


def report(label: str, pods: int, wall: float, rss: float, *, target: bool) -> None:
    line = f"{label:<6} {wall:7.1f} s  {pods / wall:9,.0f} pods/s  peak RSS {rss:6.0f} MiB"
    if target:
        verdict = "ok" if wall <= TARGET_S and rss <= TARGET_MIB else "OVER TARGET"
        line += f"  (target {TARGET_S:.0f} s / {TARGET_MIB:.0f} MiB: {verdict})"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--jobs", type=int, default=None,
                        help="policy worker processes (default: gpuguard's default)")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="file audits to run (best shown)")
    parser.add_argument("--snapshot", type=Path, metavar="DIR",
                        help="keep the snapshot in DIR; reuse the one DIR holds")
    args = parser.parse_args()
    gpuguard = [sys.executable, "-m", "gpuguard", "audit", "-o", "json"]
    if args.jobs:
        gpuguard += ["--jobs", str(args.jobs)]
    with tempfile.TemporaryDirectory(prefix="gpuguard-bench-") as tmp:
        directory = args.snapshot or Path(tmp) / "snapshot"
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        counts_file = directory.with_name(directory.name + ".counts")  # beside it: not audited
        if counts_file.exists():
            counts = json.loads(counts_file.read_text())
        else:
            counts = generate(directory, args.pods, args.nodes)
            if args.snapshot:
                counts_file.write_text(json.dumps(counts))
        size = sum(p.stat().st_size for p in directory.glob("*.json")) / 2**20
        print(f"snapshot: {counts['pods']:,} pods, {counts['nodes']:,} nodes, "
              f"{sum(counts.values()) - counts['pods'] - counts['nodes']:,} other objects, "
              f"{size:,.0f} MiB of JSON (generated in {time.perf_counter() - start:.1f} s)")
        print(f"cpus: {os.cpu_count()}", flush=True)
        runs = sorted(run_child([*gpuguard, "-f", str(directory)])[:2]
                      for _ in range(max(1, args.repeat)))
        wall, rss = runs[0]
        report("file", counts["pods"], wall, rss, target=True)
        if len(runs) > 1:
            print(f"       (median of {len(runs)} runs: {runs[len(runs) // 2][0]:.1f} s)")
        if args.skip_live:
            return
        from tests.fakes.fake_kube_api import FakeKubeAPI

        objects = (item.body for item in iter_snapshot([str(directory)])
                   if isinstance(item, Document))
        with FakeKubeAPI(objects) as api:
            kubeconfig = api.kubeconfig(Path(tmp) / "kubeconfig")
            wall, rss, _ = run_child([*gpuguard, "--kubeconfig", str(kubeconfig)])
        report("live", counts["pods"], wall, rss, target=False)


if __name__ == "__main__":
    main()
