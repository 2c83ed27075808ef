"""``gpuguard audit --watch``'s controller, driven event by event on an injected clock.

What is checked is what a platform team sees in the cluster: which PolicyReports get written,
with which failures, how often, and that relists and restarts neither lose nor duplicate a
result. The sink records writes instead of sending them (the control-plane tier,
tests/controlplane/test_audit_watch.py, sends them to a real kube-apiserver).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from audit.settings import AuditSettings
from audit.watch.controller import PolicyUpdate, WatchController, WatchSettings, canonical
from gpuguard import policy_set
from policies.facts.resource_names import DEFAULT_SETTINGS

WALL = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
KINDS = [("", "Namespace"), ("", "Node"), ("apps", "Deployment"), ("apps", "ReplicaSet"),
         ("", "Pod")]


@dataclass(frozen=True)
class Outcome:
    action: str
    message: str = ""


class RecordingSink:
    """Records report writes and deletes, and can be told to fail (what a real API server does
    not do on demand)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str | None, str]] = []
        self.failing = False

    def write(self, report: Mapping[str, Any]) -> Outcome:
        metadata = report["metadata"]
        key = (report["kind"], metadata.get("namespace"), metadata["name"])
        self.calls.append(("write", key[1], key[0]))
        if self.failing:
            return Outcome("failed", "503 Service Unavailable")
        self.objects[key] = copy.deepcopy(dict(report))
        return Outcome("replaced")

    def delete(self, kind: str, namespace: str | None, name: str) -> Outcome:
        self.calls.append(("delete", namespace, kind))
        if self.failing:
            return Outcome("failed", "503 Service Unavailable")
        self.objects.pop((kind, namespace, name), None)
        return Outcome("deleted")

    def prune(self, written: Iterable[Mapping[str, Any]], *, name: str,
              labels: Mapping[str, str]) -> list[Outcome]:
        keep = {w["metadata"]["namespace"] for w in written}
        gone = [k for k in self.objects if k[0] == "PolicyReport" and k[1] not in keep]
        for key in gone:
            del self.objects[key]
        self.calls.append(("prune", None, str(len(gone))))
        return [Outcome("deleted") for _ in gone]

    def report(self, namespace: str) -> dict[str, Any] | None:
        return self.objects.get(("PolicyReport", namespace, "gpuguard-audit"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def update() -> PolicyUpdate:
    loaded = policy_set.load(None, DEFAULT_SETTINGS)
    assert not loaded.errors
    return PolicyUpdate(loaded.engine, tuple(loaded.engine.policies.quotas),
                        loaded.engine.policies.digest)


def namespace(name: str, team: str = "vision") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"gpuguard.io/team": team,
                                    "kubernetes.io/metadata.name": name}}}


def node(name: str = "gpu-1", gpus: int = 8) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"},
                       "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96",
                                       "memory": "1Ti"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, ns: str, *, privileged: bool = False, version: str = "1",
        owner: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "train", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    metadata: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": version,
                                "uid": f"uid-{ns}-{name}",
                                "labels": {"kai.scheduler/queue": "team"}}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                        "name": owner, "controller": True, "uid": "rs"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"nodeName": "gpu-1", "containers": [container]},
            "status": {"phase": "Running"}}


def controller(update: PolicyUpdate, sink: RecordingSink, clock: Clock, **pacing: float
               ) -> WatchController:
    return WatchController(AuditSettings(now=WALL), update, sink, KINDS, clock=clock,
                           wall=lambda: WALL, watch=WatchSettings(**pacing))


def sync(ctl: WatchController, objects: list[dict[str, Any]]) -> None:
    for group, kind in KINDS:
        ctl.listed(group, kind, [o for o in objects if o["kind"] == kind
                                 and o["apiVersion"].rpartition("/")[0] == group])


def fails(report: Mapping[str, Any] | None) -> list[str]:
    return sorted(f"{r['policy']}:{r['resources'][0]['name']}"
                  for r in (report or {}).get("results", []) if r["result"] == "fail")


def test_nothing_is_published_before_every_resource_was_listed(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock)
    ctl.listed("", "Namespace", [namespace("team-a")])
    ctl.listed("", "Pod", [pod("p", "team-a", privileged=True)])
    ctl.step()
    assert sink.calls == []
    assert ctl.next_due() is None
    ctl.listed("", "Node", [node()])
    ctl.not_served("apps", "Deployment")
    ctl.not_served("apps", "ReplicaSet")
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:p"]


