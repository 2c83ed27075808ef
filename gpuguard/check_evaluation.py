"""``gpuguard check``'s evaluation: policies run offline on manifests or AdmissionReviews (its
flags are :mod:`gpuguard.check_command`).

Each object (or AdmissionReview) is evaluated as the webhook would at admission — mutations first,
then validations on the mutated object — and the results per policy and rule are printed with the
JSONPatch. Exit codes: 0 all allowed, 1 some request would be denied, 2 bad input or policy files
(a broken or empty policy set evaluates nothing; a ``-f`` or ``--snapshot`` path that names no
object is bad input, never "all allowed"; so is an object whose ``kind`` or name fields are not
strings — :mod:`policies.facts.identity`, through ``from_object`` — in every output format, and
an ``-n`` or ``--namespace-labels`` the API server would refuse).

With ``--snapshot DIR`` the ``GPUQuota`` documents of the policy files are checked too, against
the usage of the snapshot's pods (pending and running; team scopes from its Namespaces' labels):
the webhook's quota step (:class:`kube.quota_ledger.QuotaAdmission`, as a dry run over an
in-memory ledger and a pod index filled from the snapshot), so the numbers and messages are the
webhook's. CEL policies see the same figures as ``quota``.

The CEL ``authorizer`` (``authorizer.group(..).resource(..).check(verb)``) is answered by the
Kubernetes RBAC rules over the snapshot's Roles, ClusterRoles, RoleBindings and
ClusterRoleBindings (:mod:`policies.rbac`) for ``--user`` / ``--group``; without ``--snapshot`` or
without RBAC objects in it every check is an errored decision (the policy's failurePolicy decides)
and a note says so.

The Nodes among the ``-f`` objects value shared requests as ``gpuguard gpus`` does
(:func:`gpuguard.gpus_command.with_input_nodes`): the GPU facts every policy sees of a pod pinned
to a time-sliced product carry those nodes' replica count.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.table import Table

from gpuguard import policy_set
from gpuguard.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from gpuguard.gpus_command import with_input_nodes
from gpuguard.input_paths import documents_of
from gpuguard.namespace_scope import namespace_problem
from gpuguard.output_formats import versioned, write
from gpuguard.terminal import table_console
from kube.pod_cache import PodUsageIndex
from kube.quota_ledger import MemoryLedgerStore, QuotaAdmission, QuotaDecision, QuotaLedger
from policies.authorization import Authorizer, Unavailable
from policies.cel.library.format import label_value, qualified_name
from policies.engine.evaluation import Engine, RuleOutcome, Verdict
from policies.facts.resource_names import GPUSettings
from policies.facts.review import (
    ReviewError,
    ReviewInput,
    UserInfo,
    from_object,
    from_request,
    namespace_stub,
    runtime_class_names,
)
from policies.facts.workloads import WorkloadFacts, dra_index_of, workload_facts
from policies.json_fields import mapping_at
from policies.policy.loader import only_quotas
from policies.rbac import is_rbac_object, offline_authorizer
from policies.sources import Document, printable, read_documents


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` into a dict: each key a label key and each value a label value, as the API
    server validates a Namespace's labels (apimachinery's ``IsQualifiedName`` and
    ``IsValidLabelValue``, in their words), each key once.

    Raises:
        ValueError: an item without ``=`` or with an empty key, an invalid key or value, a key
            given twice (which value would the namespace carry?); the message names the item.
    """
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--namespace-labels {text!r}: expected k=v[,k=v...], got {item!r}")
        problems = [*(f"key {key!r}: {m}" for m in qualified_name(key)),
                    *(f"value {value!r}: {m}" for m in label_value(value))]
        if problems:
            raise ValueError(f"--namespace-labels {item!r}: not a label: " + "; ".join(problems))
        if key in labels:
            raise ValueError(f"--namespace-labels {text!r}: the key {key!r} is given twice "
                             f"({key}={labels[key]} and {item}): a label has one value")
        labels[key] = value
    return labels


