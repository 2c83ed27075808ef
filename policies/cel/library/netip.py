"""Go's ``net/netip`` address and prefix parsing (``ParseAddr``, ``ParsePrefix``), error texts
included, for the Kubernetes IP and CIDR libraries.

Kubernetes' ``ip()`` and ``cidr()`` parse with ``net/netip`` and quote its error in theirs
(``IP Address "1.2.3.4.5" parse error during conversion from string: ParseAddr("1.2.3.4.5"): IPv4
address too long``); Python's :mod:`ipaddress` accepts the same addresses but says why not in
other words, so the syntax is checked here, step by step as ``netip`` does (Go 1.22+), and
:mod:`ipaddress` builds the value. Must not import the CEL runtime and must not do I/O.
"""

from __future__ import annotations

import ipaddress
import json

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class NetipError(ValueError):
    """What ``netip`` would return as an error; ``str()`` is Go's ``err.Error()``."""


def quote(text: str) -> str:
    """Go's ``strconv.Quote`` for the printable text addresses are made of."""
    return json.dumps(text, ensure_ascii=False)


def _addr_error(text: str, message: str, at: str | None = None) -> NetipError:
    suffix = f" (at {quote(at)})" if at is not None else ""
    return NetipError(f"ParseAddr({quote(text)}): {message}{suffix}")


def _check_ipv4(text: str, part: str) -> None:
    value, fields, digits = 0, 0, 0
    for i, char in enumerate(part):
        if "0" <= char <= "9":
            if digits == 1 and value == 0:
                raise _addr_error(text, "IPv4 field has octet with leading zero")
            value, digits = value * 10 + int(char), digits + 1
            if value > 255:
                raise _addr_error(text, "IPv4 field has value >255")
        elif char == ".":
            if i == 0 or i == len(part) - 1 or part[i - 1] == ".":
                raise _addr_error(text, "IPv4 field must have at least one digit", part[i:])
            if fields == 3:
                raise _addr_error(text, "IPv4 address too long")
            fields, value, digits = fields + 1, 0, 0
        else:
            raise _addr_error(text, "unexpected character", part[i:])
    if fields < 3:
        raise _addr_error(text, "IPv4 address too short")


def _check_ipv6(text: str) -> None:
    rest, percent, zone = text.partition("%")
    if percent and not zone:
        raise _addr_error(text, "zone must be a non-empty string")
    filled, ellipsis = 0, -1
    if rest.startswith("::"):
        ellipsis, rest = 0, rest[2:]
        if not rest:
            return
    while filled < 16:
        digits = 0
        while digits < len(rest) and rest[digits] in "0123456789abcdefABCDEF":
            if digits > 3:
                raise _addr_error(text, "each group must have 4 or less digits", rest)
            digits += 1
        if digits == 0:
            raise _addr_error(text, "each colon-separated field must have at least one digit",
                              rest)
        if digits < len(rest) and rest[digits] == ".":
            if ellipsis < 0 and filled != 12:
                raise _addr_error(text, "embedded IPv4 address must replace the final 2 fields "
                                  "of the address", rest)
            if filled + 4 > 16:
                raise _addr_error(text, "too many hex fields to fit an embedded IPv4 at the end "
                                  "of the address", rest)
            _check_ipv4(text, rest)
            rest, filled = "", filled + 4
            break
        filled += 2
        rest = rest[digits:]
        if not rest:
            break
        if rest[0] != ":":
            raise _addr_error(text, "unexpected character, want colon", rest)
        if len(rest) == 1:
            raise _addr_error(text, "colon must be followed by more characters", rest)
        rest = rest[1:]
        if rest[0] == ":":
            if ellipsis >= 0:
                raise _addr_error(text, "multiple :: in address", rest)
            ellipsis, rest = filled, rest[1:]
            if not rest:
                break
    if rest:
        raise _addr_error(text, "trailing garbage after address", rest)
    if filled < 16 and ellipsis < 0:
        raise _addr_error(text, "address string too short")
    if filled == 16 and ellipsis >= 0:
        raise _addr_error(text, "the :: must expand to at least one field of zeros")


def parse_addr(text: str) -> IPAddress:
    """``netip.ParseAddr`` without zones (Kubernetes refuses them before parsing).

    Raises:
        NetipError: Go's error for ``text``.
    """
    for char in text:
        if char == ".":
            _check_ipv4(text, text)
            return ipaddress.IPv4Address(text)
        if char == ":":
            _check_ipv6(text)
            return ipaddress.IPv6Address(text.partition("%")[0])
        if char == "%":
            raise _addr_error(text, "missing IPv6 address")
    raise _addr_error(text, "unable to parse IP")


def parse_prefix(text: str) -> tuple[IPAddress, int]:
    """``netip.ParsePrefix``: the address (host bits kept) and the prefix length.

    Raises:
        NetipError: Go's error, ``netip.ParsePrefix("<text>"): <reason>``.
    """
    def error(message: str) -> NetipError:
        return NetipError(f"netip.ParsePrefix({quote(text)}): {message}")

    slash = text.rfind("/")
    if slash < 0:
        raise error("no '/'")
    address_text, bits_text = text[:slash], text[slash + 1:]
    try:
        address = parse_addr(address_text)
    except NetipError as exc:
        raise error(str(exc)) from None
    if "%" in address_text:
        raise error("IPv6 zones cannot be present in a prefix")
    # strconv.Atoi after netip's own check: digits only, no sign, no leading zero.
    if not (bits_text.isascii() and bits_text.isdigit()) or (len(bits_text) > 1
                                                             and bits_text[0] == "0"):
        raise error(f"bad bits after slash: {quote(bits_text)}")
    bits = int(bits_text)
    if not 0 <= bits <= address.max_prefixlen:
        raise error("prefix length out of range")
    return address, bits