def test_a_violating_pod_appears_in_its_namespace_report_and_leaves_with_it(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock, report_interval_s=5.0)
    sync(ctl, [namespace("team-a"), namespace("team-b"), node(), pod("ok", "team-a")])
    ctl.step()
    assert fails(sink.report("team-a")) == []
    assert sink.report("team-a")["summary"]["pass"] > 0

    clock.now += 10
    ctl.event("ADDED", pod("bad", "team-a", privileged=True))
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:bad"]
    assert sink.report("team-a")["summary"]["fail"] == 1
    # one namespace re-evaluated, its report written once; team-b untouched
    assert ctl.counts.namespace_evaluations == 1
    assert [c for c in sink.calls if c[1] == "team-b"] == []

    clock.now += 10
    ctl.event("DELETED", pod("bad", "team-a", privileged=True))
    ctl.step()
    assert fails(sink.report("team-a")) == []

    clock.now += 10
    ctl.event("DELETED", pod("ok", "team-a"))
    ctl.step()
    assert sink.report("team-a") is None  # nothing left to report: deleted


def test_changes_within_the_interval_fold_into_one_write_per_report(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock, report_interval_s=5.0)
    sync(ctl, [namespace("team-a"), node()])
    ctl.step()
    writes_before = len([c for c in sink.calls if c[1] == "team-a"])
    for i in range(20):  # 20 violating pods within one second
        clock.now += 0.05
        ctl.event("ADDED", pod(f"bad-{i}", "team-a", privileged=True))
        ctl.step()
    # first write was allowed at once (no earlier write of this report); the rest wait
    assert ctl.pending == 1
    assert ctl.next_due() == pytest.approx(sink_first_write_time(ctl, clock) + 5.0)
    clock.now = ctl.next_due()
    ctl.step()
    team_a_writes = [c for c in sink.calls if c[1] == "team-a"][writes_before:]
    assert len(team_a_writes) == 2
    assert len(fails(sink.report("team-a"))) == 20
    assert ctl.pending == 0


def sink_first_write_time(ctl: WatchController, clock: Clock) -> float:
    return ctl._last_write[("PolicyReport", "team-a", "gpuguard-audit")]


def test_an_unchanged_report_is_not_written_again(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock)
    sync(ctl, [namespace("team-a"), node(), pod("bad", "team-a", privileged=True)])
    ctl.step()
    calls = len(sink.calls)
    clock.now += 30
    # a status-only change (new resourceVersion, same findings) re-evaluates, writes nothing
    changed = pod("bad", "team-a", privileged=True, version="2")
    changed["status"]["phase"] = "Pending"
    ctl.event("MODIFIED", changed)
    ctl.step()
    assert ctl.counts.namespace_evaluations == 1
    assert sink.calls[calls:] == []


def test_relist_after_410_neither_loses_nor_duplicates(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock, report_interval_s=1.0)
    objects = [namespace("team-a"), namespace("team-b"), node(),
               pod("bad-1", "team-a", privileged=True), pod("bad-2", "team-b", privileged=True)]
    sync(ctl, objects)
    ctl.step()
    before = {ns: fails(sink.report(ns)) for ns in ("team-a", "team-b")}
    calls = len(sink.calls)
    # the watch expired; meanwhile bad-2 was deleted and bad-3 created: the fresh list says so
    clock.now += 10
    ctl.listed("", "Pod", [pod("bad-1", "team-a", privileged=True),
                           pod("bad-3", "team-a", privileged=True)])
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:bad-1", "no-privileged-gpu:bad-3"]
    assert sink.report("team-b") is None  # its only workload is gone
    assert before["team-a"] == ["no-privileged-gpu:bad-1"]
    # a second identical relist (a reconnect) changes nothing and writes nothing
    clock.now += 10
    calls = len(sink.calls)
    ctl.listed("", "Pod", [pod("bad-1", "team-a", privileged=True),
                           pod("bad-3", "team-a", privileged=True)])
    ctl.event("ADDED", pod("bad-1", "team-a", privileged=True))  # replayed event
    ctl.step()
    assert sink.calls[calls:] == []
    assert ctl.counts.namespace_evaluations == 2  # team-a and team-b after the first relist


def test_failed_writes_stay_pending_and_are_retried(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock, report_interval_s=5.0)
    sync(ctl, [namespace("team-a"), node()])
    ctl.step()
    sink.failing = True  # the API server is restarting
    clock.now += 10
    ctl.event("ADDED", pod("bad", "team-a", privileged=True))
    ctl.step()
    assert ctl.pending == 1 and fails(sink.report("team-a")) == []
    sink.failing = False
    clock.now += 5
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:bad"]
    assert ctl.counts.writes["failed"] == 1


