"""The engine on real inputs: bug cases from tests/data/bugs, corpus manifests and native
ValidatingAdmissionPolicy / MutatingAdmissionPolicy objects written as Kubernetes documents them."""

import datetime

import jsonpatch
import pytest
import yaml

from policies.engine.evaluation import Engine, EvaluationExpired, audit_key
from policies.facts.review import UserInfo, from_object, from_request
from policies.policy.loader import build_policy_set, rewrite_jsonpatch_literals
from policies.sources import parse_text
from tests.builders.corpus import bug_input, first
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV


def engine_for(text: str) -> Engine:
    from policies.sources import Document

    documents = [Document("policy.yaml", i, None, body, lines)
                 for i, body, lines in parse_text("policy.yaml", text, with_lines=True)]
    policy_set, errors = build_policy_set(documents, ENV)
    assert errors == [], [str(e) for e in errors]
    return Engine(policy_set, ENV)


def gpu_policy(name: str, spec: dict) -> str:
    return yaml.safe_dump({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                           "metadata": {"name": name}, "spec": spec})


def review_of(case: str, key: str | None = None, **kwargs):
    return from_request(bug_input(case, key)["request"], now=NOW, **kwargs)


ANNOTATE = gpu_policy("annotate", {
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "mutations": [{"setAnnotation": {"key": "gpu-governance.example.com/policy",
                                     "value": "default"}}],
})


# --- JSONPatch correctness (bug cases) ------------------------------------------------------


def test_annotation_key_with_slash_is_escaped_kyverno_532():
    review = review_of("kyverno-kyverno-532.yaml")
    verdict = engine_for(ANNOTATE).evaluate(review)
    assert list(verdict.patch) == [{"op": "add",
                                    "path": "/metadata/annotations/gpu-governance.example.com~1policy",
                                    "value": "default"}]
    patched = jsonpatch.apply_patch(dict(review.object), list(verdict.patch))
    assert patched["metadata"]["annotations"] == {"owner.example.com/team": "a",
                                                  "gpu-governance.example.com/policy": "default"}


def test_missing_annotations_map_is_created_whole_k8s_90623():
    review = review_of("kubernetes-kubernetes-90623.yaml")
    policy = gpu_policy("decision", {"mutations": [{"setAnnotation": {
        "key": "gpu-governance.example.com/decision", "value": "allowed"}}]})
    verdict = engine_for(policy).evaluate(review)
    assert list(verdict.patch) == [{"op": "add", "path": "/metadata/annotations",
                                    "value": {"gpu-governance.example.com/decision": "allowed"}}]


def test_null_annotations_in_a_template_is_handled_like_absent():
    job = first("manifests/mpiop__nccl-tests-mpijob.yaml")
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] is None
    policy = gpu_policy("annotate-pods", {"mutations": [{"setAnnotation": {
        "key": "gpuguard.io/checked", "value": "true", "target": "podTemplates"}}]})
    verdict = engine_for(policy).evaluate(from_object(job, now=NOW))
    # Only the GPU template (Worker) is annotated; its null map is replaced by a map.
    assert list(verdict.patch) == [{"op": "replace",
                                    "path": "/spec/mpiReplicaSpecs/Worker/template/metadata/annotations",
                                    "value": {"gpuguard.io/checked": "true"}}]


