"""Hostile and malformed input (found by trying gpuguard as a new user would): every case gets a
clear message naming where, nothing valid is lost, and nothing raises."""

import gzip
import io
import json
import os

import pytest

from audit.sources.files import iter_snapshot
from gpuguard.cli import main
from policies.facts.nodes import HAMI_REGISTER, node_facts
from policies.facts.quantity import parse_count
from policies.facts.workloads import claim_templates_of, workload_facts
from policies.sources import Document, LoadError, read_documents
from tests.builders.corpus import DATA, first

POD_FILE = DATA / "manifests" / "gpuop__cuda-vector-add-legacy-pod.yaml"


def facts_of(obj):
    return workload_facts(obj).total


@pytest.mark.parametrize("value", ["1e400", 10**400, "9223372036854775808"])
def test_huge_quantities_are_invalid_not_a_crash(value):
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = value
    facts = facts_of(pod)
    assert facts.gpus == {}
    assert any("out of range" in m for m in facts.invalid), facts.invalid
    json.dumps(facts.to_dict())  # serialisable, no OverflowError


def test_huge_replicas_and_claim_counts():
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    deployment["spec"]["replicas"] = 10**400
    facts = facts_of(deployment)
    assert facts.gpus == {"nvidia.com/gpu": 1}  # the default, with the bad value reported
    assert any(m.startswith("spec.replicas: expected a non-negative integer") for m in facts.invalid)
    template = first("manifests/dradriver__pod-two-gpus-resourceclaimtemplate.yaml",
                     "ResourceClaimTemplate")
    template["spec"]["spec"]["devices"]["requests"][0]["count"] = "lots"
    assert claim_templates_of([template]) == {("gpu-test1", "double-gpu"): ("gpu.nvidia.com", None)}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.__setitem__("spec", "string"), "spec: expected a map, got the string 'string'"),
        (lambda p: p["spec"]["containers"][0].__setitem__("resources", [1]),
         "spec.containers[0].resources: expected a map, got a list"),
        (lambda p: p["spec"]["containers"][0]["resources"].__setitem__("limits", "nvidia.com/gpu=1"),
         "spec.containers[0].resources.limits: expected a map, got the string "
         "'nvidia.com/gpu=1'"),
        (lambda p: p["spec"].__setitem__("nodeSelector", ["a"]),
         "spec.nodeSelector: expected a map, got a list"),
        (lambda p: p["spec"].__setitem__("affinity", "x"), "spec.affinity: expected a map, got the string 'x'"),
        (lambda p: p["metadata"].__setitem__("annotations", ["a"]),
         "metadata.annotations: expected a map, got a list"),
        (lambda p: p["spec"]["containers"][0].__setitem__("env", {"a": 1}),
         "spec.containers[0].env: expected a list, got a map"),
        (lambda p: p["metadata"].__setitem__("name", ["a"]),
         "metadata.name: expected a string, got a list"),
        (lambda p: p["metadata"].__setitem__("annotations", {"gpu-fraction": 0.5}),
         "metadata.annotations[gpu-fraction]: annotation values must be strings, got the number 0.5"),
    ],
)
def test_wrong_typed_fields_are_invalid(edit, message):
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    edit(pod)
    assert message in facts_of(pod).invalid


@pytest.mark.parametrize(
    ("kind_file", "edit", "message"),
    [
        ("manifests/vllm__mistral-7b-nvidia-deployment.yaml",
         lambda d: d["spec"].__setitem__("template", "x"),
         "spec.template: expected a pod template map, got the string 'x'"),
        ("manifests/ndp__e2e-job-nbody.yaml",
         lambda j: j["spec"]["template"].__setitem__("spec", [1]),
         "spec.template.spec: expected a map, got a list"),
    ],
)
def test_wrong_typed_templates_are_invalid(kind_file, edit, message):
    obj = first(kind_file)
    edit(obj)
    assert message in facts_of(obj).invalid


def test_mig_profile_missing_on_the_pinned_gpu_is_a_warning():
    pod = first("manifests/hami__static-mig-3g.20gb.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-2g.20gb": 1}
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert facts_of(pod).warnings == (
        "MIG profile 2g.20gb does not exist on A100-40GB (the GPU the pod is pinned to): the pod "
        "cannot be scheduled there",)


