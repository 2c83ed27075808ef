"""The live path: the real ``kubernetes`` client against a local fake kube-apiserver.

The fake (tests/fakes/fake_kube_api.py, an aiohttp app on 127.0.0.1) serves examples/cluster with
``limit`` / ``continue`` pagination, a continue token that expires (410 Gone), throttling (429 with
Retry-After), CRDs that are not installed (404) and a forbidden resource (403). Waits are recorded,
never slept, and nothing is timed.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from audit.report.assemble import assemble
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from audit.sources.cluster import ClusterScan, iter_cluster
from audit.sources.files import iter_snapshot
from gpuguard import policy_set
from gpuguard.cli import main
from kube.config import ClusterConfigError
from kube.connect import connect
from kube.lists import Lister, ListError, NotServed, Resource
from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.sources import Document, LoadError
from tests.builders.inventory_scenario import NOW
from tests.fakes.fake_kube_api import FakeKubeAPI
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return [d.body for d in iter_snapshot([str(EXAMPLE)]) if isinstance(d, Document)]


@pytest.fixture(scope="module")
def file_report(objects) -> dict:
    engine = policy_set.load([str(POLICIES)], DEFAULT_SETTINGS).engine
    return assemble(scan(iter_snapshot([str(EXAMPLE)]), AuditSettings(now=NOW), engine))


def client(api: FakeKubeAPI, tmp_path: Path):
    return connect(str(api.kubeconfig(tmp_path / "kubeconfig")), None).api_client


def test_pages_follow_continue_tokens(objects, tmp_path):
    with FakeKubeAPI(objects) as api:
        lister = Lister(client(api, tmp_path), page_size=7)
        pages = list(lister.iter_pages(PODS))
        queries = [q for method, path, q in api.requests if path == "/api/v1/pods"]
    # 60 pods in pages of 7: 9 pages (8 full + 4)
    assert [len(p) for p in pages] == [7] * 8 + [4]
    assert queries[0] == {"limit": "7"}
    assert all(q["limit"] == "7" and q["continue"].startswith("page:") for q in queries[1:])
    names = [p["metadata"]["name"] for page in pages for p in page]
    assert len(names) == len(set(names)) == 60
    # List items carry no kind on the wire: filled in as kubectl does
    assert all(p["kind"] == "Pod" and p["apiVersion"] == "v1" for page in pages for p in page)


def test_expired_continue_token_lists_again_without_duplicates(objects, tmp_path):
    with FakeKubeAPI(objects, expire={"/api/v1/pods"}) as api:
        lister = Lister(client(api, tmp_path), page_size=7)
        from kube.lists import ListStats

        stats = ListStats()
        names = [p["metadata"]["name"] for page in lister.iter_pages(PODS, stats) for p in page]
        queries = [q for method, path, q in api.requests if path == "/api/v1/pods"]
    assert stats.relists == 1
    # first page, the expired continue (410), then the list again from the start
    assert "continue" not in queries[0] and "continue" in queries[1]
    assert "continue" not in queries[2]
    assert len(names) == len(set(names)) == 60
    assert stats.skipped_duplicates == 7  # the first page, delivered before the 410
    assert "410 Gone" in stats.notes[0]


def test_throttling_honours_retry_after(objects, tmp_path):
    waits: list[float] = []
    with FakeKubeAPI(objects, throttle={"/api/v1/nodes": 2}, retry_after="3") as api:
        lister = Lister(client(api, tmp_path), sleep=waits.append)
        nodes = [n for page in lister.iter_pages(NODES) for n in page]
        calls = [path for _, path, _ in api.requests if path == "/api/v1/nodes"]
    assert waits == [3.0, 3.0]
    assert len(calls) == 3
    assert len(nodes) == 15


def test_missing_crd_and_forbidden_resource(objects, tmp_path):
    with FakeKubeAPI(objects, forbid={"/api/v1/nodes"}) as api:
        lister = Lister(client(api, tmp_path))
        with pytest.raises(NotServed):
            list(lister.iter_pages(Resource("kubevirt.io", "v1", "virtualmachines",
                                            "VirtualMachine")))
        with pytest.raises(ListError, match=r"^/api/v1/nodes: 403 cannot list"):
            list(lister.iter_pages(NODES))


def test_live_scan_equals_the_snapshot(objects, file_report, tmp_path):
    waits: list[float] = []
    with FakeKubeAPI(objects, expire={"/api/v1/pods"}, throttle={"/api/v1/nodes": 1}) as api:
        lister = Lister(client(api, tmp_path), page_size=7, sleep=waits.append)
        state = ClusterScan()
        engine = policy_set.load([str(POLICIES)], DEFAULT_SETTINGS).engine
        live = assemble(scan(iter_cluster(lister, state), AuditSettings(now=NOW), engine))
        methods = {method for method, _, _ in api.requests}
    assert methods == {"GET"}  # read-only
    assert waits == [0.0]
    for key in ("summary", "nodes", "teams", "fragmentation", "stranded", "mig", "pending",
                "findings", "exceptions"):
        if key == "summary":
            # the snapshot files also hold Queues, Services and a PVC the live lists skip
            drop = ("objects",)
            assert {k: v for k, v in live[key].items() if k not in drop} == \
                {k: v for k, v in file_report[key].items() if k not in drop}
        else:
            assert live[key] == file_report[key], key
    assert "/apis/kubevirt.io/v1/virtualmachines" in state.not_served
    assert any("410 Gone" in note for note in state.notes())


def test_forbidden_list_is_one_error_and_the_audit_goes_on(objects, tmp_path):
    with FakeKubeAPI(objects, forbid={"/apis/apps/v1/daemonsets"}) as api:
        items = list(iter_cluster(Lister(client(api, tmp_path)), ClusterScan()))
    errors = [i for i in items if isinstance(i, LoadError)]
    assert [str(e) for e in errors] == [
        'cluster: cannot list /apis/apps/v1/daemonsets: 403 cannot list resource at '
        '"/apis/apps/v1/daemonsets"']
    assert sum(1 for i in items if isinstance(i, Document) and i.body["kind"] == "Pod") == 60


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["audit", *args])
    return code, out.getvalue()


def test_cli_audits_the_cluster_and_writes_policy_reports(objects, file_report, tmp_path):
    with FakeKubeAPI(objects, throttle={"/api/v1/pods": 1}) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        code, out = run_cli("--kubeconfig", kubeconfig, "--context", "other", "--policies",
                            str(POLICIES), "--write-reports", "-o", "json", "--jobs", "0")
        assert code == 0
        report = json.loads(out)
        first = {key: dict(value) for key, value in api.reports.items()}
        # a second run replaces the same objects in place
        code, _ = run_cli("--kubeconfig", kubeconfig, "--policies", str(POLICIES),
                          "--write-reports", "-o", "json", "--jobs", "0")
        assert code == 0
        writes = [(m, p) for m, p, _ in api.requests if "wgpolicyk8s.io" in p and m != "GET"]
    assert report["source"]["kind"] == "cluster"
    assert report["summary"]["findings"] == file_report["summary"]["findings"]
    assert any("throttled 1 time(s)" in w for w in report["warnings"])
    # One PolicyReport per namespace with evaluated workloads, one ClusterPolicyReport.
    assert sorted(k[1] or "" for k in first) == ["", "gpu-operator", "sandbox", "team-llm",
                                                 "team-research", "team-vision"]
    # team-llm: 5 GPU workloads. max-gpus-per-pod: 4 pass, LWS fails (Deny -> fail);
    # shared-gpu-notice: 4 pass, vllm-cross-vgpu warns; queue-label-audit: 5 fail (Audit).
    llm = first[("PolicyReport", "team-llm", "gpuguard-audit")]
    assert llm["summary"] == {"pass": 0, "fail": 6, "warn": 1, "error": 0, "skip": 0}
    assert llm["metadata"]["annotations"] == {"gpuguard.io/passed-rules": "8"}
    creates = [w for w in writes if w[0] == "POST"]
    replaces = [w for w in writes if w[0] == "PUT"]
    assert len(creates) == len(replaces) == 6


def test_write_reports_deletes_the_report_of_a_namespace_with_nothing_left(objects, tmp_path,
                                                                          capsys):
    with FakeKubeAPI(objects) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        assert run_cli("--kubeconfig", kubeconfig, "--policies", str(POLICIES),
                       "--write-reports", "-o", "json", "--jobs", "0")[0] == 0
        reports = api.reports
    assert ("PolicyReport", "sandbox", "gpuguard-audit") in reports
    # the next scan: sandbox's workloads are gone; a report of another tool stays untouched
    foreign = {"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
               "metadata": {"name": "kyverno-report", "namespace": "sandbox",
                            "resourceVersion": "1"}}
    remaining = [o for o in objects if (o.get("metadata") or {}).get("namespace") != "sandbox"]
    capsys.readouterr()
    with FakeKubeAPI(remaining) as api:
        api.reports = {**reports, ("PolicyReport", "sandbox", "kyverno-report"): foreign}
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        assert run_cli("--kubeconfig", kubeconfig, "--policies", str(POLICIES),
                       "--write-reports", "-o", "json", "--jobs", "0")[0] == 0
        after = dict(api.reports)
    assert "PolicyReport sandbox/gpuguard-audit deleted" in capsys.readouterr().err
    assert ("PolicyReport", "sandbox", "gpuguard-audit") not in after
    assert ("PolicyReport", "sandbox", "kyverno-report") in after
    assert {k for k in after if k[1] != "sandbox"} == {k for k in reports if k[1] != "sandbox"}


def test_a_partial_scan_publishes_nothing(objects, tmp_path, capsys):
    with FakeKubeAPI(objects, forbid={"/apis/apps/v1/daemonsets"}) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        code, out = run_cli("--kubeconfig", kubeconfig, "--policies", str(POLICIES),
                            "--write-reports", "-o", "json", "--jobs", "0")
        writes = [(m, p) for m, p, _ in api.requests if "wgpolicyk8s.io" in p]
    assert code == 3  # environment: RBAC or the API, not the workloads
    assert writes == [] and api.reports == {}
    assert "the scan is partial, no PolicyReport written or deleted" in capsys.readouterr().err
    assert json.loads(out)["errors"]  # the report itself still says what it could not read


def test_cli_cluster_errors_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    capsys.readouterr()
    assert main(["audit", "--cluster", "--policies", str(POLICIES)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuguard: error: no cluster configured")
    kubeconfig = tmp_path / "kc.json"
    with FakeKubeAPI([]) as api:
        api.kubeconfig(kubeconfig)
    assert main(["audit", "--kubeconfig", str(kubeconfig), "--context", "nope", "--policies",
                 str(POLICIES)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "context nope" in err[0]
    with pytest.raises(ClusterConfigError):
        connect(str(tmp_path / "absent"), "x")
