"""The Kubernetes CEL libraries, as plain Python functions and a declaration table.

Owns what the CEL environment adds on top of the CEL standard library and the runtime's own
extensions (strings, optional, math, encoders): the Kubernetes libraries from
``k8s.io/apiserver/pkg/cel/library`` — quantity (in :mod:`policies.cel.library.quantity`), lists,
regex, sets, semver, IP/CIDR, URL — plus ``jsonpatch.escapeKey``. :data:`LIBRARY` declares every
function with CEL-neutral type names; ``policies/cel/runtime.py`` turns it into runtime
declarations.

Values that Kubernetes represents as opaque CEL types (Quantity, Semver, IP, CIDR, URL) travel as
one-key maps, e.g. ``{"__ip__": "10.0.0.1"}``, because the runtime cannot hold Python objects. The
runtime dispatches overloads by argument *kind* only, so functions shared by several opaque types
(``compareTo``, ``isGreaterThan``, ``isLessThan``, ``string``) have one implementation that looks
at the map's key.

Implementations receive plain Python values (the runtime converts arguments) and signal CEL
errors by raising: ``TypeError`` for "no such overload" (arrives as ``INVALID_ARGUMENT``),
``ValueError`` for bad values (``OUT_OF_RANGE``). The runtime does not accept ``datetime`` or
``timedelta`` back from Python, so ``sum()``, ``min()`` and ``max()`` over timestamps or durations
are refused with an error (``isSorted()`` works); lists of ``uint`` arrive as Python ints and their
sums come back as ``int``.

Regex functions (``find``, ``findAll``) use RE2 (``google-re2``), as Kubernetes CEL does: linear
time, so a policy's pattern cannot hang the webhook on a hostile value, and patterns RE2 refuses
(backreferences, look-around) are refused here too.

Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs, quote, urlsplit

import re2

from policies.cel.library import quantity as q

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True)
class OverloadSpec:
    """One overload: ``params`` and ``result`` are CEL type names.

    Type names: ``string int double bool bytes dyn list map`` and ``opaque`` (the map form of the
    Kubernetes opaque types). For member overloads ``params[0]`` is the receiver.
    """

    overload_id: str
    params: tuple[str, ...]
    result: str
    member: bool
    impl: Callable[..., Any]


@dataclass(frozen=True)
class FunctionSpec:
    """A CEL function name and its overloads."""

    name: str
    overloads: tuple[OverloadSpec, ...]


# --- CEL equality and ordering on plain values ---------------------------------------------------


def cel_equal(a: object, b: object) -> bool:
    """CEL ``==`` on plain values: numbers compare across int/double, bool never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, bytes | bytearray) and isinstance(b, bytes | bytearray):
        return bytes(a) == bytes(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return len(a) == len(b) and all(k in b and cel_equal(v, b[k]) for k, v in a.items())
    return type(a) is type(b) and a == b


def _order_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    for kind, types in (
        ("string", str),
        ("bytes", bytes | bytearray),
        ("timestamp", datetime.datetime),
        ("duration", datetime.timedelta),
    ):
        if isinstance(value, types):
            return kind
    raise TypeError(f"no such overload: {type(value).__name__} values are not comparable")


def _compare(a: Any, b: Any) -> int:
    if _order_kind(a) != _order_kind(b):
        raise TypeError(f"no such overload: cannot compare {_order_kind(a)} with {_order_kind(b)}")
    return int(a > b) - int(a < b)


# --- lists ---------------------------------------------------------------------------------------


# Python functions cannot hand timestamps or durations back to the runtime (it rejects them).
_NO_TIME_RESULTS: Final = "{name}() over timestamps or durations is not supported in gpuguard"


def list_is_sorted(values: list[Any]) -> bool:
    """``<list>.isSorted() -> bool`` for comparable elements (numbers, strings, bools, ...)."""
    return all(_compare(values[i], values[i + 1]) <= 0 for i in range(len(values) - 1))


def list_sum(values: list[Any]) -> Any:
    """``<list>.sum()``: ints (int64-checked) or doubles; ``[].sum() == 0``; durations refused."""
    if not values:
        return 0
    kinds = {"bool" if isinstance(v, bool) else type(v).__name__ for v in values}
    if kinds == {"int"}:
        total = sum(values)
        if not _INT64_MIN <= total <= _INT64_MAX:
            raise ValueError("integer overflow")
        return total
    if kinds == {"float"}:
        return float(sum(values))
    if kinds == {"timedelta"}:
        raise TypeError(_NO_TIME_RESULTS.format(name="sum"))
    raise TypeError(f"no such overload: sum() over {', '.join(sorted(kinds))}")


def _extreme(values: list[Any], name: str, prefer: int) -> Any:
    if not values:
        raise ValueError(f"{name} called on empty list")
    best = values[0]
    for value in values[1:]:
        if _compare(best, value) == prefer:
            best = value
    if isinstance(best, datetime.datetime | datetime.timedelta):
        raise TypeError(_NO_TIME_RESULTS.format(name=name))
    return best


def list_min(values: list[Any]) -> Any:
    """``<list>.min()``; an empty list is an error ("min called on empty list")."""
    return _extreme(values, "min", 1)


def list_max(values: list[Any]) -> Any:
    """``<list>.max()``; an empty list is an error ("max called on empty list")."""
    return _extreme(values, "max", -1)


def list_index_of(values: list[Any], item: object) -> int:
    """``<list>.indexOf(x) -> int``, -1 when absent (CEL equality)."""
    return next((i for i, v in enumerate(values) if cel_equal(v, item)), -1)


def list_last_index_of(values: list[Any], item: object) -> int:
    """``<list>.lastIndexOf(x) -> int``, -1 when absent (CEL equality)."""
    return next((i for i in range(len(values) - 1, -1, -1) if cel_equal(values[i], item)), -1)


# --- sets ----------------------------------------------------------------------------------------


def sets_contains(values: list[Any], subset: list[Any]) -> bool:
    """``sets.contains(list, list) -> bool``: every element of the second is in the first."""
    return all(any(cel_equal(v, s) for v in values) for s in subset)


def sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    """``sets.equivalent(list, list) -> bool``: same elements, ignoring order and duplicates."""
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: list[Any], b: list[Any]) -> bool:
    """``sets.intersects(list, list) -> bool``: at least one common element."""
    return any(cel_equal(x, y) for x in a for y in b)


