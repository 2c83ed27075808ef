"""The mutation shortcuts are one table (policies.policy.mutation.SHORTCUTS) that the schema follows."""

from policies.policy.mutation import SHORTCUTS
from policies.sources import load_package_yaml


def test_the_schema_lists_exactly_the_shortcuts_the_code_applies():
    mutation = load_package_yaml("policies.data", "gpupolicy.schema.json")["$defs"]["mutation"]
    declared = set(mutation["properties"]) - {"name", "condition", "patchType", "expression"}
    assert declared == set(SHORTCUTS)
    one_of = {next(iter(choice["required"])) for choice in mutation["oneOf"]}
    assert one_of == {*SHORTCUTS, "expression"}
