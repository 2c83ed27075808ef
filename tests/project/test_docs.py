"""The CEL reference (docs/cel.md) stays true: every example compiles and evaluates to a bool."""

import json
import re

import pytest

from policies.authorization import Subject
from policies.cel.gpu import gpu_data
from policies.cel.library import authz
from policies.facts.workloads import workload_facts
from tests.builders.corpus import first
from tests.builders.environment import ENV
from tests.builders.rbac import gpu_roles
from tests.paths import ROOT, TESTS

DOC = ROOT / "docs" / "cel.md"


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
        "quota": {  # the shape of policies.policy.quota.quota_variable (docs/cel.md)
            "quotas": {"team-a": {
                "scope": {"kind": "Team", "namespace": None, "label": "team", "value": "team-a"},
                "used": {"gpuEquivalents": 2.5, "gpus": {"nvidia.com/gpu": 2},
                         "gpuMemoryGiB": 0.0, "mig": {"1g.10gb": 1}, "products": {},
                         "pods": 3, "unknownPods": 0},
                "limits": {"gpus": {}, "mig": {}, "products": {}, "gpuEquivalents": 8.0},
                "headroomGpuEquivalents": 5.5}},
            "request": {"gpuEquivalents": 1.0, "gpus": {"nvidia.com/gpu": 1},
                        "gpuMemoryGiB": 0.0, "mig": {}, "products": {}, "pods": 1,
                        "unknownPods": 0}},
    }


def test_the_reference_has_examples():
    assert len(examples()) >= 45


@pytest.mark.parametrize("expression", examples())
def test_documented_example_evaluates_to_a_bool(expression):
    data = sample_data()
    variables = [("gpus", ENV.compile("gpu.count", field_path="variables.gpus"))]
    # authorizer examples: alice's checks answered by tests/data/rbac/gpu-roles.yaml
    session = authz.Session(gpu_roles(), Subject("alice", groups=("ml-engineers",)))
    with authz.bound(session, {"group": "", "resource": "pods", "namespace": "team-a"}) as value:
        data["authorizer"] = value
        activation = ENV.activation(data, variables)
        value = activation.evaluate(ENV.compile(expression, field_path="docs/cel.md"))
    assert isinstance(value, bool), (expression, value)


def test_policies_page_example_loads_and_decides(tmp_path, capsys):
    from gpuguard.cli import main

    page = (DOC.parent / "policies.md").read_text()
    block = re.search(r"```yaml\n(apiVersion: gpuguard.io/v1alpha1\nkind: GPUPolicy\n.*?)```",
                      page, re.S)
    assert block, "docs/policies.md has a GPUPolicy example"
    policy = tmp_path / "policy.yaml"
    policy.write_text(block[1])
    assert main(["lint", str(policy)]) == 0
    lws = str(TESTS / "data" / "manifests" /
              "lws__vllm-gpu-leaderworkerset.yaml")
    capsys.readouterr()
    rc = main(["check", "-f", lws, "--policies", str(policy),
               "--namespace-labels", "gpuguard.io/team=llm", "-o", "json"])
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert rc == 1
    assert result["message"] == "team-gpu-limits: a pod asks for 8 GPUs; the limit is 4"
    assert rc == 1 and result["patch"][0]["path"].endswith("/tolerations")
    assert main(["check", "-f", lws, "--policies", str(policy)]) == 0  # not a team namespace
