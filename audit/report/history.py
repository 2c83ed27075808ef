"""Audit history in SQLite: each run appended, and what changed since the previous one.

Owns the history file (``--history FILE``, stdlib :mod:`sqlite3`): one row per run (time, source,
summary, the policy set's content hash and policy names, each policy's own content hash), its
findings (by a fingerprint of workload, policy, rule and field path, so a finding whose message
wording changes stays the same finding) and its allocation figures (cluster, per team, per node).
:func:`changes` compares a report with the previous run: new and fixed findings, findings gone
because their policy left the set ("policy removed", not "fixed": a run with fewer policies fixes
nothing), because their rule left a kept policy ("rule removed") or because their policy's
content changed ("policy changed": the workload may be as it was), how the policy set changed,
and the trend of allocation and idle GPU-equivalents for the cluster and each team.

The schema version is kept in the file (``PRAGMA user_version``); a file written by a newer
version is refused rather than misread, and an older one is migrated in place when opened (schema
1 had no policy set columns: its runs read back with ``policy_hash`` and ``policies`` None, and
their vanished findings are judged against the current run's policy names; schema 2 had no
per-policy hashes: ``policy_hashes`` None, so no finding of such a run is "policy changed";
schema 4 added each run's idle and stranded GPU-equivalents per team, namespace, node and
product (:func:`audit.report.cost.waste`, table ``waste``), which :meth:`History.waste_series`
reads back for the cost over the history window — runs of older schemas read back None there).
Must not render or audit.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.report.cost import Waste, waste

SCHEMA_VERSION = 4
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    source TEXT NOT NULL,
    summary TEXT NOT NULL,
    policy_hash TEXT,
    policies TEXT,
    policy_hashes TEXT
);
CREATE TABLE IF NOT EXISTS findings (
    run INTEGER NOT NULL REFERENCES runs(id),
    fingerprint TEXT NOT NULL,
    severity TEXT NOT NULL,
    policy TEXT NOT NULL,
    rule TEXT NOT NULL,
    workload TEXT NOT NULL,
    team TEXT,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_run ON findings(run);
CREATE TABLE IF NOT EXISTS allocations (
    run INTEGER NOT NULL REFERENCES runs(id),
    scope TEXT NOT NULL,
    name TEXT,
    allocatable REAL,
    allocated REAL,
    idle REAL
);
CREATE INDEX IF NOT EXISTS allocations_run ON allocations(run);
CREATE TABLE IF NOT EXISTS waste (
    run INTEGER NOT NULL REFERENCES runs(id),
    state TEXT NOT NULL,
    team TEXT,
    namespace TEXT,
    node TEXT,
    product TEXT,
    gpu_equivalents REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS waste_run ON waste(run);
"""
# Columns added after schema 1, with their types: added to an older file when it is opened.
# waste_recorded: 1 from schema 4 on (the run's waste rows are complete, even when there are
# none); idle_known: the run had DCGM metrics (idle GPUs known).
_ADDED_COLUMNS = {"runs": (("policy_hash", "TEXT"), ("policies", "TEXT"),
                           ("policy_hashes", "TEXT"), ("waste_recorded", "INTEGER"),
                           ("idle_known", "INTEGER"))}


class HistoryError(Exception):
    """The history file cannot be used (unreadable, not SQLite, or from a newer gpuguard)."""


def workload_text(ref: Mapping[str, Any]) -> str:
    """``Kind[.group]/[namespace/]name`` of a report's workload reference (``{kind, group,
    namespace, name}``): how the history and ``gpuguard diff`` name a workload."""
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    group = f".{ref['group']}" if ref.get("group") else ""
    return f"{ref['kind']}{group}/{where}{ref['name']}"


def fingerprint(finding: Mapping[str, Any]) -> str:
    """A stable identity for a finding across runs (its message may change)."""
    text = "\x1f".join((workload_text(finding["workload"]), finding["policy"], finding["rule"],
                        finding["path"], finding["severity"]))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Run:
    """A run read back from the history: its id, time, findings by fingerprint, allocations.

    ``allocations`` maps ``(scope, name)`` — scope ``cluster``, ``team`` or ``node`` — to
    ``(allocatable, allocated, idle)`` GPU-equivalents (None when unknown). ``policy_hash``
    (``sha256:…`` of the policy files) and ``policies`` (names) are None for runs recorded
    before the history kept them (schema 1) or without a policy set; ``policy_hashes`` (policy
    name -> ``sha256:…`` of its content, :func:`policies.policy.model.policy_digest`) is None
    for runs recorded before schema 3 or without a policy set.
    """

    id: int
    at: str
    source: str
    findings: Mapping[str, Mapping[str, Any]]
    allocations: Mapping[tuple[str, str | None], tuple[float | None, float | None, float | None]]
    policy_hash: str | None = None
    policies: tuple[str, ...] | None = None
    policy_hashes: Mapping[str, str] | None = None


