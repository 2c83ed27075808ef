"""``gpuguard check`` on pods that reach GPUs without asking (tests/data/access, a trial's finds).

The trial's command line: the two library isolation policies over its files. Every pod that can
reach a GPU device without requesting one is denied (exit 1) with the field and the reason; the
pods that cannot are allowed.
"""

from __future__ import annotations

import json

import pytest

from gpuguard.cli import main
from tests.paths import ROOT

ACCESS = ROOT / "tests" / "data" / "access"
POLICIES = ("--policies", str(ROOT / "policies" / "library" / "no-privileged-gpu.yaml"),
            "--policies", str(ROOT / "policies" / "library" / "no-unrequested-gpu-access.yaml"))
# file -> the pods check denies (the others are allowed)
DENIED = {
    "cap-all.yaml": {"cap-all", "cap-all-nogpu"},
    "hostpaths.yaml": {"hp0", "hp1", "hp2", "hp3", "hp4", "hp5", "hp6", "hp7", "hp11"},
    "hostpath-dotdev.yaml": {"hp"},
    # "envfrom" (no prefix) is listed, not denied: no-unrequested-gpu-access's includeUncertain
    "envfrom.yaml": {"envfrom-prefix", "env-valuefrom", "env-dup", "env-dup2"},
}


def _check(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, dict]]:
    code = main(["check", "-f", str(ACCESS / name), *POLICIES, "-o", "json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    document = json.loads(captured.out)
    assert document["errors"] == []
    return code, {r["name"]: r for r in document["results"]}


@pytest.mark.parametrize("name", sorted(DENIED))
def test_check_denies_every_pod_that_reaches_gpus_without_asking(name, capsys) -> None:
    code, results = _check(name, capsys)
    assert code == 1
    assert {n for n, r in results.items() if not r["allowed"]} == DENIED[name]


def test_check_names_the_field_and_why(capsys) -> None:
    _, results = _check("cap-all.yaml", capsys)
    assert results["cap-all"]["message"].startswith(
        "no-privileged-gpu: container 'c' (spec.containers[0].securityContext.capabilities.add): "
        "adds capability ALL (every capability, SYS_ADMIN included), in a pod that requests GPUs")
    assert results["cap-all-nogpu"]["message"].startswith(
        "no-unrequested-gpu-access: container 'c' "
        "(spec.containers[0].securityContext.capabilities.add): adds capability ALL (every "
        "capability, SYS_ADMIN included): sees every device on the node without requesting a GPU")
    _, results = _check("hostpath-dotdev.yaml", capsys)
    assert results["hp"]["message"].startswith(
        "no-unrequested-gpu-access: container 'c' (spec.containers[0].volumeMounts[0]): mounts "
        "hostPath /./dev (= /dev) without requesting a GPU")
    _, results = _check("envfrom.yaml", capsys)
    assert results["envfrom-prefix"]["message"].startswith(
        "no-unrequested-gpu-access: container 'c' (spec.containers[0].envFrom[0]): envFrom "
        "ConfigMap 'gpu-env' with prefix 'NVIDIA_' may set NVIDIA_VISIBLE_DEVICES, "
        "NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES (value unknown) without "
        "requesting a GPU")
