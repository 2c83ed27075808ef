"""Compliance: the policy set evaluated at the audit point, once per workload, as findings.

Owns choosing which object stands for each workload and turning the engine's verdicts into
findings. A workload is the root of an ownership chain (:mod:`audit.scan.ownership`); it is
evaluated once, on the most complete object the snapshot has for it: the root object itself (a
Deployment, a CronJob, a RayCluster), else the controller nearest to it (a ReplicaSet whose
Deployment was not captured), else its pods — one of each variant (:func:`pod_variant`: what a
controller stamps on each replica, its name, node, ordinal, token volume, set aside), up to
:data:`VARIANTS_PER_WORKLOAD`, so that a pod claiming the same missing controller as harmless
replicas is judged by its own spec. Bare pods are their own workload. The Namespace
object is passed to the engine (namespaceSelector, ``namespaceObject``); a namespace missing from
the snapshot is a stub with its ``kubernetes.io/metadata.name`` label.

Objects are evaluated as if created — without ``status`` (which a CREATE does not carry) — and
those that might still be needed are kept compressed (zlib over JSON) until the end; roots are
evaluated as soon as they and their namespace are known, in worker processes when ``jobs`` > 1
(forked before the snapshot is read, so they stay small).

Severities: ``deny`` (a failed rule whose policy denies, or an evaluation error under
``failurePolicy: Fail``), ``warn``, ``audit`` (validationActions), ``error`` (an evaluation error
under ``failurePolicy: Ignore``), ``info`` (a mutation admission would apply). Exceptions
(``exempt``) are listed apart. With ``mutation_patches`` set, the RFC 6902 patch of each mutated
workload is kept too. Must not read files or the cluster; never denies or patches.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import multiprocessing
import re
import sys
import zlib
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from audit.scan.ownership import ObjectKey, Ownership
from audit.settings import AuditSettings
from policies.cel.json_values import to_json_data
from policies.engine.evaluation import Engine, RuleOutcome
from policies.facts.review import from_object, namespace_stub
from policies.json_fields import mapping_at
from policies.policy.mutation import diff
from policies.vocabulary import EvaluationPoint, ValidationAction

SEVERITIES = ("deny", "warn", "audit", "error", "info")
VARIANTS_PER_WORKLOAD = 8
"""Pod variants evaluated for a workload whose controllers are not in the input; the pods past it
are counted (:attr:`ComplianceResult.unsampled`) and named in a warning."""
PENDING_VARIANTS = 20_000
"""Pod variants beyond each owner's first held (compressed, ~1 KB each) until the end of the
scan, in all: the pods of an owner read before the owner itself are held so, and a snapshot of
pods only holds them all; past this the pods are counted as unsampled instead."""
# Fields Kubernetes' controllers and network plugins give each replica its own value of: a pod's
# variant sets them aside (StatefulSet ordinals, Indexed Job completion indexes, the pod's IPs as
# Calico and Multus record them).
_REPLICA_LABELS = frozenset({"statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index",
                             "batch.kubernetes.io/job-completion-index"})
_REPLICA_ANNOTATIONS = ("batch.kubernetes.io/job-completion-index", "cni.projectcalico.org/",
                        "k8s.v1.cni.cncf.io/network-status", "k8s.v1.cni.cncf.io/networks-status",
                        "controller.kubernetes.io/pod-deletion-cost")
_TOKEN_NAME = re.compile(rb'"name":"kube-api-access-[a-z0-9]+"')
# a run of 20 digits may be an int past 64 bits, which orjson reads as a float (see _unpack)
_LONG_NUMBER = re.compile(rb"\d{20}")
# orjson refuses, rather than writes as JSON, what JSON would not tell apart from a string or an
# object (a date, a str subclass, a dataclass): pod_variant and _pack then take the exact path
_EXACT_JSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | \
    orjson.OPT_PASSTHROUGH_DATACLASS
_BATCH = 16
#: Batches a policy worker evaluates before the pool replaces it (a fork: cheap). The CEL
#: runtime (cel-expr-python 0.1.3) never frees the arguments and result of a call to a function
#: written in Python (~750 bytes a call; the library's authorizer chain makes 8 a workload), so
#: a worker's memory grows with what it evaluates; replacing it every 4,000 workloads bounds
#: that at ~25 MiB (docs/benchmarks.md, "memory").
_BATCHES_PER_WORKER = 250

ResultTuple = tuple[str, str, str, str, str, tuple[str, ...]]  # policy, rule, path, outcome, ...
Patch = tuple[dict[str, Any], ...]  # RFC 6902 operations


@dataclass(frozen=True, slots=True)
class Finding:
    """One failed (or erroring, or mutating) rule on one workload.

    ``workload`` is the root owner; ``evaluated`` the object the policies saw (the workload, or a
    controller or pod standing for it).
    """

    workload: ObjectKey
    evaluated: ObjectKey
    policy: str
    rule: str
    path: str
    outcome: str
    message: str
    actions: tuple[str, ...]
    severity: str


@dataclass(frozen=True, slots=True)
class Exemption:
    """A policy exception that applied to a workload (``reason`` includes its expiry)."""

    workload: ObjectKey
    policy: str
    reason: str


def severity_of(outcome: str, actions: tuple[str, ...]) -> str | None:
    """The finding severity of a rule result; None for pass / skip / exempt."""
    if outcome == RuleOutcome.MUTATE:
        return "info"
    if outcome == RuleOutcome.ERROR:
        return "deny" if ValidationAction.DENY in actions else "error"
    if outcome != RuleOutcome.FAIL:
        return None
    for action, severity in ((ValidationAction.DENY, "deny"), (ValidationAction.WARN, "warn"),
                             (ValidationAction.AUDIT, "audit")):
        if action in actions:
            return severity
    return "audit"


def _exact_json(value: Any) -> bytes | None:
    """The JSON orjson writes for ``value`` when it reads back as ``value`` exactly; None when
    it might not: a ``null`` (NaN and infinities become one), or a value orjson refuses (see
    ``_EXACT_JSON``; an int past 64 bits, a key that is not a string)."""
    try:
        data = orjson.dumps(value, option=_EXACT_JSON)
    except orjson.JSONEncodeError:
        return None
    return None if b"null" in data else data


def _pack(obj: Mapping[str, Any]) -> bytes:
    """The object as admission would see it created (no ``status``, no ``managedFields``),
    compressed."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    if "status" in obj:
        obj = {k: v for k, v in obj.items() if k != "status"}
    # orjson writes a 1 KB pod in 14 k instructions, json.dumps in 147 k; where its JSON would
    # not be exact, the standard library writes it, as it always did
    data = _exact_json(obj)
    if data is None:
        try:
            data = json.dumps(obj, separators=(",", ":")).encode()
        except TypeError:  # YAML timestamps, binary, non-string keys: JSON them as the API would
            data = json.dumps(to_json_data(obj), separators=(",", ":")).encode()
    return zlib.compress(data, 1)


