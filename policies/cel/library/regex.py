"""The Kubernetes CEL regex library (``k8s.io/apiserver/pkg/cel/library/regex.go``).

Owns ``find`` and ``findAll`` and the one RE2 compiler they share (:func:`compile_regex`). RE2
(``google-re2``), as Kubernetes CEL uses: linear time, so a policy's pattern cannot hang the
webhook on a hostile value, and patterns RE2 refuses (backreferences, look-around) are refused
here too; a pattern written as a literal is checked when the expression compiles
(:func:`literal_errors`), as Kubernetes does. Errors use Go's ``regexp/syntax`` words. Must not
import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import codecs
import functools
from typing import Any, Final

import re2

from policies.cel import scanner
from policies.cel.library.declarations import FunctionSpec, function

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # errors become ValueError messages, not stderr noise


# RE2's error codes (re2.h ErrorCode texts) in Go regexp/syntax's words, which Kubernetes reports.
_GO_ERROR_CODES: Final = {
    "missing )": "missing closing )",
    "missing ]": "missing closing ]",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid repetition size": "invalid repeat count",
    "trailing \\": "trailing backslash at end of expression",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
}


@functools.lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> Any:
    """Compile a pattern with RE2 (google-re2), as Kubernetes CEL does: linear time, no
    backtracking, so a policy's regex cannot hang the webhook on a hostile value (cached).

    Raises:
        ValueError: the pattern is not valid RE2 syntax (e.g. backreferences, look-around), with
            Go's text: ``error parsing regexp: missing closing ): `(```.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        code, _, fragment = detail.partition(": ")
        raise ValueError(
            f"error parsing regexp: {_GO_ERROR_CODES.get(code, code)}: `{fragment}`"
        ) from None


def _literal_value(token: str) -> str | None:
    """The value of a CEL string literal token whose escapes are plain (``None`` otherwise)."""
    prefix = token[: len(token) - len(token.lstrip("rRbB"))]
    if "b" in prefix.lower():
        return None
    body = token[len(prefix):]
    quote = body[:3] if body[:3] in ("'''", '"""') else body[:1]
    if len(body) < 2 * len(quote) or not body.endswith(quote):
        return None
    content = body[len(quote): len(body) - len(quote)]
    if prefix or "\\" not in content:
        return content
    try:
        return codecs.decode(content, "unicode_escape")
    except UnicodeDecodeError:
        return None


def literal_errors(source: str) -> list[tuple[int, str]]:
    """Invalid regular expressions written as literals in ``source``: ``(offset, message)`` for
    each ``find``/``findAll``/``matches`` call whose pattern is a string literal RE2 refuses.

    Kubernetes refuses such a policy when it is created (``matches``: cel-go's regex validator;
    ``find``/``findAll``: constant folding at program instantiation), with these texts.
    """
    found = []
    for name, kubernetes in (("find", "program instantiation failed"),
                             ("findAll", "program instantiation failed"),
                             ("matches", "invalid matches argument")):
        if f"{name}(" not in source:
            continue
        for call in scanner.calls(source, name, member=True):
            tokens = scanner.tokenize(source[call.name_end:call.end])
            if len(tokens) < 3 or tokens[1].kind is not scanner.TokenKind.STRING \
                    or tokens[2].text not in (",", ")"):
                continue
            pattern = _literal_value(tokens[1].text)
            if pattern is None:
                continue
            try:
                compile_regex(pattern)
            except ValueError as exc:
                found.append((call.name_end + tokens[1].start, f"{kubernetes}: {exc}"))
    return found


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