TOLERATE = gpu_policy("tolerate", {
    "match": {"operations": ["CREATE"]},
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "mutations": [{"addToleration": {"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}}],
})


def test_toleration_added_to_missing_array_at_template_path_kyverno_1340():
    verdict = engine_for(TOLERATE).evaluate(
        review_of("kyverno-kyverno-1340.yaml", "deployment_without_tolerations"))
    assert list(verdict.patch) == [{"op": "add", "path": "/spec/template/spec/tolerations",
                                    "value": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                               "effect": "NoSchedule"}]}]


def test_toleration_already_present_gives_no_patch_kyverno_1340():
    verdict = engine_for(TOLERATE).evaluate(
        review_of("kyverno-kyverno-1340.yaml", "pod_with_gpu_toleration_already"))
    assert verdict.patch == ()
    assert verdict.allowed


def test_no_mutation_on_update_of_an_existing_pod_kyverno_1340():
    review = review_of("kyverno-kyverno-1340.yaml", "deployment_without_tolerations")
    update = from_request({**review.request, "operation": "UPDATE",
                           "oldObject": review.request["object"]}, now=NOW)
    assert engine_for(TOLERATE).evaluate(update).patch == ()


def test_safe_to_evict_annotation_round_trips_kopf_866():
    review = review_of("nolar-kopf-866.yaml")
    policy = gpu_policy("evict", {"mutations": [{"expression": (
        "[{'op': 'add', 'path': '/metadata/annotations/' + "
        "jsonpatch.escapeKey('cluster-autoscaler.kubernetes.io/safe-to-evict'), 'value': 'true'}]"
    )}]})
    verdict = engine_for(policy).evaluate(review)
    assert list(verdict.patch) == [{"op": "add", "path":
                                    "/metadata/annotations/cluster-autoscaler.kubernetes.io~1safe-to-evict",
                                    "value": "true"}]
    before = review.object
    after = jsonpatch.apply_patch(dict(before), list(verdict.patch))
    assert {k: v for k, v in after["metadata"]["annotations"].items()
            if k != "cluster-autoscaler.kubernetes.io/safe-to-evict"} == \
        before["metadata"]["annotations"]


def test_delete_with_null_object_is_allowed_kyverno_4374():
    review = review_of("kyverno-kyverno-4374.yaml")
    assert review.object is None and review.old_object is not None
    policy = gpu_policy("limit", {"validations": [
        {"expression": "gpu.count <= 2", "message": "too many GPUs"}]})
    verdict = engine_for(policy).evaluate(review)
    assert verdict.allowed and verdict.patch == () and verdict.results == ()


# --- validation semantics --------------------------------------------------------------------


def test_actions_deny_warn_audit_and_message_expression():
    policy = gpu_policy("max-two", {
        "validationActions": ["Warn", "Audit"],
        "variables": [{"name": "n", "expression": "gpu.maxPerPod.count"}],
        "validations": [{"expression": "variables.n <= 2",
                         "messageExpression": "'pod asks ' + string(variables.n) + ' GPUs'"}],
        "auditAnnotations": [{"key": "gpus", "valueExpression": "string(gpu.count)"}],
    })
    lws = first("manifests/lws__vllm-gpu-leaderworkerset.yaml")
    verdict = engine_for(policy).evaluate(from_object(lws, now=NOW))
    assert verdict.allowed
    assert verdict.warning_texts == ("max-two: pod asks 8 GPUs",)
    assert verdict.audit_annotations == {
        "max-two.validation-failure": '[{"rule": "validations[0]", "message": "pod asks 8 GPUs"}]',
        "max-two.gpus": "32",
    }


def test_evaluation_error_follows_failure_policy():
    pod = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
    spec = {"validations": [{"expression": "object.metadata.labels['team'] == 'a'"}]}
    failing = engine_for(gpu_policy("needs-team", spec)).evaluate(from_object(pod, now=NOW))
    assert not failing.allowed
    assert "needs-team: validations[0] failed to evaluate" in failing.message
    ignoring = engine_for(gpu_policy("needs-team", {**spec, "failurePolicy": "Ignore"}))
    verdict = ignoring.evaluate(from_object(pod, now=NOW))
    assert verdict.allowed
    assert [r.outcome for r in verdict.results] == ["error"]


def test_expired_callback_stops_between_policies():
    """The webhook's deadline for evaluations run on its event loop: asked before each policy."""
    policies = "---\n".join(gpu_policy(f"p{i}", {"validations": [{"expression": "gpu.count < 9"}]})
                            for i in range(3))
    pod = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
    asked = []

    def expired() -> bool:
        asked.append(True)
        return len(asked) > 2  # time runs out after two policies

    with pytest.raises(EvaluationExpired):
        engine_for(policies).evaluate(from_object(pod, now=NOW), expired=expired)
    assert len(asked) == 3
    verdict = engine_for(policies).evaluate(from_object(pod, now=NOW), expired=lambda: False)
    assert verdict.allowed and [r.outcome for r in verdict.results] == ["pass"] * 3


def test_expired_callback_stops_between_rules_evaluated_one_by_one():
    """A policy evaluated rule by rule (its fused program failed) stops at the next rule."""
    failing = {"expression": "object.metadata.labels['missing'] == 'x'"}
    policy = gpu_policy("many", {"failurePolicy": "Ignore", "validations": [failing] * 5})
    pod = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
    asked = []

    def expired() -> bool:
        asked.append(True)
        return len(asked) > 3  # the policy, then two rules, then time is up

    with pytest.raises(EvaluationExpired):
        engine_for(policy).evaluate(from_object(pod, now=NOW), expired=expired)
    assert len(asked) == 4


def test_match_condition_false_skips_and_namespace_selector_uses_labels():
    policy = gpu_policy("team-only", {
        "match": {"namespaceSelector": {"matchLabels": {"gpuguard.io/team": "a"}}},
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "validations": [{"expression": "false", "message": "no GPUs for team a"}],
    })
    engine = engine_for(policy)
    gpu_pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    team_a = {"metadata": {"name": "default", "labels": {"gpuguard.io/team": "a"}}}
    assert not engine.evaluate(from_object(gpu_pod, namespace_object=team_a, now=NOW)).allowed
    team_b = {"metadata": {"name": "default", "labels": {"gpuguard.io/team": "b"}}}
    assert engine.evaluate(from_object(gpu_pod, namespace_object=team_b, now=NOW)).allowed
    cpu_pod = first("manifests/imroc__ollama-statefulset-gpu-zero-request.yaml")
    assert engine.evaluate(from_object(cpu_pod, namespace_object=team_a, now=NOW)).allowed


def test_exceptions_exempt_until_they_expire():
    policy = gpu_policy("no-gpu", {
        "validations": [{"expression": "!gpu.requested", "message": "no GPUs here"}],
        "exceptions": [{"names": ["gpu-operator-test"], "reason": "smoke test, ticket OPS-1",
                        "expires": "2026-12-31"}],
    })
    engine = engine_for(policy)
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    verdict = engine.evaluate(from_object(pod, now=NOW))
    assert verdict.allowed
    assert [(r.outcome, r.message) for r in verdict.results] == [
        ("exempt", "smoke test, ticket OPS-1 (until 2026-12-31)")]
    later = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)
    assert not engine.evaluate(from_object(pod, now=later)).allowed