def _unpack(blob: bytes) -> Any:
    """The object :func:`_pack` packed (orjson reads what it can: 42 k instructions a 1 KB pod,
    json.loads 101 k; the standard library what orjson refuses, a NaN, or would read otherwise:
    an int past 64 bits, which orjson makes a float — a run of 20 digits may be one)."""
    data = zlib.decompress(blob)
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def pod_variant(obj: Mapping[str, Any]) -> int:
    """What tells a pod from its fellow replicas, as the 64-bit hash of its fields (kept per
    variant until the end of the scan: the fields themselves would be ~2 KB; finding another pod's
    hash takes ~2^64 tries, keyed or not): its labels, annotations and spec without what a
    controller stamps on each replica — ``nodeName``, ``hostname``, the ordinal and completion
    index labels, Calico's and Multus' pod IP annotations, the projected service account token
    volume's ``kube-api-access-<random>`` name, the pod's name at the end of a StatefulSet claim
    (``<template>-<pod>``), its node's name in a DaemonSet pod's ``metadata.name`` node affinity
    term — only there: a value that merely equals the pod's or node's name is its own content.
    Equal for the replicas of one template, different for a pod written otherwise.

    The fields are written by orjson and those parts taken out of its bytes as the exact bytes
    orjson writes for them (``"key":value`` is unambiguous in JSON: inside a string the quotes
    are escaped): 49 k instructions a 2 KB pod, where its marshal alone took 33 k. JSON
    tells ``1``, ``1.0`` and ``true`` apart; where it would not be exact — a ``null``, which NaN
    also becomes, or a value orjson refuses (a YAML date, a key that is not a string) — the
    fields' ``marshal`` (format 2) or ``repr`` stands in, unnormalised (such pods are rarer than
    replicas: at worst each is its own variant)."""
    metadata = mapping_at(obj, "metadata")
    parts: Any = {"spec": mapping_at(obj, "spec")}  # the fields present: no null for a missing one
    for field_name in ("labels", "annotations"):
        if metadata.get(field_name) is not None:
            parts[field_name] = metadata[field_name]
    data = _exact_json(parts)
    if data is None:
        try:
            return hash(marshal.dumps(parts, 2))
        except ValueError:
            return hash(repr(parts))
    # each field is taken out as the exact bytes orjson wrote for it (memmem, not a regex)
    spec = parts["spec"]
    node, host = spec.get("nodeName"), spec.get("hostname")
    stamped = [("nodeName", node)] if node is not None else []
    if host is not None:
        stamped.append(("hostname", host))
    labels = parts.get("labels")
    if isinstance(labels, Mapping) and not _REPLICA_LABELS.isdisjoint(labels):
        stamped += [(k, v) for k, v in labels.items() if k in _REPLICA_LABELS]
    annotations = parts.get("annotations")
    if isinstance(annotations, Mapping) and annotations:
        stamped += [(k, v) for k, v in annotations.items()
                    if str(k).startswith(_REPLICA_ANNOTATIONS)]
    for key, value in stamped:
        data = data.replace(orjson.dumps({key: value})[1:-1], b"")
    if b"kube-api-access-" in data:  # the token volume and its mounts, by their name
        data = _TOKEN_NAME.sub(b'"name":"kube-api-access-"', data)
    # The pod's own name and its node's only where a controller writes them, as exact bytes (a
    # value that merely equals the name, "all" in a pod named all, is the pod's own content).
    name = metadata.get("name")
    volumes = spec.get("volumes")
    if isinstance(name, str) and name and isinstance(volumes, list):
        for volume in volumes:  # a StatefulSet claim <template>-<pod>
            claim = volume.get("persistentVolumeClaim") if isinstance(volume, Mapping) else None
            claim_name = claim.get("claimName") if isinstance(claim, Mapping) else None
            if isinstance(claim_name, str) and claim_name.endswith("-" + name):
                data = data.replace(orjson.dumps({"claimName": claim_name})[1:-1],
                                    orjson.dumps({"claimName": claim_name[:-len(name)]})[1:-1])
    if isinstance(node, str) and node:  # a DaemonSet pod's node affinity term
        term = {"key": "metadata.name", "operator": "In", "values": [node]}
        data = data.replace(orjson.dumps(term), orjson.dumps({**term, "values": [""]}))
    return hash(data)