# --- regex ---------------------------------------------------------------------------------------

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


# --- semver --------------------------------------------------------------------------------------

_SEMVER_KEY: Final = "__semver__"
_IDENT = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _normalize_semver(text: str) -> str:
    text = text.removeprefix("v")
    cut = min((i for i in (text.find("-"), text.find("+")) if i >= 0), default=len(text))
    core, rest = text[:cut].split("."), text[cut:]
    if not 1 <= len(core) <= 3 or not all(part.isdigit() and part.isascii() for part in core):
        return text
    return ".".join(str(int(part)) for part in [*core, "0", "0"][:3]) + rest


def _parse_semver(text: str, normalize: bool = False) -> re.Match[str]:
    match = _SEMVER.match(_normalize_semver(text) if normalize else text)
    if match is None:
        raise ValueError(f"could not parse {text!r} as semantic version")
    return match


def semver(text: str, normalize: bool = False) -> dict[str, str]:
    """``semver(string[, normalize]) -> Semver`` (normalize: drop ``v``, fill minor/patch)."""
    return {_SEMVER_KEY: _parse_semver(text, normalize).group(0)}


def is_semver(text: str, normalize: bool = False) -> bool:
    """``isSemver(string[, normalize]) -> bool``."""
    try:
        _parse_semver(text, normalize)
    except ValueError:
        return False
    return True


def _semver_parts(value: object) -> re.Match[str]:
    if not (isinstance(value, Mapping) and set(value) == {_SEMVER_KEY}):
        raise TypeError("no such overload: expected a semver")
    return _parse_semver(value[_SEMVER_KEY])


def semver_major(value: object) -> int:
    """``<Semver>.major() -> int``."""
    return int(_semver_parts(value).group(1))


def semver_minor(value: object) -> int:
    """``<Semver>.minor() -> int``."""
    return int(_semver_parts(value).group(2))


def semver_patch(value: object) -> int:
    """``<Semver>.patch() -> int``."""
    return int(_semver_parts(value).group(3))


