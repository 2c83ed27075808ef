"""The Kubernetes CEL CIDR library (``k8s.io/apiserver/pkg/cel/library/cidr.go``).

Owns the CIDR value (the one-key map ``{"__cidr__": "<address>/<bits>"}``) and ``cidr``,
``isCIDR``, ``containsIP``, ``containsCIDR``, ``<CIDR>.ip()``, ``masked``, ``prefixLength``;
addresses are parsed by :mod:`~policies.cel.library.ip`'s rules. ``string(CIDR)`` is shared in
:mod:`~policies.cel.library.opaque`. Must not import the CEL runtime (only
``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final

from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.ip import IP_KEY, ip_of
from policies.cel.library.netip import IPAddress, NetipError, parse_prefix, quote

CIDR_KEY: Final = "__cidr__"
_PARSE_ERROR: Final = "network address parse error during conversion from string"


def _parse_cidr(text: str) -> tuple[IPAddress, int]:
    """``parseCIDR`` of ``cidr.go``: Go's ``netip.ParsePrefix``, IPv4-mapped IPv6 refused.

    Raises:
        ValueError: with Kubernetes' text (``network address parse error during conversion from
            string: netip.ParsePrefix(...): ...``).
    """
    try:
        address, bits = parse_prefix(text)
    except NetipError as exc:
        raise ValueError(f"{_PARSE_ERROR}: {exc}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address {quote(text)} is not allowed")
    return address, bits


def _cidr_of(value: object) -> tuple[IPAddress, int]:
    if isinstance(value, str):
        return _parse_cidr(value)
    if isinstance(value, Mapping) and set(value) == {CIDR_KEY}:
        return _parse_cidr(value[CIDR_KEY])
    raise TypeError("no such overload: expected a CIDR")


def cidr(text: str) -> dict[str, str]:
    """``cidr(string) -> CIDR``; host bits may be set (see ``masked()``)."""
    try:
        address, bits = _parse_cidr(text)
    except ValueError as exc:  # stringToCIDR wraps parseCIDR's error once more
        raise ValueError(f"{_PARSE_ERROR}: {exc}") from None
    return {CIDR_KEY: f"{address}/{bits}"}


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
    network, address = _network(value), ip_of(other)
    return network.version == address.version and address in network


def cidr_contains_cidr(value: object, other: object) -> bool:
    """``<CIDR>.containsCIDR(CIDR|string) -> bool``: the other prefix lies inside this one."""
    network, inner = _network(value), _network(other)
    return network.version == inner.version and inner.subnet_of(network)  # type: ignore[arg-type]


def cidr_ip(value: object) -> dict[str, str]:
    """``<CIDR>.ip() -> IP``: the address part, host bits included."""
    return {IP_KEY: str(_cidr_of(value)[0])}


def cidr_masked(value: object) -> dict[str, str]:
    """``<CIDR>.masked() -> CIDR`` with the host bits cleared."""
    network = _network(value)
    return {CIDR_KEY: f"{network.network_address}/{network.prefixlen}"}


def cidr_prefix_length(value: object) -> int:
    """``<CIDR>.prefixLength() -> int``."""
    return _cidr_of(value)[1]


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("ip", ("cidr_ip", ["opaque"], "opaque", True, cidr_ip)),
    function("cidr", ("string_to_cidr", ["string"], "opaque", False, cidr)),
    function("isCIDR", ("is_cidr", ["string"], "bool", False, is_cidr)),
    function(
        "containsIP",
        ("cidr_contains_ip_ip", ["opaque", "opaque"], "bool", True, cidr_contains_ip),
        ("cidr_contains_ip_string", ["opaque", "string"], "bool", True, cidr_contains_ip),
    ),
    function(
        "containsCIDR",
        ("cidr_contains_cidr_cidr", ["opaque", "opaque"], "bool", True, cidr_contains_cidr),
        ("cidr_contains_cidr_string", ["opaque", "string"], "bool", True, cidr_contains_cidr),
    ),
    function("masked", ("cidr_masked", ["opaque"], "opaque", True, cidr_masked)),
    function("prefixLength", ("cidr_prefix_length", ["opaque"], "int", True, cidr_prefix_length)),
)
"""The CIDR library's functions (``ip`` adds the member overload ``<CIDR>.ip()`` to
:mod:`~policies.cel.library.ip`'s), as :mod:`~policies.cel.library.libraries` collects them."""
