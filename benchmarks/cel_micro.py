"""Micro-benchmark: µs per CEL evaluation over a real Pod, gpuguard (cel-expr-python) vs celpy.

Run: .venv/bin/python benchmarks/cel_micro.py [--rounds N]

Columns:
  raw     cel-expr-python directly, one runtime Activation shared by all evaluations
  shared  gpuguard RequestActivation.evaluate (one activation per request, as the webhook does)
  fresh   gpuguard CompiledExpression.evaluate (input conversion + new activation every call)
  celpy   the pure-Python cel-python package (import celpy), one activation shared
  ratio   celpy / shared
Then the cost of a request with policy variables, evaluated lazily (only what the validation
mentions) against eagerly (every variable first).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

from policies.cel.runtime import CompiledExpression, default_environment

ROOT = Path(__file__).resolve().parent.parent
POD = ROOT / "tests/data/manifests/dcgm__nbody-pod-burstable-cpu.yaml"

# Standard CEL only, so that both engines run the same text.
SHARED = {
    "all containers set limits": "object.spec.containers.all(c, has(c.resources.limits))",
    "gpu containers <= 8": (
        "object.spec.containers.filter(c, 'nvidia.com/gpu' in c.resources.limits).size() <= 8"
    ),
    "images from nvcr.io": "object.spec.containers.all(c, c.image.startsWith('nvcr.io/'))",
    "name regex + restartPolicy": (
        "object.metadata.name.matches('^[a-z0-9-]+$') && "
        "object.spec.restartPolicy in ['OnFailure', 'Never']"
    ),
    "requests below limits (strings)": (
        "object.spec.containers.exists(c, has(c.resources.requests) && "
        "c.resources.requests.cpu != c.resources.limits.cpu)"
    ),
}
# Kubernetes-library expressions: Python callbacks, gpuguard only.
GPUGUARD_ONLY = {
    "quantity compare (callback)": (
        "quantity(object.spec.containers[0].resources.requests.memory).isLessThan(quantity('1Gi'))"
    ),
    "optional label lookup": "object.?metadata.?labels[?'team'].orValue('none') == 'none'",
    "gpu sum (list callback)": (
        "object.spec.containers.map(c, int(c.resources.limits[?'nvidia.com/gpu'].orValue(0)))"
        ".sum() <= 8"
    ),
}


def per_call_us(fn, rounds: int) -> float:
    """Median over 5 batches of ``rounds`` calls, in µs per call."""
    fn()
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        batches.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(batches)


def celpy_program(expression: str):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    pod = yaml.safe_load(POD.read_text())
    env = default_environment()
    request = env.activation({"object": pod})
    raw_activation = env._runtime_activation(  # the runtime alone, for reference
        {"object": pod, **dict.fromkeys(("oldObject", "request", "params", "variables"))}
    )

    try:
        import celpy

        celpy_activation = {"object": celpy.json_to_cel(pod)}
    except ImportError:
        celpy = None
        print("celpy (cel-python) is not installed: pip install -e '.[bench]'")

    header = f"{'expression':34} {'raw':>7} {'shared':>7} {'fresh':>7} {'celpy':>8} {'ratio':>6}"
    print(f"µs per evaluation, Pod {POD.name}, median of 5 x {args.rounds} calls")
    print(header)
    print("-" * len(header))
    for title, text in {**SHARED, **GPUGUARD_ONLY}.items():
        compiled: CompiledExpression = env.compile(text, field_path=title)
        raw = per_call_us(lambda c=compiled: c._program.eval(raw_activation), args.rounds)
        shared = per_call_us(lambda c=compiled: request.evaluate(c), args.rounds)
        fresh = per_call_us(lambda c=compiled: c.evaluate({"object": pod}), args.rounds)
        if celpy is not None and title in SHARED:
            program = celpy_program(text)
            rounds = max(args.rounds // 20, 20)
            slow = per_call_us(lambda p=program: p.evaluate(celpy_activation), rounds)
            ratio = slow / shared
            print(f"{title:34} {raw:7.1f} {shared:7.1f} {fresh:7.1f} {slow:8.1f} {ratio:5.0f}x")
        else:
            print(f"{title:34} {raw:7.1f} {shared:7.1f} {fresh:7.1f} {'-':>8} {'-':>6}")

    variables = [
        ("containers", env.compile("object.spec.containers", field_path="v0")),
        (
            "gpus",
            env.compile(
                "variables.containers.map(c, "
                "int(c.resources.limits[?'nvidia.com/gpu'].orValue(0)))",
                field_path="v1",
            ),
        ),
        ("total", env.compile("variables.gpus.sum()", field_path="v2")),
        ("images", env.compile("variables.containers.map(c, c.image)", field_path="v3")),
        ("names", env.compile("variables.containers.map(c, c.name).join(',')", field_path="v4")),
    ]
    validation = env.compile("variables.total <= 8", field_path="validation")

    def lazy() -> None:
        env.activation({"object": pod}, variables).evaluate(validation)

    def eager() -> None:
        activation = env.activation({"object": pod}, variables)
        for name, _ in variables:
            activation.variable(name)
        activation.evaluate(validation)

    print()
    print("one request, 5 variables, 1 validation using 3 of them (µs per request):")
    print(f"  lazy  (only what the validation needs) {per_call_us(lazy, args.rounds // 4):7.1f}")
    print(f"  eager (every variable, in order)       {per_call_us(eager, args.rounds // 4):7.1f}")


if __name__ == "__main__":
    main()
