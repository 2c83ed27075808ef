"""The flags every command shares (issue 19, item 4), checked on the real parsers and outputs:
``-o table|json|yaml`` with JSON and YAML the same versioned document, YAML without anchors,
``-n/--namespace`` where a namespace applies, and the older ``lint -o text`` still accepted.

``-o junit|sarif`` for ``check``, ``test`` and ``audit`` through one JUnit and one SARIF writer;
``-f`` and ``-`` (standard input) for every command that reads manifests. :data:`REQUIRED` names
what each command must take — a command missing from it, or a parser that loses one of its flags,
fails — and docs/cli-conventions.md's table must be what the parsers take. Not common, with the
reason in :data:`REQUIRED`: ``match-conditions -o`` and ``crds -o`` name where to write.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest
import yaml

from audit.report.assemble import API_VERSION as REPORT_API_VERSION
from gpuguard import cli
from gpuguard.output_formats import API_VERSION, DOCUMENT_FORMATS, write
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
POD = str(EXAMPLE / "workloads" / "vllm-mistral.yaml")
LIBRARY = str(ROOT / "policies" / "library")

#: command line (without -o) → the kind of its document.
DOCUMENTS = {
    ("gpus", "-f", POD): "GPUFacts",
    ("lint", LIBRARY): "LintResult",
    ("check", "-f", POD, "-n", "team-llm"): "CheckResult",
    ("test", str(ROOT / "tests" / "policies")): "TestReport",
    ("audit", "-f", str(EXAMPLE), "--jobs", "0"): "AuditReport",
    ("diff", "-f", str(EXAMPLE), "--jobs", "0", "--candidate", LIBRARY): "PolicyDiff",
}

CI_FORMATS = ("junit", "sarif")
#: What each command must take: (its -o formats, -f PATH with - for stdin, -n/--namespace),
#: None where the flag does not apply, with the reason. Every command of cli.COMMANDS is here.
REQUIRED: dict[str, tuple[tuple[str, ...] | None, bool, bool]] = {
    "audit": ((*DOCUMENT_FORMATS, *CI_FORMATS), True, True),
    "gpus": (DOCUMENT_FORMATS, True, False),  # prints each object's facts: nothing to filter
    "lint": (DOCUMENT_FORMATS, True, False),  # policy files: no namespace
    "check": ((*DOCUMENT_FORMATS, *CI_FORMATS), True, True),  # -n: objects that name none
    "test": ((*DOCUMENT_FORMATS, *CI_FORMATS), True, False),  # suites name their namespaces
    "certs": (None, False, False),  # writes key files; generate/renew take -n (tested below)
    "serve": (None, False, False),  # a server: no document, no input manifests
    "inventory": (DOCUMENT_FORMATS, False, False),  # reads this machine's NVML, not files
    "match-conditions": (None, False, False),  # -o FILE: writes a manifest; PATH... of webhooks
    "diff": (DOCUMENT_FORMATS, True, True),
    "crds": (None, False, False),  # -o DIR: writes CRD files
}


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(list(argv))
    return code, out.getvalue()


@pytest.mark.parametrize(("argv", "kind"), list(DOCUMENTS.items()),
                         ids=[argv[0] for argv in DOCUMENTS])
def test_json_and_yaml_are_the_same_versioned_document(argv, kind):
    code, as_json = _run(*argv, "-o", "json")
    code_yaml, as_yaml = _run(*argv, "-o", "yaml")
    assert code == code_yaml and code in (0, 1), as_json[-500:]
    document = json.loads(as_json)
    assert (document["apiVersion"], document["kind"]) == (API_VERSION, kind)
    assert list(document)[:2] == ["apiVersion", "kind"]
    again = yaml.safe_load(as_yaml)
    if kind == "AuditReport":  # two runs, two times
        again["generated"] = document["generated"]
    assert again == document
    assert "&id" not in as_yaml and "*id" not in as_yaml


def test_yaml_writes_a_repeated_object_out_again():
    shared = {"nvidia.com/gpu": 1}
    stream = io.StringIO()
    write({"requests": shared, "limits": shared}, "yaml", stream)
    assert stream.getvalue() == ("requests:\n  nvidia.com/gpu: 1\n"
                                 "limits:\n  nvidia.com/gpu: 1\n")


def test_one_api_version_for_every_output():
    assert API_VERSION == REPORT_API_VERSION


def _parser(name: str) -> argparse.ArgumentParser:
    parser, _ = cli.build_parser(name)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def test_every_command_takes_the_common_flags():
    assert sorted(REQUIRED) == sorted(cli.COMMANDS), "a command without its REQUIRED entry"
    for name, (formats, files, namespace) in REQUIRED.items():
        parser = _parser(name)
        options = {o: a for a in parser._actions for o in a.option_strings}
        inputs = (["-f", "x"] if files else []) + (["--candidate", "y"] if name == "diff" else [])
        for output in formats or ():
            assert parser.parse_known_args(["-o", output, *inputs])[0].output == output, \
                (name, output)
        assert ("-f" in options and "--filename" in options) is files, name
        if files:
            assert options["-f"].nargs is None and isinstance(
                options["-f"], argparse._AppendAction), f"{name}: -f is not repeatable"
        assert ({"-n", "--namespace"} <= set(options)) is namespace, name


#: ``-f -`` reads standard input: the same document as ``-f FILE`` of the same text (sources
#: named ``-``).
STDIN = {
    "gpus": (), "check": (), "audit": ("--jobs", "0"),
    "diff": ("--jobs", "0", "--candidate", LIBRARY),
}


@pytest.mark.parametrize("command", sorted(STDIN))
def test_f_dash_reads_standard_input(command, monkeypatch):
    path = EXAMPLE / "pods.yaml"
    code, from_file = _run(command, "-f", str(path), *STDIN[command], "-o", "json")
    monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text()))
    code_stdin, from_stdin = _run(command, "-f", "-", *STDIN[command], "-o", "json")
    assert code == code_stdin and code in (0, 1)
    expected, got = json.loads(from_file.replace(str(path), "-")), json.loads(from_stdin)
    expected.pop("generated", None), got.pop("generated", None)
    assert got == expected and got


def test_lint_still_accepts_text_as_table(capsys):
    assert _parser("lint").parse_args(["-o", "text", "x"]).output == "table"
    assert cli.main(["lint", "-o", "xml", LIBRARY]) == 2
    assert "invalid choice: 'xml' (choose from 'table', 'json', 'yaml')" in \
        capsys.readouterr().err


def test_check_takes_n_for_the_namespace():
    short = _run("check", "-f", POD, "-n", "team-llm", "-o", "json")
    long = _run("check", "-f", POD, "--namespace", "team-llm", "-o", "json")
    assert short == long
    assert json.loads(short[1])["results"][0]["namespace"] == "team-llm"


def _flags(parser: argparse.ArgumentParser) -> tuple[str, str, str]:
    """(the -o cell, the -f cell, the -n cell) of docs/cli-conventions.md for ``parser``."""
    options = {o: a for a in parser._actions for o in a.option_strings}
    output = options.get("-o")
    if output is None:
        cell = "—"
    elif output.metavar in ("FILE", "DIR"):  # -o names where to write, not a format
        cell = output.metavar
    elif output.metavar == "FORMAT":  # gpuguard.output_formats.add_output
        cell = ", ".join(f for f in (*DOCUMENT_FORMATS, "junit", "sarif", "markdown", "html", "policyreport")
                         if _accepts(parser, f))
    else:
        cell = ", ".join(output.choices)
    paths = any(a.nargs in ("+", "*") and not a.option_strings for a in parser._actions)
    files = "yes" if "-f" in options else "PATH..." if paths else "—"
    namespace = "yes" if {"-n", "--namespace"} <= set(options) else "—"
    return cell, files, namespace


def _accepts(parser: argparse.ArgumentParser, output: str) -> bool:
    action = next(a for a in parser._actions if "-o" in a.option_strings)
    try:
        return action.type(output) == output
    except argparse.ArgumentTypeError:
        return False


def test_the_conventions_table_is_what_the_parsers_take():
    rows = {}
    for line in (ROOT / "docs" / "cli-conventions.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = tuple(cells[1:4])
    assert list(rows) == list(cli.COMMANDS)
    for name in cli.COMMANDS:
        parser = _parser(name)
        if name == "audit":  # its own choices (OUTPUTS), not add_output
            output = next(a for a in parser._actions if "-o" in a.option_strings)
            flags = (", ".join(output.choices), *_flags(parser)[1:])
        else:
            flags = _flags(parser)
        assert rows[name] == flags, name


def test_inventory_yaml_is_its_json_document():
    from tests.audit.test_inventory_command import run as run_inventory

    code, as_json, _ = run_inventory(["--node", "gpu-node-01"])
    code_yaml, as_yaml, _ = run_inventory(["--node", "gpu-node-01", "-o", "yaml"])
    assert code == code_yaml == 0
    document = json.loads(as_json)
    assert document["apiVersion"] == API_VERSION
    assert yaml.safe_load(as_yaml) == document and "&id" not in as_yaml


def test_certs_take_n_for_the_namespace():
    parser = _parser("certs")
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, required in (("generate", ["--service", "gpuguard", "--out", "x"]),
                           ("renew", ["--out", "x"])):
        args = sub.choices[name].parse_known_args(["-n", "gpuguard-system", *required])[0]
        assert args.namespace == "gpuguard-system"


def test_test_results_as_junit_for_ci(tmp_path, capsys):
    import xml.etree.ElementTree as ET

    vllm = EXAMPLE / "workloads" / "vllm-mistral.yaml"
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: limits}}
policies: [{ROOT / "policies" / "library" / "gpu-requests-equal-limits.yaml"}]
cases:
- name: passes
  resource: {vllm}
  expect: {{allowed: true}}
- name: fails
  resource: {vllm}
  expect: {{allowed: false}}
- name: later
  skip: "waiting for \\x01 the fix"
  resource: {vllm}
  expect: {{allowed: true}}
""")
    assert cli.main(["test", str(suite), "-o", "junit"]) == 1
    out = capsys.readouterr().out
    root = ET.fromstring(out.encode())
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("errors"),
            root.get("skipped")) == ("testsuites", "3", "1", "0", "1")
    (element,) = root
    assert (element.get("name"), element.get("file")) == ("limits", str(suite))
    cases = {c.get("name"): c for c in element}
    assert cases["passes"].find("failure") is None
    failure = cases["fails"].find("failure")
    assert failure.get("message") == "allowed: expected false, got true (no denial)"
    assert cases["later"].find("skipped") is not None
    assert "\\u0001" in cases["later"].find("skipped").get("message")


