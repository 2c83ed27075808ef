"""CEL's type conversions as cel-go performs them: Go's parsing and formatting rules and cel-go's
range checks and error texts.

Owns what ``int()``, ``uint()``, ``double()``, ``bool()``, ``string()``, ``bytes()``,
``duration()``, ``timestamp()``, ``dyn()`` and ``type()`` do to a value in Kubernetes: Go's
``strconv.ParseInt`` / ``ParseUint`` / ``ParseFloat`` / ``ParseBool``, ``time.ParseDuration`` and
``time.Parse(time.RFC3339, ...)`` for strings, ``fmt``'s ``%g`` and ``time.RFC3339Nano`` for the
way back, and the checks of cel-go's ``common/types`` (``doubleToInt64Checked``, ``minUnixTime``,
``utf8.Valid``) with their texts (``unsigned integer overflow``, ``timestamp overflow``, ``type
conversion error from 'string' to 'int'``). Sources: Go 1.26 ``strconv``/``time``, cel-go
v0.29 ``common/types`` (the versions kube-apiserver 1.37 is built with).

Values are :class:`Constant` (a CEL type name and a plain value). Must not evaluate requests:
the runtime (cel-expr-python) does; :mod:`policies.cel.instantiation` uses this module for the
constants Kubernetes evaluates when a policy is created.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1
MIN_UNIX_TIME: Final = -62135596800  # 0001-01-01T00:00:00Z (cel-go common/types/timestamp.go)
MAX_UNIX_TIME: Final = 253402300799  # 9999-12-31T23:59:59Z
_NANOS: Final = 10**9

FUNCTIONS: Final = frozenset({"bool", "bytes", "double", "duration", "dyn", "int", "string",
                              "timestamp", "type", "uint"})
"""cel-go's type conversion functions (``overloads.IsTypeConversionFunction``)."""

_TYPE_NAMES: Final = {"duration": "google.protobuf.Duration",
                      "timestamp": "google.protobuf.Timestamp", "null": "null_type"}


class ConversionError(ValueError):
    """A conversion cel-go refuses; ``str()`` is cel-go's error text."""


@dataclass(frozen=True, slots=True)
class Constant:
    """A CEL value: ``type`` is ``int``, ``uint``, ``double``, ``string``, ``bytes``, ``bool``,
    ``null``, ``list``, ``map``, ``type``, ``duration`` (``value``: nanoseconds, int64) or
    ``timestamp`` (``value``: ``(unix seconds, nanoseconds, zone offset in seconds)``; Go keeps
    the offset a string was parsed with, and ``string()`` writes it back)."""

    type: str
    value: Any


def _refused(source: str, target: str) -> ConversionError:
    return ConversionError(f"type conversion error from '{_TYPE_NAMES.get(source, source)}' to "
                           f"'{_TYPE_NAMES.get(target, target)}'")


def convert(function: str, value: Constant) -> Constant:
    """``function(value)`` as cel-go evaluates it.

    Raises:
        ConversionError: cel-go's error for the conversion (out of range, unparsable text,
            ``no such overload: int(null_type)`` for a type the function has no overload for).
    """
    if function == "dyn":
        return value
    if function == "type":
        return Constant("type", _TYPE_NAMES.get(value.type, value.type))
    source = value.type
    if source == function:
        return value
    convert_to = _CONVERSIONS.get((source, function))
    if convert_to is None:  # not among the function's overloads (cel-go's stdlib)
        raise ConversionError(
            f"no such overload: {function}({_TYPE_NAMES.get(source, source)})")
    return Constant(function, convert_to(value.value))


# --- numbers ------------------------------------------------------------------------------------


def _int_of_uint(value: int) -> int:
    if value > INT64_MAX:
        raise ConversionError("integer overflow")
    return value


def _uint_of_int(value: int) -> int:
    if value < 0:
        raise ConversionError("unsigned integer overflow")
    return value


