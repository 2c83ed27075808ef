"""The Kubernetes CEL URL library (``k8s.io/apiserver/pkg/cel/library/urls.go``).

Owns the URL value (the one-key map ``{"__url__": "<url>"}``), parsing as Go's
``url.ParseRequestURI`` (an absolute URI or an absolute path; components then as ``url.Parse``
reads them, as ``urls.go`` does) and ``url``, ``isURL``,
``getScheme``, ``getHost``, ``getHostname``, ``getPort``, ``getEscapedPath``, ``getQuery``.
``string(URL)`` is shared in :mod:`~policies.cel.library.opaque`. Must not import the CEL runtime
(only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from urllib.parse import SplitResult, parse_qs, quote, urlsplit

from policies.cel.library.declarations import FunctionSpec, function

URL_KEY: Final = "__url__"


def _parse_url(text: str) -> SplitResult:
    if not isinstance(text, str) or any((c.isspace() and c != " ") or ord(c) < 0x20 for c in text):
        raise ValueError(f"URL {text!r} contains control characters")
    parts = urlsplit(text, allow_fragments=False)
    if not (parts.scheme or text.startswith("/")) or (parts.scheme and " " in parts.netloc):
        raise ValueError(
            f"URL parse error during conversion from string: {text!r} is not an "
            "absolute URI or absolute path"
        )
    host = parts.netloc.rpartition("@")[2]
    # Go's parseHost: after the host (an IPv6 literal in brackets, or up to the last ':') comes
    # nothing or ':' and digits (validOptionalPort), so 'a:b:c' is no host.
    port = host[host.find("]") + 1:] if host.startswith("[") else host[host.rfind(":"):] \
        if ":" in host else ""
    if port and not ((port[0] == ":" and port[1:].isdigit()) or port == ":"):
        raise ValueError(
            f"URL parse error during conversion from string: invalid port {port!r} after host"
        )
    return parts


def _url_parts(value: object) -> SplitResult:
    """The components as Kubernetes reads them after validating: Go's ``url.Parse``, which
    drops the ``#fragment`` first and keeps a scheme's non-``/`` rest as an opaque part (no
    path)."""
    if not (isinstance(value, Mapping) and set(value) == {URL_KEY}):
        raise TypeError("no such overload: expected a URL")
    text = value[URL_KEY]
    _parse_url(text)
    parts = urlsplit(text)
    if parts.scheme and not parts.netloc and not parts.path.startswith("/"):
        return parts._replace(path="")
    return parts


def url(text: str) -> dict[str, str]:
    """``url(string) -> URL``: an absolute URI or an absolute path, as Go's ParseRequestURI."""
    _parse_url(text)
    return {URL_KEY: text}


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


def _split_host_port(host: str) -> tuple[str, str]:
    """Go ``net/url``'s ``splitHostPort``: a trailing ``:digits`` (or a bare ``:``) is the port;
    brackets around what is left are removed."""
    colon = host.rfind(":")
    port = ""
    if colon != -1 and all("0" <= ch <= "9" for ch in host[colon + 1:]):
        host, port = host[:colon], host[colon + 1:]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def url_hostname(value: object) -> str:
    """``<URL>.getHostname() -> string``: host without port or IPv6 brackets (Go
    ``URL.Hostname``: ``http://a:/`` gives ``a``)."""
    return _split_host_port(_url_host(value))[0]


def url_port(value: object) -> str:
    """``<URL>.getPort() -> string`` (``''`` when absent; Go ``URL.Port``)."""
    return _split_host_port(_url_host(value))[1]


def url_escaped_path(value: object) -> str:
    """``<URL>.getEscapedPath() -> string``: the path with unsafe characters percent-encoded."""
    return quote(_url_parts(value).path, safe="/!$&'()*+,;=:@%-._~")


def url_query(value: object) -> dict[str, list[str]]:
    """``<URL>.getQuery() -> map<string, list<string>>``."""
    return parse_qs(_url_parts(value).query, keep_blank_values=True)


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("url", ("string_to_url", ["string"], "opaque", False, url)),
    function("isURL", ("is_url_string", ["string"], "bool", False, is_url)),
    function("getScheme", ("url_get_scheme", ["opaque"], "string", True, url_scheme)),
    function("getHost", ("url_get_host", ["opaque"], "string", True, url_host)),
    function("getHostname", ("url_get_hostname", ["opaque"], "string", True, url_hostname)),
    function("getPort", ("url_get_port", ["opaque"], "string", True, url_port)),
    function(
        "getEscapedPath", ("url_get_escaped_path", ["opaque"], "string", True, url_escaped_path)
    ),
    function("getQuery", ("url_get_query", ["opaque"], "map", True, url_query)),
)
"""The URL library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
