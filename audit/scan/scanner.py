"""The scan: one pass over a snapshot's objects, then its figures as one typed value.

Owns the order of work. Each object is looked at once, as it streams in (from files or the
cluster), and handed to the parts that need it — Namespaces (teams, policies' ``namespaceObject``),
Nodes (:mod:`audit.scan.node_capacity`), Pods (:mod:`audit.scan.pods` then
:mod:`audit.scan.placement`), workload controllers (:mod:`audit.scan.ownership`, GPU templates) —
and to :mod:`audit.scan.compliance`. Nothing is kept per pod except what placement aggregates. At
the end the parts are asked for their figures, which :meth:`Scanner.finish` hands over as one
:class:`audit.scan.result.ScanResult`; :func:`audit.report.assemble.assemble` turns that into the
report.

Must not read files or the cluster itself (callers pass an iterable of documents), build the
report (it must not import :mod:`audit.report.assemble`: an import-linter contract) or render.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from audit.scan.compliance import (
    PENDING_VARIANTS,
    VARIANTS_PER_WORKLOAD,
    Compliance,
    EvaluationMemo,
)
from audit.scan.node_capacity import node_capacity
from audit.scan.ownership import (
    ObjectKey,
    Ownership,
    controller_of,
    key_of,
    owner_reference_problems,
    refused_controller,
)
from audit.scan.placement import Placement
from audit.scan.pods import PodReader, PodUsage
from audit.scan.result import PolicySetInfo, ScanResult
from audit.scan.utilization import Metrics, utilization_report
from audit.settings import AuditSettings
from policies.engine.evaluation import Engine
from policies.facts.dra import (
    DRA_KINDS,
    ClaimDevices,
    DeviceClassFacts,
    DraIndex,
    claim_devices,
    device_class_facts,
    slice_mig_profiles,
)
from policies.facts.workloads import find_workload
from policies.json_fields import mapping_at
from policies.policy.model import policy_digest, rule_names
from policies.policy.quota import ZERO, Quota, QuotaStatus, Usage, pod_charge
from policies.sources import Document, LoadError, printable

_NOT_WORKLOADS = frozenset({"Service", "ConfigMap", "Secret", "Endpoints", "EndpointSlice",
                            "Event", "PersistentVolumeClaim", "ServiceAccount", "Lease",
                            "ControllerRevision"})


class Scanner:
    """Consumes documents one at a time (:meth:`feed`); :meth:`finish` returns what it found.

    Args:
        settings: the audit settings.
        engine: the policy engine, or None to skip compliance.
        metrics: DCGM metrics, or None.
        progress: called with the number of objects read so far, every 1,000 objects (may be
            set later, as ``progress``).
        quotas: ``GPUQuota`` documents to report usage against (pending and running pods,
            summed per namespace as they stream in: the webhook's numbers).
        memo: earlier evaluations by ``engine`` to reuse (``gpuguard audit --watch``).
    """

    def __init__(self, settings: AuditSettings, engine: Engine | None,
                 metrics: Metrics | None = None,
                 progress: Callable[[int], None] | None = None,
                 quotas: Iterable[Quota] = (), memo: EvaluationMemo | None = None) -> None:
        self.settings = settings
        self.policy_set = engine.policies if engine is not None else None
        self.quotas = tuple(quotas)
        self.quota_usage: dict[str, Usage] = {}  # namespace -> usage of its pods
        self.metrics = metrics
        self.ownership = Ownership()
        self.compliance = Compliance(engine, settings, self.ownership, memo)
        self.placement = Placement(settings)
        # The DRA objects seen so far (the store orders them before pods): pods' claims are
        # resolved with them, MIG slices by profile (an allocated claim's from ResourceSlices).
        self._templates: dict[tuple[str | None, str], ClaimDevices] = {}
        self._claims: dict[tuple[str | None, str], ClaimDevices] = {}
        self._device_classes: dict[str, DeviceClassFacts] = {}
        self._slice_devices: dict[tuple[str, str, str], str | None] = {}
        self._dra = DraIndex(self._templates, self._claims, {}, self._device_classes)
        self.pods = PodReader(settings.gpu, dra=self._dra)
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.present: dict[ObjectKey, bool] = {}  # workload objects -> asks for GPUs
        self.errors: list[str] = []
        self.warnings: list[str] = []
        # accelerator-looking resource names the registry does not know -> the pods and nodes
        # that use them (named in one warning each, never counted as zero without a word)
        self.unrecognized: dict[str, list[str]] = {}
        # objects of kinds the workload registry does not model, in which a structural search
        # found pod templates, PodSpecs or resource blocks: "kind not modelled", per kind
        self.not_modelled: dict[str, list[str]] = {}
        # objects whose controller reference is not followed (a Pod's to a Pod, a Deployment's
        # to a Job, ...: audited as their own workload), "Kind ns/name → Kind name"
        self.refused_owners: list[str] = []
        self.objects = 0
        self.ignored: dict[str, int] = {}
        self.progress = progress
        self._metric_pods = {(ns, pod) for d in (metrics.devices if metrics else ())
                             for ns, pod in d.pods}
        self._pod_refs: dict[tuple[str | None, str], tuple[ObjectKey, str | None]] = {}
        self.duplicate_pods = 0
        # objects given more than once, by kind: what the warnings name (Pods: the first copy
        # counts; Nodes and Namespaces: the last, as a later object of the name replaces it)
        self.duplicates: dict[str, list[str]] = {}

    def _owner_problems(self, body: Mapping[str, Any], key: ObjectKey,
                        owner: ObjectKey | None, location: str) -> None:
        """Note an object whose controller reference is not followed (only ``controller_of``'s
        None can be one: the reference is then read again), and record the input errors of its
        ``ownerReferences`` (not a list, an entry not a map)."""
        if owner is not None:
            return
        refused = refused_controller(body)
        if refused is not None:
            self.refused_owners.append(_owned_by(key, refused))
        for problem in owner_reference_problems(body):
            self.errors.append(f"{location}: {_who(key)}: {problem}")

    def _dra_object(self, body: Mapping[str, Any]) -> None:
        """One ``resource.k8s.io`` object of :data:`~policies.facts.dra.DRA_KINDS`: a DeviceClass
        (its MIG profile, kind), a ResourceSlice (its MIG devices' profiles), a
        ResourceClaimTemplate or ResourceClaim (what the pods naming it get). Each is counted in
        ``ignored`` by its kind, the same for all four: they value pods, they are not audited
        themselves."""
        kind = str(body.get("kind"))
        if kind == "DeviceClass":
            facts = device_class_facts(body)
            if facts.name:
                self._device_classes[facts.name] = facts
        elif kind == "ResourceSlice":
            spec = body.get("spec")
            self._slice_devices.update(slice_mig_profiles(spec if isinstance(spec, Mapping)
                                                          else {}))
        else:
            key = key_of(body)
            if key is not None:
                found = self._templates if kind == "ResourceClaimTemplate" else self._claims
                found[(key.namespace, key.name)] = claim_devices(
                    body, self._device_classes, None, self._slice_devices)
        self.ignored[kind] = self.ignored.get(kind, 0) + 1

    def feed(self, item: Document | LoadError) -> None:
        """Take one document (or one reading error)."""
        if isinstance(item, LoadError):
            self.errors.append(str(item))
            return
        self.objects += 1
        if self.progress is not None and self.objects % 1000 == 0:
            self.progress(self.objects)
        body = item.body
        kind = body.get("kind")
        try:
            if kind == "Pod":
                self._pod(body, item.location)
            elif kind == "Node":
                node = node_capacity(body, self.settings.gpu)
                if node.name in self.placement.nodes:
                    self.duplicates.setdefault("Node", []).append(printable(node.name))
                self.placement.add_node(node)
                for resource in node.facts.unrecognized:
                    self.unrecognized.setdefault(resource, []).append(
                        f"Node {printable(node.name) or '(no name)'}")
                # Unusable values (a GPU count out of int64 range, a negative allocatable) are
                # input errors like an unreadable document: the node is audited without them.
                self.errors += [f"{item.location}: Node {printable(node.name) or '(no name)'}: "
                                f"{problem}" for problem in node.facts.invalid]
            elif kind == "Namespace":
                self._namespace(body)
            elif kind in DRA_KINDS and \
                    str(body.get("apiVersion", "")).startswith("resource.k8s.io/"):
                self._dra_object(body)
            elif kind in _NOT_WORKLOADS:
                self.ignored[str(kind)] = self.ignored.get(str(kind), 0) + 1
            else:
                self._workload(body, item.location)
        except (RecursionError, ValueError, TypeError, AttributeError) as exc:
            # Malformed objects are handled field by field; this is the last line of defence.
            self.errors.append(f"{item.location}: cannot be audited: "
                               f"{type(exc).__name__}: {exc}")

    def _namespace(self, body: Mapping[str, Any]) -> None:
        metadata = mapping_at(body, "metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            return
        labels = mapping_at(metadata, "labels")
        if name in self.namespaces:
            self.duplicates.setdefault("Namespace", []).append(printable(name))
        self.namespaces[name] = {str(k): str(v) for k, v in labels.items()}
        self.compliance.namespace(name, body)

    def _pod_problems(self, body: Mapping[str, Any], location: str) -> bool:
        """Record the input errors of a Pod whose fields are not of their API types (the rule
        and its words: :func:`policies.facts.workloads.find_workload`'s ``invalid``); True when
        the pod cannot be audited — no name, or a retyped identity or state field
        (``metadata``, ``spec.nodeName``, ``status``), which would otherwise read as another
        namespace, a pending pod or a running one."""
        if _well_typed_pod(body):
            return False  # the common case, checked without building the workload
        workload = find_workload(body)
        problems = workload.invalid if workload is not None else ()
        if not problems:
            return False
        metadata = mapping_at(body, "metadata")
        name, namespace = metadata.get("name"), metadata.get("namespace")
        who = (f"{namespace}/" if isinstance(namespace, str) and namespace else "") + (
            name if isinstance(name, str) and name else "(no name)")
        blocking = any(p.startswith(_IDENTITY_FIELDS) for p in problems)
        if not blocking:
            self.errors += [f"{location}: Pod {printable(who)}: {problem}"
                            for problem in problems]
            return False
        gpus = " (it asks for GPUs)" if self.pods.template(
            mapping_at(body, "spec"), metadata, None).gpu_requested else ""
        self.errors.append(f"{location}: Pod {printable(who)}: " + "; ".join(problems)
                           + f"; not audited{gpus}: these fields say which pod it is, where it "
                           "runs or in what state")
        return True

    def _facts_problems(self, usage: PodUsage, location: str) -> None:
        """Record the fields the GPU facts found not of their API types or values
        (``GPUFacts.input_errors``: ``spec.containers[0].securityContext.privileged: expected
        a boolean, got str``) as input errors naming the pod and the path — the pod is still
        audited as read, but the run does not look clean — skipping those
        :meth:`_pod_problems` reported already (the workload reader's)."""
        if not usage.template.input_errors:
            return
        who = printable((f"{usage.key.namespace}/" if usage.key.namespace else "")
                        + usage.key.name)
        for problem in usage.template.input_errors:
            line = f"{location}: Pod {who}: {problem}"
            if line not in self.errors:
                self.errors.append(line)

    def _pod(self, body: Mapping[str, Any], location: str) -> None:
        if self._pod_problems(body, location):
            return
        usage = self.pods.read(body)
        if usage is None:  # unreachable: a nameless pod is an input error above
            self.ignored["Pod without name"] = self.ignored.get("Pod without name", 0) + 1
            return
        owner = self.ownership.record_pod(usage.key.namespace, usage.key.name, usage.owner)
        if owner is False:
            self.duplicate_pods += 1  # the same snapshot given twice: count each pod once
            self.duplicates.setdefault("Pod", []).append(
                f"{usage.key.namespace}/{usage.key.name}" if usage.key.namespace
                else usage.key.name)
            return
        self._owner_problems(body, usage.key, usage.owner, location)
        self._facts_problems(usage, location)
        for resource in usage.template.unrecognized:
            self.unrecognized.setdefault(resource, []).append(
                f"Pod {usage.key.namespace or ''}/{usage.key.name}".replace(" /", " "))
        if self.quotas:
            charge = pod_charge(body, self.settings.gpu, self._dra).usage
            if charge.pods:
                namespace = str(usage.key.namespace or "")
                self.quota_usage[namespace] = self.quota_usage.get(namespace, ZERO) + charge
        tallied = self.placement.add_pod(usage)
        if (usage.key.namespace, usage.key.name) in self._metric_pods:
            self._pod_refs[(usage.key.namespace, usage.key.name)] = (tallied, usage.node)
        self.compliance.offer(usage.key, usage.owner, body)

    def _workload(self, body: Mapping[str, Any], location: str) -> None:
        workload = find_workload(body)
        identity = [p for p in (workload.invalid if workload is not None else ())
                    if p.startswith(("kind", "metadata"))]
        if identity:  # a retyped name or namespace: the object cannot be told apart
            assert workload is not None
            who = (f"{workload.namespace}/" if workload.namespace else "") + (
                workload.name or "(no name)")
            self.errors.append(f"{location}: {printable(workload.kind) or 'object'} "
                               f"{printable(who)}: " + "; ".join(identity)
                               + "; not audited: these fields say which object it is")
            return
        key = key_of(body)
        if key is None:
            self.ignored[f"{body.get('kind')} without name"] = \
                self.ignored.get(f"{body.get('kind')} without name", 0) + 1
            return
        owner = controller_of(body, key.namespace)
        self.ownership.record(key, owner)
        self._owner_problems(body, key, owner, location)
        if workload is None:
            self.ignored[str(key.kind)] = self.ignored.get(str(key.kind), 0) + 1
            return
        if workload.not_modelled is not None:
            kind = workload.not_modelled.partition(":")[0]
            where = f"{key.namespace}/{key.name}" if key.namespace else key.name
            paths = ", ".join(t.path for t in workload.templates)
            self.not_modelled.setdefault(kind, []).append(f"{printable(where)} at {paths}")
        gpu = False
        for template in workload.templates:
            usage = self.pods.template(template.spec, template.metadata, key.namespace)
            if usage.input_errors and workload.vm_domain_path is None:
                who = printable(f"{key.namespace}/{key.name}" if key.namespace else key.name)
                self.errors.extend(
                    f"{location}: {printable(str(key.kind))} {who}: "
                    f"{_rooted(problem, template.spec_path)}" for problem in usage.input_errors)
            self.placement.add_template(usage)
            gpu = gpu or usage.gpu_requested
        self.present[key] = gpu
        self.compliance.offer(key, owner, body)

    # --- the end ------------------------------------------------------------------------------

    def team_of_namespace(self, namespace: str | None) -> str | None:
        """The team of a namespace (its team label's value), None when unlabelled or unknown."""
        if not namespace:
            return None
        return self.namespaces.get(namespace, {}).get(self.settings.team_label) or None

    def quota_statuses(self) -> list[QuotaStatus]:
        """Usage against limits of every quota (namespaces' labels as read)."""
        statuses = []
        for quota in self.quotas:
            used = ZERO
            for namespace, usage in self.quota_usage.items():
                if quota.scope.applies(namespace, self.namespaces.get(namespace, {})):
                    used = used + usage
            statuses.append(QuotaStatus(quota, used))
        return statuses

    def close(self) -> None:
        """Stop the policy workers of a scan that is abandoned (no :meth:`finish`)."""
        self.compliance.close()

    def finish(self, source: Mapping[str, Any], policy_errors: Iterable[str] = (), *,
               inventory: Mapping[str, Any] | None = None,
               warnings: Sequence[str] = ()) -> ScanResult:
        """Evaluate what is left and compute every figure, once.

        Args:
            source: what was audited (the report's ``source``).
            policy_errors: input errors found outside the scan (listed before the scan's own).
            inventory: the ``inventory`` section, when ``--inventory`` was given.
            warnings: warnings found outside the scan (listed after the scan's own).
        """
        compliance = self.compliance.finish()
        root = self.ownership.root
        placement = self.placement.figures(
            team_of=lambda key: self.team_of_namespace(key.namespace), workload_of=root)
        utilization = None
        if self.metrics is not None:
            utilization = utilization_report(self.metrics, self.settings.idle_below,
                                             self._pod_refs, root, self.team_of_namespace)
        errors = [*policy_errors, *self.errors]
        missing = placement.pods_on_missing_nodes
        if missing:
            names = list(missing)
            shown = ", ".join(printable(n) for n in names[:5]) + (
                f" and {len(names) - 5} more" if len(names) > 5 else "")
            on = placement.cluster["on_missing_nodes"]
            unknown = f" (+ {on['unknown_pods']} pod(s) of unknown size)" \
                if on["unknown_pods"] else ""
            self.warnings.append(
                f"{on['pods']} GPU pod(s) run on {len(names)} node(s) missing from the snapshot "
                f"({shown}): their {on['gpu_equivalents']:g} GPU-equivalent(s){unknown} are "
                "valued from the pods' requests alone and counted in the teams and workloads "
                "and as on_missing_nodes in the summary, not in the cluster's allocatable or "
                "allocated")
        # a node's own warnings (labels that disagree, MIG-INVALID) are warnings of the audit:
        # one list, so the summary, stderr and the problems table count the same lines
        # (an unusable value is an input error already, not a warning as well)
        self.warnings += [f"Node {printable(entry['name'])}: {warning}"
                          for entry in placement.nodes for warning in entry["warnings"]
                          if warning not in self.placement.nodes[entry["name"]].facts.invalid]
        for kind, which in (("Pod", "the first copy counts"), ("Node", "the last copy counts"),
                            ("Namespace", "the last copy counts")):
            names = self.duplicates.get(kind, [])
            if names:
                shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more"
                                                if len(names) > 5 else "")
                self.warnings.append(f"{len(names)} {kind}(s) appeared more than once in the "
                                     f"input ({shown}); {which}")
        for resource, users in sorted(self.unrecognized.items()):
            shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
            self.warnings.append(
                f"{printable(resource)}: unrecognized accelerator resource, counted as no GPU "
                f"({len(users)} object(s): {shown}); --gpu-resource {printable(resource)} counts "
                "it as whole devices")
        for kind, objects in sorted(self.not_modelled.items()):
            shown = "; ".join(objects[:5]) + (f"; and {len(objects) - 5} more"
                                              if len(objects) > 5 else "")
            self.warnings.append(
                f"{printable(kind)}: kind not modelled by gpuguard; {len(objects)} object(s) "
                f"judged from what a structural search found ({shown})")
        refused = self.refused_owners + [_owned_by(key, f"Pod {pod.name}")
                                         for key, pod in self.ownership.pod_owned()]
        if refused:
            shown = "; ".join(refused[:5]) + (
                f"; and {len(refused) - 5} more" if len(refused) > 5 else "")
            self.warnings.append(
                f"{len(refused)} object(s) name as their controller a kind that does not create "
                f"them ({shown}): Kubernetes' controllers make Deployments' ReplicaSets, "
                "CronJobs' Jobs and ReplicaSets', StatefulSets', DaemonSets' and Jobs' Pods, and "
                "only a LeaderWorkerSet's leader pod owns a workload (its workers' StatefulSet, "
                "named as the pod); so each is audited as its own workload, by its own spec")
        if compliance.unsampled:
            unsampled = [f"{key} ({count})" for key, count in sorted(compliance.unsampled.items())]
            shown = "; ".join(printable(u) for u in unsampled[:5]) + (
                f"; and {len(unsampled) - 5} more" if len(unsampled) > 5 else "")
            self.warnings.append(
                f"{len(unsampled)} workload(s) not in the input have pods that were not "
                f"evaluated ({shown}): each variant of a workload whose controllers are missing "
                f"is judged by its own spec, up to {VARIANTS_PER_WORKLOAD} a workload and "
                f"{PENDING_VARIANTS:,} held in all; give the controllers to judge them all")
        if placement.skipped_reservation:
            self.warnings.append(
                f"{placement.skipped_reservation} pod(s) in the KAI reservation namespace "
                "were not counted: the fractional pods they hold GPUs for are")
        label = self.settings.team_label
        policy_set = None if self.policy_set is None else PolicySetInfo(
            self.policy_set.digest or None, tuple(self.policy_set.names()),
            {p.name: policy_digest(p) for p in self.policy_set.policies},
            {p.name: rule_names(p) for p in self.policy_set.policies})
        return ScanResult(
            settings=self.settings,
            generated=self.settings.now if self.settings.now.year > 1970
            else datetime.datetime.now(datetime.UTC),
            source=dict(source),
            policy_set=policy_set,
            objects=self.objects,
            ignored=dict(sorted(self.ignored.items())),
            teams={namespace: team for namespace, labels in self.namespaces.items()
                   if (team := labels.get(label))},
            workloads={key: root(key) for key in (*self.present, *placement.tallies)},
            present=dict(self.present),
            placement=placement,
            compliance=compliance,
            utilization=utilization,
            quotas=tuple(self.quota_statuses()),
            inventory=inventory,
            warnings=(*self.warnings, *(utilization or {}).get("warnings", []), *warnings),
            errors=tuple(errors),
        )


def scan(items: Iterable[Document | LoadError], settings: AuditSettings, engine: Engine | None,
         *, metrics: Metrics | None = None, source: Mapping[str, Any] | None = None,
         policy_errors: Iterable[str] = (),
         progress: Callable[[int], None] | None = None,
         quotas: Iterable[Quota] = ()) -> ScanResult:
    """Audit ``items`` and return what the scan found (:func:`audit.report.assemble.assemble`
    makes the report of it, docs/audit-report.md)."""
    scanner = Scanner(settings, engine, metrics, progress, quotas)
    try:
        for item in items:
            scanner.feed(item)
    except BaseException:
        scanner.close()
        raise
    return scanner.finish(source or {}, policy_errors)


# find_workload problems of these fields leave a pod unidentified or its state unknown
_IDENTITY_FIELDS = ("kind", "metadata", "spec.nodeName", "status")


def _rooted(problem: str, spec_path: str) -> str:
    """A problem of :meth:`PodReader.template` (paths from a Pod's ``spec`` / ``metadata``) at
    the template's own place: ``spec.containers[0]...`` -> ``spec.template.spec.containers[0]...``
    for ``spec_path`` ``spec.template.spec``."""
    for root, place in (("spec", spec_path),
                        ("metadata", spec_path.rpartition(".")[0] + ".metadata"
                         if "." in spec_path else "metadata")):
        if problem.startswith(root) and problem[len(root):len(root) + 1] in (".", ":", "["):
            return place + problem[len(root):]
    return problem


def _who(key: ObjectKey) -> str:
    """``Kind ns/name`` (``Kind name`` when cluster-scoped), printable."""
    where = f"{key.namespace}/{key.name}" if key.namespace else key.name
    return f"{printable(key.kind)} {printable(where)}"


def _owned_by(key: ObjectKey, owner: str) -> str:
    """``Kind ns/name → Kind name`` for the warning on controllers that are not followed."""
    return f"{_who(key)} → {printable(owner)}"


def _well_typed_pod(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod's fields that :func:`_IDENTITY_FIELDS` and the GPU count read have their
    API types (a fast check; the messages come from ``find_workload`` when it fails)."""
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    status = pod.get("status")
    if type(metadata) is not dict or type(spec) is not dict:
        return False
    name = metadata.get("name")
    if not (type(name) is str and name) and not (type(metadata.get("generateName")) is str
                                                  and metadata.get("generateName")):
        return False
    if type(name) not in (str, type(None)) or type(metadata.get("generateName")) not in (
            str, type(None)) or type(metadata.get("namespace")) not in (str, type(None)):
        return False
    if type(spec.get("nodeName")) not in (str, type(None)):
        return False
    containers = spec.get("containers")
    if type(containers) is not list or not containers:
        return False
    if status is None:
        return True
    return type(status) is dict and type(status.get("phase")) in (str, type(None))

