"""A controller reference is followed only where a controller could have written it (two
fresh-context trials, 2026-12-04): a privileged GPU pod naming a harmless pod as its controller
was rolled up to it, never evaluated, and the report looked clean; then a StatefulSet naming a
harmless pod, a Deployment naming a Job, and a pod naming a ReplicaSet in a reference without
``controller: true`` (its GPUs taken from the ReplicaSet's first pod by a cache keyed on the
pod-template-hash label) did the same. Such objects are their own workloads, judged and counted
by their own spec. A LeaderWorkerSet's leader pod still owns its workers' StatefulSet (the
example cluster's vllm pods roll up through one: its report is unchanged)."""

from __future__ import annotations

import datetime
import json

import pytest

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
    assert any(w.startswith("1 object(s) name as their controller a kind that does not create "
                            "them (Pod team-a/evil → Pod benign): ")
               and w.endswith("so each is audited as its own workload, by its own spec")
               for w in report["warnings"])


def test_pods_naming_each_other_are_two_workloads(tmp_path, capsys):
    looped = HIDDEN.replace("metadata: {name: benign, namespace: team-a}",
                            "metadata: {name: benign, namespace: team-a, ownerReferences: "
                            "[{apiVersion: v1, kind: Pod, name: evil, uid: u2}]}")
    _, report = _audit(tmp_path, capsys, looped)
    assert sorted(w["name"] for w in report["workloads"]) == ["benign", "evil"]
    assert sorted(f["evaluated"]["name"] for f in report["findings"]
                  if f["policy"] == "no-privileged-gpu") == ["evil"]
    # benign's reference is no controller's (no controller: true): neither is followed
    assert any(w.startswith("1 object(s) name as their controller a kind that does not create "
                            "them (Pod team-a/evil → Pod benign)") for w in report["warnings"])


EVIL_TEMPLATE = """\
    metadata: {labels: {app: x}}
    spec:
      containers:
      - name: c
        image: cuda
        securityContext: {privileged: true}
        resources: {limits: {nvidia.com/gpu: 4}}
"""

BENIGN_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: benign, namespace: team-a}
spec:
  nodeName: n1
  containers: [{name: c, image: cuda}]
status: {phase: Running}
"""


def _privileged_pod(name: str, owner: str, labels: str = "{}") -> str:
    """A privileged 4-GPU pod of team-a naming ``owner`` (a YAML flow map) in ownerReferences."""
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: team-a
  labels: {labels}
  ownerReferences: [{owner}]
spec:
  nodeName: n1
  containers:
  - {{name: c, image: cuda, securityContext: {{privileged: true}},
     resources: {{limits: {{nvidia.com/gpu: 4}}}}}}
status: {{phase: Running}}
"""


def _privileged(report: dict) -> set[tuple[str, str]]:
    return {(f["workload"]["kind"], f["workload"]["name"]) for f in report["findings"]
            if f["policy"] == "no-privileged-gpu"}


def _gpus(report: dict) -> dict[str, float]:
    return {w["name"]: w["gpu_equivalents"]["allocated"] + w["gpu_equivalents"]["pending"]
            for w in report["workloads"]}


def test_a_statefulset_naming_a_pod_as_its_controller_is_its_own_workload(tmp_path, capsys):
    text = BENIGN_POD + """\
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: evil
  namespace: team-a
  ownerReferences: [{apiVersion: v1, kind: Pod, name: benign, uid: u1, controller: true}]
spec:
  replicas: 1
  template:
""" + EVIL_TEMPLATE + """\
---
""" + _privileged_pod("evil-0", "{apiVersion: apps/v1, kind: StatefulSet, name: evil, uid: u2, "
                                "controller: true}")
    code, report = _audit(tmp_path, capsys, text)
    assert ("StatefulSet", "evil") in _privileged(report) and code == 1
    assert _gpus(report)["evil"] == 4.0
    assert any("(StatefulSet team-a/evil → Pod benign)" in w for w in report["warnings"])


def test_a_deployment_naming_a_job_as_its_controller_is_its_own_workload(tmp_path, capsys):
    text = """\
apiVersion: batch/v1
kind: Job
metadata: {name: benign, namespace: team-a}
spec:
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: cuda}]}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: evil
  namespace: team-a
  ownerReferences: [{apiVersion: batch/v1, kind: Job, name: benign, uid: u1, controller: true}]
spec:
  replicas: 1
  selector: {matchLabels: {app: x}}
  template:
""" + EVIL_TEMPLATE
    code, report = _audit(tmp_path, capsys, text)
    assert ("Deployment", "evil") in _privileged(report) and code == 1
    assert any("(Deployment team-a/evil → Job benign)" in w for w in report["warnings"])


