"""Project-wide rules checked in the test run: layering (import-linter), lint (ruff) and types
(mypy)."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT


def test_layer_contracts_hold():
    # The DESIGN.md layer table, as import-linter contracts in pyproject.toml.
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is a test dependency"
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is a test dependency"
    result = subprocess.run(
        [ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean():
    # [tool.mypy] in pyproject.toml: the product packages (its ``files``), strict for policies/.
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    assert mypy, "mypy is a test dependency"
    result = subprocess.run(
        [mypy, "--no-incremental", "--cache-dir", "/dev/null"], cwd=ROOT, capture_output=True,
        text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout
