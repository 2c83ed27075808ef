"""What an outage of gpuguard blocks, asked of a real kube-apiserver with gpuguard down.

The shipped webhook configurations (deploy/base, matchConditions included) are registered with
every webhook pointed at a loopback port where nothing listens, on a control plane of this module's
own (the session's serves webhooks that answer). Then, as deploy/README.md ("When the webhook is
down") says: the objects its sentence lists — Pods and DRA ResourceClaims / ResourceClaimTemplates
that can touch a GPU — are refused; a CPU pod is admitted, one with 9,000 extended resources too
(the API server's cost of the matchConditions is ~108 units a resource — limits and the requests
it defaults from them — against its limit of 1,000,000 an expression), and one with 9,500 is
refused with the cost error, whether gpuguard is up or not (a trial found 3,000 refused before the
conditions were made cheaper: policies/facts/prefilter.py, gpu_resource_test).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.cluster import ControlPlane, started
from tests.controlplane.webhook_process import loopback_webhooks

NAMESPACE = "team-outage"
DOWN = "failed calling webhook \"pods.validate.gpuguard.io\""
COST = "actual cost limit exceeded"
# The documented bound (deploy/README.md): admitted at or below, refused from REFUSED up.
ADMITTED, REFUSED = 9_000, 9_500


def _dead_url() -> str:
    """An https URL on a loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"https://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def down(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """A control plane with the shipped webhooks registered and gpuguard not running."""
    cluster = started(ControlPlane(control_plane_bin))
    try:
        documents = loopback_webhooks(_dead_url(), cluster)
        applied = cluster.kubectl("apply", "-f", "-",
                                  input="\n---\n".join(json.dumps(d) for d in documents))
        assert applied.returncode == 0, applied.stderr
        assert cluster.kubectl("create", "namespace", NAMESPACE).returncode == 0
        yield cluster
    finally:
        cluster.stop()


def _pod(name: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36", **container}]}}


def _create(cluster: ControlPlane, obj: dict[str, Any]) -> tuple[int, str]:
    done = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj))
    return done.returncode, done.stderr


def _claim_spec() -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu",
                                      "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}


def test_gpu_pods_and_gpu_claims_are_refused_during_an_outage(down: ControlPlane) -> None:
    code, err = _create(down, _pod("gpu", resources={"limits": {"nvidia.com/gpu": "1"}}))
    assert code == 1 and DOWN in err, err
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "gpu", "namespace": NAMESPACE}, "spec": _claim_spec()}
    code, err = _create(down, claim)
    assert code == 1 and DOWN in err, err
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu", "namespace": NAMESPACE},
                "spec": {"spec": _claim_spec()}}
    code, err = _create(down, template)
    assert code == 1 and DOWN in err, err


def test_cpu_pods_are_admitted_during_an_outage(down: ControlPlane) -> None:
    assert _create(down, _pod("cpu", resources={"limits": {"cpu": "1", "memory": "1Gi"}})) == \
        (0, "")
    assert _create(down, _pod("ext", resources={"limits": {"example.com/foo": "1"}})) == (0, "")


@pytest.mark.parametrize("count", [3_000, ADMITTED, REFUSED])
def test_the_extended_resource_bound_of_deploy_readme(down: ControlPlane, count: int) -> None:
    limits = {f"example.com/r{i}": "1" for i in range(count)}
    code, err = _create(down, _pod("many", resources={"limits": limits}))
    if count <= ADMITTED:
        assert (code, err) == (0, ""), err[-300:]
    else:
        assert code == 1 and COST in err, err[-300:]
