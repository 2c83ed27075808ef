"""Native ValidatingAdmissionPolicy / MutatingAdmissionPolicy: kube-apiserver's in-tree admission
against ``gpuguard check``, object by object.

Owns the differential machinery of ``test_differential_admission.py``: the policy sets (every
native policy file of the repository's tests and examples), the objects (corpus workloads plus
generated variants), running them through a real API server with server-side dry run
(``dryRun=All`` runs admission and stores nothing) with gpuguard out of the path, running the
same objects through ``gpuguard check`` with the same policy files, the same namespace (labels)
and the same user, and comparing what a user sees: allowed or denied, the denial message,
warnings, audit annotations (from the API server's audit log) and the mutated object. Must not
decide which differences are acceptable: ``docs/compatibility.md`` lists those.

The object gpuguard evaluates is the one the API server's admission saw: the server's answer to a
dry-run create of the manifest with no policy bound (defaults applied), less uid,
creationTimestamp and managedFields (a validating policy does see uid and creationTimestamp:
docs/compatibility.md says so; no policy compared reads them). Objects the API server itself refuses without
any policy (its own validation: e.g. GPU requests without limits) are counted and left out.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import http.client
import io
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from gpuguard import cli
from policies.engine.evaluation import audit_key
from tests.controlplane.cluster import ControlPlane, wait_until

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
COMPATIBILITY = ROOT / "docs" / "compatibility.md"

# kind -> (API path prefix, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Pod": ("/api/v1", "pods", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "CronJob": ("/apis/batch/v1", "cronjobs", True),
    "Node": ("/api/v1", "nodes", False),
}
API_VERSIONS = {"Pod": "v1", "Node": "v1", "Job": "batch/v1", "CronJob": "batch/v1"}
GROUP = "gpuguard:differential"  # bound to cluster-admin; every request impersonates a member


@dataclass(frozen=True)
class Namespace:
    """A namespace of the test cluster and the labels gpuguard is given for it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


NAMESPACES = (
    Namespace("default"),
    Namespace("team-a", {"gpuguard.io/team": "training", "environment": "test"}),
    Namespace("restricted", {"gpuguard.io/team": "inference",
                             "gpuguard.io/gpu-sharing": "restricted"}),
    Namespace("gpu-operator"),
    Namespace("demo", {"environment": "test"}),
    Namespace("gpuguard-system"),
)
NAMESPACE = {n.name: n for n in NAMESPACES}


@dataclass(frozen=True)
class User:
    """Who a request comes from (impersonated at the API server, ``--user/--group`` for check)."""

    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def headers(self) -> list[tuple[str, str]]:
        """Impersonation headers (RFC 3986-escaped extra keys, as kube-apiserver expects)."""
        result = [("Impersonate-User", self.name)]
        result += [("Impersonate-Group", g) for g in (GROUP, *self.groups)]
        for key, values in self.extra.items():
            header = "Impersonate-Extra-" + urllib.parse.quote(key, safe="")
            result += [(header, v) for v in values]
        return result

    def user_info(self) -> dict[str, Any]:
        """The userInfo the API server builds for this impersonation (system:authenticated
        added, as the impersonation filter does)."""
        info: dict[str, Any] = {"username": self.name,
                                "groups": [GROUP, *self.groups, "system:authenticated"]}
        if self.extra:
            info["extra"] = {k: list(v) for k, v in self.extra.items()}
        return info


USERS = (User("alice"), User("bob", ("ml-team",)), User("carol"))


# --- objects ------------------------------------------------------------------------------------


@dataclass
class Case:
    """One request: ``body`` created (or, with ``old``, updated) in ``namespace`` by ``user``."""

    id: str
    body: dict[str, Any]
    namespace: str
    user: User
    old: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return str(self.body["kind"])


