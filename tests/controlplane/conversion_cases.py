"""CEL type conversions as Kubernetes evaluates them: the inputs, and their answers recorded from
the ``celoracle`` (cel-go, k8s.io/apiserver 1.37).

Owns two sets of requests and the recording of their answers:

* :func:`conversion_requests`: a string from request data through ``int``, ``uint``, ``double``,
  ``bool``, ``duration`` or ``timestamp`` (and back through ``string`` so that the value is
  compared as cel-go writes it), drawn near the edges of Go's parsers (signs, underscores, hex
  floats, ``inf``, units ``µs``, one-digit hours, zone offsets past 23:59) by a seeded
  ``random.Random``; and doubles through ``int``/``uint``/``string``;
* :data:`CREATION_EXPRESSIONS`: expressions Kubernetes refuses when a policy is created (a
  constant conversion that fails, an invalid duration or timestamp literal) or accepts.

``python -m tests.controlplane.conversion_cases`` asks the oracle and writes
``tests/data/k8s-cel/conversions.yaml``; ``tests/core/test_cel_conversions.py`` checks
gpuguard against the file, ``test_cel_conversions_live.py`` checks the file (and a larger seeded
set) against the oracle. Must not know what gpuguard answers.
"""

from __future__ import annotations

import random
import struct
import sys
from typing import Any

import yaml

from tests.paths import ROOT

OUTPUT = ROOT / "tests" / "data" / "k8s-cel" / "conversions.yaml"
RECORDED_SEED = 15
RECORDED_COUNT = 400

_PIECES: dict[str, list[str]] = {
    "int": [*"0123456789+-_ x", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "-9223372036854775809", "0x1"],
    "uint": [*"0123456789+-_ ", "18446744073709551615", "18446744073709551616"],
    "double": [*"0123456789+-_.eEpPxXaAfF ", "inf", "Inf", "infinity", "nan", "NaN", "0x",
               "1e308", "1e309", "e-400"],
    "duration": [*"0123456789.+-hmsun", "µs", "μs", "ms", "ns", "us", "9223372036854775807",
                 "9223372036854775808", "h", "s", "m", "0"],
}
_BOOLS = ["1", "0", "t", "T", "f", "F", "true", "True", "TRUE", "tRue", "false", "False",
          "FALSE", "yes", " ", "2"]


def _timestamp_text(rng: random.Random) -> str:
    """Each part valid four times in five, else one of Go's edge cases."""
    def part(valid: list[str], edges: list[str]) -> str:
        return rng.choice(valid if rng.random() < 0.8 else edges)
    return "".join((
        part(["2000", "1970", "0001", "9999"], ["0000", "200", "20000"]), "-",
        part(["01", "02", "12"], ["13", "00", "1"]), "-", part(["01", "28", "29"], ["30", "31", "00"]),
        part(["T"], ["t", " "]), part(["00", "23", "9"], ["24", "1"]), ":",
        part(["00", "59"], ["60", "5"]), ":", part(["00", "59"], ["60"]),
        part(["", ".5", ",5"], [".123456789123", ".", ".x"]),
        part(["Z", "+01:00", "-23:59"], ["z", "+24:00", "+24:60", "+25:00", "+0100", ""])))


def _double(rng: random.Random) -> float:
    kind = rng.random()
    if kind < 0.3:
        value: float = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        return value
    if kind < 0.6:
        return rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)
    if kind < 0.8:
        return rng.choice([2.0**63, 2.0**64, -(2.0**63), 2.0**63 - 1024, 2.0**64 - 2048, 1e6,
                           1e21, 1e-4, 1e-5, 123456.0, 0.1, -0.0, 0.5, -0.5, 1e20])
    return float(rng.randint(-10**7, 10**7)) / rng.choice([1, 10, 1000, 3])


