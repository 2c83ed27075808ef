"""The webhooks' matchConditions (policies/facts/prefilter.py, deploy/base/match-conditions.yaml).

What an outage of gpuguard can block is decided by these conditions, so they are checked for what
a user cares about, evaluated with gpuguard's own CEL runtime (policies/cel/runtime.py, the C++ CEL
runtime kube-apiserver's cel-go agrees with on these expressions):

- the shipped file is what ``gpuguard match-conditions`` writes (regenerate and compare);
- resource names: the CEL test equals :func:`policies.facts.resource_names.classify` ``is not OTHER``;
- every GPU object of the corpus (tests/data, tests/data/wild and examples/, copies of
  ../shared/corpus) is sent, and the CPU ones are not; the only objects sent that the GPU facts
  do not count are listed with the reason;
- each GPU signal (resource, DRA, device env var, device hostPath, privileged / SYS_ADMIN, KAI and
  HAMi annotations) in each container type and at each pod-template location that
  policies.facts.workloads finds, for every workload kind the webhook rules match;
- a property test: whenever the GPU facts see anything in a generated pod, the pod is sent;
- DELETE (``object`` null), UPDATE of an object being deleted, and ``pods/ephemeralcontainers``.

Objects are evaluated as the API server presents them: without null-valued fields (typed kinds
drop them in decoding, structural CRD schemas prune them).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.cli import main
from policies.cel.runtime import CompiledExpression, default_environment
from policies.facts import prefilter
from policies.facts.gpu import GPUFacts, pod_facts
from policies.facts.resource_names import GPUSettings, ResourceKind, classify, name_patterns
from policies.facts.workloads import (
    POD_SPEC,
    RESOURCES,
    TEMPLATE,
    find_workload,
    workload_facts,
)
from policies.sources import read_documents
from tests.paths import ROOT

WEBHOOKS_FILE = "deploy/base/webhooks.yaml"
GENERATED_FILE = "deploy/base/match-conditions.yaml"
ENV = default_environment()
KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def _rules() -> dict[str, list[tuple[str, str]]]:
    """Webhook name -> (apiGroup, resource) of its rules, from the shipped webhooks.yaml."""
    found: dict[str, list[tuple[str, str]]] = {}
    with (ROOT / WEBHOOKS_FILE).open(encoding="utf-8") as handle:
        for doc in yaml.safe_load_all(handle):
            if doc and doc.get("kind") in KINDS:
                for hook in doc["webhooks"]:
                    found[hook["name"]] = [(g, r) for rule in hook["rules"]
                                           for g in rule["apiGroups"] for r in rule["resources"]]
    return found


RULES = _rules()


class Webhook:
    """One webhook's generated matchConditions, compiled, and the decision the API server takes
    from them: call gpuguard only when every condition is true."""

    def __init__(self, name: str, gpu_settings: GPUSettings | None = None) -> None:
        self.name = name
        self.resources = RULES[name]
        conditions = prefilter.match_conditions(self.resources, gpu_settings or GPUSettings())
        self.compiled: list[CompiledExpression] = [
            ENV.compile(c.expression, field_path=f"{name}.matchConditions[{c.name}]")
            for c in conditions]

    def results(self, obj: Any, *, operation: str = "CREATE", old: Any = None,
                sub_resource: str = "") -> list[Any]:
        """Each condition's value (an evaluation error raises: none is expected)."""
        data = {"object": obj, "oldObject": old,
                "request": {"operation": operation, "subResource": sub_resource,
                            "userInfo": {"username": "alice"}}}
        return [c.evaluate(data) for c in self.compiled]

    def calls(self, obj: Any, **kwargs: Any) -> bool:
        results = self.results(obj, **kwargs)
        assert all(isinstance(r, bool) for r in results), results
        return all(results)


PODS = Webhook("pods.validate.gpuguard.io")
WORKLOADS = Webhook("workloads.validate.gpuguard.io")
MUTATE = Webhook("mutate.gpuguard.io")


def _group_resource(obj: dict[str, Any]) -> tuple[str, str]:
    api = str(obj.get("apiVersion", ""))
    group = api.split("/", maxsplit=1)[0] if "/" in api else ""
    return group, f"{str(obj.get('kind', '')).lower()}s"


def _hooks_for(obj: dict[str, Any]) -> list[Webhook]:
    key = _group_resource(obj)
    return [h for h in (PODS, WORKLOADS, MUTATE) if key in h.resources]