def test_owned_pods_are_judged_through_their_owner_and_evaluated_once(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock)
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "trainer-abc", "namespace": "team-a", "resourceVersion": "1",
                       "labels": {"kai.scheduler/queue": "team"}},
          "spec": {"replicas": 3, "template": pod("x", "team-a", privileged=True)}}
    rs["spec"]["template"] = {"metadata": {}, "spec": rs["spec"]["template"]["spec"]}
    pods = [pod(f"trainer-abc-{i}", "team-a", privileged=True, owner="trainer-abc")
            for i in range(3)]
    sync(ctl, [namespace("team-a"), node(), rs, *pods])
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:trainer-abc"]
    misses = ctl._memo.misses
    clock.now += 10
    ctl.event("ADDED", pod("trainer-abc-3", "team-a", privileged=True, owner="trainer-abc"))
    ctl.step()
    assert ctl._memo.misses == misses  # the owner's template is unchanged: no evaluation


def test_a_new_policy_set_re_evaluates_everything(update, tmp_path):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock)
    sync(ctl, [namespace("team-a"), node(), pod("bad", "team-a", privileged=True)])
    ctl.step()
    assert fails(sink.report("team-a")) == ["no-privileged-gpu:bad"]
    lenient = policy_set.load([str(_lenient_policy(tmp_path))], DEFAULT_SETTINGS)
    assert not lenient.errors
    clock.now += 10
    ctl.policies(PolicyUpdate(lenient.engine, (), lenient.engine.policies.digest))
    ctl.step()
    assert ctl.counts.full_evaluations == 2
    assert fails(sink.report("team-a")) == []


def _lenient_policy(folder):
    path = folder / "gpu-requested.yaml"
    path.write_text("""\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: gpu-pods-allowed}
spec:
  validationActions: [Deny]
  match: {resources: [pods]}
  validations:
    - expression: "gpu.requested || !gpu.requested"
      message: never fails
""")
    return path


def test_full_evaluation_feeds_the_metrics_and_the_cluster_report(update):
    sink, clock = RecordingSink(), Clock()
    seen: list[Mapping[str, Any]] = []
    ctl = WatchController(AuditSettings(now=WALL), update, sink, KINDS, clock=clock,
                          wall=lambda: WALL, watch=WatchSettings(full_every_s=60.0),
                          on_full=seen.append)
    sync(ctl, [namespace("team-a"), node(gpus=8), pod("a", "team-a")])
    ctl.step()
    assert len(seen) == 1
    assert seen[0]["cluster"]["gpu_equivalents"]["allocated"] == 1.0
    assert ("ClusterPolicyReport", None, "gpuguard-audit") in sink.objects
    clock.now += 1
    ctl.event("ADDED", pod("b", "team-a"))
    ctl.step()
    assert len(seen) == 1  # figures wait for the next full evaluation
    assert ctl.next_due() == pytest.approx(100.0 + 5.0)  # team-a's report: its next write
    clock.now = 105.0
    ctl.step()
    assert ctl.next_due() == pytest.approx(100.0 + 60.0)
    clock.now = 160.0
    ctl.step()
    assert len(seen) == 2
    assert seen[1]["cluster"]["gpu_equivalents"]["allocated"] == 2.0


def test_first_publish_prunes_reports_of_namespaces_gone(update):
    sink, clock = RecordingSink(), Clock()
    stale = {"kind": "PolicyReport", "metadata": {"name": "gpuguard-audit",
                                                  "namespace": "deleted-team"}}
    sink.objects[("PolicyReport", "deleted-team", "gpuguard-audit")] = stale
    ctl = controller(update, sink, clock)
    sync(ctl, [namespace("team-a"), node(), pod("a", "team-a")])
    ctl.step()
    assert sink.report("deleted-team") is None
    assert sink.report("team-a") is not None


def test_canonical_ignores_timestamps_only():
    a = {"kind": "PolicyReport", "metadata": {"name": "x", "resourceVersion": "5"},
         "results": [{"policy": "p", "timestamp": {"seconds": 1}}]}
    b = {"kind": "PolicyReport", "metadata": {"name": "x", "resourceVersion": "9"},
         "results": [{"policy": "p", "timestamp": {"seconds": 2}}]}
    c = {"kind": "PolicyReport", "metadata": {"name": "x"},
         "results": [{"policy": "q", "timestamp": {"seconds": 1}}]}
    assert canonical(a) == canonical(b)
    assert canonical(a) != canonical(c)


