"""Variables and params compiled into expressions (policies/engine/inlining.py): same decisions, fewer
activations, and a safe fallback."""

import pytest
import yaml

from policies.engine.evaluation import Engine
from policies.engine.inlining import cel_literal, inline_policy
from policies.facts.review import from_object
from policies.policy.loader import build_policy_set, load_policies
from policies.sources import Document, library_path, parse_text
from policies.vocabulary import EvaluationMode
from tests.builders.corpus import first
from tests.builders.environment import ENV


def policy_set(spec):
    text = yaml.safe_dump({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                           "metadata": {"name": "p"}, "spec": spec})
    documents = [Document("p.yaml", i, None, b, lines)
                 for i, b, lines in parse_text("p.yaml", text, with_lines=True)]
    loaded, errors = build_policy_set(documents, ENV)
    assert errors == []
    return loaded


SPEC = {
    "params": {"max": 4, "label": "team", "note": "quote ' and \" and \\ and /"},
    "variables": [{"name": "n", "expression": "gpu.maxPerPod.count"},
                  {"name": "over", "expression": "variables.n > params.max"},
                  {"name": "broken", "expression": "object.metadata.labels['missing']"}],
    "validations": [{"expression": "!variables.over",
                     "messageExpression": "'pod asks ' + string(variables.n) + ' > ' + "
                                          "string(params.max) + params.note"}],
}


def test_inlined_policy_decides_as_the_original():
    loaded = policy_set({**SPEC, "matchConditions": [{"name": "asks",
                                                      "expression": "variables.n > 0"}]})
    engine = Engine(loaded, ENV)
    [compiled] = engine.compiled
    inlined = compiled.inlined.policy
    assert inlined.variables == () and inlined.params is None
    assert "cel.bind(__var_n" in inlined.match_conditions[0].expression.expression
    # Validations run as the fused program built from the policy as written, not rewritten.
    assert inlined.validations == () and compiled.fused is not None
    assert engine.policies is loaded  # what lint, reports and the webhook read: as written
    lws = first("manifests/lws__vllm-gpu-leaderworkerset.yaml")
    review = from_object(lws)
    verdict = engine.evaluate(review)
    assert verdict.message == "p: pod asks 8 > 4quote ' and \" and \\ and /"
    assert verdict == written_engine(loaded).evaluate(review)


def test_a_failing_variable_fails_only_what_uses_it():
    spec = {**SPEC, "validations": [{"expression": "variables.broken == 'x'"},
                                    {"expression": "variables.n >= 0"}]}
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    verdict = Engine(policy_set(spec), ENV).evaluate(from_object(pod))
    assert [r.outcome for r in verdict.results] == ["error", "pass"]


@pytest.mark.parametrize("expression", [
    "variables['n'] > 0",          # indexing the variables map
    "has(variables.n)",            # has() needs a field selection
    "size(variables) > 0",         # the whole map
])
def test_policies_that_cannot_be_rewritten_keep_the_regular_path(expression):
    spec = {**SPEC, "validations": [{"expression": expression}]}
    [original] = policy_set(spec).policies
    assert inline_policy(original, ENV) is original


@pytest.mark.parametrize(("value", "literal"), [
    ({"a": [1, "x", None, True, 2.5]}, '{"a": [1, "x", null, true, 2.5]}'),
    ("new\nline", '"new\\nline"'),
])
def test_cel_literals(value, literal):
    assert cel_literal(value) == literal
    assert ENV.compile(f"{literal} == {literal}", field_path="t").evaluate({}) is True


def _library():
    loaded, errors = load_policies([library_path()], ENV)
    assert errors == []
    return loaded


@pytest.mark.parametrize("name", [p.name for p in _library().policies])
def test_every_library_policy_is_inlined(name):
    [original] = [p for p in _library().policies if p.name == name]
    inlined = inline_policy(original, ENV)
    assert inlined.variables == () and inlined.params is None


