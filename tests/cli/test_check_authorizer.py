"""``gpuguard check --snapshot``: "who may request H100s" answered from a snapshot's RBAC
objects before enforcing (the library's gpu-requesters, through CEL ``authorizer``)."""

from __future__ import annotations

import json

import pytest

from gpuguard.cli import main
from tests.paths import TESTS

POD = str(TESTS / "data" / "rbac" / "h100-pod.yaml")
ROLES = str(TESTS / "data" / "rbac" / "gpu-roles.yaml")
POLICY = "policies/library/gpu-requesters.yaml"


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["check", "-f", POD, "--policies", POLICY, "-o", "json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out)["results"][0], captured.err


def test_a_researcher_bound_in_ml_may_request_an_h100(capsys) -> None:
    code, result, _ = _check(capsys, "--user", "erin", "--group", "ml-researchers",
                             "--snapshot", ROLES)
    assert code == 0 and result["allowed"]


def test_a_user_without_the_binding_is_denied_with_the_rbac_reason(capsys) -> None:
    code, result, _ = _check(capsys, "--user", "mallory", "--group", "system:authenticated",
                             "--snapshot", ROLES)
    assert code == 1 and not result["allowed"]
    assert result["message"] == (
        "gpu-requesters: user 'mallory' may not use GPU product NVIDIA-H100-80GB-HBM3 in "
        "namespace 'ml': RBAC allows no 'use' of gpus.gpuguard.io 'NVIDIA-H100-80GB-HBM3' there."
        " Ask the platform team for a RoleBinding to a GPU role.")


def test_without_rbac_objects_it_says_so_and_does_not_allow(capsys, tmp_path) -> None:
    empty = tmp_path / "snapshot.yaml"
    empty.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n")
    for extra in ([], ["--snapshot", str(empty)]):
        code, result, err = _check(capsys, "--user", "erin", "--group", "ml-researchers",
                                   *extra)
        assert code == 1 and not result["allowed"]
        assert "gpuguard: note: policies use authorizer, but " in err
        assert "authorizer check errored" in result["message"]
