"""Small CLI faults a fresh-context trial found: ``check -n 'Bad_NS!'`` accepted; duplicate and
invalid ``--namespace-labels`` accepted; ``-f /dev/stdin`` refused as "not a regular file"; a
GPUPolicyTest case with ``expect: {}`` passing while asserting nothing; a YAML control-character
error carrying PyYAML's literal ``\\n  in "<unicode string>"``."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from gpuguard.namespace_scope import namespace_problem
from policies.sources import iter_paths, read_documents
from tests.paths import ROOT

POD = ROOT / "tests" / "data" / "manifests" / "gpuop__cuda-vector-add-legacy-pod.yaml"
LIBRARY = str(ROOT / "policies" / "library")
POLICY = ROOT / "policies" / "library" / "no-privileged-gpu.yaml"
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
             "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
             "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv), environ={})
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err
    return code, out, err.splitlines()


# --- -n: a namespace name ------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "problem"), [
    ("Bad_NS!", LABEL_MSG), ("team.a", "must not contain dots"),
    ("a" * 64, "must be no more than 63 characters")])
def test_namespace_names_are_rfc_1123_labels(name, problem):
    assert namespace_problem(name) == problem


@pytest.mark.parametrize("name", ["default", "team-a", "0ops", "a" * 63])
def test_good_namespace_names_pass(name):
    assert namespace_problem(name) is None


def test_check_refuses_a_namespace_that_cannot_exist(capsys):
    code, out, err = _run(capsys, "check", "-f", str(POD), "-n", "Bad_NS!")
    assert (code, out) == (EXIT_USAGE, "")
    assert err == [f"gpuguard: error: -n 'Bad_NS!': not a namespace name: {LABEL_MSG}"]


@pytest.mark.parametrize("command", [["audit", "-f", str(ROOT / "examples" / "cluster")],
                                     ["diff", "-f", str(ROOT / "examples" / "cluster"),
                                      "--candidate", str(POLICY)]])
def test_audit_and_diff_refuse_it_with_the_same_words(capsys, command):
    code, out, err = _run(capsys, *command, "-n", "team-a,Bad_NS!")
    assert (code, out) == (EXIT_USAGE, "")
    assert f"gpuguard: error: -n 'Bad_NS!': not a namespace name: {LABEL_MSG}" in err


# --- --namespace-labels ---------------------------------------------------------------------------

@pytest.mark.parametrize(("labels", "message"), [
    ("team=a,team=b", "--namespace-labels 'team=a,team=b': the key 'team' is given twice "
     "(team=a and team=b): a label has one value"),
    ("team=a,team=a", "--namespace-labels 'team=a,team=a': the key 'team' is given twice "
     "(team=a and team=a): a label has one value"),
    ("bad key=1", "--namespace-labels 'bad key=1': not a label: key 'bad key': name part must "
     "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
     "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
     "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
    ("Bad_Prefix/x=1", "--namespace-labels 'Bad_Prefix/x=1': not a label: key 'Bad_Prefix/x': "
     "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
     "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
     "'example.com', regex used for validation is "
     "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
    ("team=a b", "--namespace-labels 'team=a b': not a label: value 'a b': a valid label must "
     "be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
     "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
     "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
    ("team=" + "v" * 64, f"--namespace-labels 'team={'v' * 64}': not a label: value "
     f"'{'v' * 64}': must be no more than 63 characters"),
    ("team", "--namespace-labels 'team': expected k=v[,k=v...], got 'team'"),
])
def test_bad_namespace_labels_are_refused_with_the_reason(capsys, labels, message):
    code, out, err = _run(capsys, "check", "-f", str(POD), "--namespace-labels", labels)
    assert (code, out) == (EXIT_USAGE, "")
    assert err == [f"gpuguard: error: {message}"]


def test_good_namespace_labels_reach_the_namespace_object(capsys):
    code, out, _ = _run(capsys, "check", "-f", str(POD), "--policies", LIBRARY, "-n", "team-a",
                        "--namespace-labels", "gpuguard.io/team=vision,empty=", "-o", "json")
    assert code in (EXIT_OK, EXIT_FINDINGS)
    assert [r["namespace"] for r in json.loads(out)["results"]] == ["team-a"]


# --- -f /dev/stdin and other streams -------------------------------------------------------------

@pytest.fixture()
def pipe_of() -> Iterator:
    """``pipe_of(text)``: a ``/dev/fd/N`` path reading ``text`` from a pipe (as a shell's
    ``<(...)`` or ``/dev/stdin`` in a pipeline gives), written by a thread so that any size
    fits."""
    opened: list[int] = []

    def make(text: str) -> str:
        read, write = os.pipe()
        opened.append(read)

        def feed() -> None:
            with os.fdopen(write, "w") as stream:
                stream.write(text)

        threading.Thread(target=feed, daemon=True).start()
        return f"/dev/fd/{read}"

    yield make
    for fd in opened:
        with contextlib.suppress(OSError):
            os.close(fd)


def test_a_pipe_named_by_path_is_read_as_standard_input_is(pipe_of):
    path = pipe_of(POD.read_text())
    assert list(iter_paths([path])) == [path]
    documents, errors = read_documents([path])
    assert errors == [] and [d.body["kind"] for d in documents] == ["Pod"]


@pytest.mark.parametrize("command", [["gpus"], ["check", "--policies", LIBRARY]])
def test_gpus_and_check_read_a_pipe(capsys, pipe_of, command):
    code, out, err = _run(capsys, *command, "-f", pipe_of(POD.read_text()), "-o", "json")
    assert code in (EXIT_OK, EXIT_FINDINGS), err
    body = json.loads(out)
    assert body["errors"] == []
    assert len(body.get("objects", body.get("results"))) == 1


def test_the_audit_reads_a_whole_pipe_without_losing_its_first_bytes(capsys, pipe_of):
    """The audit sized each file by opening it and reading its first two bytes (gzip's magic):
    on a pipe those bytes were gone, and the first document no longer parsed."""
    snapshot = (ROOT / "examples" / "cluster" / "pods.yaml").read_text()  # > a pipe's buffer
    code, out, err = _run(capsys, "audit", "-f", pipe_of(snapshot), "-o", "json", "--jobs", "0")
    report = json.loads(out)
    assert report["errors"] == [], err
    expected = sum(1 for d in yaml.safe_load_all(snapshot) if d and d.get("kind") == "Pod") or \
        len(yaml.safe_load(snapshot).get("items", []))
    assert report["summary"]["pods"] == expected > 0
    assert code == EXIT_OK


def test_a_block_device_is_still_refused():
    devices = [f"/dev/{n}" for n in ("loop0", "sda", "vda") if os.path.exists(f"/dev/{n}")]
    if not devices:
        pytest.skip("no block device on this machine")
    [error] = list(iter_paths(devices[:1]))
    assert str(error) == (f"{devices[0]}: not a regular file, directory or stream (a pipe, "
                          "/dev/stdin)")


# --- GPUPolicyTest: a case must assert something ------------------------------------------------

def _suite(tmp_path: Path, *expects: object) -> Path:
    (tmp_path / "policy.yaml").write_text(POLICY.read_text())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"},
           "spec": {"containers": [{"name": "c", "image": "x",
                                    "securityContext": {"privileged": True},
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    suite = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicyTest",
             "metadata": {"name": "t"}, "policies": ["policy.yaml"],
             "cases": [{"name": f"case {i}", "object": pod, "expect": expect}
                       for i, expect in enumerate(expects)]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


NOTHING = ("asserts nothing: give at least one of allowed, results, messageContains, "
           "messageNotContains, warnings (an empty list: none), patch (an empty list: no "
           "mutation)")


@pytest.mark.parametrize("expect", [{}, {"results": []}, {"messageContains": []},
                                    {"results": None, "messageNotContains": []}])
def test_a_case_that_asserts_nothing_is_an_error_not_a_pass(capsys, tmp_path, expect):
    path = _suite(tmp_path, expect, {"allowed": False})
    code, out, err = _run(capsys, "test", str(path), "-o", "json")
    assert code == EXIT_USAGE
    cases = json.loads(out)["suites"][0]["cases"]
    assert [(c["case"], c["status"]) for c in cases] == [("case 0", "error"), ("case 1", "pass")]
    assert cases[0]["differences"][0].endswith(f"cases[0].expect: {NOTHING}")
    assert any(e.endswith(f"cases[0].expect: {NOTHING}") for e in err)


@pytest.mark.parametrize("expect", [{"allowed": False}, {"warnings": []}, {"patch": []},
                                    {"messageContains": "privileged"}])
def test_one_expectation_is_enough(capsys, tmp_path, expect):
    code, out, _ = _run(capsys, "test", str(_suite(tmp_path, expect)), "-o", "json")
    assert code == EXIT_OK
    assert json.loads(out)["summary"]["pass"] == 1


def test_a_case_object_with_a_retyped_namespace_is_an_error(capsys, tmp_path):
    path = _suite(tmp_path, {"allowed": False})
    suite = yaml.safe_load(path.read_text())
    suite["cases"][0]["object"]["metadata"]["namespace"] = 2024
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    code, out, _ = _run(capsys, "test", str(path), "-o", "json")
    assert code == EXIT_USAGE
    (case,) = json.loads(out)["suites"][0]["cases"]
    assert case["status"] == "error"
    assert case["differences"][0].endswith(
        "cases[0].object: metadata.namespace: expected a string, got the number 2024 (YAML reads an "
        "unquoted "
        "number or true/false as that type: quote the value)")


# --- YAML errors in one line ---------------------------------------------------------------------

@pytest.mark.parametrize("command", [["gpus"], ["check"], ["audit"]])
def test_a_control_character_is_one_clean_line_naming_file_and_line(capsys, tmp_path, command):
    path = tmp_path / "ctl.yaml"
    path.write_text('apiVersion: v1\nkind: Pod\nmetadata: {name: "a\x01b"}\n')
    code, _, err = _run(capsys, *command, "-f", str(path))
    assert code == EXIT_USAGE
    err = [line for line in err if not line.startswith("gpuguard: note:")]
    assert err[0] == (
        f"gpuguard: {path}: document 0: invalid YAML at line 3: unacceptable character #x0001: "
        "control characters are not allowed (YAML allows no control character but tab, line "
        "feed and carriage return; in a double-quoted string write it as the escape \\x01)")
    assert not any("unicode string" in line or "\\n" in line for line in err)


def test_a_control_character_in_a_later_document_names_its_file_line(tmp_path):
    path = tmp_path / "ctl.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n"
                    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: \"a\x7fb\"\n")
    documents, [error] = read_documents([str(path)])
    assert [d.body["kind"] for d in documents] == ["ConfigMap"]
    assert str(error) == (
        f"{path}: document 1: invalid YAML at line 8: unacceptable character #x007f: control "
        "characters are not allowed (YAML allows no control character but tab, line feed and "
        "carriage return; in a double-quoted string write it as the escape \\x7f)")
