"""The Helm chart deploy/helm/gpuguard: one source with the kustomize manifests of deploy/.

The chart renders copies of deploy/'s manifests (deploy/helm/sync-chart.sh) with its values
applied. Checked here, with a real helm built from the Go module proxy (tests/builders/helm_chart.py)
and kubectl's kustomize: the copies equal their sources; ``helm lint`` passes for every value set;
the default values render exactly the objects of deploy/base, ci/{dev,audit-only,cert-manager}
those of the matching overlays, and ci/audit-controller those of the base with the components
servicemonitor, audit-controller and monitoring (the watch Deployment with its Lease RBAC and
Service, the ServiceMonitor, dashboard and alerts) — so every property tests/project/test_deploy.py checks on the
kustomizations holds for the chart; every rendered object (CRDs included) validates against the
Kubernetes 1.30 schemas; and the values without a kustomize counterpart (ci/custom) do what
values.yaml says. Bad values fail ``helm template`` and ``helm lint`` with a message naming them:
values.schema.json (types, enums, ranges, misspelt keys, and the rules between values: the
server's deadline against the API server's timeout, the PDB against the replicas) and
templates/checks.yaml (the same rules, saying why). tests/controlplane/test_helm_live.py sends the same objects to a real API server.
"""

from __future__ import annotations

import base64
import filecmp
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders.helm_chart import CHART, NAMESPACE, VALUE_SETS, helm, render, values_args
from tests.paths import ROOT
from tests.project.test_deploy import KUBE_VERSION, _kustomize, needs_kubectl

DEPLOY = ROOT / "deploy"
# Labels the chart adds to every object's metadata that kustomize does not (helm's convention).
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
# Kinds without a schema in kubernetes-validate: their CRDs come from cert-manager and the
# Prometheus Operator.
THIRD_PARTY_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        assert label in labels, f"{_key(obj)}: no {label} label"
        del labels[label]
    return obj


# kustomize 5.5 stamps a namespace on these cluster-scoped kinds (the API server drops it); the
# chart writes none.
STAMPED_BY_KUSTOMIZE = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def _by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    for obj in objects:
        if obj["kind"] in STAMPED_BY_KUSTOMIZE:
            obj["metadata"].pop("namespace", None)
    keyed = {_key(o): o for o in objects}
    assert len(keyed) == len(objects), "two objects with the same apiVersion/kind/namespace/name"
    return keyed


