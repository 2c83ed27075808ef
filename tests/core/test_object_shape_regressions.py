"""The crashes and silent drops found by the object-shape fuzzing (tests/core/test_object_shapes.py),
each kept as an explicit case: it failed before its fix."""

from __future__ import annotations

import copy
import datetime
import json
from fractions import Fraction

import pytest

from audit.report.assemble import assemble
from audit.scan.ownership import ObjectKey
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from gpuguard import policy_set
from gpuguard.cli import main
from policies.cel.gpu import gpu_data
from policies.cel.runtime import prepare
from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.facts.review import from_object
from policies.facts.workloads import claim_templates_of, workload_facts
from policies.policy.mutation import diff
from policies.sources import Document
from tests.builders.corpus import DATA, first
from tests.fakes.webhook_harness import Harness, envelope
from tests.webhook.test_webhook_corpus import post

VGPU_VMI = "edge/kubevirt-vmi-vgpu-grid-a100.yaml"
NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def engine():
    return policy_set.load(None, DEFAULT_SETTINGS).engine


def team_namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name,
                                                  "gpuguard.io/team": "a"}}}


def no_internal_errors(verdict) -> None:
    assert not [r for r in verdict.results if r.rule == "internal"
                or "could not be computed" in r.message]


# --- KubeVirt vGPU: a GPU of unknown share, counted and reported, never a crash -------------


def test_vgpu_vmi_has_a_cel_view_with_the_framebuffer_share():
    facts = workload_facts(first(VGPU_VMI))
    view = gpu_data(facts)  # raised TypeError: float(None)
    prepare({"gpu": view})
    assert view["requested"] is True
    assert view["gpus"] == {"nvidia.com/GRID_A100-4C": 1} and view["count"] == 1
    assert view["shared"] is True and view["vendors"] == ["nvidia"]
    # A100-4C is 4 GB of a 40 GB A100 (NVIDIA vGPU user guide): a tenth of one GPU.
    assert view["equivalents"] == pytest.approx(0.1) and view["equivalentsKnown"] is True
    assert view["unknown"] == []
    assert facts.total.gpu_equivalents == Fraction(1, 10)


def test_vgpu_of_an_unknown_board_is_unknown_not_zero_nor_whole():
    vmi = first(VGPU_VMI)
    vmi["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] = "nvidia.com/GRID_V100DX-8Q"
    facts = workload_facts(vmi)
    view = gpu_data(facts)
    prepare({"gpu": view})
    assert view["gpus"] == {"nvidia.com/GRID_V100DX-8Q": 1} and view["count"] == 1
    # No known part, and it says so.
    assert view["equivalents"] == 0.0 and view["equivalentsKnown"] is False
    assert view["unknown"] == ["spec.domain.devices.gpus[0]: vGPU type nvidia.com/GRID_V100DX-8Q: "
                               "board V100DX is not in gpuguard's vGPU table, so its share of a "
                               "GPU is unknown"]
    template = view["templates"][0]
    assert (template["requested"], template["count"], template["equivalentsKnown"]) == \
        (True, 1, False)
    assert facts.total.gpu_equivalents is None  # the JSON's gpu_equivalents: null, not 0


def test_vgpu_between_passthrough_gpus_keeps_every_known_part():
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm"},
          "spec": {"template": {"spec": {"domain": {"devices": {"gpus": [
              {"name": "a", "deviceName": "nvidia.com/GA102GL_A10"},
              {"name": "v", "deviceName": "nvidia.com/GRID_V100DX-8Q"},
              {"name": "b", "deviceName": "nvidia.com/TU104GL_Tesla_T4"}]}}}}}}
    view = gpu_data(workload_facts(vm))
    # Before: the vGPU reset the running sum, so the first A10 was lost (1.0).
    assert view["equivalents"] == 2.0 and view["equivalentsKnown"] is False
    assert view["maxPerPod"] == {"count": 3, "equivalents": 2.0}