def test_test_results_as_sarif_for_code_scanning(tmp_path):
    """One error result per failed case, at its suite's file, through check's SARIF writer; a
    suite that cannot be read makes the run unsuccessful."""
    vllm = EXAMPLE / "workloads" / "vllm-mistral.yaml"
    limits = ROOT / "policies" / "library" / "gpu-requests-equal-limits.yaml"
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicyTest
metadata: {{name: limits}}
policies: [{limits}]
cases:
- name: passes
  resource: {vllm}
  expect: {{allowed: true}}
- name: fails
  resource: {vllm}
  expect: {{allowed: false}}
""")
    code, sarif = _run("test", str(suite), "-o", "sarif")
    (run,) = json.loads(sarif)["runs"]
    assert (code, [r["id"] for r in run["tool"]["driver"]["rules"]]) == (1, ["limits/fails"])
    (result,) = run["results"]
    assert (result["ruleId"], result["level"]) == ("limits/fails", "error")
    assert result["message"]["text"] == ("GPUPolicyTest limits: case fails: allowed: expected "
                                         "false, got true (no denial)")
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == str(suite)
    assert run["invocations"] == [{"executionSuccessful": True, "toolExecutionNotifications": []}]
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: gpuguard.io/v1alpha1\nkind: GPUPolicyTest\ncases: 7\n")
    code, sarif = _run("test", str(broken), "-o", "sarif")
    (invocation,) = json.loads(sarif)["runs"][0]["invocations"]
    assert (code, invocation["executionSuccessful"]) == (2, False)
    assert str(broken) in invocation["toolExecutionNotifications"][0]["message"]["text"]


def test_check_findings_as_sarif_for_code_scanning(tmp_path):
    policy = tmp_path / "toy.yaml"
    policy.write_text("""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: toy}