def _kustomize_of(tmp_path: Path, resources: list[Path],
                  components: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """deploy/ kustomizations combined (kustomize wants relative paths), with the base's
    ``images:`` entry as the overlay a user writes sets it (deploy/README.md): the base's own
    entry reaches only the base's objects, not a component's (the audit controller's Deployment);
    the chart sets ``image.*`` everywhere."""
    rel = [os.path.relpath(p, tmp_path) for p in resources]
    comp = [os.path.relpath(p, tmp_path) for p in components]
    images = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"]
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: {rel}\ncomponents: {comp}\nimages: {json.dumps(images)}\n")
    return _kustomize(tmp_path)


# Each value set with a kustomize counterpart, as (resources, components) of deploy/.
COUNTERPARTS: dict[str, tuple[list[Path], list[Path]]] = {
    "default": ([DEPLOY / "base"], []),
    "dev": ([DEPLOY / "overlays" / "dev"], []),
    "audit-only": ([DEPLOY / "overlays" / "audit-only"], []),
    "cert-manager": ([DEPLOY / "overlays" / "cert-manager"],
                     [DEPLOY / "components" / "servicemonitor"]),
    "audit-controller": ([DEPLOY / "base"],
                         [DEPLOY / "components" / c
                          for c in ("servicemonitor", "audit-controller", "monitoring")]),
}


def test_the_chart_copies_equal_their_sources_in_deploy(tmp_path: Path) -> None:
    # Run sync-chart.sh on a copy of deploy/ and compare its output with the committed chart.
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    done = subprocess.run(["bash", str(copy / "helm" / "sync-chart.sh")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    for folder in ("files", "crds"):
        fresh, committed = copy / "helm" / "gpuguard" / folder, CHART / folder
        fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        committed_files = sorted(p.relative_to(committed) for p in committed.rglob("*")
                                 if p.is_file())
        assert fresh_files == committed_files, (
            f"deploy/helm/gpuguard/{folder} lists other files than deploy/: run "
            "deploy/helm/sync-chart.sh")
        _, differ, _ = filecmp.cmpfiles(fresh, committed, [str(p) for p in fresh_files],
                                        shallow=False)
        assert not differ, (f"deploy/helm/gpuguard/{folder}: {differ} differ from deploy/: run "
                            "deploy/helm/sync-chart.sh")


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_passes(value_set: str) -> None:
    done = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values_args(value_set))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@needs_kubectl
@pytest.mark.parametrize("value_set", sorted(COUNTERPARTS))
def test_value_set_renders_the_objects_of_its_kustomization(value_set: str,
                                                            tmp_path: Path) -> None:
    resources, components = COUNTERPARTS[value_set]
    expected = _by_key(_kustomize_of(tmp_path, resources, components))
    if value_set == "cert-manager":
        # The inventory overlay is standalone (its own Namespace, the same as the base's).
        inventory = tmp_path / "inventory"
        inventory.mkdir()
        expected.update(_by_key(_kustomize_of(inventory, [DEPLOY / "overlays" /
                                                          "inventory-daemonset"])))
    # helm installs into a namespace it does not own (--create-namespace): not rendered by default.
    release_namespace = expected.pop(("v1", "Namespace", "", NAMESPACE))
    assert release_namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == \
        "restricted"
    got = _by_key([_without_helm_labels(o) for o in render(value_set)])
    assert sorted(got) == sorted(expected)
    for key, obj in expected.items():
        # The chart labels every object part-of gpuguard; the overlays' own objects (cert-manager's
        # Issuers and Certificates) are not under the base's labels: in kustomize only its
        # resources are.
        labels = got[key]["metadata"]["labels"]
        assert labels.pop("app.kubernetes.io/part-of") == "gpuguard", key
        obj["metadata"].get("labels", {}).pop("app.kubernetes.io/part-of", None)
        if not labels and "labels" not in obj["metadata"]:
            del got[key]["metadata"]["labels"]
        assert got[key] == obj, f"{value_set}: {key} differs from deploy/'s"


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rendered_objects_validate_against_kubernetes_schemas(value_set: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate.utils")
    objects = render(value_set, include_crds=True)
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "ConfigMap"} <= kinds
    for obj in objects:
        label = f"{value_set}: {obj['kind']} {obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["kind"] in THIRD_PARTY_KINDS, label
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label} does not validate against Kubernetes {KUBE_VERSION}: {exc}")


def test_crds_include_the_policyreports_gpuguard_writes() -> None:
    crds = {o["metadata"]["name"]: o for o in render("audit-only", include_crds=True)
            if o["kind"] == "CustomResourceDefinition"}
    assert set(crds) == {"gpupolicies.gpuguard.io", "gpuquotas.gpuguard.io",
                         "gpupolicyexceptions.gpuguard.io", "policyreports.wgpolicyk8s.io",
                         "clusterpolicyreports.wgpolicyk8s.io"}
    report = crds["policyreports.wgpolicyk8s.io"]["spec"]
    assert (report["scope"], [v["name"] for v in report["versions"]]) == ("Namespaced",
                                                                         ["v1alpha2"])
    assert crds["clusterpolicyreports.wgpolicyk8s.io"]["spec"]["scope"] == "Cluster"


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def test_custom_values_do_what_values_yaml_says() -> None:
    objects = render("custom")
    namespace = _one(objects, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = _one(objects, "Deployment", "gpuguard-webhook")
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.internal/platform/gpuguard:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert "--quota-namespace=gpuguard-ledgers" in container["args"]
    assert container["args"][-2:] == ["--cluster-policies", "--gpu-resource=example.com/gpu"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpuguard-serving-tls"
    assert volumes["policies"]["configMap"]["name"] == "gpuguard-policies-site"
    assert _one(objects, "PodDisruptionBudget", "gpuguard-webhook")["spec"]["minAvailable"] == 2
    # The quota ledgers' namespace moves with its Role and RoleBinding.
    assert _one(objects, "Namespace", "gpuguard-ledgers")
    assert _one(objects, "Role", "gpuguard-webhook-quota-ledger")["metadata"]["namespace"] == \
        "gpuguard-ledgers"
    # No prefilter: every pod of the matched namespaces goes to gpuguard.
    webhooks = [w for o in objects if o["kind"].endswith("WebhookConfiguration")
                for w in o["webhooks"]]
    assert len(webhooks) == 3
    for webhook in webhooks:
        assert "matchConditions" not in webhook, webhook["name"]
        selector = webhook["namespaceSelector"]["matchExpressions"][0]
        assert selector["values"] == ["kube-system", "monitoring", "cert-manager", NAMESPACE]
    policies = {w["name"]: w["failurePolicy"] for w in webhooks}
    assert policies == {"pods.validate.gpuguard.io": "Fail",
                        "workloads.validate.gpuguard.io": "Fail", "mutate.gpuguard.io": "Ignore"}
    # --cluster-policies gets deploy/crds/rbac.yaml, bound to the release's account.
    binding = _one(objects, "ClusterRoleBinding", "gpuguard-webhook-policies")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-webhook",
                                    "namespace": NAMESPACE}]
    # ... and what components/cluster-policies adds: the status Lease's Role and the pod's name.
    lease = _one(objects, "Role", "gpuguard-policy-status")
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert {"get", "update"} <= {v for r in lease["rules"] for v in r["verbs"]}
    assert _one(objects, "RoleBinding", "gpuguard-policy-status")["subjects"][0]["name"] == \
        "gpuguard-webhook"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in \
        container["env"]
    cronjob = _one(objects, "CronJob", "gpuguard-audit")
    assert cronjob["spec"]["schedule"] == "*/30 * * * *"
    args = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--write-reports" not in args and "--output=json" in args
    assert _one(objects, "ConfigMap", "gpuguard-policies-site")["data"]


def test_another_release_namespace_is_used_everywhere_and_never_gated() -> None:
    objects = render("cert-manager", namespace="platform-gpu")
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        assert namespace in (None, "platform-gpu", "gpuguard-quota"), _key(obj)
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "platform-gpu", _key(obj)
    for obj in objects:
        for webhook in obj.get("webhooks", []):
            assert webhook["clientConfig"]["service"]["namespace"] == "platform-gpu"
            assert "platform-gpu" in webhook["namespaceSelector"]["matchExpressions"][0]["values"]
        annotations = obj["metadata"].get("annotations", {})
        if "cert-manager.io/inject-ca-from" in annotations:
            assert annotations["cert-manager.io/inject-ca-from"] == "platform-gpu/gpuguard-serving"
    serving = _one(objects, "Certificate", "gpuguard-serving")
    assert serving["spec"]["dnsNames"][0] == "gpuguard.platform-gpu.svc"
    monitor = _one(objects, "ServiceMonitor", "gpuguard-webhook")
    assert monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == "gpuguard.platform-gpu.svc"
    vap = _one(objects, "ValidatingAdmissionPolicy", "gpuguard-inventory-node-patch")
    assert "system:serviceaccount:platform-gpu:gpuguard-inventory" in vap["spec"][
        "matchConditions"][0]["expression"]


def test_a_pem_ca_bundle_is_base64_encoded_into_every_webhook(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    objects = render("default", extra=("--set-string", f"certificates.caBundle={pem}"))
    bundles = {w["clientConfig"]["caBundle"] for o in objects for w in o.get("webhooks", [])}
    assert len(bundles) == 1
    assert base64.b64decode(bundles.pop()).decode() == pem + "\n"


def test_an_unknown_certificates_mode_is_refused_by_name() -> None:
    done = helm("template", "gpuguard", str(CHART), "--set", "certificates.mode=vault")
    assert done.returncode != 0
    assert "at '/certificates/mode': value must be one of 'self-managed', 'cert-manager'" in \
        done.stderr
    # Without the schema (--skip-schema-validation) the template still refuses it.
    done = helm("template", "gpuguard", str(CHART), "--skip-schema-validation", "--set",
                "certificates.mode=vault")
    assert done.returncode != 0
    assert 'certificates.mode: "vault" is neither self-managed nor cert-manager' in done.stderr


# The trial's bad values (tests/data/helm/trial-bad-values.yaml: failurePolicy Ignor,
# timeoutSeconds 31, deadlineMs 9000 under the default 5 s timeout), one case per value, and more
# a user gets wrong; each with what helm must print: the schema's messages name the value's path.
# `helm lint` logs a template's `fail` without failing, so the rules between values are in the
# schema too (one if/then per timeoutSeconds for the deadline, one per replicas for the PDB); only
# extraArgs repeating a chart flag is templates' alone (NOT_LINTED).
TRIAL_BAD_VALUES = ROOT / "tests" / "data" / "helm" / "trial-bad-values.yaml"
BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "failurePolicy Ignor": (
        {"webhook": {"failurePolicy": {"pods": "Ignor"}}},
        "at '/webhook/failurePolicy/pods': value must be one of 'Fail', 'Ignore'"),
    "timeoutSeconds 31": (
        {"webhook": {"timeoutSeconds": 31}},
        "at '/webhook/timeoutSeconds': maximum: got 31, want 30"),
    "deadlineMs 9000 of a 5 s timeout": (
        {"webhook": {"deadlineMs": 9000}},
        "at '/webhook/deadlineMs': maximum: got 9,000, want 2,500"),
    "deadlineMs 2501 of a 5 s timeout": (
        {"webhook": {"deadlineMs": 2501}},
        "at '/webhook/deadlineMs': maximum: got 2,501, want 2,500"),
    "deadlineMs 1500 of a 2 s timeout": (
        {"webhook": {"timeoutSeconds": 2, "deadlineMs": 1500}},
        "at '/webhook/deadlineMs': maximum: got 1,500, want 1,000"),
    "timeoutSeconds 0": (
        {"webhook": {"timeoutSeconds": 0}},
        "at '/webhook/timeoutSeconds': minimum: got 0, want 1"),
    "misspelt webhook key": (
        {"webhook": {"timeoutSecond": 10}},
        "at '/webhook': additional properties 'timeoutSecond' not allowed"),
    "misspelt top-level key": (
        {"webhooks": {"enabled": False}},
        "at '': additional properties 'webhooks' not allowed"),
    "replicas as a word": (
        {"webhook": {"replicas": "two"}},
        "at '/webhook/replicas': got string, want integer"),
    "excludedNamespaces a string": (
        {"webhook": {"excludedNamespaces": "kube-system"}},
        "at '/webhook/excludedNamespaces': got string, want array"),
    "excludedNamespaces not a namespace name": (
        {"webhook": {"excludedNamespaces": ["Kube_System"]}},
        "at '/webhook/excludedNamespaces/0'"),
    "unquoted numeric image tag": (
        {"image": {"tag": 1.1}},
        "at '/image/tag': got number, want string"),
    "unquoted boolean node selector": (
        {"inventory": {"nodeSelector": {"nvidia.com/gpu.present": True}}},
        "at '/inventory/nodeSelector/nvidia.com~1gpu.present': got boolean, want string"),
    "audit output unknown": (
        {"audit": {"output": "pdf"}},
        "at '/audit/output': value must be one of"),
    # A fresh-context trial's find: the PDB's rule was in templates/checks.yaml only, so
    # `helm lint --strict` passed a PDB that blocks every node drain.
    "PDB as many as the replicas": (
        {"webhook": {"replicas": 2, "podDisruptionBudget": {"minAvailable": 2}}},
        "at '/webhook/podDisruptionBudget/minAvailable': maximum: got 2, want 1"),
    "PDB above the replicas": (
        {"webhook": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 5}}},
        "at '/webhook/podDisruptionBudget/minAvailable': maximum: got 5, want 2"),
    "PDB 100%": (
        {"webhook": {"podDisruptionBudget": {"minAvailable": "100%"}}},
        "'100%' does not match pattern '^(0|[1-9][0-9]?)%$'"),
    "PDB 0100%": (
        {"webhook": {"podDisruptionBudget": {"minAvailable": "0100%"}}},
        "'0100%' does not match pattern '^(0|[1-9][0-9]?)%$'"),
    "PDB 150%": (
        {"webhook": {"podDisruptionBudget": {"minAvailable": "150%"}}},
        "'150%' does not match pattern '^(0|[1-9][0-9]?)%$'"),
    "replicas 31 (past the PDB's if/thens)": (
        {"webhook": {"replicas": 31}},
        "at '/webhook/replicas': maximum: got 31, want 30"),
    "extraArgs repeating a flag the chart sets (a second trial's find)": (
        {"webhook": {"extraArgs": ["--deadline-ms=9000"]}},
        "extraArgs: --deadline-ms is set by the chart from its values"),
    # The webhook may get/create/update every ConfigMap of the quota namespace (a trial's find:
    # the release namespace let it rewrite its own policies ConfigMap).
    "quota namespace the release namespace": (
        {"quota": {"namespace": NAMESPACE}},
        f"quota.namespace ({NAMESPACE}) is the release namespace, which holds the policies "
        "ConfigMap: the webhook could rewrite its own policies"),
    "quota namespace kube-system": (
        {"quota": {"namespace": "kube-system"}},
        "quota.namespace (kube-system) is the control plane's namespace; the webhook may get, "
        "create and update every ConfigMap of the quota namespace"),
    "quota namespace kube-public": (
        {"quota": {"namespace": "kube-public"}}, "quota.namespace (kube-public) is a namespace"),
    "quota namespace default": (
        {"quota": {"namespace": "default"}}, "quota.namespace (default) is a namespace"),
    "required value removed": (
        {"webhook": {"timeoutSeconds": None}},
        "at '/webhook': missing property 'timeoutSeconds'"),
}
NOT_LINTED = {"extraArgs repeating a flag the chart sets (a second trial's find)",
              "quota namespace the release namespace", "quota namespace kube-system",
              "quota namespace kube-public", "quota namespace default"}


