"""The Kubernetes CEL IP library (``k8s.io/apiserver/pkg/cel/library/ip.go``).

Owns the IP value (the one-key map ``{"__ip__": "<address>"}``: the runtime cannot hold Python
objects), the IP parsing rules Kubernetes applies (no zones, no IPv4-mapped IPv6) and ``ip``,
``isIP``, ``ip.isCanonical``, ``family``, ``isUnspecified``, ``isLoopback``,
``isLinkLocalMulticast``, ``isLinkLocalUnicast``, ``isGlobalUnicast``. ``string(IP)`` is shared
with CIDR and URL in :mod:`~policies.cel.library.opaque`. Must not import the CEL runtime (only
``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final

from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.netip import IPAddress, NetipError, parse_addr, quote

IP_KEY: Final = "__ip__"


def parse_ip(text: str) -> IPAddress:
    """An IP address as Kubernetes' ``ip()`` accepts it (``parseIPAddr`` in ``ip.go``).

    Raises:
        ValueError: not an address (Kubernetes' text with Go's ``netip`` reason), an address with
            a zone, or an IPv4-mapped IPv6 address.
    """
    if "%" in text:
        raise ValueError(f"IP address {quote(text)} with zone value is not allowed")
    try:
        address = parse_addr(text)
    except NetipError as exc:
        raise ValueError(
            f"IP Address {quote(text)} parse error during conversion from string: {exc}"
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address {quote(text)} is not allowed")
    return address


def ip_of(value: object) -> IPAddress:
    """The address of an IP map or of a string (parsed with :func:`parse_ip`).

    Raises:
        TypeError: neither ("no such overload"). ValueError: a string that is no address.
    """
    if isinstance(value, str):
        return parse_ip(value)
    if isinstance(value, Mapping) and set(value) == {IP_KEY}:
        return ipaddress.ip_address(value[IP_KEY])
    raise TypeError("no such overload: expected an IP address")


def ip(text: str) -> dict[str, str]:
    """``ip(string) -> IP``; zones and IPv4-mapped IPv6 addresses are refused as in Kubernetes."""
    return {IP_KEY: str(parse_ip(text))}


def is_ip(text: str) -> bool:
    """``isIP(string) -> bool``."""
    try:
        parse_ip(text)
    except ValueError:
        return False
    return True


def ip_is_canonical(text: str) -> bool:
    """``ip.isCanonical(string) -> bool``: the string is the RFC 5952 form of its address."""
    return str(parse_ip(text)) == text


def ip_family(value: object) -> int:
    """``<IP>.family() -> int``: 4 or 6."""
    return ip_of(value).version


def ip_is_unspecified(value: object) -> bool:
    """``<IP>.isUnspecified() -> bool``."""
    return ip_of(value).is_unspecified


def ip_is_loopback(value: object) -> bool:
    """``<IP>.isLoopback() -> bool``."""
    return ip_of(value).is_loopback


def ip_is_link_local_multicast(value: object) -> bool:
    """``<IP>.isLinkLocalMulticast() -> bool`` (224.0.0.0/24, ff02::/16 scope)."""
    address = ip_of(value)
    if address.version == 4:
        return address in ipaddress.ip_network("224.0.0.0/24")
    return (int(address) >> 112) & 0xFF0F == 0xFF02


def ip_is_link_local_unicast(value: object) -> bool:
    """``<IP>.isLinkLocalUnicast() -> bool`` (169.254.0.0/16, fe80::/10)."""
    address = ip_of(value)
    return address.is_link_local and not address.is_multicast


def ip_is_global_unicast(value: object) -> bool:
    """``<IP>.isGlobalUnicast() -> bool`` with Go's meaning (private ranges count as global)."""
    address = ip_of(value)
    if address.version == 4 and int(address) in (0, 0xFFFFFFFF):
        return False
    return not (
        address.is_unspecified
        or address.is_loopback
        or address.is_multicast
        or ip_is_link_local_unicast(value)
    )


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("ip", ("string_to_ip", ["string"], "opaque", False, ip)),
    function("isIP", ("is_ip", ["string"], "bool", False, is_ip)),
    function("ip.isCanonical", ("ip_is_canonical", ["string"], "bool", False, ip_is_canonical)),
    function("family", ("ip_family", ["opaque"], "int", True, ip_family)),
    function("isUnspecified", ("ip_is_unspecified", ["opaque"], "bool", True, ip_is_unspecified)),
    function("isLoopback", ("ip_is_loopback", ["opaque"], "bool", True, ip_is_loopback)),
    function(
        "isLinkLocalMulticast",
        ("ip_is_link_local_multicast", ["opaque"], "bool", True, ip_is_link_local_multicast),
    ),
    function(
        "isLinkLocalUnicast",
        ("ip_is_link_local_unicast", ["opaque"], "bool", True, ip_is_link_local_unicast),
    ),
    function(
        "isGlobalUnicast",
        ("ip_is_global_unicast", ["opaque"], "bool", True, ip_is_global_unicast),
    ),
)
"""The IP library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
