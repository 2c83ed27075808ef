"""Hypothesis strategies for CEL expressions over the Kubernetes libraries and random objects.

Owns generating differential inputs: protocol requests (``{"expression", "vars"}``, see
:mod:`tests.controlplane.celoracle`) that call the functions of every library the Kubernetes CEL
environment has (strings, lists, sets, regex, quantity, IP/CIDR, URL, semver, format, optionals,
two-variable comprehensions, authorizer) and some it lacks (math, base64, ``cel.bind``), on
literal arguments drawn near the edges (out-of-range indexes, int64 limits, malformed
quantities, IPv4-mapped addresses, URLs with ports and fragments) and on random JSON objects
bound to ``object``. Must not know what either side answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def lit(text: str) -> str:
    """A CEL double-quoted string literal for ``text`` (control characters as \\u escapes)."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def cel_value(value: Any) -> str:
    """A CEL literal for a JSON value (ints as int, floats as double)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value > INT64_MIN else f"({INT64_MIN + 1} - 1)"
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return lit(value)
    if isinstance(value, list):
        return "[" + ", ".join(cel_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{lit(k)}: {cel_value(v)}" for k, v in value.items()) + "}"


small_ints = st.integers(-3, 12)
edge_ints = st.sampled_from([0, 1, -1, 2, 63, 64, INT64_MAX, INT64_MIN + 1, 2**31, -(2**31)])
ints = st.one_of(small_ints, edge_ints, st.integers(INT64_MIN + 1, INT64_MAX))
doubles = st.one_of(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, -2.25, 1e300, 3.0e-5]),
                    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
short_text = st.text(alphabet="abcAB -_./:%é日0123\t", max_size=8)
words = st.sampled_from(["", "a", "ab", "abc", "b", "-", " ", "é", "日本", "a b", "%s", "AbC"])
texts = st.one_of(words, short_text)

keys = st.sampled_from(["a", "b", "name", "spec", "x-y", "n", "items", "in", "1"])
json_scalars = st.one_of(st.none(), st.booleans(), small_ints, edge_ints, doubles, words)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12)
json_objects = st.dictionaries(keys, json_values, max_size=5)

Request = dict[str, Any]


def expression(template: str, **parts: st.SearchStrategy[str]) -> st.SearchStrategy[Request]:
    """``template`` with ``{name}`` replaced by what ``parts[name]`` draws."""
    return st.fixed_dictionaries(parts).map(
        lambda drawn: {"expression": template.format(**drawn)})


def as_cel(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    """A literal drawn from ``strategy`` (a JSON value) as CEL source."""
    return strategy.map(cel_value)


STR, INT, DBL = as_cel(texts), as_cel(ints), as_cel(doubles)
SMALL = as_cel(small_ints)
int_lists = as_cel(st.lists(st.one_of(small_ints, edge_ints), max_size=5))
double_lists = as_cel(st.lists(doubles, max_size=4))
text_lists = as_cel(st.lists(words, max_size=4))
mixed_lists = st.one_of(int_lists, double_lists, text_lists)


def templates(*items: tuple[str, dict[str, st.SearchStrategy[str]]]
              ) -> list[st.SearchStrategy[Request]]:
    return [expression(t, **parts) for t, parts in items]


STRINGS = templates(
    ("{s}.charAt({i})", {"s": STR, "i": SMALL}),
    ("{s}.indexOf({t})", {"s": STR, "t": STR}),
    ("{s}.indexOf({t}, {i})", {"s": STR, "t": STR, "i": SMALL}),
    ("{s}.lastIndexOf({t})", {"s": STR, "t": STR}),
    ("{s}.lastIndexOf({t}, {i})", {"s": STR, "t": STR, "i": SMALL}),
    ("{s}.lowerAscii()", {"s": STR}),
    ("{s}.upperAscii()", {"s": STR}),
    ("{s}.replace({a}, {b})", {"s": STR, "a": STR, "b": STR}),
    ("{s}.replace({a}, {b}, {i})", {"s": STR, "a": STR, "b": STR, "i": SMALL}),
    ("{s}.split({t})", {"s": STR, "t": STR}),
    ("{s}.split({t}, {i})", {"s": STR, "t": STR, "i": SMALL}),
    ("{s}.substring({i})", {"s": STR, "i": SMALL}),
    ("{s}.substring({i}, {j})", {"s": STR, "i": SMALL, "j": SMALL}),
    ("{s}.trim()", {"s": STR}),
    ("{l}.join()", {"l": text_lists}),
    ("{l}.join({t})", {"l": text_lists, "t": STR}),
    ("strings.quote({s})", {"s": STR}),
    ("{s}.reverse()", {"s": STR}),
    ("size({s})", {"s": STR}),
    ("{s}.contains({t}) || {s}.startsWith({t}) || {s}.endsWith({t})", {"s": STR, "t": STR}),
    ("{f}.format([{a}])", {"f": st.sampled_from(['"%s"', '"%d"', '"%f"', '"%.2f"', '"%x"',
                                                 '"%X"', '"%o"', '"%b"', '"%e"', '"%5s"']),
                           "a": st.one_of(STR, INT, DBL, text_lists, st.just("null"),
                                          st.just("true"))}),
)

LISTS = templates(
    ("{l}.sum()", {"l": st.one_of(int_lists, double_lists)}),
    ("{l}.min()", {"l": mixed_lists}),
    ("{l}.max()", {"l": mixed_lists}),
    ("{l}.isSorted()", {"l": mixed_lists}),
    ("{l}.indexOf({x})", {"l": int_lists, "x": SMALL}),
    ("{l}.lastIndexOf({x})", {"l": text_lists, "x": STR}),
    ("{l}.slice({i}, {j})", {"l": int_lists, "i": SMALL, "j": SMALL}),
    ("{l}.reverse()", {"l": mixed_lists}),
    ("{l}.sort()", {"l": mixed_lists}),
    ("{l}.distinct()", {"l": mixed_lists}),
    ("[{l}, {m}].flatten()", {"l": int_lists, "m": int_lists}),
    ("lists.range({i})", {"i": SMALL}),
    ("{l}.sortBy(x, -x)", {"l": int_lists}),
    ("{l}.map(x, x * 2)", {"l": int_lists}),
    ("{l}.filter(x, x % 2 == 0)", {"l": int_lists}),
    ("{l}.exists_one(x, x > {i})", {"l": int_lists, "i": SMALL}),
    ("{l}[{i}]", {"l": mixed_lists, "i": SMALL}),
    ("{l} + {m}", {"l": int_lists, "m": int_lists}),
    ("sets.contains({l}, {m})", {"l": int_lists, "m": int_lists}),
    ("sets.equivalent({l}, {m})", {"l": text_lists, "m": text_lists}),
    ("sets.intersects({l}, {m})", {"l": int_lists, "m": int_lists}),
)

REGEXES = st.sampled_from(['"a+"', '"[a-c]"', '"^a"', '"(a)(b)?"', '"\\\\d+"', '""', '"."',
                           '"x*"', '"(?i)AB"', '"["', '"(a"', '"\\\\p{L}"', '"a{2,}"'])
REGEX = templates(
    ("{s}.find({r})", {"s": STR, "r": REGEXES}),
    ("{s}.findAll({r})", {"s": STR, "r": REGEXES}),
    ("{s}.findAll({r}, {i})", {"s": STR, "r": REGEXES, "i": SMALL}),
    ("{s}.matches({r})", {"s": STR, "r": REGEXES}),
)

quantities = st.one_of(
    st.builds(lambda n, s: f"{n}{s}",
              st.sampled_from(["0", "1", "12", "1.5", "-3", "0.1", "+2", "1e3", "999999999999"]),
              st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T",
                               "P", "E", "n", "u", "e3", "E2", "Mo", " "])),
    st.sampled_from(["", "abc", "1.2.3", "--1", "9223372036854775807", "1Gi1"]))
Q = quantities.map(lit)
QUANTITY = templates(
    ("isQuantity({q})", {"q": Q}),
    ("quantity({q}).isInteger()", {"q": Q}),
    ("quantity({q}).asInteger()", {"q": Q}),
    ("quantity({q}).asApproximateFloat()", {"q": Q}),
    ("quantity({q}).sign()", {"q": Q}),
    ("quantity({q}).add(quantity({r})) == quantity({p})", {"q": Q, "r": Q, "p": Q}),
    ("quantity({q}).add({i}).asInteger()", {"q": Q, "i": SMALL}),
    ("quantity({q}).sub(quantity({r})).asApproximateFloat()", {"q": Q, "r": Q}),
    ("quantity({q}).compareTo(quantity({r}))", {"q": Q, "r": Q}),
    ("quantity({q}).isGreaterThan(quantity({r}))", {"q": Q, "r": Q}),
    ("quantity({q}).isLessThan(quantity({r}))", {"q": Q, "r": Q}),
    ("quantity({q}) == quantity({r})", {"q": Q, "r": Q}),
)

ip_texts = st.one_of(
    st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *[st.sampled_from([0, 1, 10, 127, 169, 192,
                                                                        224, 254, 255, 256])] * 4),
    st.sampled_from(["::1", "::", "fe80::1", "fe80::1%eth0", "2001:db8::1", "::ffff:10.0.0.1",
                     "ff02::1", "010.0.0.1", "1.2.3", "", "abc", "2001:db8::/32", "::ffff:1.2.3.4"]))
cidr_texts = st.one_of(
    st.builds(lambda ip, n: f"{ip}/{n}", ip_texts, st.sampled_from([0, 8, 24, 32, 33, 64, 128])),
    st.sampled_from(["10.0.0.0/8", "192.168.0.0/16", "::/0", "2001:db8::/32", "10.0.0.1/24",
                     "/8", "10.0.0.0"]))
IP, CIDR = ip_texts.map(lit), cidr_texts.map(lit)
NETWORK = templates(
    ("isIP({a})", {"a": IP}),
    ("ip({a}).family()", {"a": IP}),
    ("ip({a}).isUnspecified()", {"a": IP}),
    ("ip({a}).isLoopback()", {"a": IP}),
    ("ip({a}).isLinkLocalMulticast()", {"a": IP}),
    ("ip({a}).isLinkLocalUnicast()", {"a": IP}),
    ("ip({a}).isGlobalUnicast()", {"a": IP}),
    ("string(ip({a}))", {"a": IP}),
    ("ip({a}) == ip({b})", {"a": IP, "b": IP}),
    ("isCIDR({c})", {"c": CIDR}),
    ("cidr({c}).containsIP(ip({a}))", {"c": CIDR, "a": IP}),
    ("cidr({c}).containsIP({a})", {"c": CIDR, "a": IP}),
    ("cidr({c}).containsCIDR({d})", {"c": CIDR, "d": CIDR}),
    ("cidr({c}).prefixLength()", {"c": CIDR}),
    ("string(cidr({c}).ip())", {"c": CIDR}),
    ("string(cidr({c}).masked())", {"c": CIDR}),
    ("string(cidr({c}))", {"c": CIDR}),
)

url_texts = st.builds(
    lambda scheme, host, port, path, query, frag: f"{scheme}{host}{port}{path}{query}{frag}",
    st.sampled_from(["https://", "http://", "", "ftp://", "HTTP://", "a:"]),
    st.sampled_from(["example.com", "[::1]", "127.0.0.1", "a:b@host", "", "ex%41mple.com",
                     "host:1:2"]),
    st.sampled_from(["", ":8080", ":", ":99999"]),
    st.sampled_from(["", "/", "/p", "/a%20b", "/a b", "/../x"]),
    st.sampled_from(["", "?a=1", "?a=1&a=2&b", "?k=%41", "?"]),
    st.sampled_from(["", "#frag", "#a?b=1"]))
U = url_texts.map(lit)
URLS = templates(
    ("isURL({u})", {"u": U}),
    ("url({u}).getScheme()", {"u": U}),
    ("url({u}).getHost()", {"u": U}),
    ("url({u}).getHostname()", {"u": U}),
    ("url({u}).getPort()", {"u": U}),
    ("url({u}).getEscapedPath()", {"u": U}),
    ("url({u}).getQuery()", {"u": U}),
)

semver_texts = st.one_of(
    st.builds(lambda a, b, c, pre: f"{a}.{b}.{c}{pre}", *[st.sampled_from(["0", "1", "10",
                                                                            "01"])] * 3,
              st.sampled_from(["", "-alpha", "-alpha.1", "+build", "-rc.1+b"])),
    st.sampled_from(["v1.2.3", "1.2", "1", "", "1.2.3.4", " 1.0.0", "1. 0.0"]))
V = semver_texts.map(lit)
SEMVER = templates(
    ("isSemver({v})", {"v": V}),
    ("isSemver({v}, true)", {"v": V}),
    ("semver({v}).major()", {"v": V}),
    ("semver({v}).minor()", {"v": V}),
    ("semver({v}, true).patch()", {"v": V}),
    ("semver({v}).compareTo(semver({w}))", {"v": V, "w": V}),
    ("semver({v}).isGreaterThan(semver({w}))", {"v": V, "w": V}),
)

FORMATS = st.sampled_from(["dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName",
                           "dns1123LabelPrefix", "uri", "uuid", "byte", "date", "datetime"])
FORMAT = templates(
    ("format.{f}().validate({s}).hasValue()", {"f": FORMATS, "s": STR}),
    ("format.named({n}).hasValue()", {"n": FORMATS.map(lit)}),
)

NUMBERS = templates(
    ("{a} + {b}", {"a": INT, "b": INT}),
    ("{a} - {b}", {"a": INT, "b": INT}),
    ("{a} * {b}", {"a": INT, "b": INT}),
    ("{a} / {b}", {"a": INT, "b": SMALL}),
    ("{a} % {b}", {"a": INT, "b": SMALL}),
    ("-({a})", {"a": INT}),
    ("{a} + {b}", {"a": DBL, "b": DBL}),
    ("{a} / {b}", {"a": DBL, "b": DBL}),
    ("{a} < {b}", {"a": INT, "b": DBL}),
    ("{a} == {b}", {"a": INT, "b": DBL}),
    ("int({d})", {"d": DBL}),
    ("uint({a})", {"a": INT}),
    ("double({a})", {"a": INT}),
    ("string({d})", {"d": DBL}),
    ("int({s})", {"s": st.one_of(STR, st.sampled_from(['"12"', '"-0"', '"9223372036854775808"',
                                                      '"0x10"', '" 1"']))}),
    ("double({s})", {"s": st.one_of(STR, st.sampled_from(['"1e3"', '"inf"', '"NaN"', '"1.5"']))}),
    ("type({a}) == type({b})", {"a": st.one_of(INT, DBL, STR), "b": st.one_of(INT, DBL, STR)}),
)

TIME = templates(
    ("timestamp({t}).getFullYear()", {"t": st.sampled_from(
        ['"2024-02-29T12:00:00Z"', '"2024-02-29T12:00:00+05:30"', '"1970-01-01T00:00:00Z"',
         '"2024-13-01T00:00:00Z"', '"0001-01-01T00:00:00Z"'])}),
    ("duration({d}) + duration({e})", {"d": st.sampled_from(['"1h"', '"1.5s"', '"-3m"', '"0"',
                                                             '"1d"', '"100ns"']),
                                       "e": st.sampled_from(['"1m"', '"2h45m"', '"1us"'])}),
    ("string(timestamp({t}) + duration({d}))", {
        "t": st.sampled_from(['"2024-02-29T12:00:00Z"', '"2030-01-01T00:00:00.5Z"']),
        "d": st.sampled_from(['"24h"', '"-1s"', '"1ns"'])}),
    ("[duration({d}), duration({e})].max()", {"d": st.sampled_from(['"1h"', '"1s"']),
                                              "e": st.sampled_from(['"1m"', '"2h"'])}),
)

OPTIONALS = templates(
    ("optional.of({a}).hasValue()", {"a": st.one_of(INT, STR)}),
    ("optional.ofNonZeroValue({a}).hasValue()", {"a": st.one_of(INT, STR, DBL, int_lists,
                                                                st.just("{}"))}),
    ("optional.none().orValue({a})", {"a": INT}),
    ("[?optional.none(), ?optional.of({a})]", {"a": INT}),
    ("{{?{k}: optional.of({a}), ?{j}: optional.none()}}", {"k": STR, "j": STR, "a": INT}),
)

COMPREHENSIONS = templates(
    ("{m}.all(k, v, k != v)", {"m": as_cel(st.dictionaries(words, words, max_size=3))}),
    ("{l}.exists(i, v, i == v)", {"l": int_lists}),
    ("{l}.transformList(i, v, v + i)", {"l": int_lists}),
    ("{l}.transformMap(i, v, v * 2)", {"l": int_lists}),
    ("{m}.transformMapEntry(k, v, {{v: k}})", {"m": as_cel(st.dictionaries(words, words,
                                                                          max_size=3))}),
)

NOT_IN_KUBERNETES = templates(
    ("math.greatest({a}, {b})", {"a": INT, "b": INT}),
    ("base64.encode(bytes({s}))", {"s": STR}),
    ("cel.bind(x, {a}, x + x)", {"a": INT}),
)

AUTHORIZER = templates(
    ("authorizer.group({g}).resource({r}).check({v}).allowed()", {
        "g": st.sampled_from(['""', '"apps"']), "r": st.sampled_from(['"pods"', '"nodes"']),
        "v": st.sampled_from(['"create"', '"get"'])}),
    ("authorizer.path({p}).check('get').allowed()", {"p": st.sampled_from(['"/healthz"'])}),
)


def _object_request(expression_of: Callable[[str], str]) -> st.SearchStrategy[Request]:
    return st.tuples(json_objects, keys).map(
        lambda drawn: {"expression": expression_of(drawn[1]),
                       "vars": {"object": json.loads(json.dumps(drawn[0]))}})


OBJECTS = [
    _object_request(lambda k: f"has(object.{k})" if k.isidentifier() and k != "in"
                    else f"{lit(k)} in object"),
    _object_request(lambda k: f"object[{lit(k)}]"),
    _object_request(lambda k: f"object[?{lit(k)}].hasValue()"),
    _object_request(lambda k: f"object[?{lit(k)}].orValue(null) == null"),
    _object_request(lambda k: "size(object)"),
    _object_request(lambda k: "object"),
    _object_request(lambda k: f"object.all(x, x != {lit(k)})"),
    _object_request(lambda k: "object.exists(x, object[x] == 1)"),
    # Results that do not depend on the order of map keys (Go iterates maps at random).
    _object_request(lambda k: f"object.map(x, x + {lit(k)}).exists(y, y == {lit(k + k)})"),
    _object_request(lambda k: "object.filter(x, type(object[x]) == int).size()"),
    _object_request(lambda k: f"type(object[{lit(k)}])"),
    _object_request(lambda k: f"string(object[{lit(k)}])"),
    _object_request(lambda k: f"int(object[{lit(k)}])"),
    _object_request(lambda k: f"object[{lit(k)}] == object[{lit(k)}]"),
    _object_request(lambda k: f"object[{lit(k)}] == 1.0"),
    _object_request(lambda k: f"object[{lit(k)}].size()"),
    _object_request(lambda k: f"object[{lit(k)}][0]"),
    _object_request(lambda k: "object == " + "{'a': 1, 'b': [1.0, 'x']}"),
]

LIBRARIES: dict[str, list[st.SearchStrategy[Request]]] = {
    "strings": STRINGS, "lists": LISTS, "regex": REGEX, "quantity": QUANTITY,
    "ip/cidr": NETWORK, "urls": URLS, "semver": SEMVER, "format": FORMAT, "numbers": NUMBERS,
    "time": TIME, "optionals": OPTIONALS, "comprehensions": COMPREHENSIONS,
    "not in kubernetes": NOT_IN_KUBERNETES, "authorizer": AUTHORIZER, "objects": OBJECTS,
}
requests = st.one_of([s for strategies in LIBRARIES.values() for s in strategies])