def _without_nulls(value: Any) -> Any:
    """``value`` as the API server presents it: null-valued fields dropped."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def seen_by_facts(facts: GPUFacts) -> bool:
    """Whether the GPU facts count anything GPU about a pod: a request of any kind, a rejected
    or unrecognised GPU resource, certain GPU access without a request (an envFrom without a
    prefix is uncertain: not sent, see policies.facts.prefilter), a privileged container."""
    return bool(facts.requested or facts.effective_requests or facts.sources
                or facts.resource_problems or facts.unrecognized
                or any(a.certain for a in facts.unrequested_access)
                or facts.privileged or facts.kai or facts.dra_claims)


# --- the shipped file ------------------------------------------------------------------------

def test_shipped_match_conditions_are_what_the_generator_writes(monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    code = main(["match-conditions", WEBHOOKS_FILE, "-o", GENERATED_FILE, "--check"])
    assert code == 0, capsys.readouterr().err
    shipped = [d for d in yaml.safe_load_all((ROOT / GENERATED_FILE).read_text()) if d]
    expected = {name: [c.to_dict() for c in prefilter.match_conditions(resources)]
                for name, resources in RULES.items()}
    got = {hook["name"]: hook["matchConditions"] for doc in shipped for hook in doc["webhooks"]}
    assert got == expected


def test_check_reports_a_stale_file_and_rewrites_it(tmp_path, capsys) -> None:
    target = tmp_path / "conditions.yaml"
    argv = ["match-conditions", str(ROOT / WEBHOOKS_FILE), "-o", str(target)]
    assert main(argv) == 0
    assert main([*argv, "--check"]) == 0
    target.write_text(target.read_text().replace("nvidia.com/mig-", "nvidia.com/mug-"))
    assert main([*argv, "--check"]) == 1
    assert "is out of date: run `gpuguard match-conditions" in capsys.readouterr().err
    assert main(argv) == 0 and main([*argv, "--check"]) == 0


def test_extra_gpu_resources_of_serve_reach_the_conditions(tmp_path) -> None:
    # A cluster that counts vendor.example/u250 as a GPU (serve --gpu-resource) must send those
    # pods too; the default conditions do not know the name (no accelerator word in it).
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "f"},
           "spec": {"containers": [{"name": "a", "resources": {"limits": {
               "vendor.example/u250": "1"}}}]}}
    assert not PODS.calls(pod)
    assert Webhook(PODS.name, GPUSettings(extra_whole_resources=("vendor.example/u250",))).calls(pod)
    target = tmp_path / "conditions.yaml"
    assert main(["match-conditions", "--gpu-resource", "vendor.example/u250",
                 str(ROOT / WEBHOOKS_FILE), "-o", str(target)]) == 0
    text = target.read_text()
    assert "'vendor.example/u250'" in text
    assert "gpuguard match-conditions --gpu-resource vendor.example/u250 " in text


@pytest.mark.parametrize(("rules", "message"), [
    ([{"apiGroups": ["*"], "apiVersions": ["v1"], "operations": ["CREATE"],
       "resources": ["pods"]}],
     "webhooks[0] (w.example.com).rules[0]: */pods: a wildcard matches kinds whose pod "
     "templates gpuguard cannot know"),
    ([{"apiGroups": ["example.com"], "apiVersions": ["v1"], "operations": ["CREATE"],
       "resources": ["widgets"]}],
     "webhooks[0] (w.example.com): no pod-template locations known for example.com/widgets"),
    ("pods", "webhooks[0] (w.example.com).rules: expected a non-empty list of rules"),
])
def test_rules_it_cannot_serve_are_refused_with_the_place(tmp_path, capsys, rules,
                                                          message) -> None:
    source = tmp_path / "hooks.yaml"
    source.write_text(yaml.safe_dump({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "mine"}, "webhooks": [{"name": "w.example.com", "rules": rules}]}))
    assert main(["match-conditions", str(source)]) == 2
    err = capsys.readouterr().err
    assert f"{source}: ValidatingWebhookConfiguration mine: {message}" in err


def test_input_without_webhook_configurations_is_an_error(tmp_path, capsys) -> None:
    source = tmp_path / "empty.yaml"
    source.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert main(["match-conditions", str(source)]) == 2
    assert "no ValidatingWebhookConfiguration or MutatingWebhookConfiguration" in \
        capsys.readouterr().err
    assert main(["match-conditions", str(source), "--check"]) == 2
    assert "--check needs --output FILE" in capsys.readouterr().err


def test_every_rule_resource_has_template_locations() -> None:
    for name, resources in RULES.items():
        for key in resources:
            assert key in prefilter.TEMPLATE_LOCATIONS or key in prefilter.CLAIM_LOCATIONS, \
                (name, key)
    assert len(prefilter.match_conditions(RULES["mutate.gpuguard.io"])) <= 64


# --- resource names --------------------------------------------------------------------------

def _corpus_resource_names() -> set[str]:
    names: set[str] = set()
    documents, _ = read_documents([str(ROOT / "tests" / "data"), str(ROOT / "examples")])

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key in ("limits", "requests", "capacity", "allocatable"):
                if isinstance(value.get(key), dict):
                    names.update(k for k in value[key] if isinstance(k, str))
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)
    for document in documents:
        walk(document.body)
    return names


def _name_variants() -> set[str]:
    patterns = name_patterns()
    names = set(patterns.names) | _corpus_resource_names()
    names |= {n.upper() for n in names} | {n.replace("/", "//") for n in names}
    names |= {f"{p}1g.10gb" for p in patterns.prefixes} | {"nvidia.com/mig-", "nvidia.com/mig"}
    names |= {"cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "example.com/widget",
              "gpu.example.com/widget", "example.com/GPU-x", "vendor.example/my-accelerator",
              "vendor.example/accel", "npu.intel.com/accel", "gpu", "a/b/gpu", "/gpu",
              "example.com/x\ngpu", "devices.kubevirt.io/kvm", "nvidia.com/gpu.product"}
    return names


def test_resource_name_test_is_the_registry() -> None:
    compiled = ENV.compile(f"[object.name].exists(r, {prefilter.gpu_resource_test('r')})",
                           field_path="t")
    names = _name_variants()
    assert len(names) > 100
    wrong = {n for n in names
             if compiled.evaluate({"object": {"name": n}})
             != (classify(n) is not ResourceKind.OTHER)}
    assert not wrong


# --- the corpus ------------------------------------------------------------------------------

# Sent although the GPU facts count nothing, and why that is right.
SENT_BEYOND_THE_FACTS = {
    # NVIDIA_VISIBLE_DEVICES " void" and "VOID": no devices to the facts; the conditions look at
    # names, not values (tests/data/access/envfrom.yaml).
    ("Pod", "env-space"),
}
# Counted by the facts (to say what the author meant) but never sent, and why that is right.
COUNTED_NOT_SENT = {
    # workerGroupSpecs written as a map: the CRD's structural schema (an array) rejects it before
    # any admission webhook runs; the facts count the one group it describes and call it invalid.
    ("RayCluster", "raycluster-tpu-v4-multihost"),
    # A claim for a DeviceClass whose name does not tell its kind (its selectors pick GPUs): the
    # class is cluster-scoped and never in the request, so the condition cannot know it; the
    # facts count it as of unknown size. Claims are judged for their MIG slices
    # (mig-profile-allowed), which a MIG class name or the request's own selectors show; the
    # pods using this one are still judged (quota: its size is unknown).
    ("ResourceClaimTemplate", "a100"),
}
# CPU objects of the corpus that must never reach gpuguard (at least these).
CPU_OBJECTS = {("Pod", "ollama-cpu-0"), ("StatefulSet", "ollama-cpu"),
               ("Pod", "tensorflow-benchmark-gpu-ps-0"), ("Job", "tensorflow-benchmarks-launcher"),
               ("Pod", "raycluster-half-gpu-head-dn8sk")}


def _corpus() -> Iterator[tuple[str, dict[str, Any]]]:
    documents, _ = read_documents([str(ROOT / "tests" / "data"), str(ROOT / "examples")])
    for document in documents:
        if _hooks_for(document.body) and workload_facts(document.body) is not None:
            yield f"{document.source}#{document.index}", document.body


def test_corpus_gpu_objects_are_sent_and_cpu_objects_are_not() -> None:
    sent: set[tuple[str, str]] = set()
    skipped: set[tuple[str, str]] = set()
    missed, beyond = [], []
    for where, obj in _corpus():
        facts = workload_facts(obj)
        assert facts is not None
        counted = seen_by_facts(facts.total) or any(seen_by_facts(f) for f in facts.per_template)
        key = (str(obj.get("kind")), str((obj.get("metadata") or {}).get("name")))
        clean = _without_nulls(obj)
        for hook in _hooks_for(obj):
            called = hook.calls(clean)
            # The same answer for UPDATE (object and oldObject) and DELETE (object null).
            assert hook.calls(clean, operation="UPDATE", old=clean) == called, where
            assert hook.calls(None, operation="DELETE", old=clean) == called, where
            (sent if called else skipped).add(key)
            if counted and not called and key not in COUNTED_NOT_SENT:
                missed.append(f"{where} {key} via {hook.name}")
            if called and not counted and key not in SENT_BEYOND_THE_FACTS:
                beyond.append(f"{where} {key} via {hook.name}")
    assert not missed, "GPU objects the API server would not send to gpuguard:\n" + \
        "\n".join(missed)
    assert not beyond, "sent although nothing in them touches a GPU:\n" + "\n".join(beyond)
    assert skipped >= CPU_OBJECTS and not CPU_OBJECTS & sent
    assert len(sent) >= 100  # the corpus is mostly GPU workloads of every kind


def test_gpuguards_own_pods_are_not_sent() -> None:
    for name in ("deployment.yaml", "audit-cronjob.yaml"):
        for obj in yaml.safe_load_all((ROOT / "deploy" / "base" / name).read_text()):
            if obj and _hooks_for(obj):
                for hook in _hooks_for(obj):
                    assert not hook.calls(obj), (name, hook.name)


# The trial's pods that reach GPUs without asking (tests/data/access): sent, the others not.
ACCESS_SENT = {
    "cap-all.yaml": {"cap-all", "cap-all-nogpu"},
    "hostpaths.yaml": {"hp0", "hp1", "hp2", "hp3", "hp4", "hp5", "hp6", "hp7", "hp11"},
    "hostpath-dotdev.yaml": {"hp"},
    # "envfrom" (no prefix) is not sent: the library does not deny it by default
    "envfrom.yaml": {"envfrom-prefix", "env-valuefrom", "env-dup", "env-dup2", "env-space"},
}


@pytest.mark.parametrize("name", sorted(ACCESS_SENT))
def test_access_without_a_request_is_sent(name: str) -> None:
    documents, errors = read_documents([str(ROOT / "tests" / "data" / "access" / name)])
    assert not errors
    sent = set()
    for document in documents:
        pod = document.body
        pod_name = pod["metadata"]["name"]
        called = PODS.calls(pod)
        assert MUTATE.calls(pod) == called
        if called:
            sent.add(pod_name)
        if seen_by_facts(pod_facts(pod["spec"], pod["metadata"])):
            assert called, pod_name
        # the same pod as a Deployment's template reaches the workloads webhook alike
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": pod_name, "namespace": "team-a"},
                      "spec": {"template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}
        assert WORKLOADS.calls(deployment) == called, pod_name
    assert sent == ACCESS_SENT[name]


# --- each signal, each container type, each template location --------------------------------

CPU_CONTAINER = {"name": "app", "image": "registry.example.com/app:1",
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                 "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
                 "securityContext": {"privileged": False, "capabilities": {"add": ["NET_ADMIN"]}},
                 "volumeMounts": [{"name": "logs", "mountPath": "/logs"}]}


def cpu_template() -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}, "annotations": {"example.com/note": "cpu"}},
            "spec": {"containers": [copy.deepcopy(CPU_CONTAINER)],
                     "volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}},
                                 {"name": "devices", "hostPath": {"path": "/devices"}}],
                     "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}


def _in_container(ctype: str, change: Any) -> Any:
    def apply(template: dict[str, Any]) -> None:
        container = {"name": f"{ctype}-x", "image": "registry.example.com/x:1"}
        change(container, template)
        template["spec"].setdefault(ctype, []).append(container)
    return apply


def _limits(name: str, value: Any = "1", side: str = "limits") -> Any:
    return lambda c, _: c.setdefault("resources", {}).setdefault(side, {}).update({name: value})


def _env(name: str, **value: Any) -> Any:
    return lambda c, _: c.setdefault("env", []).append({"name": name, **value})


def _host_path(path: str) -> Any:
    def change(container: dict[str, Any], template: dict[str, Any]) -> None:
        template["spec"]["volumes"].append({"name": "dev", "hostPath": {"path": path}})
        container.setdefault("volumeMounts", []).append({"name": "dev", "mountPath": "/dev-x"})
    return change


def _security(**context: Any) -> Any:
    return lambda c, _: c.update({"securityContext": context})


def _env_from(**source: Any) -> Any:
    return lambda c, _: c.setdefault("envFrom", []).append(source)


CONTAINER_SIGNALS = {
    "whole GPU": _limits("nvidia.com/gpu"),
    "GPU in requests only": _limits("nvidia.com/gpu", side="requests"),
    "zero GPUs": _limits("nvidia.com/gpu", "0", side="requests"),
    "MIG": _limits("nvidia.com/mig-1g.10gb"),
    "HAMi memory": _limits("nvidia.com/gpumem", 3000),
    "Volcano vGPU": _limits("volcano.sh/vgpu-number", 1),
    "AMD": _limits("amd.com/gpu"),
    "Intel i915": _limits("gpu.intel.com/i915"),
    "Neuron cores": _limits("aws.amazon.com/neuroncore", 2),
    "TPU": _limits("google.com/tpu", 4),
    "vendor-neutral": _limits("gpu-vendor.example/example-gpu"),
    "KEP-5004 device class": _limits("deviceclass.resource.kubernetes.io/gpu.example.com"),
    "obsolete name": _limits("alpha.kubernetes.io/nvidia-gpu"),
    "NVIDIA_VISIBLE_DEVICES=all": _env("NVIDIA_VISIBLE_DEVICES", value="all"),
    "NVIDIA_VISIBLE_DEVICES from a ConfigMap": _env(
        "NVIDIA_VISIBLE_DEVICES", valueFrom={"configMapKeyRef": {"name": "c", "key": "k"}}),
    "NVIDIA_MIG_MONITOR_DEVICES": _env("NVIDIA_MIG_MONITOR_DEVICES", value="all"),
    "HABANA_VISIBLE_DEVICES": _env("HABANA_VISIBLE_DEVICES", value="0"),
    "envFrom a Secret, prefix NVIDIA_": _env_from(prefix="NVIDIA_", secretRef={"name": "s"}),
    "hostPath /dev": _host_path("/dev"),
    "hostPath /dev/nvidia0": _host_path("/dev/nvidia0"),
    "hostPath //dev//nvidiactl": _host_path("//dev//nvidiactl"),
    "hostPath /dev/dri/": _host_path("/dev/dri/"),
    "hostPath /dev/kfd": _host_path("/dev/kfd"),
    "hostPath /": _host_path("/"),
    "hostPath /./dev": _host_path("/./dev"),
    "hostPath /dev/./nvidia0": _host_path("/dev/./nvidia0"),
    "hostPath /var/../dev": _host_path("/var/../dev"),
    "privileged": _security(privileged=True),
    "SYS_ADMIN": _security(capabilities={"add": ["SYS_ADMIN"]}),
    "cap_sys_admin": _security(capabilities={"add": ["NET_RAW", "cap_sys_admin"]}),
    "ALL": _security(capabilities={"add": ["ALL"]}),
    "CAP_all": _security(capabilities={"add": ["CAP_all"]}),
}


def _annotation(key: str, value: str) -> Any:
    return lambda t: t["metadata"]["annotations"].update({key: value})


POD_SIGNALS = {
    **{f"{name} ({ctype})": _in_container(ctype, change)
       for name, change in CONTAINER_SIGNALS.items()
       for ctype in ("containers", "initContainers", "ephemeralContainers")},
    "DRA claim": lambda t: t["spec"].update({"resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]}),
    "KAI gpu-fraction": _annotation("gpu-fraction", "0.5"),
    "KAI gpu-memory": _annotation("gpu-memory", "2000"),
    "HAMi use-gputype": _annotation("nvidia.com/use-gputype", "A100"),
}


def _pod(template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": "p", "namespace": "team-a"},
            "spec": template["spec"]}


def test_a_cpu_pod_is_not_sent() -> None:
    pod = _pod(cpu_template())
    assert not seen_by_facts(pod_facts(pod["spec"], pod["metadata"]))
    assert not PODS.calls(pod) and not MUTATE.calls(pod)


@pytest.mark.parametrize("signal", sorted(POD_SIGNALS))
def test_each_gpu_signal_of_a_pod_is_sent(signal: str) -> None:
    template = cpu_template()
    POD_SIGNALS[signal](template)
    pod = _pod(template)
    assert PODS.calls(pod) and MUTATE.calls(pod)
    # kubectl debug adds ephemeral containers through the subresource.
    assert PODS.calls(pod, operation="UPDATE", old=pod, sub_resource="ephemeralcontainers")


def _skeletons() -> dict[tuple[str, str], dict[str, Any]]:
    """One object per workload resource of the webhook rules, every pod template a CPU one, in
    the shape each project's API reference gives (policies.facts.workloads reads the same fields)."""
    t = cpu_template
    cpu = CPU_CONTAINER["resources"]
    ray = {"headGroupSpec": {"template": t()},
           "workerGroupSpecs": [{"groupName": "a", "replicas": 1, "template": t()},
                                {"groupName": "b", "replicas": 2, "template": t()}]}

    def kubeflow(kind: str, key: str) -> dict[str, Any]:
        return {"apiVersion": "kubeflow.org/v1", "kind": kind,
                "spec": {key: {"Master": {"replicas": 1, "template": t()},
                               "Worker": {"replicas": 2, "template": t()}}}}
    objects = {
        ("apps", "deployments"): {"apiVersion": "apps/v1", "kind": "Deployment",
                                  "spec": {"replicas": 2, "template": t()}},
        ("apps", "replicasets"): {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                  "spec": {"template": t()}},
        ("apps", "statefulsets"): {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                   "spec": {"template": t()}},
        ("apps", "daemonsets"): {"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "spec": {"template": t()}},
        ("batch", "jobs"): {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": t()}},
        ("", "replicationcontrollers"): {"apiVersion": "v1", "kind": "ReplicationController",
                                         "spec": {"replicas": 2, "template": t()}},
        ("batch", "cronjobs"): {"apiVersion": "batch/v1", "kind": "CronJob", "spec": {
            "schedule": "* * * * *", "jobTemplate": {"spec": {"template": t()}}}},
        ("kubeflow.org", "pytorchjobs"): kubeflow("PyTorchJob", "pytorchReplicaSpecs"),
        ("kubeflow.org", "tfjobs"): kubeflow("TFJob", "tfReplicaSpecs"),
        ("kubeflow.org", "xgboostjobs"): kubeflow("XGBoostJob", "xgbReplicaSpecs"),
        ("kubeflow.org", "paddlejobs"): kubeflow("PaddleJob", "paddleReplicaSpecs"),
        ("kubeflow.org", "jaxjobs"): kubeflow("JAXJob", "jaxReplicaSpecs"),
        ("kubeflow.org", "mxjobs"): kubeflow("MXJob", "mxReplicaSpecs"),
        ("kubeflow.org", "mpijobs"): {**kubeflow("MPIJob", "mpiReplicaSpecs"),
                                      "apiVersion": "kubeflow.org/v2beta1"},
        ("ray.io", "rayclusters"): {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                    "spec": copy.deepcopy(ray)},
        ("ray.io", "rayservices"): {"apiVersion": "ray.io/v1", "kind": "RayService",
                                    "spec": {"rayClusterConfig": copy.deepcopy(ray)}},
        ("ray.io", "rayjobs"): {"apiVersion": "ray.io/v1", "kind": "RayJob",
                                "spec": {"entrypoint": "python x.py",
                                         "rayClusterSpec": copy.deepcopy(ray)}},
        ("leaderworkerset.x-k8s.io", "leaderworkersets"): {
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "size": 4, "leaderTemplate": t(), "workerTemplate": t()}}},
        ("jobset.x-k8s.io", "jobsets"): {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "spec": {"replicatedJobs": [
                {"name": "a", "replicas": 1, "template": {"spec": {"template": t()}}},
                {"name": "b", "replicas": 2, "template": {"spec": {"template": t()}}}]}},
        ("batch.volcano.sh", "jobs"): {
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "spec": {"tasks": [{"name": "ps", "replicas": 1, "template": t()},
                               {"name": "worker", "replicas": 2, "template": t()}]}},
        # The kinds that keep bare PodSpecs or resource blocks (policies.facts.workload_kinds).
        ("trainer.kubeflow.org", "trainjobs"): {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2, "resourcesPerNode": copy.deepcopy(cpu)}}},
        ("serving.kserve.io", "inferenceservices"): {
            "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "spec": {"predictor": {"minReplicas": 1, **t()["spec"],
                                   "model": {"modelFormat": {"name": "pytorch"},
                                             "resources": copy.deepcopy(cpu)},
                                   "workerSpec": t()["spec"]},
                     "transformer": t()["spec"],
                     "explainer": {"art": {"resources": copy.deepcopy(cpu)}}}},
        ("serving.kserve.io", "llminferenceservices"): {
            "apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceService",
            "spec": {"replicas": 2, "template": t()["spec"], "worker": t()["spec"],
                     "prefill": {"replicas": 1, "template": t()["spec"],
                                 "worker": t()["spec"]}}},
        ("serving.kubeflow.org", "kfservices"): {
            "apiVersion": "serving.kubeflow.org/v1alpha2", "kind": "KFService",
            "spec": {"default": {"predictor": {"tensorflow": {
                         "storageUri": "gs://x", "resources": copy.deepcopy(cpu)}}},
                     "canary": {"tensorflow": {"modelUri": "gs://x",
                                               "resources": copy.deepcopy(cpu)}}}},
        ("disaggregatedset.x-k8s.io", "disaggregatedsets"): {
            "apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
            "spec": {"roles": [
                {"name": "prefill", "spec": {"leaderWorkerTemplate": {
                    "size": 2, "leaderTemplate": t(), "workerTemplate": t()}}},
                {"name": "decode", "spec": {"replicas": 2, "leaderWorkerTemplate": {
                    "size": 1, "workerTemplate": t()}}}]}},
        # Operator kinds: NIM's resource block; KAITO's custom inference template (their
        # accelerator fields, draResources and resource.mig, are test_operator_fields_are_sent's).
        ("apps.nvidia.com", "nimservices"): {
            "apiVersion": "apps.nvidia.com/v1alpha1", "kind": "NIMService",
            "spec": {"replicas": 2, "resources": copy.deepcopy(cpu)}},
        ("kaito.sh", "workspaces"): {
            "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
            "resource": {"instanceType": "Standard_NC24ads_A100_v4"},
            "inference": {"template": t()}},
        ("kaito.sh", "inferencesets"): {
            "apiVersion": "kaito.sh/v1beta1", "kind": "InferenceSet",
            "spec": {"replicas": 2, "template": {"inference": {"template": t()}}}},
    }
    for key, obj in objects.items():
        obj["metadata"] = {"name": f"{key[1]}-x", "namespace": "team-a"}
    return objects


