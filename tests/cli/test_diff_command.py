"""``gpuguard diff``: what a candidate policy set changes on the bundled example cluster.

The candidate sets are the built-in library with one policy replaced: the stricter
require-queue-label of tests/data/diff (every namespace, not only team namespaces), or copies of
library files edited in a temporary directory (Deny -> Warn, another RuntimeClass). Every figure
below was checked against examples/cluster by hand: ``gpu-operator/gpu-operator-test`` is the only
GPU workload outside a team namespace without a queue label (``sandbox/debug-shell`` asks for no
GPU), and the 14 GPU workloads of team namespaces the library already denies get the variant's
reworded message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit.sources.files import iter_snapshot
from gpuguard import cli
from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from policies.sources import Document
from tests.fakes.fake_kube_api import FakeKubeAPI
from tests.paths import ROOT

EXAMPLE = str(ROOT / "examples" / "cluster")
LIBRARY = ROOT / "policies" / "library"
STRICTER = ROOT / "tests" / "data" / "diff" / "require-queue-label-every-namespace.yaml"


def _library_with(replacement: Path) -> list[str]:
    """``--candidate`` arguments: every library file but the one ``replacement`` stands for."""
    args = []
    for path in sorted(LIBRARY.glob("*.yaml")):
        if path.name != "require-queue-label.yaml":
            args += ["--candidate", str(path)]
    return [*args, "--candidate", str(replacement)]


def _diff(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = cli.main(["diff", "-f", EXAMPLE, "--jobs", "0", "-o", "json", *args], environ={})
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def test_the_stricter_queue_label_policy_newly_denies_the_unqueued_pod_outside_team_namespaces(
        capsys):
    code, diff, err = _diff(capsys, *_library_with(STRICTER))
    assert code == EXIT_FINDINGS, err
    assert diff["kind"] == "PolicyDiff"
    assert diff["current"]["policies"] == "built-in library"
    # same names (the candidate's in the order of its files), one changed
    assert sorted(diff["current"]["names"]) == sorted(diff["candidate"]["names"])
    assert diff["current"]["hash"] != diff["candidate"]["hash"]
    summary = diff["summary"]
    assert (summary["workloads_evaluated"], summary["workloads_changed"],
            summary["workloads_newly_denied"], summary["workloads_no_longer_denied"],
            summary["workloads_newly_warned"], summary["workloads_patch_changed"]) == \
        (23, 15, 1, 0, 0, 0)
    assert {k: v for k, v in summary["findings"].items() if v} == \
        {"denied": 1, "message_changed": 14}

    [denied] = [w for w in diff["workloads"] if w["newly_denied"]]
    assert denied["workload"] == {"kind": "Pod", "group": "", "namespace": "gpu-operator",
                                  "name": "gpu-operator-test"}
    assert denied["team"] is None
    assert denied["verdict"] == {"current": "admitted", "candidate": "denied"}
    assert denied["patch"] is None  # the mutation does the same under both sets
    [change] = denied["changes"]
    assert (change["change"], change["severity"], change["policy"], change["rule"]) == \
        ("denied", "deny", "require-queue-label", "has-queue-label")
    assert change["message"].startswith(
        "Pod 'gpu-operator-test' asks for GPUs in namespace 'gpu-operator' but names no queue")

    reworded = [w for w in diff["workloads"] if not w["newly_denied"]]
    assert len(reworded) == 14
    for entry in reworded:  # denied before and after; only the message changed
        assert entry["verdict"] == {"current": "denied", "candidate": "denied"}
        [change] = entry["changes"]
        assert (change["change"], change["policy"]) == ("message_changed", "require-queue-label")
        assert "in team namespace" in change["message_before"]
        assert "in team namespace" not in change["message"]
    assert {w["team"] for w in reworded} == {"llm", "vision", "research"}

    [policy] = diff["policies"]
    assert (policy["policy"], policy["denied"], policy["message_changed"],
            policy["workloads_newly_denied"]) == ("require-queue-label", 1, 14, 1)
    teams = {t["team"]: t for t in diff["teams"]}
    assert teams[None]["workloads_newly_denied"] == teams[None]["denied"] == 1
    assert sum(t["message_changed"] for t in teams.values()) == 14
    assert all(t["workloads_newly_denied"] == 0 for name, t in teams.items() if name)


def test_the_diff_is_what_the_two_audits_find(capsys):
    # The candidate's audit has exactly the current audit's denials plus the newly denied one.
    code, diff, _ = _diff(capsys, *_library_with(STRICTER))
    assert code == EXIT_FINDINGS
    audits = []
    for policies in ([], [a for a in _library_with(STRICTER) if a != "--candidate"]):
        flags = [arg for path in policies for arg in ("--policies", path)]
        assert cli.main(["audit", "-f", EXAMPLE, "--jobs", "0", "-o", "json", *flags],
                        environ={}) == EXIT_OK
        report = json.loads(capsys.readouterr().out)
        audits.append({(f["workload"]["namespace"], f["workload"]["name"], f["policy"])
                       for f in report["findings"] if f["severity"] == "deny"})
    before, after = audits
    assert after - before == {("gpu-operator", "gpu-operator-test", "require-queue-label")}
    assert before <= after
    assert {(w["workload"]["namespace"], w["workload"]["name"], c["policy"])
            for w in diff["workloads"] for c in w["changes"] if c["change"] == "denied"} == \
        after - before


def test_the_same_set_changes_nothing_and_exits_0(capsys):
    code, diff, _ = _diff(capsys, "--candidate", str(LIBRARY))
    assert code == EXIT_OK
    assert diff["workloads"] == [] and diff["policies"] == [] and diff["teams"] == []
    assert diff["summary"]["workloads_changed"] == 0


@pytest.fixture
def relaxed(tmp_path: Path) -> Path:
    """The library with no-privileged-gpu warning instead of denying and the mutation setting
    RuntimeClass ``nvidia-cdi`` instead of ``nvidia``."""
    shutil.copytree(LIBRARY, tmp_path / "candidate", ignore=shutil.ignore_patterns("*.py", "*.md"))
    edits = {"no-privileged-gpu.yaml": ("validationActions: [Deny]", "validationActions: [Warn]"),
             "add-gpu-toleration-and-runtimeclass.yaml": ("setRuntimeClassName: nvidia\n",
                                                          "setRuntimeClassName: nvidia-cdi\n")}
    for name, (old, new) in edits.items():
        path = tmp_path / "candidate" / name
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1
        path.write_text(text.replace(old, new), encoding="utf-8")
    return tmp_path / "candidate"


def test_a_relaxed_policy_and_another_mutation_value_are_no_longer_denied_and_patches(
        capsys, relaxed):
    code, diff, err = _diff(capsys, "--candidate", str(relaxed))
    assert code == EXIT_OK, err  # nothing the library admits is denied
    summary = diff["summary"]
    assert summary["workloads_newly_denied"] == 0
    patched = [w for w in diff["workloads"] if w["patch"] is not None]
    assert summary["workloads_patch_changed"] == len(patched) > 0
    # The mutation's finding names the value it sets: its message changes with the patch.
    assert {k: v for k, v in summary["findings"].items() if v} == \
        {"warned": 1, "no_longer_denied": 1, "message_changed": len(patched)}
    [relaxed_entry] = [w for w in diff["workloads"]
                       if any(c["change"] != "message_changed" for c in w["changes"])]
    # The privileged MPIJob: still denied (no-unrequested-gpu-access, require-queue-label).
    assert relaxed_entry["workload"]["name"] == "nccl-tests"
    assert relaxed_entry["verdict"] == {"current": "denied", "candidate": "denied"}
    assert summary["workloads_no_longer_denied"] == 0
    assert [(c["change"], c["policy"]) for c in relaxed_entry["changes"]
            if c["change"] != "message_changed"] == \
        [("warned", "no-privileged-gpu"), ("no_longer_denied", "no-privileged-gpu")]
    for entry in patched:
        [reworded] = [c for c in entry["changes"] if c["change"] == "message_changed"]
        assert (reworded["policy"], reworded["rule"], reworded["message"]) == \
            ("add-gpu-toleration-and-runtimeclass", "set-runtime-class",
             'would setRuntimeClassName "nvidia-cdi"')
        patch = entry["patch"]
        # The one difference: the RuntimeClass the mutation sets, at the same paths.
        assert {op["value"] for op in patch["added"]} == {"nvidia-cdi"}
        assert {op["value"] for op in patch["removed"]} == {"nvidia"}
        assert sorted(op["path"] for op in patch["added"]) == \
            sorted(op["path"] for op in patch["removed"])
        assert all(op["path"].endswith("/runtimeClassName") for op in patch["added"])
        assert len(patch["current"]) == len(patch["candidate"])
    # Exactly the workloads the library's audit lists set-runtime-class mutations for.
    assert cli.main(["audit", "-f", EXAMPLE, "--jobs", "0", "-o", "json"], environ={}) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    mutated = {(f["workload"]["namespace"], f["workload"]["name"]) for f in report["findings"]
               if f["rule"] == "set-runtime-class"}
    assert {(w["workload"]["namespace"], w["workload"]["name"]) for w in patched} == mutated


def test_worker_processes_give_the_same_diff(capsys, relaxed):
    _, alone, _ = _diff(capsys, "--candidate", str(relaxed))
    code = cli.main(["diff", "-f", EXAMPLE, "--jobs", "2", "-o", "json", "--candidate",
                     str(relaxed)], environ={})
    assert code == EXIT_OK
    assert json.loads(capsys.readouterr().out) == alone


def test_markdown_lists_the_change_and_the_counts(capsys):
    code = cli.main(["diff", "-f", EXAMPLE, "--jobs", "0", "-o", "markdown",
                     *_library_with(STRICTER)], environ={})
    out = capsys.readouterr().out
    assert code == EXIT_FINDINGS
    assert out.startswith("# gpuguard diff\n\n15 of 23 workloads change: 1 newly denied")
    assert "| Pod/gpu-operator/gpu-operator-test | - | admitted → denied | denied | " \
        "require-queue-label / has-queue-label | Pod 'gpu-operator-test' asks for GPUs" in out
    assert "| require-queue-label | 1 | 0 | 0 | 0 | 0 | 0 | 14 | 0 | 1 |" in out


def test_a_broken_candidate_is_refused_naming_the_file(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(STRICTER.read_text(encoding="utf-8").replace(
        "expression: gpu.requested", "expression: gpu.requested &&"), encoding="utf-8")
    code, diff, err = _diff(capsys, "--candidate", str(broken))
    assert code == EXIT_USAGE and diff == {}
    assert "policy error (--candidate)" in err and str(broken) in err
    assert "nothing compared" in err


def test_an_empty_candidate_directory_is_refused(capsys, tmp_path):
    code, diff, err = _diff(capsys, "--candidate", str(tmp_path))
    assert code == EXIT_USAGE and diff == {}
    assert "no policies found" in err


def test_a_snapshot_path_that_names_nothing_is_refused(capsys, tmp_path):
    code = cli.main(["diff", "-f", str(tmp_path / "missing"), "--candidate", str(LIBRARY),
                     "--jobs", "0"], environ={})
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE and out == ""
    assert "missing" in err and "nothing compared" in err


def test_without_a_snapshot_the_message_names_the_bundled_one(capsys):
    code = cli.main(["diff", "--candidate", str(LIBRARY)], environ={})
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE and out == ""
    assert "-f examples/cluster" in err


def test_a_namespaced_exception_in_the_candidate_exempts_only_its_namespace(capsys):
    exception = ROOT / "tests" / "data" / "diff" / "gpu-operator-queue-exception.yaml"
    code, diff, err = _diff(capsys, *_library_with(STRICTER), "--candidate", str(exception))
    assert code == EXIT_OK, err  # the one newly denied pod is exempted
    assert diff["summary"]["workloads_newly_denied"] == 0
    exempted = [(w["workload"]["namespace"], w["workload"]["name"], c["policy"], c["message"])
                for w in diff["workloads"] for c in w["changes"] if c["change"] == "exempted"]
    reason = "the GPU operator's own validation pods are not queued"
    assert sorted(exempted) == [
        ("gpu-operator", "gpu-feature-discovery", "require-queue-label", reason),
        ("gpu-operator", "gpu-operator-test", "require-queue-label", reason)]
    # The team namespaces are not exempted: their workloads stay denied (reworded only).
    assert {c["change"] for w in diff["workloads"] if w["team"] for c in w["changes"]} == \
        {"message_changed"}


def test_the_live_cluster_gives_the_snapshots_diff(capsys, tmp_path):
    # The real kubernetes client against tests/fake_kube_api.py serving examples/cluster.
    objects = [d.body for d in iter_snapshot([EXAMPLE]) if isinstance(d, Document)]
    _, from_files, _ = _diff(capsys, *_library_with(STRICTER))
    with FakeKubeAPI(objects) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        code = cli.main(["diff", "--kubeconfig", kubeconfig, "--jobs", "0", "-o", "json",
                         *_library_with(STRICTER)], environ={})
    out, err = capsys.readouterr()
    assert code == EXIT_FINDINGS, err
    live = json.loads(out)
    assert live["source"]["kind"] == "cluster"
    assert {k: v for k, v in live.items() if k != "source"} == \
        {k: v for k, v in from_files.items() if k != "source"}


def test_a_snapshot_and_the_cluster_together_are_refused(capsys):
    code = cli.main(["diff", "-f", EXAMPLE, "--cluster", "--candidate", str(LIBRARY)],
                    environ={})
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE and out == ""
    assert "either -f PATH (a snapshot) or --cluster, not both" in err


def test_an_unreadable_document_makes_the_comparison_fail_its_gate(capsys, tmp_path):
    # The trial's case: the one GPU pod the stricter candidate would newly deny sits in a file
    # with git merge-conflict markers. Its absence must not read as "the candidate denies
    # nothing new" (exit 0): the diff is printed, with the error, and exits 2.
    snapshot = tmp_path / "snapshot"
    shutil.copytree(EXAMPLE, snapshot)
    (snapshot / "zz-conflicted.yaml").write_text(
        "<<<<<<< HEAD\napiVersion: v1\nkind: Pod\n=======\nkind: Pod\n>>>>>>> theirs\n")
    code = cli.main(["diff", "-f", str(snapshot), "--jobs", "0", "-o", "json",
                     *_library_with(STRICTER)], environ={})
    out, err = capsys.readouterr()
    diff = json.loads(out)
    assert code == EXIT_USAGE
    assert diff["errors"] and "zz-conflicted.yaml" in diff["errors"][0]
    assert "the comparison is incomplete and cannot pass a gate" in err


def test_the_first_example_of_the_page_runs_and_prints_what_it_shows(tmp_path):
    # diff.md's example used `--candidate policies-next/`, which does not exist. Its commands
    # now run as written (in a directory that sees the repository's files) and print its line.
    page = (ROOT / "docs" / "commands" / "diff.md").read_text(encoding="utf-8")
    block = page.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    commands = [line[2:] for line in block if line.startswith("$ ")]
    shown = [line for line in block if not line.startswith("$ ")]
    for name in ("policies", "tests", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-ec", "\n".join(commands)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == EXIT_FINDINGS, done.stderr
    assert done.stdout.splitlines()[:len(shown)] == shown