def test_node_with_negative_or_typed_wrong_values():
    node = first("nodes/issue-ndp-1501__h100-80gb-hbm3-x8-no-mig.yaml")
    node["status"]["allocatable"]["nvidia.com/gpu"] = "-4"
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "abc"
    node["metadata"]["labels"]["nvidia.com/mig.strategy"] = ["single"]
    facts = node_facts(node)
    assert facts.allocatable.gpus == {}
    assert facts.gpu_equivalents == 0
    assert facts.mig_strategy is None
    assert facts.warnings == (
        "metadata.labels[nvidia.com/mig.strategy]: expected a string, got a list; ignored",
        "status.allocatable[nvidia.com/gpu]: -4 is not a device count (expected a whole number "
        "from 0); ignored",
        "metadata.labels[nvidia.com/gpu.count]: 'abc' is not a non-negative integer; ignored",
    )


# --- reading files ---------------------------------------------------------------------------


class _Stdin(io.BytesIO):
    """A binary stream standing in for sys.stdin.buffer."""

    @property
    def buffer(self):
        return self


def test_stdin_binary_gzip_and_closed():
    documents, [error] = read_documents(["-"], stdin=_Stdin(os.urandom(64) + b"\xff"))
    assert str(error).startswith("-: not UTF-8 text")
    documents, errors = read_documents(["-"], stdin=_Stdin(gzip.compress(POD_FILE.read_bytes())))
    assert errors == [] and documents[0].body["kind"] == "Pod"
    closed = _Stdin(b"")
    closed.close()
    _, [error] = read_documents(["-"], stdin=closed)
    assert str(error) == "-: cannot read: standard input is closed"


def test_directory_problems_are_reported(tmp_path):
    (tmp_path / "POD.YAML").write_bytes(POD_FILE.read_bytes())
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "missing")
    (tmp_path / "loop-a.yaml").symlink_to(tmp_path / "loop-b.yaml")
    (tmp_path / "loop-b.yaml").symlink_to(tmp_path / "loop-a.yaml")
    documents, errors = read_documents([str(tmp_path)])
    assert [d.body["metadata"]["name"] for d in documents] == ["gpu-operator-test"]
    assert sorted(str(e).rsplit("/", 1)[1] for e in errors) == [
        "dangling.yaml: broken symbolic link (its target is missing or a link loop)",
        "loop-a.yaml: broken symbolic link (its target is missing or a link loop)",
        "loop-b.yaml: broken symbolic link (its target is missing or a link loop)",
    ]
    _, [error] = read_documents([str(tmp_path / "loop-a.yaml")])
    assert str(error).endswith("too many levels of symbolic links")
    _, [error] = read_documents([""])
    assert str(error) == "'': empty path (expected a file, a directory or -)"
    # a character device is read as a stream (/dev/stdin on a terminal): /dev/null holds nothing
    assert read_documents(["/dev/null"]) == ([], [])


def test_gzip_bomb_is_refused(tmp_path, monkeypatch):
    from policies import sources

    monkeypatch.setattr(sources, "MAX_DECOMPRESSED", 1 << 20)
    bomb = tmp_path / "bomb.yaml.gz"
    bomb.write_bytes(gzip.compress(b"#" * (3 << 20)))
    _, [error] = read_documents([str(bomb)])
    assert str(error) == f"{bomb}: cannot read: decompresses to more than 1 MiB"


def test_file_names_with_newlines_stay_on_one_line(tmp_path):
    _, [error] = read_documents([str(tmp_path / "a\nb.yaml")])
    assert "\n" not in str(error) and "a\\nb.yaml" in str(error)


