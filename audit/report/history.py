"""Audit history in SQLite: each run appended, and what changed since the previous one.

Owns the history file (``--history FILE``, stdlib :mod:`sqlite3`): one row per run (time, source,
summary, the policy set's content hash and policy names), its findings (by a fingerprint of
workload, policy, rule and field path, so a finding whose message wording changes stays the same
finding) and its allocation figures (cluster, per team, per node). :func:`changes` compares a
report with the previous run: new and fixed findings, findings gone because their policy left the
set ("policy removed", not "fixed": a run with fewer policies fixes nothing), how the policy set
changed, and the trend of allocation and idle GPU-equivalents for the cluster and each team.

The schema version is kept in the file (``PRAGMA user_version``); a file written by a newer
version is refused rather than misread, and an older one is migrated in place when opened (schema
1 had no policy set columns: its runs read back with ``policy_hash`` and ``policies`` None, and
their vanished findings are judged against the current run's policy names). Must not render or
audit.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    source TEXT NOT NULL,
    summary TEXT NOT NULL,
    policy_hash TEXT,
    policies TEXT
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
"""
# Columns added after schema 1, with their types: added to an older file when it is opened.
_ADDED_COLUMNS = {"runs": (("policy_hash", "TEXT"), ("policies", "TEXT"))}


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
    before the history kept them (schema 1) or without a policy set.
    """

    id: int
    at: str
    source: str
    findings: Mapping[str, Mapping[str, Any]]
    allocations: Mapping[tuple[str, str | None], tuple[float | None, float | None, float | None]]
    policy_hash: str | None = None
    policies: tuple[str, ...] | None = None


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
        row = self._db.execute("SELECT id, at, source, policy_hash, policies FROM runs "
                               "ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        run_id, at, source, policy_hash, policies = row
        findings = {fp: {"fingerprint": fp, "severity": sev, "policy": pol, "rule": rule,
                         "workload": wl, "team": team, "message": msg}
                    for fp, sev, pol, rule, wl, team, msg in self._db.execute(
                        "SELECT fingerprint, severity, policy, rule, workload, team, message "
                        "FROM findings WHERE run = ?", (run_id,))}
        allocations = {(scope, name): (alloc, used, idle) for scope, name, alloc, used, idle
                       in self._db.execute("SELECT scope, name, allocatable, allocated, idle "
                                           "FROM allocations WHERE run = ?", (run_id,))}
        return Run(run_id, at, source, findings, allocations, policy_hash,
                   tuple(json.loads(policies)) if policies is not None else None)

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

    def record(self, report: Mapping[str, Any]) -> int:
        """Append a run; returns its id."""
        with self._db:
            policy_set = report.get("policy_set") or {}
            names = policy_set.get("policies")
            cursor = self._db.execute(
                "INSERT INTO runs (at, source, summary, policy_hash, policies) "
                "VALUES (?, ?, ?, ?, ?)",
                (report["generated"], json.dumps(report["source"], sort_keys=True),
                 json.dumps(report["summary"], sort_keys=True), policy_set.get("hash"),
                 json.dumps(list(names)) if names is not None else None))
            run_id = int(cursor.lastrowid or 0)
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

    A finding of the previous run that is gone is ``fixed`` when its policy is still in this
    run's policy set, and in ``policy_removed_findings`` when the policy is not (the set changed;
    the workload may be as it was). Without this run's policy names (a report without
    ``policy_set``) every vanished finding counts as fixed, as before.
    """
    if previous is None:
        return None
    current = {fingerprint(f): f for f in report["findings"]}
    new = [f for fp, f in current.items() if fp not in previous.findings]
    gone = [f for fp, f in previous.findings.items() if fp not in current]
    names = (report.get("policy_set") or {}).get("policies")
    policies = set(names) if names is not None else None
    removed = [f for f in gone if policies is not None and f["policy"] not in policies]
    fixed = [f for f in gone if policies is None or f["policy"] in policies]
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
                          "message": f["message"]} for f in new],
        "fixed_findings": [{k: f[k] for k in _FIELDS} for f in fixed],
        "policy_removed_findings": [{k: f[k] for k in _FIELDS} for f in removed],
        "policy_set": _policy_set_change(report, previous),
        "trends": trends,
        "nodes_added": sorted(node_names_now - node_names_before, key=str),
        "nodes_removed": sorted(node_names_before - node_names_now, key=str),
    }
