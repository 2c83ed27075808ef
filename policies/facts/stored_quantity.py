"""The text kube-apiserver stores for a ``resource.Quantity``, whatever form it was written in.

A manifest may say ``nvidia.com/gpu: 8`` (a YAML number), ``cpu: 0.5``, ``memory: 1024Mi`` or
``cpu: "1000m"``; the API server parses each and stores its own form: ``"8"``, ``"500m"``,
``"1Gi"``, ``"1"``. Admission policies run in the cluster see only that form — a CEL expression
reads a string — so an offline evaluation that kept ``8`` a number, or ``"1000m"`` as written,
could answer otherwise than the cluster (a number where CEL expects a string is an error, and an
error under ``failurePolicy: Ignore`` admits).

Owns the port of ``k8s.io/apimachinery/pkg/api/resource`` (1.37) ``ParseQuantity`` (including
when it keeps the text as written: ``"+5"``, ``"1e3"``, ``"1Ei"``), ``CanonicalizeBytes``, and
the rounding up to milli units that ``Convert_v1_ResourceList_To_core_ResourceList`` applies to
every value of a ResourceList (``"0.0001"`` is stored as ``"1m"``). Numbers are first written as
kubectl sends them (Go's ``encoding/json``). Checked value by value against a real API server in
``tests/controlplane/test_stored_quantities_live.py``. Must not decide what a value means.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12,
                     "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_WORDS = {v: k for k, v in _DECIMAL_SUFFIXES.items()}
_BINARY_WORDS = {v: k for k, v in _BINARY_SUFFIXES.items()}
_SYNTAX = re.compile(r"(?P<sign>[+-]?)0*(?P<num>[0-9]*)(?:\.(?P<denom>[0-9]*))?"
                     r"(?P<suffix>[eEinumkKMGTP]*[-+]?[0-9]*)")
_NANO = -9
_MILLI = -3
_MAX_INT64_DIGITS = 18  # maxInt64Factors
_INT64 = 2**63 - 1  # also the cap of a BinarySI value (maxAllowed)
# Past any real quantity, and inside Python's 4300-digit int/str conversion limit: a longer text
# or a larger exponent is left as written (a number: as kubectl writes it).
_MAX_TEXT = 256
_MAX_EXPONENT = 1000
# Go's strings.TrimSpace (unicode.IsSpace): not Python's str.strip, which also strips \x1c-\x1f
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007" \
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


FORMAT_WRONG = ("quantities must match the regular expression "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
"""``resource.ErrFormatWrong``: the text does not have a quantity's shape."""
SUFFIX_WRONG = "unable to parse quantity's suffix"
"""``resource.ErrSuffix``: the shape is right, the suffix is none Kubernetes knows."""


@dataclass(frozen=True)
class _Parsed:
    """A parsed quantity: its exact value, its format, the text kept as written (or None), and
    the scale of the int64 form (None: the ``inf.Dec`` form)."""

    value: Fraction
    form: str  # "DecimalSI", "BinarySI", "DecimalExponent"
    kept: str | None
    scale: int | None


def _suffix(text: str) -> tuple[int, int, str] | None:
    """(base, exponent, format) of a suffix (``quantitySuffixer.interpret``)."""
    if text in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[text], "DecimalSI"
    if text in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[text], "BinarySI"
    if len(text) > 1 and text[0] in "eE":
        try:
            return 10, int(text[1:]), "DecimalExponent"
        except ValueError:
            return None
    return None


def _round_away(value: Fraction, scale: int) -> Fraction:
    """``value`` rounded away from zero to a multiple of 10**scale (``inf.RoundUp``)."""
    unit = Fraction(10) ** scale
    steps = value / unit
    whole = math.ceil(steps) if steps > 0 else math.floor(steps)
    return whole * unit


def _parse(text: str) -> _Parsed | None:
    """``ParseQuantity``; None where it returns an error, or past :data:`_MAX_TEXT` /
    :data:`_MAX_EXPONENT`."""
    if not text or len(text) > _MAX_TEXT:
        return None
    if text == "0":
        return _Parsed(Fraction(0), "DecimalSI", "0", 0)
    match = _SYNTAX.fullmatch(text)
    if match is None:
        return None
    sign, num, denom = match["sign"], match["num"] or "0", match["denom"] or ""
    interpreted = _suffix(match["suffix"])
    if interpreted is None or abs(interpreted[1]) > _MAX_EXPONENT:
        return None
    base, exponent, form = interpreted
    negative = sign == "-"
    magnitude = Fraction(int(num + denom), 10 ** len(denom))
    if base == 2:
        magnitude *= 2**exponent
    else:
        magnitude *= Fraction(10) ** exponent
    value = -magnitude if negative else magnitude
    if form == "BinarySI":
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1 \
            if exponent >= 0 and not denom else -1
        scale, mantissa = 0, 2**exponent
    else:
        precision = _MAX_INT64_DIGITS - len(num) - len(denom)
        scale, mantissa = exponent, 1
    if precision >= 0 and scale - len(denom) >= _NANO:
        scale -= len(denom)
        shifted = num + denom
        if int(shifted) * mantissa <= _INT64:
            if form == "BinarySI":
                kept = text if exponent % 10 == 0 and int(shifted) & 0x07 else None
            else:
                kept = text if scale % 3 == 0 and not shifted.endswith("000") and \
                    shifted[0] != "0" else None
            return _Parsed(value, form, kept, scale)
    # the inf.Dec form: rounded up to nano units, BinarySI capped at maxAllowed and below one
    # shown as DecimalSI
    if value != 0:
        value = _round_away(value, _NANO)
    if form == "BinarySI" and abs(value) > _INT64:
        value = Fraction(_INT64 if value > 0 else -_INT64)
    if form == "BinarySI" and 0 < abs(value) < 1:
        form = "DecimalSI"
    return _Parsed(value, form, None, None)


