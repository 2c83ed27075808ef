"""DCGM exporter metrics: text exposition and Prometheus query results, both label generations."""

from __future__ import annotations

import json

import pytest

from audit.scan.utilization import GPU_UTIL, GR_ENGINE_ACTIVE, MetricsError, read_metrics
from gpuguard.cli import main
from tests.paths import ROOT, TESTS


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_text_exposition_prefers_engine_activity_and_reads_old_labels(tmp_path):
    path = write(tmp_path, "scrape.prom", """# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1",pod="p",namespace="ns",container="c"} 40
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",Hostname="n1",pod="p",namespace="ns",container="c"} 0.25
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",hostname="n2",pod_name="q",pod_namespace="old",container_name="c"} 3
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",hostname="n2"} 1000
""")
    metrics = read_metrics(path)
    by_gpu = {d.uuid: d for d in metrics.devices}
    assert by_gpu["GPU-a"].metric == GR_ENGINE_ACTIVE and by_gpu["GPU-a"].utilization == 0.25
    assert by_gpu["GPU-b"].metric == GPU_UTIL and by_gpu["GPU-b"].utilization == 0.03
    assert by_gpu["GPU-b"].host == "n2" and by_gpu["GPU-b"].pods == (("old", "q"),)
    assert metrics.samples == 3  # FB_USED is not a utilization metric


def test_query_range_matrix_averages_over_the_window(tmp_path):
    result = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": GR_ENGINE_ACTIVE, "gpu": "0", "UUID": "GPU-m", "Hostname": "n",
                    "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2",
                    "modelName": "NVIDIA A100-SXM4-80GB", "pod": "p", "namespace": "ns"},
         "values": [[1700000000, "0.00"], [1700000600, "0.02"], [1700001200, "0.04"]]}]}}
    metrics = read_metrics(write(tmp_path, "q.json", json.dumps(result)))
    (device,) = metrics.devices
    assert device.utilization == pytest.approx(0.02)
    assert (device.instance, device.profile, device.model) == ("2", "3g.40gb", "A100-80GB")
    assert device.gpu_equivalents == pytest.approx(3 / 7)
    assert (metrics.end - metrics.start).total_seconds() == 1200


def test_vector_without_metric_name_is_guessed_with_a_warning(tmp_path):
    result = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"gpu": "0", "UUID": "GPU-v", "Hostname": "n"},
         "value": [1700000000, "37.5"]}]}}
    metrics = read_metrics(write(tmp_path, "v.json", json.dumps(result)))
    assert metrics.devices[0].metric == GPU_UTIL and metrics.devices[0].utilization == 0.375
    assert "without __name__" in metrics.warnings[0]


@pytest.mark.parametrize("text, message", [
    ('{"status": "error", "error": "bad query"}', "the query failed"),
    ("{not json", "invalid JSON at line 1"),
    ('{"data": 3}', "expected a Prometheus query result"),
    ("this is { not prometheus", "not Prometheus text exposition"),
])
def test_unusable_files_raise_one_message(tmp_path, text, message):
    with pytest.raises(MetricsError, match=message):
        read_metrics(write(tmp_path, "m.txt", text))
    with pytest.raises(MetricsError, match="cannot read"):
        read_metrics(str(tmp_path / "missing"))


# --- samples that are not utilizations, pods the snapshot lacks (trial finding 7) ---------------

METRICS_DATA = TESTS / "data" / "metrics"
EXAMPLE = ROOT / "examples" / "cluster"
EXAMPLE_METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"


def audit_json(capsys, *args):
    code = main(["audit", "-f", str(EXAMPLE), *args, "-o", "json", "--jobs", "0"])
    return code, json.loads(capsys.readouterr().out)


def test_the_trials_nan_negative_and_infinite_samples_are_refused_not_clamped():
    # NaN and -5 were clamped to 0 (idle), 1e400 and +Inf to 100 %; every sample of the file is
    # refused now, so nothing can be measured from it.
    path = METRICS_DATA / "trial-weird.prom"
    with pytest.raises(MetricsError) as raised:
        read_metrics(str(path))
    assert str(raised.value) == (
        f"{path}: every {GR_ENGINE_ACTIVE} / {GPU_UTIL} sample is refused, so idle GPUs cannot "
        f"be measured: {GPU_UTIL}{{Hostname=\"gpu-node-h100-01\",gpu=\"0\",UUID=\"GPU-1\","
        "namespace=\"team-llm\",pod=\"x\"}: 1 sample(s) refused (NaN; a utilization is 0 to "
        "100 %): counted neither idle nor busy")


