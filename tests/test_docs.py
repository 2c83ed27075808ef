"""The CEL reference (docs/cel.md) stays true: every example compiles and evaluates to a bool."""

import re
from pathlib import Path

import pytest

from policies.cel import CelEnvironment
from policies.cel_gpu import GPU_LIBRARY, gpu_data
from policies.workloads import workload_facts
from tests.corpus import first

DOC = Path(__file__).resolve().parent.parent / "docs" / "cel.md"
ENV = CelEnvironment(GPU_LIBRARY)


def examples():
    found = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        last = cells[-1]
        if last.startswith("`") and last.endswith("`") and "example" not in last:
            found.append(last.strip("`").replace("\\|", "|"))
    return found


def sample_data():
    pod = first("manifests/hami__default-use-gpumem-gpucores.yaml")
    pod["metadata"]["labels"] = {"team": "a"}
    return {
        "object": pod,
        "oldObject": None,
        "request": {"operation": "CREATE", "userInfo": {"username": "alice",
                                                         "groups": ["ml-engineers"]}},
        "params": {"maxGPUs": 8},
        "namespaceObject": {"metadata": {"name": "team-a",
                                         "labels": {"gpuguard.io/team": "a"}}},
        "gpu": gpu_data(workload_facts(pod)),
        "quota": {"used": 1},
    }


def test_the_reference_has_examples():
    assert len(examples()) >= 45


@pytest.mark.parametrize("expression", examples())
def test_documented_example_evaluates_to_a_bool(expression):
    data = sample_data()
    variables = [("gpus", ENV.compile("gpu.count", field_path="variables.gpus"))]
    activation = ENV.activation(data, variables)
    value = activation.evaluate(ENV.compile(expression, field_path="docs/cel.md"))
    assert isinstance(value, bool), (expression, value)
