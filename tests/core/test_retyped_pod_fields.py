"""A Pod whose identity, placement or state fields are not of their API types, or that has no
name or no containers, says so in its facts' ``invalid`` (found by a fresh-context trial: a
``metadata: null`` GPU pod listed by ``gpuguard gpus`` as ``name: null`` with no note, while
``name: 5`` got one; ``spec: null`` read as 0 GPUs without a word)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.facts.workloads import workload_facts


def _pod(**fields: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
        "status": {"phase": "Running"}}
    for path, value in fields.items():
        *parents, last = path.split("__")
        target = pod
        for key in parents:
            target = target[key]
        target[last] = value
    return pod


@pytest.mark.parametrize(("fields", "problem"), [
    ({"metadata": None}, "metadata.name: required, none given (neither metadata.name nor "
     "metadata.generateName is a non-empty string)"),
    ({"metadata__name": 5}, "metadata.name: expected a string, got the number 5"),
    ({"metadata__namespace": 7}, "metadata.namespace: expected a string, got the number 7"),
    ({"spec__nodeName": 7}, "spec.nodeName: expected a string, got the number 7"),
    ({"status__phase": 1}, "status.phase: expected a string, got the number 1"),
    ({"status": "Running"}, "status: expected a map, got the string 'Running'"),
    ({"spec": None}, "spec: required, none given (a Pod has at least one container; without, "
     "it asks for no GPU)"),
    ({"spec__containers": None}, "spec.containers: required, none given (a Pod has at least "
     "one container; without, it asks for no GPU)"),
])
def test_a_retyped_or_missing_pod_field_is_invalid(fields, problem):
    facts = workload_facts(_pod(**fields), settings=DEFAULT_SETTINGS)
    assert facts is not None
    assert problem in facts.to_dict()["total"]["invalid"]


def test_a_well_typed_pod_has_no_problems():
    facts = workload_facts(_pod(), settings=DEFAULT_SETTINGS)
    assert facts is not None and facts.to_dict()["total"]["invalid"] == []
    assert facts.to_dict()["total"]["gpus"] == {"nvidia.com/gpu": 2}