# --- evaluation, in this process or in a worker -------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(engine: Engine, settings: AuditSettings) -> None:
    _WORKER["engine"] = engine
    _WORKER["settings"] = settings


def _evaluate(engine: Engine, settings: AuditSettings, blob: bytes,
              namespace: Mapping[str, Any] | None) -> tuple[tuple[ResultTuple, ...], Patch]:
    """The rule results of one object, and (with ``settings.mutation_patches``) the patch its
    mutations would apply (empty when none changed it)."""
    obj = _unpack(blob)
    try:
        review = from_object(obj, namespace_object=namespace, now=settings.now)
        verdict = engine.evaluate(review, point=EvaluationPoint.AUDIT)
    except Exception as exc:  # the engine promises not to raise; a bug must not stop the audit
        return (("gpuguard", "evaluation", "", RuleOutcome.ERROR,
                 f"evaluation failed: {type(exc).__name__}: {exc}", ()),), ()
    patch: Patch = ()
    if settings.mutation_patches and any(r.outcome == RuleOutcome.MUTATE
                                         for r in verdict.results):
        patch = tuple(diff(review.object, verdict.final_object))
    # Plain strings from here: rows cross to the parent process and end in YAML reports,
    # which YAML's safe dumper cannot write as enum members.
    return tuple((r.policy, r.rule, r.path, str(r.outcome), r.message,
                  tuple(str(action) for action in r.actions)) for r in verdict.results), patch


def _evaluate_batch(batch: list[tuple[Any, Any, bytes, Any, bool]],
                    ) -> list[tuple[Any, Any, Any, Any, bool]]:
    engine, settings = _WORKER["engine"], _WORKER["settings"]
    return [(root, evaluated, *_evaluate(engine, settings, blob, namespace), variant)
            for root, evaluated, blob, namespace, variant in batch]


# What is kept per evaluated workload until the end: the counts of its passed rules per policy,
# and its other rows (findings, exemptions), their repeated strings interned — a workload's
# ~30 passing rows are ~10 KiB as rows fresh from a worker, a few dozen bytes as counts.
Kept = tuple[tuple[tuple[str, int], ...], tuple[ResultTuple, ...]]


def _keep(rows: tuple[ResultTuple, ...], shared: dict[Any, Any]) -> Kept:
    """The compact form of one workload's rule results (see ``Kept``); ``shared`` holds one
    tuple per distinct pass count and action list of the scan (most workloads pass the same
    rules: ~450 bytes a workload, 27 MiB at 1M pods, before they were shared)."""
    passes: dict[str, int] = {}
    others = []
    intern = sys.intern
    for policy, rule, path, outcome, message, actions in rows:
        if outcome == RuleOutcome.PASS:
            policy = intern(policy)
            passes[policy] = passes.get(policy, 0) + 1
        else:
            acts = tuple(intern(a) for a in actions)
            others.append((intern(policy), intern(rule), intern(path), intern(outcome),
                           intern(message) if len(message) < 200 else message,
                           shared.setdefault(acts, acts)))
    passed = tuple(passes.items())
    return shared.setdefault(passed, passed), tuple(others)


def _key(values: tuple[Any, ...]) -> ObjectKey:
    return ObjectKey(*values)


def _tuple(key: ObjectKey) -> tuple[Any, ...]:
    return (key.namespace, key.group, key.kind, key.name)


class EvaluationMemo:
    """Rule results of objects already evaluated, so that a scan repeated over mostly the same
    objects (``gpuguard audit --watch``) evaluates only what changed.

    An entry is keyed by the object as evaluated (its packed bytes), its Namespace object and
    the day (exceptions expire by date); it is valid for one engine only: a caller whose policy
    set changes starts a new memo. Entries not used during a *sweep* (a scan of every object,
    :meth:`begin_sweep` … :meth:`end_sweep`) are dropped at its end, so the memo holds the live
    objects plus those evaluated since the last sweep. Not thread-safe; in-process scans only
    (``jobs`` 0).
    """

    def __init__(self) -> None:
        self._current: dict[bytes, tuple[tuple[ResultTuple, ...], Patch]] = {}
        self._previous: dict[bytes, tuple[tuple[ResultTuple, ...], Patch]] = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def token(blob: bytes, namespace: Mapping[str, Any] | None, day: str) -> bytes:
        """The key of one evaluation (16-byte BLAKE2b digest)."""
        digest = hashlib.blake2b(blob, digest_size=16)
        digest.update(json.dumps(namespace, sort_keys=True, default=str).encode())
        digest.update(day.encode())
        return digest.digest()

    def get(self, token: bytes) -> tuple[tuple[ResultTuple, ...], Patch] | None:
        """The results stored under ``token``, or None."""
        found = self._current.get(token)
        if found is None:
            found = self._previous.get(token)
            if found is not None:
                self._current[token] = found
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, token: bytes, results: tuple[tuple[ResultTuple, ...], Patch]) -> None:
        """Store the results of one evaluation."""
        self._current[token] = results

    def begin_sweep(self) -> None:
        """Start a scan of every object: entries it does not use are dropped at the end."""
        self._previous, self._current = {**self._previous, **self._current}, {}

    def end_sweep(self) -> None:
        """Drop the entries the sweep did not use."""
        self._previous = {}

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)