def test_subjects_include_and_exclude():
    policy = gpu_policy("ml-only", {
        "match": {"subjects": {"exclude": [{"kind": "Group", "name": "ml-engineers"},
                                           {"kind": "ServiceAccount", "name": "trainer",
                                            "namespace": "ml"}]}},
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "validations": [{"expression": "false", "message": "only ML engineers may use GPUs"}],
    })
    engine = engine_for(policy)
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")

    def allowed(user):
        return engine.evaluate(from_object(pod, user=user, now=NOW)).allowed

    assert allowed(UserInfo("alice", groups=("ml-engineers",)))
    assert allowed(UserInfo("system:serviceaccount:ml:trainer"))
    assert not allowed(UserInfo("system:serviceaccount:other:trainer"))
    assert not allowed(UserInfo("bob", groups=("system:authenticated",)))


def test_ephemeral_container_subresource_is_matched_only_when_listed():
    review = review_of("deckhouse-deckhouse-22398.yaml")
    spec = {"validations": [{"expression": "gpu.unrequestedAccess.size() == 0",
                             "messageExpression": "gpu.unrequestedAccess[0].path + ': ' + "
                                                  "gpu.unrequestedAccess[0].reason"}]}
    default = engine_for(gpu_policy("isolation", spec)).evaluate(review)
    assert not default.allowed  # the default resources include pods/ephemeralcontainers
    assert default.message == ("isolation: spec.ephemeralContainers[0].env[0]: "
                               "NVIDIA_VISIBLE_DEVICES=all without requesting a GPU")
    pods_only = gpu_policy("isolation", {**spec, "match": {"resources": ["pods"]}})
    assert engine_for(pods_only).evaluate(review).allowed


