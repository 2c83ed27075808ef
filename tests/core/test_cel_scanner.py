"""The CEL source scanner: the one place gpuguard reads CEL as text (policies.cel.scanner)."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.cel import scanner as scan


@pytest.mark.parametrize(("source", "expected"), [
    ("'a // b' + x // comment 'c", "\"\" + x "),
    ('r"\\d+" + b\'\\x00\' + """multi\n"line"""', '"" + "" + ""'),
    ("'''it's''' + y", '"" + y'),
    ("'unterminated", '""'),
])
def test_code_only_empties_strings_and_drops_comments(source, expected):
    assert scan.code_only(source) == expected


@pytest.mark.parametrize(("source", "name", "fields"), [
    ("variables.a + variables['b'] + variables.?c.orValue(0)", "variables", ("a", "b", "c")),
    ("object.variables.x + t.gpu.count", "variables", ()),
    ("'gpu.count' + \"params.x\" // gpu.y", "gpu", ()),
    ("[1].all(gpu, gpu > 0) && gpu.count > 0", "gpu", ("count",)),
    ("m.map(k, v, gpu.a) + m.exists(gpu, gpu.b)", "gpu", ("a",)),
    ("cel.bind(gpu, gpu.init, gpu.body)", "gpu", ("init",)),
    ("x.filter(p, p.gpu.z) && gpu . count > 1", "gpu", ("count",)),
    ("object.`dashed-name` + gpu.`odd`", "gpu", ("odd",)),
])
def test_fields_respect_strings_comments_members_and_scopes(source, name, fields):
    assert scan.fields(source, name) == fields


@pytest.mark.parametrize(("source", "selected"), [
    ("variables.a + variables.b", frozenset({"a", "b"})),
    ("variables['a']", None),
    ("variables.?a.orValue(1)", None),
    ("has(variables.a)", None),
    ("size(variables) > 0", None),
    ("variables[k]", None),
    ("'variables[k]' + variables.a", frozenset({"a"})),
])
def test_selections_only_says_when_a_name_is_used_as_a_whole(source, selected):
    assert scan.selections_only(source, "variables") == selected


def test_rename_replaces_plain_selections_outside_strings():
    renamed = scan.rename("variables.a + 'variables.a' + x.variables.a // variables.b",
                          "variables", lambda f: f"__var_{f}")
    assert renamed == "__var_a + 'variables.a' + x.variables.a "


def test_typed_object_literal_fields():
    source = "JSONPatch{op: 'add', path: '/a', value: {b: 1}} + t.JSONPatch{x: 1}"
    [literal] = scan.typed_literals(source, "JSONPatch")
    assert [source[a:b] for a, b in literal.fields] == ["op", "path", "value"]
    assert literal.start == 0


@given(st.text(max_size=200))
def test_the_scanner_never_raises_and_tokens_cover_the_code(source):
    tokens = scan.tokenize(source)
    assert all(0 <= t.start < t.end <= len(source) for t in tokens)
    assert all(a.end <= b.start for a, b in itertools.pairwise(tokens))
    scan.code_only(source)
    scan.references(source, "variables")
    scan.calls(source, "validate", member=True)
    scan.aggregate_literals(source, frozenset({"format"}))


def test_calls_finds_member_and_global_calls_outside_strings_and_comments():
    source = "format.named('x').value().validate(f(')')) || 'a.validate(' == y.format.named(1)"
    [member] = scan.calls(source, "validate", member=True)
    assert source[member.name_start:member.name_end] == "validate"
    assert source[member.end - 1] == ")" and source[:member.end].endswith("f(')'))")
    [named] = scan.calls(source, "format.named", member=False)  # y.format.named is a member
    assert (named.name_start, named.name_end) == (0, len("format.named"))
    assert scan.calls("// x.validate(1)\nvalidate(2)", "validate", member=True) == ()


def test_aggregate_literals_reads_literal_elements_only():
    kinds = [[e.kind for e in group] for group in scan.aggregate_literals(
        "[1, 2.0, 3u, -4, 'a', b'b', true, null, x + 1] + m[0] + {'k': 1, 'j': 'v'} + "
        "T{a: 1, b: 'x'} + '%s'.format(['a', 1])", frozenset({"format"}))]
    # m[0] indexes; T{...} is a typed object literal; format's argument list is exempt
    assert kinds == [["int", "double", "uint", "int", "string", "bytes", "bool", "null"],
                     ["string", "string"], ["int", "string"]]


def test_typed_literals_with_dotted_type_names():
    source = "Object{spec: Object.spec{x: 1}, y: a.Object{}, s: 'Object{z: 1}'} // Object{c: 1}"
    found = scan.typed_literals(source, "Object")
    assert [(t.type_name, source[t.start:t.end]) for t in found] == [
        ("Object", "Object"), ("Object.spec", "Object.spec")]
    assert [source[a:b] for a, b in found[0].fields] == ["spec", "y", "s"]
    assert [source[a:b] for a, b in found[1].fields] == ["x"]