def test_each_refused_sample_is_named_and_counted_neither_idle_nor_busy(tmp_path):
    text = (METRICS_DATA / "trial-weird.prom").read_text() + "\n".join([
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",Hostname="gpu-node-h100-01",pod="x",'
        'namespace="team-llm"} 60',
        'DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-5",Hostname="gpu-node-h100-01",pod="v",'
        'namespace="team-llm"} 150',
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="5",UUID="GPU-6",Hostname="gpu-node-h100-01"} 1.5',
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="6",UUID="GPU-7",Hostname="gpu-node-h100-01"} 1',
        'DCGM_FI_DEV_GPU_UTIL{gpu="7",UUID="GPU-8",Hostname="gpu-node-h100-01"} 100', ""])
    metrics = read_metrics(write(tmp_path, "m.prom", text))
    # GPU-1 keeps its one valid sample (60 %, not the mean with NaN); GPU-2..6 had none left;
    # exactly 100 % and a ratio of 1 are utilizations.
    assert {d.uuid: d.utilization for d in metrics.devices} == {
        "GPU-1": 0.6, "GPU-7": 1.0, "GPU-8": 1.0}
    assert metrics.samples == 3
    source = tmp_path / "m.prom"

    def warning(gpu: str, uuid: str, pod: str, value: str) -> str:
        return (f'{source}: {GPU_UTIL}{{Hostname="gpu-node-h100-01",gpu="{gpu}",UUID="{uuid}",'
                f'namespace="team-llm",pod="{pod}"}}: 1 sample(s) refused ({value}; a '
                "utilization is 0 to 100 %): counted neither idle nor busy")

    # Five series named (1e400 reads as +Inf), then one line for the rest (GPU-6's ratio 1.5).
    assert metrics.warnings == (
        warning("0", "GPU-1", "x", "NaN"), warning("1", "GPU-2", "y", "-5"),
        warning("2", "GPU-3", "z", "+Inf"), warning("3", "GPU-4", "w", "+Inf"),
        warning("4", "GPU-5", "v", "150"),
        f"{source}: 1 more series with refused samples (1 sample(s)); counted neither idle "
        "nor busy")


def test_a_ratio_above_one_is_refused_as_a_ratio(tmp_path):
    metrics = read_metrics(write(tmp_path, "r.prom", "\n".join([
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="5",UUID="GPU-6",Hostname="n"} 1.5',
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="6",UUID="GPU-7",Hostname="n"} 0.5', ""])))
    assert [d.uuid for d in metrics.devices] == ["GPU-7"]
    assert metrics.warnings == (
        f'{tmp_path / "r.prom"}: {GR_ENGINE_ACTIVE}{{Hostname="n",gpu="5",UUID="GPU-6"}}: 1 '
        "sample(s) refused (1.5; a utilization is a ratio from 0 to 1): counted neither idle "
        "nor busy",)


def test_a_query_result_value_that_is_not_a_number_is_refused_with_its_series(tmp_path):
    result = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": GR_ENGINE_ACTIVE, "gpu": "0", "UUID": "GPU-q", "Hostname": "n",
                    "pod": "p", "namespace": "ns"},
         "values": [[1700000000, "0.5"], [1700000600, "NaN"], [1700001200, "oops"],
                    [1700001800, "0.1"], [1700002400, "NaN"]]}]}}
    metrics = read_metrics(write(tmp_path, "q.json", json.dumps(result)))
    (device,) = metrics.devices
    assert device.utilization == pytest.approx(0.3) and device.samples == 2
    assert metrics.warnings == (
        f"{tmp_path / 'q.json'}: {GR_ENGINE_ACTIVE}{{Hostname=\"n\",gpu=\"0\",UUID=\"GPU-q\","
        "namespace=\"ns\",pod=\"p\"}: 3 sample(s) refused (NaN (2 samples), not a number; a "
        "utilization is a ratio from 0 to 1): counted neither idle nor busy",)


