"""``gpuguard audit --watch``: usage refused in one line before anything runs, and the policy
files reloaded the way ``gpuguard serve`` reloads them (webhook/policy_store.py)."""

from __future__ import annotations

import pytest

from audit.watch.metrics import WatchMetrics
from gpuguard.audit_watch import FilePolicySource
from gpuguard.cli import main
from gpuguard.exit_codes import EXIT_USAGE
from policies.facts.resource_names import DEFAULT_SETTINGS
from tests.fakes.fake_kube_api import FakeKubeAPI

POLICY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {{name: {name}}}
spec:
  validationActions: [Deny]
  match: {{resources: [pods]}}
  validations:
    - expression: "!gpu.requested"
      message: no GPUs here
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(["audit", *argv])
    captured = capsys.readouterr()
    return code, captured.err.splitlines()


@pytest.mark.parametrize(("argv", "message"), [
    (["--watch"], "gpuguard: error: nothing to audit: give -f PATH"),
    (["--watch", "-f", "x.yaml"], "gpuguard: error: --watch runs the audit controller on a "
     "live cluster: use it with --cluster"),
    (["--watch", "--cluster", "-o", "json", "--history", "h.db"],
     "gpuguard: error: --watch runs the audit controller on a live cluster: use it with "
     "--cluster, without -o, --history"),
])
def test_watch_usage_is_refused_in_one_line(capsys, argv, message):
    code, err = run(capsys, *argv)
    assert code == EXIT_USAGE
    assert err[0].startswith(message), err


@pytest.mark.parametrize(("flag", "message"), [
    ("--lease=gpuguard-audit", "gpuguard: error: --lease 'gpuguard-audit': expected "
     "NAMESPACE/NAME"),
    ("--writes-per-s=0", "gpuguard: error: --report-interval-s, --full-every-s: expected 0 or "
     "more; --writes-per-s: expected more than 0"),
])
def test_watch_settings_are_checked_before_anything_starts(capsys, tmp_path, flag, message):
    kubeconfig = tmp_path / "kubeconfig"
    with FakeKubeAPI([]) as api:
        api.kubeconfig(kubeconfig)
        code, err = run(capsys, "--kubeconfig", str(kubeconfig), "--watch", flag)
    assert code == EXIT_USAGE
    assert err == [message]


def test_policy_files_reload_once_they_hold_still_and_a_broken_update_is_refused(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(name="first"))
    metrics = WatchMetrics()
    source = FilePolicySource([str(path)], DEFAULT_SETTINGS, metrics)
    assert source.first().engine.policies.names() == ("first",)
    assert source.poll() is None  # unchanged
    path.write_text(POLICY.format(name="first") + "---\n" + POLICY.format(name="second"))
    assert source.poll() is None  # seen changing: loaded once it reads the same twice
    update = source.poll()
    assert update is not None and update.engine.policies.names() == ("first", "second")
    assert update.digest == source.store.current.digest
    path.write_text("apiVersion: gpuguard.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x\n")
    assert source.poll() is None
    assert source.poll() is None  # refused: the last good set stays
    assert source.store.current.engine.policies.names() == ("first", "second")
    samples = {s.labels["outcome"]: s.value for m in metrics.registry.collect()
               if m.name == "gpuguard_audit_policy_reloads" for s in m.samples
               if s.name.endswith("_total")}
    assert samples == {"success": 1.0, "rejected": 1.0}


class _Elector:
    """Answers renewals from a script (what a real API server does not on demand: fail for a
    while, then hand the Lease to another replica)."""

    def __init__(self, answers: list[tuple[bool, str | None]]) -> None:
        self.answers = answers
        self.last_error: str | None = None

    def try_acquire_or_renew(self) -> bool:
        held, self.last_error = self.answers.pop(0)
        return held


def test_the_lease_is_lost_after_a_duration_of_errors_or_at_once_to_another_holder():
    import threading

    from gpuguard.audit_watch import LeaseGuard, LeaseKeeper

    now = [0.0]
    errors = _Elector([(True, None), (False, "503"), (False, "503"), (False, "503")])
    keeper = LeaseKeeper(errors, 15, lambda: now[0], threading.Event())
    assert keeper.renew()
    now[0] = 10.0
    assert keeper.renew() and not keeper.lost.is_set()  # an API error: retried
    now[0] = 14.9
    assert keeper.renew() and not keeper.lost.is_set()
    now[0] = 15.0
    assert not keeper.renew() and keeper.lost.is_set()  # 15 s without a renewal

    taken = LeaseKeeper(_Elector([(False, None)]), 15, lambda: 0.0,
                        threading.Event())
    assert not taken.renew() and taken.lost.is_set()  # another replica holds it

    class Sink:
        calls = 0

        def write(self, report):
            Sink.calls += 1

    guard = LeaseGuard(Sink(), taken.lost)
    outcome = guard.write({"kind": "PolicyReport"})
    assert outcome.action == "failed" and "Lease" in outcome.message
    assert Sink.calls == 0
