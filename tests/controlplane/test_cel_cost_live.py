"""CEL cost limits against Kubernetes' own: the ``celoracle`` (cel-go's actual cost in the VAP
environment of k8s.io/apiserver 1.37) and a real kube-apiserver running a
ValidatingAdmissionPolicy past ``PerCallLimit``, beside gpuguard's engine on the same file.

gpuguard's runtime cost is measured on the AST (policies/cel/cost.py): it must never be below
cel-go's actual cost, equal it where cel-go neither short-circuits nor folds a constant, and
the same expressions must pass the per-call limit on both sides (docs/cel.md "Cost").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.cel import checked_expr, cost
from policies.engine.evaluation import Engine
from policies.facts.review import from_object
from policies.policy.loader import build_policy_set
from policies.sources import Document, parse_text
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.environment import ENV
from tests.controlplane.admission_differential import ApiServer, Probe, admin
from tests.controlplane.celoracle import CelOracle
from tests.controlplane.cluster import ControlPlane
from tests.core.test_cel_cost import CALIBRATION, ORACLE_COSTS

# Long strings in a ConfigMap (its data stays under the 1 MiB object limit): each matches() of
# the 401-byte pattern on a 1,000-character value costs ceil(1001 * 0.1) * ceil(401 * 0.25) =
# 10,201; 100 values 1,020,100, past PerCallLimit; 90 values 918,090, within it.
PATTERN = "^a+$|^" + "z" * 394 + "$"
EXPRESSION = f"object.data.all(k, v, v.matches('{PATTERN}'))"


@pytest.fixture(scope="module")
def oracle(control_plane_bin: Path) -> Iterator[CelOracle]:
    with CelOracle(control_plane_bin / "celoracle") as running:
        yield running


def _gpuguard_cost(expression: str, data: dict[str, Any]) -> int | None:
    compiled = ENV.compile(expression, field_path="x")
    return cost.runtime_cost(checked_expr.checked_ast(compiled._program.serialize()), data)


def test_runtime_cost_is_never_below_cel_gos(oracle: CelOracle) -> None:
    """The recorded figures of tests/core/test_cel_cost.py, asked of the oracle again: they are
    still cel-go's, and gpuguard's measure is equal (exact cases) or above."""
    answers = oracle.evaluate([{"expression": e, "vars": {"object": CALIBRATION}}
                               for e, _, _ in ORACLE_COSTS])
    for (expression, recorded, exact), answer in zip(ORACLE_COSTS, answers, strict=True):
        assert answer.get("cost") == recorded, (expression, answer)
        measured = _gpuguard_cost(expression, {"object": CALIBRATION})
        assert measured is not None and measured >= recorded, (expression, measured)
        if exact:
            assert measured == recorded, expression


@pytest.mark.parametrize("values", [90, 100])
def test_the_per_call_limit_falls_where_cel_gos_does(oracle: CelOracle, values: int) -> None:
    data = {"object": _config_map(values)}
    [answer] = oracle.evaluate([{"expression": EXPRESSION, "vars": data}])
    measured = _gpuguard_cost(EXPRESSION, data)
    assert measured is not None
    if values == 100:
        assert answer.get("error") == cost.EXCEEDED
        assert measured > cost.PER_CALL_LIMIT
    else:
        assert answer.get("value") is True and answer["cost"] <= measured <= cost.PER_CALL_LIMIT


def _config_map(values: int, name: str = "big") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {f"k{i}": "a" * 1000 for i in range(values)}}


def _policy(name: str, failure_policy: str) -> list[dict[str, Any]]:
    registration = "admissionregistration.k8s.io/v1"
    return [
        {"apiVersion": registration, "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": failure_policy,
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": ["configmaps"]}]},
                  "matchConditions": [{"name": "mine",
                                       "expression": f"object.metadata.name.startsWith('{name}')"}],
                  "validations": [{"expression": EXPRESSION}]}},
        {"apiVersion": registration, "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"]}},
    ]


def _engine(documents: list[dict[str, Any]]) -> Engine:
    text = yaml.safe_dump_all(documents)
    parsed = [Document("policy.yaml", i, None, body, lines)
              for i, body, lines in parse_text("policy.yaml", text, with_lines=True)]
    policy_set, errors = build_policy_set(parsed, ENV)
    assert errors == [], [str(e) for e in errors]
    return Engine(policy_set, ENV)


def _gpuguard(documents: list[dict[str, Any]], obj: dict[str, Any]) -> tuple[bool, str]:
    verdict = _engine(documents).evaluate(from_object(obj, now=NOW))
    return verdict.allowed, verdict.message


def test_a_policy_past_the_per_call_limit_follows_its_failure_policy_on_both_sides(
        control_plane: ControlPlane) -> None:
    """kube-apiserver and gpuguard on the same VAP files: under Fail a ConfigMap whose check
    costs more than PerCallLimit is denied with cel-go's text, under Ignore it is allowed; one
    that costs less is judged on its value."""
    server = ApiServer(control_plane)
    documents = _policy("cost-fail", "Fail") + _policy("cost-ignore", "Ignore")
    probe = Probe(server, 9150)
    admin(control_plane, "apply", "-f", "-", input="\n---\n".join(
        json.dumps(d) for d in [*documents, *probe.documents()]))
    try:
        probe.wait_active()
        for name, values, allowed in (("cost-fail-over", 100, False),
                                      ("cost-fail-under", 90, True),
                                      ("cost-ignore-over", 100, True)):
            obj = _config_map(values, name)
            answer = server.request("POST", "/api/v1/namespaces/default/configmaps?dryRun=All",
                                    obj, None)
            ours_allowed, ours_message = _gpuguard(documents, obj)
            assert answer.allowed is allowed and ours_allowed is allowed, (name, answer.message)
            if not allowed:
                assert answer.status == 422
                assert answer.message == (
                    f'configmaps "{name}" is forbidden: ValidatingAdmissionPolicy '
                    f"'cost-fail' with binding 'cost-fail' denied request: expression "
                    f"'{EXPRESSION}' resulted in error: {cost.EXCEEDED}")
                # the same words after gpuguard's "<policy>/<binding>: " (the CEL error is
                # cel-go's)
                assert ours_message == (f"cost-fail/cost-fail: expression '{EXPRESSION}' "
                                        f"resulted in error: {cost.EXCEEDED}")
    finally:
        admin(control_plane, "delete", "-f", "-", "--ignore-not-found", input="\n---\n".join(
            json.dumps(d) for d in [*documents, *probe.documents()]))


def test_the_api_server_refuses_no_policy_by_its_estimated_cost(
        control_plane: ControlPlane) -> None:
    """A VAP whose estimate is far past every limit is created; gpuguard loads it too (the
    estimated-cost refusal is a GPUPolicy option, off by default, as Kubernetes' VAP has none)."""
    documents = _policy("cost-estimate", "Fail")
    documents[0]["spec"]["validations"] = [{"expression": (
        "lists.range(2000).all(i, lists.range(2000).all(j, "
        "object.data.all(k, v, v.matches(string(i + j)))))")}]
    created = admin(control_plane, "create", "--dry-run=server", "-f", "-",
                    input=json.dumps(documents[0]))
    assert "created (server dry run)" in created
    compiled = _engine(documents).policies.policies[0].validations[0].expression
    assert compiled.estimated_cost > cost.ESTIMATED_LIMIT
