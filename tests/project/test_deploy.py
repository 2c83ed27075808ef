"""The deploy/ manifests: render, validate against Kubernetes' schemas, and check the choices.

Every kustomization under deploy/ is rendered with ``kubectl kustomize`` (skipped, with the
reason, when kubectl is not installed) and each rendered object is validated with
``kubernetes-validate`` against the Kubernetes 1.30 OpenAPI schemas (strict: unknown fields are
errors). Kinds it has no schema for — the CRDs Certificate, Issuer, ServiceMonitor — are checked for
apiVersion, kind and metadata.name only. Then the properties the deployment must keep: webhooks
that can never match kube-system or gpuguard's own namespace, their sideEffects / versions /
timeouts / failurePolicy and generated matchConditions, RBAC within an explicit allow-list (and, by
evaluating the bindings, that the webhook can neither read nor write any ConfigMap but its quota
ledgers), the Deployment's security context and probes, and the policies ConfigMap equal to
policies/library.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.lists import AUDIT_RESOURCES
from policies.facts import prefilter
from tests.paths import ROOT

DEPLOY = ROOT / "deploy"
LIBRARY = ROOT / "policies" / "library"
KUBE_VERSION = "1.30.0"
NAMESPACE = "gpuguard-system"
QUOTA_NAMESPACE = "gpuguard-quota"  # the quota ledgers (deploy/base/quota-ledger.yaml)
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")

# Every kustomization under deploy/ that renders standalone (components render through the
# "monitoring" case below).
TARGETS = {
    "base": DEPLOY / "base",
    "cert-manager": DEPLOY / "overlays" / "cert-manager",
    "audit-only": DEPLOY / "overlays" / "audit-only",
    "dev": DEPLOY / "overlays" / "dev",
    "inventory-daemonset": DEPLOY / "overlays" / "inventory-daemonset",
}
WITH_WEBHOOKS = ("base", "cert-manager", "dev")
# Objects each rendering must hold exactly, as (kind, name).
EXPECTED_OBJECTS = {
    "audit-only": {
        ("Namespace", NAMESPACE), ("ServiceAccount", "gpuguard-audit"),
        ("ClusterRole", "gpuguard-audit"), ("ClusterRoleBinding", "gpuguard-audit"),
        ("ConfigMap", "gpuguard-policies"), ("CronJob", "gpuguard-audit"),
        ("NetworkPolicy", "gpuguard-default-deny-ingress"),
    },
}
BASE_OBJECTS = EXPECTED_OBJECTS["audit-only"] | {
    ("ServiceAccount", "gpuguard-webhook"), ("ClusterRole", "gpuguard-webhook"),
    ("ClusterRoleBinding", "gpuguard-webhook"), ("Role", "gpuguard-webhook-quota-ledger"),
    ("RoleBinding", "gpuguard-webhook-quota-ledger"), ("Namespace", QUOTA_NAMESPACE),
    ("Deployment", "gpuguard-webhook"),
    ("PodDisruptionBudget", "gpuguard-webhook"), ("Service", "gpuguard"),
    ("NetworkPolicy", "gpuguard-webhook"),
    ("ValidatingWebhookConfiguration", "gpuguard-validating"),
    ("MutatingWebhookConfiguration", "gpuguard-mutating"),
}
EXPECTED_OBJECTS["base"] = BASE_OBJECTS
EXPECTED_OBJECTS["dev"] = BASE_OBJECTS - {("PodDisruptionBudget", "gpuguard-webhook")}
EXPECTED_OBJECTS["cert-manager"] = BASE_OBJECTS | {
    ("Issuer", "gpuguard-selfsigned"), ("Issuer", "gpuguard-ca"),
    ("Certificate", "gpuguard-ca"), ("Certificate", "gpuguard-serving"),
}

# --- RBAC allow-lists: (apiGroup, resource) -> verbs. Nothing beyond these may be granted. ---
# Only the verbs the code uses: the webhook's caches list and watch (kube/list_watch.py), the
# ledger reads, creates and replaces (kube/quota_ledger.py), the audit pages through collections
# (kube/lists.py) and gets, creates or replaces its reports (kube/policy_reports.py).
WATCH = {"list", "watch"}
LIST = {"list"}
WEBHOOK_CLUSTER_RULES = {("", "namespaces"): WATCH, ("", "pods"): WATCH,
                         # the CEL authorizer (kube/subject_access_reviews.py)
                         ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
                         ("node.k8s.io", "runtimeclasses"): WATCH}
WEBHOOK_LEDGER_RULES = {("", "configmaps"): {"get", "create", "update"}}  # Role, quota namespace
AUDIT_RULES = {
    **{(g, r): LIST for g, r in [
        ("", "namespaces"), ("", "nodes"), ("", "pods"), ("", "replicationcontrollers"),
        ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"),
        ("apps", "daemonsets"), ("batch", "jobs"), ("batch", "cronjobs"),
        ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "tfjobs"), ("kubeflow.org", "mpijobs"),
        ("kubeflow.org", "xgboostjobs"), ("kubeflow.org", "paddlejobs"),
        ("kubeflow.org", "jaxjobs"), ("kubeflow.org", "mxjobs"), ("ray.io", "rayclusters"),
        ("ray.io", "rayjobs"),
        ("ray.io", "rayservices"), ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("jobset.x-k8s.io", "jobsets"), ("batch.volcano.sh", "jobs"),
        ("kubevirt.io", "virtualmachines"), ("kubevirt.io", "virtualmachineinstancereplicasets"),
        ("pool.kubevirt.io", "virtualmachinepools"),
        # DRA: the claims pods name and what they are resolved with (a trial found the claims
        # themselves missing: a pod of a ResourceClaim was of unknown size live)
        ("resource.k8s.io", "deviceclasses"), ("resource.k8s.io", "resourceslices"),
        ("resource.k8s.io", "resourceclaimtemplates"), ("resource.k8s.io", "resourceclaims"),
        ("trainer.kubeflow.org", "trainjobs"), ("serving.kserve.io", "inferenceservices"),
        ("serving.kserve.io", "llminferenceservices"), ("serving.kubeflow.org", "kfservices"),
        ("disaggregatedset.x-k8s.io", "disaggregatedsets"), ("apps.nvidia.com", "nimservices"),
        ("kaito.sh", "workspaces"), ("kaito.sh", "inferencesets"),
    ]},
    # list + delete: stale reports of namespaces with nothing left are pruned
    ("wgpolicyk8s.io", "policyreports"): {"get", "create", "update", "list", "delete"},
    ("wgpolicyk8s.io", "clusterpolicyreports"): {"get", "create", "update"},
}
INVENTORY_RULES = {("", "nodes"): {"get", "patch"}}
ALLOWED_ROLES = {
    ("ClusterRole", "gpuguard-webhook"): WEBHOOK_CLUSTER_RULES,
    ("Role", "gpuguard-webhook-quota-ledger"): WEBHOOK_LEDGER_RULES,
    ("ClusterRole", "gpuguard-audit"): AUDIT_RULES,
    ("ClusterRole", "gpuguard-inventory"): INVENTORY_RULES,
}
# The namespace of each Role (ClusterRoles have none).
ROLE_NAMESPACES = {"gpuguard-webhook-quota-ledger": QUOTA_NAMESPACE}
# Which ServiceAccount each role may be bound to.
ROLE_SUBJECTS = {
    "gpuguard-webhook": "gpuguard-webhook",
    "gpuguard-webhook-quota-ledger": "gpuguard-webhook",
    "gpuguard-audit": "gpuguard-audit",
    "gpuguard-inventory": "gpuguard-inventory",
}

# The workload kinds the engine reads pod templates from, as the webhook rules must list them.
WORKLOAD_RESOURCES = {
    ("apps", r) for r in ("deployments", "replicasets", "statefulsets", "daemonsets")
} | {("batch", "jobs"), ("batch", "cronjobs")} | {
    ("kubeflow.org", r) for r in ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs",
                                  "paddlejobs", "jaxjobs", "mxjobs")
} | {("ray.io", r) for r in ("rayclusters", "rayservices", "rayjobs")} | {
    ("leaderworkerset.x-k8s.io", "leaderworkersets"), ("jobset.x-k8s.io", "jobsets"),
    ("batch.volcano.sh", "jobs"), ("kubevirt.io", "virtualmachines"),
    ("kubevirt.io", "virtualmachineinstances"), ("kubevirt.io", "virtualmachineinstancereplicasets"),
    ("pool.kubevirt.io", "virtualmachinepools"), ("trainer.kubeflow.org", "trainjobs"),
    ("serving.kserve.io", "inferenceservices"), ("serving.kserve.io", "llminferenceservices"),
    ("serving.kubeflow.org", "kfservices"), ("disaggregatedset.x-k8s.io", "disaggregatedsets"),
    ("", "replicationcontrollers"), ("apps.nvidia.com", "nimservices"),
    ("kaito.sh", "workspaces"), ("kaito.sh", "inferencesets"),
}
POD_RESOURCES = {("", "pods"), ("", "pods/ephemeralcontainers")}
# DRA claims, judged themselves (a pod arrives without them): fail-closed beside the pods.
CLAIM_RESOURCES = {("resource.k8s.io", "resourceclaims"),
                   ("resource.k8s.io", "resourceclaimtemplates")}

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: cannot render deploy/ with "
    "`kubectl kustomize` (install kubectl >= 1.27 to run these tests)")


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """The objects of one deploy/ kustomization (cached: kubectl takes ~0.2 s each)."""
    return tuple(_kustomize(TARGETS[target]))


def _objects(target: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in render(target) if o["kind"] == kind]


def _one(target: str, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in _objects(target, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{target}: expected one {kind} {name}, found {len(found)}"
    return found[0]


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


# --- rendering and schema validation ---------------------------------------------------------

@needs_kubectl
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_renders_and_validates_against_kubernetes_schemas(target: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate.utils")
    objects = render(target)
    assert objects, f"{target} rendered nothing"
    checked_by_schema = 0
    for obj in objects:
        label = f"{target}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            checked_by_schema += 1
        except kubernetes_validate.SchemaNotFoundError:
            # A CRD kind (cert-manager, Prometheus Operator): structure only.
            assert obj["kind"] in {"Certificate", "Issuer", "ServiceMonitor"}, label
            assert "/" in obj["apiVersion"], label
            assert obj["metadata"]["name"], label
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label} does not validate against Kubernetes {KUBE_VERSION}: {exc}")
    assert checked_by_schema >= 1


@needs_kubectl
@pytest.mark.parametrize("target", sorted(EXPECTED_OBJECTS))
def test_each_overlay_renders_exactly_its_objects(target: str) -> None:
    got = {(o["kind"], o["metadata"]["name"]) for o in render(target)}
    assert got == EXPECTED_OBJECTS[target]


@needs_kubectl
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_namespaced_objects_live_in_gpuguard_system(target: str) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", *WEBHOOK_KINDS}
    # kustomize 5.5 does not know that these are cluster-scoped and stamps the namespace on them;
    # the API server drops it (a cluster-scoped object has no namespace).
    stamped_anyway = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    # Only the quota ledgers' Role and RoleBinding live in the ledgers' namespace.
    in_quota_namespace = {("Role", "gpuguard-webhook-quota-ledger"),
                          ("RoleBinding", "gpuguard-webhook-quota-ledger")}
    for obj in render(target):
        if obj["kind"] in stamped_anyway:
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            expected = QUOTA_NAMESPACE if key in in_quota_namespace else NAMESPACE
            assert obj["metadata"].get("namespace") == expected, key


@needs_kubectl
def test_servicemonitor_component_renders(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate.utils")
    # kustomize wants relative paths to other kustomizations.
    overlay = os.path.relpath(DEPLOY / "overlays" / "cert-manager", tmp_path)
    component = os.path.relpath(DEPLOY / "components" / "servicemonitor", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{overlay}]\ncomponents: [{component}]\n")
    objects = _kustomize(tmp_path)
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 1
    monitor = monitors[0]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(monitor, KUBE_VERSION, strict=True)
    service = next(o for o in objects if o["kind"] == "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")


# --- webhook configurations ------------------------------------------------------------------

def _webhooks(target: str) -> list[tuple[str, dict[str, Any]]]:
    return [(o["kind"], w) for o in render(target) if o["kind"] in WEBHOOK_KINDS
            for w in o["webhooks"]]


@needs_kubectl
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_webhooks_never_match_kube_system_or_gpuguard_namespace(target: str) -> None:
    for _, webhook in _webhooks(target):
        selector = webhook["namespaceSelector"]
        # matchExpressions are ANDed with everything else, so this one excludes both namespaces
        # whatever other selectors say; no matchLabels may widen or replace it.
        exclusions = [e for e in selector["matchExpressions"]
                      if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
        assert exclusions, webhook["name"]
        assert {"kube-system", NAMESPACE} <= set(exclusions[0]["values"]), webhook["name"]
        # namespaceSelector does not apply to cluster-scoped objects: only namespaced rules.
        for rule in webhook["rules"]:
            assert rule["scope"] == "Namespaced", webhook["name"]
        # The excluded namespace is the one the webhook's own Service runs in.
        assert webhook["clientConfig"]["service"]["namespace"] == NAMESPACE
    if target in WITH_WEBHOOKS:
        assert _webhooks(target)
    else:
        assert not _webhooks(target)


@needs_kubectl
@pytest.mark.parametrize("target", WITH_WEBHOOKS)
def test_webhook_settings(target: str) -> None:
    webhooks = _webhooks(target)
    assert {w["name"] for _, w in webhooks} == {
        "pods.validate.gpuguard.io", "workloads.validate.gpuguard.io", "mutate.gpuguard.io"}
    service = _one(target, "Service", "gpuguard")
    for kind, webhook in webhooks:
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "NoneOnDryRun"  # the quota ledger writes
        assert webhook["timeoutSeconds"] == 5
        assert webhook["matchPolicy"] == "Equivalent"
        client = webhook["clientConfig"]["service"]
        assert client["name"] == service["metadata"]["name"]
        assert client["port"] == service["spec"]["ports"][0]["port"] == 443
        assert client["path"] == ("/mutate" if kind == "MutatingWebhookConfiguration"
                                  else "/validate")
        if kind == "MutatingWebhookConfiguration":
            assert webhook["reinvocationPolicy"] == "IfNeeded"
        for rule in webhook["rules"]:
            ops = set(rule["operations"])
            if rule["resources"] == ["pods/ephemeralcontainers"]:
                assert ops == {"UPDATE"}
            else:
                assert ops == {"CREATE", "UPDATE"}
    failure = {w["name"]: w["failurePolicy"] for _, w in webhooks}
    if target == "dev":
        assert set(failure.values()) == {"Ignore"}
    else:
        assert failure == {"pods.validate.gpuguard.io": "Fail",
                           "workloads.validate.gpuguard.io": "Ignore",
                           "mutate.gpuguard.io": "Ignore"}


def _rule_resources(webhook: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g, r) for rule in webhook["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]}


# How deploy/README.md's outage sentence names each resource a fail-closed webhook matches.
OUTAGE_WORDS = {("", "pods"): "Pods", ("", "pods/ephemeralcontainers"): "ephemeral containers",
                ("resource.k8s.io", "resourceclaims"): "ResourceClaims",
                ("resource.k8s.io", "resourceclaimtemplates"): "ResourceClaimTemplates"}


@needs_kubectl
@pytest.mark.parametrize("target", ["base", "cert-manager"])
def test_the_outage_sentence_names_what_the_fail_closed_webhooks_match(target: str) -> None:
    """deploy/README.md says in one sentence what an outage of gpuguard blocks: every resource
    of every webhook with failurePolicy Fail (a trial found GPU ResourceClaims and
    ResourceClaimTemplates refused while the sentence named Pods only), and no other."""
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    start = readme.index("**What an outage of gpuguard blocks**")
    sentence = " ".join(readme[start:readme.index("\n\n", start)].split())
    blocked = {resource for _, w in _webhooks(target) if w["failurePolicy"] == "Fail"
               for resource in _rule_resources(w)}
    assert blocked <= set(OUTAGE_WORDS), blocked - set(OUTAGE_WORDS)
    refused = sentence[sentence.index("refuses"):sentence.index("every other")]
    for resource in blocked:
        assert OUTAGE_WORDS[resource] in refused, (resource, refused)
    for resource in set(OUTAGE_WORDS) - blocked:
        assert OUTAGE_WORDS[resource] not in refused, (resource, refused)
    assert f"`{NAMESPACE}`" in sentence and "`kube-system`" in sentence


@needs_kubectl
def test_webhook_rules_cover_pods_and_the_workload_kinds() -> None:
    hooks = {w["name"]: w for _, w in _webhooks("base")}
    assert _rule_resources(hooks["pods.validate.gpuguard.io"]) == POD_RESOURCES | CLAIM_RESOURCES
    assert _rule_resources(hooks["workloads.validate.gpuguard.io"]) == WORKLOAD_RESOURCES
    assert _rule_resources(hooks["mutate.gpuguard.io"]) == POD_RESOURCES | WORKLOAD_RESOURCES
    for hook in hooks.values():
        for rule in hook["rules"]:
            assert "*" not in rule["apiVersions"] and "*" not in rule["resources"]


@needs_kubectl
@pytest.mark.parametrize("target", WITH_WEBHOOKS)
def test_every_webhook_has_the_generated_match_conditions(target: str) -> None:
    # The API server calls gpuguard only when every matchCondition is true: each webhook must
    # carry exactly what policies/facts/prefilter.py generates for its rules (deploy/base/
    # match-conditions.yaml, patched in by the base), in every overlay.
    for _, webhook in _webhooks(target):
        resources = [(g, r) for rule in webhook["rules"] for g in rule["apiGroups"]
                     for r in rule["resources"]]
        expected = [c.to_dict() for c in prefilter.match_conditions(resources)]
        assert webhook.get("matchConditions") == expected, f"{target}: {webhook['name']}"
        assert len(expected) <= 64  # the API server's limit per webhook


@needs_kubectl
def test_server_deadline_is_below_the_webhook_timeout() -> None:
    for target in WITH_WEBHOOKS:
        args = _pod_spec(_one(target, "Deployment", "gpuguard-webhook"))["containers"][0]["args"]
        deadline_ms = int(next(a for a in args if a.startswith("--deadline-ms=")).split("=")[1])
        for _, webhook in _webhooks(target):
            assert deadline_ms < webhook["timeoutSeconds"] * 1000


@needs_kubectl
def test_ca_bundle_per_overlay() -> None:
    # base: injected by `gpuguard certs inject`; cert-manager: by its CA injector; dev: a
    # placeholder in overlays/dev/ca-bundle.yaml for `gpuguard certs inject` to replace.
    for _, webhook in _webhooks("base"):
        assert "caBundle" not in webhook["clientConfig"]
    for obj in render("cert-manager"):
        if obj["kind"] in WEBHOOK_KINDS:
            annotation = obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            namespace, name = annotation.split("/")
            certificate = _one("cert-manager", "Certificate", name)
            assert certificate["metadata"]["namespace"] == namespace
    for _, webhook in _webhooks("dev"):
        assert webhook["clientConfig"]["caBundle"] == "Cg=="


@needs_kubectl
def test_cert_manager_serving_certificate_matches_service_and_secret() -> None:
    serving = _one("cert-manager", "Certificate", "gpuguard-serving")
    assert "gpuguard.gpuguard-system.svc" in serving["spec"]["dnsNames"]
    volumes = _pod_spec(_one("cert-manager", "Deployment", "gpuguard-webhook"))["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == serving["spec"]["secretName"]
    issuer = _one("cert-manager", "Issuer", serving["spec"]["issuerRef"]["name"])
    ca = _one("cert-manager", "Certificate", "gpuguard-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert ca["spec"]["isCA"] is True


# --- RBAC ------------------------------------------------------------------------------------

@needs_kubectl
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_rbac_grants_nothing_beyond_the_allow_list(target: str) -> None:
    for obj in render(target):
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        assert key in ALLOWED_ROLES, f"{target}: unexpected {key}"
        allowed = ALLOWED_ROLES[key]
        granted: dict[tuple[str, str], set[str]] = {}
        for rule in obj["rules"]:
            assert not rule.get("nonResourceURLs") and not rule.get("resourceNames"), key
            assert "aggregationRule" not in obj, key
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    verbs = set(rule["verbs"])
                    assert "*" not in verbs and group != "*" and resource != "*", key
                    extra = verbs - allowed.get((group, resource), set())
                    assert not extra, f"{target}: {key} grants {sorted(extra)} on " \
                        f"{group or 'core'}/{resource}"
                    granted.setdefault((group, resource), set()).update(verbs)
        # And no less: each component needs every grant of its list.
        assert granted == allowed, key
        if obj["kind"] == "Role":
            assert obj["metadata"]["namespace"] == ROLE_NAMESPACES[obj["metadata"]["name"]]


@needs_kubectl
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_bindings_give_each_role_to_its_own_service_account(target: str) -> None:
    accounts = {o["metadata"]["name"] for o in _objects(target, "ServiceAccount")}
    for obj in render(target):
        if obj["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        role = obj["roleRef"]["name"]
        assert obj["roleRef"]["kind"] == ("Role" if obj["kind"] == "RoleBinding"
                                          else "ClusterRole")
        assert [(s["kind"], s["name"], s["namespace"]) for s in obj["subjects"]] == [
            ("ServiceAccount", ROLE_SUBJECTS[role], NAMESPACE)]
        assert ROLE_SUBJECTS[role] in accounts


def test_audit_allow_list_covers_what_the_audit_lists() -> None:
    # kube/lists.py is what `gpuguard audit --cluster` reads: RBAC must follow it, exactly.
    listed = {(r.group, r.plural) for r in AUDIT_RESOURCES}
    read = {key for key, verbs in AUDIT_RULES.items() if verbs == LIST}
    assert read == listed


def _allowed(objects: tuple[dict[str, Any], ...], account: str, verb: str, group: str,
             resource: str, namespace: str | None, name: str | None = None) -> bool:
    """Whether RBAC in ``objects`` lets ServiceAccount gpuguard-system/``account`` do ``verb``.

    Kubernetes' rules: a ClusterRoleBinding grants its ClusterRole everywhere, a RoleBinding its
    Role or ClusterRole in the binding's namespace; ``resourceNames`` never match create, list,
    watch or deletecollection (the name is not part of those requests).
    """
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("rules") or []
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace") == NAMESPACE for s in binding.get("subjects") or []):
            continue
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if scope is not None and scope != namespace:
            continue
        ref = binding["roleRef"]
        for rule in roles.get((ref["kind"], scope if ref["kind"] == "Role" else None,
                               ref["name"]), []):
            if not ({verb, "*"} & set(rule.get("verbs", []))
                    and {group, "*"} & set(rule.get("apiGroups", []))
                    and {resource, "*"} & set(rule.get("resources", []))):
                continue
            names = rule.get("resourceNames") or []
            if not names or (name in names and verb not in
                             ("create", "list", "watch", "deletecollection")):
                return True
    return False


ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@needs_kubectl
@pytest.mark.parametrize("target", WITH_WEBHOOKS)
def test_the_webhook_cannot_read_or_rewrite_its_own_policies(target: str) -> None:
    # The finding: get/create/update on every ConfigMap of gpuguard-system let the
    # webhook rewrite the policies it enforces. It reads them from the mounted volume (the
    # kubelet's access, not its own), so it needs no RBAC on them at all.
    objects = render(target)
    policies = _one(target, "ConfigMap", "gpuguard-policies")
    assert policies["metadata"]["namespace"] == NAMESPACE
    for verb in ALL_VERBS:
        for name in ("gpuguard-policies", "anything-else", None):
            assert not _allowed(objects, "gpuguard-webhook", verb, "", "configmaps", NAMESPACE,
                                name), f"{target}: webhook may {verb} ConfigMap {name}"
            assert not _allowed(objects, "gpuguard-audit", verb, "", "configmaps", NAMESPACE,
                                name), f"{target}: audit may {verb} ConfigMap {name}"
    # Nothing but ledgers can be reached either: no Secret, no other namespace's ConfigMaps.
    for verb in ALL_VERBS:
        assert not _allowed(objects, "gpuguard-webhook", verb, "", "secrets", NAMESPACE)
        assert not _allowed(objects, "gpuguard-webhook", verb, "", "configmaps", "team-a", "x")
    volumes = {v["name"]: v for v in _pod_spec(_one(target, "Deployment",
                                                    "gpuguard-webhook"))["volumes"]}
    assert volumes["policies"]["configMap"]["name"] == "gpuguard-policies"


@needs_kubectl
@pytest.mark.parametrize("target", WITH_WEBHOOKS)
def test_quota_ledgers_have_a_namespace_of_their_own(target: str) -> None:
    # What kube/quota_ledger.py needs (read, create on the first reservation, compare-and-swap
    # replace) on ConfigMaps gpuguard-quota-<name>, in the namespace the Deployment passes as
    # --quota-namespace; `create` cannot be limited by resourceNames, so that namespace holds
    # nothing else of gpuguard's.
    objects = render(target)
    args = _pod_spec(_one(target, "Deployment", "gpuguard-webhook"))["containers"][0]["args"]
    assert f"--quota-namespace={QUOTA_NAMESPACE}" in args
    _one(target, "Namespace", QUOTA_NAMESPACE)
    for verb in ("get", "create", "update"):
        assert _allowed(objects, "gpuguard-webhook", verb, "", "configmaps", QUOTA_NAMESPACE,
                        "gpuguard-quota-team-a")
    for verb in ("list", "watch", "patch", "delete", "deletecollection"):
        assert not _allowed(objects, "gpuguard-webhook", verb, "", "configmaps",
                            QUOTA_NAMESPACE, "gpuguard-quota-team-a")
    inside = {(o["kind"], o["metadata"]["name"]) for o in objects
              if o["metadata"].get("namespace") == QUOTA_NAMESPACE}
    assert inside == {("Role", "gpuguard-webhook-quota-ledger"),
                      ("RoleBinding", "gpuguard-webhook-quota-ledger")}


@needs_kubectl
@pytest.mark.parametrize("target", ("base", "audit-only"))
def test_workloads_use_their_own_service_accounts(target: str) -> None:
    cron = _pod_spec(_one(target, "CronJob", "gpuguard-audit"))
    assert cron["serviceAccountName"] == "gpuguard-audit"
    if target == "base":
        deployment = _pod_spec(_one(target, "Deployment", "gpuguard-webhook"))
        assert deployment["serviceAccountName"] == "gpuguard-webhook"


# --- Deployment, CronJob, Service, NetworkPolicy --------------------------------------------

def _assert_restricted(pod: dict[str, Any], label: str) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True, label
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", label
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, label
        assert security["allowPrivilegeEscalation"] is False, label
        assert security["capabilities"]["drop"] == ["ALL"], label
        assert not security["capabilities"].get("add"), label
        assert security.get("privileged", False) is False, label
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), label
        assert {"cpu", "memory"} <= resources["limits"].keys(), label
    for volume in pod.get("volumes", []):
        assert "hostPath" not in volume, label


@needs_kubectl
@pytest.mark.parametrize("target", WITH_WEBHOOKS)
def test_deployment(target: str) -> None:
    deployment = _one(target, "Deployment", "gpuguard-webhook")
    pod = _pod_spec(deployment)
    _assert_restricted(pod, target)
    assert deployment["spec"]["replicas"] == (1 if target == "dev" else 2)
    container = pod["containers"][0]
    args = container["args"]
    assert container["command"] == ["gpuguard"] and args[0] == "serve"
    assert {"--policies=/etc/gpuguard/policies", "--cert=/etc/gpuguard/tls/tls.crt",
            "--key=/etc/gpuguard/tls/tls.key", "--port=8443"} <= set(args)
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "https"), probe
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/gpuguard/policies"]["name"]]["configMap"]["name"] == \
        "gpuguard-policies"
    assert volumes[mounts["/etc/gpuguard/tls"]["name"]]["secret"]["secretName"] == "gpuguard-tls"
    assert mounts["/etc/gpuguard/policies"]["readOnly"] and mounts["/etc/gpuguard/tls"]["readOnly"]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]  # --workers' metrics directory
    # Spread over nodes; the selector matches the pods.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spreads = pod["topologySpreadConstraints"]
    assert any(s["topologyKey"] == "kubernetes.io/hostname" for s in spreads)
    for spread in spreads:
        assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # The Service routes 443 to the pods' https port.
    service = _one(target, "Service", "gpuguard")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("https", 8443)
    if target != "dev":
        pdb = _one(target, "PodDisruptionBudget", "gpuguard-webhook")
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


@needs_kubectl
@pytest.mark.parametrize("target", ("base", "audit-only"))
def test_audit_cronjob(target: str) -> None:
    cron = _one(target, "CronJob", "gpuguard-audit")
    pod = _pod_spec(cron)
    _assert_restricted(pod, target)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = pod["containers"][0]
    assert container["command"] == ["gpuguard"]
    assert container["args"][:3] == ["audit", "--cluster", "--write-reports"]
    assert "--policies=/etc/gpuguard/policies" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"]
                 if m["mountPath"] == "/etc/gpuguard/policies")
    assert volumes[mount["name"]]["configMap"]["name"] == "gpuguard-policies"


@needs_kubectl
def test_networkpolicy_admits_the_webhook_port_only_to_the_webhook() -> None:
    policies = {o["metadata"]["name"]: o for o in _objects("base", "NetworkPolicy")}
    deny = policies["gpuguard-default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny
    allow = policies["gpuguard-webhook"]["spec"]
    assert allow["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "gpuguard",
                                                   "app.kubernetes.io/component": "webhook"}
    # From anywhere (the API server's address is provider-specific), to 8443 only: admission
    # and /metrics share that port.
    assert allow["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]


# --- the policies ConfigMap ------------------------------------------------------------------

def _library() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(LIBRARY.glob("*.yaml"))}


def test_policy_copy_is_identical_to_the_library() -> None:
    copy = {p.name: p.read_text() for p in sorted((DEPLOY / "base" / "policies").glob("*.yaml"))
            if p.name != "kustomization.yaml"}
    assert copy == _library(), "deploy/base/policies differs from policies/library: run " \
        "deploy/sync-policies.sh"
    listed = yaml.safe_load((DEPLOY / "base" / "policies" / "kustomization.yaml").read_text())
    assert sorted(listed["configMapGenerator"][0]["files"]) == sorted(_library()), \
        "run deploy/sync-policies.sh"


@needs_kubectl
@pytest.mark.parametrize("target", ("base", "cert-manager", "audit-only", "dev"))
def test_policies_configmap_equals_the_library(target: str) -> None:
    configmap = _one(target, "ConfigMap", "gpuguard-policies")
    assert configmap["data"] == _library()