def conversion_requests(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` oracle requests ``{"expression", "vars": {"object": {"s": text}}}``, the same
    for the same seed; ``chain`` (outermost last) names the conversions applied to ``s``."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        target = rng.choice(["int", "uint", "double", "bool", "duration", "timestamp", "number"])
        if target == "number":
            text = repr(_double(rng))
            chain = rng.choice([["double"], ["double", "int"], ["double", "uint"],
                                ["double", "int", "double"]])
        else:
            if target == "bool":
                text = rng.choice(_BOOLS) + rng.choice(["", "", "", " ", "e"])
            elif target == "timestamp":
                text = _timestamp_text(rng)
            else:
                text = "".join(rng.choice(_PIECES[target]) for _ in range(rng.randint(1, 6)))
            chain = [target]
        expression = "object.s"
        for function in [*chain, "string"]:
            expression = f"{function}({expression})"
        requests.append({"expression": expression, "vars": {"object": {"s": text}},
                         "hasParams": False, "chain": chain})
    return requests


CREATION_EXPRESSIONS: tuple[str, ...] = (
    # constant conversions cel-go evaluates when the program is built (cel.OptOptimize)
    "uint(-1) > 0u", "int(1e19) > 0", "int(-9.223372036854775808e18) < 0", "int('abc') > 0",
    "uint('x') > 0u", "double('x') > 0.0", "bool('x')", "bool('tRuE')", "bool('T')",
    "string(b'\\xff') == ''", "int(' 1') == 1", "int('+1') == 1", "uint('+1') == 1u",
    "double('1e400') > 0.0", "double('1_0') > 0.0", "double('0x1p-2') > 0.0",
    "double('inf') > 0.0", "[int('x'), 1].size() == 2", "{'a': uint(-5)}.size() == 1",
    "int(string(uint(-1))) == 1", "true || int('x') == 1", "dyn(int('x')) == 1",
    "int(dyn('x')) == 1", "int(dyn(null)) == 1", "string(dyn([1])) == ''",
    "int('x') == 1 && uint(-1) == 1u", "[1, 2].all(x, x > int('y'))",
    "{'a': 1}.a > uint(-2)", "int(dyn(1.5)) == 1", "uint(1.5) == 1u", "int(['x'][0]) == 1",
    "int(object.s) > 0", "string(1000000.0) == '1e+06'",
    "object.metadata.name == 'a' ? int('4') > 1 : uint(-3) > 1u",
    # literal arguments of duration() and timestamp() (cel.ValidateDurationLiterals, ...)
    "duration('x') > duration('0s')", "duration('5') == duration('5s')",
    "duration('1us') == duration('1µs')", "duration('-1000000000000s') > duration('0s')",
    "duration('2562047h') > duration('0s')", "duration('2562048h') > duration('0s')",
    "timestamp('x') > timestamp('2000-01-01T00:00:00Z')",
    "timestamp(253402300800) > timestamp('2000-01-01T00:00:00Z')",
    "timestamp(-62135596801) > timestamp('2000-01-01T00:00:00Z')",
    "timestamp(253402300799) > timestamp('2000-01-01T00:00:00Z')",
    "timestamp('2000-01-01 00:00:00Z') > timestamp('1999-12-31T23:00:00Z')",
    "timestamp('2000-01-01t00:00:00z') > timestamp('1999-12-31T23:00:00Z')",
    "timestamp('2000-02-30T00:00:00Z') > timestamp('1999-12-31T23:00:00Z')",
    "timestamp('2000-01-01T1:00:00,5+24:00') > timestamp('1999-12-31T23:00:00Z')",
    "timestamp('0000-12-31T23:00:00-01:00') > timestamp('1999-12-31T23:00:00Z')",
    "duration('5') == duration('5s') && timestamp('x') > timestamp('2000-01-01T00:00:00Z')",
    "duration(object.s) > duration('0s')",
)


def answer_of(answer: dict[str, Any]) -> dict[str, Any]:
    """An oracle answer as the file records it: ``refused``, ``error`` or ``value``."""
    if "compileError" in answer:
        return {"refused": answer["compileError"]}
    if "error" in answer:
        return {"error": answer["error"]}
    value = answer["value"]
    return {"value": value.get("string", value) if isinstance(value, dict) else value}


def main() -> int:
    """Record the oracle's answers into :data:`OUTPUT`."""
    from tests.controlplane.celoracle import CelOracle
    from tests.controlplane.cluster import build_binaries

    conversions = conversion_requests(RECORDED_SEED, RECORDED_COUNT)
    creation = [{"expression": e, "vars": {"object": {"s": "1s", "metadata": {"name": "a"}}},
                 "hasParams": False} for e in CREATION_EXPRESSIONS]
    with CelOracle(build_binaries()[0] / "celoracle") as oracle:
        info = oracle.info()
        converted = oracle.evaluate([{k: v for k, v in r.items() if k != "chain"}
                                     for r in conversions])
        created = oracle.evaluate([{k: v for k, v in r.items()} for r in creation])
    document = {
        "kubernetes": info.get("kubernetes", ""),
        "conversions": [{"text": r["vars"]["object"]["s"], "chain": r["chain"], **answer_of(a)}
                        for r, a in zip(conversions, converted, strict=True)],
        "creation": [{"expression": e, **answer_of(a)}
                     for e, a in zip(CREATION_EXPRESSIONS, created, strict=True)],
    }
    header = ("# Recorded by `python -m tests.controlplane.conversion_cases` from the celoracle\n"
              "# (cel-go as kube-apiserver runs it); do not edit by hand.\n")
    OUTPUT.write_text(header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True,
                                              width=100, default_flow_style=None))
    print(f"wrote {OUTPUT}: {len(conversions)} conversions, {len(creation)} expressions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
