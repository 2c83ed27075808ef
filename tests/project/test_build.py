"""The reproducible build: the hashed locks in requirements/ cover pyproject.toml, the Docker build
context holds what the Dockerfile copies, and the wheel — installed outside the checkout — runs
``gpuguard --version`` and audits the bundled snapshot exactly as the checkout does.

The image itself is not built here: this machine has no Docker daemon and no registry serving
base images (docs/install.md says how to build it). What the image's build stage does — a wheel
from this tree, installed with ``--no-deps`` over the locked dependencies — is what
:func:`test_the_wheel_audits_the_bundled_snapshot_outside_the_checkout` does.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import ROOT

LOCKS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pins(lock: Path) -> dict[str, tuple[str, int]]:
    """``{name: (version, number of hashes)}`` of a pip-compile ``--generate-hashes`` file."""
    pins: dict[str, tuple[str, int]] = {}
    text = lock.read_text(encoding="utf-8")
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match:
            pins[canonicalize_name(match[1])] = (match[2], block.count("--hash=sha256:"))
    return pins


def _direct(extra: str | None = None) -> list[Requirement]:
    """pyproject.toml's requirements: the dependencies, the build backend, and ``extra``'s."""
    names = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["build-system"]["requires"]]
    if extra:
        names += PYPROJECT["project"]["optional-dependencies"][extra]
    return [Requirement(name) for name in names]


@pytest.mark.parametrize(("lock", "extra"), [("runtime.txt", None), ("test.txt", "test")])
def test_each_lock_pins_every_requirement_of_pyproject_within_its_range(lock, extra):
    pins = _pins(LOCKS / lock)
    stale = [f"{req} (locked: {pins.get(canonicalize_name(req.name), ('nothing',))[0]})"
             for req in _direct(extra)
             if canonicalize_name(req.name) not in pins
             or not req.specifier.contains(pins[canonicalize_name(req.name)][0], prereleases=True)]
    assert not stale, f"requirements/{lock} is stale, run `bash .ci/lock`: {stale}"
    unhashed = [name for name, (_, hashes) in pins.items() if hashes == 0]
    assert not unhashed, f"pins without a hash in requirements/{lock}: {unhashed}"


def test_the_test_lock_keeps_every_runtime_pin():
    runtime, test = _pins(LOCKS / "runtime.txt"), _pins(LOCKS / "test.txt")
    moved = {name: (pin[0], test.get(name, ("missing",))[0])
             for name, pin in runtime.items() if test.get(name, ("missing",))[0] != pin[0]}
    assert not moved, f"CI would test other versions than the image ships: {moved}"


def test_ci_runs_on_the_locked_versions():
    """The environment running this suite is the one the test lock describes (.ci/run)."""
    if os.environ.get("CI") != "true":
        pytest.skip("a developer's venv may differ from the lock; .ci/run installs it exactly")
    drift = {name: (pin, installed_version(name))
             for name, (pin, _) in _pins(LOCKS / "test.txt").items()
             if installed_version(name) != pin}
    assert not drift, f"installed versions differ from requirements/test.txt: {drift}"


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments of each ``.venv/bin/pip install`` in ``text``, without ``--quiet``."""
    return [[word for word in words.split() if word not in ("--quiet", "-q")]
            for words in re.findall(r"\.venv/bin/pip install ([^&\n]+)", text)]


def test_the_readme_set_up_installs_what_ci_installs():
    # The README's `pip install -e '.[test]'` left a fresh venv's setuptools (65.5) in place, and
    # the wheel tests below (which build without isolation, offline) then failed at set-up. The
    # lock is the one source of what a test run stands on: the README installs it as .ci/run does.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    set_up = readme.split("## Set-up", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_installs = _pip_installs("\n".join(line for line in ci.splitlines()
                                           if not line.lstrip().startswith("#")))
    assert ci_installs and _pip_installs(set_up) == ci_installs


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves ``path`` out (the .dockerignore subset used here:
    glob patterns, ``**/``, no ``!`` exceptions)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.replace("**/", ""))
               for pattern in patterns for prefix in prefixes)


