"""benchmarks/instructions.py without valgrind: its measured steps run once, their verdicts hold.

The callgrind figures themselves are not checked here (no timing or counting asserts); what is
checked is that the harness still measures the webhook's real path — the library denies the
example GPU pod, a set with no matching policy and the synthetic sets allow it, the phase replays
give the request's own values — and that its arithmetic on callgrind parts is right.
"""

from __future__ import annotations

import asyncio
import json
from types import ModuleType

import pytest

import policies.engine.evaluation
import policies.facts.workloads
from policies.cel import runtime as cel
from tests.benchmark_scripts import load


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("instructions")


def test_admission_steps_run_and_decide_as_the_webhook(bench, tmp_path):
    parts = bench.Parts()
    asyncio.run(bench.admission_child(parts, 1, (0, 10), tmp_path))
    figures = [entry["figure"] for entry in parts.plan]
    assert figures == [
        "_call", "_await", "validate_library_instructions",
        "validate_library_compact_instructions", "wire_instructions",
        "null_path_instructions", "review_input_instructions", "gpu_facts_instructions",
        "cel_recheck_instructions", "cel_request_activation_instructions",
        "cel_runtime_activation_instructions", "cel_fresh_instructions",
        "cel_programs_instructions", "validate_synthetic_0_instructions",
        "validate_synthetic_0_compact_instructions", "validate_synthetic_10_instructions"]
    # Three marks per measurement (close what came before, empty part, measured part).
    assert parts.marks == 3 * len(figures)
    # The example pod asks for a GPU without a limit: the library's equal-limits policy denies.
    assert parts.notes["library_denied_by"] == ["gpu-requests-equal-limits"]
    # The library request computes facts once and evaluates CEL: every phase ran but the
    # programs, whose one combined program calls the authorizer (gpu-requesters) and is not
    # replayed: its cost is in the rest, and the notes say so.
    calls = parts.notes["phase_calls"]
    assert all(count >= 1 for name, count in calls.items() if name != "programs")
    assert (calls["programs"], parts.notes["programs_not_replayed"]) == (0, 1)


def test_the_compact_body_is_the_same_review_without_whitespace(bench):
    body = bench.BODY.read_bytes()
    compact = bench.compact_body(body)
    assert json.loads(compact) == json.loads(body)
    # Byte for byte what orjson writes back: the wire's duplicate-key check needs no
    # whitespace pass for it, as for kube-apiserver's own compact JSON.
    import orjson

    assert compact == orjson.dumps(orjson.loads(body)) and len(compact) < len(body)


def test_the_measured_verdicts(bench):
    body = bench.BODY.read_bytes()
    library = bench.Admission(None)
    try:
        decision, answer = asyncio.run(library.validate(body))
        response = json.loads(answer)["response"]
        # The library words a GPU request without a matching limit as an invalid spec: 422.
        assert (decision.allowed, response["allowed"], response["status"]["code"],
                response["status"]["reason"]) == (False, False, 422, "Invalid")
        assert response["uid"] == json.loads(body)["request"]["uid"]
        assert "gpu-requests-equal-limits" in response["status"]["message"]
        library.check(body, decision, answer, allowed=False, matching=None)
        # The check is a guard: the same request claimed allowed is refused, naming why.
        with pytest.raises(AssertionError, match="allowed is False, expected True"):
            library.check(body, decision, answer, allowed=True, matching=None)
    finally:
        library.close()


def test_no_policy_and_synthetic_sets_allow_with_the_expected_matches(bench, tmp_path):
    body = bench.BODY.read_bytes()
    for count in (0, 10):
        path = tmp_path / f"synthetic-{count}.yaml"
        path.write_text(bench.synthetic_policies(count), encoding="utf-8")
        admission = bench.Admission([str(path)])
        try:
            decision, answer = asyncio.run(admission.validate(body))
            assert decision.allowed and decision.fallback is None
            assert json.loads(answer)["response"]["allowed"] is True
            admission.check(body, decision, answer, allowed=True, matching=count)
            with pytest.raises(AssertionError, match="policies match"):
                admission.check(body, decision, answer, allowed=True, matching=count + 1)
        finally:
            admission.close()


def test_recording_replays_the_request_and_unwraps_everything(bench):
    body = bench.BODY.read_bytes()
    library = bench.Admission(None)
    try:
        async def recorded():
            with bench.recording() as calls:
                return await library.validate(body), calls

        (decision, _), calls = asyncio.run(recorded())
    finally:
        library.close()
    assert not decision.allowed
    assert len(calls.facts) == 1 and calls.runs
    assert policies.engine.evaluation.workload_facts is policies.facts.workloads.workload_facts
    assert policies.engine.evaluation.prepare is cel.prepare
    assert "_run" in vars(cel.CompiledExpression)
    assert cel.CompiledExpression._run.__qualname__ == "CompiledExpression._run"
    phases = bench.Phases(calls)
    phases.check()  # replays on fresh and used activations give the request's values
    phases.facts()
    phases.recheck()
    phases.activations()
    phases.runtime_activations()


def test_audit_step_checks_its_report(bench, tmp_path):
    snapshots = bench.audit_snapshots(tmp_path / "snapshots", (20, 60), 5)
    (small, small_pods), (large, large_pods) = snapshots
    assert small_pods < large_pods
    parts = bench.Parts()
    # The first audit's report counts its pods; the second is claimed one pod larger than it
    # is, which the check must refuse.
    with pytest.raises(AssertionError, match=f"the audit of {large_pods + 1} pods"):
        bench.audit_child(parts, [(small, small_pods), (large, large_pods + 1)], 5)
    assert [e["figure"] for e in parts.plan] == ["audit_0_instructions", "audit_1_instructions"]


def test_parts_arithmetic(bench):
    plan = {"marks": 6, "plan": [
        {"figure": "_call", "empty": 2, "part": 3, "iterations": 10, "loop": None},
        {"figure": "x", "empty": 5, "part": 6, "iterations": 4, "loop": "_call"}]}
    # empty parts cost 1,000 (the marker); the loop 100 per iteration; x 5,000 per iteration.
    parts = {1: 7, 2: 1000, 3: 1000 + 10 * 100, 4: 9, 5: 1000, 6: 1000 + 4 * (5000 + 100)}
    assert bench.figures_of(plan, parts) == {"_call": 100.0, "x": 5000.0}
    with pytest.raises(RuntimeError, match="5 parts for 6 marks"):
        bench.figures_of(plan, {k: v for k, v in parts.items() if k != 6})


def test_fit_and_derived_rows(bench):
    intercept, slope, r2 = bench.fit([(10, 1100.0), (50, 1500.0), (200, 3000.0)])
    assert (round(intercept), round(slope), r2) == (1000, 10, 1.0)
    figures = {"validate_synthetic_0_instructions": 300.0,
               "validate_synthetic_0_compact_instructions": 250.0,
               "validate_synthetic_10_instructions": 1100.0,
               "validate_synthetic_50_instructions": 1500.0,
               "audit_0_instructions": 1_000_000.0, "audit_1_instructions": 1_500_000.0}
    rows = {name: value for name, _, value in bench.derive(
        figures, {"audit_pods": [100, 600], "audit_nodes": 5}, (0, 10, 50))}
    assert rows["validate_no_policy_instructions"] == 300.0
    assert rows["validate_no_policy_compact_instructions"] == 250.0
    assert round(rows["policy_slope_instructions"]) == 10
    assert rows["audit_instructions_per_pod"] == 1000.0
    assert rows["audit_fixed_instructions"] == 900_000.0