def _semver_compare(a: object, b: object) -> int:
    x, y = _semver_parts(a), _semver_parts(b)
    core_x, core_y = [int(x.group(i)) for i in (1, 2, 3)], [int(y.group(i)) for i in (1, 2, 3)]
    if core_x != core_y:
        return (core_x > core_y) - (core_x < core_y)
    pre_x, pre_y = x.group(4), y.group(4)
    if pre_x is None or pre_y is None:
        return (pre_x is None) - (pre_y is None)

    def key(ident: str) -> tuple[int, int, str]:
        return (0, int(ident), "") if ident.isdigit() else (1, 0, ident)

    kx, ky = [key(i) for i in pre_x.split(".")], [key(i) for i in pre_y.split(".")]
    return (kx > ky) - (kx < ky)


# --- IP and CIDR ---------------------------------------------------------------------------------

_IP_KEY: Final = "__ip__"
_CIDR_KEY: Final = "__cidr__"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse_ip(text: str) -> IPAddress:
    if "%" in text:
        raise ValueError(f"IP address {text!r} with zone value is not allowed")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"IP Address {text!r} parse error during conversion from string") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address {text!r} is not allowed")
    return address


def _parse_cidr(text: str) -> tuple[IPAddress, int]:
    address_text, slash, bits_text = text.partition("/")
    if not slash or not bits_text.isdigit() or not bits_text.isascii():
        raise ValueError(f"network address {text!r} parse error during conversion from string")
    address = _parse_ip(address_text)
    bits = int(bits_text)
    if bits > address.max_prefixlen or (len(bits_text) > 1 and bits_text[0] == "0"):
        raise ValueError(f"network address {text!r} parse error during conversion from string")
    return address, bits


def _ip_of(value: object) -> IPAddress:
    if isinstance(value, str):
        return _parse_ip(value)
    if isinstance(value, Mapping) and set(value) == {_IP_KEY}:
        return ipaddress.ip_address(value[_IP_KEY])
    raise TypeError("no such overload: expected an IP address")


def _cidr_of(value: object) -> tuple[IPAddress, int]:
    if isinstance(value, str):
        return _parse_cidr(value)
    if isinstance(value, Mapping) and set(value) == {_CIDR_KEY}:
        return _parse_cidr(value[_CIDR_KEY])
    raise TypeError("no such overload: expected a CIDR")


def ip(text: str) -> dict[str, str]:
    """``ip(string) -> IP``; zones and IPv4-mapped IPv6 addresses are refused as in Kubernetes."""
    return {_IP_KEY: str(_parse_ip(text))}


def is_ip(text: str) -> bool:
    """``isIP(string) -> bool``."""
    try:
        _parse_ip(text)
    except ValueError:
        return False
    return True


def ip_is_canonical(text: str) -> bool:
    """``ip.isCanonical(string) -> bool``: the string is the RFC 5952 form of its address."""
    return str(_parse_ip(text)) == text


def ip_family(value: object) -> int:
    """``<IP>.family() -> int``: 4 or 6."""
    return _ip_of(value).version


def ip_is_unspecified(value: object) -> bool:
    """``<IP>.isUnspecified() -> bool``."""
    return _ip_of(value).is_unspecified


def ip_is_loopback(value: object) -> bool:
    """``<IP>.isLoopback() -> bool``."""
    return _ip_of(value).is_loopback


def ip_is_link_local_multicast(value: object) -> bool:
    """``<IP>.isLinkLocalMulticast() -> bool`` (224.0.0.0/24, ff02::/16 scope)."""
    address = _ip_of(value)
    if address.version == 4:
        return address in ipaddress.ip_network("224.0.0.0/24")
    return (int(address) >> 112) & 0xFF0F == 0xFF02


def ip_is_link_local_unicast(value: object) -> bool:
    """``<IP>.isLinkLocalUnicast() -> bool`` (169.254.0.0/16, fe80::/10)."""
    address = _ip_of(value)
    return address.is_link_local and not address.is_multicast


def ip_is_global_unicast(value: object) -> bool:
    """``<IP>.isGlobalUnicast() -> bool`` with Go's meaning (private ranges count as global)."""
    address = _ip_of(value)
    if address.version == 4 and int(address) in (0, 0xFFFFFFFF):
        return False
    return not (
        address.is_unspecified
        or address.is_loopback
        or address.is_multicast
        or ip_is_link_local_unicast(value)
    )


