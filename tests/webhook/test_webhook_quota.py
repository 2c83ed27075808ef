"""GPUQuota on the webhook's /validate, through the HTTP app (in-memory ledger, a pod index)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.pod_cache import PodUsageIndex
from kube.quota_ledger import MemoryLedgerStore, QuotaLedger
from tests.core.test_quota import Clock, DownStore, pod
from tests.fakes.webhook_harness import JSON, Harness, envelope, gpu_policy, write_policies
from webhook.quota import QuotaGate

NAMESPACES = {
    "a-ns": {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "a-ns", "labels": {"kubernetes.io/metadata.name": "a-ns",
                                                     "team": "team-a"}}},
}
pytestmark = pytest.mark.asyncio
MESSAGE = ("team team-a (GPUQuota team-a) uses 7 of 8 GPU-equivalents; this pod needs 2 "
           "(headroom 1 GPU-equivalents)")


def gpu_quota(name: str = "team-a", failure_policy: str = "Fail", **limits: Any) -> str:
    return yaml.safe_dump({
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota", "metadata": {"name": name},
        "spec": {"scope": {"team": {"label": "team", "value": "team-a"}},
                 "limits": limits or {"gpuEquivalents": 8}, "failurePolicy": failure_policy}})


# Warns with the quota figures CEL sees (the request's charge and the team's usage).
HEADROOM = gpu_policy("quota-visible", {
    "validationActions": ["Warn"], "match": {"resources": ["pods"]},
    "validations": [{
        "expression": "!has(quota.quotas)",
        "messageExpression": "'team-a used ' + string(quota.quotas['team-a'].used.gpuEquivalents)"
                             " + ', request ' + string(quota.request.gpuEquivalents)"
                             " + ', headroom ' + "
                             "string(quota.quotas['team-a'].headroomGpuEquivalents)"}]})
DENY_BIG = gpu_policy("no-three", {
    "match": {"resources": ["pods"]},
    "validations": [{"expression": "!has(quota.request) || quota.request.gpuEquivalents != 3.0",
                     "message": "no 3-GPU pods"}]})


class Setup:
    """A harness with a quota gate over an in-memory ledger and a pod index."""

    def __init__(self, tmp_path: Path, *documents: str, store: Any = None) -> None:
        self.policies = write_policies(tmp_path, *documents)
        self.index = PodUsageIndex(lambda ns: (NAMESPACES.get(ns) or {"metadata": {}})
                                   ["metadata"].get("labels") or {})
        self.index.upsert(pod("running", "a-ns", {"nvidia.com/gpu": 7}))
        self.store = store or MemoryLedgerStore()
        self.ledger = QuotaLedger(self.store, self.index, clock=Clock(), sleep=lambda s: None)
        self.gate = QuotaGate(self.ledger, self.index.namespace_labels)
        self.harness = Harness([self.policies], namespaces=NAMESPACES, quota=self.gate)
        assert self.harness.result.outcome == "loaded", self.harness.result.errors


def pod_review(name: str, gpus: int, uid: str = "u1", **extra: Any) -> dict[str, Any]:
    obj = pod(name, "a-ns", {"nvidia.com/gpu": gpus})
    return envelope({"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                     "operation": "CREATE", "namespace": "a-ns", "name": name,
                     "userInfo": {"username": "alice"}, "object": obj, **extra})


async def validate(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/validate", data=json.dumps(body), headers=JSON)
    assert response.status == 200
    return (await response.json())["response"]


async def test_over_quota_is_denied_with_the_quota_message(aiohttp_client, tmp_path):
    setup = Setup(tmp_path, gpu_quota(), HEADROOM)
    client = await aiohttp_client(setup.harness.app)
    answer = await validate(client, pod_review("big", 2))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert answer["status"]["reason"] == "Forbidden"
    assert answer["status"]["message"] == MESSAGE
    assert setup.ledger.reservations(setup.gate.admission(
        setup.harness.store.current.engine.policies.quotas).quotas[0]) == {}
    # One GPU fits: admitted, reserved, and CEL saw the figures before this pod.
    fits = await validate(client, pod_review("one", 1, "u2"))
    assert fits["allowed"] is True
    assert fits["warnings"] == ["quota-visible: team-a used 7, request 1, headroom 1"]
    quota = setup.harness.store.current.engine.policies.quotas[0]
    assert list(setup.ledger.reservations(quota)) == ["a-ns/one/u2"]
    # Now full: the next 1-GPU pod is denied.
    full = await validate(client, pod_review("two", 1, "u3"))
    assert full["status"]["message"] == ("team team-a (GPUQuota team-a) uses 8 of 8 "
                                         "GPU-equivalents; this pod needs 1 (headroom 0 "
                                         "GPU-equivalents)")
    setup.harness.close()


async def test_dry_run_is_checked_but_never_reserves(aiohttp_client, tmp_path):
    setup = Setup(tmp_path, gpu_quota(), HEADROOM)
    client = await aiohttp_client(setup.harness.app)
    quota = setup.harness.store.current.engine.policies.quotas[0]
    for uid in ("d1", "d2"):
        answer = await validate(client, pod_review("dry", 1, uid, dryRun=True))
        assert answer["allowed"] is True
    assert setup.ledger.reservations(quota) == {}
    over = await validate(client, pod_review("dry-big", 2, "d3", dryRun=True))
    assert over["status"]["message"] == MESSAGE
    setup.harness.close()


async def test_a_policy_denial_gives_the_reservation_back(aiohttp_client, tmp_path):
    setup = Setup(tmp_path, gpu_quota(gpuEquivalents=20), DENY_BIG)
    client = await aiohttp_client(setup.harness.app)
    answer = await validate(client, pod_review("three", 3))
    assert answer["allowed"] is False
    assert answer["status"]["message"] == "no-three: no 3-GPU pods"
    setup.harness.executor.shutdown(wait=True)  # the release ran on the quota executor
    quota = setup.harness.store.current.engine.policies.quotas[0]
    assert setup.ledger.reservations(quota) == {}


class SlowStore(MemoryLedgerStore):
    """A ledger whose writes wait for ``go``: the only way to make the quota step miss the
    deadline on demand (in a cluster: a loaded API server, many replicas racing)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.writing = threading.Event()
        self.writes = 0

    def write(self, *args: Any) -> str:
        self.writing.set()
        assert self.go.wait(10)
        version = super().write(*args)
        self.writes += 1
        return version