def test_gpu_requests_equal_limits_is_inlined_and_decides_as_before():
    # It used to walk ``object`` with 10 levels of optional indexing in a variable, past the
    # parser's nesting limit once inlined; it now reads gpu.resourceProblems.
    loaded = _library()
    [original] = [p for p in loaded.policies if p.name == "gpu-requests-equal-limits"]
    assert original.variables == ()
    [inlined] = [c.inlined.policy for c in Engine(loaded, ENV).compiled
                 if c.policy.name == "gpu-requests-equal-limits"]
    assert inlined.variables == () and inlined.params is None
    ollama = first("manifests/imroc__ollama-statefulset-gpu-requests-only.yaml")
    verdict = Engine(loaded, ENV).evaluate(from_object(ollama))
    assert [d.text for d in verdict.denials if d.policy == "gpu-requests-equal-limits"] == [
        "gpu-requests-equal-limits: container 'ollama' (spec.template.spec.containers[0]): "
        "nvidia.com/gpu requests 1, limits not set: an extended resource needs a limit; a "
        "request without a limit is rejected by the API server. Put GPUs in resources.limits "
        "(the request then defaults to the limit); if you also set resources.requests it must "
        "equal the limit, as a whole number, under a current resource name (nvidia.com/gpu, not "
        "alpha.kubernetes.io/nvidia-gpu).",
    ]


def written_engine(loaded):
    """The reference: the policies evaluated as written (no inlining, no fused programs)."""
    return Engine(loaded, ENV, mode=EvaluationMode.REFERENCE)


POD = "manifests/gpuop__cuda-vector-add-legacy-pod.yaml"


@pytest.mark.parametrize("spec", [
    # A quote inside a comment opens no string: variables.b after it is still code.
    {"variables": [{"name": "a", "expression": "gpu.count"},
                   {"name": "b", "expression": "object.metadata.name"}],
     "validations": [{"expression": "variables.a < 0 // see '''docs\n"
                                    "|| variables.b != ''' # '''", "message": "static"}]},
    # Trailing comments must not swallow the parentheses inlining adds after them.
    {"params": {"max": 4},
     "variables": [{"name": "n", "expression": "gpu.count // devices"}],
     "validations": [{"expression": "variables.n <= params.max // the cap",
                      "messageExpression": "'asks ' + string(variables.n) // why"}]},
    # Characters past U+FFFF in params (JSON would write surrogate pairs CEL refuses).
    {"params": {"note": "GPU \U0001F680 quota"},
     "validations": [{"expression": "gpu.count > 100", "messageExpression": "params.note"}]},
])
def test_comments_and_unicode_are_inlined_and_decide_as_written(spec):
    loaded = policy_set(spec)
    engine = Engine(loaded, ENV)
    [compiled] = engine.compiled
    assert compiled.inlined.policy.variables == () and compiled.inlined.policy.params is None
    review = from_object(first(POD))
    assert engine.evaluate(review) == written_engine(loaded).evaluate(review)


def test_emoji_param_reaches_the_message():
    spec = {"params": {"note": "GPU \U0001F680 quota"},
            "validations": [{"expression": "gpu.count > 100", "messageExpression": "params.note"}]}
    assert Engine(policy_set(spec), ENV).evaluate(from_object(first(POD))).message == \
        "p: GPU \U0001F680 quota"


def test_an_inlined_pass_with_an_error_is_redone_as_written():
    """Variables keep their own iteration budget and errors name the variable, as when the
    policy is evaluated as written (the API server's way)."""
    numbers = "[" + ", ".join(str(i) for i in range(95)) + "]"
    budget = {"variables": [{"name": "v", "expression":  # 9,120 iterations
                             f"{numbers}.map(x, {numbers}.map(y, y)).size()"}],
              "validations": [{"expression": f"variables.v > 0 && {numbers}.all(z, z >= 0)"}]}
    loaded = policy_set(budget)
    review = from_object(first(POD))
    verdict = Engine(loaded, ENV).evaluate(review)
    assert verdict == written_engine(loaded).evaluate(review)
    assert verdict.allowed and [r.outcome for r in verdict.results] == ["pass"]
    failing = {"variables": [{"name": "label", "expression":
                              "object.metadata.labels['missing']"}],
               "validations": [{"expression": "variables.label == 'x'"}]}
    loaded = policy_set(failing)
    verdict = Engine(loaded, ENV).evaluate(review)
    assert verdict == written_engine(loaded).evaluate(review)
    assert verdict.results[0].message.startswith(
        "validations[0] failed to evaluate: variables.label: ")
