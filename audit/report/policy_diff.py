"""What a candidate policy set would change: two audit scans of one snapshot, compared.

Owns the comparison behind ``gpuguard diff``: the findings of the audit report of each scan
(:func:`audit.report.assemble.assemble`, so the diff lists exactly what the two audits would)
matched by the audit history's finding identity (:func:`audit.report.history.fingerprint`:
workload, policy, rule, field path, severity — a finding whose message changes is the same
finding, one whose severity changes is another), and the RFC 6902 patch the mutations of each set
would apply to each workload. The result is one JSON-ready dict (``kind: PolicyDiff``) documented
in ``docs/commands/diff.md``.

Must not read input, evaluate policies or render; it compares two finished scans.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from audit.report.assemble import API_VERSION, assemble, ref
from audit.report.history import fingerprint
from audit.scan.ownership import ObjectKey, namespace_order
from audit.scan.result import ScanResult

KIND = "PolicyDiff"

#: The change a finding present only in the candidate's audit makes, by its severity.
ADDED: Mapping[str, str] = {"deny": "denied", "warn": "warned", "audit": "audited",
                            "error": "erroring", "info": "mutated"}
#: The change a finding present only in the current set's audit makes, by its severity.
REMOVED: Mapping[str, str] = {"deny": "no_longer_denied", "warn": "no_longer_warned",
                              "audit": "no_longer_audited", "error": "no_longer_erroring",
                              "info": "no_longer_mutated"}
#: The same finding (same fingerprint) with another message.
MESSAGE_CHANGED = "message_changed"
#: A policy exception (inline ``spec.exceptions`` or a GPUPolicyException) that applies to the
#: workload under the candidate only, or under the current set only.
EXEMPTED, NO_LONGER_EXEMPTED = "exempted", "no_longer_exempted"
#: Every change a finding or an exemption can make, in the order counts are listed.
CHANGES: tuple[str, ...] = (*ADDED.values(), *REMOVED.values(), MESSAGE_CHANGED, EXEMPTED,
                            NO_LONGER_EXEMPTED)

#: A workload's verdict under a policy set: what admission would do with it as it is.
DENIED, WARNED, ADMITTED = "denied", "warned", "admitted"


def verdict(findings: Iterable[Mapping[str, Any]]) -> str:
    """``denied`` when a finding denies, else ``warned`` when one warns, else ``admitted``."""
    severities = {f["severity"] for f in findings}
    return DENIED if "deny" in severities else WARNED if "warn" in severities else ADMITTED


def _key(workload: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (workload["kind"], workload["group"] or "", workload["namespace"] or "",
            workload["name"])


def _by_workload(report: Mapping[str, Any]) -> dict[tuple[str, str, str, str],
                                                  dict[str, dict[str, Any]]]:
    """Workload key -> fingerprint -> finding, for every finding of an audit report."""
    grouped: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = {}
    for finding in report["findings"]:
        grouped.setdefault(_key(finding["workload"]), {})[fingerprint(finding)] = finding
    return grouped


def _exemptions(report: Mapping[str, Any]) -> dict[tuple[str, str, str, str],
                                                 dict[str, dict[str, Any]]]:
    """Workload key -> policy -> the exemption entry of an audit report."""
    grouped: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = {}
    for entry in report["exceptions"]:
        grouped.setdefault(_key(entry["workload"]), {})[entry["policy"]] = entry
    return grouped


def _exemption_change(kind: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"change": kind, "severity": None, "policy": entry["policy"], "rule": "exceptions",
            "path": "", "message": entry["reason"]}


def _patches(result: ScanResult) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
    return {_key(ref(key)): list(patch) for key, patch in result.compliance.patches.items()}


def _operations_not_in(patch: Sequence[Mapping[str, Any]],
                       other: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The operations of ``patch`` that ``other`` does not apply (compared as JSON values)."""
    present = {json.dumps(op, sort_keys=True) for op in other}
    return [dict(op) for op in patch if json.dumps(op, sort_keys=True) not in present]


def _change(kind: str, finding: Mapping[str, Any], before: Mapping[str, Any] | None = None,
            ) -> dict[str, Any]:
    entry = {"change": kind, "severity": finding["severity"], "policy": finding["policy"],
             "rule": finding["rule"], "path": finding["path"], "message": finding["message"]}
    if before is not None:
        entry["message_before"] = before["message"]
    return entry


def _counts(counter: Mapping[str, int], extra: Sequence[str]) -> dict[str, int]:
    return {name: counter.get(name, 0) for name in (*CHANGES, *extra)}


