"""CEL cost limits as the API server applies them: PerCallLimit per evaluation (cel-go's
``operation cancelled: actual cost limit exceeded``), RuntimeCELCostBudget per policy (``validation
failed due to running out of cost budget, ...``), each following the policy's failurePolicy; the
estimated-cost check of GPUPolicy expressions at load; and the estimator's figures against cel-go's
cost model (k8s.io/apiserver ``pkg/apis/cel/config.go``, cel-go ``common/cost.go``)."""

from __future__ import annotations

import pytest
import yaml

from policies.cel import checked_expr, cost
from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import ITERATION_LIMIT_TEXT, CelEnvironment, CelEvaluationError
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


def _vap_with_variable(expression: str) -> str:
    """A VAP that reads the widget's items only through ``variables.items``."""
    documents = list(yaml.safe_load_all(_vap("Fail", expression)))
    documents[0]["spec"]["variables"] = [{"name": "items", "expression": "object.spec.items"}]
    return yaml.safe_dump_all(documents)


# Each costs over the per-call limit in cel-go on the widget, though the variable itself
# costs 3: cel-go charges the long list where the validation reads it. Measured with the CEL
# oracle (kube-apiserver 1.37.2's environment): 1,400 matches() 1,001,185 (cancelled), 400 of
# them 886,006; contains() on 2,600,000 characters 1,040,006 (cancelled), on 2,400,000 960,007;
# max() over 1,200,000 elements 1,200,005 (cancelled) — here 120,000 against a limit of 100,000,
# ten times faster. The estimate once took `variables` for GPU facts (512 bytes in all), so
# these were never measured and evaluated as if unlimited.
THROUGH_A_VARIABLE = [
    (f"variables.items.all(s, s.matches('{PATTERN}'))", LONG, [*LONG[:400]], None),
    ("variables.items.max() < 10", [0] * 120_000, [0] * 90_000, 100_000),
    ("!variables.items[0].contains('" + "n" * 35 + "')", ["a" * 2_600_000], ["a" * 2_400_000],
     None),
]


@pytest.mark.parametrize(("expression", "over", "within", "per_call"), THROUGH_A_VARIABLE,
                         ids=["all-matches", "max", "contains"])
def test_a_long_list_read_through_a_variable_is_held_to_the_per_call_limit(
        expression, over, within, per_call):
    environment = ENV if per_call is None else CelEnvironment(
        GPU_LIBRARY, cost.CostLimits(per_call=per_call))
    engine = _engine(_vap_with_variable(expression), environment)
    verdict = engine.evaluate(from_object(_widget(over), now=NOW))
    assert not verdict.allowed
    assert verdict.message == \
        f"p/b: expression '{expression}' resulted in error: {cost.EXCEEDED}"
    # the same expression on a list whose cost is within the limit evaluates as usual
    assert engine.evaluate(from_object(_widget(within), now=NOW)).allowed


def test_in_over_a_long_list_through_a_variable_costs_one_call_as_in_cel_go():
    """`!(7 in variables.items)` costs 7 in Kubernetes with 1,200,000 items (oracle): admitted
    by both, where gpuguard charged the list's length and denied it under Fail."""
    engine = _engine(_vap_with_variable("!(7 in variables.items)"),
                     CelEnvironment(GPU_LIBRARY, cost.CostLimits(per_call=100_000)))
    assert engine.evaluate(from_object(_widget([0] * 120_000), now=NOW)).allowed


def test_the_estimate_bounds_variables_as_request_data_not_as_gpu_facts():
    variable = ENV.compile("object.spec.items", field_path="v", written="object.spec.items")
    expression = THROUGH_A_VARIABLE[0][0]
    through = ENV.compile(expression, field_path="e", written=expression)
    direct = ENV.compile(OVER, field_path="e", written=OVER)
    assert variable.estimated_cost == 3
    assert through.estimated_cost > cost.PER_CALL_LIMIT
    assert through.estimated_cost == direct.estimated_cost - 1  # one selection less
    activation = ENV.activation({"object": _widget(LONG)}, [("items", variable)])
    # over the per-call limit, plus the variable's own 3, charged once per request
    assert activation.cost(through) == cost.PER_CALL_LIMIT + 1 + 3
    assert activation.cost(through) == cost.PER_CALL_LIMIT + 1


def test_a_variables_cost_counts_in_its_policys_budget():
    """Kubernetes' composition context reports a variable's cost into the policy's
    RuntimeCELCostBudget when the variable is first evaluated: a variable of about 884,000
    (filter over 400 strings) read by the first validation leaves too little for the second
    one's 884,000 under a budget of 1,000,000."""
    documents = list(yaml.safe_load_all(_vap("Fail", "size(variables.matching) >= 0", OVER)))
    documents[0]["spec"]["variables"] = [
        {"name": "matching", "expression": f"object.spec.items.filter(s, s.matches('{PATTERN}'))"}]
    environment = CelEnvironment(GPU_LIBRARY, cost.CostLimits(per_policy=1_000_000))
    verdict = _engine(yaml.safe_dump_all(documents), environment).evaluate(
        from_object(_widget(["a" * 2000] * 400), now=NOW))
    assert not verdict.allowed
    assert cost.OUT_OF_BUDGET in verdict.message
    assert [r.outcome for r in verdict.results if r.policy == "p/b"] == [
        RuleOutcome.PASS, RuleOutcome.ERROR]


def test_evaluate_outside_an_engine_checks_the_limit_too():
    compiled = ENV.compile(OVER, field_path="x", written=OVER)
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


