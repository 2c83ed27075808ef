"""The Kubernetes CEL semver library (``k8s.io/apiserver/pkg/cel/library/semverlib.go``).

Owns the Semver value (the one-key map ``{"__semver__": "<version>"}``: the runtime cannot hold
Python objects) and ``semver``, ``isSemver``, ``major``, ``minor``, ``patch``; ``compareTo``,
``isGreaterThan`` and ``isLessThan`` are shared with Quantity in
:mod:`~policies.cel.library.opaque`, which calls :func:`semver_compare`. Must not import the CEL
runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.netip import quote

SEMVER_KEY: Final = "__semver__"
_NUMBERS: Final = frozenset("0123456789")
_ALPHANUMERIC: Final = _NUMBERS | frozenset("-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_UINT64_MAX: Final = 2**64 - 1


@dataclass(frozen=True)
class _Version:
    core: tuple[int, int, int]
    prerelease: tuple[str, ...]


def _normalize_semver(text: str) -> str:
    """``normalizeAndParse`` of Kubernetes' ``semverlib.go`` before its ``Parse``: no ``v``
    prefix, leading zeros trimmed, minor and patch filled with ``0``.

    Raises:
        ValueError: a short version with a pre-release or build part.
    """
    parts = text.removeprefix("v").split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            trimmed = part.lstrip("0")
            parts[i] = trimmed if trimmed and trimmed[0] in "0123456789" else "0" + trimmed
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _number(part: str, what: str) -> int:
    if not set(part) <= _NUMBERS:
        raise ValueError(f"Invalid character(s) found in {what.lower()} number {quote(part)}")
    if len(part) > 1 and part[0] == "0":
        raise ValueError(f"{what} number must not contain leading zeroes {quote(part)}")
    if not part or int(part) > _UINT64_MAX:  # strconv.ParseUint's refusals
        reason = "invalid syntax" if not part else "value out of range"
        raise ValueError(f"strconv.ParseUint: parsing {quote(part)}: {reason}")
    return int(part)


def _parse_semver(text: str, normalize: bool = False) -> _Version:
    """blang/semver v4 ``Parse`` (what Kubernetes' semver library calls), its error texts included.

    Raises:
        ValueError: e.g. ``No Major.Minor.Patch elements found``.
    """
    if normalize:
        text = _normalize_semver(text)
    if not text:
        raise ValueError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    major, minor = _number(parts[0], "Major"), _number(parts[1], "Minor")
    patch_text, plus, build_text = parts[2].partition("+")
    patch_text, minus, pre_text = patch_text.partition("-")
    patch = _number(patch_text, "Patch")
    prerelease = pre_text.split(".") if minus else []
    for ident in prerelease:
        if not ident:
            raise ValueError("Prerelease is empty")
        if set(ident) <= _NUMBERS:
            if len(ident) > 1 and ident[0] == "0":
                raise ValueError("Numeric PreRelease version must not contain leading zeroes "
                                 f"{quote(ident)}")
        elif not set(ident) <= _ALPHANUMERIC:
            raise ValueError(f"Invalid character(s) found in prerelease {quote(ident)}")
    for ident in build_text.split(".") if plus else []:
        if not ident:
            raise ValueError("Build meta data is empty")
        if not set(ident) <= _ALPHANUMERIC:
            raise ValueError(f"Invalid character(s) found in build meta data {quote(ident)}")
    return _Version((major, minor, patch), tuple(prerelease))


def semver(text: str, normalize: bool = False) -> dict[str, str]:
    """``semver(string[, normalize]) -> Semver`` (normalize: drop ``v``, fill minor/patch)."""
    _parse_semver(text, normalize)
    return {SEMVER_KEY: _normalize_semver(text) if normalize else text}


def is_semver(text: str, normalize: bool = False) -> bool:
    """``isSemver(string[, normalize]) -> bool``."""
    try:
        _parse_semver(text, normalize)
    except ValueError:
        return False
    return True


def _semver_parts(value: object) -> _Version:
    if not (isinstance(value, Mapping) and set(value) == {SEMVER_KEY}):
        raise TypeError("no such overload: expected a semver")
    return _parse_semver(value[SEMVER_KEY])


def semver_major(value: object) -> int:
    """``<Semver>.major() -> int``."""
    return _semver_parts(value).core[0]


def semver_minor(value: object) -> int:
    """``<Semver>.minor() -> int``."""
    return _semver_parts(value).core[1]


def semver_patch(value: object) -> int:
    """``<Semver>.patch() -> int``."""
    return _semver_parts(value).core[2]


def semver_compare(a: object, b: object) -> int:
    """Semantic-version precedence of two Semver maps (SemVer 2.0.0 section 11): -1, 0 or 1.

    Raises:
        TypeError: either value is not a Semver ("no such overload").
    """
    x, y = _semver_parts(a), _semver_parts(b)
    if x.core != y.core:
        return (x.core > y.core) - (x.core < y.core)
    if not x.prerelease or not y.prerelease:
        return (not x.prerelease) - (not y.prerelease)

    def key(ident: str) -> tuple[int, int, str]:
        return (0, int(ident), "") if set(ident) <= _NUMBERS else (1, 0, ident)

    kx, ky = [key(i) for i in x.prerelease], [key(i) for i in y.prerelease]
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
