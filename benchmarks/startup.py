"""CPU time of the CLI's start-up: ``--help``, ``--version``, every command's ``--help`` and the
small commands (issue 19: each under 0.4 s of CPU).

Run: .venv/bin/python benchmarks/startup.py [--repeat 3]

Each command runs in a fresh interpreter (``python -m gpuguard ARGV``); its user + system CPU
seconds come from ``getrusage(RUSAGE_CHILDREN)`` (best of ``--repeat``: the least disturbed by
other processes' cache and scheduler effects). CPU time does not count time spent waiting for a
core, but on a loaded machine it still grows (cache misses, frequency): compare figures from one
run only. The test suite checks the deterministic cause instead, the modules each command
imports (``tests/cli/test_cli_startup.py``). Prints one line per command and, at the end,
``startup_cpu_s_max: S`` and ``startup_over_budget: N``.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cli.test_cli_startup import SMALL_COMMANDS  # noqa: E402

BUDGET_S = 0.4


def cpu_seconds(argv: list[str], repeat: int) -> float:
    """Best-of-``repeat`` user + system CPU seconds of ``python -m gpuguard ARGV``."""
    best = float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "gpuguard", *argv], cwd=ROOT, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return best


def main() -> int:
    """Measure every command of SMALL_COMMANDS; exit 1 when one is over the budget."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures = {name: cpu_seconds(argv, args.repeat) for name, argv in SMALL_COMMANDS.items()}
    for name, seconds in figures.items():
        print(f"gpuguard {name}: {seconds:.3f} s of CPU"
              + ("  OVER the 0.4 s budget" if seconds >= BUDGET_S else ""))
    over = sum(seconds >= BUDGET_S for seconds in figures.values())
    print(f"startup_cpu_s_max: {max(figures.values()):.3f}")
    print(f"startup_over_budget: {over}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
