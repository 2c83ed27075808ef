"""Two-variable comprehensions (cel-go ``ext.TwoVarComprehensions``, Kubernetes 1.32+) beyond
what the runtime's own macros take.

The C++ runtime's two-variable macros (``all``, ``exists``, ``existsOne``, ``transformList``, ...)
come from its environment config (``policies/cel/runtime.py``); cel-go also accepts the
``exists_one`` spelling with two variables, which the runtime knows with one variable only, so
:func:`expand` renames ``m.exists_one(k, v, p)`` (three arguments) to ``existsOne``. Must not
import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

from policies.cel import scanner


def expand(source: str) -> str:
    """``source`` with each three-argument ``exists_one(...)`` member call named ``existsOne``
    (same length as written but one: later columns shift left by one)."""
    if "exists_one" not in source:
        return source
    for call in reversed(scanner.calls(source, "exists_one", member=True)):
        if call.arguments == 3:
            source = source[:call.name_start] + "existsOne" + source[call.name_end:]
    return source