@pytest.mark.parametrize("controller", [False, True])
def test_a_pod_claiming_a_replicaset_is_counted_and_judged_by_its_own_spec(
        tmp_path, capsys, controller):
    """Only ``controller: true`` is a controller; and a pod that claims one (and its
    pod-template-hash) still has its own GPUs counted, not the first replica's."""
    text = """\
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs, namespace: team-a}
spec:
  replicas: 1
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x, pod-template-hash: h1}}
    spec: {containers: [{name: c, image: cuda}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: rs-real
  namespace: team-a
  labels: {app: x, pod-template-hash: h1}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: rs, uid: u1, controller: true}]
spec:
  nodeName: n1
  containers: [{name: c, image: cuda}]
status: {phase: Running}
---
""" + _privileged_pod("evil", "{apiVersion: apps/v1, kind: ReplicaSet, name: rs, uid: u1, "
                              f"controller: {'true' if controller else 'false'}}}",
                      labels="{app: x, pod-template-hash: h1}")
    _, report = _audit(tmp_path, capsys, text)
    assert sum(_gpus(report).values()) == 4.0  # the pods' own: evil's 4, the replica's none
    if not controller:  # no controller: its own workload, judged by its own spec
        assert ("Pod", "evil") in _privileged(report)
        assert _gpus(report)["evil"] == 4.0
    else:  # a replica of rs as far as the audit can tell: its GPUs are rs's
        assert _gpus(report)["rs"] == 4.0


def _replica(name: str, *, privileged: bool = False, gpus: int = 0, ordinal: int = 0,
             owner: str = "ReplicaSet", image: str = "cuda") -> dict:
    """A pod as a controller stamps it: its own name, node, ordinal label, token volume and
    StatefulSet claim, the rest from the template."""
    container = {"name": "c", "image": image,
                 "volumeMounts": [{"name": f"kube-api-access-{ordinal:05d}", "mountPath": "/t"},
                                  {"name": "data", "mountPath": "/data"}]}
    if privileged:
        container["securityContext"] = {"privileged": True}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a",
                     "labels": {"app": "x", "statefulset.kubernetes.io/pod-name": name,
                                "apps.kubernetes.io/pod-index": str(ordinal)},
                     "annotations": {"cni.projectcalico.org/podIP": f"10.0.0.{ordinal}/32",
                                     "team": "a"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner, "name": "gone",
                                          "uid": "u1", "controller": True}]},
        "spec": {"nodeName": f"n{ordinal}", "hostname": name, "containers": [container],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                     "nodeSelectorTerms": [{"matchFields": [{
                         "key": "metadata.name", "operator": "In", "values": [f"n{ordinal}"]}]}]}}},
                 "volumes": [{"name": f"kube-api-access-{ordinal:05d}", "projected": {}},
                             {"name": "data", "persistentVolumeClaim": {
                                 "claimName": f"data-{name}"}}]},
        "status": {"phase": "Running"},
    }


def _audit_pods(tmp_path, capsys, pods: list[dict]) -> dict:
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    return _audit(tmp_path, capsys, text)[1]


def test_a_pod_claiming_a_missing_controller_is_judged_by_its_own_spec(tmp_path, capsys):
    """Pods whose controller is not in the input were judged by the first one read: a
    privileged pod claiming the same missing ReplicaSet as a harmless one got no finding."""
    report = _audit_pods(tmp_path, capsys, [_replica("gone-a", gpus=1),
                                            _replica("gone-b", privileged=True, gpus=4)])
    found = {(f["workload"]["kind"], f["workload"]["name"], f["evaluated"]["name"])
             for f in report["findings"] if f["policy"] == "no-privileged-gpu"}
    assert found == {("ReplicaSet", "gone", "gone-b")}
    assert _gpus(report) == {"gone": 5.0}


def test_replicas_differing_only_where_a_controller_stamps_them_are_one_variant(
        tmp_path, capsys):
    pods = [_replica(f"gone-{i}", privileged=True, gpus=1, ordinal=i, owner="StatefulSet")
            for i in range(5)]
    report = _audit_pods(tmp_path, capsys, pods)
    privileged = [f for f in report["findings"] if f["policy"] == "no-privileged-gpu"]
    assert [f["evaluated"]["name"] for f in privileged] == ["gone-0"]  # evaluated once


def test_variants_past_the_cap_are_named_in_a_warning(tmp_path, capsys):
    from audit.scan.compliance import VARIANTS_PER_WORKLOAD

    pods = [_replica(f"gone-{i}", image=f"cuda:{i}") for i in range(VARIANTS_PER_WORKLOAD + 2)]
    report = _audit_pods(tmp_path, capsys, pods)
    assert any(w.startswith("1 workload(s) not in the input have pods that were not evaluated "
                            "(ReplicaSet/team-a/gone (2)): each variant of a workload whose "
                            "controllers are missing is judged by its own spec, up to "
                            f"{VARIANTS_PER_WORKLOAD} a workload")
               for w in report["warnings"]), report["warnings"]


