"""The examples of the command pages (docs/commands/) stay true: what they show is what the commands
print (found by a fresh-context trial: serve.md said the sample was denied 422 by
gpu-requests-equal-limits — it is 403, first by gpu-requesters —, check.md's table lacked the
gpu-requesters row, test.md counted 10 suites and 103 cases when there were 11 and 107).

``check.md``: every ``$ gpuguard check ...`` of its console blocks is run (``-o json``) and each
object's title line, its non-pass rows (policy, rule, outcome — the messages may be abridged with
``[...]``), its quota lines and its patch must be the command's. ``test.md``: the ``| tail -1``
summary of the library's suites. ``serve.md``: the sentence on what ``/validate`` answers for the
sample review (code, reason, the policies that deny in order, the warnings) against the webhook
app in-process, as ``gpuguard serve --dev`` serves it. (The README's examples:
``test_readme.py``.)
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import pytest_asyncio

from gpuguard.cli import main
from gpuguard.serve_run import STANDALONE_AUTHORIZER
from policies.authorization import Unavailable
from tests.fakes.webhook_harness import JSON, Harness
from tests.paths import ROOT

COMMANDS = ROOT / "docs" / "commands"
REVIEW = ROOT / "examples" / "admission" / "gpu-pod-review.json"
_TITLE = re.compile(r"^(\S+/\S+/\S+) \((.+)\): (allowed|DENIED)$")
_ROW = re.compile(r"^  (\S+)\s{2,}(\S+)\s{2,}(mutate|fail|error|skip|exempt|pass)\b")


def console_examples(page: str, command: str) -> list[tuple[str, list[str]]]:
    """``(command line, output lines)`` of each ``$ gpuguard COMMAND ...`` in the console blocks
    of ``docs/commands/PAGE``."""
    found: list[tuple[str, list[str]]] = []
    text = (COMMANDS / page).read_text(encoding="utf-8")
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif found:
                found[-1][1].append(line)
    return [(cmd, out) for cmd, out in found if cmd.startswith(f"gpuguard {command} ")]


def _shown_entries(output: list[str]) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = []
    for line in output:
        title = _TITLE.match(line)
        if title:
            entries.append({"title": line, "rows": [], "quota": [], "patch": None})
        elif entries and (row := _ROW.match(line)) and row[1] != "policy":
            entries[-1]["rows"].append(row.groups())  # type: ignore[attr-defined]
        elif entries and line.startswith("  quota: "):
            entries[-1]["quota"].append(line.removeprefix("  quota: "))  # type: ignore[attr-defined]
        elif entries and line.startswith("  patch: "):
            entries[-1]["patch"] = json.loads(line.removeprefix("  patch: "))
    return entries


def _run_entries(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    main([*argv, "-o", "json"], environ={})
    entries = []
    for result in json.loads(capsys.readouterr().out)["results"]:
        title = (f"{result['kind']}/{result['namespace'] or '-'}/{result['name'] or '-'} "
                 f"({result['source']}): {'allowed' if result['allowed'] else 'DENIED'}")
        entries.append({
            "title": title,
            "rows": [(r["policy"], r["rule"], r["outcome"]) for r in result["results"]
                     if r["outcome"] != "pass"],
            "quota": list(result["quota"]["denials"]),
            "patch": result["patch"] or None})
    return entries


CHECK_EXAMPLES = console_examples("check.md", "check")


def test_check_md_has_its_examples():
    assert len(CHECK_EXAMPLES) == 2


@pytest.mark.parametrize(("command", "output"), CHECK_EXAMPLES, ids=[c for c, _ in CHECK_EXAMPLES])
def test_each_check_md_example_is_what_check_prints(capsys, monkeypatch, command, output):
    monkeypatch.chdir(ROOT)  # the examples' paths are relative to the repository
    argv = shlex.split(command)[1:]
    assert _shown_entries(output) == _run_entries(argv, capsys)


def test_test_md_counts_are_the_library_suites(capsys, monkeypatch):
    (shown,) = [out for cmd, out in console_examples("test.md", "test")
                if cmd == "gpuguard test tests/policies | tail -1"]
    monkeypatch.chdir(ROOT)
    main(["test", "tests/policies"], environ={})
    assert capsys.readouterr().out.rstrip("\n").splitlines()[-1] == shown[0]


@pytest_asyncio.fixture
async def library_client(aiohttp_client):
    # the built-in library, as `gpuguard serve --dev` serves it: standalone, no authorizer
    harness = Harness(None, authorizer=Unavailable(STANDALONE_AUTHORIZER))
    assert harness.result.outcome == "loaded", harness.result.errors
    yield await aiohttp_client(harness.app)
    harness.close()


_NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}


@pytest.mark.asyncio
async def test_serve_md_says_what_validate_answers_for_the_sample(library_client):
    text = " ".join((COMMANDS / "serve.md").read_text(encoding="utf-8").split())
    sentence = re.search(r"The sample pod is denied on `/validate` (.*?) on `/mutate`", text)
    assert sentence, "serve.md says what /validate answers for the sample review"
    claim = sentence[1]
    response = await library_client.post("/validate", data=REVIEW.read_bytes(), headers=JSON)
    answer = (await response.json())["response"]
    status = answer["status"]
    assert answer["allowed"] is False and '`"allowed": false`' in claim
    assert f"`code: {status['code']}`" in claim and f"`reason: {status['reason']}`" in claim
    # the policies that deny, in the order of the message (``policy: message; policy: ...``)
    message = status["message"]
    denying = [name for _, name in sorted(
        (message.find(f"{name}: "), name) for name in set(re.findall(r"`([a-z0-9-]+)`", claim))
        if message.startswith(f"{name}: ") or f"; {name}: " in message)]
    named = [name for name in re.findall(r"`([a-z0-9-]+)`", claim.split(", with ")[0])
             if name in denying]
    assert named == denying and denying
    warnings = answer.get("warnings") or []
    assert f"with the {_NUMBERS[len(warnings)]} warnings of" in claim
    warned = re.search(r"warnings of `([a-z0-9-]+)`", claim)
    assert warned and all(w.startswith(f"{warned[1]}") or warned[1] in w for w in warnings)