def _int_of_double(value: float) -> int:
    # doubleToInt64Checked: both ends excluded, NaN and infinities refused
    if math.isnan(value) or not float(INT64_MIN) < value < float(INT64_MAX):
        raise ConversionError("integer overflow")
    return int(value)


def _uint_of_double(value: float) -> int:
    if math.isnan(value) or not 0 <= value < 2.0**64:
        raise ConversionError("unsigned integer overflow")
    return int(value)


_DECIMAL_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_int(text: str) -> int:
    """Go ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits, nothing else.

    Raises:
        ConversionError: not such a number, or outside int64.
    """
    body = text[1:] if text[:1] in ("+", "-") else text
    if not _DECIMAL_DIGITS.fullmatch(body) or len(body.lstrip("0")) > 19:
        raise _refused("string", "int")  # (more than 19 digits: out of range, and past int())
    digits = body.lstrip("0") or "0"
    value = -int(digits) if text[:1] == "-" else int(digits)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _refused("string", "int")
    return value


def parse_uint(text: str) -> int:
    """Go ``strconv.ParseUint(text, 10, 64)``: ASCII digits only (no sign).

    Raises:
        ConversionError: not such a number, or over 2^64-1.
    """
    if not _DECIMAL_DIGITS.fullmatch(text) or len(text.lstrip("0")) > 20 \
            or int(text.lstrip("0") or "0") > UINT64_MAX:
        raise _refused("string", "uint")
    return int(text.lstrip("0") or "0")


_SPECIAL_FLOAT = re.compile(r"[+-]?(?:inf|infinity)|nan", re.ASCII | re.IGNORECASE)
_DECIMAL_FLOAT = re.compile(r"[+-]?(?=\.?[0-9])[0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9][0-9_]*)?",
                            re.ASCII)
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?=\.?[0-9a-fA-F_])[0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?"
                        r"[pP][+-]?[0-9][0-9_]*", re.ASCII)


def _underscores_ok(text: str) -> bool:
    """Go's ``underscoreOK``: each ``_`` between two digits (a base prefix counts as one)."""
    body = text[1:] if text[:1] in ("+", "-") else text
    saw, i, hexadecimal = "^", 0, False
    if len(body) >= 2 and body[0] == "0" and body[1] in "bBoOxX":
        i, saw, hexadecimal = 2, "0", body[1] in "xX"
    for ch in body[i:]:
        if ch.isdigit() or (hexadecimal and ch in "abcdefABCDEF"):
            saw = "0"
        elif ch == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def parse_float(text: str) -> float:
    """Go ``strconv.ParseFloat(text, 64)``: decimal or hexadecimal (``0x1p-2``, exponent
    required) with ``_`` between digits, ``inf``/``infinity`` (signed) and ``nan`` in any case.

    Raises:
        ConversionError: not such a number, or beyond float64's range (Go's ``ErrRange``, which
            cel-go refuses; a value too small for float64 becomes 0 as in Go).
    """
    if _SPECIAL_FLOAT.fullmatch(text):
        return float(text.lower().replace("infinity", "inf"))
    hexadecimal = _HEX_FLOAT.fullmatch(text)
    if not (hexadecimal or _DECIMAL_FLOAT.fullmatch(text)) \
            or ("_" in text and not _underscores_ok(text)):
        raise _refused("string", "double")
    plain = text.replace("_", "")
    try:
        value = float.fromhex(plain) if hexadecimal else float(plain)
    except (OverflowError, ValueError):
        raise _refused("string", "double") from None
    if math.isinf(value):
        raise _refused("string", "double")
    return value


_GO_BOOLS: Final = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
                    "0": False, "f": False, "F": False, "FALSE": False, "false": False,
                    "False": False}


def parse_bool(text: str) -> bool:
    """Go ``strconv.ParseBool``: ``1 t T TRUE true True`` and ``0 f F FALSE false False``.

    Raises:
        ConversionError: any other text.
    """
    if text not in _GO_BOOLS:
        raise _refused("string", "bool")
    return _GO_BOOLS[text]