def test_the_bad_value_cases_are_the_trials_values() -> None:
    trial = yaml.safe_load(TRIAL_BAD_VALUES.read_text())
    merged: dict[str, Any] = {}
    for name in ("failurePolicy Ignor", "timeoutSeconds 31", "deadlineMs 9000 of a 5 s timeout"):
        for key, value in BAD_VALUES[name][0]["webhook"].items():
            merged[key] = value
    assert trial == {"webhook": merged}


def test_the_trials_bad_values_file_is_refused_with_each_schema_message() -> None:
    done = helm("template", "gpuguard", str(CHART), "--values", str(TRIAL_BAD_VALUES))
    assert (done.returncode, done.stdout) == (1, "")
    for name in ("failurePolicy Ignor", "timeoutSeconds 31"):
        assert BAD_VALUES[name][1] in done.stderr, name


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_template_and_lint_with_the_message(case: str, tmp_path: Path) -> None:
    values, message = BAD_VALUES[case]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    done = helm("template", "gpuguard", str(CHART), "--namespace", NAMESPACE, "--values",
                str(path))
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert message in done.stderr
    assert "nil pointer" not in done.stderr
    linted = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(path))
    assert message in linted.stdout + linted.stderr
    if case in NOT_LINTED:
        assert linted.returncode == 0  # helm lint logs a `fail` ("funcMap fail") and passes
    else:
        assert linted.returncode == 1
        assert "1 chart(s) linted, 1 chart(s) failed" in linted.stdout + linted.stderr


