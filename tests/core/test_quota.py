"""GPUQuota: documents, usage arithmetic, the check, the ledger protocol and the CEL variable."""

from __future__ import annotations

import glob
from fractions import Fraction
from typing import Any

import pytest

from kube.pod_cache import PodUsageIndex
from kube.quota_ledger import (
    LedgerState,
    LedgerUnavailable,
    MemoryLedgerStore,
    QuotaAdmission,
    QuotaLedger,
)
from policies.facts.workloads import find_workload
from policies.policy.loader import load_quotas
from policies.policy.quota import (
    ZERO,
    QuotaStatus,
    Usage,
    check,
    parse_quota,
    pod_charge,
    request_charge,
    usage_of,
)
from policies.sources import read_documents

QUOTA = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota"}


def quota(name: str = "team-a", scope: dict | None = None, **limits: Any) -> Any:
    body = {**QUOTA, "metadata": {"name": name},
            "spec": {"scope": scope or {"team": {"label": "team", "value": "team-a"}},
                     "limits": limits or {"gpuEquivalents": 8}}}
    built, errors = parse_quota(body)
    assert not errors
    return built


def pod(name: str = "p", namespace: str = "a", limits: dict | None = None,
        selector: dict | None = None, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"nodeSelector": selector or {}, "containers": [
                {"name": "c", "resources": {"limits": limits or {"nvidia.com/gpu": 1}}}]}}


def _manifest_pods() -> dict[str, dict]:
    """Each manifest's first pod: a Pod itself, or a pod made from a workload's first template."""
    documents, _ = read_documents(sorted(glob.glob("tests/data/manifests/*.yaml")))
    out: dict[str, dict] = {}
    for document in documents:
        name = document.source.rsplit("/", 1)[-1]
        body = document.body
        if body.get("kind") == "Pod":
            out.setdefault(name, body)
            continue
        workload = find_workload(body)
        if workload and workload.templates and name not in out:
            template = workload.templates[0]
            out[name] = {"kind": "Pod", "metadata": {**template.metadata, "namespace": "a"},
                         "spec": dict(template.spec)}
    return out


MANIFESTS = _manifest_pods()

