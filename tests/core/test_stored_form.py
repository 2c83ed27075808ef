"""Offline, a workload is judged as the API server would store it: Quantities in its text.

A manifest's ``nvidia.com/gpu: 8`` is a YAML number; the API server stores ``"8"``, and a policy
running in the cluster reads a string. ``gpuguard check`` used to hand CEL the number, so a policy
that parses the limit with ``quantity()`` failed — and under ``failurePolicy: Ignore`` admitted
what the cluster denies (a fresh-context trial's find).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from policies.facts.openapi import stored_form
from policies.facts.review import from_object
from policies.facts.stored_quantity import (
    FORMAT_WRONG,
    SUFFIX_WRONG,
    quantity_error,
    stored_quantity,
)
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.core.test_engine import engine_for
from tests.paths import TESTS

TABLE = yaml.safe_load((TESTS / "data" / "quantities" / "stored-forms.yaml").read_text(
    encoding="utf-8"))


@pytest.mark.parametrize("row", TABLE, ids=[repr(r["value"]) for r in TABLE])
def test_a_resource_list_value_is_stored_as_the_api_server_stores_it(row):
    assert stored_quantity(row["value"], resource_list=True) == row["stored"]


@pytest.mark.parametrize("value", [True, None, "abc", "1x", "", "--1", [1], {"a": 1}])
def test_what_is_no_quantity_is_left_for_its_reader_to_report(value):
    pod = _pod({"nvidia.com/gpu": value})
    assert stored_form(pod) is pod  # unchanged: the GPU facts name the bad value


def _pod(limits: dict, kind: str = "Pod") -> dict:
    container = {"name": "c", "image": "cuda", "resources": {"limits": limits}}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                "spec": {"containers": [container]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ml"},
            "spec": {"template": {"spec": {"containers": [container],
                                           "restartPolicy": "Never"}}}}


def test_stored_form_copies_only_what_changes_and_never_edits_the_manifest():
    pod = _pod({"nvidia.com/gpu": 8, "cpu": 0.5, "memory": "1Gi"})
    before = copy.deepcopy(pod)
    stored = stored_form(pod)
    assert pod == before
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8", "cpu": "500m", "memory": "1Gi"}
    assert stored["metadata"] is pod["metadata"]  # untouched parts are shared, not copied
    canonical = _pod({"nvidia.com/gpu": "8"})
    assert stored_form(canonical) is canonical


def test_templates_and_custom_resources():
    job = stored_form(_pod({"nvidia.com/gpu": 2}, kind="Job"))
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "2"}
    custom = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"},
              "spec": {"resources": {"limits": {"nvidia.com/gpu": 8}}}}
    assert stored_form(custom) is custom  # its schema is in its CRD: judged as written


# In the cluster the policy reads the stored "8" and denies. On main before this fix gpuguard
# read the number 8 (or 8.0): quantity(8) has no overload, and failurePolicy Ignore admitted.
AT_MOST_FOUR = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: at-most-four-gpus}
spec:
  failurePolicy: Ignore
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}
  validations:
  - expression: >
      object.spec.containers.all(c, !('nvidia.com/gpu' in c.resources.?limits.orValue({})) ||
        quantity(c.resources.limits['nvidia.com/gpu']).compareTo(quantity('4')) <= 0)
    message: at most 4 GPUs per container
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: at-most-four-gpus}
spec: {policyName: at-most-four-gpus, validationActions: [Deny]}
"""


@pytest.mark.parametrize("gpus", [8, "8", 8.0])
def test_an_unquoted_gpu_count_is_judged_as_the_cluster_judges_it(gpus):
    verdict = engine_for(AT_MOST_FOUR).evaluate(from_object(_pod({"nvidia.com/gpu": gpus}),
                                                            now=NOW))
    assert not verdict.allowed
    assert verdict.message == "at-most-four-gpus/at-most-four-gpus: at most 4 GPUs per container"


def test_a_quantity_past_the_ports_bounds_is_kept_as_written_never_a_crash_or_a_number():
    """A fresh-context trial's finds: a quoted 5,000-digit quantity crashed ``check`` (Python's
    4,300-digit conversion limit), and numbers the port could not write stayed numbers, which a
    ``failurePolicy: Ignore`` policy then admitted."""
    huge = "9" * 5000
    limits = stored_form(_pod({"nvidia.com/gpu": huge, "memory": 1e308, "cpu": 10**21}))[
        "spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": huge, "memory": "100e306", "cpu": "1e+21"}
    assert stored_quantity("4\x1f") is None  # Go's TrimSpace keeps \x1f: no quantity there
    assert stored_quantity(" 4\t") == "4"


@pytest.mark.parametrize(("value", "error"), [
    ("9" * 100, None), (8, None), (0.5, None), (None, None), ("1mm", SUFFIX_WRONG),
    ("1x", FORMAT_WRONG), (True, FORMAT_WRONG), ({"a": 1}, FORMAT_WRONG), ("", FORMAT_WRONG),
])
def test_what_the_api_servers_quantity_decoder_refuses(value, error):
    """The decoding check of a mutated object asks the ParseQuantity port, not CEL's stricter
    ``quantity()`` (which refuses a 100-digit quantity Go parses: a trial's find)."""
    assert quantity_error(value) == error
