"""The README's webhook example stays true: what it prints is what the webhook answers.

The example posts ``examples/admission/gpu-pod-review.json`` to ``gpuguard serve --dev`` (the
built-in library) and filters the answers with jq; here the same review goes to the same app
in-process and the same projections are taken in Python. (The audit example is checked by
``tests/audit/test_audit_reports.py``.)
"""

from __future__ import annotations

import base64
import json
import re

import pytest
import pytest_asyncio

from gpuguard.cli import main
from gpuguard.serve_run import STANDALONE_AUTHORIZER
from policies.authorization import Unavailable
from tests.fakes.webhook_harness import JSON, Harness
from tests.paths import ROOT

REVIEW = ROOT / "examples" / "admission" / "gpu-pod-review.json"

# The jq filters of the README, and their Python equivalents below.
VALIDATE_FILTER = ("'.response | {allowed, code: .status.code, deniedBy: (.status.message | "
                   "split(\":\")[0]), warnings: (.warnings | length)}'")
MUTATE_FILTER = "'.response.patch | @base64d | fromjson | map(.path)'"


def example(endpoint: str, jq_filter: str) -> object:
    """The value the README prints for ``curl … /endpoint | jq -c FILTER``."""
    section = (ROOT / "README.md").read_text(encoding="utf-8") \
        .split("## An admission webhook", 1)[1].split("\n## ", 1)[0]
    assert "gpuguard serve --dev" in section
    match = re.search(rf"https://localhost:8443/{endpoint} \\\n\s+\| jq -c "
                      rf"{re.escape(jq_filter)}\n(.+)\n", section)
    assert match, f"README shows the /{endpoint} example with jq -c {jq_filter}"
    return json.loads(match[1])


@pytest_asyncio.fixture
async def library_client(aiohttp_client):
    # the built-in library, as `gpuguard serve --dev` serves it: standalone, no authorizer
    harness = Harness(None, authorizer=Unavailable(STANDALONE_AUTHORIZER))
    assert harness.result.outcome == "loaded", harness.result.errors
    yield await aiohttp_client(harness.app)
    harness.close()


async def answer(client, endpoint: str) -> dict:
    response = await client.post(f"/{endpoint}", data=REVIEW.read_bytes(), headers=JSON)
    assert response.status == 200
    return (await response.json())["response"]


@pytest.mark.asyncio
async def test_the_readme_validate_example_is_what_validate_answers(library_client):
    response = await answer(library_client, "validate")
    shown = {"allowed": response["allowed"], "code": response["status"]["code"],
             "deniedBy": response["status"]["message"].split(":")[0],
             "warnings": len(response["warnings"])}
    assert example("validate", VALIDATE_FILTER) == shown


@pytest.mark.asyncio
async def test_the_readme_mutate_example_is_what_mutate_answers(library_client):
    response = await answer(library_client, "mutate")
    patch = json.loads(base64.b64decode(response["patch"]))
    assert example("mutate", MUTATE_FILTER) == [operation["path"] for operation in patch]


def test_check_gives_the_same_verdict_offline(capsys):
    # "Offline, `gpuguard check -f examples/admission/gpu-pod-review.json` gives the same verdict."
    assert main(["check", "-f", str(REVIEW), "-o", "json"]) == 1
    (result,) = json.loads(capsys.readouterr().out)["results"]
    shown = example("validate", VALIDATE_FILTER)
    assert isinstance(shown, dict) and result["allowed"] is shown["allowed"] is False
    # without a --snapshot gpu-requesters cannot decide (an error under Fail) and comes first
    assert result["message"].split(":")[0] == "gpu-requesters"
    assert "; gpu-requests-equal-limits: " in result["message"]
