"""The exit codes of every ``gpuguard`` command, in one place (the table in
``docs/commands/README.md``, "Exit codes", says what each command means by them).

Owns the numbers only; each command decides which applies. 1 is reserved for what a command was
asked to find (a denial, a finding at ``--fail-on``, a failed test case, a lint error), so that CI
never reads a crash or a bad input as "findings".
"""

from __future__ import annotations

from typing import Final

#: Done; nothing to report at the level asked for.
EXIT_OK: Final = 0
#: Findings: a request would be denied, a finding at ``--fail-on``, a failed test, a lint error.
EXIT_FINDINGS: Final = 1
#: Bad input or usage: the message names the flag, file, document or field, and what was
#: expected (a broken or empty policy set, a path that names nothing, an unknown option).
EXIT_USAGE: Final = 2
#: The environment lacks something the command needs: no NVML on this machine, the API server
#: cannot be reached.
EXIT_ENVIRONMENT: Final = 3
#: An internal error (a bug): an unexpected exception caught at the top of the CLI. The value is
#: ``EX_SOFTWARE`` of BSD's sysexits.h.
EXIT_SOFTWARE: Final = 70
#: Interrupted by SIGINT (Ctrl-C): 128 + 2, as shells report it.
EXIT_INTERRUPTED: Final = 130
