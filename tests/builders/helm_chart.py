"""The Helm chart deploy/helm/gpuguard rendered by a real helm, for the project and control-plane tests.

``helm_binary()`` runs deploy/helm/build-helm.sh (helm from the Go module proxy, built once into
``~/.cache/gpuguard/helm/<version>_<go>/bin/helm``, then reused) and skips — or, under
``CI=true``, fails — when Go is missing or the build fails, as the control-plane tier does.
``VALUE_SETS`` are the defaults and the chart's ci/*-values.yaml; ``render`` is ``helm template``
of one of them into a list of objects (CRDs of crds/ included when asked).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import ROOT

CHART = ROOT / "deploy" / "helm" / "gpuguard"
BUILD_SCRIPT = ROOT / "deploy" / "helm" / "build-helm.sh"
RELEASE = "gpuguard"
NAMESPACE = "gpuguard-system"
# The value sets `helm lint` and `helm template` run with: "default" is values.yaml alone.
VALUE_SETS = ("default", *sorted(p.name.removesuffix("-values.yaml")
                                 for p in (CHART / "ci").glob("*-values.yaml")))


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@functools.cache
def _build() -> tuple[Path | None, str]:
    if shutil.which("go") is None:
        return None, "Go toolchain not found on PATH (helm is built from the Go module proxy)"
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                          check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        return None, (f"deploy/helm/build-helm.sh exited {done.returncode}: "
                      f"{done.stderr.strip()[-2000:]}")
    return Path(lines[-1]), ""


def helm_binary() -> Path:
    """The cached helm binary (built on first use); skips, or fails under CI=true, without it."""
    binary, why = _build()
    if binary is None:
        if _in_ci():
            pytest.fail(f"helm: {why}", pytrace=False)
        pytest.skip(f"helm: {why.splitlines()[0]}")
    return binary


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the built helm; never raises on a non-zero exit."""
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def values_args(value_set: str) -> list[str]:
    """The ``--values`` arguments of one of VALUE_SETS."""
    if value_set == "default":
        return []
    return ["--values", str(CHART / "ci" / f"{value_set}-values.yaml")]


@functools.cache
def _template(value_set: str, namespace: str, include_crds: bool,
              extra: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *values_args(value_set),
            *extra]
    if include_crds:
        args.append("--include-crds")
    done = helm(*args)
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(value_set: str, *, namespace: str = NAMESPACE, include_crds: bool = False,
           extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders for one value set (cached per arguments; a copy)."""
    return copy.deepcopy(list(_template(value_set, namespace, include_crds, extra)))