def test_later_policies_see_earlier_mutations():
    text = TOLERATE + "---\n" + gpu_policy("must-tolerate", {
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "validations": [{"expression": "object.spec.template.spec.tolerations.exists(t, "
                                       "t.key == 'nvidia.com/gpu')"}],
    })
    verdict = engine_for(text).evaluate(
        review_of("kyverno-kyverno-1340.yaml", "deployment_without_tolerations"))
    assert verdict.allowed
    assert [r.outcome for r in verdict.results] == ["mutate", "pass"]


def test_audit_point_reports_and_never_denies_or_patches():
    engine = engine_for(TOLERATE + "---\n" + gpu_policy("no-gpu", {
        "validations": [{"expression": "!gpu.requested", "message": "no GPUs"}]}))
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    verdict = engine.evaluate(from_object(deployment, now=NOW), point="audit")
    assert verdict.allowed and verdict.patch == ()
    assert [r.outcome for r in verdict.results] == ["mutate", "fail"]


def test_audit_keys_are_valid_label_names():
    assert audit_key("max-gpus-per-pod", "validation-failure") == \
        "max-gpus-per-pod.validation-failure"
    long = audit_key("x" * 80 + "/binding", "key")
    assert len(long) <= 63 and "/" not in long


# --- native admission policies ---------------------------------------------------------------

