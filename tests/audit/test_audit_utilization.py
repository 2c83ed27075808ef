"""DCGM exporter metrics: text exposition and Prometheus query results, both label generations."""

from __future__ import annotations

import json

import pytest

from audit.scan.utilization import GPU_UTIL, GR_ENGINE_ACTIVE, MetricsError, read_metrics


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
