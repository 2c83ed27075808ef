"""The Helm chart's objects on a real kube-apiserver: every value set applies.

``helm template`` (tests/builders/helm_chart.py) of the defaults and each ci/*-values.yaml, into a
namespace of its own; the chart's CRDs (crds/: the gpuguard.io kinds and the PolicyReports) are
created for real and become Established, the Namespaces too, and every other object goes through
``kubectl apply --server-side --dry-run=server``: the API server's own schemas, strict field
validation, CEL of ValidatingAdmissionPolicy and the webhook configurations' checks (matchConditions
compile, caBundle), with nothing stored. cert-manager's and the Prometheus Operator's kinds are
left out: their CRDs are not on this server (tests/project/test_helm_chart.py checks their shape).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders.helm_chart import VALUE_SETS, render
from tests.controlplane.cluster import ControlPlane

THIRD_PARTY_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}


def _apply(cluster: ControlPlane, objects: list[dict[str, Any]], *args: str) -> str:
    done = cluster.kubectl("apply", "--server-side", "--force-conflicts",
                           "--field-manager=gpuguard-helm-test", *args, "-f", "-",
                           input=json.dumps({"apiVersion": "v1", "kind": "List",
                                             "items": objects}))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def chart_crds(control_plane: ControlPlane) -> ControlPlane:
    crds = [o for o in render("default", include_crds=True)
            if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 5
    _apply(control_plane, crds)
    control_plane.wait_established(*(o["metadata"]["name"] for o in crds))
    return control_plane


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_of_the_value_set_is_accepted_by_the_api_server(
        chart_crds: ControlPlane, value_set: str) -> None:
    namespace = f"helm-{value_set}"
    objects = render(value_set, namespace=namespace)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    names = {o["metadata"]["name"] for o in namespaces}
    if namespace not in names:   # helm install --create-namespace
        namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": namespace}})
    _apply(chart_crds, namespaces)
    rest = [o for o in objects if o["kind"] not in THIRD_PARTY_KINDS | {"Namespace"}]
    for obj in rest:
        # Other tests of the session register webhook configurations of these names (with a
        # clientConfig.url): a server-side apply would merge into theirs, so each value set's get
        # a name of their own.
        if obj["kind"].endswith("WebhookConfiguration"):
            obj["metadata"]["name"] += f"-{namespace}"
    assert len(rest) >= 5
    applied = _apply(chart_crds, rest, "--dry-run=server")
    assert applied.count("serverside-applied (server dry run)") == len(rest), applied