def test_the_docker_build_context_holds_everything_the_dockerfile_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions: extend _dockerignored"
    copied = [source for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from=" not in line
              for source in line.split()[1:-1]]
    assert "requirements/runtime.txt" in copied
    for source in copied:
        path = source.rstrip("/")
        assert (ROOT / path).exists(), f"Dockerfile copies {source}, which does not exist"
        assert not _dockerignored(path, patterns), f".dockerignore leaves out {source}"
    # The wheel's package data reaches through gpuguard/examples to examples/.
    target = os.path.normpath(os.path.join("gpuguard", os.readlink(ROOT / "gpuguard" / "examples")))
    assert target in {c.rstrip("/") for c in copied}, "the image's wheel would lack the examples"


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout with the locked setuptools (no build isolation: no
    download of a build backend)."""
    out = tmp_path_factory.mktemp("wheel")
    built = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                  "--no-build-isolation", "--no-index", "--wheel-dir", str(out), str(ROOT)],
                 ROOT, dict(os.environ))
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("gpuguard-*.whl")
    return path


def test_the_wheel_carries_the_data_the_commands_read(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("gpuguard/examples/cluster/pods.yaml",
                   "gpuguard/examples/cluster/metrics/dcgm-exporter.prom",
                   "gpuguard/examples/admission/gpu-pod-review.json",
                   "policies/data/mig_profiles.yaml", "policies/data/vgpu_types.yaml",
                   "policies/library/gpu-requesters.yaml"):
        assert needed in names
    source = {str(p.relative_to(ROOT / "examples")) for p in (ROOT / "examples").rglob("*")
              if p.is_file()}
    shipped = {n.removeprefix("gpuguard/examples/") for n in names
               if n.startswith("gpuguard/examples/")}
    assert shipped == source


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv outside the checkout with the wheel installed (``--no-deps``, from the
    file: no index). Its dependencies are this environment's, the locked ones: a ``.pth`` line
    puts this venv's site-packages after the new one's. A plain path entry runs none of the
    ``.pth`` files there, so the checkout's editable install stays out."""
    venv = tmp_path_factory.mktemp("venv") / "gpuguard"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent,
                dict(os.environ))
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                 "--no-deps", "--no-index", str(wheel)], venv.parent, dict(os.environ))
    assert done.returncode == 0, done.stderr
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                venv.parent, {})
    (Path(site.stdout.strip()) / "locked-dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    return venv


def _clean_env(tmp: Path) -> dict[str, str]:
    """No PYTHONPATH, no virtualenv of the checkout; HOME in a temporary directory."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8"}


def test_the_wheel_audits_the_bundled_snapshot_outside_the_checkout(installed, tmp_path):
    env, bin_dir = _clean_env(tmp_path), installed / "bin"
    where = _run([str(bin_dir / "python"), "-c",
                  "import gpuguard, policies; from gpuguard.bundled_examples import "
                  "CLUSTER_SNAPSHOT, CLUSTER_METRICS; print(gpuguard.__file__); "
                  "print(policies.__file__); print(CLUSTER_SNAPSHOT); print(CLUSTER_METRICS)"],
                 tmp_path, env)
    assert where.returncode == 0, where.stderr
    package, core, snapshot, metrics = where.stdout.split()
    for path in (package, core, snapshot):
        assert Path(path).is_relative_to(installed), f"{path} is not the wheel's"
    assert not Path(snapshot).is_symlink() and (Path(snapshot) / "pods.yaml").is_file()

    shown = _run([str(bin_dir / "gpuguard"), "--version"], tmp_path, env)
    assert (shown.returncode, shown.stdout) == (0, f"gpuguard {PYPROJECT['project']['version']}\n")

    # Without -f, the message names the installed snapshot a user can pass.
    bare = _run([str(bin_dir / "gpuguard"), "audit"], tmp_path, env)
    assert bare.returncode == 2 and f"-f {snapshot}," in bare.stderr

    audit = _run([str(bin_dir / "gpuguard"), "audit", "-f", snapshot, "--metrics", metrics,
                  "--jobs", "0", "-o", "json"], tmp_path, env)
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    # The same audit from the checkout: the wheel judges and counts exactly as the sources do.
    here = _run([sys.executable, "-m", "gpuguard", "audit", "-f", "examples/cluster",
                 "--metrics", "examples/cluster/metrics/dcgm-exporter.prom", "--jobs", "0",
                 "-o", "json"], ROOT, {**os.environ})
    assert here.returncode == 0, here.stderr
    expected = json.loads(here.stdout)
    assert report["summary"] == expected["summary"]
    assert (report["summary"]["nodes"], report["summary"]["pods"]) == (15, 60)
    assert report["findings"] == expected["findings"]
