"""Whether orjson writes a decoded JSON value back as the text it came from, whitespace aside.

Owns the one proof that a fast decode lost nothing: a JSON text orjson writes back (whitespace
aside) from the value it decoded names no key twice and held no number that decoded inexactly.
The webhook's wire (``webhook.wire``) and the snapshot reader (:func:`policies.sources.
decode_json_value`) both decode with orjson and fall back to the standard library's strict
decoding when this says no.

Must not decode, raise, or word errors: it answers a yes / no question only.
"""

from __future__ import annotations

from typing import Any

import orjson

WHITESPACE = b" \t\n\r"  # JSON's (RFC 8259 section 2)


def reencodes_as(value: Any, body: bytes) -> tuple[bool, bool]:
    r"""Whether orjson writes ``value`` back as ``body``, whitespace aside, and whether every
    int in ``value`` is within 53 bits.

    Written back the same, ``body`` has no duplicate key: a JSON object written from a dict
    names each key once, and deleting whitespace (inside strings too) from both keeps every
    structural byte — quotes, brackets, colons, commas; whitespace never escapes a quote — so
    equal results have the same objects with the same number of members. Nor did orjson read
    an int as a float (it does past 64 bits): the float would be written with a ``.`` or an
    exponent. With ints within 53 bits as well (``OPT_STRICT_INTEGER``), every int is within
    int64, so the body needs no search for long digit runs. This is the case of
    kube-apiserver's compact JSON (one C encoding and a byte compare) and of indented JSON
    (``kubectl get -o json``, ``json.dumps(indent=…)`` of ASCII text: a few C passes over the
    bytes more); anything else (``\\u`` escapes, other number spellings) answers False.

    Args:
        value: what a decoder made of ``body``.
        body: the JSON text, UTF-8 bytes.

    Returns:
        ``(written back the same, every int within 53 bits)``; ``(False, False)`` when orjson
        cannot write ``value`` at all (an int past 64 bits, a key that is not a string).
    """
    small_ints = True
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER)
    except orjson.JSONEncodeError:
        small_ints = False
        try:
            encoded = orjson.dumps(value)
        except orjson.JSONEncodeError:
            return False, False
    if encoded == body:
        return True, small_ints
    # orjson writes no whitespace but inside strings: most bodies have none there, and the
    # whitespace-free body then equals the encoding as it is.
    stripped = body.translate(None, WHITESPACE)
    return stripped == encoded or stripped == encoded.translate(None, WHITESPACE), small_ints
