"""The Kubernetes CEL semver library (``k8s.io/apiserver/pkg/cel/library/semverlib.go``).

Owns the Semver value (the one-key map ``{"__semver__": "<version>"}``: the runtime cannot hold
Python objects) and ``semver``, ``isSemver``, ``major``, ``minor``, ``patch``; ``compareTo``,
``isGreaterThan`` and ``isLessThan`` are shared with Quantity in
:mod:`~policies.cel.library.opaque`, which calls :func:`semver_compare`. Must not import the CEL
runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from policies.cel.library.declarations import FunctionSpec, function

SEMVER_KEY: Final = "__semver__"
_IDENT = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _normalize_semver(text: str) -> str:
    text = text.removeprefix("v")
    cut = min((i for i in (text.find("-"), text.find("+")) if i >= 0), default=len(text))
    core, rest = text[:cut].split("."), text[cut:]
    if not 1 <= len(core) <= 3 or not all(part.isdigit() and part.isascii() for part in core):
        return text
    return ".".join(str(int(part)) for part in [*core, "0", "0"][:3]) + rest


def _parse_semver(text: str, normalize: bool = False) -> re.Match[str]:
    match = _SEMVER.match(_normalize_semver(text) if normalize else text)
    if match is None:
        raise ValueError(f"could not parse {text!r} as semantic version")
    return match


def semver(text: str, normalize: bool = False) -> dict[str, str]:
    """``semver(string[, normalize]) -> Semver`` (normalize: drop ``v``, fill minor/patch)."""
    return {SEMVER_KEY: _parse_semver(text, normalize).group(0)}


def is_semver(text: str, normalize: bool = False) -> bool:
    """``isSemver(string[, normalize]) -> bool``."""
    try:
        _parse_semver(text, normalize)
    except ValueError:
        return False
    return True


def _semver_parts(value: object) -> re.Match[str]:
    if not (isinstance(value, Mapping) and set(value) == {SEMVER_KEY}):
        raise TypeError("no such overload: expected a semver")
    return _parse_semver(value[SEMVER_KEY])


def semver_major(value: object) -> int:
    """``<Semver>.major() -> int``."""
    return int(_semver_parts(value).group(1))


def semver_minor(value: object) -> int:
    """``<Semver>.minor() -> int``."""
    return int(_semver_parts(value).group(2))


def semver_patch(value: object) -> int:
    """``<Semver>.patch() -> int``."""
    return int(_semver_parts(value).group(3))


def semver_compare(a: object, b: object) -> int:
    """Semantic-version precedence of two Semver maps (SemVer 2.0.0 section 11): -1, 0 or 1.

    Raises:
        TypeError: either value is not a Semver ("no such overload").
    """
    x, y = _semver_parts(a), _semver_parts(b)
    core_x, core_y = [int(x.group(i)) for i in (1, 2, 3)], [int(y.group(i)) for i in (1, 2, 3)]
    if core_x != core_y:
        return (core_x > core_y) - (core_x < core_y)
    pre_x, pre_y = x.group(4), y.group(4)
    if pre_x is None or pre_y is None:
        return (pre_x is None) - (pre_y is None)

    def key(ident: str) -> tuple[int, int, str]:
        return (0, int(ident), "") if ident.isdigit() else (1, 0, ident)

    kx, ky = [key(i) for i in pre_x.split(".")], [key(i) for i in pre_y.split(".")]
    return (kx > ky) - (kx < ky)


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function(
        "semver",
        ("string_to_semver", ["string"], "opaque", False, semver),
        ("string_bool_to_semver", ["string", "bool"], "opaque", False, semver),
    ),
    function(
        "isSemver",
        ("is_semver_string", ["string"], "bool", False, is_semver),
        ("is_semver_string_bool", ["string", "bool"], "bool", False, is_semver),
    ),
    function("major", ("semver_major", ["opaque"], "int", True, semver_major)),
    function("minor", ("semver_minor", ["opaque"], "int", True, semver_minor)),
    function("patch", ("semver_patch", ["opaque"], "int", True, semver_patch)),
)
"""The semver library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
