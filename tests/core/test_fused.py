"""Each policy's validation pass as one CEL program (policies/engine/fused.py): the same verdict as rule
by rule on every real input, and the rule-by-rule path for anything that is not plain."""

import json

import pytest
import yaml

from policies.engine.evaluation import Engine
from policies.facts.review import from_object, from_request
from policies.policy.loader import build_policy_set, load_policies
from policies.sources import Document, parse_text
from policies.vocabulary import EvaluationMode
from tests.builders.corpus import DATA, corpus_reviews, first
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV
from tests.builders.rbac import gpu_roles

LIBRARY = DATA.parent.parent / "policies" / "library"


def engines(text: str | None = None) -> tuple[Engine, Engine]:
    """(fast, reference) engines for the policies in ``text`` (default: the library)."""
    if text is None:
        loaded, errors = load_policies([str(LIBRARY)], ENV)
    else:
        docs = [Document("p.yaml", i, None, body, lines)
                for i, body, lines in parse_text("p.yaml", text, with_lines=True)]
        loaded, errors = build_policy_set(docs, ENV)
    assert errors == [], [str(e) for e in errors]
    return Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)


def gpu_policy(name: str, spec: dict) -> str:
    return yaml.safe_dump({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                           "metadata": {"name": name}, "spec": spec})


REVIEWS = list(corpus_reviews(NOW))


def test_the_library_runs_fused_except_where_the_parser_cannot_nest_it():
    fused, _ = engines()
    library = {p.name for p in fused.policies.policies
               if p.validations or p.audit_annotations}
    assert len(fused.fused_policies) >= len(library) - 2
    assert fused.fused_policies <= library


@pytest.mark.parametrize("point", ["admission", "audit"])
def test_library_verdicts_equal_rule_by_rule_on_every_corpus_input(point):
    fused, plain = engines()
    assert len(REVIEWS) > 40
    failed = 0
    for name, review in REVIEWS:
        verdict = fused.evaluate(review, point=point)
        assert verdict == plain.evaluate(review, point=point), name
        failed += any(r.outcome == "fail" for r in verdict.results)
    assert failed > 5  # the comparison covers failures and their messages, not only passes


EDGES = "---\n".join([
    gpu_policy("bool-message", {"validations": [{  # a messageExpression that is a bool
        # (dyn to the checker: a literal `true` is refused at load, as the API server does)
        "expression": "gpu.count == 0", "messageExpression": "gpu.requested"}]}),
    gpu_policy("empty-message", {"validations": [{
        "expression": "gpu.count == 0", "messageExpression": "'  '", "message": "static"}]}),
    gpu_policy("not-bool", {"validations": [{"expression": "gpu.count"}]}),
    gpu_policy("one-error", {"validations": [
        {"expression": "object.metadata.labels['missing'] == 'x'"},
        {"expression": "gpu.count >= 0"}]}),
    gpu_policy("condition-error", {
        "matchConditions": [{"name": "broken", "expression": "object.spec.missing == 1"}],
        "validations": [{"expression": "true"}]}),
    gpu_policy("condition-not-bool", {
        "matchConditions": [{"name": "count", "expression": "gpu.count"}],
        "validations": [{"expression": "true"}]}),
    gpu_policy("second-condition-false", {
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"},
                            {"name": "team", "expression": "request.namespace == 'team-a'"}],
        "validations": [{"expression": "false"}]}),
    gpu_policy("comments-and-annotations", {
        "validationActions": ["Warn", "Audit"],
        "validations": [{"expression": "gpu.count > 100 // never, so it fails",
                         "messageExpression": "'asks ' + string(gpu.count) // trailing comment"}],
        "auditAnnotations": [{"key": "gpus", "valueExpression": "string(gpu.count)"},
                             {"key": "none", "valueExpression": "null"}]}),
])


def test_results_that_are_not_plain_are_reported_rule_by_rule():
    fused, plain = engines(EDGES)
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    review = from_object(pod, now=NOW)
    verdict = fused.evaluate(review)
    assert verdict == plain.evaluate(review)
    messages = {r.policy: (r.outcome, r.message) for r in verdict.results}
    assert messages["bool-message"] == (
        "fail", "failed expression: gpu.count == 0 (messageExpression returned bool, not a "
        "string)")
    assert messages["empty-message"] == (
        "fail", "static (messageExpression returned an empty string)")
    assert messages["not-bool"] == ("error", "validations[0] returned the number 1, not a bool")
    assert [r.outcome for r in verdict.results if r.policy == "one-error"] == ["error", "pass"]
    assert messages["condition-error"][0] == "error"
    assert messages["condition-not-bool"] == (
        "error", "matchCondition 'count' returned the number 1, not a bool")
    assert messages["second-condition-false"] == ("skip", "matchCondition 'team' is false")
    assert messages["comments-and-annotations"] == ("fail", "asks 1")
    assert verdict.warning_texts == ("comments-and-annotations: asks 1",)
    assert verdict.audit_annotations["comments-and-annotations.gpus"] == "1"
    assert "comments-and-annotations.none" not in verdict.audit_annotations
    assert {"comments-and-annotations", "second-condition-false", "one-error"} <= \
        fused.fused_policies