def test_markup_and_escape_codes_in_names_are_printed_literally(tmp_path, capsys):
    path = tmp_path / "pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: '[/red]'\nspec:\n  containers:\n"
        "  - name: c\n    env:\n    - name: NVIDIA_VISIBLE_DEVICES\n      value: \"\\e[2J\"\n"
    )
    assert main(["gpus", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Pod/[/red]" in out and "\x1b" not in out and "\\x1b[2J" in out


def test_gpus_names_a_pod_without_metadata_and_says_why_a_pod_has_no_gpus(tmp_path, capsys):
    path = tmp_path / "pods.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: null\nspec:\n  containers: [{name: c, resources: "
        "{limits: {nvidia.com/gpu: 1}}}]\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: s}\n"
        "spec: null\n")
    assert main(["gpus", "-f", str(path)]) == 0
    notes = " ".join(capsys.readouterr().out.split())  # the console wraps long notes
    assert notes.endswith(
        f"- Pod/(no name, {path}: document 0): invalid: metadata.name: required, none given "
        "(neither metadata.name nor metadata.generateName is a non-empty string) "
        "- Pod/s: invalid: spec: required, none given (a Pod has at least one container; "
        "without, it asks for no GPU)")


def test_a_kind_that_is_not_a_string_is_invalid_not_a_crash():
    facts = workload_facts({"apiVersion": "v1", "kind": ["Pod"],
                            "spec": {"containers": [{"name": "c"}]}})
    assert facts is not None and "kind: expected a string, got a list" in facts.total.invalid


# --- numbers beyond int64 (tests/data/edge/nodes-out-of-range.yaml) ------------------------------

EDGE = DATA / "edge"
NODES_OUT_OF_RANGE = EDGE / "nodes-out-of-range.yaml"


def test_node_values_beyond_int64_or_negative_are_input_errors_and_the_audit_completes(capsys):
    where = f"{NODES_OUT_OF_RANGE}: document"
    # exit 2: the report is printed, but incomplete input passes no gate
    assert main(["audit", "-f", str(NODES_OUT_OF_RANGE), "-o", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == [
        f"{where} 0: Node n1: status.allocatable[nvidia.com/gpu]: 100000...e400 is out of range "
        "(at most 9223372036854775807); ignored",
        f"{where} 1: Node n2: metadata.labels: expected a map, got the string 'x'; ignored",
        f"{where} 1: Node n2: status.capacity[nvidia.com/gpu]: 123456...e29 is out of range "
        "(at most 9223372036854775807); ignored",
        f"{where} 1: Node n2: status.allocatable[nvidia.com/gpu]: -4 is not a device count "
        "(expected a whole number from 0); ignored",
        f"{where} 1: Node n2: status.allocatable[cpu]: -2 is negative; ignored",
        f"{where} 1: Node n2: status.allocatable[memory]: 100000...e400 is out of range (at most "
        "9223372036854775807); ignored",
        f"{where} 2: Node gpu-node-ok: metadata.labels[nvidia.com/gpu.replicas]: "
        "'99999999999999999999' is out of range (at most 9223372036854775807); ignored",
        f"{where} 2: Node gpu-node-ok: metadata.labels[nvidia.com/gpu.count]: '²' is not a "
        "non-negative integer; ignored",
        f"{where} 2: Node gpu-node-ok: status.allocatable[cpu]: 100000...e400 is out of range "
        "(at most 9223372036854775); ignored",
    ]
    # The valid parts still count: the good node's 4 GPUs, 2 taken by the pod; n1 and n2 offer
    # nothing usable, so they are not GPU nodes.
    [node] = report["nodes"]
    assert node["name"] == "gpu-node-ok"
    assert node["gpu_equivalents"] | {"approximate": False} == {
        "allocatable": 4.0, "allocated": 2.0, "free": 2.0, "approximate": False,
        "unknown_pods": 0}
    assert node["cpu"]["allocatable_millicores"] is None  # out of range: unknown, not huge
    # A request beyond int64 saturates there: the pod fits no node, and MiB stay a float.
    assert node["cpu"]["requested_millicores"] == 2**63 - 1
    assert report["summary"]["nodes"] == 3 and report["summary"]["gpu_pods"]["running"] == 1


def test_every_node_count_is_bounded_and_reported():
    node = first("nodes/issue-ndp-1501__h100-80gb-hbm3-x8-no-mig.yaml")
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "9" * 5000  # int() refuses > 4300 digits
    node["metadata"]["annotations"] = {HAMI_REGISTER: "GPU-1,-10,1e400,²,NVIDIA-H100,0,true:"}
    node["status"]["allocatable"]["nvidia.com/gpu"] = 10**400
    node["status"]["capacity"]["nvidia.com/gpu"] = "1e-3"
    facts = node_facts(node)
    assert facts.allocatable.gpus == {} and facts.capacity.gpus == {}
    assert facts.hami_devices[0].split == 0 and facts.hami_devices[0].memory_mib == 0
    assert facts.invalid == (
        "status.capacity[nvidia.com/gpu]: 0.001 is not a device count (expected a whole number "
        "from 0); ignored",
        "status.allocatable[nvidia.com/gpu]: 100000...e400 is out of range (at most "
        "9223372036854775807); ignored",
        f"{HAMI_REGISTER}: record 0 split: '-10' is not a whole number from 0 to "
        "9223372036854775807; counted as 0",
        f"{HAMI_REGISTER}: record 0 memory: '1e400' is not a whole number from 0 to "
        "9223372036854775807; counted as 0",
        f"{HAMI_REGISTER}: record 0 cores: '²' is not a whole number from 0 to "
        "9223372036854775807; counted as 0",
        "metadata.labels[nvidia.com/gpu.count]: '" + "9" * 36 + "... is out of range (at most "
        "9223372036854775807); ignored",
    )
    assert set(facts.invalid) <= set(facts.warnings)
    json.dumps(facts.to_dict())


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"gpu-memory": "²"}, "metadata.annotations[gpu-memory]: '²' is not a number of MiB "
         "(KAI accepts a positive integer)"),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "²"},
         "metadata.annotations[gpu-fraction-num-devices]: '²' is not a positive integer"),
        # Fraction('1e-99999999') alone would take minutes.
        ({"gpu-fraction": "1e-99999999"}, "metadata.annotations[gpu-fraction]: '1e-99999999' is "
         "not a fraction of a GPU (KAI accepts a number above 0 and below 1; a whole GPU is asked "
         "as nvidia.com/gpu)"),
    ],
)
def test_pod_annotation_counts_are_bounded(annotations, message):
    pod = first("manifests/gpuop__cuda-vector-add-legacy-pod.yaml")
    pod["metadata"]["annotations"] = annotations
    assert message in facts_of(pod).invalid


