"""The built-in policy library: every suite case passes, every policy has a suite and lints
cleanly, the library is sensible on the whole corpus, and a few denials read exactly as written."""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpuguard.cli import main
from policies import suites as testing
from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import CelEnvironment
from policies.engine.evaluation import Engine, RuleOutcome, Verdict
from policies.facts.review import UserInfo, from_object, from_request, namespace_stub
from policies.policy.loader import load_policies
from policies.sources import library_path, read_documents
from tests.builders.corpus import DATA, bug_input, first
from tests.builders.rbac import gpu_roles
from tests.paths import ROOT

LIBRARY = Path(library_path())
SUITES = ROOT / "tests" / "policies"
POLICY_FILES = sorted(LIBRARY.glob("*.yaml"))


def _suite_cases() -> list[tuple[str, str]]:
    """(suite file, case name) of every case, read without running anything."""
    cases = []
    for path in sorted(SUITES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(document, dict) and document.get("kind") == testing.KIND:
                cases.extend((path.name, case["name"]) for case in document["cases"])
    return cases


@functools.cache
def _suite_results(name: str) -> testing.SuiteResult:
    results = testing.run_paths([str(SUITES / name)])
    assert len(results) == 1
    return results[0]


@functools.cache
def _engine() -> Engine:
    environment = CelEnvironment(GPU_LIBRARY)
    policy_set, errors = load_policies([str(LIBRARY)], environment)
    assert not errors
    return Engine(policy_set, environment)


def _namespace(name: str, **labels: str) -> dict:
    return namespace_stub(name, labels)


def _verdict(obj: dict, namespace: str = "default", user: UserInfo | None = None,
             **labels: str) -> Verdict:
    review = from_object(obj, user=user, namespace_object=_namespace(namespace, **labels))
    review = replace(review, namespace=namespace,
                     request={**review.request, "namespace": namespace})
    return _engine().evaluate(review, authorizer=gpu_roles())


# --- the suites -------------------------------------------------------------------------------


@pytest.mark.parametrize(("suite", "case"), _suite_cases(),
                         ids=[f"{s.removesuffix('.yaml')}: {c}" for s, c in _suite_cases()])
def test_suite_case(suite: str, case: str) -> None:
    result = _suite_results(suite)
    assert not result.errors, result.errors
    found = {c.case: c for c in result.cases}
    assert case in found
    outcome = found[case]
    if outcome.status == testing.SKIPPED:
        pytest.skip("; ".join(outcome.differences))
    assert outcome.status == testing.PASSED, "\n".join(outcome.differences)


def test_every_library_policy_has_a_suite() -> None:
    suites = {}
    for path in SUITES.glob("*.yaml"):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        suites[document["metadata"]["name"]] = [
            (path.parent / p).resolve() for p in document["policies"]]
    assert len(POLICY_FILES) >= 10
    for policy in POLICY_FILES:
        assert policy.stem in suites, f"no suite in tests/policies for {policy.name}"
        assert suites[policy.stem] == [policy.resolve()]


def test_suites_run_clean_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", str(SUITES)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"11 suite\(s\), \d+ case\(s\): \d+ passed, 0 failed, 0 error\(s\)", out)


# --- the policy files -------------------------------------------------------------------------


@pytest.mark.parametrize("path", POLICY_FILES, ids=[p.stem for p in POLICY_FILES])
def test_library_file_lints_cleanly_and_documents_itself(path: Path) -> None:
    policy_set, errors = load_policies([str(path)], CelEnvironment(GPU_LIBRARY))
    assert [str(e) for e in errors] == []
    assert policy_set.names() == (path.stem,)
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# {path.stem}: ")
    for word in ("# What:", "# Why:", "# Params", "# Example"):
        assert word in text
    body = yaml.safe_load(text)
    assert isinstance(body["spec"]["params"], dict)
    description = body["spec"]["description"]
    assert "Why:" in description
    assert "Params:" in description
    assert "Example" in description


def test_gpuguard_lint_reports_no_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(LIBRARY)]) == 0
    assert "11 policies loaded, 0 error(s), 0 warning(s)" in capsys.readouterr().out


