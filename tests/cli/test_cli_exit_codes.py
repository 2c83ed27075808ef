"""Exit codes of the CLI: a crash is never 1 (issue 13), and the command reference documents them.

1 is what ``--fail-on`` and ``check`` use for findings, so CI must never read a crash as one: an
unexpected exception in any command is caught at the top (``gpuguard.cli.main``), reported as one
line naming the command and the error, and exits 70 (EX_SOFTWARE). Failures are injected by
replacing a function the command calls with one that raises.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from gpuguard import certs_command, check_evaluation, cli, gpus_command, policy_set
from gpuguard.exit_codes import (
    EXIT_ENVIRONMENT,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOFTWARE,
    EXIT_USAGE,
)
from policies import suites
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
REVIEW = ROOT / "examples" / "admission" / "gpu-pod-review.json"


def _raise(*args: object, **kwargs: object) -> None:
    raise RuntimeError("injected failure\nsecond line")


# The module whose run() is the innermost gpuguard frame, where it is not <command>_command.
FRAMES = {"check": "check_evaluation"}


@pytest.mark.parametrize("argv, module, function", [
    (["gpus", "-f", str(EXAMPLE)], gpus_command, "collect"),
    (["check", "-f", str(REVIEW)], check_evaluation, "read_documents"),
    # lint imports policy_set when it runs (its --help does not need it).
    (["lint", str(ROOT / "policies" / "library")], policy_set, "load"),
    # test imports its suite runner when it runs (its --help does not need it).
    (["test", str(ROOT / "policies" / "library")], suites, "run_paths"),
])
def test_an_unexpected_exception_is_one_line_and_exit_70(capsys, monkeypatch, argv, module,
                                                         function):
    # The line names the innermost frame in gpuguard's packages: here the command's run().
    monkeypatch.setattr(module, function, _raise)
    code = cli.main(argv, environ={})
    err = capsys.readouterr().err
    assert code == EXIT_SOFTWARE != EXIT_FINDINGS
    assert "Traceback" not in err
    [line] = err.splitlines()  # the message's newline is escaped: one error, one line
    assert re.fullmatch(
        rf"gpuguard {argv[0]}: internal error: RuntimeError: injected failure\\nsecond line "
        rf"\(at gpuguard/{FRAMES.get(argv[0], argv[0] + '_command')}.py:\d+ in run; a bug in "
        r"gpuguard, please report it; "
        r"run again with --debug or GPUGUARD_DEBUG=1 for the traceback\)", line), line


def test_the_crash_of_the_audit_names_the_frame_in_gpuguard(capsys, monkeypatch):
    def broken(self: object, *args: object) -> None:
        raise TypeError("'<' not supported between instances of 'str' and 'NoneType'")

    monkeypatch.setattr("audit.scan.compliance.Compliance.finish", broken)
    code = cli.main(["audit", "-f", str(EXAMPLE), "--jobs", "0", "-o", "json"], environ={})
    captured = capsys.readouterr()
    assert code == EXIT_SOFTWARE
    assert captured.out == ""  # no report from a run that did not finish
    assert captured.err.splitlines()[-1].startswith(
        "gpuguard audit: internal error: TypeError: '<' not supported between instances of "
        "'str' and 'NoneType' (at audit/scan/scanner.py:")


@pytest.mark.parametrize("debug", [["--debug"], []])
def test_debug_flag_or_variable_prints_the_traceback(capsys, monkeypatch, debug):
    monkeypatch.setattr(gpus_command, "collect", _raise)
    environ = {} if debug else {cli.DEBUG_VARIABLE: "1"}
    assert cli.main([*debug, "gpus", "-f", str(EXAMPLE)], environ=environ) == EXIT_SOFTWARE
    err = capsys.readouterr().err
    assert err.startswith("gpuguard gpus: internal error: RuntimeError: injected failure")
    assert "the traceback follows" in err
    assert "Traceback (most recent call last):" in err and 'in _raise' in err


def test_debug_variable_set_to_0_keeps_one_line(capsys, monkeypatch):
    monkeypatch.setattr(gpus_command, "collect", _raise)
    assert cli.main(["gpus", "-f", str(EXAMPLE)],
                    environ={cli.DEBUG_VARIABLE: "0"}) == EXIT_SOFTWARE
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_sub_command_is_named(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(certs_command._HANDLERS, "generate", _raise)
    assert cli.main(["certs", "generate", "--service", "s", "--namespace", "n", "--out",
                     str(tmp_path)], environ={}) == EXIT_SOFTWARE
    assert capsys.readouterr().err.startswith(
        "gpuguard certs generate: internal error: RuntimeError")


def test_ctrl_c_is_130_without_a_traceback(capsys, monkeypatch):
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(gpus_command, "collect", interrupted)
    assert cli.main(["gpus", "-f", str(EXAMPLE)], environ={}) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "gpuguard gpus: interrupted\n"


def test_the_installed_entry_point_exits_70_on_a_crash(tmp_path):
    # A real process: sys.exit(main()) in gpuguard/__main__.py passes the code through.
    script = ("import sys, gpuguard.gpus_command as g\n"
              "def boom(*a, **k):\n    raise MemoryError('injected')\n"
              "g.collect = boom\n"
              "from gpuguard.cli import main\n"
              f"sys.exit(main(['gpus', '-f', {str(EXAMPLE)!r}], environ={{}}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == EXIT_SOFTWARE
    assert done.stderr.startswith("gpuguard gpus: internal error: MemoryError: injected")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_port_that_is_taken_is_the_environment_not_a_finding(workers):
    # The port is held by this test (no SO_REUSEPORT), so every bind fails: one error line and
    # exit 3, with or without the worker supervisor, and no restart loop.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gpuguard", "serve", "--dev", "--port",
                               str(port), "--workers", workers], capture_output=True,
                              text=True, timeout=120, check=False)
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr
    assert "address already in use" in done.stderr and "Traceback" not in done.stderr


def test_codes_are_distinct():
    codes = [EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_ENVIRONMENT, EXIT_SOFTWARE,
             EXIT_INTERRUPTED]
    assert len(set(codes)) == len(codes)


def test_the_command_reference_documents_the_exit_codes_of_every_command():
    # One table, in docs/commands/README.md; each command's page points to it.
    reference = ROOT / "docs" / "commands"
    index = (reference / "README.md").read_text(encoding="utf-8")
    section = index.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    commands = set(cli.build_parser()[1])
    rows = dict(re.findall(r"^\| `gpuguard ([\w-]+)[^`]*` \| (.+) \|$", section, re.MULTILINE))
    assert set(rows) == commands
    assert "| command | 0 | 1 | 2 | 3 |" in section
    assert f"**{EXIT_SOFTWARE}** (`EX_SOFTWARE`) is an internal error" in section
    assert f"**{EXIT_INTERRUPTED}** is an interrupt" in section
    for command in commands:
        page = (reference / f"{command}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# `gpuguard {command}`"), command
        assert "## Exit codes" in page and "(README.md#exit-codes)" in page, command


@pytest.mark.parametrize(("argv", "code"), [
    (["gpus", "-f", str(EXAMPLE)], EXIT_OK),
    (["audit", "-f", str(EXAMPLE), "--fail-on", "deny", "--jobs", "0"], EXIT_FINDINGS),
])
def test_a_reader_that_went_away_leaves_the_commands_own_exit_code(argv, code):
    # stdout is a pipe whose reading end is already closed (`| head` that has exited): every
    # write fails with EPIPE. rich made that SystemExit(1), "findings" to CI, for gpus too.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "gpuguard", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr


def _ca(tmp_path) -> str:
    # A real CA through the command users run, so `certs ca-bundle` has something to print.
    assert cli.main(["certs", "generate", "--service", "gpuguard", "-n", "gpuguard", "--out",
                     str(tmp_path)]) == EXIT_OK
    return str(tmp_path / "ca.crt")


#: One command per way of writing standard output: rich tables, print(), sys.stdout.write,
#: json/yaml streamed onto it; ``{ca}`` is replaced by a CA certificate made for the test.
WRITERS = [
    ["gpus", "-f", str(EXAMPLE)],
    ["check", "-f", str(REVIEW)],
    ["lint", "-o", "json", str(ROOT / "policies" / "library")],
    ["crds"],
    ["test", "-o", "json", str(ROOT / "policies" / "library")],
    ["certs", "ca-bundle", "--ca", "{ca}"],
]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("argv", WRITERS, ids=lambda argv: " ".join(argv[:2]))
def test_standard_output_that_cannot_be_written_is_the_environment_not_a_bug(argv, tmp_path):
    # `> /dev/full`: every write fails with ENOSPC. That was exit 70 "a bug in gpuguard" (or,
    # for certs, "error: None: No space left on device"); it is one line naming what could not
    # be written and exit 3, like any other thing the environment lacks.
    argv = [_ca(tmp_path) if word == "{ca}" else word for word in argv]
    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run([sys.executable, "-m", "gpuguard", *argv], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    command = " ".join(["gpuguard", *argv[:2]]) if argv[0] == "certs" else f"gpuguard {argv[0]}"
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr
    # the last line (check may note first what it cannot decide offline, e.g. authorizer checks)
    assert done.stderr.splitlines()[-1] == (f"{command}: error: cannot write standard output: "
                                            "No space left on device")
    assert "internal error" not in done.stderr and "None" not in done.stderr


@pytest.mark.parametrize(("argv", "code"), [
    (["certs", "ca-bundle", "--ca", "{ca}"], EXIT_OK),
    (["lint", "-o", "json", str(ROOT / "policies" / "library")], EXIT_OK),
    (["check", "-o", "json", "-f", str(ROOT / "examples" / "cluster")], EXIT_FINDINGS),
])
def test_a_closed_pipe_is_quiet_and_keeps_the_exit_code_of_any_output(argv, code, tmp_path):
    # `certs ca-bundle | head -c 10` printed "error: None: Broken pipe"; JSON written in one piece
    # to a closed pipe ended with 0 whatever the command had found. Neither says a word now, and
    # the exit code is the command's own.
    argv = [_ca(tmp_path) if word == "{ca}" else word for word in argv]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "gpuguard", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == code, done.stderr
    # nothing about the pipe (check may still note what it cannot decide offline)
    assert not [line for line in done.stderr.splitlines() if "error" in line or "pipe" in line]


@pytest.mark.parametrize("where", ["taken port", "address not this machine's"])
def test_serve_dev_prints_its_curl_commands_only_once_serving(where):
    # `serve --dev` printed "Post the sample ... curl https://localhost:PORT" and then exited 3
    # because it could not listen: commands for a server that never ran. 192.0.2.10 is
    # TEST-NET-1 (RFC 5737), never an address of this machine.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        address = ["--port", str(port)] if where == "taken port" else \
            ["--host", "192.0.2.10", "--port", "0"]
        done = subprocess.run([sys.executable, "-m", "gpuguard", "serve", "--dev", *address],
                              capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr
    assert done.stdout == ""
    assert "cannot start the server" in done.stderr


def test_the_dev_curl_command_names_the_address_it_listens_on():
    from gpuguard.serve_run import curl_command

    assert "https://localhost:8443/validate" in curl_command("ca.crt", 8443, host="0.0.0.0")
    assert "https://10.1.2.3:8443/mutate" in curl_command("ca.crt", 8443, "mutate",
                                                          host="10.1.2.3")
    assert "https://[fd00::7]:8443/validate" in curl_command("ca.crt", 8443, host="fd00::7")


@pytest.mark.parametrize(("policies", "warned"), [
    ([], False),
    (["--policies", str(ROOT / "policies" / "library"),
      "--policies", str(ROOT / "tests" / "data" / "quota" / "example-cluster-quotas.yaml")], True),
])
def test_serve_warns_about_standalone_quotas_only_when_the_set_holds_a_gpuquota(policies,
                                                                               warned):
    # "GPUQuota enforcement needs a cluster" was printed for the built-in library, which holds
    # no GPUQuota. (The port is taken so that the server stops right after its start-up lines.)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run([sys.executable, "-m", "gpuguard", "serve", "--dev", "--port",
                               str(taken.getsockname()[1]), *policies],
                              capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr
    assert "no cluster configured" in done.stderr  # standalone, as the warning's premise
    assert ("GPUQuota enforcement needs a cluster" in done.stderr) is warned
