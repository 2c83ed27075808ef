"""The JSON text of every document: orjson writes it, and it reads as json.dumps wrote it.

``gpuguard.output_formats.json_text`` replaced ``json.dumps(document, indent=2)`` (Python's
indenting encoder: 257 M instructions for a 6,000-pod audit report, orjson 9 M), and
``json_chunks`` the Python ``iterencode`` of the streamed compact report. Consumers diff and
hash these files, so the text is json.dumps' own, byte for byte, wherever both can write it.
"""

from __future__ import annotations

import io
import json
import math

import pytest

from gpuguard.audit_run import INDENT_UP_TO, write_json
from gpuguard.output_formats import json_chunks, json_text

# Every character JSON strings can hold (no lone surrogates: neither encoder writes those the
# same), as a value and as keys.
EVERY_CHARACTER = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)

DOCUMENTS = [
    {"apiVersion": "gpuguard.io/v1alpha1", "kind": "AuditReport", "workloads": [], "n": None},
    {"text": EVERY_CHARACTER},
    {EVERY_CHARACTER[i:i + 500]: i for i in range(0, len(EVERY_CHARACTER), 50_000)},
    {"message": "pods on gpu-node-a100-05-00019, … (and 3 more) → team-a ², \U0001F600"},
    {"floats": [0.5, 1.0, 1 / 3, 1e16, 1e22, 123456789012345680.0, -0.0, 5e-324, 0.0001],
     "ints": [0, -1, 2**53, 2**63 - 1, -(2**63)], "bools": [True, False], "empty": [{}, []]},
    {"nested": [[[{"a": [1, {"b": "c"}]}]]], "tuple": (1, 2)},
]


@pytest.mark.parametrize("document", DOCUMENTS, ids=range(len(DOCUMENTS)))
def test_json_text_is_json_dumps_text(document):
    assert json_text(document) == json.dumps(document, indent=2)
    assert json_text(document, indent=False) == json.dumps(document, separators=(",", ":"))


@pytest.mark.parametrize("document", [
    {1: "an int key", None: "a null key", 2.5: "a float key"},
    {True: "a bool key", "x": [False]},
    {"big": 2**64 + 1, "negative": -(2**70)},
    {"surrogate": "\udc80 from a YAML escape"},
    {"deep": json.loads("[" * 300 + "]" * 300)},
], ids=["keys", "bool-key", "big-ints", "lone-surrogate", "deep"])
def test_what_orjson_refuses_is_written_by_json_dumps(document):
    assert json_text(document) == json.dumps(document, indent=2)
    assert json_text(document, indent=False) == json.dumps(document, separators=(",", ":"))


def test_small_floats_are_spelled_as_json_dumps_spells_them():
    # orjson writes 1e-05 as 0.00001 and 1e-07 as 1e-7; the text is json.dumps' (a report's
    # GPU-equivalents of a 0.00001 KAI fraction, found by a fresh-context trial)
    document = {"small": [1e-7, 1e-05, 2.5e-9, -1.5317053354907915e-06, 0.0001, 0.00012],
                "text": "0.00001 and 1e-7 in a string stay", "nested": [{"f": 3e-05}]}
    assert json_text(document) == json.dumps(document, indent=2)
    assert json_text(document, indent=False) == json.dumps(document, separators=(",", ":"))


def test_nan_which_json_cannot_spell_is_null():
    text = json_text({"nan": math.nan, "inf": -math.inf})
    assert json.loads(text) == {"nan": None, "inf": None}


def test_values_neither_writes_are_a_type_error():
    with pytest.raises(TypeError):
        json_text({"a set": {1, 2}})


def _report(workloads: int) -> dict:
    return {
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "AuditReport", "summary": {"pods": 3},
        "workloads": [{"name": f"w-{i}", "namespace": "team-a", "gpus": i % 4,
                       "message": "pending on gpu-node-00001, … — MIG 1g.10gb"}
                      for i in range(workloads)],
        "findings": [], "warnings": ["3 Pod(s) name a Pod in ownerReferences (a/b → c)"],
        "empty": [], "nodes": {"n1": {"gpus": 8}},
    }


@pytest.mark.parametrize("chunk_chars", [1, 100, 1 << 16])
def test_json_chunks_join_to_the_compact_text(chunk_chars):
    report = _report(300)
    chunks = list(json_chunks(report, chunk_chars=chunk_chars))
    assert "".join(chunks) == json.dumps(report, separators=(",", ":"))
    if chunk_chars == 100:  # held in pieces, none much over the size asked
        assert len(chunks) > 100 and max(len(c) for c in chunks) < 400


def test_json_chunks_with_a_key_json_dumps_must_spell():
    document = {"a": [1, 2], 7: "seven"}
    assert "".join(json_chunks(document)) == json.dumps(document, separators=(",", ":"))


@pytest.mark.parametrize("workloads", [3, INDENT_UP_TO + 1])
def test_the_audit_report_file_is_the_text_json_dumps_wrote(workloads):
    """Small reports indented, large ones compact and streamed: the same text as before."""
    report = _report(workloads)
    stream = io.StringIO()
    write_json(report, stream)
    expected = json.dumps(report, indent=2) if workloads <= INDENT_UP_TO else \
        json.dumps(report, separators=(",", ":"))
    assert stream.getvalue() == expected + "\n"


def test_floats_of_every_magnitude_are_json_dumps_text():
    import random
    import struct

    rng = random.Random(20261204)
    floats = [rng.random() * 10.0 ** rng.randint(-12, 20) for _ in range(3000)]
    floats += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    document = {"floats": [f for f in floats if math.isfinite(f)]}
    assert json_text(document) == json.dumps(document, indent=2)
    assert json_text(document, indent=False) == json.dumps(document, separators=(",", ":"))
