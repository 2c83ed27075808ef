"""The report as titled tables of text, shared by the terminal, Markdown and HTML renderers.

Owns which figures each human-readable output shows and how they are worded (so the three agree):
summary, changes since the previous run, nodes, teams, GPU quotas, fragmentation, stranded GPUs,
MIG, pending GPU pods, idle GPUs, their cost (``--prices``), findings by policy, findings,
exceptions, warnings and errors. Cells are plain text (renderers escape them). ``limit`` cuts long
tables; the cut is stated in the table's ``more``.

Must not print or escape for a medium.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextTable:
    """One section: ``title``, column names, rows of text cells, a note, rows left out."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""
    more: int = 0


def number(value: float | None, unknown: str = "?") -> str:
    """A GPU-equivalent (or other) figure as a person reads it: 2 decimals below 10, 1 from 10
    on, no trailing zeros (``0.14``, ``4.14``, ``72.1``, ``8``); a non-zero figure that would
    round to 0 is ``<0.01``. The JSON report keeps the exact figures (6 places)."""
    if value is None:
        return unknown
    text = f"{value:.{1 if abs(value) >= 10 else 2}f}".rstrip("0").rstrip(".")
    if text in ("0", "-0", "") and value:
        return "<0.01" if value > 0 else "-<0.01"
    return "0" if text in ("-0", "") else text


def moment(value: str | None, unknown: str = "-") -> str:
    """An ISO 8601 time of the report (``2026-12-02T01:20:15.031985+00:00``) as a person reads
    it, in UTC to the minute: ``2 Dec 2026, 01:20 UTC``. A time without a zone is taken as UTC;
    text that is no ISO time is returned as it is."""
    if not value:
        return unknown
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return f"{when.day} {when:%b %Y, %H:%M} UTC"


def ref_text(ref: Mapping[str, Any] | None) -> str:
    """``Kind/namespace/name``."""
    if not ref:
        return "-"
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    return f"{ref['kind']}/{where}{ref['name']}"


def _counts(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items() if v) or "-"


def _table(key: str, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
           limit: int | None, note: str = "") -> TextTable:
    shown = rows if limit is None else rows[:limit]
    return TextTable(key, title, tuple(columns), tuple(tuple(r) for r in shown), note,
                     len(rows) - len(shown))


def _summary(report: Mapping[str, Any]) -> TextTable:
    s = report["summary"]
    eq = s["gpu_equivalents"]
    whole = s["whole_gpus"]
    findings = s["findings"]
    share = eq.get("allocated_share")
    rows = [
        ("nodes", f"{s['nodes']} ({s['gpu_nodes']} with GPUs)"),
        ("physical GPUs", f"{s['physical_gpus']['known']}"
         + (f" (+ {s['physical_gpus']['nodes_unknown']} node(s) that do not say)"
            if s["physical_gpus"]["nodes_unknown"] else "")),
        ("GPU-equivalents", f"{number(eq['allocatable'])} allocatable, "
         f"{number(eq['allocated'])} allocated"
         + (f" ({share:.0%})" if share is not None else "")
         + f", {number(eq['free'])} free, {number(eq['stranded'])} stranded "
         f"({_stranded_split(s, 'gpu_equivalents')})" + _on_missing(s)),
        ("pending demand", f"{s['gpu_pods']['pending']} GPU pod(s), "
         f"{number(eq['pending'])} GPU-equivalents"),
        ("idle allocated", "no metrics" if eq["idle_allocated"] is None
         else f"{number(eq['idle_allocated'])} GPU-equivalents"),
        ("whole GPUs", f"{whole['allocatable']} allocatable, {whole['allocated']} allocated, "
         f"{whole['free']} free, {whole['stranded']} stranded "
         f"({_stranded_split(s, 'whole_gpus')})"),
        ("pods", f"{s['pods']} ({s['gpu_pods']['running']} GPU pods running, "
         f"{s['gpu_pods']['pending']} pending; {s['finished_pods']} finished, not counted)"),
        ("workloads", f"{s['workloads']} ({s['gpu_workloads']} with GPUs, "
         f"{s['evaluated_workloads']} evaluated)"),
        ("findings", f"{findings['deny']} deny, {findings['warn']} warn, "
         f"{findings['audit']} audit, {findings['error']} error, {findings['info']} info; "
         f"{s['exceptions']} exception(s)"),
        *([("GPU quotas", f"over: {', '.join(s['quotas']['over']) or 'none'}; at 90 % or "
            f"more: {', '.join(s['quotas']['near']) or 'none'}")]
          if s.get("quotas") and (s["quotas"]["over"] or s["quotas"]["near"]) else []),
        ("problems", f"{s['stranded_nodes']} node(s) with stranded GPUs, "
         f"{s['errors']} input error(s), {s['warnings']} warning(s)"),
    ]
    return TextTable("summary", "Summary", ("", ""), tuple(rows))


