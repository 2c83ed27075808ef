"""gpuguard's stored form of quantities is kube-apiserver's, value by value.

Every value of tests/data/quantities/stored-forms.yaml is written in a manifest (read by
kubectl, as a user's is) as a container's cpu limit, memory request and nvidia.com/gpu
limit where it is a whole number, and as an emptyDir ``sizeLimit`` (a Quantity outside a
ResourceList: no milli rounding). The API server's stored object (``--dry-run=server``) must equal
:func:`policies.facts.openapi.stored_form` of the same manifest, and the table's ``stored`` must be
what the server stored.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import yaml

from policies.facts.openapi import stored_form
from policies.facts.quantity import parse_quantity
from tests.controlplane.cluster import ControlPlane
from tests.paths import TESTS

TABLE = yaml.safe_load((TESTS / "data" / "quantities" / "stored-forms.yaml").read_text(
    encoding="utf-8"))


def _manifest() -> dict:
    containers, volumes = [], []
    for index, row in enumerate(TABLE):
        value = row["value"]
        limits = {"cpu": value}
        whole = parse_quantity(value)
        if whole.denominator == 1 and 0 <= whole < 10**12:
            limits["nvidia.com/gpu"] = value  # extended resources must be whole numbers
        containers.append({"name": f"c{index}", "image": "cuda",
                           "resources": {"limits": limits, "requests": {"memory": value}},
                           "volumeMounts": [{"name": f"v{index}", "mountPath": f"/v{index}"}]})
        volumes.append({"name": f"v{index}", "emptyDir": {"sizeLimit": value}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "default"},
            "spec": {"containers": containers, "volumes": volumes}}


def test_stored_quantities_are_the_api_servers(control_plane: ControlPlane,
                                               tmp_path: Path) -> None:
    manifest = _manifest()
    # JSON (YAML to kubectl): a string stays a string and a number a number for both readers
    # (PyYAML reads an unquoted 1e3 as a string, kubectl's YAML as a number)
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(manifest), encoding="utf-8")
    created = control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", str(path))
    assert created.returncode == 0, created.stderr
    server = json.loads(created.stdout)
    ours = stored_form(manifest)
    for index, row in enumerate(TABLE):
        theirs_c = server["spec"]["containers"][index]["resources"]
        ours_c = ours["spec"]["containers"][index]["resources"]
        assert theirs_c["limits"] == ours_c["limits"], row
        # (the server also defaults requests from limits: only the memory request is ours)
        assert theirs_c["requests"]["memory"] == ours_c["requests"]["memory"], row
        assert theirs_c["limits"]["cpu"] == row["stored"], row
        assert server["spec"]["volumes"][index]["emptyDir"] == \
            ours["spec"]["volumes"][index]["emptyDir"], row
    # the values did reach the server as numbers where the table has numbers
    assert any(isinstance(r["value"], float) for r in TABLE)
    assert Fraction(1, 2) in {parse_quantity(r["value"]) for r in TABLE}
