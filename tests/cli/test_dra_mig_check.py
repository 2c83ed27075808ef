"""``check`` and ``gpus`` on DRA MIG claims (trial finding 2): a pod's ResourceClaimTemplate from
``-f`` or ``--snapshot`` makes its MIG slices judged by ``mig-profile-allowed`` and GPUQuota
``mig`` limits exactly as the ``nvidia.com/mig-<profile>`` form."""

from __future__ import annotations

import json
from pathlib import Path

from gpuguard.cli import main
from tests.paths import TESTS

TRIAL = TESTS / "data" / "trial"
MIG_ONLY = str(TRIAL / "dra" / "mig-only.yaml")
EXTENDED = str(TRIAL / "dra" / "mig-extended-resource-pod.yaml")
LIBRARY_MIG = "policies/library/mig-profile-allowed.yaml"
QUOTA = str(TRIAL / "quota" / "quota.yaml")
SNAPSHOT = str(TRIAL / "quota" / "snap.yaml")
DENIAL = ("mig-profile-allowed: MIG profile 1g.10gb is not allowed for team 'vision' (namespace "
          "'team-llm', label gpuguard.io/team=vision); this team may not use MIG. Ask the platform "
          "team to add 1g.10gb to params.allowedProfiles.vision of policy mig-profile-allowed.")
QUOTA_DENIAL = ("namespace team-llm (GPUQuota llm-mig) uses 0 of 1 MIG 1g.10gb instances; this "
                "pod needs 2 (headroom 1 MIG 1g.10gb instances)")