def _on_missing(summary: Mapping[str, Any]) -> str:
    """``; + 5 allocated on 1 node(s) missing from the snapshot`` (``on_missing_nodes``), or
    nothing when every bound pod's node is in the snapshot."""
    missing = summary.get("on_missing_nodes") or {}
    if not missing.get("pods"):
        return ""
    unknown = f" + {missing['unknown_pods']} pod(s) of unknown size" \
        if missing["unknown_pods"] else ""
    return (f"; + {number(missing['gpu_equivalents'])} allocated{unknown} to {missing['pods']} "
            f"pod(s) on {missing['nodes']} node(s) missing from the snapshot")


def _stranded_split(summary: Mapping[str, Any], unit: str) -> str:
    """``16 on cordoned/NotReady nodes, 10 on in-service nodes`` from ``stranded_by_cause``."""
    causes = summary["stranded_by_cause"]
    return (f"{number(causes['node_unavailable'][unit])} on {UNAVAILABLE}, "
            f"{number(causes['in_service'][unit])} on {IN_SERVICE}")


#: How the two causes of stranded GPUs are named in every human-readable output.
UNAVAILABLE = "cordoned/NotReady nodes"
IN_SERVICE = "in-service nodes"


def _changes(report: Mapping[str, Any], limit: int | None) -> list[TextTable]:
    changes = report.get("changes")
    if not changes:
        return []
    note = f"since run {changes['previous_run']['id']} at {moment(changes['previous_run']['at'])}"
    policy_set = changes.get("policy_set") or {}
    if policy_set.get("changed"):
        added, gone = policy_set.get("policies_added"), policy_set.get("policies_removed")
        note += "; the policy set changed" + (
            f" ({len(added)} polic(ies) added, {len(gone)} removed)"
            if added is not None and gone is not None else "")
    rows = [("new", f["severity"], f["policy"], f["workload"], f["message"])
            for f in changes["new_findings"]]
    rows += [("fixed", f["severity"], f["policy"], f["workload"], f["message"])
             for f in changes["fixed_findings"]]
    removed = changes.get("policy_removed_findings", [])
    rows += [("policy removed", f["severity"], f["policy"], f["workload"], f["message"])
             for f in removed]
    rule_removed = changes.get("rule_removed_findings", [])
    rows += [("rule removed", f["severity"], f["policy"], f["workload"], f["message"])
             for f in rule_removed]
    policy_changed = changes.get("policy_changed_findings", [])
    rows += [("policy changed", f["severity"], f["policy"], f["workload"], f["message"])
             for f in policy_changed]
    trends = [(t["scope"], str(t["name"]) if t["name"] is not None else
               ("cluster" if t["scope"] == "cluster" else "(no team)"),
               number(t["allocated_before"], "-"), number(t["allocated"], "-"),
               _signed(t["allocated_change"]), number(t["idle_before"], "-"),
               number(t["idle"], "-"), _signed(t["idle_change"]))
              for t in changes["trends"]]
    return [
        _table("changes", "Findings since the previous run",
               ("change", "severity", "policy", "workload", "message"), rows, limit,
               note + f": {len(changes['new_findings'])} new, "
               f"{len(changes['fixed_findings'])} fixed"
               + (f", {len(removed)} gone with their policy" if removed else "")
               + (f", {len(rule_removed)} gone with their rule" if rule_removed else "")
               + (f", {len(policy_changed)} gone as their policy changed (not fixed)"
                  if policy_changed else "")),
        _table("trends", "Allocation trend (GPU-equivalents)",
               ("scope", "name", "allocated before", "allocated", "change", "idle before",
                "idle", "idle change"), trends, limit, note),
    ]