def test_the_watched_cluster_gives_the_batch_audits_figures_and_metrics(update):
    """The example cluster fed as lists: the full evaluation's report is the batch audit's (same
    findings, teams, nodes, MIG, idle GPUs from the DCGM scrape), and the metrics read it."""
    import contextlib
    import io
    import json

    from audit.scan.utilization import read_metrics
    from audit.sources.files import iter_snapshot
    from audit.watch.metrics import state_samples
    from gpuguard.cli import main
    from policies.sources import Document
    from tests.paths import ROOT

    example = ROOT / "examples" / "cluster"
    metrics = example / "metrics" / "dcgm-exporter.prom"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", "-f", str(example), "--metrics", str(metrics), "-o", "json",
                     "--jobs", "0"]) == 0
    batch = json.loads(out.getvalue())

    objects = [d.body for d in iter_snapshot([str(example)]) if isinstance(d, Document)]
    by_kind: dict[tuple[str, str], list] = {}
    for obj in objects:
        by_kind.setdefault((str(obj.get("apiVersion", "")).rpartition("/")[0], obj["kind"]),
                           []).append(obj)
    seen: list[Mapping[str, Any]] = []
    ctl = WatchController(AuditSettings(now=WALL), update, RecordingSink(), list(by_kind),
                          clock=Clock(), wall=lambda: WALL, on_full=seen.append,
                          utilization=lambda: read_metrics(str(metrics)))
    for (group, kind), items in by_kind.items():
        ctl.listed(group, kind, items)
    ctl.step()
    watched = seen[0]
    for section in ("findings", "teams", "nodes", "mig", "stranded", "namespaces"):
        assert watched[section] == batch[section], section
    assert watched["utilization"]["teams"] == batch["utilization"]["teams"]
    samples = state_samples(watched, 1.0)
    assert samples == state_samples(batch, 1.0)
    idle = dict(samples["gpuguard_team_gpu_equivalents_idle"])
    research = next(t for t in batch["teams"] if t["team"] == "research")
    assert idle[("research",)] == research["gpu_equivalents"]["idle_allocated"] > 0
    configured = dict(samples["gpuguard_mig_instances_configured"])
    assert configured == {(p["profile"],): float(p["configured"])
                          for p in batch["mig"]["profiles"]}
    assert all(len(labels) == 2 for labels, _ in
               samples["gpuguard_node_gpu_equivalents_stranded"])  # node, model: no pod names


def test_metrics_exposition_follows_the_last_full_evaluation():
    from prometheus_client.parser import text_string_to_metric_families

    from audit.watch.metrics import WatchMetrics

    metrics = WatchMetrics()
    report = {"teams": [{"team": "vision", "gpu_equivalents": {
        "allocated": 3.0, "pending": 1.0, "idle_allocated": None}}],
        "workloads": [], "nodes": [], "cluster": {}, "summary": {}, "mig": {}, "quotas": [],
        "policies": [{"policy": "no-privileged-gpu", "deny": 2, "warn": 0, "audit": 0,
                      "error": 0, "info": 0}]}
    metrics.state.update(report, 1700000000.0)

    def samples() -> dict[str, dict[tuple, float]]:
        text = metrics.exposition().decode()
        return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
                for f in text_string_to_metric_families(text)}

    first = samples()
    assert first["gpuguard_team_gpu_equivalents_allocated"] == {(("team", "vision"),): 3.0}
    assert first["gpuguard_team_gpu_equivalents_idle"] == {}  # unknown: absent, not 0
    assert first["gpuguard_audit_findings"][(("policy", "no-privileged-gpu"),
                                             ("severity", "deny"))] == 2.0
    assert first["gpuguard_audit_last_full_evaluation_timestamp_seconds"] == {(): 1700000000.0}
    report["teams"] = []
    metrics.state.update(report, 1700000060.0)
    assert samples()["gpuguard_team_gpu_equivalents_allocated"] == {}  # the team's series left


def test_latency_counts_from_the_changes_arrival_to_its_write(update):
    sink, clock = RecordingSink(), Clock()
    ctl = controller(update, sink, clock, report_interval_s=5.0)
    sync(ctl, [namespace("team-a"), node()])
    ctl.step()
    ctl.counts.latencies.clear()
    clock.now += 10
    # it arrived 3 s ago and waited in the queue while the loop was busy
    ctl.event("ADDED", pod("bad", "team-a", privileged=True), at=clock.now - 3)
    clock.now += 1  # the first write of this report may go at once
    ctl.event("ADDED", pod("bad-2", "team-a", privileged=True))  # folded in: oldest counts
    ctl.step()
    assert ctl.counts.latencies == [pytest.approx(4.0)]
