"""CEL cost limits as the API server applies them: PerCallLimit per evaluation (cel-go's
``operation cancelled: actual cost limit exceeded``), RuntimeCELCostBudget per policy (``validation
failed due to running out of cost budget, ...``), each following the policy's failurePolicy; the
estimated-cost check of GPUPolicy expressions at load; and the estimator's figures against cel-go's
cost model (k8s.io/apiserver ``pkg/apis/cel/config.go``, cel-go ``common/cost.go``)."""

from __future__ import annotations

import pytest
import yaml

from policies.cel import cost
from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import CelEnvironment, CelEvaluationError
from policies.engine.evaluation import Engine, RuleOutcome
from policies.facts.review import from_object
from policies.policy.loader import build_policy_set
from policies.sources import Document, parse_text
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV

# 1,400 strings of 2,000 'a' (2.8 MB, within the API server's 3 MiB request limit): each
# matches() of the 41-byte pattern costs ceil(1 + 2000 * 0.1) * ceil(41 * 0.25) = 2,211 in
# cel-go's model, 1,400 of them about 3,100,000: over PerCallLimit, under the iteration budget.
PATTERN = "^a+$|^" + "z" * 34 + "$"
LONG = ["a" * 2000] * 1400
OVER = f"object.spec.items.all(s, s.matches('{PATTERN}'))"
RULE = {"apiGroups": ["example.com"], "apiVersions": ["v1"], "operations": ["CREATE"],
        "resources": ["widgets"]}


def _widget(items: list[str]) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default"}, "spec": {"items": items}}


def _vap(failure_policy: str, *expressions: str) -> str:
    return yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "p"},
         "spec": {"failurePolicy": failure_policy, "matchConstraints": {"resourceRules": [RULE]},
                  "validations": [{"expression": e} for e in expressions]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"},
         "spec": {"policyName": "p", "validationActions": ["Deny"]}}])


def _load(text: str, environment: CelEnvironment = ENV) -> tuple[Engine | None, list[str]]:
    documents = [Document("policy.yaml", i, None, body, lines)
                 for i, body, lines in parse_text("policy.yaml", text, with_lines=True)]
    policy_set, errors = build_policy_set(documents, environment)
    if errors:
        return None, [str(e) for e in errors]
    return Engine(policy_set, environment), []


def _engine(text: str, environment: CelEnvironment = ENV) -> Engine:
    engine, errors = _load(text, environment)
    assert engine is not None, errors
    return engine


def test_a_vap_is_not_refused_by_its_estimate_only_by_its_runtime_cost():
    """Kubernetes has no estimated-cost refusal for a VAP (everything is dyn there); the
    expression loads, and a small list evaluates as usual."""
    engine = _engine(_vap("Fail", OVER))
    verdict = engine.evaluate(from_object(_widget(["aaa", "a"]), now=NOW))
    assert verdict.allowed, verdict.message
    verdict = engine.evaluate(from_object(_widget(["aaa", "ab"]), now=NOW))
    assert not verdict.allowed
    assert verdict.message == f"p/b: failed expression: {OVER}"


def test_per_call_limit_exceeded_denies_under_fail_with_cel_gos_text():
    verdict = _engine(_vap("Fail", OVER)).evaluate(from_object(_widget(LONG), now=NOW))
    assert not verdict.allowed
    assert cost.EXCEEDED == "operation cancelled: actual cost limit exceeded"
    assert cost.EXCEEDED in verdict.message
    [result] = [r for r in verdict.results if r.policy == "p/b"]
    assert result.outcome == RuleOutcome.ERROR


def test_per_call_limit_exceeded_is_allowed_and_reported_under_ignore():
    verdict = _engine(_vap("Ignore", OVER)).evaluate(from_object(_widget(LONG), now=NOW))
    assert verdict.allowed
    [result] = [r for r in verdict.results if r.policy == "p/b"]
    assert result.outcome == RuleOutcome.ERROR and cost.EXCEEDED in result.message
    assert result.actions == ()


def test_the_per_call_limit_is_configurable():
    """A higher per-call limit lets the same evaluation run (it is then a plain failure)."""
    generous = CelEnvironment(GPU_LIBRARY, cost.CostLimits(per_call=5_000_000))
    verdict = _engine(_vap("Fail", OVER), generous).evaluate(
        from_object(_widget([*LONG[:-1], "b"]), now=NOW))
    assert not verdict.allowed and verdict.message == f"p/b: failed expression: {OVER}"