def test_the_trials_ghost_pods_are_warned_about_and_not_idle_allocated(capsys):
    # 8 idle GPUs on gpu-node-a100-02 named pods that are not in the snapshot: they were
    # reported as 8 idle allocated GPUs of a node the snapshot shows with none allocated.
    path = METRICS_DATA / "trial-ghost.prom"
    code, report = audit_json(capsys, "--metrics", str(path))
    assert code == 0
    util = report["utilization"]
    assert (util["devices"], util["allocated_devices"], util["idle_allocated_devices"],
            util["idle_allocated_gpu_equivalents"]) == (8, 0, 0, 0.0)
    assert util["nodes"] == [{"node": "gpu-node-a100-02", "devices": 8, "allocated": 0,
                              "idle_allocated": 0, "mean_utilization": 0.0}]
    assert util["teams"] == [] and util["idle_workloads"] == []
    assert report["summary"]["gpu_equivalents"]["idle_allocated"] == 0.0
    assert not any(d["idle"] or d["pods"] for d in util["devices_detail"])
    assert util["devices_detail"][0]["unmatched_pods"] == [{"namespace": "team-vision",
                                                             "pod": "ghost-0"}]
    assert len(util["unmatched_pods"]) == 8
    assert util["warnings"] == [
        f"{path}: 8 pod(s) named by the metrics are not in the snapshot (team-vision/ghost-0, "
        "team-vision/ghost-1, team-vision/ghost-2, team-vision/ghost-3, team-vision/ghost-4 and "
        "3 more): finished since the scrape, or of another cluster; they count for no team or "
        "workload; 8 device(s) used by none of the snapshot's pods (gpu-node-a100-02/gpu 0, "
        "gpu-node-a100-02/gpu 1, gpu-node-a100-02/gpu 2, gpu-node-a100-02/gpu 3, "
        "gpu-node-a100-02/gpu 4 and 3 more) are not counted as allocated or idle"]
    assert util["warnings"][0] in report["warnings"]


def test_ghost_pods_next_to_the_examples_metrics_change_nothing_else(capsys, tmp_path):
    both = tmp_path / "both.prom"
    both.write_text(EXAMPLE_METRICS.read_text() + (METRICS_DATA / "trial-ghost.prom").read_text())
    _, alone = audit_json(capsys, "--metrics", str(EXAMPLE_METRICS))
    _, with_ghosts = audit_json(capsys, "--metrics", str(both))
    for key in ("allocated_devices", "idle_allocated_devices", "idle_allocated_gpu_equivalents",
                "teams", "idle_workloads"):
        assert with_ghosts["utilization"][key] == alone["utilization"][key], key
    assert with_ghosts["utilization"]["devices"] == alone["utilization"]["devices"] + 8
    assert with_ghosts["summary"]["gpu_equivalents"] == alone["summary"]["gpu_equivalents"]


def test_a_gpu_shared_with_a_pod_the_snapshot_lacks_goes_to_the_pod_it_has(capsys, tmp_path):
    # GPU 3 of gpu-node-h100-02 is shared by two research pods; with one of them gone from the
    # snapshot the other holds the whole (idle) GPU, and the gone one counts nowhere.
    metrics = tmp_path / "shared.prom"
    metrics.write_text(EXAMPLE_METRICS.read_text().replace(
        'pod="gpu-sharing-init-container"', 'pod="gone-since-the-scrape"'))
    _, report = audit_json(capsys, "--metrics", str(metrics))
    util = report["utilization"]
    [device] = [d for d in util["devices_detail"] if d["device"] == "gpu-node-h100-02/gpu 3"]
    assert [p["pod"] for p in device["pods"]] == ["raycluster-half-gpu-shared-gpu-worker-q8w7d"]
    assert device["unmatched_pods"] == [{"namespace": "team-research",
                                         "pod": "gone-since-the-scrape"}]
    assert device["idle"] is True
    _, before = audit_json(capsys, "--metrics", str(EXAMPLE_METRICS))

    def ray(util: dict) -> list[tuple[float, float]]:
        return [(w["gpu_equivalents"], w["idle_gpu_equivalents"]) for w in util["idle_workloads"]
                if w["workload"]["kind"] == "RayCluster"]

    # Half of the idle GPU before (the other half the KAI pod's), the whole of it now; the
    # RayCluster's other GPU is busy.
    assert (ray(before["utilization"]), ray(util)) == ([(1.5, 0.5)], [(2.0, 1.0)])
    assert util["idle_allocated_gpu_equivalents"] == \
        before["utilization"]["idle_allocated_gpu_equivalents"]
    assert "1 pod(s) named by the metrics are not in the snapshot (team-research/" \
        "gone-since-the-scrape)" in util["warnings"][0]
    assert "device(s) used by none" not in util["warnings"][0]
