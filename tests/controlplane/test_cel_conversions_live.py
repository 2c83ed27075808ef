"""CEL type conversions against the Kubernetes CEL oracle, live.

The recorded file (``tests/data/k8s-cel/conversions.yaml``, which the core tier checks gpuguard
against) must be what the oracle answers today, and a larger seeded set of conversions must give
cel-go's value or error in :mod:`policies.cel.conversions` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.cel import conversions
from tests.controlplane import conversion_cases
from tests.controlplane.celoracle import CelOracle

LIVE_SEED = 2026
LIVE_COUNT = 3000


@pytest.fixture(scope="module")
def oracle(control_plane_bin: Path) -> Iterator[CelOracle]:
    with CelOracle(control_plane_bin / "celoracle") as running:
        yield running


def _request(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k != "chain"}


def test_the_recorded_answers_are_the_oracles(oracle: CelOracle) -> None:
    recorded = yaml.safe_load(conversion_cases.OUTPUT.read_text())
    requests = conversion_cases.conversion_requests(conversion_cases.RECORDED_SEED,
                                                    conversion_cases.RECORDED_COUNT)
    answers = oracle.evaluate([_request(r) for r in requests])
    assert [{"text": r["vars"]["object"]["s"], "chain": r["chain"],
             **conversion_cases.answer_of(a)} for r, a in zip(requests, answers, strict=True)] \
        == recorded["conversions"]
    creation = oracle.evaluate([
        {"expression": e, "vars": {"object": {"s": "1s", "metadata": {"name": "a"}}},
         "hasParams": False} for e in conversion_cases.CREATION_EXPRESSIONS])
    assert [{"expression": e, **conversion_cases.answer_of(a)} for e, a in zip(
        conversion_cases.CREATION_EXPRESSIONS, creation, strict=True)] == recorded["creation"]


def test_seeded_conversions_give_cel_gos_answer(oracle: CelOracle) -> None:
    """3,000 strings and doubles (another seed than the recorded file's) through Go's parsers
    and formatters: gpuguard's port answers each as cel-go does, value or error text."""
    requests = conversion_cases.conversion_requests(LIVE_SEED, LIVE_COUNT)
    answers = oracle.evaluate([_request(r) for r in requests])
    differences = []
    for request, answer in zip(requests, answers, strict=True):
        expected = conversion_cases.answer_of(answer)
        value = conversions.Constant("string", request["vars"]["object"]["s"])
        try:
            for function in [*request["chain"], "string"]:
                value = conversions.convert(function, value)
            ours: dict[str, Any] = {"value": value.value}
        except conversions.ConversionError as exc:
            ours = {"error": str(exc)}
        if ours != expected:
            differences.append(f"{request['expression']} of {request['vars']['object']['s']!r}: "
                               f"gpuguard {ours}, Kubernetes {expected}")
    assert not differences, "\n".join(differences[:30])
    assert sum("value" in conversion_cases.answer_of(a) for a in answers) > LIVE_COUNT // 4
