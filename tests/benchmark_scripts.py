"""Loading a script of ``benchmarks/`` as a module, for the tests of its arithmetic and steps.

Each script is run as ``.venv/bin/python benchmarks/<name>.py``, not imported as a package
module; the tests load it from its file under a name of their own, so what they exercise is the
file a user runs.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.paths import ROOT


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` loaded as the module ``<name>_benchmark``.

    Raises:
        FileNotFoundError: no such script.
    """
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