spec:
  validationActions: [Warn]
  validations:
  - name: no-gpu
    expression: gpu.count == 0
    message: asks for a GPU
""")
    denied = _run("check", "-f", str(EXAMPLE / "pods.yaml"), "-o", "sarif")
    warned = _run("check", "-f", POD, "--policies", str(policy), "-o", "sarif")
    log = json.loads(denied[1])
    assert (log["version"], denied[0]) == ("2.1.0", 1)
    (run,) = log["runs"]
    assert run["tool"]["driver"]["name"] == "gpuguard"
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rules == ["no-unrequested-gpu-access/no-unrequested-access"]
    # The two denials check -o json reports, each pointing at the file.
    as_json = json.loads(_run("check", "-f", str(EXAMPLE / "pods.yaml"), "-o", "json")[1])
    assert len(run["results"]) == sum(1 for e in as_json["results"] if not e["allowed"]) == 2
    for result in run["results"]:
        assert (result["level"], result["ruleIndex"]) == ("error", 0)
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
            str(EXAMPLE / "pods.yaml")
    (warning,) = json.loads(warned[1])["runs"][0]["results"]
    assert (warned[0], warning["ruleId"], warning["level"]) == (0, "toy/no-gpu", "warning")
    assert warning["message"]["text"] == "Deployment team-llm/mistral-7b: asks for a GPU"


def test_check_verdicts_as_junit_for_ci():
    """One case per object checked, per file: the denied ones fail, with their rules' lines."""
    import xml.etree.ElementTree as ET

    code, junit = _run("check", "-f", str(EXAMPLE / "pods.yaml"), "-o", "junit")
    as_json = json.loads(_run("check", "-f", str(EXAMPLE / "pods.yaml"), "-o", "json")[1])
    root = ET.fromstring(junit.encode())
    assert (code, root.get("name")) == (1, "gpuguard check")
    assert int(root.get("tests")) == len(as_json["results"])
    denied = [e for e in as_json["results"] if not e["allowed"]]
    assert int(root.get("failures")) == len(denied) == 2
    (suite,) = root
    assert suite.get("file") == str(EXAMPLE / "pods.yaml")
    for entry in denied:
        name = f"{entry['kind']}/{entry['namespace']}/{entry['name']}"
        failure = suite.find(f"testcase[@name='{name}']/failure")
        assert failure is not None and "no-unrequested-gpu-access/no-unrequested-access" in \
            failure.get("message")