class Compliance:
    """Collects evaluation candidates while the snapshot streams; :meth:`finish` evaluates.

    Args:
        engine: the policy engine (None: no policies, no findings).
        settings: the audit settings (``now``, ``jobs``).
        ownership: the snapshot's owner links (filled by the scanner).
        memo: results of earlier evaluations by the same engine to reuse (in-process only:
            ignored when ``settings.jobs`` > 0).
    """

    def __init__(self, engine: Engine | None, settings: AuditSettings,
                 ownership: Ownership, memo: EvaluationMemo | None = None) -> None:
        self._engine = engine
        self._settings = settings
        self._ownership = ownership
        self._memo = memo
        self._day = settings.now.date().isoformat()
        self._namespaces: dict[str, dict[str, Any]] = {}
        self._waiting: dict[str, list[tuple[ObjectKey, bytes]]] = defaultdict(list)
        self._stored: dict[ObjectKey, bytes] = {}
        # per owner whose root may be missing: one pod of each variant, (variant, pod, blob)
        # while it has one (most owners: a dict each would cost ~12 MiB at a million pods)
        self._pod_samples: dict[ObjectKey, tuple[int, ObjectKey, bytes]
                                | dict[int, tuple[ObjectKey, bytes]]] = {}
        self._unsampled: Counter[ObjectKey] = Counter()  # by owner: pods past the variant cap
        self._pending = 0  # variants beyond each owner's first held in _pod_samples
        # results of the other variants of a workload: (root, pod evaluated, kept rows)
        self._variants: list[tuple[ObjectKey, ObjectKey, Kept]] = []
        self._done: set[ObjectKey] = set()
        self._results: dict[ObjectKey, tuple[ObjectKey, Kept, Patch]] = {}
        self._shared: dict[Any, Any] = {}  # one tuple per distinct pass counts / actions
        self._batch: list[tuple[Any, Any, bytes, Any, bool]] = []
        self._async: deque[Any] = deque()
        self._pool: Any = None
        if engine is not None and settings.jobs > 0 and \
                "fork" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("fork")
            self._pool = context.Pool(settings.jobs, initializer=_init_worker,
                                      initargs=(engine, settings),
                                      maxtasksperchild=_BATCHES_PER_WORKER)

    def namespace(self, name: str, obj: Mapping[str, Any]) -> None:
        """A Namespace of the snapshot: roots waiting for it are evaluated."""
        metadata = mapping_at(obj, "metadata")
        labels = mapping_at(metadata, "labels")
        annotations = metadata.get("annotations")
        self._namespaces[name] = namespace_stub(
            name, labels, annotations if isinstance(annotations, Mapping) else {})
        for key, blob in self._waiting.pop(name, []):
            self._submit(key, key, blob)

    def namespace_object(self, name: str | None) -> dict[str, Any] | None:
        """The Namespace object for ``name`` (a stub when the snapshot lacks it)."""
        if not name:
            return None
        return self._namespaces.get(name) or namespace_stub(name)

    def offer(self, key: ObjectKey, owner: ObjectKey | None, obj: Mapping[str, Any]) -> None:
        """A workload object or pod of the snapshot (after ``ownership.record``)."""
        if self._engine is None:
            return
        if owner is None:
            if key in self._done:
                return
            if key.namespace is None or key.namespace in self._namespaces:
                self._submit(key, key, _pack(obj))
            else:
                self._waiting[key.namespace].append((key, _pack(obj)))
            return
        if owner.kind == "Pod" and not owner.group and key.kind != "Pod":
            # Whether a pod may own this object is known once the whole input is read (a
            # LeaderWorkerSet's leader pod owns its workers' StatefulSet; see Ownership)
            self._stored[key] = _pack(obj)
            return
        if self._ownership.root(owner) in self._done:
            return  # its workload is in the snapshot and already evaluated
        if key.kind == "Pod" and not key.group:
            samples = self._pod_samples.get(owner)
            if samples is None:
                self._pod_samples[owner] = (pod_variant(obj), key, _pack(obj))
                return
            variant = pod_variant(obj)
            if isinstance(samples, tuple):
                if variant == samples[0]:
                    return
                samples = {samples[0]: (samples[1], samples[2])}
                self._pod_samples[owner] = samples
            if variant not in samples:
                if len(samples) < VARIANTS_PER_WORKLOAD and self._pending < PENDING_VARIANTS:
                    samples[variant] = (key, _pack(obj))
                    self._pending += 1
                else:
                    self._unsampled[owner] += 1
            return
        self._stored[key] = _pack(obj)

    def _submit(self, root: ObjectKey, evaluated: ObjectKey, blob: bytes,
                variant: bool = False) -> None:
        """Evaluate ``evaluated`` for the workload ``root``; ``variant``: another pod variant of
        a workload evaluated already (its findings are added to the workload's)."""
        if not variant:
            if root in self._done:
                return
            self._done.add(root)
        namespace = self.namespace_object(evaluated.namespace)
        if self._pool is None:
            assert self._engine is not None
            if self._memo is None:
                rows, patch = _evaluate(self._engine, self._settings, blob, namespace)
            else:
                token = EvaluationMemo.token(blob, namespace, self._day)
                memo = self._memo.get(token)
                if memo is None:
                    memo = _evaluate(self._engine, self._settings, blob, namespace)
                    self._memo.put(token, memo)
                rows, patch = memo
            self._store(root, evaluated, rows, patch, variant)
            return
        self._batch.append((_tuple(root), _tuple(evaluated), blob, namespace, variant))
        if len(self._batch) >= _BATCH:
            self._flush()

    def _store(self, root: ObjectKey, evaluated: ObjectKey, rows: tuple[ResultTuple, ...],
               patch: Patch, variant: bool) -> None:
        kept = _keep(rows, self._shared)
        if variant:  # the workload's patch is its first variant's
            self._variants.append((root, evaluated, kept))
        else:
            self._results[root] = (evaluated, kept, patch)

    def _flush(self) -> None:
        if self._batch:
            self._async.append(self._pool.apply_async(_evaluate_batch, (self._batch,)))
            self._batch = []
        # Fold in the batches already back, in order: their raw rows (passes included) would
        # otherwise wait for finish() in the pool's result objects, one per workload.
        while self._async and self._async[0].ready():
            self._absorb(self._async.popleft().get())

    def _absorb(self, evaluated: list[tuple[Any, Any, Any, Any, bool]]) -> None:
        for root, subject, rows, patch, variant in evaluated:
            self._store(_key(root), _key(subject), rows, patch, variant)

    def finish(self) -> ComplianceResult:
        """Evaluate every workload not evaluated yet and collect the findings (once: the kept
        results are handed over, not kept twice)."""
        for name in list(self._waiting):
            for key, blob in self._waiting.pop(name):
                self._submit(key, key, blob)
        # a missing root's nearest controllers, each judged (a Deployment's ReplicaSets: its
        # old and new templates), the first read standing for it
        best: dict[ObjectKey, tuple[int, ObjectKey, bytes]] = {}
        others: dict[ObjectKey, list[tuple[ObjectKey, bytes]]] = {}
        unsampled: Counter[ObjectKey] = Counter()
        for key, blob in self._stored.items():
            chain = self._ownership.chain(key)
            root = chain[-1]
            if root in self._done:
                continue
            if root not in best or len(chain) < best[root][0]:
                best[root] = (len(chain), key, blob)
                others[root] = []
                unsampled.pop(root, None)
            elif len(chain) == best[root][0]:
                if len(others[root]) + 1 < VARIANTS_PER_WORKLOAD:
                    others[root].append((key, blob))
                else:
                    unsampled[root] += 1
        for owner, samples in self._pod_samples.items():
            chain = self._ownership.chain(owner)
            root = chain[-1]
            if root not in self._done and root not in best:
                held = list(samples.values()) if isinstance(samples, dict) else \
                    [(samples[1], samples[2])]
                (pod, blob), *rest = held
                best[root] = (len(chain) + 1, pod, blob)
                others[root] = rest
                if self._unsampled[owner]:
                    unsampled[root] += self._unsampled[owner]
        for root, (_, evaluated, blob) in sorted(best.items()):
            self._submit(root, evaluated, blob)
            for pod, other in others.get(root, ()):
                self._submit(root, pod, other, variant=True)
        self._stored.clear()
        self._pod_samples.clear()
        self._unsampled.clear()
        self._pending = 0
        if self._pool is not None:
            self._flush()
            try:
                while self._async:
                    self._absorb(self._async.popleft().get())
            finally:
                self._pool.close()
                self._pool.join()
                self._pool = None
        results, self._results = self._results, {}
        variants, self._variants = self._variants, []
        return _collect(results, variants, unsampled)

    def close(self) -> None:
        """Stop the worker processes (when the scan is abandoned)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


@dataclass(frozen=True)
class ComplianceResult:
    """Findings, exceptions and per-policy counts of one audit.

    ``evaluated`` maps each workload to the object evaluated for it; ``passes`` counts the rules it
    passed; ``by_policy`` counts results per policy: ``pass``, each severity, ``exempt``;
    ``patches`` maps each workload its mutations changed to the RFC 6902 patch they would apply
    (only with ``AuditSettings.mutation_patches``; empty otherwise).
    """

    findings: tuple[Finding, ...]
    exemptions: tuple[Exemption, ...]
    evaluated: Mapping[ObjectKey, ObjectKey]
    passes: Mapping[ObjectKey, int]
    by_policy: Mapping[str, Mapping[str, int]]
    patches: Mapping[ObjectKey, Patch] = field(default_factory=dict)
    unsampled: Mapping[ObjectKey, int] = field(default_factory=dict)
    """Per workload whose controllers are not in the input, its pods past
    :data:`VARIANTS_PER_WORKLOAD` variants: not evaluated (a warning names them)."""


def _collect(results: dict[ObjectKey, tuple[ObjectKey, Kept, Patch]],
             variants: list[tuple[ObjectKey, ObjectKey, Kept]] | None = None,
             unsampled: Mapping[ObjectKey, int] | None = None) -> ComplianceResult:
    """The findings of the kept results, which it empties as it goes (each workload's kept
    rows are freed once its findings exist, so the two are never both whole in memory); a
    workload's other pod variants add their findings after its own, each naming its pod."""
    findings: list[Finding] = []
    exemptions: list[Exemption] = []
    by_policy: dict[str, Counter[str]] = defaultdict(Counter)
    passes: Counter[ObjectKey] = Counter()
    evaluated_for = {root: ev for root, (ev, _, _) in results.items()}
    patches = {root: patch for root, (_, _, patch) in results.items() if patch}
    more: dict[ObjectKey, list[tuple[ObjectKey, Kept]]] = defaultdict(list)
    for root, pod, kept in variants or ():
        more[root].append((pod, kept))
    for root in sorted(results):
        first = results.pop(root)
        exempted: set[tuple[str, str]] = set()  # an exception exempts the workload once
        for evaluated, (passed, rows) in [first[:2], *more.pop(root, ())]:
            _add_results(root, evaluated, passed, rows, findings, exemptions, by_policy,
                         passes, exempted)
    return ComplianceResult(tuple(findings), tuple(exemptions), evaluated_for, dict(passes),
                            {p: dict(c) for p, c in sorted(by_policy.items())}, patches,
                            dict(unsampled or {}))


def _add_results(root: ObjectKey, evaluated: ObjectKey, passed: tuple[tuple[str, int], ...],
                 rows: tuple[ResultTuple, ...], findings: list[Finding],
                 exemptions: list[Exemption], by_policy: dict[str, Counter[str]],
                 passes: Counter[ObjectKey], exempted: set[tuple[str, str]]) -> None:
    """One evaluation's kept results folded into the findings and counts (``exempted``: the
    workload's exemptions so far, each listed once whatever its pod variants)."""
    for policy, count in passed:
        by_policy[policy]["pass"] += count
        passes[root] += count
    for policy, rule, path, outcome, message, actions in rows:
        if outcome == RuleOutcome.EXEMPT:
            if (policy, message) not in exempted:
                exempted.add((policy, message))
                exemptions.append(Exemption(root, policy, message))
                by_policy[policy]["exempt"] += 1
            continue
        severity = severity_of(outcome, actions)
        if severity is None:
            continue
        by_policy[policy][severity] += 1
        findings.append(Finding(root, evaluated, policy, rule, path, outcome, message,
                                actions, severity))