SKELETONS = _skeletons()
TEMPLATE_CASES = [
    (key, template.path, template.shape)
    for key, obj in sorted(SKELETONS.items())
    for template in find_workload(obj).templates  # type: ignore[union-attr]
]
# Where each shape's locations are kept (policies.facts.workload_kinds, through the prefilter).
LOCATIONS_OF_SHAPE = {TEMPLATE: prefilter.TEMPLATE_LOCATIONS, POD_SPEC: prefilter.POD_SPEC_LOCATIONS,
                      RESOURCES: prefilter.RESOURCE_LOCATIONS}


def _location_pattern(location: str) -> re.Pattern[str]:
    """A prefilter location as a regex over policies.facts.workloads' template paths."""
    parts = []
    for field in location.split("."):
        if field == "*":
            parts.append(r"[^.\[\]]+")
        elif field.endswith("[]"):
            parts.append(re.escape(field[:-2]) + r"\[\d+\]")
        else:
            parts.append(re.escape(field))
    return re.compile(r"\.".join(parts))


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    steps = [s for s in re.split(r"\.|(\[\d+\])", path) if s]
    target: Any = obj
    for step in steps[:-1]:
        target = target[int(step[1:-1])] if step.startswith("[") else target[step]
    last = steps[-1]
    target[int(last[1:-1]) if last.startswith("[") else last] = value


