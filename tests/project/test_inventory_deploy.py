"""deploy/overlays/inventory-daemonset: the DaemonSet runs the command as documented, with the
hardening the docs promise; RBAC is get/patch on nodes only; the admission policy that narrows
the patch allows the agent's own write and nothing else (evaluated with gpuguard's own engine)."""

import copy
import json

import pytest
import yaml

from audit.inventory.summary import ANNOTATION
from gpuguard.cli import build_parser, main
from kube.node_annotations import merge_patch
from tests.builders.corpus import first
from tests.paths import ROOT

OVERLAY = ROOT / "deploy" / "overlays" / "inventory-daemonset"
AGENT = "system:serviceaccount:gpuguard-system:gpuguard-inventory"


def load(name):
    return [d for d in yaml.safe_load_all((OVERLAY / name).read_text()) if d]


def test_kustomization_lists_every_file():
    kustomization = load("kustomization.yaml")[0]
    assert kustomization["namespace"] == "gpuguard-system"
    listed = set(kustomization["resources"])
    present = {p.name for p in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert [i["name"] for i in kustomization["images"]] == ["gpuguard"]


def test_daemonset_runs_the_inventory_command_hardened():
    [ds] = load("daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert pod["serviceAccountName"] == "gpuguard-inventory"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    assert "nvidia.com/gpu" not in container["resources"]["limits"]  # takes no GPU
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # The arguments parse with gpuguard's own parser, as Kubernetes expands $(NODE_NAME).
    argv = [a.replace("$(NODE_NAME)", "gpu-node-01") for a in container["args"]]
    assert container["command"] == ["gpuguard"]
    parser, _ = build_parser()
    parsed = parser.parse_args(argv)
    assert (parsed.command, parsed.annotate_node, parsed.interval) == (
        "inventory", "gpu-node-01", 300.0)


def test_rbac_is_get_and_patch_on_nodes_only():
    role, binding = load("rbac.yaml")
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                              "verbs": ["get", "patch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-inventory",
                                    "namespace": "gpuguard-system"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_namespace_enforces_restricted_pod_security():
    [namespace] = load("namespace.yaml")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_gpuguard_library_allows_its_own_inventory_daemonset(capsys):
    # The agent reads every GPU (NVIDIA_VISIBLE_DEVICES=all, no request): the library's
    # no-unrequested-gpu-access exempts gpuguard-system for it, and flags it anywhere else.
    path = str(OVERLAY / "daemonset.yaml")
    assert main(["check", "-f", path, "--namespace", "gpuguard-system", "-o", "json"]) == 0
    [result] = json.loads(capsys.readouterr().out)["results"]
    assert [r["policy"] for r in result["results"] if r["outcome"] in ("fail", "error")] == []


def review(new, old, user=AGENT, node_name="gpu-node-h100-01"):
    extra = {"authentication.kubernetes.io/node-name": [node_name]} if node_name else {}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": new["metadata"]["name"], "operation": "UPDATE",
        "userInfo": {"username": user, "extra": extra}, "object": new, "oldObject": old}}


def patched(node, annotations):
    """``node`` after the agent's JSON merge patch (RFC 7386 on metadata.annotations)."""
    new = copy.deepcopy(node)
    target = new["metadata"].setdefault("annotations", {})
    for key, value in merge_patch(annotations)["metadata"]["annotations"].items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return new


def allowed(tmp_path, capsys, admission_review):
    path = tmp_path / "review.json"
    path.write_text(json.dumps(admission_review))
    main(["check", "-f", str(path), "--policies", str(OVERLAY / "restrict-node-patch.yaml"),
          "-o", "json"])
    [result] = json.loads(capsys.readouterr().out)["results"]
    return result["allowed"], result["message"]


@pytest.fixture
def node():
    found = first("nodes/issue-ndp-1501__h100-80gb-hbm3-x8-no-mig.yaml", "Node")
    found["spec"] = {"providerID": "example://gpu-node-h100-01"}
    found["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
    return found


def test_policy_allows_the_agents_annotation_on_its_own_node(tmp_path, capsys, node):
    new = patched(node, {ANNOTATION: '{"kind":"GPUInventorySummary"}'})
    assert allowed(tmp_path, capsys, review(new, node)) == (True, "")
    again = patched(new, {ANNOTATION: '{"kind":"GPUInventorySummary","v":2}'})
    assert allowed(tmp_path, capsys, review(again, new))[0] is True


@pytest.mark.parametrize(("edit", "message"), [
    (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.present": "false"}),
     "may not change a Node's spec, labels or finalizers"),
    (lambda n: n["spec"].update(taints=[{"key": "x", "effect": "NoSchedule"}]),
     "may not change a Node's spec, labels or finalizers"),
    (lambda n: n["metadata"]["annotations"].update({"other": "x"}),
     "may change only the gpuguard.io/inventory annotation"),
    (lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl"),
     "may change only the gpuguard.io/inventory annotation"),
])
def test_policy_denies_anything_else(tmp_path, capsys, node, edit, message):
    new = patched(node, {ANNOTATION: "{}"})
    edit(new)
    ok, text = allowed(tmp_path, capsys, review(new, node))
    assert not ok and message in text


def test_policy_denies_another_nodes_annotation(tmp_path, capsys, node):
    new = patched(node, {ANNOTATION: "{}"})
    ok, text = allowed(tmp_path, capsys, review(new, node, node_name="gpu-node-other"))
    assert not ok and "only the Node its pod runs on" in text
    ok, _ = allowed(tmp_path, capsys, review(new, node, node_name=None))
    assert not ok


def test_policy_leaves_other_users_alone(tmp_path, capsys, node):
    new = copy.deepcopy(node)
    new["metadata"]["labels"]["x"] = "y"
    assert allowed(tmp_path, capsys, review(new, node, user="kubernetes-admin"))[0] is True