def test_readme_example_suite_passes(tmp_path: Path) -> None:
    readme = (LIBRARY / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(apiVersion: gpuguard.io/v1alpha1\nkind: GPUPolicyTest.*?)```",
                      readme, re.S)
    assert block
    text = block[1].replace("../../policies/", f"{ROOT}/policies/") \
        .replace("../data/", f"{DATA}/")
    suite = tmp_path / "readme.yaml"
    suite.write_text(text, encoding="utf-8")
    results = testing.run_paths([str(suite)])
    assert [c.status for c in results[0].cases] == ["pass", "pass", "pass"]


# --- the library on the corpus ---------------------------------------------------------------


def _corpus_objects() -> list:
    documents, errors = read_documents([str(DATA / "manifests")])
    assert not errors
    return documents


@pytest.mark.parametrize("labels", [
    {}, {"gpuguard.io/team": "inference", "gpuguard.io/gpu-sharing": "restricted"},
], ids=["plain namespace", "team restricted namespace"])
def test_no_policy_errors_on_any_corpus_manifest(labels: dict[str, str]) -> None:
    for document in _corpus_objects():
        obj = document.body
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        for user in (None, UserInfo("alice", groups=("gpu-interns",))):
            verdict = _verdict(obj, namespace, user, **labels)
            errors = [r for r in verdict.results if r.outcome == RuleOutcome.ERROR]
            assert errors == [], (document.location, errors)


def test_corpus_decisions_in_a_plain_namespace() -> None:
    denied = {}
    for document in _corpus_objects():
        obj = document.body
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        verdict = _verdict(obj, namespace)
        if not verdict.allowed:
            name = Path(document.source).name
            denied[f"{name}#{document.index}"] = sorted(
                {r.policy for r in verdict.results if r.outcome == "fail"})
    assert denied == {
        "imroc__ollama-statefulset-gpu-requests-only.yaml#0": ["gpu-requests-equal-limits"],
        "imroc__ollama-statefulset-gpu-zero-request.yaml#0": ["gpu-requests-equal-limits"],
        "kftrain__legacy-tfjob-alpha-nvidia-gpu.yaml#0": ["gpu-requests-equal-limits"],
        "mpiop__nccl-tests-mpijob.yaml#0": ["no-privileged-gpu", "no-unrequested-gpu-access"],
        "ndp__gfd-daemonset-mig-mixed-privileged.yaml#0": ["no-unrequested-gpu-access"],
    }


def test_gpu_operator_daemonset_is_allowed_in_its_namespace() -> None:
    gfd = first("manifests/ndp__gfd-daemonset-mig-mixed-privileged.yaml")
    for namespace in ("gpu-operator", "nvidia-gpu-operator", "kube-system", "hami-system"):
        assert _verdict(gfd, namespace).allowed, namespace
    assert not _verdict(gfd, "team-a").allowed


# --- exact denial messages --------------------------------------------------------------------


LIMITS_ADVICE = (
    ". Put GPUs in resources.limits (the request then defaults to the limit); if you also set "
    "resources.requests it must equal the limit, as a whole number, under a current resource "
    "name (nvidia.com/gpu, not alpha.kubernetes.io/nvidia-gpu)."
)


def test_message_gpu_request_without_limit() -> None:
    ollama = first("manifests/imroc__ollama-statefulset-gpu-requests-only.yaml")
    assert _verdict(ollama, "llama").message == (
        "gpu-requests-equal-limits: container 'ollama' (spec.template.spec.containers[0]): "
        "nvidia.com/gpu requests 1, limits not set: an extended resource needs a limit; a "
        "request without a limit is rejected by the API server" + LIMITS_ADVICE
    )


def test_message_gpu_zero_request_without_limit() -> None:
    ollama = first("manifests/imroc__ollama-statefulset-gpu-zero-request.yaml")
    assert _verdict(ollama, "llama").message == (
        "gpu-requests-equal-limits: container 'ollama' (spec.template.spec.containers[0]): "
        "nvidia.com/gpu requests 0, limits not set: an extended resource needs a limit; a "
        "request without a limit is rejected by the API server (a request of 0 asks for no GPU: "
        "remove it)" + LIMITS_ADVICE
    )


def test_message_gpu_request_different_from_limit_in_a_job() -> None:
    job = bug_input("NVIDIA-k8s-device-plugin-154.yaml")["request"]["object"]
    assert _verdict(job, "team-a").message == (
        "gpu-requests-equal-limits: container 'train' (spec.template.spec.containers[0]): "
        "nvidia.com/gpu requests 1, limits 3: requests (1) must equal limits (3) for an extended "
        "resource" + LIMITS_ADVICE
    )


def test_message_obsolete_gpu_resource_name() -> None:
    tfjob = first("manifests/kftrain__legacy-tfjob-alpha-nvidia-gpu.yaml")
    assert _verdict(tfjob).message == (
        "gpu-requests-equal-limits: container 'tensorflow' "
        "(spec.replica_specs[0].template.spec.containers[0]): alpha.kubernetes.io/nvidia-gpu "
        "requests not set, limits 1: obsolete resource name (removed in Kubernetes 1.10; use "
        "nvidia.com/gpu); the API server rejects it" + LIMITS_ADVICE
    )


@pytest.mark.parametrize(("limit", "shown", "value"), [
    ("500m", "500m", "0.5"), (0.5, "500m", "0.5"), (2.5e6 + 0.5, "2500000500m", "2500000.5"),
])
def test_message_fractional_gpu_limit(limit: object, shown: str, value: str) -> None:
    # Edited copy of the nbody pod: limit nvidia.com/gpu as given; a YAML number is shown as
    # the API server stores it (0.5 is "500m"), the form the policy reads in the cluster.
    pod = first("manifests/dcgm__nbody-pod-burstable-cpu.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = limit
    assert _verdict(pod).message == (
        f"gpu-requests-equal-limits: container 'nbody' (spec.containers[0]): nvidia.com/gpu "
        f"requests not set, limits {shown}: {value} is not a whole number; extended resources "
        "take integers" + LIMITS_ADVICE
    )


def test_message_init_and_app_container_problems_are_joined() -> None:
    # Edited copy of the HAMi#2167 pod: the init container asks for nvidia.com/gpu 1 but is
    # limited to 2, and the app container requests nvidia.com/gpu "0" with no limit.
    pod = bug_input("Project-HAMi-HAMi-2167.yaml")["request"]["object"]
    warmup = pod["spec"]["initContainers"][0]["resources"]
    warmup["limits"]["nvidia.com/gpu"] = 2
    warmup["requests"] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "0"
    assert _verdict(pod, "team-a").message == (
        "gpu-requests-equal-limits: container 'warmup' (spec.initContainers[0]): nvidia.com/gpu "
        "requests 1, limits 2: requests (1) must equal limits (2) for an extended resource; "
        "container 'app' (spec.containers[0]): nvidia.com/gpu requests 0, limits not set: an "
        "extended resource needs a limit; a request without a limit is rejected by the API "
        "server (a request of 0 asks for no GPU: remove it)" + LIMITS_ADVICE
    )


def test_message_privileged_mpijob() -> None:
    nccl = first("manifests/mpiop__nccl-tests-mpijob.yaml")
    assert tuple(d.text for d in _verdict(nccl, "team-a").denials) == (
        "no-privileged-gpu: container 'nccl' "
        "(spec.mpiReplicaSpecs.Worker.template.spec.containers[0].securityContext.privileged): "
        "privileged container, in a pod that requests GPUs. A privileged or SYS_ADMIN container "
        "reaches every GPU on the node, not only the ones allocated to it. Remove "
        "securityContext.privileged and the SYS_ADMIN capability (GPUs requested in "
        "resources.limits need neither); GPU system components belong in a namespace of "
        "params.exemptNamespaces of policy no-privileged-gpu.",
        "no-unrequested-gpu-access: container 'nccl' "
        "(spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].securityContext.privileged): "
        "privileged container: sees every device on the node without requesting a GPU. A "
        "container that needs a GPU must request it in resources.limits (e.g. nvidia.com/gpu: "
        "1); otherwise remove the setting (or set NVIDIA_VISIBLE_DEVICES=void; give an envFrom "
        "another prefix than NVIDIA_, or set the variables it may set in env), drop privileged "
        "/ SYS_ADMIN and /dev host mounts. GPU system components belong in a namespace of "
        "params.exemptNamespaces of policy no-unrequested-gpu-access.",
    )


def test_message_ephemeral_debug_container() -> None:
    review = from_request(bug_input("deckhouse-deckhouse-22398.yaml")["request"],
                          namespace_object=_namespace("team-a"))
    verdict = _engine().evaluate(review)
    assert verdict.message == (
        "no-unrequested-gpu-access: ephemeral container 'debugger-x7k2p' "
        "(spec.ephemeralContainers[0].env[0]): NVIDIA_VISIBLE_DEVICES=all without requesting a "
        "GPU. A container that needs a GPU must request it in resources.limits (e.g. "
        "nvidia.com/gpu: 1); otherwise remove the setting (or set NVIDIA_VISIBLE_DEVICES=void; "
        "give an envFrom another prefix than NVIDIA_, or set the variables it may set in env), "
        "drop privileged / SYS_ADMIN and /dev host mounts. GPU system components belong in a "
        "namespace of params.exemptNamespaces of policy no-unrequested-gpu-access."
    )


def test_message_mig_profile_not_allowed_for_team() -> None:
    pod = first("manifests/hami__static-mig-3g.20gb.yaml")
    verdict = _verdict(pod, "serving", **{"gpuguard.io/team": "inference"})
    # In a team namespace require-queue-label also asks for a queue label: look at this policy.
    assert [d.text for d in verdict.denials if d.policy == "mig-profile-allowed"] == [(
        "mig-profile-allowed: MIG profile 3g.20gb is not allowed for team 'inference' "
        "(namespace 'serving', label gpuguard.io/team=inference); allowed: 1g.5gb, 1g.10gb, "
        "1g.12gb, 2g.10gb, 2g.20gb, 2g.24gb. Ask for one of these profiles (resource "
        "nvidia.com/mig-<profile>), or ask the platform team to add 3g.20gb to "
        "params.allowedProfiles.inference of policy mig-profile-allowed."
    )]


def test_message_user_without_gpu_group() -> None:
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    verdict = _verdict(deployment, user=UserInfo("mallory", groups=("system:authenticated",)))
    assert verdict.message == (
        "gpu-requesters: user 'mallory' may not use GPUs not pinned to a product "
        "(spec.template.spec) in namespace 'default': RBAC allows no 'use' of gpus.gpuguard.io "
        "(without resourceNames) there. Ask the platform team for a RoleBinding to a GPU role."
    )


def test_message_queue_label_missing() -> None:
    deployment = first("manifests/vllm__mistral-7b-nvidia-deployment.yaml")
    verdict = _verdict(deployment, "team-a", **{"gpuguard.io/team": "a"})
    assert verdict.message == (
        "require-queue-label: Deployment 'mistral-7b' asks for GPUs in team namespace 'team-a' "
        "but names no queue: set the label kueue.x-k8s.io/queue-name or kai.scheduler/queue or "
        "runai/queue in metadata.labels of the Deployment (kai.scheduler/queue or runai/queue "
        "may instead be on every GPU pod template). Kueue reads kueue.x-k8s.io/queue-name on the "
        "workload object (a LocalQueue of this namespace); KAI reads kai.scheduler/queue on the "
        "workload, else on its pods; Run:ai runai/queue; Volcano spec.queue or the pod "
        "annotation scheduling.volcano.sh/queue-name."
    )
