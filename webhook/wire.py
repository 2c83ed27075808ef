"""The AdmissionReview wire format: request bytes in, response maps out.

Owns reading an ``admission.k8s.io/v1`` (or ``v1beta1``) AdmissionReview body — content type,
content coding (``gzip`` / ``deflate`` inflated under the body limit, others refused), UTF-8,
JSON syntax, nesting depth, envelope ``apiVersion`` / ``kind``, ``request`` and ``uid`` —
into an :class:`Envelope`, every problem becoming a :class:`WireError` with its HTTP status and a
message naming the field; and writing AdmissionReview responses (``uid`` echoed, ``apiVersion``
answered in kind, a ``status`` on denial, ``warnings``, ``auditAnnotations``, a base64 JSONPatch)
and the Kubernetes ``Status`` body of every error answer (:func:`status_body`). Field names follow
the Kubernetes API reference for AdmissionReview.

JSON is read and written by orjson where it gives the same result as the standard library
(several times faster, which counts on every request); the standard library decides everything
else, so what is accepted, how it is decoded and every error message stay as they were: a body
orjson refuses is decoded again by the standard library (which then accepts lone surrogate escapes
and ``1e400`` as before, or words the error), a body with a run of 19 or more digits is decoded
by the standard library unless orjson writes its value back as the body with every int within
53 bits (orjson reads integers beyond 64 bits as floats), and output orjson cannot write as ASCII
is written by the standard library.

Must not evaluate policies, read the AdmissionRequest's content beyond the envelope, or do I/O.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.cel.runtime import MAX_NESTING
from policies.json_roundtrip import reencodes_as
from policies.records import maker

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
KIND = "AdmissionReview"
JSON_CONTENT_TYPE = "application/json"
GZIP, DEFLATE = "gzip", "deflate"
# Content-Encoding tokens (RFC 9110 section 8.4.1, case-insensitive) and what they mean here.
_CODINGS: dict[str, str | None] = {"identity": None, "gzip": GZIP, "x-gzip": GZIP,
                                   "deflate": DEFLATE}
# The Status reason of an HTTP error code (metav1.StatusReason), for errors that are not a
# WireError raised here (aiohttp's own 404 / 405 / 400, a bug's 500).
_STATUS_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 406: "NotAcceptable", 408: "Timeout", 409: "Conflict",
    413: "RequestEntityTooLarge", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
    504: "Timeout",
}

# HTTP status of a denial by its Status reason (metav1.StatusReason); anything else is 403.
_REASON_CODES = {
    "Forbidden": 403, "Unauthorized": 401, "Invalid": 422, "BadRequest": 400,
    "RequestEntityTooLarge": 413, "Conflict": 409, "AlreadyExists": 409, "NotFound": 404,
    "InternalError": 500,
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class WireError(Exception):
    """A request the server answers with an HTTP 4xx instead of an AdmissionReview.

    Attributes:
        status: the HTTP status (400, 413, 415, ...).
        reason: the ``Status`` reason (``BadRequest``, ``RequestEntityTooLarge``, ...).
        message: what was wrong, naming the field (``request.uid: expected a non-empty
            string``).
        unread: the request body was not read to its end (the connection cannot be reused).
    """

    def __init__(self, status: int, reason: str, message: str, *, unread: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.unread = unread


def bad_request(message: str) -> WireError:
    """A 400 ``BadRequest`` :class:`WireError`."""
    return WireError(400, "BadRequest", message)


@dataclass(frozen=True)
class Envelope:
    """A well-formed AdmissionReview.

    Attributes:
        api_version: ``admission.k8s.io/v1`` or ``admission.k8s.io/v1beta1`` (the answer uses
            the same).
        uid: ``request.uid``, echoed in the response.
        request: the AdmissionRequest map (not yet checked beyond ``uid``).
        size: the request body's length in bytes (0 when not known); it decides where the
            evaluation runs (see :mod:`webhook.admission`).
        checked: every value of the body is one the CEL runtime takes as it is (see
            :func:`decode_checked`), so the evaluation need not walk ``request.object`` /
            ``oldObject`` again (:func:`policies.cel.runtime.checked_json`).
    """

    api_version: str
    uid: str
    request: Mapping[str, Any]
    size: int = 0
    checked: bool = False


_make_envelope = maker(Envelope)  # one per request: the frozen __init__ cost ~10 k instructions


def check_content_type(content_type: str | None) -> None:
    """Accept ``application/json`` (with or without parameters such as ``charset=utf-8``).

    Raises:
        WireError: 415 for any other or a missing content type.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != JSON_CONTENT_TYPE:
        what = f"Content-Type {content_type!r} is not supported" if content_type \
            else "the request has no Content-Type"
        raise WireError(415, "UnsupportedMediaType",
                        f"{what}: send an AdmissionReview as {JSON_CONTENT_TYPE}")


