"""Policies compiled once for evaluation (policies/engine/compiled.py): the fast mode decides, says
and patches exactly as the reference mode, which evaluates every policy as written."""


import pytest
import yaml

from policies.engine.evaluation import Engine
from policies.facts.review import from_object
from policies.policy.loader import build_policy_set, load_policies
from policies.sources import Document, library_path, parse_text
from policies.vocabulary import EvaluationMode, EvaluationPoint
from tests.builders.corpus import DATA, corpus_reviews, first
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV

REVIEWS = list(corpus_reviews(NOW))
POD = "manifests/gpuop__cuda-vector-add-legacy-pod.yaml"

# Policy sets of the corpus: the built-in library, its native (VAP / MAP with bindings and
# params) twin, and the native and GPUPolicy files the other tests load.
POLICY_SETS = {
    "library": [str(library_path())],
    "native-library": [str(DATA / "native-admission" / "library")],
    "native-others": [str(DATA / "native-admission" / "gpu-count-audit.yaml"),
                      str(DATA / "native-admission" / "runtime-errors.yaml"),
                      str(DATA / "native-admission" / "k8sdocs")],
    "audit": [str(DATA / "audit" / "policies.yaml"), str(DATA / "audit" / "warn-only.yaml")],
}


def both(paths):
    """(fast, reference) engines over the policies of ``paths`` that load."""
    loaded, _ = load_policies(paths, ENV)
    assert loaded.policies
    return Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)


def policy_set(*specs):
    text = "---\n".join(yaml.safe_dump({
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
        "metadata": {"name": f"p{index}"}, "spec": spec}) for index, spec in enumerate(specs))
    documents = [Document("p.yaml", i, None, b, lines)
                 for i, b, lines in parse_text("p.yaml", text, with_lines=True)]
    loaded, errors = build_policy_set(documents, ENV)
    assert errors == [], [str(e) for e in errors]
    return loaded


def results(engine, review):
    return [(r.outcome, r.message) for r in engine.evaluate(review).results]


# What each set's comparison covers on the corpus (so no comparison is of passes alone).
EXERCISES = {
    "library": {"fail", "mutate", "skip", "patch"},
    "native-library": {"fail", "mutate", "skip", "patch", "warning"},
    "native-others": {"error", "audit-annotation"},
    "audit": {"fail", "warning", "audit-annotation"},
}
ADMISSION_ONLY = {"patch", "warning", "audit-annotation"}


@pytest.mark.parametrize("name", sorted(POLICY_SETS))
@pytest.mark.parametrize("point", list(EvaluationPoint))
def test_fast_and_reference_agree_on_every_corpus_input(name, point):
    """Verdicts, results and messages, denials, warnings, audit annotations, patches and the
    final object: all of Verdict, compared whole."""
    fast, reference = both(POLICY_SETS[name])
    covered: set[str] = set()
    for case, review in REVIEWS:
        verdict = fast.evaluate(review, point=point)
        assert verdict == reference.evaluate(review, point=point), case
        covered |= {str(r.outcome) for r in verdict.results}
        covered |= {feature for feature, present in (
            ("patch", verdict.patch), ("warning", verdict.warnings),
            ("audit-annotation", verdict.audit_annotations)) if present}
    expected = EXERCISES[name] if point == EvaluationPoint.ADMISSION else \
        EXERCISES[name] - ADMISSION_ONLY
    assert expected <= covered


def test_the_corpus_runs_the_fast_path_in_fast_mode_only():
    """The comparison above is between two different paths, not one path twice."""
    fast, reference = both(POLICY_SETS["library"])
    assert len(fast.fused_policies) == 10  # all but the mutations-only policy
    inlined = [c for c in fast.compiled if c.inlined is not c.written]
    assert len(inlined) == 11
    assert any(c.policy.mutations for c in inlined)  # mutations with variables: inlined
    assert all(c.inlined.policy.variables == () for c in inlined)
    assert reference.fused_policies == frozenset()
    assert all(c.inlined is c.written and c.fused is None for c in reference.compiled)
    assert all(c.written.activation is None and not any(c.written.request_only)
               for c in reference.compiled)
    assert fast.policies is reference.policies  # both expose the set as written


