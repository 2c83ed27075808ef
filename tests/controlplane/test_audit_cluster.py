"""``gpuguard audit --cluster`` over a real API server loaded with the bundled example cluster.

A control plane of its own (so no other test's objects are in it) gets examples/cluster the way
a cluster holds it: namespaces, nodes with their status written through the ``status``
subresource, the workloads (CRDs installed), and pods bound with ``nodeName`` and their status
patched in (no kubelet runs). The audit read through the API must then be the audit of the same
objects read from files: the same summary, nodes, findings, everything but when and from where it
was made. ``--write-reports`` then creates PolicyReports and, on the next run, updates them.
The last tests change the cluster (a label, a deleted pod), so they come after the comparison in
this file (pytest keeps the file order).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.lists import AUDIT_RESOURCES
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.test_admission_e2e import install_crds
from tests.controlplane.webhook_process import REPO, gpuguard

EXAMPLE = REPO / "examples" / "cluster"
DATA = Path(__file__).resolve().parent / "data"
CLUSTER_SCOPED = ("Namespace", "Node", "DeviceClass", "ResourceSlice")
# apiVersion, kind -> (path prefix, plural, namespaced)
RESOURCES = {(r.api_version, r.kind): (r.path, r.plural, r.kind not in CLUSTER_SCOPED)
             for r in AUDIT_RESOURCES}
SERVER_FIELDS = ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation",
                 "selfLink")
ORDER = {"Namespace": 0, "Node": 1, "Pod": 3}  # workloads in between


def _documents() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(EXAMPLE.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not document:
                continue
            items = document["items"] if document.get("kind") == "List" else [document]
            objects += items
    return objects


def _call(api_client: Any, method: str, path: str, body: Any,
          content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    response = api_client.call_api(
        *api_client.param_serialize(method, path, body=body, header_params={
            "Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"]), _request_timeout=30)
    data = response.read()
    return response.status, json.loads(data) if data else {}


def load(cluster: ControlPlane, objects: list[dict[str, Any]]
         ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Create ``objects`` through the API and patch their status in.

    Returns:
        ``(objects the API server took, kinds it does not list for the audit, refusals)``; a
        refusal reads ``Kind/namespace/name: the API server's message``.
    """
    api_client = cluster.api_client()
    loaded, skipped, refused = [], [], []
    try:
        for obj in sorted(objects, key=lambda o: ORDER.get(o["kind"], 2)):
            key = (obj["apiVersion"], obj["kind"])
            if key not in RESOURCES:
                skipped.append(f"{obj['apiVersion']}/{obj['kind']}")
                continue
            path, plural, namespaced = RESOURCES[key]
            metadata = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS}
            body = {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}
            base = path.removesuffix(f"/{plural}")
            collection = f"{base}/namespaces/{metadata['namespace']}/{plural}" if namespaced \
                else path
            status, answer = _call(api_client, "POST", collection, body)
            where = f"{obj['kind']}/{metadata.get('namespace', '')}/{metadata['name']}"
            if status != 201:
                refused.append(f"{where}: {answer.get('message')}")
                continue
            if obj.get("status"):
                status, answer = _call(api_client, "PATCH",
                                       f"{collection}/{metadata['name']}/status",
                                       {"status": obj["status"]},
                                       "application/merge-patch+json")
                assert status == 200, f"{where} status: {answer.get('message')}"
            loaded.append(obj)
    finally:
        api_client.close()
    return loaded, skipped, refused


@pytest.fixture(scope="module")
def example_cluster(control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[ControlPlane, Path, list[str], list[str]]]:
    """A fresh control plane holding examples/cluster, and the same objects as one file.

    The TaintNodesByCondition admission plugin is off: it taints every *new* Node
    ``node.kubernetes.io/not-ready`` until kube-controller-manager (absent here) sees it Ready,
    while the example's Nodes are a snapshot with the taints they had. The API server's own
    namespaces (default, kube-system, ...) are in the cluster, so they go into the file too.
    """
    with ControlPlane(control_plane_bin,
                      apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]
                      ) as cluster:
        install_crds(cluster, DATA / "workload-crds.yaml")
        # The PolicyReport CRDs gpuguard ships: the API server checks the written reports
        # against their schema.
        for crd in sorted((REPO / "deploy" / "crds" / "policyreports").glob("*.wgpolicyk8s.io.yaml")):
            install_crds(cluster, crd)
        loaded, skipped, refused = load(cluster, _documents())
        own = {o["metadata"]["name"] for o in loaded if o["kind"] == "Namespace"}
        listed = json.loads(cluster.kubectl("get", "namespaces", "-o", "json").stdout)["items"]
        loaded += [{"apiVersion": "v1", "kind": "Namespace", **n} for n in listed
                   if n["metadata"]["name"] not in own]
        same = tmp_path_factory.mktemp("audit-example") / "loaded.yaml"
        same.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": loaded}))
        yield cluster, same, skipped, refused


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    report = copy.deepcopy(report)
    for key in ("generated", "source"):
        report.pop(key)
    return report