def _canonical(value: Fraction, form: str) -> str:
    """``CanonicalizeBytes``: ``500m``, ``1Gi``, ``1536Mi``, ``1e3``, in exact integers (Go's
    ``inf.Dec`` is exact). A DecimalSI exponent past ``E`` has no suffix, and Go then writes the
    number alone (``1000E`` is stored as ``1``): so does this."""
    if value == 0:
        return "0"
    if form == "BinarySI" and (-1024 < value < 1024 or value.denominator != 1):
        form = "DecimalSI"
    if form == "BinarySI":
        amount, power = int(value), 0
        while amount % 1024 == 0:
            amount, power = amount // 1024, power + 10
        return f"{amount}{_BINARY_WORDS.get(power, '')}"
    # value = amount * 10**exponent with amount an integer: the denominator divides 10**k
    numerator, denominator = value.numerator, value.denominator
    k = 0
    while denominator != 1 and k < 40:  # nano rounding leaves at most 10**9 (2**9 * 5**9)
        k += 1
        scaled = numerator * 10**k
        if scaled % denominator == 0:
            numerator, denominator = scaled // denominator, 1
    exponent = -k
    while numerator % 10 == 0:
        numerator, exponent = numerator // 10, exponent + 1
    while exponent % 3:
        numerator, exponent = numerator * 10, exponent - 1
    if form == "DecimalExponent":
        return str(numerator) if exponent == 0 else f"{numerator}e{exponent}"
    return f"{numerator}{_DECIMAL_WORDS.get(exponent, '')}"


def json_number(value: int | float) -> str:
    """A number as Go's ``encoding/json`` writes it (how kubectl sends a YAML number): ``8``,
    ``0.5``, ``1000`` for ``1e3``, an exponent only below 1e-6 or from 1e21 on (``1e-07`` is
    ``1e-7``). An integer outside int64 goes through float64 on its way (kubectl's unstructured
    objects hold int64 or float64): ``10**21`` is sent as ``1e+21``."""
    if isinstance(value, int):
        if -(2**63) <= value <= _INT64:
            return str(value)
        try:
            value = float(value)
        except OverflowError:
            return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, power = f"{Decimal(repr(value)).normalize():e}".partition("e")
    return f"{mantissa}e{'-' if power.startswith('-') else '+'}{power.lstrip('+-')}"


@functools.lru_cache(maxsize=4096, typed=True)
def stored_quantity(value: str | int | float, resource_list: bool = False) -> str | None:
    """The text kube-apiserver stores for a Quantity written as ``value``.

    Args:
        value: a string as written (``"1000m"``), or a YAML number (``8``, ``0.5``).
        resource_list: a value of a ResourceList (container ``limits`` / ``requests``, pod
            ``overhead``): rounded up to milli units first, as the API server does.

    Returns:
        ``"1"``, ``"500m"``, ``"1Gi"``, ... ; None for what the API server refuses (not a
        quantity; booleans) or what is past this port's bounds (a text over 256 characters, an
        exponent over 1000) — the caller leaves a string as it is, for its own error.
    """
    if isinstance(value, bool):
        return None
    text = value.strip(_GO_SPACE) if isinstance(value, str) else json_number(value)
    parsed = _parse(text)
    if parsed is None:
        return None
    if resource_list and (parsed.scale is None or parsed.scale < _MILLI):
        # RoundUp(-3): the int64 form at milli scale or coarser keeps its text
        rounded = _round_away(parsed.value, _MILLI) if parsed.value else parsed.value
        return _canonical(rounded, parsed.form)
    return parsed.kept if parsed.kept is not None else _canonical(parsed.value, parsed.form)


def quantity_error(value: object) -> str | None:
    """What ``ParseQuantity`` says of ``value`` (a string, or a number as kubectl sends it) when
    the API server decodes it into a Quantity: :data:`FORMAT_WRONG` or :data:`SUFFIX_WRONG`;
    None when it parses (also past this port's length and exponent bounds, which Go has not)."""
    if value is None:
        return None  # null decodes into a zero Quantity
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return FORMAT_WRONG
    text = value.strip(_GO_SPACE) if isinstance(value, str) else json_number(value)
    match = _SYNTAX.fullmatch(text)
    if not text or match is None:
        return FORMAT_WRONG
    if _suffix(match["suffix"]) is None:
        return SUFFIX_WRONG
    return None
