"""Reading manifests: every problem named by file and document, nothing else lost."""

import gzip
import io
import json

import pytest

from gpuguard.cli import main
from policies.facts.quantity import QuantityError, format_fraction, parse_quantity
from policies.sources import read_documents
from tests.builders.corpus import DATA

POD = (DATA / "manifests" / "gpuop__cuda-vector-add-legacy-pod.yaml").read_text()


def test_broken_document_is_reported_and_the_others_still_load(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(POD + "\n---\nkind: Pod\nmetadata: {name: [unclosed\n---\n" + POD)
    documents, errors = read_documents([str(path)])
    assert [d.index for d in documents] == [0, 2]
    [error] = errors
    assert error.index == 1
    assert str(error).startswith(f"{path}: document 1: invalid YAML at line ")


def test_list_items_and_gzip_and_directory_order(tmp_path):
    items = [
        json.loads(json.dumps(d))
        for d in [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}"}} for i in range(3)
        ]
    ]
    listing = {"apiVersion": "v1", "kind": "List", "items": items}
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps(listing).encode()))
    (tmp_path / "a.yaml").write_text(POD)
    (tmp_path / "notes.txt").write_text("not a manifest")
    documents, errors = read_documents([str(tmp_path)])
    assert errors == []
    assert [d.body["metadata"]["name"] for d in documents] == [
        "gpu-operator-test",
        "p0",
        "p1",
        "p2",
    ]
    assert documents[2].location == f"{tmp_path / 'b.json.gz'}: document 0 items[1]"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00garbage", "not UTF-8 text (byte offset 0)"),
        (b'{"kind": "Pod",', "invalid JSON at line 1 column"),
        (
            b"[1, 2, 3]",
            "expected a Kubernetes object (a mapping with apiVersion and kind), got a list",
        ),
        (b'{"apiVersion": "v1", "metadata": {}}', "object has no kind (expected e.g. kind: Pod)"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    ],
)
def test_bad_json_files_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    documents, [error] = read_documents([str(path)])
    assert documents == []
    assert message in str(error)
    assert str(error).startswith(str(path))


def test_comment_only_and_trailing_separators_are_not_documents():
    documents, errors = read_documents(
        [str(DATA / "manifests" / "volcano__vcjob-mindspore-gpu.yaml")]
    )
    assert errors == [] and len(documents) == 1


def test_missing_path_and_stdin():
    documents, [error] = read_documents(["/nonexistent/x.yaml"])
    assert str(error) == "/nonexistent/x.yaml: no such file or directory"
    documents, errors = read_documents(["-"], stdin=io.StringIO(POD))
    assert errors == [] and documents[0].source == "-"


def test_deeply_nested_yaml_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("kind: Pod\nspec: " + "[" * 3000 + "]" * 3000 + "\n")
    documents, errors = read_documents([str(path)])
    assert documents == [] or errors == []  # either parsed or reported, never raised


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("500m", 0.5),
        ("1Gi", 2**30),
        ("1.5k", 1500),
        ("1e3", 1000),
        ("2E-1", 0.2),
        (3, 3),
        ("+1", 1),
        (".5", 0.5),
        ("12E", 12 * 10**18),  # the exa suffix, not an exponent without digits
        ("0.5E", 5 * 10**17),
    ],
)
def test_quantity_values(text, value):
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1 Gi", "1GiB", "abc", "--1", True, None, [1]])
def test_quantity_errors(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_cached_quantities_keep_types_apart_and_long_text_out_of_the_cache():
    """1, 1.0 and True hash alike: the cache must not answer one for another."""
    from policies.facts.quantity import _parse_cached

    assert parse_quantity(1) == parse_quantity(1.0) == 1
    with pytest.raises(QuantityError):
        parse_quantity(True)
    padded = " " * 100_000 + "1"  # valid (stripped), but too long to be a cache key
    before = _parse_cached.cache_info().currsize
    assert parse_quantity(padded) == 1
    assert _parse_cached.cache_info().currsize == before


def test_format_fraction():
    from fractions import Fraction

    assert [format_fraction(Fraction(x)) for x in (2, Fraction(1, 2), Fraction(1, 7))] == [
        "2",
        "0.5",
        "1/7",
    ]


# --- the gpus command on bad input ----------------------------------------------------------


def test_gpus_command_reports_bad_documents_and_keeps_the_good(tmp_path, capsys):
    path = tmp_path / "mixed.yaml"
    path.write_text(POD + "\n---\nmetadata: {name: x}\n---\n: : :\n")
    rc = main(["gpus", "-f", str(path), "-o", "json"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert rc == 2
    assert [o["name"] for o in result["objects"]] == ["gpu-operator-test"]
    assert (
        result["errors"][0] == f"{path}: document 1: object has no kind (expected e.g. kind: Pod)"
    )
    assert result["errors"][1].startswith(f"{path}: document 2: invalid YAML")
    assert captured.err.count("\n") == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gpus"], "the following arguments are required: -f/--filename"),
        (
            ["gpus", "-f", "x", "--shared-replicas", "nvidia.com/gpu.shared=1"],
            "--shared-replicas 'nvidia.com/gpu.shared=1': expected RESOURCE=N with N >= 2",
        ),
        (["gpus", "-f", "x", "--gpu-resource", "no slash"], "--gpu-resource 'no slash'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_table_and_yaml_outputs(capsys):
    path = str(DATA / "manifests" / "lws__vllm-gpu-leaderworkerset.yaml")
    assert main(["gpus", "-f", path]) == 0
    table = capsys.readouterr().out
    assert "LeaderWorkerSet/vllm" in table and "nvidia.com/gpu: 32" in table
    assert main(["gpus", "-f", path, "-o", "yaml"]) == 0
    assert "gpu_equivalents: 32.0" in capsys.readouterr().out


def test_ordinary_anchors_and_aliases_still_load(capsys):
    # The corpus LeaderWorkerSet with what its templates share written once (&, *, <<): the alias
    # bound must not touch such files, and every command sees the same object.
    anchored = str(DATA / "edge" / "anchors__lws-vllm-gpu-leaderworkerset.yaml")
    plain = str(DATA / "manifests" / "lws__vllm-gpu-leaderworkerset.yaml")
    [document], errors = read_documents([anchored], with_lines=True)
    assert errors == []
    assert document.body == read_documents([plain])[0][0].body
    assert document.line_of("spec.leaderWorkerTemplate.workerTemplate.spec.volumes") == 75
    assert main(["gpus", "-f", anchored, "-o", "json"]) == 0
    total = json.loads(capsys.readouterr().out)["objects"][0]["total"]
    assert total["gpus"] == {"nvidia.com/gpu": 32}
    assert main(["check", "-f", anchored]) == 0
    capsys.readouterr()
    assert main(["audit", "-f", anchored, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == []


@pytest.mark.parametrize(("value", "words"), [
    (True, "got the boolean true"), (None, "got null"), (float("inf"), "got the number .inf")])
def test_a_quantity_of_the_wrong_kind_is_named_in_yaml_words(value, words):
    """A new user's trial: a denial said ``... got True`` / ``got None`` (Python reprs)."""
    with pytest.raises(QuantityError) as raised:
        parse_quantity(value)
    assert str(raised.value).endswith(words)
