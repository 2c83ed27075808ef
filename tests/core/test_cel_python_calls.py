"""What the CEL runtime (cel-expr-python) keeps of a call to a function written in Python.

Measured on 0.1.3, the newest release: the runtime keeps one reference to the arguments' tuple
and one to the result of every such call, and never releases them (with the C++ values around
them, ~750 bytes a call for the authorizer chain; 6.1 KB per built-in-library ``/validate``).
The audit bounds it by replacing its policy workers (``audit.scan.compliance._BATCHES_PER_WORKER``);
the webhook cannot, so its memory grows with the requests it evaluates (docs/benchmarks.md,
"memory"). These tests pin the fact the bound rests on: when a release frees the values, they
fail — then re-measure and drop the bound.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from cel_expr_python import cel


def _environment(seen: dict[str, Any]) -> Any:
    def make(text: str, count: int) -> list[str]:
        seen["argument"] = text
        seen["result"] = result = [text * count]
        return result

    overload = cel.Overload("make_string_int", return_type=cel.Type.List(cel.Type.STRING),
                            parameters=[cel.Type.STRING, cel.Type.INT], is_member=False,
                            impl=make)
    return cel.NewEnv(variables={"o": cel.Type.DYN},
                      extensions=[cel.CelExtension("probe", [cel.FunctionDecl("make",
                                                                              [overload])])])


def test_the_runtime_keeps_the_result_of_a_python_function_call():
    seen: dict[str, Any] = {}
    env = _environment(seen)
    program = env.compile("make(o.s, 2)[0] == 'abab'")
    assert program.eval(env.Activation({"o": {"s": "ab"}})).plain_value() is True
    gc.collect()
    result = seen.pop("result")
    # Python holds it twice (this name, getrefcount's argument); the rest are the runtime's
    assert gc.get_referrers(result) == []
    assert sys.getrefcount(result) - 2 >= 1


def test_the_runtime_keeps_the_arguments_tuple_of_a_python_function_call():
    seen: dict[str, Any] = {}
    env = _environment(seen)
    program = env.compile("make(o.s, 2).size() == 1")
    program.eval(env.Activation({"o": {"s": "xyz"}}))
    holders = [r for r in gc.get_referrers(seen["argument"]) if isinstance(r, tuple)]
    assert holders == [("xyz", 2)]