def format_double(value: float) -> str:
    """Go ``fmt.Sprintf("%g", value)`` (shortest digits; exponent form below 1e-4 and from 1e21
    when the digits need it, always from 1e+06 otherwise): ``1e+06``, ``1.5``, ``+Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    digits_tuple = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digits_tuple.digits)).rstrip("0") or "0"
    # decimal point position: value = 0.<digits> * 10**point
    point = len(digits_tuple.digits) + int(digits_tuple.exponent)
    exponent = point - 1
    if exponent < -4 or exponent >= 6:  # shortest %g: precision 6 for the decision
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


# --- durations -----------------------------------------------------------------------------------

_UNITS: Final = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6,
                 "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)", re.ASCII)


def parse_duration(text: str) -> int:
    r"""Go ``time.ParseDuration``: ``[-+]?([0-9]*(\.[0-9]*)?unit)+`` with units ns, us/µs/μs,
    ms, s, m, h, or ``0``; nanoseconds within int64.

    Raises:
        ConversionError: cel-go's ``type conversion error from 'string' to
            'google.protobuf.Duration'``.
    """
    refused = _refused("string", "duration")
    negative = text[:1] == "-"
    rest = text[1:] if text[:1] in ("+", "-") else text
    if rest == "0":
        return 0
    if not rest:
        raise refused
    total, position = 0, 0
    while position < len(rest):
        part = _DURATION_PART.match(rest, position)
        assert part is not None  # the pattern matches the empty string
        whole, fraction, unit = part.group(1), part.group(2), part.group(3)
        if (not whole and not fraction) or unit not in _UNITS:
            raise refused
        scale = _UNITS[unit]
        if len(whole.lstrip("0")) > 19:  # leadingInt's overflow (and past int()'s digit limit)
            raise refused
        value = int(whole.lstrip("0") or "0")
        if value > 2**63 // scale:
            raise refused
        value *= scale
        if fraction:
            fractional, divisor = _leading_fraction(fraction)
            if fractional:
                value += int(float(fractional) * (float(scale) / divisor))
                if value > 2**63:
                    raise refused
        total += value
        if total > 2**63:
            raise refused
        position = part.end()
    if not negative and total > INT64_MAX:
        raise refused
    return -total if negative else total


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's ``leadingFraction``: the digits' value and ``10.0 ** n`` for the ``n`` digits kept
    (it stops before the value would pass 2^63 and ignores the rest)."""
    value, scale = 0, 1.0
    for ch in digits:
        if value > INT64_MAX // 10 or value * 10 + int(ch) > 2**63:
            break
        value, scale = value * 10 + int(ch), scale * 10
    return value, scale


