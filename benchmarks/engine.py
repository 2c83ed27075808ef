"""Policy engine benchmark: in-process evaluation over the corpus manifests.

Run: .venv/bin/python benchmarks/engine.py [--requests N]

Prints, for (a) the built-in library and (b) the library plus 50 synthetic CEL policies, the
per-request latency p50 / p99 (µs) and requests/s of ``Engine.evaluate`` (mutations and
validations, GPU facts included). Then evaluates the synthetic policies' expressions once through
cel-expr-python and once through the pure-Python ``celpy`` (package cel-python) on the same data,
and prints the ratio, so the engine choice in DESIGN.md stays measured.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from policies.cel.gpu import GPU_LIBRARY, gpu_data  # noqa: E402
from policies.cel.runtime import CelEnvironment  # noqa: E402
from policies.engine.evaluation import Engine  # noqa: E402
from policies.facts.review import from_object  # noqa: E402
from policies.facts.workloads import find_workload, workload_facts  # noqa: E402
from policies.policy.loader import build_policy_set, load_policies  # noqa: E402
from policies.sources import Document, library_path, parse_text, read_documents  # noqa: E402

TEMPLATES = (
    "!has(object.metadata.name) || object.metadata.name.size() < {n}",
    "!has(object.metadata.labels) || !('forbidden-{i}' in object.metadata.labels)",
    "gpu.count <= {n}",
    "gpu.equivalents <= {i}.0 + 100.0",
    "object.kind != 'Forbidden{i}' && gpu.migProfiles.size() <= {n}",
)


def synthetic_policies(count: int = 50) -> str:
    """``count`` GPUPolicies, each with one validation from TEMPLATES."""
    documents = []
    for i in range(count):
        expression = TEMPLATES[i % len(TEMPLATES)].format(i=i, n=64 + i)
        documents.append({
            "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
            "metadata": {"name": f"synthetic-{i:02d}"},
            "spec": {"validations": [{"expression": expression}]},
        })
    return yaml.safe_dump_all(documents)


def corpus_reviews():
    documents, errors = read_documents([str(ROOT / "tests" / "data" / "manifests")])
    assert not errors, errors
    return [from_object(d.body) for d in documents if find_workload(d.body) is not None]


def measure(engine: Engine, reviews, total: int) -> tuple[float, float, float]:
    """(p50 µs, p99 µs, requests/s) over ``total`` evaluations."""
    timings = []
    for review in itertools.islice(itertools.cycle(reviews), total):
        start = time.perf_counter_ns()
        engine.evaluate(review)
        timings.append((time.perf_counter_ns() - start) / 1000)
    timings.sort()
    p50 = statistics.median(timings)
    p99 = timings[int(len(timings) * 0.99) - 1]
    return p50, p99, 1e6 * len(timings) / sum(timings)


def compare_celpy(reviews, rounds: int) -> None:
    """Same expressions, same data: cel-expr-python vs celpy."""
    try:
        import celpy
    except ImportError:
        print("celpy not installed (pip install -e '.[bench]'): ratio skipped")
        return
    expressions = [TEMPLATES[i % len(TEMPLATES)].format(i=i, n=64 + i) for i in range(50)]
    env = CelEnvironment(GPU_LIBRARY)
    fast = [env.compile(e, field_path="bench") for e in expressions]
    slow_env = celpy.Environment()
    slow = [slow_env.program(slow_env.compile(e)) for e in expressions]
    data = [{"object": dict(r.object), "gpu": gpu_data(workload_facts(r.object))}
            for r in reviews]
    start = time.perf_counter()
    for _ in range(rounds):
        for item in data:
            activation = env.activation(item)
            for expression in fast:
                activation.evaluate(expression)
    fast_time = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(rounds):
        for item in data:
            activation = {k: celpy.json_to_cel(v) for k, v in item.items()}
            for program in slow:
                program.evaluate(activation)
    slow_time = time.perf_counter() - start
    evaluations = rounds * len(data) * len(expressions)
    print(f"cel-expr-python: {fast_time * 1e6 / evaluations:8.1f} µs/evaluation")
    print(f"celpy:           {slow_time * 1e6 / evaluations:8.1f} µs/evaluation")
    print(f"ratio celpy / cel-expr-python: {slow_time / fast_time:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    reviews = corpus_reviews()
    environment = CelEnvironment(GPU_LIBRARY)
    library, errors = load_policies([library_path()], environment)
    assert not errors, [str(e) for e in errors]
    extra = [Document("synthetic.yaml", i, None, body, None)
             for i, body, _ in parse_text("synthetic.yaml", synthetic_policies())]
    synthetic, errors = build_policy_set(extra, environment)
    assert not errors, [str(e) for e in errors]
    combined = type(library)(library.policies + synthetic.policies)
    print(f"{len(reviews)} corpus workloads, {args.requests} evaluations per row")
    for label, policy_set in ((f"built-in library ({len(library.policies)} policies)", library),
                              (f"library + 50 synthetic ({len(combined.policies)})", combined)):
        engine = Engine(policy_set, environment)
        measure(engine, reviews, 200)  # warm-up
        p50, p99, rate = measure(engine, reviews, args.requests)
        print(f"{label:40s} p50 {p50:7.1f} µs  p99 {p99:7.1f} µs  {rate:8,.0f} requests/s")
    compare_celpy(reviews, rounds=3)


if __name__ == "__main__":
    main()