# file → (GPU-equivalents, whole devices, MIG, GPU memory MiB, unknown size)
TABLE = {
    "gpuop__cuda-vector-add-legacy-pod.yaml": ("1", {"nvidia.com/gpu": 1}, {}, 0, False),
    "gke__vllm-gemma3-27b-a100-deployment.yaml": ("2", {"nvidia.com/gpu": 2}, {}, 0, False),
    "lws__vllm-gpu-leaderworkerset.yaml": ("8", {"nvidia.com/gpu": 8}, {}, 0, False),
    "vllm__mistral-7b-amd-rocm-deployment.yaml": ("1", {"amd.com/gpu": 1}, {}, 0, False),
    # MIG on several models
    "triton__mig-1g.5gb-deployment.yaml": ("1/7", {}, {"1g.5gb": 1}, 0, False),
    "hami__static-mig-3g.20gb.yaml": ("3/7", {}, {"3g.20gb": 1}, 0, False),
    # KAI fractions
    "kai__gpu-fraction-init-container.yaml": ("1/2", {}, {}, 0, False),
    "kai__gpu-fraction-non-default-container.yaml": ("1/2", {}, {}, 0, False),
    "kai__gpu-memory-annotation.yaml": ("0", {}, {}, 2000, True),
    # HAMi
    "hami__default-use-gpumem-gpucores.yaml": ("3/5", {"nvidia.com/gpu": 2}, {}, 6000, False),
    "hami__gpumem-percentage.yaml": ("3/5", {"nvidia.com/gpu": 2}, {}, 0, False),
    "kueue__hami-deployment-clusterqueue.yaml": ("3/10", {"nvidia.com/gpu": 1}, {}, 1024, False),
    # shared (MPS / time-slicing): a replica, size unknown without --shared-replicas
    "gpuop__mps-deployment-sharing-strategy-nodeselector.yaml":
        ("0", {"nvidia.com/gpu": 1}, {}, 0, True),
    # DRA claim whose template is elsewhere: size unknown
    "dradriver__pod-two-gpus-resourceclaimtemplate.yaml": ("0", {}, {}, 0, True),
    "k8sdocs__example-vector-add-vendor-neutral.yaml": ("0", {}, {}, 0, False),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_usage_table_from_manifests(name: str) -> None:
    equivalents, gpus, migs, memory, unknown = TABLE[name]
    charge = pod_charge(MANIFESTS[name])
    assert charge.usage.gpu_equivalents == Fraction(equivalents)
    assert dict(charge.usage.gpus) == gpus
    assert dict(charge.usage.mig) == migs
    assert charge.usage.gpu_memory_mib == memory
    assert bool(charge.unknown_reasons) is unknown
    assert charge.usage.pods == 1


@pytest.mark.parametrize(("resource", "product", "equivalents"), [
    ("nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3", Fraction(3, 7)),
    ("nvidia.com/mig-2g.12gb", "NVIDIA-A30", Fraction(1, 2)),
    ("nvidia.com/mig-1g.10gb", "NVIDIA-A100-SXM4-80GB", Fraction(1, 7)),
])
def test_mig_on_several_models_counts_per_product(resource, product, equivalents) -> None:
    usage = pod_charge(pod(limits={resource: 1},
                           selector={"nvidia.com/gpu.product": product})).usage
    assert usage.gpu_equivalents == equivalents
    assert dict(usage.products) == {product: equivalents}


def test_table_sums_and_finished_pods_are_free() -> None:
    pods = [MANIFESTS[n] for n in TABLE]
    total = usage_of(pods, quota(scope={"cluster": {}}), {})
    assert total.gpu_equivalents == sum(Fraction(v[0]) for v in TABLE.values())
    assert total.unknown == 3
    done = {**pod(), "status": {"phase": "Succeeded"}}
    assert pod_charge(done).usage == ZERO
    assert usage_of([pod(namespace="b")], quota(scope={"namespace": "a"}), {}) == ZERO


def test_denial_message_has_limit_usage_and_headroom_in_one_unit() -> None:
    q = quota()
    used = Usage(gpu_equivalents=Fraction(15, 2))
    problems = check(q, used, pod_charge(pod()))
    assert problems == ["team team-a (GPUQuota team-a) uses 7.5 of 8 GPU-equivalents; this pod "
                        "needs 1 (headroom 0.5 GPU-equivalents)"]
    assert check(q, Usage(gpu_equivalents=Fraction(7)), pod_charge(pod())) == []


def test_every_dimension_is_checked() -> None:
    q = quota(gpus={"nvidia.com/gpu": 2}, gpuMemoryGiB=4, mig={"1g.10gb": 1},
              products={"NVIDIA-A100-SXM4-80GB-MIG-1g.10gb": 0.5}, perPod={"gpuEquivalents": 1})
    assert dict(q.limits.products) == {"NVIDIA-A100-SXM4-80GB": Fraction(1, 2)}
    big = pod_charge(pod(limits={"nvidia.com/gpu": 3}))
    text = " | ".join(check(q, ZERO, big))
    assert "at most 1 per pod" in text and "uses 0 of 2 nvidia.com/gpu; this pod needs 3" in text
    mig = pod_charge(pod(limits={"nvidia.com/mig-1g.10gb": 4},
                         selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}))
    text = " | ".join(check(q, ZERO, mig))
    assert "MIG 1g.10gb instances" in text and "GPU-equivalents of NVIDIA-A100-SXM4-80GB" in text
    memory = pod_charge(MANIFESTS["hami__default-use-gpumem-gpucores.yaml"])
    assert any("GiB of GPU memory" in p and "this pod needs 5.859" in p
               for p in check(q, ZERO, memory))


def test_unknown_size_is_denied_unless_allowed() -> None:
    shared = pod_charge(MANIFESTS["kai__gpu-memory-annotation.yaml"])
    assert "unknown" in check(quota(), ZERO, shared)[0]
    body = {**QUOTA, "metadata": {"name": "q"}, "spec": {
        "scope": {"cluster": {}}, "limits": {"gpuEquivalents": 1}, "unknownSize": "Allow"}}
    assert check(parse_quota(body)[0], ZERO, shared) == []


def test_request_charge_counts_pods_once_and_updates_by_increase() -> None:
    deployment = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {
        "replicas": 3, "template": {"spec": pod()["spec"]}}}
    assert request_charge("CREATE", deployment) is None
    assert request_charge("DELETE", pod()) is None
    assert request_charge("CREATE", pod()).usage.gpu_equivalents == 1
    grown = request_charge("UPDATE", pod(limits={"nvidia.com/gpu": 3}), pod())
    assert grown.usage.gpu_equivalents == 2 and dict(grown.usage.gpus) == {"nvidia.com/gpu": 2}
    shrunk = request_charge("UPDATE", pod(), pod(limits={"nvidia.com/gpu": 3}))
    assert shrunk.usage.empty


