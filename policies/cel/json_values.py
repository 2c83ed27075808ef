"""YAML-loaded values as JSON data: the one conversion for what a YAML safe loader makes beyond
JSON, wherever an object read from a file must be written as JSON (a response patch, the audit's
packed objects).

Owns the mapping: timestamps as CEL reads them (RFC 3339 / ``YYYY-MM-DD`` text, via
:func:`policies.cel.runtime.to_cel_data`), binary as base64 (how the Kubernetes API encodes bytes),
sets and tuples as lists, map keys that are not strings as JSON writes them (``1``, ``true``,
``null``). JSON input comes back equal. Must not do I/O.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Mapping
from typing import Any

from policies.cel.runtime import to_cel_data


def to_json_data(value: Any) -> Any:
    """``value`` with every part JSON can hold (see the module docstring); other scalars (a
    Fraction, inf) are left as they are for the caller's encoder to judge."""
    if isinstance(value, Mapping):
        return {key if isinstance(key, str) else _key_text(key): to_json_data(item)
                for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json_data(item) for item in value]
    if isinstance(value, datetime.date):
        return to_cel_data(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return value


def _key_text(key: Any) -> str:
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    text = to_json_data(key)
    return text if isinstance(text, str) else json.dumps(text)