def _review(document: Document, args: argparse.Namespace, labels: Mapping[str, str],
            now: datetime.datetime, snapshot: Snapshot | None = None) -> ReviewInput:
    def labels_of(namespace: str) -> Mapping[str, str]:
        known = snapshot.namespace_labels.get(namespace, {}) if snapshot else {}
        return {**known, **labels}

    body = document.body
    if body.get("kind") == "AdmissionReview":
        review = from_request(body.get("request"), now=now)
        namespace = review.namespace or args.namespace
        return ReviewInput(**{**review.__dict__,
                              "namespace_object": namespace_stub(namespace,
                                                                    labels_of(namespace))})
    metadata = mapping_at(body, "metadata")
    namespace = str(metadata.get("namespace") or args.namespace)
    labels = labels_of(namespace)
    user = UserInfo(username=args.user, groups=tuple(args.group))
    review = from_object(body, user=user, now=now,
                         namespace_object=namespace_stub(namespace, labels))
    return ReviewInput(**{**review.__dict__, "namespace": review.namespace or namespace})


def _with_runtime_classes(review: ReviewInput, classes: frozenset[str] | None) -> ReviewInput:
    return review if classes is None else dataclasses.replace(review, runtime_classes=classes)


@dataclass
class Snapshot:
    """What quota and the CEL ``authorizer`` need of a cluster snapshot: Namespace labels, a
    pod usage index and the RBAC objects (Roles, ClusterRoles and their bindings)."""

    namespace_labels: dict[str, dict[str, str]]
    index: PodUsageIndex
    rbac: list[Mapping[str, Any]] = field(default_factory=list)
    runtime_classes: frozenset[str] | None = None
    dra: list[Mapping[str, Any]] = field(default_factory=list)  # resource.k8s.io objects


def read_snapshot(paths: list[str], settings: GPUSettings) -> tuple[Snapshot, list[str]]:
    """The Namespaces' labels, the Pods and the RBAC objects of a snapshot (files /
    directories); errors."""
    documents, errors = read_documents(paths)
    labels: dict[str, dict[str, str]] = {}
    pods = []
    rbac: list[Mapping[str, Any]] = []
    dra: list[Mapping[str, Any]] = []
    for document in documents:
        body = document.body
        if is_rbac_object(body):
            rbac.append(body)
        if str(body.get("apiVersion", "")).startswith("resource.k8s.io/"):
            dra.append(body)
        metadata = mapping_at(body, "metadata")
        if body.get("kind") == "Namespace" and isinstance(metadata.get("name"), str):
            raw = mapping_at(metadata, "labels")
            labels[metadata["name"]] = {str(k): str(v) for k, v in raw.items()}
        elif body.get("kind") == "Pod" and metadata.get("name"):
            pods.append(body)
    index = PodUsageIndex(lambda name: labels.get(name, {}), settings)
    index.replace(pods)
    classes = runtime_class_names(d.body for d in documents)
    return Snapshot(labels, index, rbac, classes, dra), [*(f"--snapshot: {e}" for e in errors),
                                     *documents_of(documents, errors, paths, "--snapshot")]


def _authorizer(engine: Engine, snapshot: Snapshot | None) -> Authorizer:
    """The CEL ``authorizer``: RBAC over the snapshot's RBAC objects; with none, every check
    is an errored decision (the policy's failurePolicy decides) and a note says why."""
    if snapshot is None:
        authorizer: Authorizer = Unavailable(
            "no --snapshot was given, so authorizer checks cannot be decided offline (give the "
            "cluster's Roles, ClusterRoles and bindings with --snapshot)")
    else:
        authorizer = offline_authorizer(snapshot.rbac)
    if engine.uses_authorizer and isinstance(authorizer, Unavailable):
        print(f"gpuguard: note: policies use authorizer, but {authorizer.error}",
              file=sys.stderr)
    return authorizer