def compare(current: ScanResult, candidate: ScanResult) -> dict[str, Any]:
    """The ``PolicyDiff`` of two scans of one snapshot (docs/commands/diff.md).

    Args:
        current: the scan with the policy set in force (``--policies``).
        candidate: the scan of the same objects with the candidate set (``--candidate``), made
            with ``AuditSettings.mutation_patches`` like ``current`` for the patches to count.

    Returns:
        ``{apiVersion, kind, source, current, candidate, summary, workloads, policies, teams}``:
        ``workloads`` lists each workload whose findings, exemptions or patch differ, with its
        verdict under both sets (``denied`` / ``warned`` / ``admitted``), each changed finding
        or exemption (:data:`CHANGES`; an exemption's ``severity`` is None, its ``message`` the
        exception's reason) and, when the patches differ, both patches and the operations each
        adds over the other; ``policies`` and ``teams`` count the changes, and the workloads
        newly denied (admitted or warned by the current set, denied by the candidate).
    """
    before_report, after_report = assemble(current), assemble(candidate)
    before, after = _by_workload(before_report), _by_workload(after_report)
    patches_before, patches_after = _patches(current), _patches(candidate)
    exempt_before, exempt_after = _exemptions(before_report), _exemptions(after_report)
    keys = sorted({*before, *after, *patches_before, *patches_after, *exempt_before,
                   *exempt_after},
                  key=lambda k: (namespace_order(k[2] or None), k[0], k[1], k[3]))
    workloads = []
    by_policy: dict[str, Counter[str]] = {}
    by_team: dict[str | None, Counter[str]] = {}
    transitions: Counter[str] = Counter()
    for key in keys:
        old, new = before.get(key, {}), after.get(key, {})
        changes = [_change(ADDED[f["severity"]], f) for fp, f in new.items() if fp not in old]
        changes += [_change(REMOVED[f["severity"]], f) for fp, f in old.items() if fp not in new]
        changes += [_change(MESSAGE_CHANGED, f, old[fp]) for fp, f in new.items()
                    if fp in old and old[fp]["message"] != f["message"]]
        was, now = exempt_before.get(key, {}), exempt_after.get(key, {})
        changes += [_exemption_change(EXEMPTED, e) for p, e in now.items() if p not in was]
        changes += [_exemption_change(NO_LONGER_EXEMPTED, e) for p, e in was.items()
                    if p not in now]
        patch_old, patch_new = patches_before.get(key, []), patches_after.get(key, [])
        if not changes and patch_old == patch_new:
            continue
        kind, group, namespace, name = key
        team = candidate.team_of(namespace or None)
        verdicts = {"current": verdict(old.values()), "candidate": verdict(new.values())}
        newly_denied = verdicts["current"] != DENIED and verdicts["candidate"] == DENIED
        entry: dict[str, Any] = {
            "workload": ref(ObjectKey(namespace or None, group, kind, name)), "team": team,
            "verdict": verdicts, "newly_denied": newly_denied,
            "changes": sorted(changes, key=lambda c: (CHANGES.index(c["change"]), c["policy"],
                                                      c["rule"], c["path"])),
            "patch": None,
        }
        if patch_old != patch_new:
            entry["patch"] = {"current": patch_old, "candidate": patch_new,
                              "added": _operations_not_in(patch_new, patch_old),
                              "removed": _operations_not_in(patch_old, patch_new)}
        workloads.append(entry)
        team_counts = by_team.setdefault(team, Counter())
        team_counts["workloads_changed"] += 1
        for change in changes:
            by_policy.setdefault(change["policy"], Counter())[change["change"]] += 1
            team_counts[change["change"]] += 1
        if newly_denied:
            transitions["newly_denied"] += 1
            team_counts["workloads_newly_denied"] += 1
            for policy in {c["policy"] for c in changes if c["change"] == ADDED["deny"]}:
                by_policy[policy]["workloads_newly_denied"] += 1
        if verdicts["current"] == DENIED and verdicts["candidate"] != DENIED:
            transitions["no_longer_denied"] += 1
        if verdicts["current"] == ADMITTED and verdicts["candidate"] == WARNED:
            transitions["newly_warned"] += 1
        if entry["patch"] is not None:
            transitions["patch_changed"] += 1
            team_counts["patch_changed"] += 1
    totals: Counter[str] = Counter()
    for counts in by_policy.values():
        totals.update({k: v for k, v in counts.items() if k in CHANGES})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "source": {k: v for k, v in current.source.items() if k != "policies"},
        "current": _policy_set(current),
        "candidate": _policy_set(candidate),
        "summary": {
            "workloads_evaluated": len(current.compliance.evaluated),
            "workloads_changed": len(workloads),
            "workloads_newly_denied": transitions["newly_denied"],
            "workloads_no_longer_denied": transitions["no_longer_denied"],
            "workloads_newly_warned": transitions["newly_warned"],
            "workloads_patch_changed": transitions["patch_changed"],
            "findings": _counts(totals, ()),
        },
        "workloads": workloads,
        "policies": [{"policy": policy, **_counts(counts, ("workloads_newly_denied",))}
                     for policy, counts in sorted(by_policy.items())],
        "teams": [{"team": team, **_counts(counts, ("workloads_changed",
                                                    "workloads_newly_denied", "patch_changed"))}
                  for team, counts in sorted(by_team.items(), key=lambda t: (t[0] is None,
                                                                              t[0] or ""))],
    }


def _policy_set(result: ScanResult) -> dict[str, Any]:
    info = result.policy_set
    return {"policies": result.source.get("policies"),
            "hash": info.digest if info is not None else None,
            "names": list(info.policies) if info is not None else []}