class History:
    """An open history file.

    Raises:
        HistoryError: the file is not a usable history (see module docstring).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{path}: written by a newer gpuguard (history schema "
                                   f"{version}, this one reads {SCHEMA_VERSION})")
            self._db.executescript(_SCHEMA)
            for table, columns in _ADDED_COLUMNS.items():
                present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns:
                    if name not in present:  # a file from an older gpuguard: migrate it
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.commit()
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{path}: not a gpuguard history file ({exc})") from None

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def latest(self) -> Run | None:
        """The most recent run, or None for an empty history."""
        row = self._db.execute("SELECT id, at, source, policy_hash, policies, policy_hashes "
                               "FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        run_id, at, source, policy_hash, policies, policy_hashes = row
        findings = {fp: {"fingerprint": fp, "severity": sev, "policy": pol, "rule": rule,
                         "workload": wl, "team": team, "message": msg}
                    for fp, sev, pol, rule, wl, team, msg in self._db.execute(
                        "SELECT fingerprint, severity, policy, rule, workload, team, message "
                        "FROM findings WHERE run = ?", (run_id,))}
        allocations = {(scope, name): (alloc, used, idle) for scope, name, alloc, used, idle
                       in self._db.execute("SELECT scope, name, allocatable, allocated, idle "
                                           "FROM allocations WHERE run = ?", (run_id,))}
        return Run(run_id, at, source, findings, allocations, policy_hash,
                   tuple(json.loads(policies)) if policies is not None else None,
                   json.loads(policy_hashes) if policy_hashes is not None else None)

    def series(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` runs, oldest first, for trend charts: ``{at, allocatable,
        allocated, idle, findings}`` — the cluster's GPU-equivalents (None when the run did not
        know them: ``idle`` needs DCGM metrics) and its findings per severity (``deny``,
        ``warn``, ``audit``, ``error``), as each run's summary recorded them."""
        rows = self._db.execute("SELECT at, summary FROM runs ORDER BY id DESC LIMIT ?",
                                (limit,)).fetchall()
        points = []
        for at, text in reversed(rows):
            summary = json.loads(text)
            eq = summary.get("gpu_equivalents") or {}
            findings = summary.get("findings") or {}
            points.append({"at": at, "allocatable": eq.get("allocatable"),
                           "allocated": eq.get("allocated"), "idle": eq.get("idle_allocated"),
                           "findings": {s: findings.get(s, 0)
                                        for s in ("deny", "warn", "audit", "error")}})
        return points

    def waste_series(self, limit: int = 100) -> list[tuple[str, Waste | None]]:
        """The last ``limit`` runs (the runs of :meth:`series`), oldest first, as ``(time,
        idle and stranded GPU-equivalents)`` for :func:`audit.report.cost.window`; None for a
        run recorded before schema 4."""
        rows = self._db.execute("SELECT id, at, waste_recorded, idle_known FROM runs "
                                "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        if not rows:
            return []
        figures: dict[int, tuple[list[Any], list[Any]]] = {row[0]: ([], []) for row in rows}
        for run, state, team, namespace, node, product, amount in self._db.execute(
                "SELECT run, state, team, namespace, node, product, gpu_equivalents FROM waste "
                "WHERE run >= ? ORDER BY rowid", (rows[-1][0],)):
            if run in figures:
                if state == "idle":
                    figures[run][0].append((team, namespace, product, amount))
                elif state == "stranded":
                    figures[run][1].append((node, product, amount))
        out: list[tuple[str, Waste | None]] = []
        for run_id, at, recorded, idle_known in reversed(rows):
            idle, stranded = figures[run_id]
            out.append((at, Waste(bool(idle_known), tuple(idle), tuple(stranded))
                        if recorded else None))
        return out

    def record(self, report: Mapping[str, Any]) -> int:
        """Append a run; returns its id."""
        figures = waste(report)
        with self._db:
            policy_set = report.get("policy_set") or {}
            names = policy_set.get("policies")
            hashes = policy_set.get("policy_hashes")
            cursor = self._db.execute(
                "INSERT INTO runs (at, source, summary, policy_hash, policies, policy_hashes, "
                "waste_recorded, idle_known) VALUES (?, ?, ?, ?, ?, ?, 1, ?)",
                (report["generated"], json.dumps(report["source"], sort_keys=True),
                 json.dumps(report["summary"], sort_keys=True), policy_set.get("hash"),
                 json.dumps(list(names)) if names is not None else None,
                 json.dumps(hashes, sort_keys=True) if hashes is not None else None,
                 int(figures.idle_known)))
            run_id = int(cursor.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO waste VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, "idle", team, namespace, None, product, amount)
                 for team, namespace, product, amount in figures.idle]
                + [(run_id, "stranded", None, None, node, product, amount)
                   for node, product, amount in figures.stranded])
            self._db.executemany(
                "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, fingerprint(f), f["severity"], f["policy"], f["rule"],
                  workload_text(f["workload"]), f["team"], f["message"])
                 for f in report["findings"]])
            self._db.executemany("INSERT INTO allocations VALUES (?, ?, ?, ?, ?, ?)",
                                 [(run_id, *row) for row in _allocation_rows(report)])
        return run_id


