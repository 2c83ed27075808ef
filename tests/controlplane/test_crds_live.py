"""The CRDs of deploy/crds on a real kube-apiserver: what lint accepts it accepts, what lint
refuses it refuses with the same field path, and the status, printer columns and RBAC work.

The documents are those of tests/core/test_crds.py (the repository's gpuguard.io documents and
tests/data/crds/invalid.yaml); here the API server itself judges them — with strict field
validation, list-type uniqueness and the CEL rules that a JSON Schema validator does not have.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.cluster import ControlPlane
from tests.core.test_crds import CORPUS, INVALID

ROOT = Path(__file__).resolve().parent.parent.parent
WEBHOOK = "system:serviceaccount:gpuguard-system:gpuguard-webhook"


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with deploy/crds applied (CRDs Established, RBAC in place)."""
    control_plane.apply_gpuguard_crds()
    return control_plane


def _dry_run(cluster: ControlPlane, document: dict[str, Any]) -> tuple[int, str]:
    done = cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-f", "-",
                           input=json.dumps(document))
    return done.returncode, done.stdout + done.stderr


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
            if isinstance(d, dict) and d.get("apiVersion") == "gpuguard.io/v1alpha1"]


def test_the_library_applies_and_kubectl_get_prints_its_columns(crds: ControlPlane) -> None:
    applied = crds.kubectl("apply", "-f", str(ROOT / "policies" / "library"))
    assert applied.returncode == 0, applied.stderr
    listed = crds.kubectl("get", "gpupolicies")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "ACTIONS", "FAILURE", "POLICY", "READY", "AGE"]
    names = {row.split()[0] for row in rows}
    assert names >= {p.stem for p in (ROOT / "policies" / "library").glob("*.yaml")}
    # The loader's defaults are stored: a policy without failurePolicy / validationActions.
    stored = crds.kubectl("get", "gpupolicy", "add-gpu-toleration-and-runtimeclass", "-o", "json")
    spec = json.loads(stored.stdout)["spec"]
    assert spec["validationActions"] == ["Deny"] and spec["failurePolicy"] == "Ignore"


def test_what_lint_accepts_the_api_server_accepts(crds: ControlPlane,
                                                  make_namespace: Callable[..., str]) -> None:
    namespace = make_namespace("accepts")
    for path in CORPUS:
        for document in _documents(path):
            if document["kind"] == "GPUPolicyException":
                document["metadata"]["namespace"] = namespace
            # Not the names other tests apply for real (a dry run of a create still collides).
            document["metadata"]["name"] += "-dry-run"
            code, output = _dry_run(crds, document)
            assert code == 0, f"{path.name}: {document['metadata']['name']}: {output}"


@pytest.mark.parametrize("document", [d for d in yaml.safe_load_all(
    INVALID.read_text(encoding="utf-8")) if d], ids=lambda d: d["metadata"]["name"])
def test_what_lint_refuses_the_api_server_refuses_at_the_same_field(
        crds: ControlPlane, document: dict[str, Any]) -> None:
    expected = document["metadata"]["annotations"]["gpuguard.io/expected-path"]
    code, output = _dry_run(crds, document)
    assert code != 0, f"accepted: {output}"
    assert expected in output, output


def test_a_broken_policy_is_refused_naming_the_field_and_the_valid_ones_stay(
        crds: ControlPlane) -> None:
    good = _documents(ROOT / "policies" / "library" / "require-queue-label.yaml")[0]
    broken = json.loads(json.dumps(good))
    broken["metadata"]["name"] = "require-queue-label-broken"
    broken["spec"]["validationActions"] = ["Deny", "Block"]
    applied = crds.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [good, broken]}))
    assert applied.returncode != 0
    assert 'spec.validationActions[1]: Unsupported value: "Block"' in applied.stderr
    assert crds.kubectl("get", "gpupolicy", "require-queue-label").returncode == 0
    assert crds.kubectl("get", "gpupolicy", "require-queue-label-broken").returncode != 0


