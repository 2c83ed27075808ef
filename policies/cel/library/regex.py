"""The Kubernetes CEL regex library (``k8s.io/apiserver/pkg/cel/library/regex.go``).

Owns ``find`` and ``findAll`` and the one RE2 compiler they share (:func:`compile_regex`). RE2
(``google-re2``), as Kubernetes CEL uses: linear time, so a policy's pattern cannot hang the
webhook on a hostile value, and patterns RE2 refuses (backreferences, look-around) are refused
here too. Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do
I/O.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import re2

from policies.cel.library.declarations import FunctionSpec, function

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # errors become ValueError messages, not stderr noise


@functools.lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> Any:
    """Compile a pattern with RE2 (google-re2), as Kubernetes CEL does: linear time, no
    backtracking, so a policy's regex cannot hang the webhook on a hostile value (cached).

    Raises:
        ValueError: the pattern is not valid RE2 syntax (e.g. backreferences, look-around).
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"invalid regular expression {pattern!r}: {detail}") from None


def regex_find(text: str, pattern: str) -> str:
    """``<string>.find(regex) -> string``: the first match, or ``''``."""
    match = compile_regex(pattern).search(text)
    return "" if match is None else match.group(0)


def regex_find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """``<string>.findAll(regex[, n]) -> list<string>``: Go ``FindAllString`` semantics.

    ``n < 0`` returns all matches, ``n == 0`` none; an empty match right after the previous match
    is skipped as Go does.
    """
    if limit == 0:
        return []
    found: list[str] = []
    previous_end = -1
    for match in compile_regex(pattern).finditer(text):
        if match.start() == match.end() == previous_end:
            continue
        found.append(match.group(0))
        previous_end = match.end()
        if len(found) == limit:
            break
    return found


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("find", ("string_find_string", ["string", "string"], "string", True, regex_find)),
    function(
        "findAll",
        ("string_find_all_string", ["string", "string"], "list_string", True, regex_find_all),
        (
            "string_find_all_string_int",
            ["string", "string", "int"],
            "list_string",
            True,
            regex_find_all,
        ),
    ),
)
"""The regex library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
