"""policies/data/apply-schema.json is what the tier's kube-apiserver says about Pods and workloads.

The ApplyConfiguration merge (policies/policy/apply.py) reads its list types, list-map keys,
atomic maps and key defaults from that file; regenerate it with
``python -m tests.controlplane.apply_schema`` when the Kubernetes version of the tier changes.
"""

from __future__ import annotations

from tests.controlplane.apply_schema import OUTPUT, facts, read_schemas, render
from tests.controlplane.cluster import ControlPlane


def test_the_checked_in_structured_merge_facts_are_the_api_servers(
        control_plane: ControlPlane) -> None:
    served = render(facts(read_schemas(lambda path: control_plane.get_raw(path, timeout_s=60))))
    assert served == OUTPUT.read_text(encoding="utf-8"), \
        "regenerate: python -m tests.controlplane.apply_schema"
