"""An object whose ``metadata.namespace`` or ``metadata.name`` is not a string (YAML's unquoted
``namespace: 2024``) is one input error, the same in ``check`` (every output format), ``gpus`` and
the audit (found by a fresh-context trial: ``check -o junit`` / ``-o sarif`` crashed with exit 70,
``-o table`` / ``json`` judged ``Pod/2024/p``, ``gpus`` listed it with exit 0, while the audit
refused it). The rule is :func:`policies.facts.identity.identity_problems`."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_USAGE
from policies.facts.identity import identity_problems
from tests.paths import ROOT

LIBRARY = str(ROOT / "policies" / "library")
POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{containers: [{{name: c, image: x, securityContext: {{privileged: true}},
  resources: {{limits: {{nvidia.com/gpu: 1}}}}}}]}}
"""
HINT = " (YAML reads an unquoted number or true/false as that type: quote the value)"
CASES = [("p", "2024", "metadata.namespace: expected a string, got the number 2024"),
         ("p", "1.5", "metadata.namespace: expected a string, got the number 1.5"),
         ("7", "team-llm", "metadata.name: expected a string, got the number 7"),
         ("p", "[a]", "metadata.namespace: expected a string, got a list")]


def _file(tmp_path: Path, name: str, namespace: str) -> str:
    path = tmp_path / "pod.yaml"
    path.write_text(POD.format(name=name, namespace=namespace))
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), environ={})
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err
    return code, out, err


@pytest.mark.parametrize(("name", "namespace", "problem"), CASES)
@pytest.mark.parametrize("output", ["table", "json", "yaml", "junit", "sarif"])
def test_check_refuses_a_retyped_name_field_in_every_format(capsys, tmp_path, name, namespace,
                                                            problem, output):
    path = _file(tmp_path, name, namespace)
    code, out, err = _run(capsys, "check", "-f", path, "--policies", LIBRARY, "-o", output)
    hint = "" if problem.endswith("list") else HINT
    message = f"{path}: document 0: {problem}{hint}"
    assert code == EXIT_USAGE
    assert f"gpuguard: {message}\n" in err
    if output == "json":
        result = json.loads(out)
        assert result["results"] == [] and result["errors"] == [message]
    elif output == "junit":
        suites = ElementTree.fromstring(out)
        assert suites.get("errors") == "1" and suites.get("tests") == "1"
        error = suites.find("./testsuite/testcase/error")
        assert error is not None and error.get("message") == message
    elif output == "sarif":
        run = json.loads(out)["runs"][0]
        assert run["results"] == []
        invocation = run["invocations"][0]
        assert invocation["executionSuccessful"] is False
        assert [n["message"]["text"] for n in invocation["toolExecutionNotifications"]] == [
            message]
    elif output == "table":
        assert "2024/p" not in out and "DENIED" not in out


@pytest.mark.parametrize(("name", "namespace", "problem"), CASES)
def test_gpus_refuses_it_and_gives_it_no_row(capsys, tmp_path, name, namespace, problem):
    path = _file(tmp_path, name, namespace)
    code, out, err = _run(capsys, "gpus", "-f", path, "-o", "json")
    message = (f"{path}: document 0: Pod: {problem}; not reported: these fields say which "
               "object it is")
    assert code == EXIT_USAGE
    assert json.loads(out)["objects"] == []
    assert json.loads(out)["errors"] == [message]
    assert err == f"gpuguard: {message}\n"


@pytest.mark.parametrize(("name", "namespace", "problem"), CASES)
def test_the_audit_refuses_it_with_the_same_words(capsys, tmp_path, name, namespace, problem):
    path = _file(tmp_path, name, namespace)
    code, _, err = _run(capsys, "audit", "-f", path, "-o", "json")
    assert code == EXIT_USAGE
    assert ": document 0: Pod " in err and f": {problem}; not audited" in err


def test_a_well_typed_object_has_no_identity_problem():
    assert identity_problems({"kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}}) == []
    assert identity_problems({"kind": "Pod"}) == []  # absent: the readers decide what is required
    assert identity_problems({"kind": 3, "metadata": []}) == [
        "kind: expected a string, got the number 3", "metadata: expected a map, got a list"]