def corpus_workloads() -> list[tuple[str, dict[str, Any]]]:
    """(id, object) of every Pod and built-in workload in tests/data/manifests and tests/data/wild."""
    found = []
    for folder in ("manifests", "wild"):
        for path in sorted((DATA / folder).glob("*.yaml")):
            try:
                documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
            except yaml.YAMLError:
                continue  # a corpus file that is not YAML is another test's business
            for index, body in enumerate(documents):
                if not isinstance(body, dict) or body.get("kind") not in RESOURCES or \
                        body.get("kind") == "Node":
                    continue
                kind = body["kind"]
                if str(body.get("apiVersion")) != API_VERSIONS.get(kind, "apps/v1"):
                    continue
                found.append((f"{folder}/{path.stem}#{index}", _clean(body)))
    return found


def _clean(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    metadata = body.setdefault("metadata", {}) or {}
    body["metadata"] = metadata
    for key in ("namespace", "resourceVersion", "uid", "creationTimestamp"):
        metadata.pop(key, None)
    if not metadata.get("name"):  # generateName: the server would pick a random name
        metadata["name"] = str(metadata.pop("generateName", "object")).rstrip("-") + "-x"
    metadata.pop("generateName", None)
    body.pop("status", None)
    return body


def pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Pod or of a workload's template (CronJob: the job's template)."""
    if body["kind"] == "Pod":
        return body.setdefault("spec", {})
    spec = body.setdefault("spec", {})
    if body["kind"] == "CronJob":
        spec = spec.setdefault("jobTemplate", {}).setdefault("spec", {})
    return spec.setdefault("template", {}).setdefault("spec", {})


def pod_metadata(body: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a Pod or of a workload's pod template."""
    if body["kind"] == "Pod":
        return body["metadata"]
    spec = body["spec"]
    if body["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template = spec["template"]
    if not isinstance(template.get("metadata"), dict):
        template["metadata"] = {}
    return template["metadata"]


def _containers(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_spec(body).get("containers") or [])


def _limits(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.setdefault("resources", {}) or {}
    container["resources"] = resources
    limits = resources.setdefault("limits", {}) or {}
    resources["limits"] = limits
    return limits


def _privileged(body: dict[str, Any]) -> None:
    _containers(body)[0].setdefault("securityContext", {})["privileged"] = True


def _env_bypass(body: dict[str, Any]) -> None:
    pod_spec(body)["containers"].append({
        "name": "sidecar", "image": "busybox:1.36",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})


def _queue_label(body: dict[str, Any]) -> None:
    pod_metadata(body).setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "team-a"


def _mig(profile: str) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        limits = _limits(_containers(body)[0])
        limits.pop("nvidia.com/gpu", None)
        limits[f"nvidia.com/mig-{profile}"] = 1
        requests = _containers(body)[0]["resources"].get("requests") or {}
        requests.pop("nvidia.com/gpu", None)
    return apply


def _gpus(count: int) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        container = _containers(body)[0]
        _limits(container)["nvidia.com/gpu"] = count
        requests = container["resources"].get("requests")
        if isinstance(requests, dict) and "nvidia.com/gpu" in requests:
            requests["nvidia.com/gpu"] = count
    return apply


def _tolerated(body: dict[str, Any]) -> None:
    spec = pod_spec(body)
    spec.setdefault("tolerations", []).append(
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    spec["runtimeClassName"] = "nvidia"


def _shared(body: dict[str, Any]) -> None:
    _limits(_containers(body)[0])["nvidia.com/gpu.shared"] = 1
    pod_metadata(body).setdefault("annotations", {})["gpu-fraction"] = "0.5"


def _demo_name(body: dict[str, Any]) -> None:
    body["metadata"]["name"] = "demo-" + body["metadata"]["name"]


def _replicas(body: dict[str, Any]) -> None:
    if body["kind"] in ("Deployment", "StatefulSet", "ReplicaSet"):
        body["spec"]["replicas"] = 60


# (name, namespace, user index, change): each corpus object once per variant.
VARIANTS: tuple[tuple[str, str, int, Callable[[dict[str, Any]], None] | None], ...] = (
    ("as-is", "default", 0, None),
    ("team", "team-a", 1, None),
    ("restricted", "restricted", 1, _shared),
    ("exempt", "gpu-operator", 0, _privileged),
    ("privileged", "team-a", 0, _privileged),
    ("env-bypass", "default", 2, _env_bypass),
    ("queued-mig", "team-a", 1, lambda b: (_queue_label(b), _mig("3g.20gb")(b))),
    ("mig-inference", "restricted", 1, _mig("7g.80gb")),
    ("mig-unknown", "default", 0, _mig("5g.50gb")),
    ("eight-gpus", "demo", 2, _gpus(8)),
    ("tolerated", "default", 1, _tolerated),
    ("demo", "default", 0, lambda b: (_demo_name(b), _replicas(b))),
)


def workload_cases() -> list[Case]:
    """Every corpus workload in every variant (see :data:`VARIANTS`)."""
    cases = []
    for object_id, body in corpus_workloads():
        for name, namespace, user, change in VARIANTS:
            variant = copy.deepcopy(body)
            if change is not None:
                change(variant)
            cases.append(Case(f"{object_id}:{name}", variant, namespace, USERS[user]))
    return cases


# --- policy sets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySet:
    """One policy file (policies, bindings, params) and the kinds of object its policies match."""

    name: str
    path: Path
    documents: tuple[dict[str, Any], ...]
    kinds: frozenset[str]
    node_updates: bool = False

    @property
    def mutating(self) -> bool:
        return any(d.get("kind") == "MutatingAdmissionPolicy" for d in self.documents)


def _kinds(documents: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    plural = {v[1]: k for k, v in RESOURCES.items()}
    kinds: set[str] = set()
    for document in documents:
        if not str(document.get("kind", "")).endswith("AdmissionPolicy"):
            continue
        rules = ((document.get("spec") or {}).get("matchConstraints") or {}).get(
            "resourceRules") or []
        for rule in rules:
            for resource in rule.get("resources") or []:
                if resource == "*":
                    kinds |= set(RESOURCES)
                elif resource in plural:
                    kinds.add(plural[resource])
    return frozenset(kinds)


def policy_set(name: str, path: Path) -> PolicySet:
    """Read one policy file."""
    documents = tuple(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    kinds = _kinds(documents)
    return PolicySet(name, path, documents, kinds, node_updates=kinds == {"Node"})


def policy_sets(scratch: Path) -> list[PolicySet]:
    """Every native policy file of the repository: tests/data/native-admission/**, the native
    policies written inline in tests/core/test_engine.py, and the VAP of deploy/ (its only one)."""
    from tests.core import test_engine

    scratch.mkdir(parents=True, exist_ok=True)
    sets = [policy_set(str(p.relative_to(DATA / "native-admission")).removesuffix(".yaml"), p)
            for p in sorted((DATA / "native-admission").rglob("*.yaml"))]
    for name in ("NATIVE_VAP", "NATIVE_MAP"):
        path = scratch / f"test_engine.{name}.yaml"
        path.write_text(getattr(test_engine, name), encoding="utf-8")
        sets.append(policy_set(f"tests/core/test_engine.py:{name}", path))
    deploy = ROOT / "deploy" / "overlays" / "inventory-daemonset" / "restrict-node-patch.yaml"
    sets.append(policy_set("deploy/inventory-daemonset/restrict-node-patch", deploy))
    return sets


# --- the API server side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerAnswer:
    """What kube-apiserver answered to one request."""

    status: int
    body: dict[str, Any]
    warnings: tuple[str, ...]
    audit_id: str

    @property
    def allowed(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return "" if self.allowed else str(self.body.get("message", ""))


_WARNING = re.compile(r'^\d{3} \S+ "((?:[^"\\]|\\.)*)"')


class ApiServer:
    """Raw HTTPS requests to the control plane as an impersonated user (one connection per
    thread), so the test sees status, body, warnings and the audit ID exactly. ``timeout_s``:
    how long one answer may take (a deletecollection of thousands of pods takes longer than
    the default)."""

    def __init__(self, control_plane: ControlPlane, timeout_s: float = 30.0) -> None:
        self.control_plane = control_plane
        self.timeout_s = timeout_s
        parsed = urllib.parse.urlsplit(control_plane.server)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self.context = control_plane.ssl_context()
        self.local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                                     timeout=self.timeout_s)
            self.local.connection = connection
        return connection

    def request(self, method: str, path: str, body: Mapping[str, Any] | None,
                user: User | None) -> ServerAnswer:
        """One request; retried once on a dropped keep-alive connection."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):
            connection = self._connection()
            try:
                connection.putrequest(method, path)
                connection.putheader("Content-Type", "application/json")
                connection.putheader("Accept", "application/json")
                for key, value in (user.headers() if user else []):
                    connection.putheader(key, value)
                connection.putheader("Content-Length", str(len(data or b"")))
                connection.endheaders(data)
                response = connection.getresponse()
                raw = response.read()
            except (ConnectionError, http.client.HTTPException):
                self.local.connection = None
                connection.close()
                if attempt:
                    raise
                continue
            warnings = tuple(json.loads(f'"{m[1]}"') for h in response.headers.get_all(
                "Warning") or [] if (m := _WARNING.match(h)))
            return ServerAnswer(response.status, json.loads(raw or b"{}"), warnings,
                                response.headers.get("Audit-Id", ""))
        raise AssertionError("unreachable")

    def path(self, case: Case, *, dry_run: bool = True) -> str:
        prefix, plural, namespaced = RESOURCES[case.kind]
        where = f"{prefix}/namespaces/{case.namespace}/{plural}" if namespaced else \
            f"{prefix}/{plural}"
        if case.old is not None:
            where += "/" + case.body["metadata"]["name"]
        return where + ("?dryRun=All" if dry_run else "")

    def submit(self, case: Case) -> ServerAnswer:
        """Dry-run create (or update, with ``case.old``) as ``case.user``; a binding whose
        param informer has not synced yet is asked again until it has (condition, not time)."""
        method = "PUT" if case.old is not None else "POST"

        def answer() -> ServerAnswer | None:
            got = self.request(method, self.path(case), case.body, case.user)
            return None if "not yet synced" in got.message else got

        return wait_until(answer, f"{case.id}: param informer sync", deadline_s=60,
                          interval_s=0.2)

    def submit_all(self, cases: Sequence[Case]) -> list[ServerAnswer]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(self.submit, cases))


def admin(control_plane: ControlPlane, *args: str, input: str | None = None) -> str:
    """kubectl as admin; raises with stderr on failure."""
    done = control_plane.kubectl(*args, input=input)
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def prepare_cluster(control_plane: ControlPlane) -> None:
    """Namespaces with their labels, the impersonation group as cluster-admin, RuntimeClass
    nvidia (the mutations set runtimeClassName and the RuntimeClass admission plugin checks it)."""
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": n.name, "labels": dict(n.labels)}} for n in NAMESPACES
        if n.name != "default"]
    documents += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "gpuguard-differential"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cluster-admin"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                       "name": GROUP}]},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
         "metadata": {"name": "nvidia"}, "handler": "nvidia"},
    ]
    admin(control_plane, "apply", "-f", "-", input="\n---\n".join(
        json.dumps(d) for d in documents))


class Probe:
    """Tells when the admission plugins run a policy set: a probe VAP (denying a ConfigMap named
    ``<probe>-v``) and a probe MAP (labelling one named ``<probe>-m``), created after the set's
    objects. The plugins build their policy snapshot from informer caches, which receive objects
    in resourceVersion order, so once both probes act the set's policies and bindings (created
    before them) are in effect; once both stop, the set's are gone too."""

    def __init__(self, server: ApiServer, generation: int) -> None:
        self.server = server
        self.name = f"gpuguard-differential-probe-{generation}"

    def documents(self) -> list[dict[str, Any]]:
        def rules(suffix: str) -> dict[str, Any]:
            return {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                       "operations": ["CREATE"], "resources": ["configmaps"]}]}

        def only(suffix: str) -> list[dict[str, str]]:
            return [{"name": "probe",
                     "expression": f"object.metadata.name == '{self.name}-{suffix}'"}]

        registration = "admissionregistration.k8s.io/v1"
        return [
            {"apiVersion": registration, "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": self.name},
             "spec": {"matchConstraints": rules("v"), "matchConditions": only("v"),
                      "validations": [{"expression": "false", "message": "probe"}]}},
            {"apiVersion": registration, "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": self.name},
             "spec": {"policyName": self.name, "validationActions": ["Deny"]}},
            {"apiVersion": registration, "kind": "MutatingAdmissionPolicy",
             "metadata": {"name": self.name},
             "spec": {"matchConstraints": rules("m"), "matchConditions": only("m"),
                      "reinvocationPolicy": "Never", "mutations": [{
                          "patchType": "JSONPatch", "jsonPatch": {"expression": (
                              "[JSONPatch{op: 'add', path: '/data', "
                              "value: {'probe': 'yes'}}]")}}]}},
            {"apiVersion": registration, "kind": "MutatingAdmissionPolicyBinding",
             "metadata": {"name": self.name}, "spec": {"policyName": self.name}},
        ]

    def _state(self) -> tuple[bool, bool]:
        """(the probe VAP denies, the probe MAP mutates), asked with dry-run creates."""
        def create(suffix: str) -> ServerAnswer:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"{self.name}-{suffix}"}}
            return self.server.request(
                "POST", "/api/v1/namespaces/default/configmaps?dryRun=All", body, None)

        validating, mutating = create("v"), create("m")
        return (not validating.allowed and "probe" in validating.message,
                mutating.allowed and (mutating.body.get("data") or {}).get("probe") == "yes")

    def wait_active(self) -> None:
        wait_until(lambda: self._state() == (True, True), f"{self.name}: policies in effect",
                   deadline_s=60, interval_s=0.1)

    def wait_gone(self) -> None:
        wait_until(lambda: self._state() == (False, False), f"{self.name}: policies removed",
                   deadline_s=60, interval_s=0.1)


