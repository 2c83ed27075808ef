"""An ownerReference to a Pod is not followed (a fresh-context trial, 2026-12-04): a privileged
GPU pod naming a harmless pod as its controller was rolled up to it, never evaluated, and the
report looked clean. No controller makes pods own pods (a LeaderWorkerSet's leader pod owns a
StatefulSet, which the example cluster's vllm pods roll up through); such a pod is its own
workload."""

from __future__ import annotations

import json

from gpuguard.cli import main

HIDDEN = """\
apiVersion: v1
kind: Pod
metadata:
  name: evil
  namespace: team-a
  ownerReferences:
  - {apiVersion: v1, kind: Pod, name: benign, uid: u1, controller: true}
spec:
  nodeName: n1
  containers:
  - name: c
    image: cuda
    securityContext: {privileged: true}
    resources: {limits: {nvidia.com/gpu: 1}}
status: {phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: benign, namespace: team-a}
spec:
  nodeName: n1
  containers:
  - name: c
    image: cuda
    resources: {limits: {nvidia.com/gpu: 1}}
status: {phase: Running}
"""


def _audit(tmp_path, capsys, text: str) -> tuple[int, dict]:
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    capsys.readouterr()
    code = main(["audit", "-f", str(path), "-o", "json", "--jobs", "0", "--fail-on", "deny"])
    return code, json.loads(capsys.readouterr().out)


def test_a_pod_naming_a_pod_as_its_controller_is_judged_by_its_own_spec(tmp_path, capsys):
    code, report = _audit(tmp_path, capsys, HIDDEN)
    denied = {(f["policy"], f["workload"]["kind"], f["workload"]["name"])
              for f in report["findings"] if f["severity"] == "deny"}
    assert ("no-privileged-gpu", "Pod", "evil") in denied
    assert code == 1
    assert {(w["name"], w["pods"]["running"]) for w in report["workloads"]} == \
        {("evil", 1), ("benign", 1)}
    assert ("1 Pod(s) name a Pod in ownerReferences (team-a/evil → benign): no controller "
            "makes pods own pods, so each is audited as its own workload, by its own spec"
            ) in report["warnings"]


def test_pods_naming_each_other_are_two_workloads(tmp_path, capsys):
    looped = HIDDEN.replace("metadata: {name: benign, namespace: team-a}",
                            "metadata: {name: benign, namespace: team-a, ownerReferences: "
                            "[{apiVersion: v1, kind: Pod, name: evil, uid: u2}]}")
    _, report = _audit(tmp_path, capsys, looped)
    assert sorted(w["name"] for w in report["workloads"]) == ["benign", "evil"]
    assert sorted(f["evaluated"]["name"] for f in report["findings"]
                  if f["policy"] == "no-privileged-gpu") == ["evil"]
    assert any(w.startswith("2 Pod(s) name a Pod in ownerReferences") for w in
               report["warnings"])