def format_duration(nanoseconds: int) -> str:
    """cel-go's ``string(duration)``: Go ``FormatFloat(d.Seconds(), 'f', -1, 64) + "s"``
    (``Seconds()`` is ``float64(d / Second) + float64(d % Second) / 1e9``, Go's division
    truncating toward zero)."""
    whole = abs(nanoseconds) // _NANOS * (-1 if nanoseconds < 0 else 1)
    seconds = float(whole) + float(nanoseconds - whole * _NANOS) / 1e9
    text = format(Decimal(repr(seconds)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "s"


# --- timestamps ----------------------------------------------------------------------------------

_RFC3339 = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
                      r"(?:[.,]([0-9]+))?(Z|[+-][0-9]{2}:[0-9]{2})", re.ASCII)


def _days_in(month: int, year: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, 0 included)."""
    year -= month <= 2
    era = year // 400
    of_era = year - era * 400
    of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    of_era_days = of_era * 365 + of_era // 4 - of_era // 100 + of_year
    return era * 146097 + of_era_days - 719468


def parse_timestamp(text: str) -> tuple[int, int, int]:
    """Go ``time.Parse(time.RFC3339, text)`` then cel-go's range check: ``(unix seconds,
    nanoseconds, zone offset in seconds)``. Go's general parser accepts a one-digit hour, a
    comma before the fraction, more than nine fraction digits (truncated) and zone offsets up to
    ``24:60``; the ``T`` and ``Z`` are upper case.

    Raises:
        ConversionError: not such a timestamp (``type conversion error from 'string' to
            'google.protobuf.Timestamp'``) or outside years 1-9999 (``timestamp overflow``).
    """
    match = _RFC3339.fullmatch(text)
    if not match:
        raise _refused("string", "timestamp")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and hour < 24 and minute < 60 and second < 60) \
            or not 1 <= day <= _days_in(month, year):
        raise _refused("string", "timestamp")
    nanos = int((match.group(7) or "")[:9].ljust(9, "0"))
    zone = match.group(8)
    offset = 0
    if zone != "Z":
        zone_hour, zone_minute = int(zone[1:3]), int(zone[4:6])
        if zone_hour > 24 or zone_minute > 60:  # Go's range test allows 24 and 60
            raise _refused("string", "timestamp")
        offset = (zone_hour * 60 + zone_minute) * 60 * (-1 if zone[0] == "-" else 1)
    unix = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    unix -= offset
    if not MIN_UNIX_TIME <= unix <= MAX_UNIX_TIME:
        raise ConversionError("timestamp overflow")
    return unix, nanos, offset


def _timestamp_of_int(seconds: int) -> tuple[int, int, int]:
    if not MIN_UNIX_TIME <= seconds <= MAX_UNIX_TIME:
        raise ConversionError("timestamp overflow")
    return seconds, 0, 0


def format_timestamp(value: tuple[int, int, int]) -> str:
    """cel-go's ``string(timestamp)``: Go ``Format(time.RFC3339Nano)`` in the timestamp's own
    zone offset (``Z`` for 0), fraction without trailing zeros."""
    unix, nanos, offset = value
    local = unix + offset
    days, second_of_day = divmod(local, 86400)
    # civil_from_days (the inverse of _days_from_civil)
    z = days + 719468
    era = z // 146097
    of_era = z - era * 146097
    year_of_era = (of_era - of_era // 1460 + of_era // 36524 - of_era // 146096) // 365
    of_year = of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * of_year + 2) // 153
    day = of_year - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    year = year_of_era + era * 400 + (month <= 2)
    hour, rest = divmod(second_of_day, 3600)
    minute, second = divmod(rest, 60)
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    if offset == 0:
        zone = "Z"
    else:
        sign, size = ("-", -offset) if offset < 0 else ("+", offset)
        zone = f"{sign}{size // 3600:02d}:{size % 3600 // 60:02d}"
    return (f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
            f"{fraction}{zone}")


def _string_of_bytes(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConversionError("invalid UTF-8 in bytes, cannot convert to string") from None


_CONVERSIONS: Final[dict[tuple[str, str], Any]] = {  # cel-go common/stdlib/standard.go
    ("uint", "int"): _int_of_uint,
    ("double", "int"): _int_of_double,
    ("string", "int"): parse_int,
    ("timestamp", "int"): lambda t: t[0],
    ("duration", "int"): lambda d: d,
    ("int", "uint"): _uint_of_int,
    ("double", "uint"): _uint_of_double,
    ("string", "uint"): parse_uint,
    ("int", "double"): float,
    ("uint", "double"): float,
    ("string", "double"): parse_float,
    ("string", "bool"): parse_bool,
    ("int", "string"): str,
    ("uint", "string"): str,
    ("double", "string"): format_double,
    ("bool", "string"): lambda b: "true" if b else "false",
    ("bytes", "string"): _string_of_bytes,
    ("timestamp", "string"): format_timestamp,
    ("duration", "string"): format_duration,
    ("string", "bytes"): lambda s: s.encode("utf-8", "surrogatepass"),
    ("string", "duration"): parse_duration,
    ("string", "timestamp"): parse_timestamp,
    ("int", "timestamp"): _timestamp_of_int,
}
