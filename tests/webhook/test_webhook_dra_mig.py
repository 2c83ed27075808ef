"""GPUQuota ``mig`` limits on the webhook's /validate for DRA pods (trial finding 2): the
webhook sees the pod alone, so a claim whose devices it cannot know may be MIG slices — unknown
size, denied under ``unknownSize: Deny``, never admitted as if it held no slice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.pod_cache import PodUsageIndex
from kube.quota_ledger import MemoryLedgerStore, QuotaLedger
from tests.builders.corpus import documents
from tests.core.test_quota import Clock
from tests.fakes.webhook_harness import JSON, Harness, envelope, write_policies
from webhook.quota import QuotaGate

pytestmark = pytest.mark.asyncio
NAMESPACES = {"team-llm": {"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": "team-llm",
                                        "labels": {"kubernetes.io/metadata.name": "team-llm"}}}}


def _harness(tmp_path: Path, unknown_size: str | None = None) -> Harness:
    quota = documents("trial/quota/quota.yaml")[0]
    if unknown_size:
        quota["spec"]["unknownSize"] = unknown_size
    policies = write_policies(tmp_path, yaml.safe_dump(quota))
    index = PodUsageIndex(lambda ns: {})
    ledger = QuotaLedger(MemoryLedgerStore(), index, clock=Clock(), sleep=lambda s: None)
    harness = Harness([policies], namespaces=NAMESPACES, quota=QuotaGate(ledger, lambda ns: {}))
    assert harness.result.outcome == "loaded", harness.result.errors
    return harness


def _review(name: str) -> dict[str, Any]:
    pod = next(d for d in documents("trial/dra/mig-only.yaml") if d["metadata"]["name"] == name)
    return envelope({"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                     "operation": "CREATE", "namespace": "team-llm", "name": name,
                     "userInfo": {"username": "alice"}, "object": pod})


async def _validate(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/validate", data=json.dumps(body), headers=JSON)
    assert response.status == 200
    return (await response.json())["response"]


async def test_two_dra_slices_are_denied_by_a_mig_limit(aiohttp_client, tmp_path) -> None:
    harness = _harness(tmp_path)
    client = await aiohttp_client(harness.app)
    answer = await _validate(client, _review("p-mig"))
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert answer["status"]["message"] == (
        "GPUQuota llm-mig: the MIG slices of this pod are unknown (spec.resourceClaims[0]: the "
        "devices of mig-only are not known (they may be MIG slices)), so its mig limits cannot "
        "be checked (unknownSize: Deny)")
    harness.close()


async def test_unknown_size_allow_admits_it(aiohttp_client, tmp_path) -> None:
    harness = _harness(tmp_path, "Allow")
    client = await aiohttp_client(harness.app)
    assert (await _validate(client, _review("p-mig")))["allowed"] is True
    harness.close()
