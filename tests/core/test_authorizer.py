"""The CEL ``authorizer`` (policies/cel/library/authz.py) through the engine: Kubernetes'
authz.go semantics, the request's user as the subject, one decision per check per request, and
an errored decision following the policy's failurePolicy."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from policies.authorization import Attributes, Decision, Subject, Verdict
from policies.engine.evaluation import Engine
from policies.facts.review import UserInfo, from_object
from policies.rbac import RBACAuthorizer
from tests.builders.corpus import first
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.core.test_engine import engine_for, gpu_policy
from tests.core.test_rbac import GPU_USER, binding, group

POD = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
ALICE = UserInfo("alice", "u-1", ("gpu-h100", "system:authenticated"), {"team": ["ml"]})


@dataclass
class Recording:
    """An authorizer that answers from a table and records what it was asked (a test double:
    the real ones are policies.rbac and kube/subject_access_reviews.py)."""

    answers: dict[tuple[str, str, str], Decision]
    asked: list[Attributes] = field(default_factory=list)

    def authorize(self, attributes: Attributes) -> Decision:
        self.asked.append(attributes)
        key = (attributes.verb, attributes.resource or attributes.path, attributes.name)
        return self.answers.get(key, Decision(Verdict.NO_OPINION, ""))


def engine(expression: str, **spec: object) -> Engine:
    return engine_for(gpu_policy("authz", {
        "validations": [{"expression": expression}], **spec}))


def review(user: UserInfo = ALICE, namespace: str = "ml"):
    pod = {**POD, "metadata": {**POD["metadata"], "namespace": namespace, "name": "train"}}
    return from_object(pod, user=user, now=NOW)


CHECK = ("authorizer.group('gpuguard.io').resource('gpus').namespace(object.metadata.namespace)"
         ".name('NVIDIA-H100-80GB-HBM3').check('use')")


def test_the_request_user_is_checked_with_every_attribute() -> None:
    recording = Recording({("use", "gpus", "NVIDIA-H100-80GB-HBM3"): Decision(Verdict.ALLOW, "ok")})
    verdict = engine(f"{CHECK}.allowed() && {CHECK}.reason() == 'ok'").evaluate(
        review(), authorizer=recording)
    assert verdict.allowed, verdict.message
    [asked] = recording.asked  # the second check of the request was memoised
    assert asked == Attributes(
        Subject("alice", "u-1", ("gpu-h100", "system:authenticated"), {"team": ("ml",)}),
        "use", resource_request=True, api_group="gpuguard.io", resource="gpus",
        namespace="ml", name="NVIDIA-H100-80GB-HBM3")


def test_no_opinion_and_deny_are_not_allowed() -> None:
    for verdict in (Verdict.NO_OPINION, Verdict.DENY):
        recording = Recording({("use", "gpus", "NVIDIA-H100-80GB-HBM3"): Decision(verdict, "")})
        result = engine(f"{CHECK}.allowed()").evaluate(review(), authorizer=recording)
        assert not result.allowed
        assert [r.outcome for r in result.results] == ["fail"]


def test_request_resource_path_and_service_account() -> None:
    recording = Recording({("create", "pods", "train"): Decision(Verdict.ALLOW, ""),
                           ("get", "/healthz", ""): Decision(Verdict.ALLOW, "")})
    # two rules: three checks in one expression cost 1,050,000, past Kubernetes' PerCallLimit
    # (350,000 each; tests/core/test_cel_cost.py)
    checks = engine_for(gpu_policy("authz", {"validations": [
        {"expression": "authorizer.requestResource.check('create').allowed() && "
                       "authorizer.path('/healthz').check('get').allowed()"},
        {"expression": "!authorizer.serviceAccount('ml', 'runner').group('').resource('pods')"
                       ".check('delete').allowed()"}]}))
    assert checks.evaluate(review(), authorizer=recording).allowed
    request, path, service_account = recording.asked
    assert (request.resource, request.namespace, request.name, request.api_group) == (
        "pods", "ml", "train", "")
    assert (path.resource_request, path.path) == (False, "/healthz")
    assert service_account.subject == Subject(
        "system:serviceaccount:ml:runner",
        groups=("system:serviceaccounts", "system:serviceaccounts:ml"))


@pytest.mark.parametrize(("expression", "message"), [
    ("authorizer.path('  ').check('get').allowed()", "path must not be empty"),
    ("authorizer.group('').resource('').check('get').allowed()", "resource must not be empty"),
    ("authorizer.serviceAccount('ml', 'Bad_Name').group('').resource('pods').check('get')"
     ".allowed()", "Invalid service account name"),
    ("authorizer.serviceAccount('not@ns', 'ok').group('').resource('pods').check('get')"
     ".allowed()", "Invalid service account namespace"),
    # Go's regexp $ is the end of the text; Python's $ also matched before a final newline
    ("authorizer.serviceAccount('ml', 'runner\\n').group('').resource('pods').check('get')"
     ".allowed()", "Invalid service account name"),
    ("authorizer.serviceAccount('ml\\n', 'runner').group('').resource('pods').check('get')"
     ".allowed()", "Invalid service account namespace"),
])
def test_argument_errors_are_authz_go_texts(expression: str, message: str) -> None:
    verdict = engine(expression).evaluate(review(), authorizer=Recording({}))
    [result] = verdict.results
    assert result.outcome == "error" and message in result.message


ERRORED = Decision(Verdict.NO_OPINION, "", "subjectaccessreviews: connection refused")


def test_errored_decision_is_reported_as_kubernetes_does() -> None:
    recording = Recording({("use", "gpus", "NVIDIA-H100-80GB-HBM3"): ERRORED})
    # one check, bound: three would cost 1,050,000, past Kubernetes' PerCallLimit
    expression = (f"cel.bind(d, {CHECK}, d.errored() && !d.allowed() && "
                  f"d.error() == 'subjectaccessreviews: connection refused')")
    # the expression handles the error itself: it passes, nothing to escalate
    assert engine(expression).evaluate(review(), authorizer=recording).allowed


def test_errored_decision_follows_failure_policy() -> None:
    recording = Recording({("use", "gpus", "NVIDIA-H100-80GB-HBM3"): ERRORED})
    failing = engine(f"{CHECK}.allowed()").evaluate(review(), authorizer=recording)
    assert not failing.allowed
    [result] = failing.results
    assert result.outcome == "error"
    assert "authorizer check errored: subjectaccessreviews: connection refused" in result.message
    ignoring = engine(f"{CHECK}.allowed()", failurePolicy="Ignore").evaluate(
        review(), authorizer=recording)
    assert ignoring.allowed
    assert [r.outcome for r in ignoring.results] == ["error"]


def test_no_authorizer_never_allows() -> None:
    verdict = engine(f"{CHECK}.allowed()").evaluate(review())
    assert not verdict.allowed
    assert "this evaluation was given no authorizer" in verdict.message


def test_offline_rbac_decides_who_may_use_h100s() -> None:
    rbac = RBACAuthorizer([GPU_USER, binding("h100", None, "ClusterRole", "gpu-h100-user",
                                             group("gpu-h100"))])
    policy = engine(f"{CHECK}.allowed()")
    assert policy.evaluate(review(), authorizer=rbac).allowed
    bob = UserInfo("bob", groups=("system:authenticated",))
    denied = policy.evaluate(review(bob), authorizer=rbac)
    assert not denied.allowed and [r.outcome for r in denied.results] == ["fail"]


def test_policies_without_authorizer_are_not_bound() -> None:
    plain = engine("object.metadata.name == 'train'")
    assert not plain.uses_authorizer
    assert engine(f"{CHECK}.allowed()").uses_authorizer
    assert plain.evaluate(review()).allowed


def test_a_suite_without_rbac_files_denies_with_the_reason(tmp_path) -> None:
    """``gpuguard test``: a suite that names no ``rbac`` files cannot decide authorizer checks;
    the library's gpu-requesters (failurePolicy Fail) then denies, saying why."""
    from policies.suites import run_file
    from tests.paths import ROOT

    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: no-rbac}}
policies: [{ROOT / 'policies' / 'library' / 'gpu-requesters.yaml'}]
cases:
- name: undecidable
  resource: {ROOT / 'tests' / 'data' / 'manifests' / 'lws__vllm-gpu-leaderworkerset.yaml'}
  userInfo: {{username: alice, groups: [gpu-users]}}
  expect:
    allowed: false
    results:
    - {{policy: gpu-requesters, rule: allowed-requester, outcome: error,
       messageContains: "the suite names no rbac files"}}
""")
    [result] = run_file(str(suite))
    assert [c.status for c in result.cases] == ["pass"], result