def test_vgpu_vmi_is_checked_without_a_traceback(capsys):
    code = main(["check", "-f", str(DATA / VGPU_VMI), "--namespace-labels", "gpuguard.io/team=a",
                 "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    [entry] = out["results"]
    assert entry["kind"] == "VirtualMachineInstance" and entry["allowed"] is True
    assert not [r for r in entry["results"] if r["outcome"] == "error"]


@pytest.mark.asyncio
async def test_vgpu_vmi_is_admitted_by_the_webhook_not_denied_by_its_fallback(aiohttp_client):
    harness = Harness(None, namespaces={"team-a": team_namespace("team-a")})
    try:
        client = await aiohttp_client(harness.app)
        vmi = first(VGPU_VMI)
        body = envelope({"uid": "vmi-1", "operation": "CREATE", "namespace": "team-a",
                         "kind": {"group": "kubevirt.io", "version": "v1",
                                  "kind": "VirtualMachineInstance"},
                         "resource": {"group": "kubevirt.io", "version": "v1",
                                      "resource": "virtualmachineinstances"},
                         "userInfo": {"username": "alice", "groups": ["gpu-users"]},
                         "object": vmi})
        for endpoint in ("validate", "mutate"):
            status, answer = await post(client, endpoint, body)
            assert status == 200
            assert answer["response"]["allowed"] is True, answer["response"]
    finally:
        harness.close()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda vm: vm["spec"].__setitem__("domain", "gpu"),
     "spec.domain: expected a map, got the string 'gpu'"),
    (lambda vm: vm["spec"]["domain"].__setitem__("devices", ["gpu"]),
     "spec.domain.devices: expected a map, got a list"),
    (lambda vm: vm["spec"]["domain"]["devices"].__setitem__("gpus", {"deviceName": "x"}),
     "spec.domain.devices.gpus: expected a list, got a map"),
    (lambda vm: vm["spec"]["domain"]["devices"]["gpus"].__setitem__(0, "nvidia.com/GRID_A100-4C"),
     "spec.domain.devices.gpus[0]: expected a device map, got the string "
     "'nvidia.com/GRID_A100-4C'"),
    (lambda vm: vm["spec"]["domain"]["devices"]["gpus"][0].__setitem__("deviceName", 7),
     "spec.domain.devices.gpus[0].deviceName: expected a resource name, got 7"),
    (lambda vm: vm["metadata"].__setitem__("labels", ["special"]),
     "metadata.labels: expected a map, got a list"),
])
def test_a_malformed_vm_is_reported_naming_the_field(edit, message):
    vm = first(VGPU_VMI)
    edit(vm)
    facts = workload_facts(vm)
    assert message in facts.total.invalid  # before: silently no GPU (or the label ignored)
    gpu_data(facts)


# --- YAML values JSON cannot hold: timestamps, binary, keys that are not strings ------------


def dated_pod() -> dict:
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    pod["metadata"]["annotations"] = {"expires": datetime.date(2026, 12, 31),  # unquoted date
                                      "built": datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                                 tzinfo=datetime.UTC)}
    pod["metadata"]["labels"] = {1: "x"}
    pod["spec"].pop("tolerations", None)
    return pod


def test_a_yaml_date_in_the_object_gives_a_json_patch(engine):
    pod = dated_pod()
    verdict = engine.evaluate(from_object(pod, namespace_object=team_namespace("default"),
                                          now=NOW))  # raised TypeError in jsonpatch
    assert any(op["path"] == "/spec/tolerations" for op in verdict.patch)
    json.dumps(list(verdict.patch))
    no_internal_errors(verdict)


