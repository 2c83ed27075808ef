"""Fields of the wrong API type are input errors naming the path (issue 13, item 4; a trial's
finds): ``check`` and the audit read a privileged GPU pod with ``privileged: "true"`` or
``containers: null`` — an object the API server refuses — as a pod without that field and called
it allowed, exit 0, with nothing said. The rule is :attr:`policies.facts.gpu.GPUFacts.input_errors`
(the GPU facts' ``invalid`` but the extended-resource entries a policy judges).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_USAGE
from policies.facts.workloads import workload_facts
from policies.policy.mutation import MutationError, apply_shortcut

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"containers": [{"name": "c", "image": "cuda",
                             "securityContext": {"privileged": True},
                             "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def _container(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]["containers"][0]


# The trial's objects (/tmp/t13/ret), each with the input error check must print.
CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "spec null": (lambda d: d.__setitem__("spec", None), "spec: required, none given"),
    "spec a string": (lambda d: d.__setitem__("spec", "x"), "spec: expected a map, got the string 'x'"),
    "containers null": (lambda d: d["spec"].__setitem__("containers", None),
                        "spec.containers: required, none given"),
    "containers a map": (lambda d: d["spec"].__setitem__("containers", {"c": _container(d)}),
                         "spec.containers: expected a list of containers"),
    "a container a string": (lambda d: d["spec"].__setitem__("containers", ["c"]),
                             "spec.containers[0]: expected a container object"),
    "privileged a string": (
        lambda d: _container(d)["securityContext"].__setitem__("privileged", "true"),
        "spec.containers[0].securityContext.privileged: expected a boolean, got the "
        "string 'true'"),
    "privileged 1": (lambda d: _container(d)["securityContext"].__setitem__("privileged", 1),
                     "spec.containers[0].securityContext.privileged: expected a boolean, got the "
                     "number 1"),
    "securityContext a list": (
        lambda d: _container(d).__setitem__("securityContext", [{"privileged": True}]),
        "spec.containers[0].securityContext: expected a map, got a list"),
    "capability a number": (
        lambda d: _container(d)["securityContext"].__setitem__("capabilities", {"add": [7]}),
        "spec.containers[0].securityContext.capabilities.add[0]: expected a string, got the "
        "number 7"),
    "hostPath path a number": (
        lambda d: d["spec"].__setitem__("volumes", [{"name": "v", "hostPath": {"path": 5}}]),
        "spec.volumes[0].hostPath.path: expected a string, got the number 5"),
}


def _check(capsys: pytest.CaptureFixture[str], path: Path, *extra: str
           ) -> tuple[int, dict[str, Any], str]:
    code = main(["check", "-f", str(path), "-o", "json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_reports_a_mistyped_field_as_an_input_error(case, tmp_path, capsys) -> None:
    mutate, problem = CASES[case]
    pod = copy.deepcopy(POD)
    mutate(pod)
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, report, err = _check(capsys, path)
    assert code == EXIT_USAGE
    assert any(problem in e for e in report["errors"]), report["errors"]
    assert f"{path}: document 0: {problem}" in err
    [entry] = report["results"]
    assert any(problem in e for e in entry["inputErrors"])
    # the table says so beside the verdict
    main(["check", "-f", str(path)])
    table = capsys.readouterr().out
    assert "(input errors)" in table and f"input error: {problem}" in " ".join(table.split())


@pytest.mark.parametrize("device", [None, 5, "", ["x"]])
def test_check_reports_a_vmi_gpu_without_a_device_name(device, tmp_path, capsys) -> None:
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "vgpu-vmi", "namespace": "team-a"},
           "spec": {"domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": device}]},
                               "resources": {"requests": {"memory": "4Gi"}}}}}
    path = tmp_path / "vmi.yaml"
    path.write_text(yaml.safe_dump(vmi))
    code, report, _ = _check(capsys, path)
    assert code == EXIT_USAGE
    assert [e.split(": ", 2)[-1] for e in report["errors"]] == [
        f"spec.domain.devices.gpus[0].deviceName: expected a resource name, got {device!r}"]


def test_a_well_typed_pod_has_no_input_errors(tmp_path, capsys) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(POD))
    code, report, _ = _check(capsys, path)
    assert report["errors"] == [] and report["results"][0]["inputErrors"] == []
    assert code == 1  # denied: privileged GPU container


def test_an_extended_resource_problem_stays_a_policy_finding(tmp_path, capsys) -> None:
    # gpu-requests-equal-limits judges these (examples/cluster has one): not an input error
    pod = copy.deepcopy(POD)
    del _container(pod)["securityContext"]
    _container(pod)["resources"] = {"requests": {"nvidia.com/gpu": 1}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, report, _ = _check(capsys, path)
    assert report["errors"] == [] and code == 1
    facts = workload_facts(pod)
    assert facts is not None and facts.total.invalid and not facts.total.input_errors


def test_the_audit_reports_mistyped_fields_of_pods_and_templates(tmp_path, capsys) -> None:
    pod = copy.deepcopy(POD)
    _container(pod)["securityContext"]["privileged"] = "true"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": "team-a"},
                  "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                      "metadata": {"labels": {"a": "b"}},
                      "spec": copy.deepcopy(pod["spec"])}}}
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all([pod, deployment]))
    code = main(["audit", "-f", str(path), "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == EXIT_USAGE
    assert report["errors"] == [
        f"{path}: document 0: Pod team-a/p: spec.containers[0].securityContext.privileged: "
        "expected a boolean, got the string 'true'",
        f"{path}: document 1: Deployment team-a/d: spec.template.spec.containers[0]."
        "securityContext.privileged: expected a boolean, got the string 'true'"]


def test_tolerations_of_the_wrong_type_are_an_error_in_check_as_at_the_webhook(
        tmp_path, capsys) -> None:
    # The trial: `tolerations: 10**30` — check applied add-gpu-toleration's addToleration over
    # it (a list replaced the number) and gpu-node-toleration passed, while the webhook's
    # /validate, sent the object itself, reported the evaluation error.
    pod = copy.deepcopy(POD)
    del _container(pod)["securityContext"]
    pod["spec"]["tolerations"] = 10**30
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    _, report, _ = _check(capsys, path)
    outcomes = {(r["policy"], r["rule"]): (r["outcome"], r["message"])
                for r in report["results"][0]["results"]}
    assert outcomes[("add-gpu-toleration-and-runtimeclass", "add-gpu-toleration")] == (
        "error", "mutation 'add-gpu-toleration' failed: addToleration: spec.tolerations: "
                 "expected a list, got the number 1000000000000000000000000000000; not changed")
    assert outcomes[("gpu-node-toleration", "tolerates-gpu-taint")][0] == "error"


@pytest.mark.parametrize(("shortcut", "field", "value", "message"), [
    (("addToleration", {"key": "nvidia.com/gpu", "operator": "Exists"}), "tolerations", 5,
     "addToleration: spec.tolerations: expected a list, got the number 5; not changed"),
    (("setNodeSelector", {"key": "k", "value": "v"}), "nodeSelector", "x",
     "setNodeSelector: spec.nodeSelector: expected a map, got the string 'x'; not changed"),
])
def test_a_mutation_shortcut_never_replaces_a_mistyped_field(shortcut, field, value,
                                                              message) -> None:
    pod = copy.deepcopy(POD)
    pod["spec"][field] = value
    with pytest.raises(MutationError) as raised:
        apply_shortcut(pod, shortcut, workload_facts(pod))
    assert str(raised.value) == message
    assert pod["spec"][field] == value


def test_an_empty_namespace_is_the_same_as_none_in_the_audit(tmp_path, capsys) -> None:
    # The API server reads `namespace: ""` as unset; the audit reported it as another namespace
    pods = []
    for name, metadata in (("p-empty", {"namespace": ""}), ("p-missing", {})):
        pod = copy.deepcopy(POD)
        pod["metadata"] = {"name": name, **metadata}
        pods.append(pod)
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(pods))
    main(["audit", "-f", str(path), "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert sorted((w["namespace"], w["name"]) for w in report["workloads"]) == [
        (None, "p-empty"), (None, "p-missing")]