def _allocation_rows(report: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    summary = report["summary"]["gpu_equivalents"]
    rows: list[tuple[Any, ...]] = [("cluster", None, summary["allocatable"],
                                    summary["allocated"], summary["idle_allocated"])]
    rows += [("team", t["team"], None, t["gpu_equivalents"]["allocated"],
              t["gpu_equivalents"]["idle_allocated"]) for t in report["teams"]]
    rows += [("node", n["name"], n["gpu_equivalents"]["allocatable"],
              n["gpu_equivalents"]["allocated"], None) for n in report["nodes"]]
    return rows


def _delta(now: float | None, before: float | None) -> float | None:
    if now is None or before is None:
        return None
    return round(now - before, 6)


_FIELDS = ("severity", "policy", "rule", "workload", "team", "message")


def _policy_set_change(report: Mapping[str, Any], previous: Run) -> dict[str, Any]:
    """``{hash, hash_before, changed, policies_added, policies_removed}``; the lists are None
    when either run's policy names are unknown, ``changed`` None when either hash is."""
    policy_set = report.get("policy_set") or {}
    digest, names = policy_set.get("hash"), policy_set.get("policies")
    known = names is not None and previous.policies is not None
    return {
        "hash": digest, "hash_before": previous.policy_hash,
        "changed": digest != previous.policy_hash
        if digest is not None and previous.policy_hash is not None else None,
        "policies_added": sorted(set(names) - set(previous.policies))  # type: ignore[arg-type]
        if known else None,
        "policies_removed": sorted(set(previous.policies) - set(names))  # type: ignore[arg-type]
        if known else None,
    }


def changes(report: Mapping[str, Any], previous: Run | None) -> dict[str, Any] | None:
    """The ``changes`` section: what differs from ``previous`` (None when there is no previous
    run).

    A finding of the previous run that is gone is, in this order: in
    ``policy_removed_findings`` when its policy is not in this run's policy set; in
    ``rule_removed_findings`` when the policy is but no longer has the finding's rule (renamed
    or deleted); in ``policy_changed_findings`` when the policy's content hash differs from the
    previous run's (a relaxed limit: the workload may be as it was); else ``fixed``. Without
    this run's policy names (a report without ``policy_set``) every vanished finding counts as
    fixed, as before; without either run's per-policy hashes none is "policy changed". A new
    finding carries ``policy_changed``: its policy's hash differs from the previous run's.
    """
    if previous is None:
        return None
    current = {fingerprint(f): f for f in report["findings"]}
    new = [f for fp, f in current.items() if fp not in previous.findings]
    gone = [f for fp, f in previous.findings.items() if fp not in current]
    policy_set = report.get("policy_set") or {}
    names = policy_set.get("policies")
    policies = set(names) if names is not None else None
    rules: Mapping[str, list[str]] | None = policy_set.get("rules")
    hashes_now: Mapping[str, str] | None = policy_set.get("policy_hashes")
    hashes_before = previous.policy_hashes

    def changed(policy: str) -> bool:
        return hashes_now is not None and hashes_before is not None and \
            policy in hashes_before and hashes_before[policy] != hashes_now.get(policy)

    removed, rule_removed, policy_changed, fixed = [], [], [], []
    for f in gone:
        if policies is None:
            fixed.append(f)
        elif f["policy"] not in policies:
            removed.append(f)
        elif rules is not None and f["rule"] not in rules.get(f["policy"], ()):
            rule_removed.append(f)
        elif changed(f["policy"]):
            policy_changed.append(f)
        else:
            fixed.append(f)
    now = {(scope, name): values for scope, name, *values in _allocation_rows(report)}
    trends = []
    for scope in ("cluster", "team"):
        names = {name for s, name in (*now, *previous.allocations) if s == scope}
        for name in sorted(names, key=str):
            before = previous.allocations.get((scope, name), (None, None, None))
            after = now.get((scope, name), (None, None, None))
            trends.append({
                "scope": scope, "name": name,
                "allocated": after[1], "allocated_before": before[1],
                "allocated_change": _delta(after[1], before[1]),
                "idle": after[2], "idle_before": before[2],
                "idle_change": _delta(after[2], before[2]),
            })
    node_names_now = {name for s, name in now if s == "node"}
    node_names_before = {name for s, name in previous.allocations if s == "node"}
    return {
        "previous_run": {"id": previous.id, "at": previous.at},
        "new_findings": [{"severity": f["severity"], "policy": f["policy"], "rule": f["rule"],
                          "workload": workload_text(f["workload"]), "team": f["team"],
                          "message": f["message"], "policy_changed": changed(f["policy"])}
                         for f in new],
        "fixed_findings": [{k: f[k] for k in _FIELDS} for f in fixed],
        "policy_removed_findings": [{k: f[k] for k in _FIELDS} for f in removed],
        "rule_removed_findings": [{k: f[k] for k in _FIELDS} for f in rule_removed],
        "policy_changed_findings": [{k: f[k] for k in _FIELDS} for f in policy_changed],
        "policy_set": _policy_set_change(report, previous),
        "trends": trends,
        "nodes_added": sorted(node_names_now - node_names_before, key=str),
        "nodes_removed": sorted(node_names_before - node_names_now, key=str),
    }