async def test_a_reservation_written_after_the_deadline_is_given_back(aiohttp_client,
                                                                      tmp_path):
    """Found by tests/controlplane/test_quota_e2e.py: 500 creates through kube-apiserver
    admitted 37 of a 40-GPU quota, the other 3 held by reservations of requests already
    answered 'did not finish within the deadline'."""
    store = SlowStore()
    setup = Setup(tmp_path, gpu_quota(), HEADROOM, store=store)
    setup.harness.admitter.settings = dataclasses.replace(setup.harness.settings,
                                                          deadline_ms=50)
    client = await aiohttp_client(setup.harness.app)
    answering = asyncio.ensure_future(validate(client, pod_review("late", 1)))
    # the quota step is past its read, writing; then the deadline passes (the harness's clock
    # moves only when told, so this does not depend on how fast the machine is)
    assert await asyncio.to_thread(store.writing.wait, 10)
    setup.harness.timer.advance(1.0)
    answer = await answering
    assert answer["allowed"] is False
    assert "did not finish within the 50 ms deadline" in answer["status"]["message"]
    store.go.set()  # the write lands after the answer ...
    quota = setup.harness.store.current.engine.policies.quotas[0]
    end = time.monotonic() + 10
    while not (store.writes >= 2 and setup.ledger.reservations(quota) == {}):
        assert time.monotonic() < end, (store.writes, setup.ledger.reservations(quota))
        await asyncio.sleep(0.01)
    # ... and is given back: the reservation, then the release
    setup.harness.close()


