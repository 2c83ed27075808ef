"""Start-up cost of the CLI: ``gpuguard --help`` and ``--version`` import no command module and
none of the heavy libraries, a command imports only its own module, every command's ``--help``
imports none of what only its run needs (:data:`HELP_MUST_NOT_IMPORT`, one entry per command),
and the top-level help lines (gpuguard/cli.py ``COMMANDS``, listed without importing) are the ones
the modules register.

The import sets are deterministic, and so is the number of modules each small command imports
(:data:`MODULE_BUDGET`). The 0.4 s CPU budget of issue 19 is measured by
``benchmarks/startup.py``, not asserted here: CPU time, though not wall-clock time, still grew
past 3x its quiet figure on a machine at load 13. Figures (CPU seconds, best of three, two
cores under load): ``gpuguard --help`` 0.035 s, bare ``python -c pass`` ~0.02 s;
``audit --help`` 0.34 -> 0.07 s, ``serve --help`` 0.62 -> 0.08 s, ``diff --help`` 0.33 -> 0.08 s,
``certs --help`` 0.31 -> 0.11 s, ``test --help`` 0.25 -> 0.08 s (the run moved to
``*_run.py`` or imported in the function that needs it); before the lazy imports ~1.5 s.
Instructions (``valgrind --tool=callgrind``, whole process, before -> after the split): audit
2,423 M -> 500 M, serve 3,822 M -> 505 M, diff 2,454 M -> 491 M, certs 1,723 M -> 728 M, test
1,733 M -> 484 M; check --help, split before, 479 M.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from gpuguard import cli
from tests.paths import ROOT

HEAVY = ("kubernetes", "aiohttp", "cel_expr_python", "yaml", "rich", "jsonschema", "policies",
         "audit", "webhook", "kube", "certs")


def _run_main(argv: list[str]) -> tuple[int, str, list[str]]:
    """Run ``main(argv)`` in a fresh interpreter: its exit status, its stdout and the full
    names of the modules in ``sys.modules`` after it."""
    code = ("import io, json, sys, contextlib\n"
            "from gpuguard.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    status = main({argv!r})\n"
            "print(json.dumps([status, out.getvalue(), sorted(sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)
    status, out, modules = json.loads(done.stdout)
    return status, out, modules


def _imported_by(argv: list[str], *, submodules: bool = False) -> tuple[str, set[str]]:
    """Run ``main(argv)`` in a fresh interpreter; its stdout and the top-level packages and
    gpuguard modules it imported (every module's full name too with ``submodules``)."""
    status, out, modules = _run_main(argv)
    assert status == 0, out
    names = {m if m.startswith("gpuguard.") else m.split(".")[0] for m in modules}
    return out, names | (set(modules) if submodules else set())


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_import_no_command_and_no_heavy_library(argv):
    out, modules = _imported_by(argv)
    assert out.strip()
    commands = {module for module, _ in cli.COMMANDS.values()}
    assert not commands & modules
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


def test_a_command_imports_only_its_own_module():
    out, modules = _imported_by(["gpus", "--help"])
    assert "usage: gpuguard gpus" in out
    commands = {module for module, _ in cli.COMMANDS.values()}
    assert commands & modules == {"gpuguard.gpus_command"}
    assert not {"kubernetes", "aiohttp"} & modules


def test_the_listed_help_lines_are_the_registered_ones():
    parser, handlers = cli.build_parser()
    assert list(handlers) == list(cli.COMMANDS)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {name: summary for name, (_, summary) in cli.COMMANDS.items()}
    modules = {f"gpuguard.{p.stem}" for p in (ROOT / "gpuguard").glob("*_command.py")}
    assert modules == {module for module, _ in cli.COMMANDS.values()}, \
        "a gpuguard/*_command.py module missing from cli.COMMANDS"


def test_the_lazy_parser_accepts_what_the_full_one_does(capsys):
    # An unknown command is refused with the list of every command, as before.
    assert cli.main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "'match-conditions'" in err
    assert cli.main(["--debug", "gpus", "--help"]) == 0
    assert "usage: gpuguard gpus" in capsys.readouterr().out


# What `COMMAND --help` may not import, for every command: what only its run needs. The heavy
# libraries (the kubernetes client, aiohttp, the CEL runtime, JSON Schema) never; lint's help
# needs only its parser (no policy code); check's, audit's, serve's and diff's modules are their
# flags only (gpuguard.check_evaluation, audit_run, serve_run, diff_run are imported when they
# run); certs' imports the kubernetes client only for inject --live, test's its suite runner and
# rich when the suites run. kube.pod_cache / kube.quota_ledger / kube.list_watch import the
# client only when a cache or a ConfigMap ledger is built.
# Figures (user+sys, two cores under load): lint --help 0.40 s -> 0.06 s,
# check --help 0.77 s -> 0.42 s -> 0.14 s (see the module docstring for the others).
NEVER = ("kubernetes", "aiohttp", "cel_expr_python", "jsonschema", "kube",
         "gpuguard.check_evaluation", "gpuguard.audit_run", "gpuguard.serve_run",
         "gpuguard.diff_run", "gpuguard.audit_watch", "gpuguard.policy_set")
HELP_MUST_NOT_IMPORT = {
    "audit": (*NEVER, "rich", "webhook", "certs", "audit.scan", "audit.report", "audit.render"),
    "gpus": (*NEVER, "webhook", "audit", "certs"),
    "lint": tuple(m for m in (*HEAVY, *NEVER) if m != "yaml"),
    "check": (*NEVER, "rich", "webhook", "audit", "certs"),
    "test": (*NEVER, "rich", "webhook", "audit", "certs", "policies.suites"),
    "certs": (*NEVER, "rich", "webhook", "audit"),
    "serve": (*NEVER, "rich", "audit", "certs", "webhook.server", "cryptography"),
    "inventory": (*NEVER, "webhook", "certs", "pynvml"),
    "match-conditions": (*NEVER, "rich", "webhook", "audit", "certs"),
    "diff": (*NEVER, "rich", "webhook", "certs", "audit.scan", "audit.report", "audit.render"),
    "crds": (*NEVER, "rich", "webhook", "audit", "certs"),
}


def test_every_command_has_its_help_import_budget():
    assert sorted(HELP_MUST_NOT_IMPORT) == sorted(cli.COMMANDS)


@pytest.mark.parametrize("command", sorted(HELP_MUST_NOT_IMPORT))
def test_command_help_imports_no_heavy_library(command):
    out, modules = _imported_by([command, "--help"], submodules=True)
    assert f"usage: gpuguard {command}" in out
    heavy = {m for m in modules for banned in HELP_MUST_NOT_IMPORT[command]
             if m == banned or m.startswith(banned + ".")}
    assert not heavy, sorted(heavy)


#: Issue 19's "start-up under 0.4 s of CPU for --help and the small commands" is measured by
#: ``benchmarks/startup.py`` (CPU seconds, best of three): a CPU-time assertion here failed on a
#: machine at load 13 (issue 13, item 7: no test may depend on the machine's speed). What the
#: suite checks is the deterministic cause of start-up cost, the modules a command imports:
#: at most MODULE_BUDGET each. Measured: ``--help`` 97, ``lint --help`` 127, ``serve --help``
#: 162, ``gpus -f`` 229, ``certs --help`` 234 (the most, 0.11 s of CPU) — while importing
#: ``gpuguard.serve_run`` alone loads 915 and ``gpuguard.audit_run`` 457.
MODULE_BUDGET = 300
SMALL_COMMANDS = {
    "--help": ["--help"], "--version": ["--version"],
    **{f"{name} --help": [name, "--help"] for name in cli.COMMANDS},
    "gpus -f": ["gpus", "-f", str(ROOT / "examples" / "cluster" / "pods.yaml")],
    "match-conditions": ["match-conditions"],
}


@pytest.mark.parametrize("name", list(SMALL_COMMANDS))
def test_start_up_imports_at_most_the_module_budget(name):
    # whatever the exit status: `match-conditions` alone is a usage error (2)
    count = len(_run_main(SMALL_COMMANDS[name])[2])
    assert count <= MODULE_BUDGET, f"gpuguard {name}: {count} modules imported"
