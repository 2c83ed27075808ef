"""What the audit keeps of an object until it is evaluated reads back as the object (orjson packs
what it writes exactly, the standard library the rest: a NaN, a YAML date, a huge int)."""

from __future__ import annotations

import datetime
import json
import math

import pytest

from audit.scan.compliance import _pack, _unpack

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
       "status": {"phase": "Running"}}


@pytest.mark.parametrize("value", [
    1, 1.0, True, 1e-07, "ü → …", None, 2**64 + 1, "\udc80", [1, [2, {"x": None}]],
], ids=["int", "float", "bool", "small-float", "unicode", "null", "big-int", "surrogate",
        "nested"])
def test_a_packed_object_reads_back_as_it_was_without_status(value):
    pod = {**POD, "metadata": {**POD["metadata"], "annotations": {"v": value}}}
    expected = {k: v for k, v in pod.items() if k != "status"}
    assert _unpack(_pack(pod)) == expected


def test_a_nan_reads_back_as_a_nan_not_null():
    pod = {**POD, "spec": {"priority": math.nan}}
    assert math.isnan(_unpack(_pack(pod))["spec"]["priority"])


def test_a_yaml_date_reads_back_as_the_api_would_write_it():
    pod = {**POD, "metadata": {"name": "p", "creationTimestamp": datetime.datetime(
        2026, 12, 4, 19, 0, tzinfo=datetime.UTC)}}
    unpacked = _unpack(_pack(pod))
    assert unpacked["metadata"]["creationTimestamp"] == json.loads(json.dumps(
        unpacked["metadata"]["creationTimestamp"]))
    assert unpacked["metadata"]["creationTimestamp"].startswith("2026-12-04T19:00:00")