def test_every_workload_resource_of_the_rules_has_a_skeleton() -> None:
    wanted = {key for name in ("workloads.validate.gpuguard.io", "mutate.gpuguard.io")
              for key in RULES[name]
              if key not in (("", "pods"), ("", "pods/ephemeralcontainers"))
              and key[0] not in ("kubevirt.io", "pool.kubevirt.io")}  # test_kubevirt_*
    assert wanted == set(SKELETONS)


@pytest.mark.parametrize(("key", "path", "shape"), TEMPLATE_CASES,
                         ids=[f"{k[1]}:{p}" for k, p, _ in TEMPLATE_CASES])
def test_a_gpu_in_any_template_of_a_workload_is_sent(key: tuple[str, str], path: str,
                                                     shape: str) -> None:
    # Where policies.facts.workloads finds a pod template (a PodTemplateSpec, a bare PodSpec or a
    # resource block), the prefilter looks: the path is one of the kind's locations of that
    # shape in the registry, and a GPU placed there, in an otherwise all-CPU workload, makes the
    # API server call gpuguard.
    locations = LOCATIONS_OF_SHAPE[shape].get(key, ())
    assert any(_location_pattern(loc).fullmatch(path) for loc in locations), (path, locations)
    cpu = SKELETONS[key]
    assert not WORKLOADS.calls(cpu) and not MUTATE.calls(cpu)
    signals = {TEMPLATE: ("whole GPU (initContainers)", "KAI gpu-fraction", "DRA claim",
                          "hostPath /dev/nvidia0 (containers)"),
               POD_SPEC: ("whole GPU (initContainers)", "DRA claim",
                          "hostPath /dev/nvidia0 (containers)", "privileged (containers)"),
               RESOURCES: ()}[shape]
    changes: list[tuple[str, Any]] = []
    for signal in signals:
        template = cpu_template()
        POD_SIGNALS[signal](template)
        changes.append((signal, template if shape == TEMPLATE else template["spec"]))
    if shape == RESOURCES:
        changes += [(f"{name} in {side}", {side: {name: "1"}})
                    for name in ("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-1g.10gb")
                    for side in ("limits", "requests")]
    for signal, value in changes:
        obj = copy.deepcopy(cpu)
        _set_path(obj, path, value)
        facts = workload_facts(obj)
        assert facts is not None and seen_by_facts(facts.total), (path, signal)
        assert WORKLOADS.calls(obj) and MUTATE.calls(obj), (path, signal)


