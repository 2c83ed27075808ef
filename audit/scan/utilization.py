"""GPU utilization from DCGM exporter metrics, and the allocated-but-idle GPUs it reveals.

Owns reading two inputs, both from NVIDIA's dcgm-exporter (``shared/reference/gpu-domain.md``
section 7):

- the Prometheus **text exposition** the exporter serves on ``:9400/metrics`` (one or more scrapes
  saved to a file), parsed with ``prometheus_client``'s text parser;
- a **Prometheus HTTP API query result** (``/api/v1/query`` or ``/api/v1/query_range`` JSON:
  ``vector`` or ``matrix``), e.g. ``DCGM_FI_PROF_GR_ENGINE_ACTIVE[24h]``.

Metrics used: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0-1; works per MIG instance; preferred)
and ``DCGM_FI_DEV_GPU_UTIL`` (percent; not produced for MIG instances). Label names of both
exporter generations are read: ``pod`` / ``namespace`` / ``container`` and ``pod_name`` /
``pod_namespace`` / ``container_name``; ``Hostname`` and ``hostname``; MIG series carry
``GPU_I_PROFILE`` and ``GPU_I_ID``. A device (host, GPU, GPU instance) is *allocated* when a series
names a pod, and *idle* when its mean utilization over the window is below the threshold; its
GPU-equivalents (1, or the MIG profile's share) are split between the pods using it.

Never counted, each with a warning in ``utilization.warnings``: a sample that is not a
utilization (NaN, infinite, negative, above 100 % / a ratio above 1, or not a number in a query
result) — it is neither idle nor busy, and a device with no other sample is left out — and, in the
report, a pod the metrics name that is not in the snapshot (finished since the scrape, or another
cluster's): a device with no pod of the snapshot is not allocated, and one shared with pods of the
snapshot is split between those alone.

Must not read the cluster or evaluate policies; the file is read whole (a scrape is small).
"""

from __future__ import annotations

import datetime
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from audit.scan.ownership import namespace_order
from policies.facts import mig
from policies.sources import load_json

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_METRICS = {GR_ENGINE_ACTIVE: 1.0, GPU_UTIL: 100.0}  # name -> divisor giving a 0-1 ratio
#: How many series, devices or pods a warning names before "and N more".
_EXAMPLES = 5
# Labels that tell a series apart, in the order a warning prints them (the exporter's names).
_IDENTITY = ("Hostname", "hostname", "node", "kubernetes_node", "gpu", "UUID", "uuid", "GPU_I_ID",
             "namespace", "pod_namespace", "pod", "pod_name")
_LABELS = {
    "pod": ("pod", "pod_name"),
    "namespace": ("namespace", "pod_namespace"),
    "container": ("container", "container_name"),
    "host": ("Hostname", "hostname", "node", "kubernetes_node"),
}