def test_input_errors_are_in_the_junit_and_sarif_reports_not_a_green_run(tmp_path):
    """A file that holds no object (check) or a pod with a retyped field (audit): the exit code
    is 2 and the CI artifact says so too — an error case in JUnit, an unsuccessful invocation in
    SARIF — instead of a report of what could be read, which a dashboard shows as green."""
    import xml.etree.ElementTree as ET

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "pod.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": 7},
        "spec": {"containers": [{"name": "c", "image": "cuda",
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    for argv in (("check", "-f", str(empty)), ("audit", "-f", str(snapshot), "--jobs", "0")):
        code, junit = _run(*argv, "-o", "junit")
        root = ET.fromstring(junit.encode())
        assert (code, int(root.get("errors"))) == (2, 1), argv
        assert root.find("testsuite[@name='(input)']/testcase/error") is not None, argv
        code, sarif = _run(*argv, "-o", "sarif")
        (invocation,) = json.loads(sarif)["runs"][0]["invocations"]
        assert code == 2 and invocation["executionSuccessful"] is False, argv
        assert len(invocation["toolExecutionNotifications"]) == 1, argv
    # A clean run says so.
    (invocation,) = json.loads(_run("check", "-f", POD, "-o", "sarif")[1])["runs"][0][
        "invocations"]
    assert invocation == {"executionSuccessful": True, "toolExecutionNotifications": []}


def test_audit_findings_as_junit_and_sarif_for_ci():
    import xml.etree.ElementTree as ET

    argv = ("audit", "-f", str(EXAMPLE), "--jobs", "0")
    report = json.loads(_run(*argv, "-o", "json")[1])
    code, junit = _run(*argv, "-o", "junit")
    root = ET.fromstring(junit.encode())
    assert (code, root.get("name")) == (0, "gpuguard audit")
    evaluated = [w for w in report["workloads"] if w["evaluated"]]
    assert int(root.get("tests")) == len(evaluated)
    # A workload fails when it has a deny or audit finding; the case lists its findings.
    failing = {(f["workload"]["namespace"], f["workload"]["kind"], f["workload"]["name"])
               for f in report["findings"] if f["severity"] in ("deny", "audit")}
    assert int(root.get("failures")) == len(failing) > 0
    sandbox = next(s for s in root if s.get("name") == "sandbox")
    failure = sandbox.find("testcase[@name='Pod/debug-shell']/failure")
    assert failure.get("message").startswith(
        "deny no-unrequested-gpu-access/no-unrequested-access: container 'shell'")
    code, sarif = _run(*argv, "-o", "sarif")
    (run,) = json.loads(sarif)["runs"]
    findings = [f for f in report["findings"] if f["severity"] != "info"]
    assert (code, len(run["results"])) == (0, len(findings))
    levels = {"deny": "error", "error": "error", "warn": "warning", "audit": "note"}
    assert sorted(r["level"] for r in run["results"]) == sorted(levels[f["severity"]]
                                                               for f in findings)
    assert all("locations" not in r for r in run["results"])  # a snapshot, not files


@pytest.mark.parametrize("command", ["lint", "test"])
def test_lint_and_test_take_f_and_stdin(command, monkeypatch):
    path = (ROOT / "policies" / "library" / "gpu-requesters.yaml") if command == "lint" else \
        (ROOT / "tests" / "policies" / "gpu-requesters.yaml")
    as_path = _run(command, str(path), "-o", "json")
    as_f = _run(command, "-f", str(path), "-o", "json")
    assert as_path == as_f and as_path[0] == 0
    if command == "lint":  # a suite names its policies relative to its own file
        monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text()))
        from_stdin = _run(command, "-f", "-", "-o", "json")
        assert from_stdin == as_path
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main([command]) == 2
    assert f"gpuguard {command}: error: no input: give PATH... or -f PATH" in err.getvalue()


# --- an option a command does not have ------------------------------------------------------

#: Every command and sub-command, as typed (``certs`` has sub-commands of its own).
EVERY_COMMAND = [[name] for name in cli.COMMANDS] + [
    ["certs", sub] for sub in ("generate", "renew", "ca-bundle", "inject")]


def _usage_error(argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue().splitlines()


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
def test_an_option_a_command_lacks_is_its_own_usage_error_naming_the_option(command):
    """A fresh-context trial's find: ``gpuguard gpus --version`` said "the following arguments
    are required: -f/--filename" (the unknown option unnamed), and ``gpuguard lint --version``
    printed the top-level usage. Every command now answers with its own usage and name, exit 2,
    the option first — before a missing required option."""
    name = " ".join(command)
    code, lines = _usage_error([*command, "--no-such-flag"])
    assert code == 2
    assert lines[0].startswith(f"usage: gpuguard {name} ")
    assert lines[-1] == f"gpuguard {name}: error: unrecognized arguments: --no-such-flag"
    code, lines = _usage_error([*command, "--version"])
    assert code == 2 and lines[0].startswith(f"usage: gpuguard {name} ")
    assert lines[-1] == (
        f"gpuguard {name}: error: unrecognized arguments: --version (--version is an option of "
        "gpuguard itself and goes before the command: gpuguard --version ...)")


def test_values_that_look_like_options_are_still_values(capsys):
    # a negative number, standard input, an abbreviation and an attached value: argparse's own
    # rules decide these (here: --jobs -1 is refused by audit itself, not as an option)
    code, lines = _usage_error(["audit", "-f", str(EXAMPLE), "--jobs", "-1"])
    assert code == 2 and lines[-1] == "gpuguard: error: --jobs -1: expected 0 or more"
    assert cli.main(["gpus", "-f", POD, "-o=json", "--al"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "GPUFacts"
    assert cli.main(["--debug", "gpus", "-f", POD, "-ojson"]) == 0