def cidr(text: str) -> dict[str, str]:
    """``cidr(string) -> CIDR``; host bits may be set (see ``masked()``)."""
    address, bits = _parse_cidr(text)
    return {_CIDR_KEY: f"{address}/{bits}"}


def is_cidr(text: str) -> bool:
    """``isCIDR(string) -> bool``."""
    try:
        _parse_cidr(text)
    except ValueError:
        return False
    return True


def _network(value: object) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    address, bits = _cidr_of(value)
    return ipaddress.ip_network(f"{address}/{bits}", strict=False)


def cidr_contains_ip(value: object, other: object) -> bool:
    """``<CIDR>.containsIP(IP|string) -> bool`` (false across address families)."""
    network, address = _network(value), _ip_of(other)
    return network.version == address.version and address in network


def cidr_contains_cidr(value: object, other: object) -> bool:
    """``<CIDR>.containsCIDR(CIDR|string) -> bool``: the other prefix lies inside this one."""
    network, inner = _network(value), _network(other)
    return network.version == inner.version and inner.subnet_of(network)  # type: ignore[arg-type]


def cidr_ip(value: object) -> dict[str, str]:
    """``<CIDR>.ip() -> IP``: the address part, host bits included."""
    return {_IP_KEY: str(_cidr_of(value)[0])}


def cidr_masked(value: object) -> dict[str, str]:
    """``<CIDR>.masked() -> CIDR`` with the host bits cleared."""
    network = _network(value)
    return {_CIDR_KEY: f"{network.network_address}/{network.prefixlen}"}


def cidr_prefix_length(value: object) -> int:
    """``<CIDR>.prefixLength() -> int``."""
    return _cidr_of(value)[1]


# --- URL -----------------------------------------------------------------------------------------

_URL_KEY: Final = "__url__"


def _parse_url(text: str) -> SplitResult:
    if not isinstance(text, str) or any((c.isspace() and c != " ") or ord(c) < 0x20 for c in text):
        raise ValueError(f"URL {text!r} contains control characters")
    parts = urlsplit(text, allow_fragments=False)
    if not (parts.scheme or text.startswith("/")) or (parts.scheme and " " in parts.netloc):
        raise ValueError(
            f"URL parse error during conversion from string: {text!r} is not an "
            "absolute URI or absolute path"
        )
    return parts


def _url_parts(value: object) -> SplitResult:
    if not (isinstance(value, Mapping) and set(value) == {_URL_KEY}):
        raise TypeError("no such overload: expected a URL")
    return _parse_url(value[_URL_KEY])


def url(text: str) -> dict[str, str]:
    """``url(string) -> URL``: an absolute URI or an absolute path, as Go's ParseRequestURI."""
    _parse_url(text)
    return {_URL_KEY: text}


def is_url(text: str) -> bool:
    """``isURL(string) -> bool``."""
    try:
        _parse_url(text)
    except ValueError:
        return False
    return True


def _url_host(value: object) -> str:
    return _url_parts(value).netloc.rpartition("@")[2]


def url_scheme(value: object) -> str:
    """``<URL>.getScheme() -> string``."""
    return _url_parts(value).scheme


def url_host(value: object) -> str:
    """``<URL>.getHost() -> string``: host and port, IPv6 in brackets."""
    return _url_host(value)


def url_hostname(value: object) -> str:
    """``<URL>.getHostname() -> string``: host without port or IPv6 brackets."""
    host = _url_host(value)
    if host.startswith("["):
        return host[1 : host.find("]")]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


def url_port(value: object) -> str:
    """``<URL>.getPort() -> string`` (``''`` when absent)."""
    host = _url_host(value)
    head, colon, port = host.rpartition(":")
    return (
        port
        if colon and port.isdigit() and (not host.startswith("[") or head.endswith("]"))
        else ""
    )


def url_escaped_path(value: object) -> str:
    """``<URL>.getEscapedPath() -> string``: the path with unsafe characters percent-encoded."""
    return quote(_url_parts(value).path, safe="/!$&'()*+,;=:@%-._~")