def test_pod_counts_are_parsed_as_ascii_within_int64():
    assert [parse_count(v) for v in ("0", "12", str(2**63 - 1), str(2**63), "²", "١٢", " 1",
                                      "-1", "9" * 5000, 5)] == \
        [0, 12, 2**63 - 1, None, None, None, None, None, None, None]


# --- YAML alias bombs (tests/data/edge/alias-bomb.yaml) -----------------------------------------

ALIAS_BOMB = EDGE / "alias-bomb.yaml"
BOMB_ERROR = (f"{ALIAS_BOMB}: document 0: invalid YAML at line 14: alias *c: aliases would add more "
              "than 4,700 nodes (at most 100 per node written, 47 here, and 1,000,000 in all); "
              "refused as a YAML alias bomb")


def test_alias_bomb_is_refused_naming_file_document_and_line():
    documents, errors = read_documents([str(ALIAS_BOMB)])
    assert documents == [] and [str(e) for e in errors] == [BOMB_ERROR]
    assert ALIAS_BOMB.read_text().splitlines()[13].startswith("    d: &d [*c,")


@pytest.mark.parametrize(
    ("command", "code"),
    [(["audit", "-f", str(ALIAS_BOMB), "-o", "json"], 2), (["check", "-f", str(ALIAS_BOMB)], 2),
     (["gpus", "-f", str(ALIAS_BOMB)], 2), (["lint", str(ALIAS_BOMB)], 1)],
)
def test_alias_bomb_does_not_hang_any_command(command, code, capsys):
    assert main(command) == code  # minutes of CPU before the bound
    printed = capsys.readouterr()
    assert BOMB_ERROR in printed.err + printed.out


def test_alias_bomb_in_a_streamed_list_item(tmp_path):
    def item(path):  # a manifest as an entry of a List's items, header comments dropped
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
        return "- " + "\n  ".join(lines) + "\n"

    path = tmp_path / "pods.yaml"
    path.write_text("apiVersion: v1\nkind: List\nitems:\n" + item(POD_FILE) + item(ALIAS_BOMB))
    found = list(iter_snapshot([str(path)], stream_above=0))  # parsed item by item
    assert [d.body["metadata"]["name"] for d in found if isinstance(d, Document)] == \
        ["gpu-operator-test"]
    [error] = [str(e) for e in found if isinstance(e, LoadError)]
    assert error.startswith(f"{path}: document 0: items[1]: invalid YAML at line ")
    assert "alias *c: aliases would add more than 4,700 nodes" in error