def test_the_quota_namespace_follows_the_release_namespace() -> None:
    # In another release namespace that one is refused, and gpuguard-system is then just a name.
    refused = helm("template", "gpuguard", str(CHART), "--namespace", "team-gpu", "--set",
                   "quota.namespace=team-gpu")
    assert refused.returncode == 1
    assert "quota.namespace (team-gpu) is the release namespace" in refused.stderr
    objects = render("default", namespace="team-gpu",
                     extra=("--set", f"quota.namespace={NAMESPACE}"))
    roles = [o for o in objects if o["kind"] == "Role" and "quota" in o["metadata"]["name"]]
    assert [r["metadata"]["namespace"] for r in roles] == [NAMESPACE]


@pytest.mark.parametrize("timeout_s", [1, 2, 5, 10, 29, 30])
def test_the_schema_and_the_template_bound_the_deadline_alike(timeout_s: int) -> None:
    # Half of timeoutSeconds passes, one millisecond more fails: in the schema (helm lint and
    # install) and in templates/checks.yaml (the reason, under --skip-schema-validation).
    def template(deadline_ms: int, *extra: str) -> subprocess.CompletedProcess[str]:
        return helm("template", "gpuguard", str(CHART), *extra, "--set",
                    f"webhook.timeoutSeconds={timeout_s}", "--set",
                    f"webhook.deadlineMs={deadline_ms}")

    bound = timeout_s * 500
    assert template(bound).returncode == 0
    schema = template(bound + 1)
    assert schema.returncode == 1
    assert f"at '/webhook/deadlineMs': maximum: got {bound + 1:,}, want {bound:,}" in \
        schema.stderr
    assert template(bound, "--skip-schema-validation").returncode == 0
    checked = template(bound + 1, "--skip-schema-validation")
    assert checked.returncode == 1
    assert (f"webhook.deadlineMs ({bound + 1}) must be at most half of webhook.timeoutSeconds "
            f"({timeout_s} s, so at most {bound} ms): past the API server's timeout it applies "
            "the webhook's failurePolicy to every policy at once (Ignore admits unchecked)") in \
        checked.stderr


