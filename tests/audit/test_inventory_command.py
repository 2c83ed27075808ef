"""``gpuguard inventory``: JSON and table output from the fake NVML, exit 3 with one line without
NVML, --annotate-node through a stand-in for the kube call, the --interval loop, and
kube.node_annotations' merge patch as the real kubernetes client sends it (no network)."""

import argparse
import io
import json
import sys
from types import SimpleNamespace

import pynvml
import pytest
import yaml
from kubernetes import client as k8s_client

from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import ANNOTATION, summarize, summary_from_json
from gpuguard import inventory_command
from gpuguard.cli import main
from kube.node_annotations import AnnotationError, NodeAnnotator, merge_patch
from tests.builders.inventory_scenario import NOW
from tests.fakes.fake_nvml import FakeNvml, example_machine, t4


def args(*argv):
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    inventory_command.register(commands)
    return parser.parse_args(["inventory", *argv])


class Recorder:
    """Stand-in for the kube call: records (node, annotations); may fail on some calls."""

    def __init__(self, fail_on=()):
        self.calls = []
        self.fail_on = set(fail_on)
        self.kubeconfig = "unset"

    def connect(self, kubeconfig):
        self.kubeconfig = kubeconfig
        return self.annotate

    def annotate(self, node, annotations):
        self.calls.append((node, annotations))
        if len(self.calls) in self.fail_on:
            raise inventory_command.AnnotateError(f"node {node}: 403 nodes \"{node}\" is "
                                                  "forbidden")