def _quota_request(document: Document, review: ReviewInput) -> dict[str, Any]:
    """The AdmissionRequest the webhook's quota step would see (always a dry run here)."""
    body = document.body
    if body.get("kind") == "AdmissionReview" and isinstance(body.get("request"), Mapping):
        request = dict(body["request"])
    else:
        request = {"uid": "gpuguard-check", "operation": review.operation, "object": body}
    request.setdefault("namespace", review.namespace)
    request.setdefault("name", review.name)
    return {**request, "dryRun": True}


def _notes(review: ReviewInput, verdict: Verdict, settings: GPUSettings,
           warnings: list[str]) -> list[str]:
    """Gpuguard's own word on the object: a kind it does not model (judged from what a
    structural search found), and accelerator-looking resources the GPU registry does not know
    (``GPUFacts.unrecognized``: no policy sees them as GPUs, so the object is judged as asking for
    none of them) — only those no warning of the policies names already (the library's
    ``unrecognized-accelerator`` warns about each): that note is for a policy set that says
    nothing about them, never a second copy of the warning. The facts are the verdict's;
    computed here only when no policy applied."""
    facts = verdict.facts
    if facts is None and isinstance(review.object, Mapping):
        facts = workload_facts(review.object, settings=settings, dra=review.dra)
    if facts is None:
        return []
    modelled = [facts.workload.not_modelled] if facts.workload.not_modelled else []
    unverified = [] if review.runtime_classes is not None else [
        f"{r.policy}: {r.message} applied without knowing whether the cluster has that "
        "RuntimeClass (a pod naming a missing one is refused): give the cluster's RuntimeClass "
        "objects with -f or --snapshot to check it"
        for r in verdict.results
        if r.outcome == RuleOutcome.MUTATE and r.message.startswith("setRuntimeClassName ")]
    unrecognized = [f"{name}: unrecognized accelerator resource, judged as no GPU by every "
                    f"policy (--gpu-resource {name} counts it as whole devices)"
                    for name in facts.total.unrecognized
                    if not any(name in warning for warning in warnings)]
    return [*modelled, *unverified, *unrecognized, *_missing_claims(review, facts)]


def _missing_claims(review: ReviewInput, facts: WorkloadFacts) -> list[str]:
    """A note for each DRA claim the object names that is not among the ``-f`` and
    ``--snapshot`` objects (``DraClaim.found``): its devices — whole GPUs, MIG slices of which
    profile, or none — are unknown, so a policy on them (``mig-profile-allowed``, a GPU count)
    passes it unjudged. At admission the same holds (a Pod arrives without its claim), and the
    claim is judged itself when it is created; here the user is told what to add."""
    where = f" in namespace {review.namespace}" if review.namespace else ""
    return [f"{claim.path}: {claim.source}{where} is not in the input, so its devices (how many "
            "GPUs, which MIG profile) are unknown and no policy judged them; give it with -f or "
            "--snapshot (at admission it is judged itself when it is created)"
            for claim in facts.total.dra_claims if not claim.found]


def _input_errors(review: ReviewInput, verdict: Verdict, settings: GPUSettings) -> list[str]:
    """The fields of the object the GPU facts found not of their API types
    (``GPUFacts.input_errors``: ``spec.containers[0].securityContext.privileged: expected a boolean,
    got str``), each naming its path: the API server refuses such an object, so ``check`` reports
    them as input errors (exit 2) beside the verdict instead of calling the object allowed. The
    facts are the verdict's; computed here only when no policy applied."""
    facts = verdict.facts
    obj = review.object if review.object is not None else review.old_object
    if facts is None and isinstance(obj, Mapping):
        facts = workload_facts(obj, settings=settings, dra=review.dra)
    return list(facts.total.input_errors) if facts is not None else []


