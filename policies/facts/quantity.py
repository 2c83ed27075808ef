"""Kubernetes ``resource.Quantity`` parsing, exact.

Owns the grammar of quantities as the Kubernetes API defines it (``k8s.io/apimachinery/pkg/api/
resource``): an optional sign, a decimal number, and one suffix — binary SI (``Ki Mi Gi Ti Pi Ei``),
decimal SI (``n u m "" k M G T P E``) or a decimal exponent (``e3``, ``E-2``). Values are
returned as :class:`fractions.Fraction`, so ``500m`` is exactly ``1/2``: nothing is lost to
floats.

Must not know about GPUs or policies: callers decide what a value means.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from policies.value_words import described

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$"
)
# The API server refuses quantities whose text exceeds this many digits of precision.
_MAX_TEXT = 64
# Far past any real value (Kubernetes serialises within int64 at nano scale), and small enough to
# keep Fraction arithmetic instant: ``1e99999999`` would otherwise take minutes.
_MAX_EXPONENT = 1000


MAX_COUNT = 2**63 - 1
"""The largest count (devices, replicas, MiB) gpuguard accepts: Kubernetes stores int64."""


class QuantityError(ValueError):
    """A value is not a valid Kubernetes quantity; the message says what was expected."""


def parse_count(value: object) -> int | None:
    """A count written as a plain string of ASCII digits (a label or annotation value), or None.

    Returns:
        The count, 0 to :data:`MAX_COUNT`; None for anything else: other types, signs, spaces,
        values above ``MAX_COUNT``, and the non-ASCII digits ``str.isdigit`` accepts (``'²'``,
        on which ``int()`` fails, or ``'١٢'``; label values are ASCII).
    """
    if type(value) is not str or not 0 < len(value) <= _MAX_TEXT or not value.isascii() \
            or not value.isdigit():
        return None
    count = int(value)  # at most 64 digits: well inside int()'s 4300-digit limit
    return count if count <= MAX_COUNT else None


def parse_quantity(value: object) -> Fraction:
    """Parse a Kubernetes quantity (``"2"``, ``2``, ``"500m"``, ``"1Gi"``, ``"1e3"``) exactly.

    Args:
        value: a string as written in a manifest, or an int (YAML ``2``). Floats are accepted only
            when they hold an exact decimal value (YAML ``0.5``), as kubectl would serialise them.

    Returns:
        The value as a Fraction in the quantity's base unit (bytes for memory, cores for CPU,
        devices for extended resources).

    Raises:
        QuantityError: for booleans, None, other types, empty or malformed strings, or strings
            longer than 64 characters.
    """
    if (type(value) is str and len(value) <= _MAX_TEXT) or type(value) is float or \
            (type(value) is int and -MAX_COUNT <= value <= MAX_COUNT):
        # Manifests repeat a handful of values ("1", "8", "500m"); Fractions are immutable.
        # Only short keys are kept, so hostile input cannot fill memory through the cache.
        return _parse_cached(value)
    return _parse(value)


@functools.lru_cache(maxsize=4096, typed=True)  # typed: 1, 1.0 and True are not one key
def _parse_cached(value: str | int | float) -> Fraction:
    return _parse(value)


def _parse(value: object) -> Fraction:
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"expected a quantity such as 1, '2' or '500m', got "
                            f"{described(value)}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a finite quantity, got {described(value)}")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(
            f"expected a quantity string or number, got {described(value)}"
        )
    text = value.strip()
    if not text or len(text) > _MAX_TEXT:
        raise QuantityError(f"expected a quantity such as '1', '500m' or '1Gi', got {value!r}")
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"{value!r} is not a Kubernetes quantity (expected <number><suffix>, suffix one of "
            "Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e3)"
        )
    number = Fraction(match["num"])
    suffix = match["suffix"]
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:  # before the exponent: a bare "E" is exa, not an exponent
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])  # what is left: e3, E-2
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"{value!r}: exponent {exponent} is out of range (at most "
                            f"±{_MAX_EXPONENT})")
    return number * Fraction(10) ** exponent


def format_fraction(value: Fraction) -> str:
    """Render a Fraction for messages: ``2``, ``0.5``, or ``1/7`` without a short decimal form."""
    if value.denominator == 1:
        text = str(value.numerator)
        return text if len(text) <= 24 else f"{text[:6]}...e{len(text) - 1}"
    try:
        as_float = float(value)
    except OverflowError:
        return f"~1e{len(str(value.numerator)) - len(str(value.denominator))}"
    if Fraction(repr(as_float)) == value and len(repr(as_float)) <= 12:
        return repr(as_float)
    return f"{value.numerator}/{value.denominator}"