def test_a_program_nested_past_the_parser_limit_is_evaluated_rule_by_rule():
    deep = "[" * 29 + "gpu.count" + "]" * 29 + " != []"  # the parser allows 30 levels
    fused, plain = engines(gpu_policy("deep", {
        "matchConditions": [{"name": "a", "expression": "true"}],
        "validations": [{"expression": deep}]}))
    assert fused.fused_policies == frozenset()
    review = from_object(first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml"), now=NOW)
    verdict = fused.evaluate(review)
    assert verdict == plain.evaluate(review)
    assert [r.outcome for r in verdict.results] == ["pass"]


VARIABLES = gpu_policy("variables", {
    "params": {"max": 4, "note": "quote ' and \" and \\ and /"},
    "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
    "variables": [{"name": "n", "expression": "gpu.maxPerPod.count"},
                  {"name": "over", "expression": "variables.n > params.max"},
                  {"name": "label", "expression": "object.metadata.labels['missing']"},
                  {"name": "text", "expression": "'asks ' + string(variables.n)"}],
    "validations": [{"expression": "!variables.over",
                     "messageExpression": "variables.text + params.note"},
                    {"expression": "variables.n <= params.max"},
                    {"expression": "variables.label == 'x'"}],
    "auditAnnotations": [{"key": "n", "valueExpression": "string(variables.n)"}],
})


@pytest.mark.parametrize("case", [
    "manifests/lws__vllm-gpu-leaderworkerset.yaml",       # 8 GPUs a pod: over the max
    "manifests/gpuop__cuda-vector-add-legacy-pod.yaml",   # 1 GPU
])
def test_variables_and_params_bound_once_decide_as_rule_by_rule(case):
    fused, plain = engines(VARIABLES)
    review = from_object(first(case), now=NOW)
    verdict = fused.evaluate(review)
    assert verdict == plain.evaluate(review)
    # The failing variable fails only the validation that uses it.
    assert [r.outcome for r in verdict.results][-1] == "error"


def test_default_message_names_the_expression_as_written():
    """Inlining rewrites the expression; the message must still show what the user wrote."""
    fused, plain = engines(gpu_policy("max", {"params": {"max": 0},
                                              "validations": [{"expression": "gpu.count <= "
                                                                             "params.max"}]}))
    review = from_object(first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml"), now=NOW)
    assert fused.fused_policies == {"max"}
    for engine in (fused, plain):
        assert engine.evaluate(review).message == "max: failed expression: gpu.count <= params.max"


def test_the_fast_path_is_taken_for_variables_and_params(monkeypatch):
    spec = yaml.safe_load(VARIABLES)["spec"]
    spec["validations"] = spec["validations"][:2]  # without the failing variable
    fused, plain = engines(gpu_policy("variables", spec))
    review = from_object(first("manifests/lws__vllm-gpu-leaderworkerset.yaml"), now=NOW)
    expected = plain.evaluate(review)

    def rule_by_rule(*args, **kwargs):
        raise AssertionError("the policy was evaluated rule by rule")

    monkeypatch.setattr(Engine, "_validate", rule_by_rule)
    verdict = fused.evaluate(review)
    assert verdict == expected
    assert verdict.message == "variables: asks 8quote ' and \" and \\ and /; variables: failed " \
        "expression: variables.n <= params.max"
    assert verdict.audit_annotations == {"variables.n": "8"}  # the largest pod's GPUs


@pytest.fixture
def evaluations(monkeypatch) -> list[str]:
    """The field path of every CEL evaluation from now on (``spec``: a fused program)."""
    from policies.cel.runtime import CompiledExpression

    calls: list[str] = []
    run = CompiledExpression._run

    def counting(self, activation):
        calls.append(self.field_path)
        return run(self, activation)

    monkeypatch.setattr(CompiledExpression, "_run", counting)
    return calls


def test_the_library_costs_one_evaluation_for_all_its_fused_policies(request):
    """The fused programs of the matching policies are evaluated as one list (gpu-requesters
    too, whose ten variables are bound in a few layers to fit the parser's nesting limit)."""
    fused, plain = engines()
    review = from_request(json.loads((DATA.parent.parent / "examples" / "admission" /
                                      "gpu-pod-review.json").read_text())["request"], now=NOW)
    # gpu-requesters asks the authorizer: an errored decision would send each policy on its own
    expected = plain.evaluate(review, mutate=False, authorizer=gpu_roles())
    # compiles the program of this set of policies
    fused.evaluate(review, mutate=False, authorizer=gpu_roles())
    calls = request.getfixturevalue("evaluations")
    assert fused.evaluate(review, mutate=False, authorizer=gpu_roles()) == expected
    assert not expected.allowed and len(expected.warnings) == 2
    unfused = {p.name for p in fused.policies.policies} - fused.fused_policies
    assert unfused == {"add-gpu-toleration-and-runtimeclass"}  # (mutations only)
    assert calls == ["spec"]


def test_many_policies_run_in_groups_of_sixteen(evaluations):
    """The combined program's one-off compile stays small: 40 policies, three evaluations."""
    text = "---\n".join(gpu_policy(f"p{i:02d}", {
        "validations": [{"expression": f"gpu.count <= {i}", "messageExpression":
                         f"'more than {i} GPUs: ' + string(gpu.count)"}]}) for i in range(40))
    fused, plain = engines(text)
    review = from_object(first("manifests/lws__vllm-gpu-leaderworkerset.yaml"), now=NOW)
    expected = plain.evaluate(review)
    evaluations.clear()
    verdict = fused.evaluate(review)
    assert verdict == expected
    assert verdict.denials[0].text == "p00: more than 0 GPUs: 32" and len(verdict.denials) == 32
    assert evaluations == ["spec"] * 3
