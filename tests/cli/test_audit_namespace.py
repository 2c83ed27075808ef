"""``gpuguard audit -n`` and ``gpuguard diff -n`` (gpuguard/namespace_scope.py): a scan limited to
namespaces keeps exactly those namespaces' workloads and findings — the same as the whole audit
finds for them — from a snapshot and from a (fake) cluster, says what it left out, computes no
node figures from a partial set of pods, and refuses the flags that act on the whole cluster.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from gpuguard.cli import main
from policies.sources import Document
from tests.fakes.fake_kube_api import FakeKubeAPI
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
AUDIT = ("audit", "-f", str(EXAMPLE), "--jobs", "0", "-o", "json")


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _report(*argv: str) -> dict:
    code, out, err = _run(*argv)
    assert code == 0, err
    return json.loads(out)


def _findings(report: dict, namespaces: set[str]) -> list[tuple]:
    return sorted((f["workload"]["namespace"], f["workload"]["kind"], f["workload"]["name"],
                   f["policy"], f["rule"], f["severity"], f["message"])
                  for f in report["findings"] if f["workload"]["namespace"] in namespaces)


@pytest.fixture(scope="module")
def whole() -> dict:
    return _report(*AUDIT)


def test_a_limited_audit_keeps_exactly_those_namespaces_findings(whole):
    wanted = {"team-llm", "sandbox"}
    limited = _report(*AUDIT, "-n", "team-llm,sandbox")
    # A comma list and a repeated flag are the same limit.
    again = _report(*AUDIT, "-n", "sandbox", "--namespace", "team-llm", "-n", "sandbox")
    assert again["source"]["namespaces"] == ["sandbox", "team-llm"]
    assert again["findings"] == limited["findings"]
    assert limited["source"]["namespaces"] == ["team-llm", "sandbox"]
    assert {w["namespace"] for w in limited["workloads"]} == wanted
    assert limited["findings"] and _findings(limited, wanted) == _findings(whole, wanted)
    assert len(limited["findings"]) == len(_findings(whole, wanted))
    whole_workloads = sorted((w["namespace"], w["kind"], w["name"]) for w in whole["workloads"]
                             if w["namespace"] in wanted)
    assert sorted((w["namespace"], w["kind"], w["name"])
                  for w in limited["workloads"]) == whole_workloads
    # No node figures from a partial set of pods: the other namespaces' GPUs would show free.
    assert whole["summary"]["nodes"] > 0
    assert (limited["summary"]["nodes"], limited["summary"]["whole_gpus"]["free"]) == (0, 0)
    (note,) = [w for w in limited["warnings"] if w.startswith("limited to namespace(s)")]
    assert note.startswith("limited to namespace(s) team-llm, sandbox (-n): ")
    assert " Node" in note and "node figures" in note


def test_a_limited_cluster_audit_is_the_limited_snapshot_audit(tmp_path: Path):
    from audit.sources.files import iter_snapshot

    objects = [d.body for d in iter_snapshot([str(EXAMPLE)]) if isinstance(d, Document)]
    snapshot = _report(*AUDIT, "-n", "team-vision")
    with FakeKubeAPI(objects) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        live = _report("audit", "--kubeconfig", kubeconfig, "--jobs", "0", "-o", "json",
                       "-n", "team-vision")
    assert live["source"]["kind"] == "cluster"
    assert live["source"]["namespaces"] == ["team-vision"]
    assert live["findings"] == snapshot["findings"] and live["findings"]
    assert live["workloads"] == snapshot["workloads"]
    assert live["summary"]["nodes"] == 0


@pytest.mark.parametrize(("extra", "message"), [
    (("-n", "nosuch"), "gpuguard: error: -n nosuch: no object of these namespaces in the input "
                       "(it has objects of: gpu-operator, sandbox, team-llm, team-research, "
                       "team-vision)"),
    (("-n", "team-llm,,sandbox"), "gpuguard: error: -n 'team-llm,,sandbox': expected namespace "
                                  "names separated by commas, e.g. -n team-a,team-b"),
    (("-n", "sandbox", "--inventory"), "gpuguard: error: -n limits the audit to some "
                                       "namespaces, --inventory work(s) on the whole cluster"),
])
def test_bad_limits_exit_2_with_one_reason(extra, message):
    code, out, err = _run(*AUDIT, *extra)
    assert (code, out) == (2, "")
    assert message in err


def test_write_reports_and_watch_are_refused_with_n():
    """Publishing from a limited scan would delete every other namespace's PolicyReport."""
    for flags in (("--write-reports",), ("--watch",), ("--write-reports", "--watch")):
        code, out, err = _run("audit", "--cluster", "-n", "team-llm", *flags)
        assert (code, out) == (2, ""), flags
        assert f"-n limits the audit to some namespaces, {', '.join(flags)} work(s) on the " \
            "whole cluster" in err


def test_diff_takes_the_same_limit(whole):
    candidate = ROOT / "tests" / "data" / "diff" / "require-queue-label-every-namespace.yaml"
    argv = ("diff", "-f", str(EXAMPLE), "--jobs", "0", "-o", "json", "--candidate",
            str(candidate))
    code, out, _ = _run(*argv)
    code_limited, limited, err = _run(*argv, "-n", "team-research")
    assert code in (0, 1) and code_limited in (0, 1)
    everything, limited = json.loads(out), json.loads(limited)
    assert limited["source"]["namespaces"] == ["team-research"]
    assert "limited to namespace(s) team-research (-n)" in err
    research = [w for w in everything["workloads"]
                if w["workload"]["namespace"] == "team-research"]
    assert research and limited["workloads"] == research