class BrokenReleaseStore(SlowStore):
    """A ledger whose second write (the release) waits for ``go`` and then raises a bug's
    error: a release that fails after the request's deadline cannot be made on demand with a
    real API server."""

    def write(self, *args: Any) -> str:
        if self.writes == 0:
            self.writes += 1
            return MemoryLedgerStore.write(self, *args)
        self.writing.set()
        assert self.go.wait(10)
        raise RuntimeError("the ledger's bug")


async def test_a_release_that_fails_after_the_deadline_is_logged_not_lost(aiohttp_client,
                                                                         tmp_path, caplog):
    """The denial is answered at the deadline; the release's later error is one JSON warning
    (it was asyncio's "Future exception was never retrieved", outside the JSON log)."""
    caplog.set_level("WARNING")
    store = BrokenReleaseStore()
    setup = Setup(tmp_path, gpu_quota(gpuEquivalents=20), DENY_BIG, store=store)
    setup.harness.admitter.settings = dataclasses.replace(setup.harness.settings,
                                                          deadline_ms=50)
    client = await aiohttp_client(setup.harness.app)
    answering = asyncio.ensure_future(validate(client, pod_review("three", 3)))
    assert await asyncio.to_thread(store.writing.wait, 10)  # the release is writing
    setup.harness.timer.advance(1.0)
    answer = await answering
    assert answer["allowed"] is False and answer["status"]["message"] == \
        "no-three: no 3-GPU pods"
    store.go.set()
    end = time.monotonic() + 10
    failed: list[Any] = []
    while not failed:
        assert time.monotonic() < end
        await asyncio.sleep(0.01)
        failed = [r for r in caplog.records if r.getMessage().startswith(
            "releasing the quota reservations of a denied request failed")]
    assert len(failed) == 1 and failed[0].fields == {
        "error": "RuntimeError: the ledger's bug", "quotas": ["team-a"]}
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    setup.harness.close()


@pytest.mark.parametrize(("policy", "allowed"), [("Fail", False), ("Ignore", True)])
async def test_unreachable_ledger_follows_the_quota_failure_policy(aiohttp_client, tmp_path,
                                                                   policy, allowed):
    setup = Setup(tmp_path, gpu_quota(failure_policy=policy), HEADROOM, store=DownStore())
    client = await aiohttp_client(setup.harness.app)
    answer = await validate(client, pod_review("p", 1))
    assert answer["allowed"] is allowed
    text = "GPUQuota team-a: usage could not be checked (connection refused)"
    if allowed:
        assert answer["warnings"][0] == f"{text}; admitted (failurePolicy Ignore)"
    else:
        assert answer["status"]["message"] == f"{text}; failurePolicy Fail"
        assert answer["status"]["code"] == 403
    setup.harness.close()


async def test_before_the_pod_watch_synced_quotas_follow_failure_policy_and_not_ready(
        aiohttp_client, tmp_path):
    """Counting no pods would admit past every limit right after a start or a restart."""
    setup = Setup(tmp_path, gpu_quota(), HEADROOM)
    watch = {"synced": False}
    setup.gate.usage_status = lambda: (watch["synced"], "watching" if
                                       watch["synced"] else "waiting for the first list of "
                                       "the cluster's pods (last error: 403 Forbidden)")
    setup.gate.source = "pod watch"
    client = await aiohttp_client(setup.harness.app)
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert (await ready.json())["checks"]["quotaUsage"] == {
        "ok": False, "detail": "pod watch: waiting for the first list of the cluster's pods "
                               "(last error: 403 Forbidden)"}
    answer = await validate(client, pod_review("p", 1))
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "GPUQuota team-a: usage could not be checked (pod watch: waiting for the first list of "
        "the cluster's pods (last error: 403 Forbidden)); failurePolicy Fail")
    watch["synced"] = True
    assert (await client.get("/readyz")).status == 200
    assert (await validate(client, pod_review("p", 1, "u2")))["allowed"] is True
    setup.harness.close()


class Untouchable:
    """A quota gate that fails the test when used."""

    def admit(self, *args: Any) -> Any:
        raise AssertionError("the quota step ran without GPUQuota documents")


