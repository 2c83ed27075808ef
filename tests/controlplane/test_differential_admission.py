"""Native ValidatingAdmissionPolicy / MutatingAdmissionPolicy: the API server's in-tree admission
against ``gpuguard check``, on the same objects with the same policy files.

Every native policy file of the repository (tests/data/native-admission: the library's rules as
native policies and the Kubernetes documentation's examples; the native policies of
tests/core/test_engine.py; deploy/'s node-patch VAP) is applied to a real kube-apiserver, and the
corpus workloads in every variant of ``admission_differential.VARIANTS`` are created there with
``dryRun=All`` (admission runs, nothing is stored), with gpuguard out of the path. The same
objects go through ``gpuguard check`` with the same file, namespace labels and user. Allowed or
denied, the denial message, warnings, audit annotations (from the API server's audit log) and the
mutated object are compared; every difference must be listed in docs/compatibility.md, and every
listed difference must still occur.
"""

from __future__ import annotations

import collections
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.corpus import documents
from tests.controlplane.admission_differential import (
    AUDIT_POLICY,
    NAMESPACE,
    ApiServer,
    AuditLog,
    Case,
    Difference,
    PolicyLoadError,
    PolicySet,
    Probe,
    User,
    admin,
    admission_review,
    admitted_form,
    compare,
    gpuguard_check,
    listed_differences,
    policy_sets,
    prepare_cluster,
    workload_cases,
)
from tests.controlplane.cluster import ControlPlane

MIN_OBJECTS = 300