def test_the_status_subresource_is_what_the_ready_column_prints(crds: ControlPlane) -> None:
    applied = crds.kubectl("apply", "-f", str(ROOT / "policies" / "library" /
                                              "gpu-requesters.yaml"))
    assert applied.returncode == 0, applied.stderr
    status = {"status": {"observedGeneration": 1, "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Compiled", "message": "",
         "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 1},
        {"type": "Ready", "status": "True", "reason": "Served", "message": "served by 2 of 2",
         "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 1}]}}
    patched = crds.kubectl("patch", "gpupolicy", "gpu-requesters", "--subresource=status",
                           "--type=merge", "-p", json.dumps(status))
    assert patched.returncode == 0, patched.stderr
    row = crds.kubectl("get", "gpupolicy", "gpu-requesters", "--no-headers").stdout.split()
    assert row[:4] == ["gpu-requesters", '["Deny"]', "Fail", "True"]
    # The status endpoint changes no spec, and the main endpoint no status.
    sneaky = crds.kubectl("patch", "gpupolicy", "gpu-requesters", "--subresource=status",
                          "--type=merge", "-p", json.dumps({"spec": {"failurePolicy": "Ignore"}}))
    assert sneaky.returncode == 0, sneaky.stderr
    stored = json.loads(crds.kubectl("get", "gpupolicy", "gpu-requesters", "-o",
                                     "json").stdout)
    assert stored["spec"]["failurePolicy"] == "Fail"
    assert stored["status"]["conditions"][1]["message"] == "served by 2 of 2"
    bad = crds.kubectl("patch", "gpupolicy", "gpu-requesters", "--subresource=status",
                       "--type=merge", "-p", json.dumps({"status": {"conditions": [
                           {"type": "Ready", "status": "Maybe", "reason": "x", "message": "",
                            "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}))
    assert bad.returncode != 0 and "status.conditions[0].status" in bad.stderr


def _can(cluster: ControlPlane, who: str, *args: str) -> bool:
    done = cluster.kubectl("auth", "can-i", *args, f"--as={who}")
    assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
    return done.stdout.strip() == "yes"


def test_the_webhook_reads_the_objects_and_writes_only_their_status(crds: ControlPlane) -> None:
    for plural in ("gpupolicies", "gpuquotas", "gpupolicyexceptions"):
        assert _can(crds, WEBHOOK, "watch", f"{plural}.gpuguard.io", "-A")
        assert _can(crds, WEBHOOK, "patch", f"{plural}.gpuguard.io", "--subresource=status", "-A")
        for verb in ("create", "update", "patch", "delete"):
            assert not _can(crds, WEBHOOK, verb, f"{plural}.gpuguard.io", "-A"), (verb, plural)


def test_an_exception_requester_may_write_exceptions_of_their_own_namespace_only(
        crds: ControlPlane, make_namespace: Callable[..., str]) -> None:
    own, other = make_namespace("team-a"), make_namespace("team-b")
    bound = crds.kubectl("-n", own, "create", "rolebinding", "exceptions",
                         "--clusterrole=gpuguard-exception-requester", "--user=alice")
    assert bound.returncode == 0, bound.stderr
    assert _can(crds, "alice", "create", "gpupolicyexceptions.gpuguard.io", "-n", own)
    assert not _can(crds, "alice", "create", "gpupolicyexceptions.gpuguard.io", "-n", other)
    assert not _can(crds, "alice", "create", "gpupolicies.gpuguard.io")
    assert not _can(crds, "alice", "patch", "gpupolicyexceptions.gpuguard.io", "-n", own,
                    "--subresource=status")
    exception = _documents(ROOT / "tests" / "data" / "diff" /
                           "gpu-operator-queue-exception.yaml")[0]
    exception["metadata"]["namespace"] = other
    refused = crds.kubectl("create", "-f", "-", "--as=alice", input=json.dumps(exception))
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    exception["metadata"]["namespace"] = own
    created = crds.kubectl("create", "-f", "-", "--as=alice", input=json.dumps(exception))
    assert created.returncode == 0, created.stderr