def test_the_cross_field_checks_pass_at_their_bounds() -> None:
    # At half the timeout exactly (the base's 2500 ms of 5 s; 15 s of 30), and with the webhook
    # off (no server, no deadline); a PDB one below the replicas; a percentage below 100 %.
    for extra in (("--set", "webhook.deadlineMs=2500"),
                  ("--set", "webhook.timeoutSeconds=30", "--set", "webhook.deadlineMs=15000"),
                  ("--set", "webhook.enabled=false", "--set", "webhook.deadlineMs=9000"),
                  ("--set", "webhook.replicas=3", "--set",
                   "webhook.podDisruptionBudget.minAvailable=2"),
                  ("--set", "webhook.podDisruptionBudget.enabled=false", "--set",
                   "webhook.podDisruptionBudget.minAvailable=2")):
        assert render("default", extra=extra), extra
    for percent in ("50%", "99%", "0%"):
        pdb = _one(render("default", extra=("--set-string",
                                            f"webhook.podDisruptionBudget.minAvailable={percent}")),
                   "PodDisruptionBudget", "gpuguard-webhook")
        assert pdb["spec"]["minAvailable"] == percent
    for percent in ("100%", "0100%", "150%"):  # the reason, under --skip-schema-validation
        done = helm("template", "gpuguard", str(CHART), "--skip-schema-validation",
                    "--set-string", f"webhook.podDisruptionBudget.minAvailable={percent}")
        assert done.returncode == 1
        assert (f"webhook.podDisruptionBudget.minAvailable ({percent}) allows no eviction: node "
                "drains never finish; lower it below 100% or disable the PDB") in done.stderr


