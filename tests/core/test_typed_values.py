"""Typed values: outcomes, actions, failure policies, points and endpoints are enum members that
are still the API's strings, and what users read (JSON, YAML, messages) is unchanged."""

import json

import yaml

from policies.engine.evaluation import RuleOutcome, Violation
from policies.facts.review import from_object
from policies.policy.quota import parse_quota
from policies.vocabulary import EvaluationPoint, FailurePolicy, ValidationAction
from tests.builders.corpus import first
from tests.core.test_engine import NOW, engine_for, gpu_policy
from webhook.admission import ENDPOINTS, Endpoint

WARN_AUDIT = gpu_policy("max-two", {
    "validationActions": ["Warn", "Audit"], "failurePolicy": "Ignore",
    "validations": [{"expression": "gpu.maxPerPod.count <= 2", "message": "too many GPUs"}],
})


def test_loaded_policy_fields_are_members_equal_to_the_api_words():
    policy = engine_for(WARN_AUDIT).policies.policies[0]
    assert policy.actions == (ValidationAction.WARN, ValidationAction.AUDIT)
    assert all(type(a) is ValidationAction for a in policy.actions)
    assert policy.failure_policy is FailurePolicy.IGNORE and policy.failure_policy == "Ignore"
    quota, errors = parse_quota({"metadata": {"name": "q"}, "spec": {
        "scope": {"namespace": "a"}, "limits": {"gpuEquivalents": 1}}})
    assert errors == [] and quota is not None and quota.failure_policy is FailurePolicy.FAIL


def test_rule_results_write_the_same_json_and_yaml_as_plain_strings():
    lws = first("manifests/lws__vllm-gpu-leaderworkerset.yaml")
    verdict = engine_for(WARN_AUDIT).evaluate(from_object(lws, now=NOW),
                                              point=EvaluationPoint.AUDIT)
    result = verdict.results[0]
    assert result.outcome is RuleOutcome.FAIL and result.outcome == "fail"
    data = result.to_dict()
    assert json.loads(json.dumps(data))["outcome"] == "fail"
    # YAML's safe dumper refuses enum members: the dict view holds plain strings.
    assert yaml.safe_load(yaml.safe_dump(data)) == {
        "policy": "max-two", "rule": "validations[0]", "path": "spec.validations[0].expression",
        "outcome": "fail", "message": "too many GPUs", "actions": ["Warn", "Audit"]}


def test_endpoints_are_the_url_paths():
    assert [f"/{endpoint}" for endpoint in ENDPOINTS] == ["/validate", "/mutate"]
    assert Endpoint("mutate") is Endpoint.MUTATE


def test_denials_and_warnings_are_records_and_read_as_before():
    deny = gpu_policy("no-big", {"validations": [
        {"name": "count", "expression": "gpu.maxPerPod.count <= 4", "reason": "Invalid",
         "messageExpression": "'asks: ' + string(gpu.maxPerPod.count)"}]})
    lws = first("manifests/lws__vllm-gpu-leaderworkerset.yaml")
    verdict = engine_for(deny + "---\n" + WARN_AUDIT).evaluate(from_object(lws, now=NOW))
    assert verdict.denials == (Violation("no-big", "count", "asks: 8", "Invalid"),)
    assert verdict.warnings == (Violation("max-two", "validations[0]", "too many GPUs"),)
    # What users read is unchanged: "policy: message", joined by "; ".
    assert verdict.message == "no-big: asks: 8"
    assert verdict.warning_texts == ("max-two: too many GPUs",)
    assert verdict.reason == "Invalid" and verdict.denied_by == ("no-big",)
