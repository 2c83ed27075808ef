"""Fixtures of the control-plane tier: one real etcd + kube-apiserver for the whole session.

Every test under ``tests/controlplane/`` is marked ``controlplane`` (run the tier alone with
``.venv/bin/python -m pytest tests/controlplane``, or leave it out with ``-m "not
controlplane"``). Without Go the tier is skipped with one line saying so; under ``CI=true`` a
missing toolchain or a failed build fails the session's first control-plane test instead, so CI
never passes by skipping.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.controlplane.cluster import BuildError, ControlPlane, build_binaries, started

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tier's tests ``controlplane``."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.controlplane)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def control_plane_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder with etcd, kube-apiserver and kubectl (built once, then cached by version)."""
    log = tmp_path_factory.mktemp("controlplane-build") / "build.log"
    try:
        folder, took = build_binaries(log)
    except BuildError as exc:
        if _in_ci():
            pytest.fail(f"control-plane tier: {exc}", pytrace=False)
        pytest.skip(f"control-plane tier: {str(exc).splitlines()[0]}")
    if took > 5:
        print(f"\ncontrol-plane binaries built in {took:.0f} s into {folder}")
    return folder


@pytest.fixture(scope="session")
def control_plane(control_plane_bin: Path) -> Iterator[ControlPlane]:
    """A running control plane (admin kubeconfig at ``.kubeconfig``), stopped after the session."""
    cluster = started(ControlPlane(control_plane_bin))
    try:
        yield cluster
    finally:
        cluster.stop()


_NAMES = itertools.count(1)


@pytest.fixture
def make_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest
                   ) -> Callable[..., str]:
    """Create a namespace with a unique name (and labels); returns its name.

    There is no namespace controller, so a deleted namespace would stay Terminating: names are
    unique per test instead and namespaces stay until the control plane goes.
    """
    def make(prefix: str | None = None, labels: dict[str, str] | None = None) -> str:
        stem = re.sub(r"[^a-z0-9-]+", "-", (prefix or request.node.name).lower())
        name = f"{stem[:40].strip('-')}-{next(_NAMES)}"
        arguments = ["create", "namespace", name]
        created = control_plane.kubectl(*arguments)
        assert created.returncode == 0, created.stderr
        if labels:
            labelled = control_plane.kubectl("label", "namespace", name, "--overwrite",
                                             *(f"{k}={v}" for k, v in labels.items()))
            assert labelled.returncode == 0, labelled.stderr
        return name
    return make