def test_pod_variants_are_judged_in_worker_processes_too(tmp_path, capsys):
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        _replica("gone-a", gpus=1), _replica("gone-b", privileged=True, gpus=4)]}))
    capsys.readouterr()
    main(["audit", "-f", str(path), "-o", "json", "--jobs", "2"])
    report = json.loads(capsys.readouterr().out)
    assert {f["evaluated"]["name"] for f in report["findings"]
            if f["policy"] == "no-privileged-gpu"} == {"gone-b"}


def test_pod_variants_held_in_all_are_bounded(tmp_path, capsys, monkeypatch):
    """The variants of pods read before their owner are held to the end: a bound in all keeps
    a pods-only snapshot's memory flat; the pods past it are named, never dropped silently."""
    from audit.scan import compliance

    monkeypatch.setattr(compliance, "PENDING_VARIANTS", 2)
    pods = [_replica(f"gone-{i}", image=f"cuda:{i}") for i in range(5)]
    report = _audit_pods(tmp_path, capsys, pods)
    assert any("(ReplicaSet/team-a/gone (2))" in w for w in report["warnings"])


@pytest.mark.parametrize(("one", "other"), [
    (True, 1), (1, 1.0), (None, float("nan")), ("2026-01-01", datetime.date(2026, 1, 1)),
    ("x", "y"),
], ids=["bool-int", "int-float", "null-nan", "string-date", "strings"])
def test_pod_variants_tell_apart_what_json_readers_would_not(one, other):
    from audit.scan.compliance import pod_variant

    def pod(value):
        replica = _replica("gone-a")
        replica["spec"]["containers"][0]["securityContext"] = {"privileged": value}
        return replica

    assert pod_variant(pod(one)) == pod_variant(pod(one))
    assert pod_variant(pod(one)) != pod_variant(pod(other))


def test_a_replicas_own_name_and_token_are_set_aside_but_other_names_are_not():
    from audit.scan.compliance import pod_variant

    first, second = _replica("gone-0", ordinal=0), _replica("gone-1", ordinal=1)
    assert pod_variant(first) == pod_variant(second)
    second["spec"]["containers"][0]["env"] = [{"name": "PEER", "value": "gone-0"}]
    assert pod_variant(first) != pod_variant(second)


@pytest.mark.parametrize("field", ["capabilities", "node"])
def test_a_value_equal_to_the_pods_own_name_is_its_content(tmp_path, capsys, field):
    """A fresh-context trial: pod `aaa` adding capability `aaa` and pod `all` adding `all` were
    one variant (the pod's name was set aside wherever it appeared), so `all` was not judged."""
    def pod(name: str, value: str) -> dict:
        replica = _replica(name, gpus=1)
        replica["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": [value]}}
        if field == "node":
            replica["spec"]["nodeName"] = value
        return replica

    names = ("aaa", "all") if field == "capabilities" else ("web-a", "web-b")
    report = _audit_pods(tmp_path, capsys, [pod(names[0], "aaa" if field == "capabilities"
                                                else "chown"),
                                            pod(names[1], "all")])
    assert {f["evaluated"]["name"] for f in report["findings"]
            if f["policy"] == "no-privileged-gpu"} == {names[1]}


def test_every_controller_of_a_missing_root_is_judged(tmp_path, capsys):
    """A missing Deployment with a harmless old ReplicaSet and a privileged new one: the first
    read stood for both."""
    def replicaset(name: str, privileged: bool) -> dict:
        container = {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        if privileged:
            container["securityContext"] = {"privileged": True}
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": "team-a", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u",
                     "controller": True}]},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"containers": [container]}}}}

    report = _audit_pods(tmp_path, capsys, [replicaset("web-old", False),
                                            replicaset("web-new", True)])
    assert {(f["workload"]["name"], f["evaluated"]["name"]) for f in report["findings"]
            if f["policy"] == "no-privileged-gpu"} == {("web", "web-new")}


@pytest.mark.parametrize(("references", "problem"), [
    ({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True},
     "metadata.ownerReferences: expected a list of owner references, got a map; audited as its "
     "own workload"),
    (["rs"], "metadata.ownerReferences[0]: expected an owner reference map, got the string 'rs'"),
    ([{"apiVersion": "apps/v1", "kind": 3, "name": "rs", "controller": True}],
     "metadata.ownerReferences[0]: a controller reference needs a kind and a name (strings); "
     "audited as its own workload"),
], ids=["map", "string-entry", "kind-not-a-string"])
def test_unusable_owner_references_are_input_errors(tmp_path, capsys, references, problem):
    """A fresh-context trial: a Pod whose ownerReferences was a map was audited with no word."""
    pod = _replica("gone-a", privileged=True, gpus=1)
    pod["metadata"]["ownerReferences"] = references
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod]}))
    capsys.readouterr()
    code = main(["audit", "-f", str(path), "-o", "json", "--jobs", "0"])
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == [f"{path}: document 0 items[0]: Pod team-a/gone-a: {problem}"]
    assert code == 2 and _privileged(report) == {("Pod", "gone-a")}