@pytest.mark.parametrize(("key", "path", "value", "gpus", "mig"), [
    (("apps.nvidia.com", "nimservices"), "spec.draResources",
     [{"resourceClaimTemplateName": "gpu-claim"}], {}, {}),
    (("apps.nvidia.com", "nimservices"), "spec.draResources",
     [{"claimSpec": {"devices": [{"name": "gpu", "count": 2}]}}], {}, {}),
    (("kaito.sh", "workspaces"), "resource.mig", {"profile": "1g.10gb"}, {}, {"1g.10gb": 1}),
    (("kaito.sh", "inferencesets"), "spec.template.resource.mig",
     {"profile": "2g.24gb", "count": 2}, {}, {"2g.24gb": 4}),  # 2 Workspaces x 2
])
def test_operator_fields_are_sent(key: tuple[str, str], path: str, value: Any,
                                  gpus: dict[str, int], mig: dict[str, int]) -> None:
    # An operator field that asks for accelerators without a resource name or a PodSpec (NIM
    # draResources, KAITO resource.mig) makes the API server call gpuguard, and the facts count it.
    obj = copy.deepcopy(SKELETONS[key])
    obj.setdefault("spec", {})
    _put(obj, path, value)
    assert WORKLOADS.calls(obj) and MUTATE.calls(obj)
    facts = workload_facts(obj)
    assert facts is not None and seen_by_facts(facts.total)
    assert (facts.total.gpus, facts.total.mig) == (gpus, mig)
    empty = copy.deepcopy(SKELETONS[key])
    _put(empty, path, [] if path.endswith("draResources") else {})
    assert not WORKLOADS.calls(empty)