def test_a_false_condition_before_an_erroring_one_skips_the_policy():
    """matchConditions run in the order written in both modes. The fast path used to run the
    ones reading only the request first, so an error in the second condition won over the
    first one being false (an error under failurePolicy Fail: a denial)."""
    loaded = policy_set({
        "params": {"max": 1},
        "matchConditions": [{"name": "big", "expression": "params.max > 5"},
                            {"name": "broken", "expression": "object.spec.missing == 1"}],
        "validations": [{"expression": "false"}]})
    review = from_object(first(POD), now=NOW)
    fast, reference = Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)
    assert results(fast, review) == [("skip", "matchCondition 'big' is false")]
    assert fast.evaluate(review) == reference.evaluate(review)
    assert fast.evaluate(review).allowed


def test_params_cel_cannot_hold_are_an_error_that_names_them():
    """Params that fail CEL's check (``.inf``) used to become null silently, so the policy
    failed with an unrelated runtime message."""
    loaded = policy_set({"params": {"max": float("inf")},
                         "validations": [{"expression": "gpu.count <= params.max"}]})
    review = from_object(first(POD), now=NOW)
    fast, reference = Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)
    verdict = fast.evaluate(review)
    assert verdict == reference.evaluate(review)
    assert [(r.outcome, r.rule, r.path) for r in verdict.results] == [
        ("error", "params", "spec.params")]
    assert verdict.message == "p0: the params cannot be evaluated in CEL: params.max: number " \
        "out of the range of a double (inf)"
    assert not verdict.allowed  # failurePolicy Fail


MUTATING = {
    "params": {"runtime": "nvidia"},
    "matchConditions": [{"name": "gpu", "expression": "variables.wants"}],
    "variables": [{"name": "wants", "expression": "gpu.requested"},
                  {"name": "label", "expression": "object.metadata.labels['missing']"}],
    "mutations": [
        {"name": "runtime", "expression":
         "[{'op': 'add', 'path': '/spec/runtimeClassName', 'value': params.runtime}]"},
        {"name": "broken", "condition": "variables.label == 'x'",
         "expression": "[{'op': 'add', 'path': '/metadata/x', 'value': 'y'}]"},
    ],
    "validations": [{"expression": "!has(object.spec.runtimeClassName)"}],
}


def test_mutations_with_params_and_a_failing_variable_agree_with_the_reference():
    loaded = policy_set(MUTATING, {**MUTATING, "mutations": MUTATING["mutations"][:1]})
    review = from_object(first(POD), now=NOW)
    fast, reference = Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)
    assert all(c.inlined is not c.written for c in fast.compiled)  # the fast path is taken
    verdict = fast.evaluate(review)
    assert verdict == reference.evaluate(review)
    # p0's failed pass keeps none of its changes; p1 adds the runtime class, so both fail.
    assert [(r.policy, r.outcome) for r in verdict.results] == [
        ("p0", "mutate"), ("p0", "error"), ("p1", "mutate"), ("p0", "fail"), ("p1", "fail")]
    # The error names the variable, as evaluated as written (the inlined form's error did not).
    assert verdict.results[1].message.startswith(
        "mutation 'broken' failed: variables.label: ")
    assert verdict.patch == ({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"},)


def test_the_default_message_is_the_expression_as_written_in_every_path():
    """One rule (policies/engine/messages.py) for the fused program, the rule-by-rule pass and
    the reference; an inlined policy still shows what the user wrote."""
    loaded = policy_set(
        {"params": {"max": 0}, "variables": [{"name": "n", "expression": "gpu.count"}],
         "validations": [{"expression": "variables.n <= params.max"}]},
        {"validations": [{"expression": "gpu.count <= 0 ",  # rule by rule: an empty message
                          "messageExpression": "''"}]})
    review = from_object(first(POD), now=NOW)
    fast, reference = Engine(loaded, ENV), Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)
    assert fast.fused_policies == {"p0", "p1"}
    for engine in (fast, reference):
        assert [d.text for d in engine.evaluate(review).denials] == [
            "p0: failed expression: variables.n <= params.max",
            "p1: failed expression: gpu.count <= 0 (messageExpression returned an empty string)"]