class AuditLog:
    """The API server's audit log (JSON lines), read by audit ID."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: dict[str, dict[str, Any]] = {}
        self.offset = 0

    def _read(self) -> None:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                self.events[event["auditID"]] = event

    def annotations(self, audit_ids: Sequence[str]) -> list[dict[str, str]]:
        """The annotations of each request's ResponseComplete event, waiting until all are
        written (the log backend writes after the response)."""
        def complete() -> bool:
            self._read()
            return all(i in self.events for i in audit_ids)
        wait_until(complete, "audit events", deadline_s=60, interval_s=0.1)
        return [dict(self.events[i].get("annotations") or {}) for i in audit_ids]


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "verbs": ["create", "update"]}, {"level": "None"}],
}


# --- gpuguard check ---------------------------------------------------------------------------


def gpuguard_check(policy_file: Path, documents: Sequence[Mapping[str, Any]], namespace: str,
                   user: User, scratch: Path) -> list[dict[str, Any]]:
    """``gpuguard check -o json`` (the CLI's own entry point, in this process) on ``documents``
    as objects of ``namespace`` created by ``user``; one result per document, in order.

    Raises:
        PolicyLoadError: the policy file does not load (exit 2 with policy errors).
    """
    scratch.mkdir(parents=True, exist_ok=True)
    inputs = scratch / "objects.yaml"
    inputs.write_text("\n---\n".join(json.dumps(d) for d in documents), encoding="utf-8")
    labels = ",".join(f"{k}={v}" for k, v in NAMESPACE[namespace].labels.items())
    argv = ["check", "-f", str(inputs), "--policies", str(policy_file), "--namespace", namespace,
            "--user", user.name, "-o", "json"]
    argv += [a for g in user.user_info()["groups"] for a in ("--group", g)]
    if labels:
        argv += ["--namespace-labels", labels]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    if code == 2 and "policy error" in err.getvalue():
        raise PolicyLoadError(err.getvalue().strip())
    if code not in (0, 1):
        raise AssertionError(f"gpuguard check exited {code}: {err.getvalue()}")
    results = json.loads(out.getvalue())["results"]
    assert len(results) == len(documents), err.getvalue()
    return list(results)


class PolicyLoadError(Exception):
    """gpuguard refused a policy file."""


def admission_review(case: Case) -> dict[str, Any]:
    """The AdmissionReview an UPDATE case stands for (``gpuguard check`` reads those)."""
    _, plural, _ = RESOURCES[case.kind]
    version = API_VERSIONS.get(case.kind, "apps/v1")
    group, _, version = version.rpartition("/")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "differential", "kind": {"group": group, "version": version, "kind": case.kind},
        "resource": {"group": group, "version": version, "resource": plural},
        "name": case.body["metadata"]["name"], "operation": "UPDATE",
        "userInfo": case.user.user_info(), "object": case.body, "oldObject": case.old,
        "dryRun": True}}


# --- comparing ------------------------------------------------------------------------------------


_SERVER_ADDED = ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields")


def admitted_form(body: Mapping[str, Any]) -> dict[str, Any]:
    """An object without what the server adds after admission (uid, timestamps, ...); the uid
    is also replaced where the server copied it (a Job's controller-uid selector labels)."""
    uid = str((body.get("metadata") or {}).get("uid") or "")
    text = json.dumps(body)
    result = json.loads(text.replace(uid, "<uid>") if uid else text)
    metadata = result.get("metadata") or {}
    for key in _SERVER_ADDED:
        metadata.pop(key, None)
    return result


# After the status's own prefix: 'pods "x" is forbidden: ' (403) or '... is invalid: ' (422).
# A VAP's validation denies as "ValidatingAdmissionPolicy 'p' with binding 'b' denied request";
# a MAP's failure and a binding's configuration error as "policy 'p' with binding 'b' denied
# request" (policy/generic/policy_dispatcher.go, PolicyError).
_DENIED = re.compile(r"(?:ValidatingAdmissionPolicy|policy) '(?P<policy>[^']*)' with binding "
                     r"'(?P<binding>[^']*)' denied request: (?P<message>.*)$", re.S)
_WARNED = re.compile(r"^Validation failed for ValidatingAdmissionPolicy '(?P<policy>[^']*)' "
                     r"with binding '(?P<binding>[^']*)': (?P<message>.*)$", re.S)


# A mutated object that does not decode (a JSONPatch's result) fails as an internal error that
# names no policy (500, whatever the failurePolicy); gpuguard names the policy it came from.
_INTERNAL = "Internal error occurred: "


def server_denial(message: str) -> str:
    """A VAP denial as gpuguard words it (``policy/binding: message``); other texts as-is."""
    match = _DENIED.search(message)
    return f"{match['policy']}/{match['binding']}: {match['message']}" if match else message


def comparable_denials(ours: str, theirs: str) -> tuple[str, str]:
    """gpuguard's first denial and the API server's, as compared: an internal error of the API
    server (no policy named) against gpuguard's text after its ``policy/binding: ``."""
    if theirs.startswith(_INTERNAL):
        return ours.partition(": ")[2], theirs.removeprefix(_INTERNAL)
    return ours, server_denial(theirs)


def server_warning(warning: str) -> str:
    match = _WARNED.match(warning)
    return f"{match['policy']}/{match['binding']}: {match['message']}" if match else warning


def server_audit(annotations: Mapping[str, str], sets: PolicySet) -> dict[str, str]:
    """The policy annotations of an audit event, keyed as gpuguard keys them
    (:func:`policies.engine.evaluation.audit_key` of ``policy/binding`` and the key)."""
    policies = {d["metadata"]["name"] for d in sets.documents
                if d.get("kind") == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d["metadata"]["name"] for d in sets.documents
                if d.get("kind") == "ValidatingAdmissionPolicyBinding"}
    result: dict[str, str] = {}
    for key, value in annotations.items():
        policy, _, name = key.partition("/")
        if policy in policies:
            result[audit_key(f"{policy}/{bindings[policy]}", name)] = value
        elif key == "validation.policy.admission.k8s.io/validation_failure":
            by_policy: dict[str, list[dict[str, str]]] = {}
            for failure in json.loads(value):
                name = f"{failure['policy']}/{failure['binding']}"
                by_policy.setdefault(name, []).append(
                    {"rule": f"validations[{failure['expressionIndex']}]",
                     "message": failure["message"]})
            for name, failures in by_policy.items():
                result[audit_key(name, "validation-failure")] = json.dumps(failures)
    return result


def comparable_audit(annotations: Mapping[str, str]) -> dict[str, Any]:
    """Audit annotations with the validation-failure lists parsed (JSON spacing aside)."""
    return {k: json.loads(v) if k.endswith("validation-failure") else v
            for k, v in annotations.items()}


def first_denial(result: Mapping[str, Any]) -> str:
    """gpuguard's first denying rule as ``policy: message`` (the API server reports only the
    first denying validation); '' when nothing denied."""
    for rule in result["results"]:
        if rule["outcome"] in ("fail", "error") and "Deny" in rule["actions"]:
            return f"{rule['policy']}: {rule['message']}"
    return ""


@dataclass(frozen=True)
class Difference:
    """One aspect of one request on which the two sides differ."""

    policy_set: str
    case: str
    aspect: str  # load, allowed, message, warnings, audit, object
    gpuguard: Any
    kubernetes: Any

    def describe(self) -> str:
        return (f"[{self.policy_set}] {self.case} {self.aspect}\n"
                f"    gpuguard   {json.dumps(self.gpuguard, default=str)[:400]}\n"
                f"    kubernetes {json.dumps(self.kubernetes, default=str)[:400]}")


def compare(policies: PolicySet, case: Case, baseline: Mapping[str, Any], ours: Mapping[str, Any],
            theirs: ServerAnswer, audit: Mapping[str, str]) -> list[Difference]:
    """Every aspect on which gpuguard's result for ``case`` differs from the API server's."""
    found = []

    def differ(aspect: str, a: Any, b: Any) -> None:
        if a != b:
            found.append(Difference(policies.name, case.id, aspect, a, b))

    differ("allowed", ours["allowed"], theirs.allowed)
    if not ours["allowed"] and not theirs.allowed:
        differ("message", *comparable_denials(first_denial(ours), theirs.message))
    differ("warnings", sorted(ours["warnings"]), sorted(server_warning(w)
                                                       for w in theirs.warnings))
    differ("audit", comparable_audit(ours["auditAnnotations"]),
           comparable_audit(server_audit(audit, policies)))
    if ours["allowed"] and theirs.allowed and (policies.mutating or ours["patch"]):
        patched = jsonpatch.apply_patch(admitted_form(baseline), ours["patch"])
        differ("object", _object_delta(baseline, patched),
               _object_delta(baseline, admitted_form(theirs.body)))
    return found


def _object_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a mutation changed, as a JSON patch from the admitted form (order-independent)."""
    patch = jsonpatch.make_patch(admitted_form(before), dict(after)).patch
    return sorted(patch, key=lambda op: (op["path"], op["op"]))


# --- the known differences (docs/compatibility.md) -------------------------------------------


@dataclass(frozen=True)
class Listed:
    """One row of the table in docs/compatibility.md: the policy set, an fnmatch pattern of case
    ids (``*`` = all), the aspect, and the reason."""

    policy_set: str
    cases: str
    aspect: str
    reason: str

    def covers(self, d: Difference) -> bool:
        return d.policy_set == self.policy_set and d.aspect == self.aspect and \
            fnmatch.fnmatchcase(d.case, self.cases)


_BEGIN, _END = "<!-- differential:begin -->", "<!-- differential:end -->"


def listed_differences(path: Path = COMPATIBILITY) -> list[Listed]:
    """The rows between the ``differential`` markers of docs/compatibility.md.

    Raises:
        ValueError: the markers are missing or a row does not have four cells.
    """
    text = path.read_text(encoding="utf-8")
    if _BEGIN not in text or _END not in text:
        raise ValueError(f"{path}: the {_BEGIN} ... {_END} table is missing")
    rows = []
    for number, line in enumerate(text.split(_BEGIN, 1)[1].split(_END, 1)[0].splitlines()):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("|") or set("".join(cells)) <= set("-: "):
            continue
        if cells[0] == "policy set":
            continue
        if len(cells) != 4:
            raise ValueError(f"{path}: differential table row {number}: expected 4 cells, "
                             f"got {line!r}")
        rows.append(Listed(*(c.strip("`") for c in cells[:3]), cells[3]))
    return rows


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