def test_runtime_budget_per_policy_stops_the_policy_with_the_api_servers_text():
    """Expressions of about 884,000 each (400 strings) fit the per-call limit; two together
    pass a per-policy budget of 1,000,000: the second is not run, the policy fails under Fail."""
    third = ["a" * 2000] * 400
    expression = OVER
    limits = cost.CostLimits(per_policy=1_000_000)
    environment = CelEnvironment(GPU_LIBRARY, limits)
    engine = _engine(_vap("Fail", expression, expression + " && true",
                          expression + " || false"), environment)
    verdict = engine.evaluate(from_object(_widget(third), now=NOW))
    assert not verdict.allowed
    assert cost.OUT_OF_BUDGET in verdict.message
    outcomes = [r.outcome for r in verdict.results if r.policy == "p/b"]
    assert outcomes == [RuleOutcome.PASS, RuleOutcome.ERROR]
    ignored = _engine(_vap("Ignore", expression, expression + " && true",
                           expression + " || false"), environment)
    assert ignored.evaluate(from_object(_widget(third), now=NOW)).allowed


def test_evaluate_outside_an_engine_checks_the_limit_too():
    compiled = ENV.compile(OVER, field_path="x")
    with pytest.raises(CelEvaluationError) as caught:
        compiled.evaluate({"object": _widget(LONG)})
    assert caught.value.message == cost.EXCEEDED and caught.value.code == "RESOURCE_EXHAUSTED"
    assert compiled.evaluate({"object": _widget(["a"])}) is True


def _gpu_policy(expression: str) -> str:
    return yaml.safe_dump({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                           "metadata": {"name": "big"},
                           "spec": {"validations": [{"name": "every-pair",
                                                     "expression": expression}]}})


def test_a_gpu_policy_over_the_estimated_limit_is_refused_at_load_naming_file_and_rule():
    strict = CelEnvironment(GPU_LIBRARY, cost.CostLimits(estimated=cost.ESTIMATED_LIMIT))
    expression = ("object.spec.containers.all(c, object.spec.volumes.all(v, "
                  "c.name + v.name != object.metadata.name))")
    engine, errors = _load(_gpu_policy(expression), strict)
    assert engine is None
    [error] = errors
    assert error.startswith("policy.yaml:")
    assert "spec.validations[0].expression: estimated rule cost exceeds budget by factor of" \
        in error and "limit 10,000,000" in error
    # the same file as a VAP loads: Kubernetes refuses neither by estimate
    assert _load(_vap("Fail", expression), strict)[0] is not None
    # and a rule over a part of each element is estimated once for all elements together
    assert _load(_gpu_policy("object.spec.containers.all(c, c.env.all(e, e.name != ''))"),
                 strict)[0] is not None


@pytest.mark.parametrize(("expression", "expected"), [
    ("1 + 2 == 3", 1),  # constants 0, each call 1, equality of scalars ceil(1 * 0.1)
    ("object.metadata.name", 3),  # ident 1, two selections
    ("[1, 2, 3].exists(x, x > 2)", 25),
])
def test_costs_of_small_expressions_follow_cel_gos_constants(expression, expected):
    compiled = ENV.compile(expression, field_path="x")
    tree = cost.checked_ast(compiled._program.serialize())
    measured = cost.runtime_cost(tree, {"object": {"metadata": {"name": "n"}}})
    assert measured is not None and measured >= expected - 1
    assert measured <= compiled.estimated_cost


def test_runtime_cost_never_exceeds_the_estimate_on_the_built_in_policies_examples():
    """The estimate is a worst case: on real objects every expression costs at most that."""
    from gpuguard.policy_set import load
    from policies.facts.resource_names import DEFAULT_SETTINGS
    from tests.paths import TESTS

    loaded = load(None, DEFAULT_SETTINGS)
    assert loaded.errors == ()
    pod = yaml.safe_load((TESTS / "data" / "manifests").glob("*.yaml").__next__().read_text())
    for policy in loaded.engine.policies.policies:
        for rule in (*policy.validations, *policy.match_conditions):
            tree = cost.checked_ast(rule.expression._program.serialize())
            measured = cost.runtime_cost(tree, {"object": pod})
            assert measured is not None and measured <= rule.expression.estimated_cost


def test_cost_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="per_call must be at least 1"):
        cost.CostLimits(per_call=0)