def _signed(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value > 0 else "") + number(value)


def _nodes(report: Mapping[str, Any], limit: int | None) -> TextTable:
    rows = []
    nodes = sorted(report["nodes"], key=lambda n: (-(n["gpu_equivalents"]["allocatable"] or 0),
                                                   n["name"]))
    for node in nodes:
        eq = node["gpu_equivalents"]
        kind = node["model"] or node["product"] or "-"
        mode = []
        if node["mig_strategy"] in ("single", "mixed"):
            mode.append(f"MIG {node['mig_strategy']}"
                        + (f" {node['mig_single_profile']}" if node["mig_single_profile"]
                           else ""))
        if node["sharing_strategy"] not in (None, "none"):
            mode.append(f"{node['sharing_strategy']} x{node['replicas'] or '?'}")
        if node["hami"]:
            mode.append("HAMi")
        state = {True: "Ready", False: "NotReady", None: "no conditions"}[node["ready"]]
        if node["unschedulable"]:
            state += ",cordoned"
        resources = ", ".join(f"{r.removeprefix('nvidia.com/')} {v['allocated']}/"
                              f"{v['allocatable']}" for r, v in node["resources"].items()
                              if v["allocatable"] or v["allocated"])
        rows.append((node["name"], kind, " ".join(mode) or "-", state,
                     f"{number(eq['allocated'])}/{number(eq['allocatable'])}"
                     + ("~" if eq["approximate"] else ""),
                     number(eq["free"]), resources or "-",
                     "; ".join(node["stranded"]["reasons"]) if node["stranded"] else ""))
    return _table("nodes", "GPU nodes", ("node", "GPU", "mode", "state",
                                         "GPU-eq allocated/allocatable", "free",
                                         "resources allocated/allocatable", "stranded"),
                  rows, limit)


def _teams(report: Mapping[str, Any], limit: int | None) -> TextTable:
    rows = []
    for team in report["teams"]:
        eq = team["gpu_equivalents"]
        share = eq["share_of_cluster"]
        rows.append((team["team"] or "(no team)", ", ".join(team["namespaces"]) or "-",
                     str(team["workloads"]),
                     f"{team['gpu_pods']['running']}/{team['gpu_pods']['pending']}",
                     number(eq["allocated"]) + (f" ({share:.0%})" if share is not None else ""),
                     number(eq["pending"]), number(eq["idle_allocated"], "-"),
                     "-" if team["mean_utilization"] is None
                     else f"{team['mean_utilization']:.0%}",
                     _counts({k: v for k, v in team["findings"].items() if k != "info"})))
    return _table("teams", f"Teams (namespace label {report['settings']['team_label']})",
                  ("team", "namespaces", "workloads", "GPU pods run/pend", "GPU-eq allocated",
                   "pending", "idle", "mean util", "findings"), rows, limit)