def test_recursive_alias_is_refused_and_the_next_document_loads():
    path = EDGE / "recursive-alias.yaml"
    documents, [error] = read_documents([str(path)])
    assert [d.body["metadata"]["name"] for d in documents] == ["fine"]
    assert str(error) == (f"{path}: document 0: invalid YAML at line 9: alias *spec is inside the "
                          "node &spec it names (a recursive structure, which a Kubernetes object "
                          "cannot be)")


def test_alias_bound_is_exact(monkeypatch):
    from policies import sources

    # Written: the map, 'a', the list, x, y, 'b', the list = 7 nodes; each *a adds 3.
    two, three = "a: &a [x, y]\nb: [*a, *a]\n", "a: &a [x, y]\nb: [*a, *a, *a]\n"
    monkeypatch.setattr(sources, "ALIAS_RATIO", 1)
    assert sources.load_yaml(two) == {"a": ["x", "y"], "b": [["x", "y"], ["x", "y"]]}  # adds 6
    with pytest.raises(sources.AliasExpansionError) as raised:
        sources.load_yaml(three)  # adds 9 > 7
    assert (raised.value.problem_mark.line, raised.value.problem_mark.column) == (1, 12)
    assert raised.value.problem.startswith("alias *a: aliases would add more than 7 nodes")
    monkeypatch.setattr(sources, "ALIAS_RATIO", 100)
    monkeypatch.setattr(sources, "MAX_ALIAS_NODES", 5)  # the cap holds whatever the ratio
    with pytest.raises(sources.AliasExpansionError) as raised:
        sources.load_yaml(two)
    assert raised.value.problem_mark.column == 8  # the second *a: 6 > 5


def test_many_small_bombs_cost_linear_time(tmp_path):
    # Each document stays far under 1,000,000 nodes but over 100 per node written: the ratio,
    # not the cap, keeps a file of many small documents linear.
    document = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  a: &a [1,1,1,1,1,1,1,1]\n"
                "  b: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n  c: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n"
                "  d: [*c,*c,*c,*c,*c,*c,*c,*c]\n")
    path = tmp_path / "many.yaml"
    path.write_text("---\n".join([document] * 200))
    documents, errors = read_documents([str(path)])
    assert documents == [] and len(errors) == 200
    assert all("refused as a YAML alias bomb" in str(e) for e in errors)


# --- scalars Python cannot convert ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2026-13-45", "cannot read '2026-13-45' as a timestamp (month must be in 1..12)"),
        ("!!float abc", "cannot read 'abc' as a float (could not convert string to float: 'abc')"),
        ("1" + "0" * 5000, "a number with more than 4300 digits"),  # int() refuses them
    ],
)
def test_unconvertible_yaml_scalars_are_errors_with_a_line(tmp_path, value, problem):
    path = tmp_path / "pod.yaml"
    path.write_text(POD_FILE.read_text() + f"  x: {value}\n---\n" + POD_FILE.read_text())
    documents, [error] = read_documents([str(path)])
    assert len(documents) == 1
    line = POD_FILE.read_text().count("\n") + 1
    assert str(error) == f"{path}: document 0: invalid YAML at line {line}: {problem}"


def test_json_numbers_beyond_python_int_limit(tmp_path):
    path = tmp_path / "node.json"
    node = first("nodes/issue-ndp-1501__h100-80gb-hbm3-x8-no-mig.yaml")
    node["status"]["allocatable"]["nvidia.com/gpu"] = 12345
    node["metadata"]["annotations"] = {HAMI_REGISTER: '[{"count": 1' + "0" * 5000 + "}]"}
    text = json.dumps(node).replace("12345", "1" + "0" * 5000)  # json.dumps cannot write it
    path.write_text(text)
    _, [error] = read_documents([str(path)])
    column = text.rindex("1" + "0" * 5000) + 1  # the number, not the JSON in the annotation
    assert str(error) == (f"{path}: document 0: invalid JSON at line 1 column {column}: a number "
                          "with more than 4300 digits")
    assert node_facts(node).invalid[-1] == \
        f"{HAMI_REGISTER}: invalid JSON: a number with more than 4300 digits"