# The calibration object and cel-go's actual cost of each expression on it, recorded from the
# tier's CEL oracle (tests/controlplane/kube/celoracle, k8s.io/apiserver 1.37.2; the live
# comparison is tests/controlplane/test_cel_cost_live.py). "exact": gpuguard counts the same;
# otherwise cel-go short-circuits (exists, ?:) or folds a constant, and gpuguard counts more.
CALIBRATION = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "pod-1", "namespace": "default", "labels": {"a": "b", "team": "x"}},
    "spec": {"containers": [{"name": f"c{i}", "image": "nvidia/cuda:12" * (i + 1),
                             "env": [{"name": f"E{j}", "value": "v" * j} for j in range(i)],
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                            for i in range(5)],
             "items": ["a" * 50] * 20}}
ORACLE_COSTS = [
    ("1 + 2 == 3", 2, True),
    ("object.metadata.name == 'pod-1'", 4, True),
    ("object.metadata.name.matches('^pod-[0-9]+$')", 6, True),
    ("has(object.spec.containers)", 2, True),
    ("object.spec.containers.all(c, c.name.startsWith('c'))", 34, True),
    ("object.spec.containers.map(c, c.name).join(',')", 77, True),
    ("object.spec.containers.all(c, c.env.all(e, e.value.size() < 10))", 104, True),
    ("object.spec.items.all(s, s.matches('^a+$'))", 204, True),
    ("object.spec.containers.map(c, c.image).all(i, i.contains('cuda'))", 118, True),
    ("object.metadata.labels.all(k, v, v.size() > 0)", 16, True),
    ("lists.range(100).all(i, i >= 0)", 612, True),
    ("object.spec.items.isSorted()", 103, True),
    ("object.spec.items.join('').size() > 0", 205, True),
    ("sets.equivalent(object.spec.items, object.spec.items)", 807, True),
    ("object.spec.items.distinct().size()", 855, True),
    ("authorizer.group('').resource('pods').check('get').allowed()", 350_004, False),
    ("object.spec.containers.exists(c, c.name == 'c3')", 35, False),
    ("object.spec.containers.filter(c, c.name != 'c1')", 71, False),
    ("object.spec.containers.size() > 1 ? object.metadata.name : 'x'", 7, False),
    # `in` is one call whatever the container's size (cel-go measures 2 for 0 and for 100,000
    # elements; gpuguard charged the list's length, and denied what Kubernetes admits)
    ("7 in object.spec.items", 4, True),
    ("'a' in object.metadata.labels", 4, True),
]


@pytest.mark.parametrize(("expression", "expected", "exact"), ORACLE_COSTS,
                         ids=[case[0] for case in ORACLE_COSTS])
def test_runtime_cost_against_cel_gos_actual_cost(expression, expected, exact):
    compiled = ENV.compile(expression, field_path="x")
    tree = checked_expr.checked_ast(compiled._program.serialize())
    measured = cost.runtime_cost(tree, {"object": CALIBRATION})
    assert measured is not None
    if exact:
        assert measured == expected
    else:
        assert expected <= measured <= 2 * expected + 20


def test_three_authorizer_checks_pass_the_per_call_limit_as_in_kubernetes():
    """Kubernetes charges 350,000 per ``check()`` ("two authorization checks per expression"):
    the oracle answers ``operation cancelled: actual cost limit exceeded`` for three; two pass.
    The checks are counted as made (the authorizer here allows everything)."""
    from policies.authorization import Decision, Verdict

    class Allowing:
        def authorize(self, attributes):
            return Decision(Verdict.ALLOW, "")

    def verdict(names: str):
        expression = (f"[{names}].all(x, authorizer.group('').resource('pods').name(x)"
                      ".check('get').allowed())")
        return _engine(_vap("Fail", expression)).evaluate(
            from_object(_widget(["a"]), now=NOW), authorizer=Allowing())

    over = verdict("'a', 'b', 'c'")
    assert not over.allowed and cost.EXCEEDED in over.message
    assert verdict("'a', 'b'").allowed


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
            tree = checked_expr.checked_ast(rule.expression._program.serialize())
            measured = cost.runtime_cost(tree, {"object": pod})
            assert measured is not None and measured <= rule.expression.estimated_cost


def test_cost_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="per_call must be at least 1"):
        cost.CostLimits(per_call=0)


def test_the_runtimes_iteration_limit_is_named_as_gpuguards_under_both_failure_policies():
    """12,000 items cost 60,004 in Kubernetes (oracle): it admits the widget; gpuguard's
    runtime stops at 10,000 iterations, the policy's failurePolicy decides and the message says
    it is gpuguard's limit (docs/cel.md 'Limits', docs/compatibility.md)."""
    expression = "object.spec.items.all(x, x >= 0)"
    widget = from_object(_widget(list(range(12_000))), now=NOW)
    denied = _engine(_vap("Fail", expression)).evaluate(widget)
    assert not denied.allowed
    assert denied.message == \
        f"p/b: expression '{expression}' resulted in error: {ITERATION_LIMIT_TEXT}"
    assert "gpuguard's CEL runtime" in denied.message
    admitted = _engine(_vap("Ignore", expression)).evaluate(widget)
    assert admitted.allowed
    [result] = [r for r in admitted.results if r.policy == "p/b"]
    assert result.outcome == RuleOutcome.ERROR and result.message.endswith(ITERATION_LIMIT_TEXT)
    # under the budget both agree: 9,999 items pass
    assert _engine(_vap("Fail", expression)).evaluate(
        from_object(_widget(list(range(9_999))), now=NOW)).allowed