def url_query(value: object) -> dict[str, list[str]]:
    """``<URL>.getQuery() -> map<string, list<string>>``."""
    return parse_qs(_url_parts(value).query, keep_blank_values=True)


# --- functions shared by several opaque types -----------------------------------------------------


def _opaque_key(value: object) -> str:
    if isinstance(value, Mapping) and len(value) == 1 and \
            isinstance(key := next(iter(value)), str):
        return key
    raise TypeError("no such overload")


def compare_to(a: object, b: object) -> int:
    """``compareTo`` for Quantity and Semver."""
    if _opaque_key(a) == _SEMVER_KEY:
        return _semver_compare(a, b)
    return q.compare_to(a, b)


def is_greater_than(a: object, b: object) -> bool:
    """``isGreaterThan`` for Quantity and Semver."""
    return compare_to(a, b) > 0


def is_less_than(a: object, b: object) -> bool:
    """``isLessThan`` for Quantity and Semver."""
    return compare_to(a, b) < 0


def opaque_string(value: object) -> str:
    """``string(IP)``, ``string(CIDR)``, ``string(URL)``."""
    key = _opaque_key(value)
    if key not in (_IP_KEY, _CIDR_KEY, _URL_KEY):
        raise TypeError("no such overload: string() of this value")
    assert isinstance(value, Mapping)
    return str(value[key])