NATIVE_VAP = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: gpu-limit.example.com
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
    - apiGroups: ["apps"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["deployments"]
  variables:
  - name: gpus
    expression: >-
      object.spec.template.spec.containers.map(c,
        has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits
        ? int(c.resources.limits['nvidia.com/gpu']) : 0).sum()
  validations:
  - expression: variables.gpus * object.spec.replicas <= int(params.data.maxGPUs)
    messageExpression: "'deployment asks ' + string(variables.gpus * object.spec.replicas) + ' GPUs, limit ' + params.data.maxGPUs"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: gpu-limit-binding
spec:
  policyName: gpu-limit.example.com
  validationActions: [Deny]
  paramRef:
    name: gpu-limits
    namespace: default
    parameterNotFoundAction: Deny
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpu-limits
  namespace: default
data:
  maxGPUs: "2"
"""


def test_native_validating_admission_policy_with_params_evaluates_unmodified():
    engine = engine_for(NATIVE_VAP)
    assert engine.policies.names() == ("gpu-limit.example.com/gpu-limit-binding",)
    gemma = first("manifests/gke__vllm-gemma3-27b-a100-deployment.yaml")  # 1 x 2 GPUs
    assert engine.evaluate(from_object(gemma, now=NOW)).allowed
    gemma["spec"]["replicas"] = 3
    verdict = engine.evaluate(from_object(gemma, now=NOW))
    assert verdict.message == ("gpu-limit.example.com/gpu-limit-binding: deployment asks 6 "
                              "GPUs, limit 2")
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    assert engine.evaluate(from_object(pod, now=NOW)).results == ()  # not a deployment


def test_native_policy_without_binding_is_a_warning_not_enforced():
    text = NATIVE_VAP.split("---", maxsplit=1)[0]
    from policies.sources import Document

    documents = [Document("p.yaml", i, None, b, None) for i, b, _ in parse_text("p.yaml", text)]
    policy_set, errors = build_policy_set(documents, ENV)
    assert errors == [] and policy_set.policies == ()
    assert "has no binding in the input" in policy_set.warnings[0]


NATIVE_MAP = """
apiVersion: admissionregistration.k8s.io/v1beta1
kind: MutatingAdmissionPolicy
metadata:
  name: gpu-runtimeclass
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["pods"]
  reinvocationPolicy: Never
  matchConditions:
  - name: gpu
    expression: object.spec.containers.exists(c, has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits)
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: >
        [JSONPatch{op: "add", path: "/spec/runtimeClassName", value: "nvidia"}]
---
apiVersion: admissionregistration.k8s.io/v1beta1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: gpu-runtimeclass
spec:
  policyName: gpu-runtimeclass
"""


def test_native_mutating_admission_policy_jsonpatch():
    engine = engine_for(NATIVE_MAP)
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    verdict = engine.evaluate(from_object(pod, now=NOW))
    assert list(verdict.patch) == [{"op": "add", "path": "/spec/runtimeClassName",
                                    "value": "nvidia"}]


def test_mutating_policy_without_reinvocation_policy_is_refused_as_the_api_server_does():
    """kube-apiserver refuses it ('spec.reinvocationPolicy: Required value'; no default), so a
    file that loads in gpuguard would not apply to a cluster (found by the differential tier)."""
    text = NATIVE_MAP.replace("  reinvocationPolicy: Never\n", "")
    from policies.sources import Document

    documents = [Document("p.yaml", i, None, b, None) for i, b, _ in parse_text("p.yaml", text)]
    policy_set, errors = build_policy_set(documents, ENV)
    assert policy_set.policies == ()
    assert [(e.path, e.message) for e in errors] == [
        ("spec", "'reinvocationPolicy' is required")]


@pytest.mark.parametrize(("source", "rewritten"), [
    ('[JSONPatch{op: "add", path: "/a", value: {"k": "v"}}]',
     '[{"op": "add", "path": "/a", "value": {"k": "v"}}]'),
    ("JSONPatch{op: 'replace', path: '/op: x', value: [1, {'path': 2}]}",
     "{\"op\": 'replace', \"path\": '/op: x', \"value\": [1, {'path': 2}]}"),
])
def test_jsonpatch_literal_rewrite(source, rewritten):
    assert rewrite_jsonpatch_literals(source) == rewritten


# --- found by a new user's attack --------------------------------------------------------------


@pytest.mark.parametrize(("operations", "message"), [
    ("[{'op': 'replace', 'path': '/metadata/name', 'value': 'other'}]",
     "a mutation may not change metadata.name (from the string 'gpu-operator-test' to the "
     "string 'other')"),
    ("[{'op': 'replace', 'path': '/kind', 'value': 'Secret'}]",
     "a mutation may not change kind (from the string 'Pod' to the string 'Secret')"),
    # the API server's JSON Patch library refuses a whole-document replace by a scalar
    ("[{'op': 'replace', 'path': '', 'value': 'gone'}]",
     "operation 0 (replace ) does not apply: replace operation value must be object or array"),
    ("[{'op': 'remove', 'path': '/spec/nodeName'}]",
     "operation 0 (remove /spec/nodeName) does not apply"),
])
def test_mutations_may_not_rename_retype_or_replace_the_object(operations, message):
    policy = gpu_policy("bad-mutation", {"failurePolicy": "Ignore",
                                         "mutations": [{"expression": operations}]})
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    verdict = engine_for(policy).evaluate(from_object(pod, now=NOW))
    assert verdict.patch == () and verdict.allowed
    [result] = verdict.results
    assert result.outcome == "error" and message in result.message


def test_wrong_typed_labels_do_not_crash_the_engine():
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    deployment["spec"]["template"]["metadata"]["labels"] = ["app", "mistral"]
    deployment["metadata"] = None
    policy = gpu_policy("labels", {
        "validations": [{"expression": "gpu.templates.all(t, !('team' in t.metadata.labels))"}],
        "mutations": [{"setLabel": {"key": "a", "value": "b"}}],
        "failurePolicy": "Ignore",
    })
    verdict = engine_for(policy).evaluate(from_object(deployment, now=NOW))
    assert [(r.outcome, r.message) for r in verdict.results] == [
        ("error", "mutation 'mutations[0]' failed: setLabel: the object's metadata is "
                  "null, not a map"),
        ("pass", ""),
    ]


def test_message_expression_failure_is_explained():
    policy = gpu_policy("msg", {"validations": [{
        "expression": "false", "message": "static text", "messageExpression": "string(gpu.kai.x)"}]})
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    verdict = engine_for(policy).evaluate(from_object(pod, now=NOW))
    assert verdict.message == "msg: static text (messageExpression failed: no such key: x)"