def test_loader_validates_quota_documents(tmp_path) -> None:
    good = tmp_path / "q.yaml"
    good.write_text("""
apiVersion: gpuguard.io/v1alpha1
kind: GPUQuota
metadata: {name: team-a}
spec:
  scope: {team: {label: team, value: team-a}}
  limits: {gpuEquivalents: 7.5, gpus: {nvidia.com/gpu: 8}, mig: {1g.10gb: 7}}
---
apiVersion: gpuguard.io/v1alpha1
kind: GPUQuota
metadata: {name: bad}
spec:
  scope: {namespace: x, cluster: {}}
  limits: {gpuEquivalents: -1, mig: {huge: 1}, gpus: {nvidia.com/gpu: 1.5}}
""")
    quotas, errors = load_quotas([str(good)])
    assert [q.name for q in quotas] == ["team-a"]
    assert quotas[0].limits.gpu_equivalents == Fraction(15, 2)
    text = "\n".join(map(str, errors))
    for fragment in ("spec.scope", "spec.limits.gpuEquivalents", "spec.limits.mig",
                     "spec.limits.gpus.nvidia.com/gpu"):
        assert fragment in text, text
    assert all(":1" in str(e).split(": document")[0] for e in errors)  # a line number


# --- the ledger protocol, on the in-memory store -------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def admission(quotas, index=None, store=None, clock=None, **kwargs):
    index = index or PodUsageIndex(lambda ns: {"team": "team-a"} if ns.startswith("a") else {})
    ledger = QuotaLedger(store or MemoryLedgerStore(), index, clock=clock or Clock(),
                         sleep=lambda s: None, **kwargs)
    return QuotaAdmission(quotas, ledger, index.namespace_labels), index


def request(obj: dict, uid: str = "u1", operation: str = "CREATE", **extra: Any) -> dict:
    return {"uid": uid, "operation": operation, "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"], "object": obj, **extra}


def test_reservations_hold_until_the_watch_shows_the_pod_then_expire() -> None:
    clock = Clock()
    check_, index = admission([quota(gpuEquivalents=2)], clock=clock, settle_s=5, ttl_s=60)
    first, second = pod("p1"), pod("p2")
    assert check_.admit(request(first, "u1")).allowed
    assert check_.admit(request(second, "u2")).allowed
    denied = check_.admit(request(pod("p3"), "u3"))
    assert not denied.allowed and "uses 2 of 2 GPU-equivalents" in denied.denials[0]
    # the same request again (API server retry) is admitted without a second reservation
    assert check_.admit(request(first, "u1")).allowed
    ledger, q = check_.ledger, check_.quotas[0]
    assert len(ledger.reservations(q)) == 2
    index.upsert(first)  # the watch shows p1: counted once, not twice
    assert ledger.status(q).used.gpu_equivalents == 2
    clock.now += 5
    assert ledger.prune(q) == 1  # p1 settled; p2 still reserved (not in the watch)
    clock.now += 60
    assert ledger.prune(q) == 0  # p2 was never created: expired
    assert ledger.status(q).used.gpu_equivalents == 1


class EventBeforeRead:
    """A usage source (a :class:`PodUsageIndex`) that applies one pod watch event just before
    its ``n``-th read: each point where the watch thread can land inside a quota check, made
    deterministic instead of left to thread scheduling."""

    def __init__(self, index: PodUsageIndex, obj: dict, n: int) -> None:
        self.index, self.obj, self.n, self.reads = index, obj, n, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.index, name)

        def read(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            if self.reads == self.n:
                self.index.upsert(self.obj)
            return method(*args, **kwargs)
        return read


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])  # read 1 is p1's own admission
def test_a_reserved_pod_is_counted_once_wherever_its_watch_event_lands(n: int) -> None:
    # A CI run admitted 41 of 40: the scope was summed before p1's event and p1 was looked up
    # after it, so p1 was subtracted without having been added (counted zero times; n=3 here
    # before the fix).
    clock = Clock()
    index = PodUsageIndex(lambda ns: {"team": "team-a"})
    team = quota(gpuEquivalents=1)
    first = pod("p1")
    ledger = QuotaLedger(MemoryLedgerStore(), EventBeforeRead(index, first, n), clock=clock,
                         sleep=lambda s: None, settle_s=5, ttl_s=60)
    check_ = QuotaAdmission([team], ledger, index.namespace_labels)
    assert check_.admit(request(first, "u1")).allowed  # p1 reserved, not yet in the watch
    for name in ("p2", "p3"):
        denied = check_.admit(request(pod(name), name))
        assert not denied.allowed, name
        assert "uses 1 of 1 GPU-equivalents" in denied.denials[0]
    assert ledger.status(team).used.gpu_equivalents == 1