def jsonpatch_escape_key(key: str) -> str:
    """``jsonpatch.escapeKey(string) -> string``: RFC 6901 (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


# --- declarations ---------------------------------------------------------------------------------


def _f(
    name: str, *overloads: tuple[str, Sequence[str], str, bool, Callable[..., Any]]
) -> FunctionSpec:
    return FunctionSpec(
        name, tuple(OverloadSpec(i, tuple(p), r, m, f) for i, p, r, m, f in overloads)
    )


LIBRARY: Final[tuple[FunctionSpec, ...]] = (
    # quantity
    _f("quantity", ("string_to_quantity", ["string"], "opaque", False, q.quantity)),
    _f("isQuantity", ("is_quantity_string", ["string"], "bool", False, q.is_quantity)),
    _f("compareTo", ("opaque_compare_to", ["opaque", "opaque"], "int", True, compare_to)),
    _f(
        "isGreaterThan",
        ("opaque_is_greater_than", ["opaque", "opaque"], "bool", True, is_greater_than),
    ),
    _f("isLessThan", ("opaque_is_less_than", ["opaque", "opaque"], "bool", True, is_less_than)),
    _f(
        "add",
        ("quantity_add", ["opaque", "opaque"], "opaque", True, q.add),
        ("quantity_add_int", ["opaque", "int"], "opaque", True, q.add),
    ),
    _f(
        "sub",
        ("quantity_sub", ["opaque", "opaque"], "opaque", True, q.sub),
        ("quantity_sub_int", ["opaque", "int"], "opaque", True, q.sub),
    ),
    _f("mul", ("quantity_multiply_int", ["opaque", "int"], "opaque", True, q.mul)),
    _f(
        "sign",
        ("quantity_sign", ["opaque"], "int", False, q.sign),
        ("quantity_sign_member", ["opaque"], "int", True, q.sign),
    ),
    _f("isInteger", ("quantity_is_integer", ["opaque"], "bool", True, q.is_integer)),
    _f("asInteger", ("quantity_get_int", ["opaque"], "int", True, q.as_integer)),
    _f(
        "asApproximateFloat",
        ("quantity_get_float", ["opaque"], "double", True, q.as_approximate_float),
    ),
    # lists
    _f("isSorted", ("list_is_sorted", ["list"], "bool", True, list_is_sorted)),
    _f("sum", ("list_sum", ["list"], "dyn", True, list_sum)),
    _f("min", ("list_min", ["list"], "dyn", True, list_min)),
    _f("max", ("list_max", ["list"], "dyn", True, list_max)),
    _f("indexOf", ("list_index_of", ["list", "dyn"], "int", True, list_index_of)),
    _f("lastIndexOf", ("list_last_index_of", ["list", "dyn"], "int", True, list_last_index_of)),
    # sets
    _f(
        "sets.contains", ("list_sets_contains_list", ["list", "list"], "bool", False, sets_contains)
    ),
    _f(
        "sets.equivalent",
        ("list_sets_equivalent_list", ["list", "list"], "bool", False, sets_equivalent),
    ),
    _f(
        "sets.intersects",
        ("list_sets_intersects_list", ["list", "list"], "bool", False, sets_intersects),
    ),
    # regex
    _f("find", ("string_find_string", ["string", "string"], "string", True, regex_find)),
    _f(
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
    # semver
    _f(
        "semver",
        ("string_to_semver", ["string"], "opaque", False, semver),
        ("string_bool_to_semver", ["string", "bool"], "opaque", False, semver),
    ),
    _f(
        "isSemver",
        ("is_semver_string", ["string"], "bool", False, is_semver),
        ("is_semver_string_bool", ["string", "bool"], "bool", False, is_semver),
    ),
    _f("major", ("semver_major", ["opaque"], "int", True, semver_major)),
    _f("minor", ("semver_minor", ["opaque"], "int", True, semver_minor)),
    _f("patch", ("semver_patch", ["opaque"], "int", True, semver_patch)),
    # IP / CIDR
    _f(
        "ip",
        ("string_to_ip", ["string"], "opaque", False, ip),
        ("cidr_ip", ["opaque"], "opaque", True, cidr_ip),
    ),
    _f("isIP", ("is_ip", ["string"], "bool", False, is_ip)),
    _f("ip.isCanonical", ("ip_is_canonical", ["string"], "bool", False, ip_is_canonical)),
    _f("family", ("ip_family", ["opaque"], "int", True, ip_family)),
    _f("isUnspecified", ("ip_is_unspecified", ["opaque"], "bool", True, ip_is_unspecified)),
    _f("isLoopback", ("ip_is_loopback", ["opaque"], "bool", True, ip_is_loopback)),
    _f(
        "isLinkLocalMulticast",
        ("ip_is_link_local_multicast", ["opaque"], "bool", True, ip_is_link_local_multicast),
    ),
    _f(
        "isLinkLocalUnicast",
        ("ip_is_link_local_unicast", ["opaque"], "bool", True, ip_is_link_local_unicast),
    ),
    _f("isGlobalUnicast", ("ip_is_global_unicast", ["opaque"], "bool", True, ip_is_global_unicast)),
    _f("cidr", ("string_to_cidr", ["string"], "opaque", False, cidr)),
    _f("isCIDR", ("is_cidr", ["string"], "bool", False, is_cidr)),
    _f(
        "containsIP",
        ("cidr_contains_ip_ip", ["opaque", "opaque"], "bool", True, cidr_contains_ip),
        ("cidr_contains_ip_string", ["opaque", "string"], "bool", True, cidr_contains_ip),
    ),
    _f(
        "containsCIDR",
        ("cidr_contains_cidr_cidr", ["opaque", "opaque"], "bool", True, cidr_contains_cidr),
        ("cidr_contains_cidr_string", ["opaque", "string"], "bool", True, cidr_contains_cidr),
    ),
    _f("masked", ("cidr_masked", ["opaque"], "opaque", True, cidr_masked)),
    _f("prefixLength", ("cidr_prefix_length", ["opaque"], "int", True, cidr_prefix_length)),
    _f("string", ("opaque_to_string", ["opaque"], "string", False, opaque_string)),
    # URL
    _f("url", ("string_to_url", ["string"], "opaque", False, url)),
    _f("isURL", ("is_url_string", ["string"], "bool", False, is_url)),
    _f("getScheme", ("url_get_scheme", ["opaque"], "string", True, url_scheme)),
    _f("getHost", ("url_get_host", ["opaque"], "string", True, url_host)),
    _f("getHostname", ("url_get_hostname", ["opaque"], "string", True, url_hostname)),
    _f("getPort", ("url_get_port", ["opaque"], "string", True, url_port)),
    _f("getEscapedPath", ("url_get_escaped_path", ["opaque"], "string", True, url_escaped_path)),
    _f("getQuery", ("url_get_query", ["opaque"], "map", True, url_query)),
    # JSONPatch helpers (MutatingAdmissionPolicy)
    _f(
        "jsonpatch.escapeKey",
        ("string_jsonpatch_escape_key", ["string"], "string", False, jsonpatch_escape_key),
    ),
)