def _quotas(report: Mapping[str, Any], limit: int | None) -> list[TextTable]:
    quotas = report.get("quotas") or []
    if not quotas:
        return []
    rows = []
    for quota in quotas:
        used, limits = quota["used"], quota["limits"]
        parts = []
        if "gpuEquivalents" in limits:
            parts.append(f"{number(used['gpuEquivalents'])}/{number(limits['gpuEquivalents'])} "
                         "GPU-eq")
        parts += [f"{used['gpus'].get(r, 0)}/{n} {r}" for r, n in limits["gpus"].items()]
        if "gpuMemoryGiB" in limits:
            parts.append(f"{number(used['gpuMemoryGiB'])}/{number(limits['gpuMemoryGiB'])} GiB")
        parts += [f"{used['mig'].get(p, 0)}/{n} MIG {p}" for p, n in limits["mig"].items()]
        parts += [f"{number(used['products'].get(p, 0))}/{number(n)} GPU-eq {p}"
                  for p, n in limits["products"].items()]
        ratio = quota["max_ratio"]
        rows.append((quota["name"], quota["team"] or "-", "; ".join(parts) or "-",
                     "∞" if ratio is None and quota["usage_ratio"] else
                     "-" if ratio is None else f"{ratio:.0%}",
                     number(quota["headroom_gpu_equivalents"], "-"), quota["state"]))
    summary = report["summary"].get("quotas") or {}
    note = f"{len(summary.get('over', []))} over quota, {len(summary.get('near', []))} at 90 % " \
        "or more; pending and running pods"
    return [_table("quotas", "GPU quotas (used/limit)", ("quota", "team", "used/limit",
                                                        "highest", "headroom GPU-eq", "state"),
                   rows, limit, note)]


def _fragmentation(report: Mapping[str, Any]) -> TextTable:
    frag = report["fragmentation"]
    rows = [(e["resource"], str(e["free"]), str(e["largest_free_on_one_node"]),
             " ".join(f"{size}:{n}" for size, n in e["fits"].items()), e["message"])
            for e in frag["whole_gpus"]]
    eq = frag["gpu_equivalents"]
    rows.append(("GPU-equivalents", number(eq["free"]), number(eq["largest_free_on_one_node"]),
                 "-", f"fragmentation index {eq['index']:.2f} (0: all free capacity on one "
                 "node)"))
    return _table("fragmentation", "Fragmentation of free GPUs (usable nodes)",
                  ("resource", "free", "largest on one node", "nodes fitting N", "meaning"),
                  rows, None)


def _stranded(report: Mapping[str, Any], limit: int | None) -> list[TextTable]:
    """Two tables: free GPUs on nodes out of service (NotReady / cordoned: a failure's or an
    operator's doing), and GPUs stranded on nodes in service (a placement problem to fix)."""
    columns = ("node", "GPU-eq", "whole GPUs", "free resources", "why")
    tables = []
    for key, unavailable, title, note in (
            ("stranded", False, f"Stranded GPUs on {IN_SERVICE} (free, but no pod can use them)",
             "Ready and schedulable nodes whose free GPUs no pod of the snapshot can use: "
             "MIG misconfigured, a taint nothing tolerates, CPU or memory exhausted"),
            ("stranded-unavailable", True, f"Free GPUs on {UNAVAILABLE}",
             "out of service: the scheduler skips these nodes for every pod until they are "
             "Ready and uncordoned")):
        rows = [(s["node"], number(s["gpu_equivalents"]), str(s["whole_gpus"]),
                 _counts(s["resources"]), "; ".join(s["reasons"]))
                for s in report["stranded"] if s["node_unavailable"] is unavailable]
        tables.append(_table(key, title, columns, rows, limit, note))
    return tables


def _mig(report: Mapping[str, Any]) -> list[TextTable]:
    rows = [(p["profile"], str(p["configured"]), str(p["used"]), str(p["free"]),
             number(p["configured_gpu_equivalents"]), number(p["used_gpu_equivalents"]),
             str(p["pending_instances"]), ", ".join(p["nodes"]) or "-")
            for p in report["mig"]["profiles"]]
    tables = [_table("mig", "MIG instances by profile",
                     ("profile", "configured", "used", "free", "GPU-eq configured",
                      "GPU-eq used", "pending", "nodes"), rows, None)]
    unmet = [(u["profile"], str(u["pending_pods"]), str(u["pending_instances"]))
             for u in report["mig"]["unmet_profiles"]]
    if unmet:
        tables.append(_table("mig-unmet", "Pending demand for MIG profiles no node offers",
                             ("profile", "pending pods", "instances"), unmet, None))
    return tables