@pytest.mark.parametrize("replicas", [1, 2, 3, 10, 30])
def test_the_schema_and_the_template_bound_the_pdb_alike(replicas: int) -> None:
    # One below the replicas passes, as many fails: in the schema (helm lint and install) and in
    # templates/checks.yaml (the reason, under --skip-schema-validation).
    def lint(minimum: int) -> subprocess.CompletedProcess[str]:
        return helm("lint", "--strict", str(CHART), "--set", f"webhook.replicas={replicas}",
                    "--set", f"webhook.podDisruptionBudget.minAvailable={minimum}")

    def template(minimum: int) -> subprocess.CompletedProcess[str]:
        return helm("template", "gpuguard", str(CHART), "--skip-schema-validation", "--set",
                    f"webhook.replicas={replicas}", "--set",
                    f"webhook.podDisruptionBudget.minAvailable={minimum}")

    assert lint(replicas - 1).returncode == 0 and template(replicas - 1).returncode == 0
    refused = lint(replicas)
    assert refused.returncode == 1
    assert (f"at '/webhook/podDisruptionBudget/minAvailable': maximum: got {replicas}, want "
            f"{replicas - 1}") in refused.stdout + refused.stderr
    checked = template(replicas)
    assert checked.returncode == 1
    assert (f"webhook.podDisruptionBudget.minAvailable ({replicas}) must be below "
            f"webhook.replicas ({replicas})") in checked.stderr


