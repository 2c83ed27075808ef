"""GPU facts throughput: 100k pods built from the corpus mix.

Run: .venv/bin/python benchmarks/gpu_facts.py [--pods N]
Prints pods/s for pod_facts (one pod spec) and for workload_facts (whole objects), best of 3.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from policies.facts.gpu import pod_facts  # noqa: E402
from policies.facts.workloads import claim_templates_of, find_workload, workload_facts  # noqa: E402
from policies.sources import read_documents  # noqa: E402


def corpus_objects():
    documents, errors = read_documents([str(ROOT / "tests" / "data" / "manifests")])
    assert not errors, errors
    return [d.body for d in documents]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100_000)
    args = parser.parse_args()
    objects = corpus_objects()
    claims = claim_templates_of(objects)
    templates = []
    for obj in objects:
        workload = find_workload(obj)
        if workload is not None:
            templates += [(t, workload.namespace) for t in workload.templates]
    pods = list(itertools.islice(itertools.cycle(templates), args.pods))
    print(
        f"corpus: {len(objects)} objects, {len(templates)} pod templates; "
        f"benchmark: {len(pods)} pods"
    )

    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for template, namespace in pods:
            pod_facts(
                template.spec,
                template.metadata,
                spec_path=template.spec_path,
                claim_templates=claims,
                namespace=namespace,
            )
        best = min(best, time.perf_counter() - start)
    print(
        f"pod_facts:      {len(pods) / best:10,.0f} pods/s  ({best * 1e6 / len(pods):.1f} µs/pod)"
    )

    workloads = [o for o in objects if find_workload(o) is not None]
    batch = list(itertools.islice(itertools.cycle(workloads), args.pods // 2))
    pod_count = sum(find_workload(o).replicas or 1 for o in batch)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for obj in batch:
            workload_facts(obj, claim_templates=claims)
        best = min(best, time.perf_counter() - start)
    print(
        f"workload_facts: {len(batch) / best:10,.0f} objects/s ({best * 1e6 / len(batch):.1f} "
        f"µs/object, {pod_count:,} pods described)"
    )


if __name__ == "__main__":
    main()