def _audit(*args: str) -> dict[str, Any]:
    done = gpuguard("audit", *args, "-o", "json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_the_example_loads_into_a_real_api_server(example_cluster) -> None:
    cluster, same, skipped, refused = example_cluster
    # only kinds the audit does not read are left out (PVC, Service, KAI Queue) ...
    assert sorted(set(skipped)) == ["scheduling.run.ai/v2/Queue", "v1/PersistentVolumeClaim",
                                    "v1/Service"], skipped
    # ... and the API server takes every object the audit reads but one: the corpus StatefulSet
    # that asks for a GPU in requests only, kept in the example because no cluster can hold it
    # (the auditor finds it in files, where GitOps repositories keep such manifests)
    assert refused == ['StatefulSet/team-llm/ollama: StatefulSet.apps "ollama" is invalid: '
                       "spec.template.spec.containers[0].resources.limits: Required value: "
                       "Limit must be set for non overcommitable resources"]
    items = yaml.safe_load(same.read_text())["items"]
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 15 and all(n["status"].get("allocatable") for n in nodes)
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    assert len(pods) == len([o for o in items if o["kind"] == "Pod"]) == 60  # every pod
    bound = [p for p in pods if p["spec"].get("nodeName")]
    assert bound and all(p["status"].get("phase") for p in pods)


def test_audit_of_the_cluster_is_the_audit_of_the_same_objects_from_files(example_cluster
                                                                          ) -> None:
    cluster, same, _, _ = example_cluster
    from_files = _audit("-f", str(same))
    from_cluster = _audit("--cluster", "--kubeconfig", str(cluster.kubeconfig))
    assert from_cluster["source"]["kind"] == "cluster"
    assert from_files["summary"]["pods"] == 60 and from_files["summary"]["nodes"] == 15
    assert _comparable(from_cluster) == _comparable(from_files)


def _stored_reports(cluster: ControlPlane) -> dict[str, dict[str, Any]]:
    done = cluster.kubectl("get", "policyreports,clusterpolicyreports", "-A", "-o", "json")
    assert done.returncode == 0, done.stderr
    return {_report_key(r): r for r in json.loads(done.stdout)["items"]}


def _report_key(report: dict[str, Any]) -> str:
    metadata = report["metadata"]
    return f"{report['kind']}/{metadata.get('namespace') or ''}/{metadata['name']}"


def _write_reports(cluster: ControlPlane) -> tuple[dict[str, dict[str, Any]], str]:
    """``audit --cluster --write-reports -o policyreport``: the reports it printed (= wrote)."""
    done = gpuguard("audit", "--cluster", "--kubeconfig", str(cluster.kubeconfig),
                    "--write-reports", "-o", "policyreport")
    assert done.returncode in (0, 1), done.stderr
    return {_report_key(r): r for r in yaml.safe_load_all(done.stdout) if r}, done.stderr


def _content(report: dict[str, Any]) -> dict[str, Any]:
    return {"labels": report["metadata"].get("labels"), "summary": report.get("summary"),
            "results": report.get("results") or []}


def test_write_reports_creates_then_updates_policy_reports(example_cluster) -> None:
    cluster, _, _, _ = example_cluster
    printed, log = _write_reports(cluster)
    stored = _stored_reports(cluster)
    assert set(stored) == set(printed)  # one PolicyReport per namespace + a ClusterPolicyReport
    assert {"PolicyReport/sandbox/gpuguard-audit", "PolicyReport/team-llm/gpuguard-audit",
            "ClusterPolicyReport//gpuguard-audit"} <= set(stored)
    for key, report in printed.items():
        assert _content(stored[key]) == _content(report), key
        kind, namespace, name = key.split("/")
        where = f"{namespace}/{name}" if namespace else name
        assert f"gpuguard: {kind} {where} created" in log
    sandbox = stored["PolicyReport/sandbox/gpuguard-audit"]
    assert sandbox["summary"]["fail"] == 1
    assert [r["resources"][0]["name"] for r in sandbox["results"]] == ["debug-shell"]

    research = stored["PolicyReport/team-research/gpuguard-audit"]
    assert _failing(research, "hami-gpu-pod") == ["require-queue-label"]

    # the violation is fixed (the pod gets its queue label): the next run replaces the report
    labelled = cluster.kubectl("-n", "team-research", "label", "pod", "hami-gpu-pod",
                               "kueue.x-k8s.io/queue-name=research")
    assert labelled.returncode == 0, labelled.stderr
    printed_again, log = _write_reports(cluster)
    after = _stored_reports(cluster)
    assert set(after) == set(stored)  # the same objects: no duplicates, none left over
    for key, report in printed_again.items():
        assert _content(after[key]) == _content(report), key
        assert after[key]["metadata"]["uid"] == stored[key]["metadata"]["uid"]  # in place
    assert "replaced" in log and "created" not in log, log
    updated = after["PolicyReport/team-research/gpuguard-audit"]
    assert _failing(updated, "hami-gpu-pod") == []
    assert updated["summary"]["fail"] == research["summary"]["fail"] - 1
    assert updated["metadata"]["resourceVersion"] != research["metadata"]["resourceVersion"]


def _failing(report: dict[str, Any], name: str) -> list[str]:
    return [r["policy"] for r in report.get("results") or [] if r["result"] == "fail"
            and any(res.get("name") == name for res in r.get("resources") or [])]


def test_write_reports_clears_a_namespace_whose_workloads_are_gone(example_cluster) -> None:
    cluster, _, _, _ = example_cluster
    _write_reports(cluster)
    assert _stored_reports(cluster)["PolicyReport/sandbox/gpuguard-audit"]["summary"][
        "fail"] == 1
    deleted = cluster.kubectl("-n", "sandbox", "delete", "pod", "debug-shell",
                              "--grace-period=0", "--force")
    assert deleted.returncode == 0, deleted.stderr
    _, stderr = _write_reports(cluster)
    assert "gpuguard: PolicyReport sandbox/gpuguard-audit deleted" in stderr, stderr
    stored = _stored_reports(cluster)
    # sandbox held only that pod: its report is deleted; every other namespace's stays
    assert "PolicyReport/sandbox/gpuguard-audit" not in stored, stored.keys()
    assert "ClusterPolicyReport//gpuguard-audit" in stored