def test_null_defaults_mean_what_the_empty_value_means() -> None:
    # A fresh-context trial's find: `webhook.extraArgs: null` (helm drops the key) failed with
    # "missing property 'extraArgs'", which names no mistake; like excludedNamespaces, null is
    # the empty value for every key whose empty value is a default.
    nulls = ("webhook.extraArgs", "image.tag", "image.pullPolicy", "webhook.logLevel",
             "certificates.caBundle")
    extra = tuple(a for key in nulls for a in ("--set", f"{key}=null"))
    assert _by_key(render("default", extra=extra)) == _by_key(render("default"))
    controller = ("--set", "auditController.enabled=true")
    assert _by_key(render("default", extra=(*controller, "--set",
                                            "auditController.extraArgs=null"))) == \
        _by_key(render("default", extra=controller))
    linted = helm("lint", "--strict", str(CHART), *extra)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_null_excluded_namespaces_exclude_only_the_release_namespace() -> None:
    # `--set webhook.excludedNamespaces=null` (helm's way to drop a default) was a nil-pointer
    # template error; it means no namespace besides the release's own, as [] does.
    for extra in (("--set", "webhook.excludedNamespaces=null"),
                  ("--set-json", "webhook.excludedNamespaces=[]")):
        webhooks = [w for o in render("default", extra=extra)
                    if o["kind"].endswith("WebhookConfiguration") for w in o["webhooks"]]
        assert len(webhooks) == 3
        for webhook in webhooks:
            assert webhook["namespaceSelector"]["matchExpressions"][0] == {
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": [NAMESPACE]}, (extra, webhook["name"])


def test_the_audit_controller_follows_the_release_namespace_and_its_values() -> None:
    objects = render("audit-controller", namespace="platform-gpu", extra=(
        "--set", "auditController.replicas=3", "--set", "auditController.reportIntervalS=10",
        "--set", "auditController.extraArgs={--writes-per-s=7}",
        "--set", "policies.configMapName=site-policies"))
    deployment = _one(objects, "Deployment", "gpuguard-audit-controller")
    assert (deployment["metadata"]["namespace"], deployment["spec"]["replicas"]) == \
        ("platform-gpu", 3)
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    # The Lease it elects by is in the release namespace, where its Role grants it.
    assert "--lease=platform-gpu/gpuguard-audit" in args
    assert "--report-interval-s=10" in args and args[-1] == "--writes-per-s=7"
    assert pod["containers"][0]["image"] == "registry.example.com/gpuguard:0.1.0"
    assert {"name": "policies", "configMap": {"name": "site-policies"}} in pod["volumes"]
    lease = _one(objects, "Role", "gpuguard-audit-controller-lease")
    assert lease["metadata"]["namespace"] == "platform-gpu"
    for name in ("gpuguard-audit-controller-lease", "gpuguard-audit-controller"):
        kind = "RoleBinding" if name.endswith("lease") else "ClusterRoleBinding"
        assert _one(objects, kind, name)["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpuguard-audit-controller",
             "namespace": "platform-gpu"}]
    # The CronJob would rewrite the same reports: suspended, as the component patches it.
    assert _one(objects, "CronJob", "gpuguard-audit")["spec"]["suspend"] is True
    assert "suspend" not in _one(render("default"), "CronJob", "gpuguard-audit")["spec"]
    for kind, name in (("PrometheusRule", "gpuguard"),
                       ("ConfigMap", "gpuguard-grafana-dashboard"),
                       ("ServiceMonitor", "gpuguard-audit-controller")):
        assert _one(objects, kind, name)["metadata"]["namespace"] == "platform-gpu"


def test_each_monitoring_object_has_its_own_value() -> None:
    only = {"auditController.enabled": "true", "monitoring.dashboard.enabled": "true"}
    objects = render("default", extra=tuple(a for k, v in only.items() for a in
                                            ("--set", f"{k}={v}")))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("ConfigMap", "gpuguard-grafana-dashboard") in kinds
    assert ("Deployment", "gpuguard-audit-controller") in kinds
    assert not {k for k in kinds if k[0] in ("PrometheusRule", "ServiceMonitor")}
    dashboard = _one(objects, "ConfigMap", "gpuguard-grafana-dashboard")
    assert dashboard["data"]["gpuguard.json"] == (
        DEPLOY / "components" / "monitoring" / "grafana-dashboard.json").read_text()


def test_a_controller_servicemonitor_without_the_controller_is_refused_by_name() -> None:
    done = helm("template", "gpuguard", str(CHART), "--set", "monitoring.serviceMonitor.enabled=true")
    assert done.returncode != 0
    assert "monitoring.serviceMonitor.enabled scrapes the audit controller: set " \
        "auditController.enabled too" in done.stderr