def _put(obj: dict[str, Any], path: str, value: Any) -> None:
    target = obj
    *parents, last = path.split(".")
    for name in parents:
        target = target.setdefault(name, {})
    target[last] = value


def test_kubevirt_vms_with_gpus_are_sent() -> None:
    domain = {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/GRID_A100-4C"}]}}
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "v"}, "spec": {"domain": domain}}
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v"},
          "spec": {"template": {"spec": {"domain": copy.deepcopy(domain)}}}}
    assert WORKLOADS.calls(vmi) and WORKLOADS.calls(vm)
    host = {"devices": {"hostDevices": [{"name": "h", "deviceName": "nvidia.com/GA102GL_A10"}]}}
    assert WORKLOADS.calls({**vmi, "spec": {"domain": host}})
    plain = {"devices": {"disks": [{"name": "d"}]}}
    assert not WORKLOADS.calls({**vmi, "spec": {"domain": plain}})
    assert not WORKLOADS.calls({**vm, "spec": {"template": {"spec": {"domain": plain}}}})
    # Host devices that are not GPUs (QuickAssist crypto, a NIC) are not sent; a malformed entry is.
    others = {"devices": {"hostDevices": [{"name": "q", "deviceName": "intel.com/qat"},
                                          {"name": "n", "deviceName": "mellanox.com/MT2892"}]}}
    assert not WORKLOADS.calls({**vmi, "spec": {"domain": others}})
    assert WORKLOADS.calls({**vmi, "spec": {"domain": {"devices": {"hostDevices": ["x"]}}}})
    amd = {"devices": {"hostDevices": [{"name": "a", "deviceName": "amd.com/MI300X"}]}}
    assert WORKLOADS.calls({**vmi, "spec": {"domain": amd}})
    pool = {"apiVersion": "pool.kubevirt.io/v1alpha1", "kind": "VirtualMachinePool",
            "metadata": {"name": "p"}, "spec": {"replicas": 2, "virtualMachineTemplate": {
                "spec": {"template": {"spec": {"domain": copy.deepcopy(domain)}}}}}}
    replica_set = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceReplicaSet",
                   "metadata": {"name": "r"},
                   "spec": {"replicas": 2, "template": {"spec": {"domain": copy.deepcopy(domain)}}}}
    assert WORKLOADS.calls(pool) and WORKLOADS.calls(replica_set)
    pool["spec"]["virtualMachineTemplate"]["spec"]["template"]["spec"]["domain"] = plain
    assert not WORKLOADS.calls(pool)