class MetricsError(ValueError):
    """A metrics file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Device:
    """One GPU or MIG instance seen in the metrics, with its mean utilization over the window.

    ``utilization`` is a ratio (0-1); ``pods`` the ``(namespace, pod)`` pairs using it;
    ``gpu_equivalents`` 1 for a GPU, the profile's share for a MIG instance.
    """

    host: str | None
    gpu: str | None
    uuid: str | None
    instance: str | None
    profile: str | None
    model: str | None
    metric: str
    utilization: float
    samples: int
    pods: tuple[tuple[str | None, str], ...]
    gpu_equivalents: Fraction

    @property
    def label(self) -> str:
        """``host/gpu N`` (``/mig ID (profile)`` for an instance), for reports."""
        text = f"{self.host or '?'}/gpu {self.gpu if self.gpu is not None else self.uuid}"
        if self.instance is not None:
            text += f"/mig {self.instance} ({self.profile})"
        return text


@dataclass(frozen=True)
class Metrics:
    """The devices of one metrics file and the time window its samples cover (UTC)."""

    source: str
    devices: tuple[Device, ...]
    start: datetime.datetime | None
    end: datetime.datetime | None
    samples: int
    warnings: tuple[str, ...]


def _label(labels: Mapping[str, str], field: str) -> str | None:
    for name in _LABELS[field]:
        value = labels.get(name)
        if value:
            return value
    return None


class _Series:
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0


_Sample = tuple[str, dict[str, str], float | None, float | None]
"""(metric name, labels, value — None when a query result's value is not a number —, timestamp
in seconds since the epoch or None)."""


#: What a utilization is, per metric (the exporter's units, shared/reference/gpu-domain.md
#: section 7), for the warning about a sample that is not one.
_RANGES = {GR_ENGINE_ACTIVE: "a ratio from 0 to 1", GPU_UTIL: "0 to 100 %"}


def _refusal(name: str, value: float | None) -> str | None:
    """The value of a sample of ``name`` that is not a utilization, as a warning prints it
    (``NaN``, ``+Inf``, ``-5``, ``not a number``), or None when it is one: a finite number from
    0 to 100 for DCGM_FI_DEV_GPU_UTIL, from 0 to 1 for DCGM_FI_PROF_GR_ENGINE_ACTIVE."""
    if value is None:
        return "not a number"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if not 0.0 <= value <= _METRICS[name]:
        return f"{value:g}"
    return None


def _series_name(name: str, labels: Mapping[str, str]) -> str:
    """``NAME{label="value",...}`` with the labels that identify the series."""
    shown = ",".join(f'{k}="{labels[k]}"' for k in _IDENTITY if labels.get(k))
    return f"{name}{{{shown}}}"


def _more(shown: list[str], total: int) -> str:
    return ", ".join(shown) + (f" and {total - len(shown)} more" if total > len(shown) else "")


def _text_samples(text: str, source: str) -> list[_Sample]:
    try:
        return [(sample.name, dict(sample.labels), float(sample.value),
                 None if sample.timestamp is None else float(sample.timestamp))
                for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name in _METRICS]
    except ValueError as exc:
        raise MetricsError(f"{source}: not Prometheus text exposition: {exc}") from None


def _query_samples(data: Any, source: str, warnings: list[str]) -> list[_Sample]:
    if isinstance(data, Mapping) and data.get("status") not in (None, "success"):
        raise MetricsError(f"{source}: the query failed: {data.get('error') or data}")
    if isinstance(data, Mapping) and "data" in data:
        data = data["data"]
    if isinstance(data, Mapping):
        data = data.get("result")
    if not isinstance(data, list):
        raise MetricsError(f"{source}: expected a Prometheus query result "
                           "({status, data: {resultType, result}})")
    found: list[_Sample] = []
    unnamed = 0
    for series in data:
        if not isinstance(series, Mapping) or not isinstance(series.get("metric"), Mapping):
            continue
        labels = {str(k): str(v) for k, v in series["metric"].items()}
        range_points, instant_point = series.get("values"), series.get("value")
        points: list[Any] = range_points if isinstance(range_points, list) else \
            [instant_point] if isinstance(instant_point, list) else []
        values: list[tuple[float | None, float | None]] = []
        for point in points:
            try:
                values.append((float(point[1]), float(point[0])))
            except (TypeError, ValueError, IndexError):
                values.append((None, None))  # refused, with a warning naming the series
        name = labels.pop("__name__", None)
        if name is None:
            unnamed += 1
            name = GPU_UTIL if any(v is not None and v > 1.0 for v, _ in values) \
                else GR_ENGINE_ACTIVE
        if name not in _METRICS:
            continue
        found += [(name, labels, value, stamp) for value, stamp in values]
    if unnamed:
        warnings.append(f"{source}: {unnamed} series without __name__ (avg_over_time drops "
                        "it): read as DCGM_FI_DEV_GPU_UTIL when a value exceeds 1, else as "
                        "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    return found


def read_metrics(path: str) -> Metrics:
    """Read a DCGM exporter scrape or a Prometheus query result (see module docstring).

    Raises:
        MetricsError: the file cannot be read, is neither format, or holds no
            ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` / ``DCGM_FI_DEV_GPU_UTIL`` sample (an empty file, a
            query that matched nothing): idle GPUs cannot be measured from it, and reporting
            none would read as "no GPU is idle".
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise MetricsError(f"{path}: cannot read: {reason}") from None
    warnings: list[str] = []
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = load_json(text)
        except json.JSONDecodeError as exc:
            raise MetricsError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
        samples = _query_samples(data, path, warnings)
    else:
        samples = _text_samples(text, path)
    if not samples:
        what = "the file is empty" if not stripped else "none of its samples is one"
        raise MetricsError(f"{path}: no {GR_ENGINE_ACTIVE} or {GPU_UTIL} sample ({what}); "
                           "expected a dcgm-exporter scrape (Prometheus text) or a Prometheus "
                           "query result holding them")
    before = len(warnings)
    usable = _usable(path, samples, warnings)
    if not usable:
        raise MetricsError(f"{path}: every {GR_ENGINE_ACTIVE} / {GPU_UTIL} sample is refused, "
                           "so idle GPUs cannot be measured: "
                           f"{warnings[before].removeprefix(f'{path}: ')}")
    return _devices(path, usable, warnings)


def _usable(source: str, samples: list[_Sample], warnings: list[str]) -> list[_Sample]:
    """The samples that are utilizations; one warning per series with refused samples (the
    first ``_EXAMPLES`` series, then one line for the rest)."""
    usable: list[_Sample] = []
    refused: dict[tuple[str, str], dict[str, int]] = {}  # (metric, series) -> value -> samples
    for sample in samples:
        name, labels, value, _ = sample
        reason = _refusal(name, value)
        if reason is None:
            usable.append(sample)
        else:
            values = refused.setdefault((name, _series_name(name, labels)), {})
            values[reason] = values.get(reason, 0) + 1
    for (name, series), values in list(refused.items())[:_EXAMPLES]:
        shown = ", ".join(f"{value} ({count} samples)" if count > 1 else value
                          for value, count in values.items())
        warnings.append(f"{source}: {series}: {sum(values.values())} sample(s) refused ({shown}; "
                        f"a utilization is {_RANGES[name]}): counted neither idle nor busy")
    if len(refused) > _EXAMPLES:
        rest = list(refused.values())[_EXAMPLES:]
        warnings.append(f"{source}: {len(rest)} more series with refused samples "
                        f"({sum(sum(r.values()) for r in rest)} sample(s)); counted neither idle "
                        "nor busy")
    return usable


def _devices(source: str, samples: list[_Sample], warnings: list[str]) -> Metrics:
    # device identity -> metric -> series; pods per device
    series: dict[tuple[Any, ...], dict[str, _Series]] = defaultdict(dict)
    pods: dict[tuple[Any, ...], set[tuple[str | None, str]]] = defaultdict(set)
    details: dict[tuple[Any, ...], tuple[str | None, str | None]] = {}
    stamps = [s for *_, s in samples if s is not None]
    for name, labels, value, _ in samples:
        host = _label(labels, "host")
        identity = (host, labels.get("gpu"), labels.get("UUID") or labels.get("uuid"),
                    labels.get("GPU_I_ID"))
        details.setdefault(identity, (labels.get("GPU_I_PROFILE"), labels.get("modelName")))
        entry = series[identity].setdefault(name, _Series())
        assert value is not None  # _usable refused the others
        entry.total += value / _METRICS[name]
        entry.count += 1
        pod = _label(labels, "pod")
        if pod:
            pods[identity].add((_label(labels, "namespace"), pod))
    devices = []
    for identity in sorted(series, key=lambda i: tuple(str(p) for p in i)):
        metric = GR_ENGINE_ACTIVE if GR_ENGINE_ACTIVE in series[identity] else GPU_UTIL
        chosen = series[identity][metric]
        profile, model_name = details[identity]
        host, gpu, uuid, instance = identity
        model = mig.model_from_name(model_name) if model_name else None
        share = Fraction(1)
        if instance is not None and profile:
            share = mig.equivalents(profile, model)[0]
        devices.append(Device(
            host=host, gpu=gpu, uuid=uuid, instance=instance, profile=profile, model=model,
            metric=metric, utilization=min(1.0, max(0.0, chosen.total / chosen.count)),
            samples=chosen.count, pods=tuple(sorted(pods.get(identity, ()),
                                                    key=lambda p: (namespace_order(p[0]), p[1]))),
            gpu_equivalents=share))
    start = end = None
    if stamps:
        start = datetime.datetime.fromtimestamp(min(stamps), datetime.UTC)
        end = datetime.datetime.fromtimestamp(max(stamps), datetime.UTC)
    return Metrics(source, tuple(devices), start, end, len(samples), tuple(warnings))


def utilization_report(metrics: Metrics, threshold: float,
                       pods: Mapping[tuple[str | None, str], tuple[Any, str | None]],
                       workload_of: Any, team_of_namespace: Any) -> dict[str, Any]:
    """The ``utilization`` section of the report (see docs/audit-report.md).

    A device is allocated when a pod of the snapshot uses it, its GPU-equivalents split between
    those pods; pods the metrics name that the snapshot does not have are listed in
    ``unmatched_pods`` and in one warning (count and examples), and count nowhere — not as
    allocated, idle, a team's or a workload's.

    Args:
        metrics: the devices read by :func:`read_metrics`.
        threshold: utilization ratio below which an allocated device is idle.
        pods: ``(namespace, pod)`` → (owner key, node) for the pods of the snapshot named in the
            metrics.
        workload_of: owner key → workload key (:meth:`audit.scan.ownership.Ownership.root`).
        team_of_namespace: namespace → team (None when unlabelled).
    """
    by_node: dict[str, dict[str, Any]] = {}
    by_team: dict[str | None, dict[str, Any]] = {}
    by_workload: dict[Any, dict[str, Any]] = {}
    unmatched: set[tuple[str | None, str]] = set()
    unmatched_devices: list[Device] = []
    known: dict[Device, tuple[tuple[str | None, str], ...]] = {}  # device -> its snapshot pods
    allocated = idle = 0
    idle_eq = Fraction(0)
    allocated_total = 0.0
    for device in metrics.devices:
        node = by_node.setdefault(device.host or "?", {
            "node": device.host, "devices": 0, "allocated": 0, "idle_allocated": 0,
            "utilization_sum": 0.0})
        node["devices"] += 1
        node["utilization_sum"] += device.utilization
        users = known[device] = tuple(p for p in device.pods if p in pods)
        unmatched.update(p for p in device.pods if p not in pods)
        if device.pods and not users:
            unmatched_devices.append(device)
        if not users:
            continue
        allocated += 1
        node["allocated"] += 1
        allocated_total += device.utilization
        is_idle = device.utilization < threshold
        if is_idle:
            idle += 1
            node["idle_allocated"] += 1
            idle_eq += device.gpu_equivalents
        share = device.gpu_equivalents / len(users)
        for namespace, pod in users:
            workload = workload_of(pods[(namespace, pod)][0])
            ref = {"kind": workload.kind, "group": workload.group,
                   "namespace": workload.namespace, "name": workload.name}
            team = team_of_namespace(namespace)
            team_entry = by_team.setdefault(team, {"team": team, "devices": 0,
                                                   "idle_devices": 0,
                                                   "idle_gpu_equivalents": Fraction(0),
                                                   "utilization_sum": 0.0})
            team_entry["devices"] += 1
            team_entry["utilization_sum"] += device.utilization
            entry = by_workload.setdefault(workload, {
                "workload": ref, "team": team, "devices": 0, "idle_devices": 0,
                "gpu_equivalents": Fraction(0), "idle_gpu_equivalents": Fraction(0),
                "utilization_sum": 0.0})
            entry["devices"] += 1
            entry["gpu_equivalents"] += share
            entry["utilization_sum"] += device.utilization
            if is_idle:
                team_entry["idle_devices"] += 1
                team_entry["idle_gpu_equivalents"] += share
                entry["idle_devices"] += 1
                entry["idle_gpu_equivalents"] += share

    def mean(total: float, count: int) -> float | None:
        return round(total / count, 4) if count else None

    order = sorted(unmatched, key=lambda x: (namespace_order(x[0]), x[1]))
    warnings = list(metrics.warnings)
    if unmatched:
        named = [f"{ns}/{p}" if ns else p for ns, p in order[:_EXAMPLES]]
        devices = [d.label for d in unmatched_devices[:_EXAMPLES]]
        left_out = (f"; {len(unmatched_devices)} device(s) used by none of the snapshot's pods "
                    f"({_more(devices, len(unmatched_devices))}) are not counted as allocated "
                    "or idle") if unmatched_devices else ""
        warnings.append(
            f"{metrics.source}: {len(unmatched)} pod(s) named by the metrics are not in the "
            f"snapshot ({_more(named, len(unmatched))}): finished since the scrape, or of "
            f"another cluster; they count for no team or workload{left_out}")

    return {
        "source": metrics.source,
        "metric": sorted({d.metric for d in metrics.devices}),
        "window": {"start": metrics.start.isoformat() if metrics.start else None,
                   "end": metrics.end.isoformat() if metrics.end else None,
                   "samples": metrics.samples},
        "idle_below": threshold,
        "devices": len(metrics.devices),
        "allocated_devices": allocated,
        "idle_allocated_devices": idle,
        "idle_allocated_gpu_equivalents": round(float(idle_eq), 6),
        "mean_utilization_allocated": mean(allocated_total, allocated),
        "nodes": [{"node": n["node"], "devices": n["devices"], "allocated": n["allocated"],
                   "idle_allocated": n["idle_allocated"],
                   "mean_utilization": mean(n["utilization_sum"], n["devices"])}
                  for n in sorted(by_node.values(),
                                  key=lambda n: (n["node"] is None, n["node"] or ""))],
        "teams": [{"team": t["team"], "devices": t["devices"], "idle_devices": t["idle_devices"],
                   "idle_gpu_equivalents": round(float(t["idle_gpu_equivalents"]), 6),
                   "mean_utilization": mean(t["utilization_sum"], t["devices"])}
                  for t in sorted(by_team.values(),
                                  key=lambda t: (t["team"] is None, t["team"] or ""))],
        "idle_workloads": sorted(
            ({"workload": w["workload"], "team": w["team"], "devices": w["devices"],
              "idle_devices": w["idle_devices"],
              "gpu_equivalents": round(float(w["gpu_equivalents"]), 6),
              "idle_gpu_equivalents": round(float(w["idle_gpu_equivalents"]), 6),
              "mean_utilization": mean(w["utilization_sum"], w["devices"])}
             for w in by_workload.values() if w["idle_devices"]),
            key=lambda w: (-w["idle_gpu_equivalents"], namespace_order(w["workload"]["namespace"]),
                           w["workload"]["kind"], w["workload"]["name"])),
        "devices_detail": [{"device": d.label, "node": d.host, "gpu": d.gpu, "uuid": d.uuid,
                            "mig_instance": d.instance, "mig_profile": d.profile,
                            "metric": d.metric, "utilization": round(d.utilization, 4),
                            "samples": d.samples, "gpu_equivalents": round(
                                float(d.gpu_equivalents), 6),
                            "pods": [{"namespace": ns, "pod": p, "team": team_of_namespace(ns)}
                                     for ns, p in known[d]],
                            "unmatched_pods": [{"namespace": ns, "pod": p} for ns, p in d.pods
                                               if (ns, p) not in pods],
                            "idle": bool(known[d]) and d.utilization < threshold}
                           for d in metrics.devices],
        "unmatched_pods": [{"namespace": ns, "pod": p} for ns, p in order],
        "warnings": warnings,
    }