def _pending(report: Mapping[str, Any], limit: int | None) -> TextTable:
    rows = [(f"{p['namespace']}/{p['pod']}", ref_text(p["workload"]), p["team"] or "-",
             _counts(p["resources"]), number(p["gpu_equivalents"]), p["reason"], p["detail"])
            for p in report["pending"]]
    return _table("pending", "Pending GPU pods", ("pod", "workload", "team", "asks",
                                                  "GPU-eq", "reason", "detail"), rows, limit)


def _utilization(report: Mapping[str, Any], limit: int | None) -> list[TextTable]:
    util = report.get("utilization")
    if not util:
        return []
    window = util["window"]
    note = (f"{util['devices']} device(s) in {util['source']}, {util['allocated_devices']} "
            f"allocated, {util['idle_allocated_devices']} idle (< {util['idle_below']:.0%} "
            + (f"mean utilization); window {moment(window['start'])} to "
               f"{moment(window['end'])}, "
               if window["start"] and window["end"] else
               "mean utilization); sample times not given, ")
            + f"{window['samples']} sample(s)")
    rows = [(ref_text(w["workload"]), w["team"] or "-", f"{w['idle_devices']}/{w['devices']}",
             number(w["idle_gpu_equivalents"]),
             "-" if w["mean_utilization"] is None else f"{w['mean_utilization']:.1%}")
            for w in util["idle_workloads"]]
    return [_table("idle", "Allocated but idle GPUs", ("workload", "team",
                                                        "idle/devices", "idle GPU-eq",
                                                        "mean util"), rows, limit, note)]


def money(value: float | None, currency: str, unpriced: str = "unpriced") -> str:
    """A sum of money as a person reads it: ``USD 1,234.57`` (2 decimals; the JSON keeps 4)."""
    return unpriced if value is None else f"{currency} {value:,.2f}"


def _cost_note(line: Mapping[str, Any] | None, unit: str, key: str, currency: str) -> str:
    if line is None:
        return "unknown (no --metrics)"
    unpriced = line[f"unpriced_{unit}"]
    name = {"gpu_equivalents": "GPU-equivalents", "gpu_hours": "GPU-hours"}[unit]
    return (f"{number(line[unit])} {name} = {money(line[key], currency)}"
            + (f" ({number(unpriced)} unpriced)" if unpriced else ""))