@pytest.fixture(scope="module")
def audited(control_plane_bin: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ControlPlane, AuditLog]]:
    """A control plane of its own with an audit log (the audit annotations are only there) and
    admissionregistration.k8s.io/v1beta1 served (tests/core/test_engine.py's MAP is written in it)."""
    folder = tmp_path_factory.mktemp("audit")
    policy, log = folder / "audit-policy.yaml", folder / "audit.log"
    policy.write_text(json.dumps(AUDIT_POLICY), encoding="utf-8")
    log.touch()
    cluster = ControlPlane(control_plane_bin, apiserver_args=[
        f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-mode=blocking",
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true"])
    try:
        cluster.start()
        prepare_cluster(cluster)
        yield cluster, AuditLog(log)
    finally:
        cluster.stop()


AGENT = "system:serviceaccount:gpuguard-system:gpuguard-inventory"


def node_cases(cluster: ControlPlane, server: ApiServer) -> list[Case]:
    """UPDATEs of the corpus Nodes (created for real first) as the inventory agent and as admin:
    the changes deploy/'s restrict-node-patch VAP allows and the ones it refuses."""
    cases = []
    nodes = [d for path in sorted((Path(__file__).parents[1] / "data" / "nodes").glob("*.yaml"))
             for d in documents(f"nodes/{path.name}") if d.get("kind") == "Node"]
    for node in nodes:
        body = admitted_form(node)
        body.pop("status", None)
        created = server.request("POST", "/api/v1/nodes", body, None)
        assert created.allowed, created.body
        stored = created.body
        name = stored["metadata"]["name"]

        def agent(on: str) -> User:
            return User(AGENT, ("system:serviceaccounts", "system:serviceaccounts:gpuguard-system"),
                        {"authentication.kubernetes.io/node-name": (on,)})

        def change(edit: Any, stored: dict[str, Any] = stored) -> dict[str, Any]:
            new = copy.deepcopy(stored)
            edit(new["metadata"], new.setdefault("spec", {}))
            return new

        def inventory(meta: dict[str, Any], _: dict[str, Any]) -> None:
            meta.setdefault("annotations", {})["gpuguard.io/inventory"] = '{"gpus": 8}'

        variants = {
            "inventory": (agent(name), inventory),
            "inventory-other-node": (agent("some-other-node"), inventory),
            "label": (agent(name), lambda m, _: m.setdefault("labels", {}).update(
                {"nvidia.com/gpu.product": "H100"})),
            "annotation": (agent(name), lambda m, _: m.setdefault("annotations", {}).update(
                {"example.com/other": "x"})),
            "cordon": (agent(name), lambda _, s: s.update({"unschedulable": True})),
            "admin-label": (User("carol"), lambda m, _: m.setdefault("labels", {}).update(
                {"example.com/x": "y"})),
        }
        for variant, (user, edit) in variants.items():
            cases.append(Case(f"nodes/{name}:{variant}", change(edit), "", user, old=stored))
    return cases


def _gpuguard_side(policies: PolicySet, cases: list[Case], baseline: dict[str, dict[str, Any]],
                   scratch: Path) -> dict[str, dict[str, Any]]:
    """``gpuguard check`` on every case, one run per (namespace, user); raises PolicyLoadError."""
    results: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, str], list[Case]] = collections.defaultdict(list)
    for case in cases:
        groups[(case.namespace, case.user.name) if case.old is None else ("", "")].append(case)
    for n, ((namespace, _), members) in enumerate(sorted(groups.items())):
        inputs = [admission_review(c) if c.old is not None else baseline[c.id] for c in members]
        found = gpuguard_check(policies.path, inputs or [{"apiVersion": "v1", "kind": "Pod",
                                                          "metadata": {"name": "x"}}],
                               namespace or "default", members[0].user, scratch / str(n))
        results.update({c.id: r for c, r in zip(members, found, strict=True)})
    if not groups:  # no case of this set's kinds: still load the file
        gpuguard_check(policies.path, [{"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "x"}}], "default", User("alice"),
                       scratch / "load")
    return results


def _run_set(cluster: ControlPlane, server: ApiServer, audit: AuditLog, policies: PolicySet,
             generation: int, cases: list[Case], baseline: dict[str, dict[str, Any]],
             scratch: Path) -> tuple[list[Difference], int, bool]:
    """Apply one policy set, run its cases on both sides, remove it.

    Returns (differences, requests compared, whether both sides refused the file).
    """
    try:
        ours = _gpuguard_side(policies, cases, baseline, scratch)
        gpuguard_loaded = ""
    except PolicyLoadError as exc:
        ours, gpuguard_loaded = {}, str(exc)
    applied = cluster.kubectl("create", "-f", str(policies.path))
    probe = Probe(server, generation)
    probe_documents = "\n---\n".join(json.dumps(d) for d in probe.documents())
    admin(cluster, "create", "-f", "-", input=probe_documents)
    try:
        probe.wait_active()
        if gpuguard_loaded or applied.returncode != 0:
            if gpuguard_loaded and applied.returncode != 0:
                return [], 0, True
            return [Difference(policies.name, "*", "load", gpuguard_loaded or "loaded",
                               applied.stderr.strip() or "accepted")], 0, False
        answers = server.submit_all(cases)
        annotations = audit.annotations([a.audit_id for a in answers])
    finally:
        # The set first, then the probe: once the probe has gone, so has the set.
        admin(cluster, "delete", "-f", str(policies.path), "--wait=true", "--ignore-not-found")
        admin(cluster, "delete", "-f", "-", "--wait=true", input=probe_documents)
        probe.wait_gone()
    found = []
    for case, answer, annotation in zip(cases, answers, annotations, strict=True):
        before = baseline[case.id] if case.old is None else case.body
        found += compare(policies, case, before, ours[case.id], answer, annotation)
        OUTCOMES[policies.name].update(outcomes(policies, before, answer, annotation))
    return found, len(cases), False


OUTCOMES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def outcomes(policies: PolicySet, before: dict[str, Any], answer: Any,
             annotations: dict[str, str]) -> list[str]:
    """What the API server did to one request (so the report shows the comparison is not
    between two sides that never act): denied, warned, audited, mutated."""
    done = [] if answer.allowed else ["denied"]
    done += ["warned"] if answer.warnings else []
    done += ["audited"] if any(k.partition("/")[0] in {
        d["metadata"]["name"] for d in policies.documents} or "validation_failure" in k
        for k in annotations) else []
    if answer.allowed and admitted_form(answer.body) != admitted_form(before):
        done.append("mutated")
    return done


def test_native_policies_give_the_api_servers_verdicts(
        audited: tuple[ControlPlane, AuditLog], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, audit = audited
    server = ApiServer(cluster)
    workloads = workload_cases()
    # What admission sees: the server's own defaulting of each manifest, with no policy bound.
    plain = server.submit_all(workloads)
    refused = collections.Counter(
        a.body.get("reason", str(a.status)) for a in plain if not a.allowed)
    admitted = [c for c, a in zip(workloads, plain, strict=True) if a.allowed]
    baseline = {c.id: admitted_form(a.body) for c, a in zip(workloads, plain, strict=True)
                if a.allowed}
    nodes = node_cases(cluster, server)
    assert len(admitted) + len(nodes) >= 300, (len(admitted), len(nodes), refused)
    sets = policy_sets(tmp_path / "sets")
    differences: list[Difference] = []
    compared: collections.Counter[str] = collections.Counter()
    both_refuse = []
    for generation, policies in enumerate(sets):
        cases = nodes if policies.node_updates else [c for c in admitted
                                                     if c.kind in policies.kinds]
        found, count, refused_by_both = _run_set(cluster, server, audit, policies, generation,
                                                 cases, baseline, tmp_path / f"check-{generation}")
        differences += found
        compared[policies.name] = count
        if refused_by_both:
            both_refuse.append(policies.name)
    by_aspect = collections.Counter(d.aspect for d in differences)
    with capsys.disabled():
        print(f"\nnative admission differential: {len(sets)} policy sets, "
              f"{len(admitted)} workload objects + {len(nodes)} node updates "
              f"({sum(compared.values())} requests compared; {len(workloads) - len(admitted)} "
              f"manifests refused by the API server's own validation: {dict(refused)}); "
              f"{len(differences)} differences ({dict(sorted(by_aspect.items()))})")
        for name, count in compared.items():
            mine = collections.Counter(d.aspect for d in differences if d.policy_set == name)
            state = " (refused by both)" if name in both_refuse else ""
            print(f"  {name}: {count} requests{state}, API server "
                  f"{dict(sorted(OUTCOMES[name].items()))}, differences "
                  f"{dict(sorted(mine.items()))}")
    acted = sum(OUTCOMES.values(), collections.Counter())
    assert all(acted[k] > 0 for k in ("denied", "warned", "audited", "mutated")), acted
    listed = listed_differences()
    unlisted = [d for d in differences if not any(row.covers(d) for row in listed)]
    stale = [row for row in listed if not any(row.covers(d) for d in differences)]
    message = []
    if unlisted:
        message.append(f"{len(unlisted)} differences not listed in docs/compatibility.md:\n" +
                       "\n".join(d.describe() for d in unlisted[:60]))
    if stale:
        message.append("listed in docs/compatibility.md but no longer different (remove): " +
                       "; ".join(f"{r.policy_set} {r.cases} {r.aspect}" for r in stale))
    assert not message, "\n".join(message)
    assert NAMESPACE  # every namespace of the cases exists (prepare_cluster)