def _claim_objects() -> list[tuple[str, dict[str, Any]]]:
    """The ResourceClaims and ResourceClaimTemplates of tests/data (v1beta1 and v1 shapes)."""
    documents, _ = read_documents([str(ROOT / "tests" / "data")])
    return [(d.location, d.body) for d in documents if d.body.get("kind") in (
        "ResourceClaim", "ResourceClaimTemplate")
        and str(d.body.get("apiVersion", "")).startswith("resource.k8s.io/")]


def test_dra_claims_are_sent_exactly_when_the_facts_see_gpus_or_mig() -> None:
    # A claim is judged itself (mig-profile-allowed): sent when the facts, without the
    # DeviceClass (cluster-scoped, not in the request), count a GPU or a MIG slice in it; an
    # IMEX channel or a NIC is not sent. A class of unknown kind is counted by the facts but
    # not sent: see CLAIMS_OF_UNKNOWN_KIND.
    claims = _claim_objects()
    assert len(claims) >= 10
    sent, missed, beyond = 0, [], []
    for where, obj in claims:
        facts = workload_facts(obj)
        assert facts is not None
        total = facts.total
        counted = bool(total.mig) or (bool(total.dra_claims) and not total.unknown)
        called = PODS.calls(_without_nulls(obj))
        assert PODS.calls(None, operation="DELETE", old=_without_nulls(obj)) == called
        sent += called
        if (counted or total.mig) and not called:
            missed.append(where)
        if called and not total.dra_claims:
            beyond.append(where)
    assert not missed, missed
    assert not beyond, beyond
    assert sent >= 5