def _cost(report: Mapping[str, Any], limit: int | None) -> list[TextTable]:
    """The cost tables (``--prices``): this run's rate, and with ``--history`` the window."""
    cost = report.get("cost")
    if not cost:
        return []
    currency, rate = cost["currency"], cost["rate"]
    table = cost["price_table"]
    rows = [("idle", n["team"] or "(no team)", n["namespace"] or "-",
             number(n["idle_gpu_equivalents"]), money(n["idle_cost_per_hour"], currency))
            for n in rate["namespaces"]]
    rows += [("stranded", "-", p["product"] or "(no product label)",
              number(p["stranded_gpu_equivalents"]),
              money(p["stranded_cost_per_hour"], currency))
             for p in rate["products"] if p["stranded_gpu_equivalents"]]
    unpriced = ", ".join(f"{p['product'] or '(no product label)'} "
                         f"({number(p['idle_gpu_equivalents'] + p['stranded_gpu_equivalents'])}"
                         " GPU-eq)" for p in rate["unpriced"])
    note = (f"Priced with {table['source']} ({currency}). Per hour now: idle "
            f"{_cost_note(rate['idle'], 'gpu_equivalents', 'cost_per_hour', currency)}; "
            f"stranded "
            f"{_cost_note(rate['stranded'], 'gpu_equivalents', 'cost_per_hour', currency)}"
            + (f". Not in the table: {unpriced}" if unpriced else ""))
    out = [_table("cost", "Idle and stranded GPUs: cost per hour",
                  ("state", "team", "namespace / GPU product", "GPU-eq", "per hour"), rows,
                  limit, note)]
    window = cost.get("window")
    if window:
        rows = [("idle", n["team"] or "(no team)", n["namespace"] or "-",
                 number(n["idle_gpu_hours"]), money(n["idle_cost"], currency))
                for n in window["namespaces"]]
        rows += [("stranded", "-", p["product"] or "(no product label)",
                  number(p["stranded_gpu_hours"]), money(p["stranded_cost"], currency))
                 for p in window["products"] if p["stranded_gpu_hours"]]
        idle, stranded = window["idle"], window["stranded"]
        note = (f"{window['runs']} run(s) from {moment(window['start'])} to "
                f"{moment(window['end'])} ({number(window['hours'])} h; idle known for "
                f"{number(idle['hours_covered'])} h), integrated between runs (trapezoid). "
                f"Idle {_cost_note(idle, 'gpu_hours', 'cost', currency)}; stranded "
                f"{_cost_note(stranded, 'gpu_hours', 'cost', currency)}")
        out.append(_table("cost-window", "Idle and stranded GPUs over the history window",
                          ("state", "team", "namespace / GPU product", "GPU-hours", "cost"),
                          rows, limit, note))
    return out


def _policies(report: Mapping[str, Any]) -> TextTable:
    rows = [(p["policy"], str(p["deny"]), str(p["warn"]), str(p["audit"]), str(p["error"]),
             str(p["info"]), str(p["exempt"]), str(p["pass"])) for p in report["policies"]]
    return _table("policies", "Findings by policy", ("policy", "deny", "warn", "audit", "error",
                                                      "info", "exempt", "pass"), rows, None)


def _findings(report: Mapping[str, Any], limit: int | None) -> TextTable:
    rows = [(f["severity"], f["policy"], ref_text(f["workload"]), f["team"] or "-",
             f["message"]) for f in report["findings"] if f["severity"] != "info"]
    info = sum(1 for f in report["findings"] if f["severity"] == "info")
    note = f"{info} mutation(s) admission would apply are in the JSON report" if info else ""
    return _table("findings", "Findings", ("severity", "policy", "workload", "team", "message"),
                  rows, limit, note)


def _exceptions(report: Mapping[str, Any], limit: int | None) -> TextTable:
    rows = [(e["policy"], ref_text(e["workload"]), e["team"] or "-", e["reason"])
            for e in report["exceptions"]]
    return _table("exceptions", "Policy exceptions applied",
                  ("policy", "workload", "team", "reason"), rows, limit)


def _problem_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Input errors and warnings (the nodes' own warnings among them, ``Node NAME: …``): the
    rows of the problems table, as many as ``summary.errors`` and ``summary.warnings`` count."""
    return [("error", e) for e in report["errors"]] + [("warning", w)
                                                       for w in report["warnings"]]


def _problems(report: Mapping[str, Any], limit: int | None) -> TextTable:
    return _table("problems", "Input errors and warnings", ("type", "message"),
                  _problem_rows(report), limit)


def tables(report: Mapping[str, Any], limit: int | None = None) -> list[TextTable]:
    """Every section of the human-readable report, in reading order."""
    return [
        _summary(report), *_changes(report, limit), _teams(report, limit),
        *_quotas(report, limit),
        _nodes(report, limit), _fragmentation(report), *_stranded(report, limit),
        *_mig(report), _pending(report, limit), *_utilization(report, limit),
        *_cost(report, limit),
        _policies(report), _findings(report, limit), _exceptions(report, limit),
        _problems(report, limit),
    ]