async def test_no_quota_loaded_means_no_quota_step_and_reload_brings_quotas(aiohttp_client,
                                                                          tmp_path):
    policies = write_policies(tmp_path, HEADROOM)
    harness = Harness([policies], namespaces=NAMESPACES, quota=Untouchable())
    client = await aiohttp_client(harness.app)
    answer = await validate(client, pod_review("p", 2))
    assert answer["allowed"] is True and "warnings" not in answer
    assert "quota" not in json.dumps(answer)
    harness.close()
    # Hot reload: the GPUQuota added to the policy files is enforced by the next request.
    setup = Setup(tmp_path / "second", HEADROOM)
    client = await aiohttp_client(setup.harness.app)
    assert (await validate(client, pod_review("p", 2)))["allowed"] is True
    write_policies(tmp_path / "second", HEADROOM, gpu_quota())
    assert setup.harness.store.check().outcome == "retry"  # loaded once it holds still
    assert setup.harness.store.check().outcome == "loaded"
    answer = await validate(client, pod_review("p", 2, "u2"))
    assert answer["status"]["message"] == MESSAGE
    setup.harness.close()


async def test_mutate_and_other_kinds_are_not_charged(aiohttp_client, tmp_path):
    setup = Setup(tmp_path, gpu_quota(), HEADROOM)
    client = await aiohttp_client(setup.harness.app)
    response = await client.post("/mutate", data=json.dumps(pod_review("big", 2)),
                                 headers=JSON)
    assert (await response.json())["response"]["allowed"] is True
    quota = setup.harness.store.current.engine.policies.quotas[0]
    assert setup.ledger.reservations(quota) == {}
    setup.harness.close()


async def test_the_decision_log_names_who_denied_from_the_decisions(aiohttp_client, tmp_path,
                                                                    caplog):
    """deniedBy comes from the quota and policy names the decisions carry (QuotaDecision
    .denied_by, Verdict.denied_by), not from parsing the messages users read."""
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    no_nope = gpu_policy("no-nope", {"match": {"resources": ["pods"]}, "validations": [
        {"expression": "object.metadata.name != 'nope'", "message": "GPUQuota team-a: no"}]})
    setup = Setup(tmp_path, gpu_quota(), gpu_quota("team-a-small", gpuEquivalents=7.5), no_nope)
    client = await aiohttp_client(setup.harness.app)
    over = await validate(client, pod_review("big", 1))  # 7 running + 1 > 7.5
    assert over["status"]["message"].startswith("team team-a (GPUQuota team-a-small) uses 7")
    setup.harness.close()
    setup = Setup(tmp_path, gpu_quota(), no_nope)
    client = await aiohttp_client(setup.harness.app)
    nope = await validate(client, pod_review("nope", 1, "u2"))
    assert nope["status"]["message"] == "no-nope: GPUQuota team-a: no"
    # Released before the answer (was fire-and-forget: under load the next pod was sometimes
    # denied over quota by the reservation of the pod refused just before it).
    quota = setup.gate.admission(setup.harness.store.current.engine.policies.quotas).quotas[0]
    assert setup.ledger.reservations(quota) == {}
    assert (await validate(client, pod_review("fine", 1, "u3")))["allowed"] is True
    denied_by = [r.fields.get("deniedBy") for r in caplog.records
                 if r.name == "gpuguard.webhook.admission"]
    assert denied_by == [["GPUQuota/team-a-small"], ["no-nope"], None]
    setup.harness.close()


async def test_a_quota_only_policy_set_is_described_by_its_quota_not_as_empty(
        aiohttp_client, tmp_path):
    """A fresh-context trial's find: a policy file holding only a GPUQuota was "no policies
    found" (check) and "0 policies" (/readyz) — a quota is a policy source, and it is
    enforced."""
    setup = Setup(tmp_path, gpu_quota())
    client = await aiohttp_client(setup.harness.app)
    ready = await client.get("/readyz")
    detail = (await ready.json())["checks"]["policies"]["detail"]
    assert detail.startswith("0 policies and 1 GPUQuota(s) from ")
    answer = await validate(client, pod_review("p", 2))
    assert answer["allowed"] is False and answer["status"]["message"] == MESSAGE
    setup.harness.close()
