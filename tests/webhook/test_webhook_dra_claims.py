"""``mig-profile-allowed`` on the webhook's /validate for DRA claims themselves (trial finding 2):
a Pod arrives without the ResourceClaimTemplate or ResourceClaim it names, so the claim, created
first, is where its MIG profile is judged. The DeviceClass is cluster-scoped and not in the
request: MIG is known from the class name (``mig.nvidia.com``) and the request's selectors."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.builders.corpus import documents
from tests.fakes.webhook_harness import JSON, Harness, envelope
from tests.paths import ROOT

pytestmark = pytest.mark.asyncio
LIBRARY_MIG = ROOT / "policies" / "library" / "mig-profile-allowed.yaml"
TEAMS = {"vision": "team-vision", "inference": "team-inference"}
NAMESPACES = {ns: {"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns,
                                                       "gpuguard.io/team": team}}}
              for team, ns in TEAMS.items()}


def _template(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in documents("trial/dra/mig-only.yaml")
                              if d["kind"] == "ResourceClaimTemplate"
                              and d["metadata"]["name"] == name))


def _review(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    kind = str(obj["kind"])
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    return envelope({"uid": "u1", "kind": {"group": "resource.k8s.io", "version": "v1",
                                           "kind": kind},
                     "resource": {"group": "resource.k8s.io", "version": "v1",
                                  "resource": f"{kind.lower()}s"},
                     "operation": "CREATE", "namespace": namespace,
                     "name": obj["metadata"]["name"], "userInfo": {"username": "alice"},
                     "object": obj})


async def _validate(harness: Harness, aiohttp_client: Any, body: dict[str, Any]
                    ) -> dict[str, Any]:
    client = await aiohttp_client(harness.app)
    response = await client.post("/validate", data=json.dumps(body), headers=JSON)
    assert response.status == 200
    return dict((await response.json())["response"])


@pytest.fixture
def harness() -> Any:
    made = Harness([LIBRARY_MIG], namespaces=NAMESPACES)
    assert made.result.outcome == "loaded", made.result.errors
    yield made
    made.close()


async def test_a_template_for_two_1g10gb_slices_is_denied_for_the_vision_team(
        harness: Harness, aiohttp_client: Any) -> None:
    answer = await _validate(harness, aiohttp_client, _review(_template("mig-only"),
                                                              "team-vision"))
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert answer["status"]["message"] == (
        "mig-profile-allowed: MIG profile 1g.10gb is not allowed for team 'vision' (namespace "
        "'team-vision', label gpuguard.io/team=vision); this team may not use MIG. Ask the "
        "platform team to add 1g.10gb to params.allowedProfiles.vision of policy "
        "mig-profile-allowed.")


async def test_the_same_template_is_allowed_for_a_team_given_1g10gb(
        harness: Harness, aiohttp_client: Any) -> None:
    answer = await _validate(harness, aiohttp_client, _review(_template("mig-only"),
                                                              "team-inference"))
    assert answer["allowed"] is True


async def test_a_claim_for_mig_slices_of_unknown_profile_is_denied_as_the_pod_form(
        harness: Harness, aiohttp_client: Any) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "any-slice"},
             "spec": {"devices": {"requests": [
                 {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}
    answer = await _validate(harness, aiohttp_client, _review(claim, "team-inference"))
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith(
        "mig-profile-allowed: MIG profile unknown is not allowed for team 'inference' "
        "(namespace 'team-inference', label gpuguard.io/team=inference); allowed: 1g.5gb, "
        "1g.10gb, 1g.12gb, 2g.10gb, 2g.20gb, 2g.24gb. Ask for one of these profiles (a device "
        "selector profile == '<profile>')")


async def test_a_profile_pinned_by_a_selector_on_another_class_is_judged(
        harness: Harness, aiohttp_client: Any) -> None:
    # No DeviceClass at the webhook: the request's own selector shows the MIG profile.
    template = _template("mig-only")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    request["exactly"]["deviceClassName"] = "slices.example.com"
    request["exactly"]["selectors"][0]["cel"]["expression"] = (
        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'")
    answer = await _validate(harness, aiohttp_client, _review(template, "team-inference"))
    assert answer["allowed"] is False
    assert "MIG profile 3g.40gb is not allowed for team 'inference'" in \
        answer["status"]["message"]


async def test_claims_for_no_gpu_pass(harness: Harness, aiohttp_client: Any) -> None:
    for name in ("compute-domain", "vfio"):  # an IMEX channel; a whole GPU is not MIG
        answer = await _validate(harness, aiohttp_client, _review(_template(name),
                                                                  "team-vision"))
        assert answer["allowed"] is True, name