def _check(capsys, *args: str) -> tuple[int, dict[str, dict]]:
    code = main(["check", *args, "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    return code, {r["name"]: r for r in out["results"]}


def test_mig_profile_allowed_denies_the_dra_claim_as_the_extended_resource_form(capsys) -> None:
    team = ["--policies", LIBRARY_MIG, "--namespace-labels", "gpuguard.io/team=vision"]
    code, dra = _check(capsys, "-f", MIG_ONLY, *team)
    ext_code, ext = _check(capsys, "-f", EXTENDED, *team)
    assert code == ext_code == 1
    assert dra["p-mig"]["allowed"] is False and ext["p-mig-ext"]["allowed"] is False
    assert dra["p-mig"]["message"] == ext["p-mig-ext"]["message"] == DENIAL
    assert dra["p-cd"]["allowed"] and dra["p-vfio"]["allowed"]  # IMEX channel, VFIO: no MIG


def test_a_mig_claim_of_unknown_profile_is_denied_by_mig_profile_allowed(capsys) -> None:
    files = ["-f", str(TRIAL / "dra" / "dra.yaml"), "-f", str(TRIAL / "dra" / "pods.yaml")]
    code, out = _check(capsys, *files, "--policies", LIBRARY_MIG,
                       "--namespace-labels", "gpuguard.io/team=inference")
    assert code == 1
    denied = {n for n, r in out.items() if not r["allowed"]}
    # 2 mig.nvidia.com slices, no profile pinned: the pod and its template itself
    assert denied == {"p-v1-two-requests", "v1-two-requests"}
    for name in denied:
        assert out[name]["message"].startswith(
            "mig-profile-allowed: MIG profile unknown is not allowed for team 'inference'")


def test_gpuquota_mig_limit_denies_two_dra_slices(capsys) -> None:
    code, out = _check(capsys, "-f", MIG_ONLY, "--policies", QUOTA, "--snapshot", SNAPSHOT)
    assert code == 1
    assert out["p-mig"]["allowed"] is False
    assert out["p-mig"]["quota"]["denials"] == [QUOTA_DENIAL]
    assert out["p-mig"]["quota"]["usage"]["request"]["mig"] == {"1g.10gb": 2}
    assert out["p-cd"]["allowed"] and out["p-vfio"]["allowed"]


def test_the_template_may_come_from_the_snapshot(tmp_path: Path, capsys) -> None:
    text = Path(MIG_ONLY).read_text(encoding="utf-8").split("---\n")
    templates, pods = tmp_path / "templates.yaml", tmp_path / "pods.yaml"
    templates.write_text("---\n".join(text[:3]) + "---\n" + Path(SNAPSHOT).read_text(
        encoding="utf-8"), encoding="utf-8")
    pods.write_text("---\n".join(text[3:]), encoding="utf-8")
    code, out = _check(capsys, "-f", str(pods), "--policies", QUOTA, "--snapshot", str(templates))
    assert code == 1 and out["p-mig"]["quota"]["denials"] == [QUOTA_DENIAL]


def test_a_claim_whose_devices_are_unknown_is_unknown_size_under_a_mig_limit(
        tmp_path: Path, capsys) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text("\n".join(Path(MIG_ONLY).read_text(encoding="utf-8").split("---\n")[3:4]),
                    encoding="utf-8")  # p-mig alone: its template is not known
    code, out = _check(capsys, "-f", str(pods), "--policies", QUOTA, "--snapshot", SNAPSHOT)
    assert code == 1
    assert out["p-mig"]["quota"]["denials"] == [
        "GPUQuota llm-mig: the MIG slices of this pod are unknown (spec.resourceClaims[0]: the "
        "devices of mig-only are not known (they may be MIG slices)), so its mig limits cannot "
        "be checked (unknownSize: Deny)"]
    allow = tmp_path / "allow.yaml"
    allow.write_text(Path(QUOTA).read_text(encoding="utf-8").replace(
        "  limits:", "  unknownSize: Allow\n  limits:"), encoding="utf-8")
    code, out = _check(capsys, "-f", str(pods), "--policies", str(allow), "--snapshot", SNAPSHOT)
    assert code == 0 and out["p-mig"]["allowed"] is True


def test_gpus_shows_the_mig_profile_and_two_sevenths(capsys) -> None:
    assert main(["gpus", "-f", MIG_ONLY, "-o", "json"]) == 0
    objects = {o["name"]: o for o in json.loads(capsys.readouterr().out)["objects"]}
    total = objects["p-mig"]["total"]
    assert total["mig"] == {"1g.10gb": 2} and total["gpus"] == {}
    assert total["gpu_equivalents"] == round(2 / 7, 6)
    assert total["dra"]["claims"][0]["mig"] == {"1g.10gb": 2}
    assert main(["gpus", "-f", MIG_ONLY]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "p-mig" in line)
    assert "1g.10gb: 2" in row and "0.285714" in row


def test_the_claim_template_itself_is_denied_for_the_vision_team_and_allowed_for_inference(
        capsys) -> None:
    # At admission a Pod arrives without its claim: the ResourceClaimTemplate is judged itself.
    code, out = _check(capsys, "-f", MIG_ONLY, "--policies", LIBRARY_MIG,
                       "--namespace-labels", "gpuguard.io/team=vision")
    assert code == 1
    assert out["mig-only"]["allowed"] is False and out["mig-only"]["message"] == DENIAL
    assert out["compute-domain"]["allowed"] and out["vfio"]["allowed"]
    code, out = _check(capsys, "-f", MIG_ONLY, "--policies", LIBRARY_MIG,
                       "--namespace-labels", "gpuguard.io/team=inference")
    assert code == 0 and out["mig-only"]["allowed"] is True



def test_an_allocation_mode_all_mig_claim_is_unknown_size_under_a_mig_limit(capsys) -> None:
    """A second trial's find: a claim taking every matching 1g.10gb slice of the node was charged
    as one slice, so a `mig: {1g.10gb: 1}` GPUQuota admitted it."""
    code, out = _check(capsys, "-f", str(TRIAL / "dra" / "allocation-all.yaml"), "--policies",
                       str(TRIAL / "quota" / "mig-quota-vision.yaml"), "--snapshot",
                       str(TRIAL / "quota" / "vision-namespace.yaml"))
    assert code == 1
    assert out["p-all"]["allowed"] is False
    assert "the number of its MIG slices is not known (allocationMode All" in \
        out["p-all"]["quota"]["denials"][0]
    assert out["p-gpuclass"]["allowed"]  # a whole-GPU claim: no mig limit applies


MISSING = ("{path}: {what} in namespace team-llm is not in the input, so its devices (how many "
           "GPUs, which MIG profile) are unknown and no policy judged them; give it with -f or "
           "--snapshot (at admission it is judged itself when it is created)")


def test_a_pod_whose_claim_template_is_not_in_the_input_passes_with_a_note_naming_it(
        tmp_path: Path, capsys) -> None:
    """A fresh-context trial's find: p-mig without its template passed mig-profile-allowed with
    no word (the matchCondition saw no MIG profile). It still passes, as at the webhook, where
    the template is judged itself, but the result says which object was missing."""
    pods = tmp_path / "pods.yaml"
    pods.write_text(Path(MIG_ONLY).read_text(encoding="utf-8").split("---\n")[3],
                    encoding="utf-8")
    team = ["--policies", LIBRARY_MIG, "--namespace-labels", "gpuguard.io/team=vision"]
    code, out = _check(capsys, "-f", str(pods), *team)
    assert code == 0 and out["p-mig"]["allowed"] is True
    assert out["p-mig"]["notes"] == [MISSING.format(
        path="spec.resourceClaims[0]", what="ResourceClaimTemplate 'mig-only'")]
    assert main(["check", "-f", str(pods), *team]) == 0
    assert "note: spec.resourceClaims[0]: ResourceClaimTemplate 'mig-only' in namespace " \
        "team-llm is not in the input" in capsys.readouterr().out
    # given the template, no note, and the vision team is denied
    code, out = _check(capsys, "-f", str(pods), "-f", MIG_ONLY, *team)
    assert code == 1 and out["p-mig"]["notes"] == []


def test_a_workload_naming_a_resource_claim_not_in_the_input_gets_the_note(
        tmp_path: Path, capsys) -> None:
    deployment = tmp_path / "deploy.yaml"
    deployment.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: team-llm}\n"
        "spec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
        "    spec:\n      resourceClaims: [{name: g, resourceClaimName: shared-mig}]\n"
        "      containers: [{name: c, image: x, resources: {claims: [{name: g}]}}]\n",
        encoding="utf-8")
    code, out = _check(capsys, "-f", str(deployment), "--policies", LIBRARY_MIG,
                       "--namespace-labels", "gpuguard.io/team=vision")
    assert code == 0
    assert out["d"]["notes"] == [MISSING.format(path="spec.template.spec.resourceClaims[0]",
                                                what="ResourceClaim 'shared-mig'")]
