"""The Kubernetes CEL format library (``k8s.io/apiserver/pkg/cel/library/format.go``, 1.31+).

Owns the Format value (the one-key map ``{"__format__": "<name>"}``), ``format.<name>()`` for
each of Kubernetes' named formats, ``format.named(string) -> optional<Format>`` and
``<Format>.validate(string) -> optional<list<string>>`` (``optional.none()`` when the string is
valid, else the reasons, in ``k8s.io/apimachinery/pkg/util/validation``'s words).

Python functions cannot return optionals to the runtime (cel-expr-python 0.1.3 has no Python form
for them), so :func:`expand` rewrites the two optional-returning calls before compiling, into
functions that return a list of zero or one element and the ext lists ``first()``:
``F.validate(s)`` -> ``F.validateAsList(s).first()`` and ``format.named(n)`` ->
``format.namedAsList(n).first()``. The result has the same type and value as Kubernetes'; a
compile error after such a call is reported at a column shifted by the rewrite.

``uri`` follows Go's ``url.ParseRequestURI`` as :mod:`~policies.cel.library.urls` does;
``datetime`` accepts RFC 3339 date-times (strfmt also accepts a few other ISO 8601 layouts).

Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import re
from collections.abc import Callable, Mapping
from typing import Final

from policies.cel import scanner
from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.urls import is_url

FORMAT_KEY: Final = "__format__"

# k8s.io/apimachinery/pkg/util/validation/validation.go, word for word.
_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_FMT: Final = f"{_DNS1123_LABEL_FMT}(\\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_DNS1035_LABEL_FMT: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_LABEL_MSG: Final = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
_QUALIFIED_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_FMT: Final = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}", re.I
)
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATETIME = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _matches(pattern: str, value: str) -> bool:
    # Go's ^...$ without multiline: the whole string (Python's $ would allow a final newline).
    return re.fullmatch(pattern, value) is not None


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    """``validation.RegexError``: the message, examples and the regex, as Go writes them."""
    shown = "".join(("" if i == 0 else " or ") + f"'{e}', " for i, e in enumerate(examples))
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(length: int, unit: str = "characters") -> str:
    # apimachinery's util/validation says characters, its newer api/validate/content (the
    # admissionregistration validation of kube-apiserver 1.37) bytes
    return f"must be no more than {length} {unit}"


def _mask_trailing_dash(name: str) -> str:
    # apimachinery's maskTrailingDash, including its [:len-2] (a prefix may be followed by more).
    return name[:-2] + "a" if len(name) > 1 and name.endswith("-") else name


def dns1123_label(value: str) -> list[str]:
    """``validation.IsDNS1123Label``: at most 63 characters of ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``."""
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_DNS1123_LABEL_FMT, value):
        if _matches(_DNS1123_SUBDOMAIN_FMT, value):
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(_DNS1123_LABEL_MSG, _DNS1123_LABEL_FMT, "my-name",
                                       "123-abc"))
    return errors


def dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    """``validation.IsDNS1123Subdomain``: at most 253 characters of dot-separated labels
    (``unit``: how the length limit is worded, ``characters`` or ``bytes``)."""
    errors = [_max_len(253, unit)] if len(value) > 253 else []
    if not _matches(_DNS1123_SUBDOMAIN_FMT, value):
        errors.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def dns1035_label(value: str) -> list[str]:
    """``validation.IsDNS1035Label``: at most 63 characters, starting with a letter."""
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_DNS1035_LABEL_FMT, value):
        errors.append(_regex_error(_DNS1035_LABEL_MSG, _DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errors


def qualified_name(value: str, unit: str = "characters") -> list[str]:
    """``validation.IsQualifiedName``: ``[prefix/]name``, the prefix a DNS-1123 subdomain, the
    name at most 63 ``unit`` (``characters``; ``bytes`` in the admissionregistration checks of
    kube-apiserver 1.37, which call it ``IsLabelKey``)."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return ["a qualified name " + _regex_error(
            _QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + m for m in dns1123_subdomain(parts[0], unit))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part " + _max_len(63, unit))
    if not _matches(_QUALIFIED_NAME_FMT, name):
        errors.append("name part " + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT,
                                                  "MyName", "my.name", "123-abc"))
    return errors


