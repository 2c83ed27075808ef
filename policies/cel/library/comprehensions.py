"""Comprehension macros as cel-go spells them (Kubernetes' environment) where the C++ runtime
spells them otherwise.

The C++ runtime's two-variable macros (``all``, ``exists``, ``existsOne``, ``transformList``, ...)
come from its environment config (``policies/cel/runtime.py``), and its one-variable
exactly-one macro is the standard ``exists_one`` only. cel-go (``parser/macro.go``) accepts both
spellings with either number of variables: ``exists_one`` and ``existsOne``
(``ExistsOneMacroNew``) with one variable, ``exists_one`` and ``existsOne`` with two
(``ext.TwoVarComprehensions``). :func:`expand` therefore renames ``l.existsOne(x, p)`` (two
arguments) to ``exists_one`` and ``m.exists_one(k, v, p)`` (three arguments) to ``existsOne``.
Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

from policies.cel import scanner

_SPELLING = {  # (name as written, arguments) -> the runtime's name
    ("existsOne", 2): "exists_one",
    ("exists_one", 3): "existsOne",
}


def expand(source: str) -> str:
    """``source`` with each two-argument ``existsOne(...)`` member call named ``exists_one``
    (later columns shift right by one) and each three-argument ``exists_one(...)`` named
    ``existsOne`` (they shift left by one); calls inside strings and comments are left alone.
    """
    if "exists_one" not in source and "existsOne" not in source:
        return source
    renames = [(call, _SPELLING[(name, call.arguments)])
               for name in ("existsOne", "exists_one") if name in source
               for call in scanner.calls(source, name, member=True)
               if (name, call.arguments) in _SPELLING]
    for call, runtime_name in sorted(renames, key=lambda found: -found[0].name_start):
        source = source[:call.name_start] + runtime_name + source[call.name_end:]
    return source