def _entry(document: Document, review: ReviewInput, verdict: Verdict, settings: GPUSettings,
           quota: QuotaDecision | None = None) -> dict[str, Any]:
    quota = quota or QuotaDecision()
    message = "; ".join(m for m in ("; ".join(quota.denials), verdict.message) if m)
    warnings = [*quota.warnings, *verdict.warning_texts]
    return {
        "source": document.location,
        "kind": review.kind[2], "namespace": review.namespace, "name": review.name,
        "operation": review.operation,
        "allowed": verdict.allowed and quota.allowed,
        "message": message,
        "quota": {"allowed": quota.allowed, "denials": list(quota.denials),
                  "warnings": list(quota.warnings), "usage": dict(quota.cel)},
        "warnings": warnings,
        # gpuguard's own word, apart from the warnings the webhook would return
        "notes": _notes(review, verdict, settings, warnings),
        "inputErrors": _input_errors(review, verdict, settings),
        "auditAnnotations": dict(verdict.audit_annotations),
        "patch": list(verdict.patch),
        "results": [r.to_dict() for r in verdict.results],
    }


def _print_table(entries: list[dict[str, Any]]) -> None:
    console = table_console(160)
    for entry in entries:
        decision = "[green]allowed[/]" if entry["allowed"] else "[red]DENIED[/]"
        title = f"{entry['kind']}/{entry['namespace'] or '-'}/{entry['name'] or '-'} " \
                f"({entry['source']})"
        if entry["inputErrors"]:
            decision += " [red](input errors)[/]"
        console.print(f"{escape(printable(title))}: {decision}")
        for problem in entry["inputErrors"]:
            console.print(f"  input error: {printable(problem)}", markup=False, highlight=False)
        for denial in entry["quota"]["denials"]:
            console.print(f"  quota: {printable(denial)}", markup=False, highlight=False)
        table = Table(show_header=True, box=None, padding=(0, 2))
        for column in ("policy", "rule", "outcome", "message"):
            table.add_column(column, overflow="fold")
        for result in entry["results"]:
            if result["outcome"] == "pass":
                continue
            cells = (result["policy"], result["rule"], result["outcome"],
                     result["message"] if result["outcome"] != "mutate" else "")
            table.add_row(*(escape(printable(str(c))) for c in cells))
        if table.row_count:
            console.print(table)
        for warning in entry["warnings"]:
            console.print(f"  warning: {printable(warning)}", markup=False, highlight=False)
        for note in entry["notes"]:
            console.print(f"  note: {printable(note)}", markup=False, highlight=False)
        if entry["patch"]:
            console.print("  patch: " + json.dumps(entry["patch"]), markup=False,
                          highlight=False)