def label_value(value: str, unit: str = "characters") -> list[str]:
    """``validation.IsValidLabelValue``: empty, or at most 63 characters of a qualified name."""
    errors = [_max_len(63, unit)] if len(value) > 63 else []
    if not _matches(_LABEL_VALUE_FMT, value):
        errors.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value",
                                   "12345"))
    return errors


def _uri(value: str) -> list[str]:
    return [] if is_url(value) else [f'parse "{value}": invalid URI for request']


def _uuid(value: str) -> list[str]:
    return [] if _UUID.fullmatch(value) else ["does not match the UUID format"]


def _byte(value: str) -> list[str]:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return ["invalid base64"]
    return []


def _date(value: str) -> list[str]:
    try:
        if _DATE.fullmatch(value):
            datetime.date.fromisoformat(value)
            return []
    except ValueError:
        pass
    return ["invalid date"]


def _datetime(value: str) -> list[str]:
    match = _DATETIME.fullmatch(value)
    try:
        if match:
            zone = match[4].upper().replace("Z", "+00:00")
            datetime.datetime.fromisoformat(f"{match[1]}T{match[2]}{zone}")
            return []
    except ValueError:
        pass
    return ["invalid datetime"]


NAMED_FORMATS: Final[Mapping[str, Callable[[str], list[str]]]] = {
    "dns1123Label": dns1123_label,
    "dns1123Subdomain": dns1123_subdomain,
    "dns1035Label": dns1035_label,
    "qualifiedName": qualified_name,
    "dns1123LabelPrefix": lambda s: dns1123_label(_mask_trailing_dash(s)),
    "dns1123SubdomainPrefix": lambda s: dns1123_subdomain(_mask_trailing_dash(s)),
    "dns1035LabelPrefix": lambda s: dns1035_label(_mask_trailing_dash(s)),
    "labelValue": label_value,
    "uri": _uri,
    "uuid": _uuid,
    "byte": _byte,
    "date": _date,
    "datetime": _datetime,
}
"""Kubernetes' ``ConstantFormats``: name -> why a string does not match (``[]``: it does)."""


def named_as_list(name: str) -> list[dict[str, str]]:
    """``format.named(name)`` before :func:`expand`'s ``first()``: ``[Format]`` or ``[]``."""
    return [{FORMAT_KEY: name}] if name in NAMED_FORMATS else []


def validate_as_list(value: object, text: str) -> list[list[str]]:
    """``<Format>.validate(text)`` before :func:`expand`'s ``first()``: ``[]`` when valid, else
    ``[reasons]``.

    Raises:
        TypeError: ``value`` is not a Format ("no such overload").
    """
    if not (isinstance(value, Mapping) and set(value) == {FORMAT_KEY}
            and value[FORMAT_KEY] in NAMED_FORMATS):
        raise TypeError("no such overload: validate() of a value that is not a format")
    errors = NAMED_FORMATS[value[FORMAT_KEY]](text)
    return [errors] if errors else []


def expand(source: str) -> str:
    """``source`` with ``<F>.validate(s)`` and ``format.named(n)`` rewritten to their list forms
    followed by ``.first()`` (see the module docstring); other text unchanged. Comments and string
    literals are never rewritten."""
    if "validate" not in source and "named" not in source:
        return source
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), non-overlapping
    for call in scanner.calls(source, "validate", member=True):
        edits += [(call.name_start, call.name_end, "validateAsList"), (call.end, call.end,
                                                                         ".first()")]
    for call in scanner.calls(source, "format.named", member=False):
        edits += [(call.name_start, call.name_end, "format.namedAsList"),
                  (call.end, call.end, ".first()")]
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _constant(name: str) -> Callable[[], dict[str, str]]:
    return lambda: {FORMAT_KEY: name}


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    *(function(f"format.{name}", (f"format_{name}", [], "opaque", False, _constant(name)))
      for name in NAMED_FORMATS),
    function("format.namedAsList",
             ("format_named_as_list", ["string"], "list_opaque", False, named_as_list)),
    function("validateAsList",
             ("format_validate_as_list", ["opaque", "string"], "list_list_string", True,
              validate_as_list)),
)
"""The format library's functions (in their list forms, see :func:`expand`), as
:mod:`~policies.cel.library.libraries` collects them."""
