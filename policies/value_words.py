"""What a message calls a parsed YAML / JSON value, and the type a field expects.

Owns the one wording of "expected X, got Y" halves for every reader (policy files, manifests,
AdmissionReviews, inventories, price tables, the API's answers): the words of YAML and JSON,
which users write — ``null``, ``the number 7``, ``a map`` — never Python's type names
(``NoneType``, ``dict``, ``str``), which a user of a YAML file does not know. Must not import
anything of gpuguard (the bottom layer of :mod:`policies`).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

_QUOTED = 40  # characters of a string quoted in a message (a 5000-digit label stays readable)
_TYPE_WORDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               dict: "a map", list: "a list"}


def described(value: Any) -> str:
    """``value`` as a message names what was found: ``null``, ``the boolean true``, ``the number
    7`` (``.nan``, ``.inf`` as YAML writes them), ``the string '7'`` (cut to 40 characters,
    control characters escaped), ``the timestamp 2026-01-01`` (YAML's unquoted dates), ``a map``,
    ``a list``, ``binary data``: ``expected a number, got the string '2'`` says both what and
    which.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"the number {value}"
    if isinstance(value, float):
        if math.isnan(value):
            return "the number .nan"
        if math.isinf(value):
            return f"the number {'-' if value < 0 else ''}.inf"
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= _QUOTED else value[:_QUOTED - 3] + "..."
        return f"the string {text!r}"
    if isinstance(value, datetime.date):
        return f"the timestamp {value.isoformat()}"
    if isinstance(value, Mapping):
        return "a map"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, bytes | bytearray):
        return "binary data"
    return "a value of no JSON type"


def type_words(*kinds: type) -> str:
    """What a field of the Python types ``kinds`` expects, in YAML / JSON words: ``a string``,
    ``an integer or a number``, ``a map`` — the other half of :func:`described`."""
    return " or ".join(_TYPE_WORDS.get(k, f"a {k.__name__}") for k in kinds)