def test_diff_of_yaml_values_writes_them_as_the_api_would():
    original = {"metadata": {"annotations": {"expires": datetime.date(2026, 12, 31)},
                             "labels": {True: "yes"}}, "data": {"raw": b"\x00\xff"}}
    final = copy.deepcopy(original)
    final["metadata"]["annotations"]["expires"] = datetime.date(2027, 1, 1)
    final["data"]["raw"] = b"\x01"
    final["spec"] = {"when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)}
    patch = diff(original, final)
    json.dumps(patch)
    assert {"op": "replace", "path": "/metadata/annotations/expires",
            "value": "2027-01-01"} in patch
    assert {"op": "replace", "path": "/data/raw", "value": "AQ=="} in patch
    assert {"op": "add", "path": "/spec", "value": {"when": "2026-01-02T03:04:05Z"}} in patch
    assert not [op for op in patch if op["path"].startswith("/metadata/labels")]


def test_the_audit_evaluates_an_object_holding_a_yaml_date(engine):
    pod = dated_pod()
    pod["metadata"]["namespace"] = "default"
    report = assemble(scan([Document("pods.yaml", 0, None, pod)], AuditSettings(now=NOW), engine))
    # Before: "cannot be audited: TypeError: Object of type date is not JSON serializable",
    # and the pod had no policy results at all.
    assert report["errors"] == []
    assert report["summary"]["evaluated_workloads"] == 1
    assert any(f["policy"] == "add-gpu-toleration-and-runtimeclass" for f in report["findings"])


# --- the audit of a snapshot mixing namespaced and namespace-less objects --------------------


def test_object_keys_sort_with_and_without_a_namespace():
    keys = [ObjectKey("b", "", "Pod", "x"), ObjectKey(None, "", "Pod", "n"),
            ObjectKey("a", "apps", "Deployment", "d")]
    assert sorted(keys) == [keys[1], keys[2], keys[0]]  # TypeError before


def test_the_audit_of_a_mixed_namespace_snapshot_completes(engine):
    items = [Document(f"{name}.yaml", 0, None, body) for name, body in (
        ("namespaced", first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")),
        ("bare", first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")))]
    assert items[0].body["metadata"].get("namespace") and \
        not items[1].body["metadata"].get("namespace")
    report = assemble(scan(items, AuditSettings(now=NOW), engine))  # TypeError before
    assert report["summary"]["evaluated_workloads"] == 2
    assert [w["namespace"] for w in report["workloads"]] == [None, "default"]


# --- fields of the wrong type: reported naming the field, never a crash or a silent skip ------


def test_a_claim_template_with_a_list_namespace_is_not_a_crash():
    template = first("manifests/dradriver__pod-two-gpus-resourceclaimtemplate.yaml",
                     "ResourceClaimTemplate")
    template["metadata"]["namespace"] = ["gpu-test1"]
    assert claim_templates_of([template]) == {(None, "double-gpu"): ("gpu.nvidia.com", 2)}
    del template["metadata"]["name"]
    assert claim_templates_of([template]) == {}  # before: keyed by the text "None"


POD = "manifests/gpuop__cuda-vector-add-legacy-pod.yaml"
DEPLOYMENT = "manifests/vllm__mistral-7b-nvidia-deployment.yaml"


@pytest.mark.parametrize(("source", "edit", "message"), [
    (POD, lambda p: p["spec"].__setitem__("nodeSelector", []),
     "spec.nodeSelector: expected a map, got a list"),
    (POD, lambda p: p["spec"].__setitem__("affinity", ""),
     "spec.affinity: expected a map, got the string ''"),
    (POD, lambda p: p["metadata"].__setitem__("labels", ["team"]),
     "metadata.labels: expected a map, got a list"),
    (DEPLOYMENT, lambda d: d["spec"]["template"]["metadata"].__setitem__("labels", "q"),
     "spec.template.metadata.labels: expected a map, got the string 'q'"),
    (DEPLOYMENT, lambda d: d["metadata"].__setitem__("annotations", ["a"]),
     "metadata.annotations: expected a map, got a list"),
    (POD, lambda p: p["spec"]["containers"][0].__setitem__("env",
                                                           ["NVIDIA_VISIBLE_DEVICES=all"]),
     "spec.containers[0].env[0]: expected a map, got the string "
     "'NVIDIA_VISIBLE_DEVICES=all'"),
    (POD, lambda p: p["spec"]["containers"][0].__setitem__("volumeMounts", [None]),
     "spec.containers[0].volumeMounts[0]: expected a map, got null"),
    (POD, lambda p: p["spec"].__setitem__("volumes", [{"name": "d", "hostPath": "/dev"}]),
     "spec.volumes[0].hostPath: expected a map, got the string '/dev'"),
    (POD, lambda p: p["spec"].__setitem__("volumes", ["dev"]),
     "spec.volumes[0]: expected a map, got the string 'dev'"),
    (POD, lambda p: p["spec"].__setitem__("resourceClaims", ["gpu"]),
     "spec.resourceClaims[0]: expected a map, got the string 'gpu'"),
    (POD, lambda p: p["spec"]["containers"][0]["resources"].__setitem__("claims", [1]),
     "spec.containers[0].resources.claims[0]: expected a map, got the number 1"),
])
def test_wrong_typed_gpu_fields_are_reported(source, edit, message):
    obj = first(source)
    edit(obj)
    assert message in workload_facts(obj).total.invalid


def test_a_claim_entry_that_is_not_a_map_is_not_counted_as_a_gpu_claim():
    pod = first(POD)
    pod["spec"]["resourceClaims"] = ["gpu"]
    facts = workload_facts(pod).total
    assert facts.dra_claims == ()  # before: a claim named '' with an unknown count
    assert facts.gpus == {"nvidia.com/gpu": 1}