def test_dry_run_never_reserves_and_denial_releases_other_quotas() -> None:
    team, namespace = quota(gpuEquivalents=4), quota("ns-a", {"namespace": "a"}, gpuEquivalents=1)
    check_, _ = admission([team, namespace])
    dry = check_.admit(request(pod(), dryRun=True))
    assert dry.allowed and dry.reserved == ()
    assert check_.ledger.reservations(team) == {}
    assert check_.admit(request(pod("p1"), "u1")).reserved == ("ns-a", "team-a")
    denied = check_.admit(request(pod("p2"), "u2"))
    assert not denied.allowed and "namespace a (GPUQuota ns-a)" in denied.denials[0]
    assert denied.denied_by == ("ns-a",)  # the quota's name, not parsed from its message
    assert len(check_.ledger.reservations(team)) == 1  # p2's team reservation was released


class DownStore:
    def read(self, name: str) -> LedgerState:
        raise LedgerUnavailable("connection refused")

    def write(self, *args: Any) -> str:
        raise LedgerUnavailable("connection refused")


@pytest.mark.parametrize(("policy", "allowed"), [("Fail", False), ("Ignore", True)])
def test_unreachable_api_follows_failure_policy(policy: str, allowed: bool) -> None:
    body = {**QUOTA, "metadata": {"name": "q"}, "spec": {
        "scope": {"cluster": {}}, "limits": {"gpuEquivalents": 1}, "failurePolicy": policy}}
    check_, _ = admission([parse_quota(body)[0]], store=DownStore())
    decision = check_.admit(request(pod()))
    assert decision.allowed is allowed
    assert "connection refused" in (decision.denials + decision.warnings)[0]
    assert decision.denied_by == (() if allowed else ("q",))


def test_cel_sees_the_same_numbers() -> None:
    from policies.cel.gpu import GPU_LIBRARY
    from policies.cel.runtime import CelEnvironment
    from policies.engine.evaluation import Engine
    from policies.facts.review import from_request
    from policies.policy.loader import build_policy_set
    from policies.sources import Document, parse_text

    text = """
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata: {name: quota-headroom-warning}
spec:
  validationActions: [Warn]
  match: {resources: [pods]}
  validations:
  - expression: >-
      !has(quota.quotas) || !('team-a' in quota.quotas) ||
      quota.quotas['team-a'].used.gpuEquivalents + quota.request.gpuEquivalents
        <= 0.5 * quota.quotas['team-a'].limits.gpuEquivalents
    messageExpression: "'team-a would be at ' + string(quota.quotas['team-a'].used.gpuEquivalents
      + quota.request.gpuEquivalents) + ' GPU-equivalents'"
"""
    env = CelEnvironment(GPU_LIBRARY)
    documents = [Document("p.yaml", i, None, body, lines)
                 for i, body, lines in parse_text("p.yaml", text, with_lines=True)]
    policy_set, errors = build_policy_set(documents, env)
    assert not errors
    engine = Engine(policy_set, env)
    check_, index = admission([quota(gpuEquivalents=4)])
    index.upsert(pod("running", limits={"nvidia.com/gpu": 2}))
    req = request(pod("new"))
    decision = check_.admit(req)
    assert decision.cel["quotas"]["team-a"]["used"]["gpuEquivalents"] == 2.0
    verdict = engine.evaluate(from_request({**req, "kind": {"kind": "Pod"}}),
                              quota=decision.cel)
    assert verdict.warning_texts == (
        "quota-headroom-warning: team-a would be at 3 GPU-equivalents",)


def test_quota_status_states() -> None:
    q = quota(gpuEquivalents=10)
    assert QuotaStatus(q, Usage(gpu_equivalents=Fraction(11))).state() == "over"
    assert QuotaStatus(q, Usage(gpu_equivalents=Fraction(9))).state() == "near"
    assert QuotaStatus(q, Usage(gpu_equivalents=Fraction(1))).state() == "ok"