def run(args: argparse.Namespace, settings: GPUSettings) -> int:
    """Evaluate the policies on every object under ``args.filename``; see module docstring."""
    try:
        labels = parse_labels(args.namespace_labels or "")
        problem = namespace_problem(args.namespace)
        if problem:
            raise ValueError(f"-n {args.namespace!r}: not a namespace name: {problem}")
    except ValueError as exc:
        print(f"gpuguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    documents, errors = read_documents(args.filename)
    settings = with_input_nodes(settings, documents)  # Nodes of the input value shared requests
    loaded = policy_set.load(args.policies, settings)
    for error in loaded.errors:
        print(f"gpuguard: policy error: {error}", file=sys.stderr)
    for warning in loaded.warnings:  # e.g. a policy without a binding: not evaluated, said so
        print(f"gpuguard: policy warning: {warning}", file=sys.stderr)
    if loaded.errors:
        return EXIT_USAGE
    if not loaded.engine.policies.policies and not (args.snapshot
                                                    and loaded.engine.policies.quotas):
        # Evaluating nothing would allow everything: refuse rather than fail open. (A set with
        # neither policies nor quotas is refused by policy_set.load; here it holds quotas only.)
        where = ", ".join(args.policies or ["the library"])
        print("gpuguard: error: " + only_quotas(
            where, len(loaded.engine.policies.quotas),
            "check judges GPUQuotas against the usage of a cluster snapshot: give --snapshot "
            "PATH (its Pods and Namespaces), or policy files with a policy to evaluate"),
            file=sys.stderr)
        return EXIT_USAGE
    problems = [str(e) for e in errors] + documents_of(documents, errors, args.filename)
    engine: Engine = loaded.engine
    snapshot: Snapshot | None = None
    quota_check: QuotaAdmission | None = None
    if args.snapshot:
        snapshot, snapshot_errors = read_snapshot(args.snapshot, settings)
        problems.extend(snapshot_errors)
    # Pods' DRA claims are resolved against the ResourceClaimTemplates, ResourceClaims,
    # DeviceClasses and ResourceSlices of -f and --snapshot, as the API server would have them.
    dra = dra_index_of([*(d.body for d in documents), *(snapshot.dra if snapshot else ())])
    if snapshot is not None:
        if not engine.policies.quotas and not engine.uses_authorizer:
            print("gpuguard: note: --snapshot given but the policy files hold no GPUQuota "
                  "documents", file=sys.stderr)
        quota_check = QuotaAdmission(
            engine.policies.quotas, QuotaLedger(MemoryLedgerStore(), snapshot.index),
            snapshot.index.namespace_labels, settings, dra)
    authorizer = _authorizer(engine, snapshot)
    now = datetime.datetime.now(datetime.UTC)
    # The cluster's RuntimeClasses, from the RuntimeClass objects of -f and --snapshot (None:
    # not known, and a setRuntimeClassName mutation applies as written, with a note).
    found = [c for c in (runtime_class_names(d.body for d in documents),
                         snapshot.runtime_classes if snapshot else None) if c is not None]
    classes = frozenset().union(*found) if found else None
    entries = []
    located: list[tuple[str, int | None]] = []  # each entry's file and line, for -o sarif
    for document in documents:
        try:
            review = dataclasses.replace(_with_runtime_classes(
                _review(document, args, labels, now, snapshot), classes), dra=dra)
        except ReviewError as exc:
            problems.append(f"{document.location}: {exc}")
            continue
        located.append((document.source, document.line_of("")))
        if quota_check is None:
            entries.append(_entry(document, review, engine.evaluate(review, authorizer=authorizer),
                                  settings))
        else:
            quota = quota_check.admit(_quota_request(document, review))
            entries.append(_entry(document, review, engine.evaluate(
                review, quota=quota.cel, authorizer=authorizer), settings, quota))
        # A field of the wrong type (privileged: "true", containers: null) is an object the API
        # server refuses: an input error naming the path, never a plain "allowed".
        problems.extend(f"{document.location}: {problem}" for problem in entries[-1]["inputErrors"])
    for problem in problems:
        print(f"gpuguard: {problem}", file=sys.stderr)
    if args.output == "sarif":
        from gpuguard.cli import version  # noqa: PLC0415 - only for -o sarif
        from gpuguard.sarif_report import sarif_log  # noqa: PLC0415

        sys.stdout.write(sarif_log(((s, n, e) for (s, n), e in zip(located, entries,
                                                                  strict=True)), version(),
                                   problems))
    elif args.output == "junit":
        from gpuguard.junit_report import check_suites, junit_xml  # noqa: PLC0415 - -o junit only

        sys.stdout.write(junit_xml(check_suites([(s, e) for (s, _), e in zip(
            located, entries, strict=True)], problems), "gpuguard check"))
    elif args.output != "table":
        write(versioned("CheckResult", {"results": entries, "errors": problems}), args.output,
              sys.stdout)
    else:
        _print_table(entries)
    if problems:
        return EXIT_USAGE
    return EXIT_OK if all(e["allowed"] for e in entries) else EXIT_FINDINGS