def run(argv, fake=None, recorder=None, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    recorder = recorder or Recorder()
    code = inventory_command.run(
        args(*argv), backend_loader=lambda: fake or example_machine(),
        annotator=recorder.connect, now=lambda: NOW, out=out, err=err,
        environ=kwargs.pop("environ", {}), **kwargs)
    return code, out.getvalue(), err.getvalue()


def expected_inventory(node="gpu-node-01"):
    return read_inventory(example_machine(), node=node, now=lambda: NOW)


def test_json_output_is_the_documented_inventory():
    code, out, err = run(["--node", "gpu-node-01"])
    assert (code, err) == (0, "")
    assert json.loads(out) == expected_inventory().to_dict()


def test_node_name_defaults():
    assert json.loads(run([], environ={"NODE_NAME": "from-env"})[1])["node"] == "from-env"
    assert json.loads(run(["--annotate-node", "n1"])[1])["node"] == "n1"


def test_table_output():
    code, out, _ = run(["--node", "gpu-node-01", "-o", "table"])
    assert code == 0
    assert "GPUs on gpu-node-01 (driver 550.54.15, CUDA 12.4, 2026-03-02T10:00:00Z)" in out
    for text in ("NVIDIA A100-SXM4-80GB", "3g.40gb", "0/2", "24217/81920", "lost", "Tesla T4",
                 "GPU 0: nvmlDeviceGetUtilizationRates: NOT_SUPPORTED (Not Supported)",
                 "GPU 2: nvmlDeviceGetUUID: GPU_IS_LOST (GPU is lost)",
                 "GPU 3: nvmlDeviceGetMigMode: NOT_SUPPORTED"):
        assert text in out, text


def test_no_nvml_exits_3_with_one_line():
    code, out, err = run([], fake=FakeNvml([t4()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert (code, out) == (3, "")
    assert err == ("gpuguard inventory: error: NVML is not available (LIBRARY_NOT_FOUND: NVML "
                   "Shared Library Not Found): libnvidia-ml.so.1 is not on this machine: no "
                   "NVIDIA driver, or a container started without the NVIDIA runtime "
                   "(runtimeClassName: nvidia)\n")


def test_cli_without_the_binding_exits_3(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert main(["inventory"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("gpuguard inventory: error: NVML is not available: the "
                                   "nvidia-ml-py package cannot be imported")


def test_cli_on_this_machine_without_a_gpu_exits_3(capsys):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        reason = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML: the no-NVML path is covered by the fakes")
    assert main(["inventory", "-o", "table"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("gpuguard inventory: error: NVML is not available (")
    assert reason in captured.err


def test_annotate_node_writes_the_summary():
    recorder = Recorder()
    code, out, err = run(["--annotate-node", "gpu-node-01", "--kubeconfig", "kc"],
                         recorder=recorder)
    assert code == 0
    assert recorder.kubeconfig == "kc"
    [(node, annotations)] = recorder.calls
    assert node == "gpu-node-01" and list(annotations) == [ANNOTATION]
    value = annotations[ANNOTATION]
    assert value == summarize(expected_inventory()).to_json()
    assert summary_from_json(value).node == "gpu-node-01"
    assert json.loads(out)["node"] == "gpu-node-01"  # the inventory is still printed
    assert err == (f"gpuguard inventory: annotated node gpu-node-01: {ANNOTATION} (4 GPUs, "
                   f"{len(value)} bytes)\n")


def test_annotate_failure_exits_2():
    code, _, err = run(["--annotate-node", "n1"], recorder=Recorder(fail_on={1}))
    assert code == 2
    assert err == 'gpuguard inventory: error: cannot annotate node n1: 403 nodes "n1" is ' \
                  'forbidden\n'


def test_no_cluster_exits_2():
    def no_cluster(kubeconfig):
        raise inventory_command.AnnotateError("no cluster configured for --annotate-node: …")

    err = io.StringIO()
    code = inventory_command.run(args("--annotate-node", "n1"),
                                 backend_loader=example_machine, annotator=no_cluster,
                                 out=io.StringIO(), err=err, environ={})
    assert code == 2
    assert err.getvalue() == ("gpuguard inventory: error: no cluster configured for "
                              "--annotate-node: …\n")


def test_interval_loop_annotates_each_round_and_survives_a_failure():
    recorder = Recorder(fail_on={2})
    sleeps = []
    code, out, err = run(["--annotate-node", "n1", "--interval", "300"], recorder=recorder,
                         sleep=sleeps.append, rounds=3)
    assert code == 0
    assert len(recorder.calls) == 3 and sleeps == [300.0, 300.0]
    assert out.splitlines() == [
        f"2026-03-02T10:00:00Z annotated node n1: 4 GPUs (1 not ok), "
        f"{len(recorder.calls[0][1][ANNOTATION])} bytes"] * 2
    assert err == ('2026-03-02T10:00:00Z gpuguard inventory: error: cannot annotate node n1: '
                   '403 nodes "n1" is forbidden (retrying in 300s)\n')


def test_interval_without_annotation_prints_json_lines():
    code, out, _ = run(["--interval", "60", "--node", "gpu-node-01"], sleep=lambda s: None,
                       rounds=2)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert json.loads(lines[0]) == expected_inventory().to_dict()


def test_interval_loop_without_nvml_exits_3_at_once():
    sleeps = []
    code, _, err = run(["--annotate-node", "n1", "--interval", "60"], sleep=sleeps.append,
                       fake=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
                       rounds=5)
    assert code == 3 and sleeps == [] and err.count("\n") == 1


@pytest.mark.parametrize("value", ["5", "abc", "100000"])
def test_interval_bounds(value, capsys):
    assert main(["inventory", "--interval", value]) == 2
    assert "--interval" in capsys.readouterr().err


# -- kube.node_annotations -------------------------------------------------------------------


class FakePool:
    """Replaces urllib3's pool manager inside a real kubernetes ApiClient."""

    def __init__(self, status=200, body=b'{"kind": "Node"}'):
        self.requests = []
        self.status = status
        self.body = body

    def request(self, method, url, **kwargs):
        self.requests.append({"method": method, "url": url, **kwargs})
        return SimpleNamespace(status=self.status, reason="x", data=self.body, headers={})


def real_client(pool):
    configuration = k8s_client.Configuration(host="https://kube.example:6443")
    configuration.api_key = {"BearerToken": "t0ken"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    api = k8s_client.ApiClient(configuration)
    api.rest_client.pool_manager = pool
    return api


def test_annotator_sends_one_json_merge_patch():
    pool = FakePool()
    NodeAnnotator(real_client(pool)).annotate("gpu-node-01", {ANNOTATION: '{"kind":"x"}'})
    [request] = pool.requests
    assert request["method"] == "PATCH"
    assert request["url"] == "https://kube.example:6443/api/v1/nodes/gpu-node-01"
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(request["body"]) == {
        "metadata": {"annotations": {ANNOTATION: '{"kind":"x"}'}}}


def test_annotator_quotes_the_node_name():
    pool = FakePool()
    NodeAnnotator(real_client(pool)).annotate("a/b", {ANNOTATION: None})
    assert pool.requests[0]["url"].endswith("/api/v1/nodes/a%2Fb")
    assert json.loads(pool.requests[0]["body"]) == merge_patch({ANNOTATION: None})


def test_annotator_refusal_is_one_line():
    pool = FakePool(status=403, body=json.dumps({
        "kind": "Status", "message": 'nodes "n1" is forbidden: User "system:serviceaccount:x:y" '
        'cannot patch resource "nodes"'}).encode())
    with pytest.raises(AnnotationError) as caught:
        NodeAnnotator(real_client(pool)).annotate("n1", {ANNOTATION: "{}"})
    assert str(caught.value).startswith('node n1: 403 nodes "n1" is forbidden: User')
    assert "\n" not in str(caught.value)


def test_annotator_network_failure_is_one_line():
    class Broken:
        def request(self, *a, **k):
            raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(AnnotationError, match=r"^node n1: ConnectionRefusedError: "):
        NodeAnnotator(real_client(Broken())).annotate("n1", {ANNOTATION: "{}"})


def test_connect_annotator_without_a_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(inventory_command.AnnotateError, match=r"^no cluster configured"):
        inventory_command.connect_annotator(None)
    with pytest.raises(inventory_command.AnnotateError, match=r"kubeconfig .*: no such file"):
        inventory_command.connect_annotator(str(tmp_path / "missing"))


def test_connect_annotator_reports_an_unreachable_api_server(tmp_path, closed_port):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{closed_port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    annotate = inventory_command.connect_annotator(str(kubeconfig))
    with pytest.raises(inventory_command.AnnotateError, match=r"^node n1: \w+"):
        annotate("n1", {ANNOTATION: "{}"})
