"""Hostile and malformed input (found by trying gpuguard as a new user would): every case gets a
clear message naming where, nothing valid is lost, and nothing raises."""

import gzip
import io
import json
import os

import pytest

from gpuguard.cli import main
from policies.nodes import node_facts
from policies.sources import read_documents
from policies.workloads import claim_templates_of, workload_facts
from tests.corpus import DATA, first

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
        (lambda p: p.__setitem__("spec", "string"), "spec: expected a map, got str"),
        (lambda p: p["spec"]["containers"][0].__setitem__("resources", [1]),
         "spec.containers[0].resources: expected a map, got list"),
        (lambda p: p["spec"]["containers"][0]["resources"].__setitem__("limits", "nvidia.com/gpu=1"),
         "spec.containers[0].resources.limits: expected a map, got str"),
        (lambda p: p["spec"].__setitem__("nodeSelector", ["a"]),
         "spec.nodeSelector: expected a map, got list"),
        (lambda p: p["spec"].__setitem__("affinity", "x"), "spec.affinity: expected a map, got str"),
        (lambda p: p["metadata"].__setitem__("annotations", ["a"]),
         "metadata.annotations: expected a map, got list"),
        (lambda p: p["spec"]["containers"][0].__setitem__("env", {"a": 1}),
         "spec.containers[0].env: expected a list, got dict"),
        (lambda p: p["metadata"].__setitem__("name", ["a"]),
         "metadata.name: expected a string, got list"),
        (lambda p: p["metadata"].__setitem__("annotations", {"gpu-fraction": 0.5}),
         "metadata.annotations[gpu-fraction]: annotation values must be strings, got float 0.5"),
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
         "spec.template: expected a pod template map, got str"),
        ("manifests/ndp__e2e-job-nbody.yaml",
         lambda j: j["spec"]["template"].__setitem__("spec", [1]),
         "spec.template.spec: expected a map, got list"),
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
        "metadata.labels[nvidia.com/mig.strategy]: expected a string, got list; ignored",
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
    _, [error] = read_documents(["/dev/null"])
    assert str(error) == "/dev/null: not a regular file or directory"


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


def test_a_kind_that_is_not_a_string_is_invalid_not_a_crash():
    facts = workload_facts({"apiVersion": "v1", "kind": ["Pod"],
                            "spec": {"containers": [{"name": "c"}]}})
    assert facts is not None and "kind: expected a string, got list" in facts.total.invalid