def test_a_mig_selector_on_a_class_of_any_name_is_sent() -> None:
    def claim(request: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "n"},
                "spec": {"spec": {"devices": {"requests": [{"name": "r", **request}]}}}}

    profile = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]
    kind = [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].type == "mig"'}}]
    for request in ({"exactly": {"deviceClassName": "slices.example.com", "selectors": profile}},
                    {"firstAvailable": [{"name": "a", "deviceClassName": "nic.example.com"},
                                        {"name": "b", "deviceClassName": "x.example.com",
                                         "selectors": kind}]},
                    {"deviceClassName": "mig.nvidia.com"},  # v1beta1: no exactly
                    {"exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}):
        obj = claim(request)
        assert PODS.calls(obj), request
        assert workload_facts(obj).total.requested, request  # type: ignore[union-attr]
    for request in ({"exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}},
                    {"exactly": {"deviceClassName": "nic.example.com"}}):
        assert not PODS.calls(claim(request)), request
    bare = claim({"exactly": {"deviceClassName": "gpu.nvidia.com"}})
    claim_object = {**bare, "kind": "ResourceClaim", "spec": bare["spec"]["spec"]}
    assert PODS.calls(claim_object)


# --- operations ------------------------------------------------------------------------------

def test_updates_of_objects_being_deleted_are_not_sent() -> None:
    # During an outage a GPU pod being deleted must still lose its finalizers; a pod with a
    # deletionTimestamp is never scheduled again, so such an UPDATE gives no GPU access.
    template = cpu_template()
    POD_SIGNALS["whole GPU (containers)"](template)
    pod = _pod(template)
    assert PODS.calls(pod, operation="UPDATE", old=pod)
    leaving = copy.deepcopy(pod)
    leaving["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    assert PODS.results(leaving, operation="UPDATE", old=leaving) == [False, True]
    assert not PODS.calls(leaving, operation="UPDATE", old=leaving)
    # ... but kubectl debug on it still is (a subresource), and so is everything else.
    assert PODS.calls(leaving, operation="UPDATE", old=leaving,
                      sub_resource="ephemeralcontainers")
    assert PODS.calls(leaving, operation="CREATE")


def test_delete_reads_the_old_object() -> None:
    template = cpu_template()
    POD_SIGNALS["privileged (containers)"](template)
    assert PODS.calls(None, operation="DELETE", old=_pod(template))
    assert not PODS.calls(None, operation="DELETE", old=_pod(cpu_template()))
    assert not PODS.calls(None, operation="CONNECT", old=None)


# --- property: whatever the facts see is sent -------------------------------------------------

PIECES = sorted(CONTAINER_SIGNALS)
NOISE = {
    "cpu": _limits("cpu", "2"),
    "hugepages": _limits("hugepages-2Mi", "1Gi"),
    "nic": _limits("nvidia.com/mlnxnics"),
    "env": _env("CUDA_VISIBLE_DEVICES", value="all"),
    "void": _env("PATH", value="/usr/bin"),
    "hostPath": _host_path("/var/lib/kubelet"),
    "hostPath /dev/shm": _host_path("/dev/shm"),
    "envFrom prefix APP_": _env_from(prefix="APP_", configMapRef={"name": "app"}),
    # every app's envFrom: not sent, else each such app would depend on gpuguard being up
    "envFrom a ConfigMap, no prefix": _env_from(configMapRef={"name": "app-env"}),
    "capability": _security(capabilities={"add": ["NET_ADMIN", "SYS_PTRACE"]}),
    "not privileged": _security(privileged=False, runAsNonRoot=True),
}


@st.composite
def pods(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A pod of random containers, each with random GPU signals and noise, and whether any
    signal was placed."""
    template = cpu_template()
    placed = False
    for _ in range(draw(st.integers(1, 4))):
        ctype = draw(st.sampled_from(prefilter.CONTAINER_FIELDS))
        signals = draw(st.lists(st.sampled_from(PIECES), max_size=2))
        noise = draw(st.lists(st.sampled_from(sorted(NOISE)), max_size=3))

        def change(c: dict[str, Any], t: dict[str, Any], signals: list[str] = signals,
                   noise: list[str] = noise) -> None:
            for name in noise:
                NOISE[name](c, t)
            for name in signals:
                CONTAINER_SIGNALS[name](c, t)
        _in_container(ctype, change)(template)
        placed = placed or bool(signals)
    if draw(st.booleans()):
        key = draw(st.sampled_from([*prefilter.GPU_ANNOTATIONS, "example.com/other"]))
        template["metadata"]["annotations"][key] = draw(st.sampled_from(["0.5", "", "x"]))
        placed = placed or key != "example.com/other"
    return _pod(template), placed


@settings(max_examples=300, derandomize=True, deadline=None)
@given(case=pods())
def test_whatever_the_facts_see_is_sent(case: tuple[dict[str, Any], bool]) -> None:
    pod, placed = case
    called = PODS.calls(pod)
    assert called == placed
    if seen_by_facts(pod_facts(pod["spec"], pod["metadata"])):
        assert called


# --- property: every hostPath the facts count as exposing devices is sent ---------------------

PATH_PIECES = ("/", "//", ".", "..", "dev", "nvidia0", "nvidiactl", "dri", "shm", "var", "DEV",
               "devices", ".cache", "kfd")


@settings(max_examples=500, derandomize=True, deadline=None)
@given(pieces=st.lists(st.sampled_from(PATH_PIECES), min_size=1, max_size=6))
def test_whatever_host_path_the_facts_count_is_sent(pieces: list[str]) -> None:
    path = "".join(pieces)
    template = cpu_template()
    _in_container("containers", _host_path(path))(template)
    pod = _pod(template)
    if pod_facts(pod["spec"], pod["metadata"]).unrequested_access:
        assert PODS.calls(pod), path