def content_coding(header: str | None) -> str | None:
    """The compression of a body from its ``Content-Encoding`` header.

    Returns:
        ``"gzip"`` (also for ``x-gzip``), ``"deflate"``, or None for no header, an empty one or
        ``identity``.

    Raises:
        WireError: 415 ``UnsupportedMediaType`` for any other coding (``br``, ``zstd``,
            ``compress``, ...) or for more than one coding applied in turn.
    """
    if not header:
        return None
    tokens = [token.strip().lower() for token in header.split(",") if token.strip()]
    unknown = [token for token in tokens if token not in _CODINGS]
    codings = [_CODINGS[token] for token in tokens if _CODINGS.get(token)]
    if unknown or len(codings) > 1:
        what = f"Content-Encoding {_shown(header)} is not supported" if unknown else \
            f"Content-Encoding {_shown(header)}: only one coding is supported"
        raise WireError(415, "UnsupportedMediaType",
                        f"{what}: send the AdmissionReview uncompressed, or compressed once "
                        "with gzip or deflate")
    return codings[0] if codings else None


def decompress(body: bytes, coding: str, limit: int) -> bytes:
    """Inflate a ``gzip`` or ``deflate`` body, producing at most ``limit`` + 1 bytes.

    The output is bounded as it is produced (zlib's ``max_length``), so a small body that would
    inflate to gigabytes costs no more than ``limit`` bytes and the time to make them. ``gzip``
    may hold several members one after the other (RFC 1952 section 2.2, as Go's reader
    accepts); ``deflate`` is the zlib format (RFC 1950) or, as some clients send it, a raw
    DEFLATE stream (RFC 1951). zlib releases the GIL while it inflates.

    Raises:
        WireError: 413 when the body inflates to more than ``limit`` bytes; 400 when it is not
            valid for its coding (bad header or checksum, cut short, bytes after its end).
    """
    if not body:
        return body  # decode_json names the empty body
    if coding == GZIP:
        wbits = 16 + zlib.MAX_WBITS
    else:  # a zlib header: CM 8 and a header checksum divisible by 31 (RFC 1950 section 2.2)
        zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and \
            (body[0] << 8 | body[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
    parts: list[bytes] = []
    size = 0
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(data, limit + 1 - size)
        except zlib.error as exc:
            raise bad_request(f"the request body is not valid {coding} (Content-Encoding): "
                              f"{exc}") from None
        size += len(part)
        parts.append(part)
        if size > limit or (inflater.unconsumed_tail and not inflater.eof):
            raise WireError(413, "RequestEntityTooLarge",
                            f"the request body inflates ({coding}) to more than {limit} "
                            "bytes, the limit of an AdmissionReview")
        if not inflater.eof:
            raise bad_request(f"the request body is not valid {coding} (Content-Encoding): "
                              "the compressed data is cut short")
        data = inflater.unused_data
        if not data:
            return b"".join(parts)
        if coding != GZIP:
            raise bad_request(f"the request body is not valid {coding} (Content-Encoding): "
                              f"{len(data)} bytes follow the end of the compressed data")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads / json.dumps with arguments build a new coder on every call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"))
# Digits to "0", every other byte to " ": a run of _LONG_DIGITS in the translation is a run of 19
# digits in the body, the shortest integer orjson may read as a float (past 64 bits).
_DIGITS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGITS = b"0" * 19


def encode(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` (ASCII, so any string is safe to send).

    orjson writes it when the result is ASCII; otherwise (non-ASCII text, which the standard
    library escapes) or when orjson refuses the value (lone surrogates, integers past 64 bits,
    keys that are not strings) the standard library does, as it always did.
    """
    try:
        data = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value).encode()
    return data if data.isascii() else _ENCODER.encode(value).encode()


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects / arrays more than ``limit`` levels (the top is level 1).

    Walks level by level and visits containers only, each level's children in one
    comprehension (about 1.5 times as fast as a stack of nodes on a 3 MiB pod with 60,000 env
    vars); stops at the first level with no container.
    """
    level = [value]
    for _ in range(limit):
        deeper = [child for node in level if type(node) is dict for child in node.values()
                  if type(child) is dict or type(child) is list]
        deeper += [child for node in level if type(node) is list for child in node
                   if type(child) is dict or type(child) is list]
        if not deeper:
            return False
        level = deeper
    return True


def decode_json(body: bytes, *, max_depth: int) -> Any:
    """Parse a request body as strict UTF-8 JSON no deeper than ``max_depth``.

    Raises:
        WireError: 400 for an empty body, bytes that are not UTF-8, invalid JSON (including
            ``NaN`` / ``Infinity`` and integers too long to convert) or nesting deeper than
            ``max_depth``; the message says which and where.
    """
    return decode_checked(body, max_depth=max_depth)[0]


def decode_checked(body: bytes, *, max_depth: int) -> tuple[Any, bool]:
    """:func:`decode_json`, and whether the value is checked JSON for CEL.

    Checked (True) when orjson decoded it and ``max_depth`` is within the CEL runtime's
    :data:`~policies.cel.runtime.MAX_NESTING`: orjson refuses lone surrogate escapes and
    numbers beyond a double (``1e400``), gives str keys, and every int is within int64
    (within 53 bits as orjson writes the value back, or the body has no run of 19 digits) —
    with the depth check here, everything :func:`policies.cel.runtime.to_cel_data` would walk
    the value for. Bodies the standard
    library decodes are not checked.

    Raises:
        WireError: as :func:`decode_json`.
    """
    if not body.strip():
        raise bad_request("the request body is empty: expected an AdmissionReview")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        pass  # the standard library decides and words it (see module docstring)
    else:
        _check_depth(value, body, max_depth)
        same, small_ints = reencodes_as(value, body)
        if same and small_ints:
            return value, max_depth <= MAX_NESTING
        # An int past 53 bits, or a body orjson does not write back: a run of 19 digits may
        # be an int orjson read as a float, or one past int64 (the standard library's).
        if _LONG_DIGITS not in body.translate(_DIGITS):
            if not same:  # whitespace inside strings, escapes, floats: look closer
                _refuse_duplicate_keys(body.decode("utf-8"), value)
            return value, max_depth <= MAX_NESTING
    value = _check_depth(_decode_standard(body, max_depth), body, max_depth)
    _refuse_duplicate_keys(body.decode("utf-8"), value)
    return value, False


def _refuse_duplicate_keys(text: str, value: Any) -> None:
    """Raise when an object of ``text`` (already decoded as ``value``) names a key twice.

    The API server's strict decoding refuses duplicate fields; a JSON decoder keeps the last
    value, so ``"allowPrivilegeEscalation": true`` written again as ``false`` would read as
    either depending on the reader. The standard library's ``object_pairs_hook`` sees every
    member; the offending object is then found in ``value`` by identity to name its path.

    Raises:
        WireError: 400 naming the key path (``request.object.metadata.labels.app``).
    """
    found: list[tuple[dict[str, Any], str]] = []

    def pairs(members: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(members)
        if len(obj) != len(members) and not found:
            seen: set[str] = set()
            for key, _ in members:
                if key in seen:
                    found.append((obj, key))
                    break
                seen.add(key)
        return obj

    decoded = json.JSONDecoder(object_pairs_hook=pairs, parse_constant=_reject_constant) \
        .decode(text)
    if not found:
        return
    obj, key = found[0]
    path = _path_to(decoded, obj) or []
    raise bad_request(f"{_key_path([*path, key])}: duplicate key in the request body (the "
                      "API server's strict decoding refuses duplicate fields; the value a "
                      "reader sees would depend on the reader)")


def _path_to(value: Any, target: object) -> list[str | int] | None:
    """The keys and indexes from ``value`` to the object ``target`` (by identity)."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, dict):
            stack.extend((child, [*path, key]) for key, child in node.items()
                         if isinstance(child, (dict, list)))
        elif isinstance(node, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(node)
                         if isinstance(child, (dict, list)))
    return None


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]+")


def _key_path(path: Sequence[str | int]) -> str:
    """``request.object.spec.containers[0].env`` style; odd keys quoted (``["a b"]``)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part) and "." not in part:
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text or "(top level)"


def _decode_standard(body: bytes, max_depth: int) -> Any:
    """:func:`decode_json` by the standard library, without the depth check."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8: invalid byte at offset "
                          f"{exc.start}") from None
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                          f"column {exc.colno}") from None
    except RecursionError:
        raise bad_request(f"the request body nests JSON deeper than {max_depth} levels") from None
    except ValueError as exc:  # NaN / Infinity, integer digit limit
        reason = f"an integer has more than {sys.get_int_max_str_digits()} digits" \
            if "integer string conversion" in str(exc) else str(exc)
        raise bad_request(f"the request body is not valid JSON: {reason}") from None
    return value


def _check_depth(value: Any, body: bytes, max_depth: int) -> Any:
    """``value``, unless it nests deeper than ``max_depth``.

    Raises:
        WireError: 400 when it does.
    """
    # A document with fewer brackets than the limit cannot be too deep: skip the walk.
    if (isinstance(value, (dict, list)) and body.count(b"{") + body.count(b"[") > max_depth
            and too_deep(value, max_depth)):
        raise bad_request(f"the request body nests JSON deeper than {max_depth} levels")
    return value


def parse_envelope(value: Any, size: int = 0, checked: bool = False) -> Envelope:
    """Check the AdmissionReview envelope of a parsed body (``size``: its length in bytes;
    ``checked``: see :attr:`Envelope.checked`).

    Raises:
        WireError: 400 when the body is not an object, ``apiVersion`` / ``kind`` are not an
            AdmissionReview's, ``request`` is missing or not an object, or ``request.uid`` is
            missing or not a non-empty string.
    """
    if not isinstance(value, dict):
        raise bad_request(f"expected an AdmissionReview object, got a JSON "
                          f"{_json_type(value)}")
    api_version = value.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise bad_request(f"apiVersion: expected one of {', '.join(API_VERSIONS)}, got "
                          f"{_shown(api_version)}")
    if value.get("kind") != KIND:
        raise bad_request(f"kind: expected {KIND}, got {_shown(value.get('kind'))}")
    request = value.get("request")
    if request is None:
        raise bad_request("request: missing; an AdmissionReview sent to a webhook carries the "
                          "AdmissionRequest in 'request'")
    if not isinstance(request, dict):
        raise bad_request(f"request: expected an object, got a JSON {_json_type(request)}")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise bad_request(f"request.uid: expected a non-empty string, got {_shown(uid)}")
    return _make_envelope(api_version=api_version, uid=uid, request=request, size=size,
                          checked=checked)


def decode_envelope(body: bytes, *, max_depth: int) -> Envelope:
    """The envelope of an uncompressed body: :func:`decode_checked`, then
    :func:`parse_envelope`.

    Raises:
        WireError: 400, as :func:`decode_json` and :func:`parse_envelope` say.
    """
    value, checked = decode_checked(body, max_depth=max_depth)
    return parse_envelope(value, len(body), checked)


def parse(body: bytes, content_type: str | None, *, max_depth: int) -> Envelope:
    """Content type, decoding and envelope checks in one call (see the functions above).

    Raises:
        WireError: 415 or 400, as :func:`check_content_type`, :func:`decode_json` and
            :func:`parse_envelope` say.
    """
    check_content_type(content_type)
    return decode_envelope(body, max_depth=max_depth)


def decode_body(body: bytes, coding: str | None, *, max_bytes: int, max_depth: int) -> Envelope:
    """The envelope of a body as received: inflated when ``coding`` is given, then decoded.

    Pure and thread-safe: the server calls it in a thread for large or compressed bodies.
    ``Envelope.size`` is the decoded size.

    Raises:
        WireError: 413 or 400, as :func:`decompress`, :func:`decode_json` and
            :func:`parse_envelope` say.
    """
    if coding is not None:
        body = decompress(body, coding, max_bytes)
    return decode_envelope(body, max_depth=max_depth)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) else \
        f"a JSON {_json_type(value)}"
    return text if len(text) <= 80 else text[:77] + "..."


def status_code(reason: str) -> int:
    """The HTTP code for a denial ``reason`` (403 unless the reason names another)."""
    return _REASON_CODES.get(reason, 403)


def clean_warning(text: str) -> str:
    """A warning as one line: control characters (newlines, tabs) become single spaces."""
    if text.isascii() and text.isprintable():  # nothing to replace: skip the regex scan
        return text.strip()
    return _CONTROL.sub(" ", text).strip()


def response(
    envelope: Envelope,
    *,
    allowed: bool,
    message: str = "",
    reason: str = "Forbidden",
    warnings: Sequence[str] = (),
    audit_annotations: Mapping[str, str] | None = None,
    patch: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answering ``envelope``.

    Args:
        envelope: the request's envelope (``apiVersion`` and ``uid`` are echoed).
        allowed: the decision. A denial carries ``status`` with ``code`` (403 unless
            ``reason`` names another status), ``reason`` and ``message``.
        warnings: shown to the client (kubectl prints them); each made one line.
        audit_annotations: added to the audit event (keys already valid label-name segments).
        patch: RFC 6902 operations; omitted (with ``patchType``) when None or empty.

    Returns:
        The response map, ready for ``json.dumps``.
    """
    answer: dict[str, Any] = {"uid": envelope.uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"metadata": {}, "status": "Failure", "code": status_code(reason),
                            "reason": reason, "message": message}
    if warnings:
        answer["warnings"] = [clean_warning(w) for w in warnings]
    if audit_annotations:
        answer["auditAnnotations"] = dict(audit_annotations)
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(encode(list(patch))).decode("ascii")
    return {"apiVersion": envelope.api_version, "kind": KIND, "response": answer}


def status_reason(code: int) -> str:
    """The ``Status`` reason of an HTTP error ``code`` (``InternalError`` for an unknown 5xx,
    ``BadRequest`` for an unknown 4xx), as kube-apiserver names them."""
    return _STATUS_REASONS.get(code, "InternalError" if code >= 500 else "BadRequest")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A Kubernetes ``Status`` (``v1``) of a failed request: the body of every error answer."""
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "code": code, "reason": reason, "message": message}


def error_body(error: WireError) -> dict[str, Any]:
    """The ``Status`` body answering a :class:`WireError`."""
    return status_body(error.status, error.reason, error.message)
