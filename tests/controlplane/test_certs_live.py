"""``gpuguard certs inject --live`` against the real API server (kube/webhooks.py).

The live update is one JSON patch whose first operation tests ``metadata.resourceVersion``: the
API server must apply it when nobody wrote in between, refuse it when somebody did (so their
change is not overwritten), and nothing must be sent when the caBundle is already current.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.webhooks import WebhookConfigError, admission_api, set_ca_bundle
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.webhook_process import generate_certs, gpuguard, loopback_webhooks

NAME = "gpuguard-validating"


@pytest.fixture
def configuration(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """deploy/base/webhooks.yaml's ValidatingWebhookConfiguration, applied (no caBundle yet)."""
    validating = [d for d in loopback_webhooks("https://127.0.0.1:1")
                  if d["kind"] == "ValidatingWebhookConfiguration"]
    path = tmp_path / "validating.yaml"
    path.write_text(yaml.safe_dump_all(validating))
    control_plane.kubectl("delete", "--ignore-not-found", "validatingwebhookconfiguration", NAME)
    applied = control_plane.kubectl("apply", "-f", str(path))
    assert applied.returncode == 0, applied.stderr
    yield path
    control_plane.kubectl("delete", "--ignore-not-found", "validatingwebhookconfiguration", NAME)


def _live(cluster: ControlPlane) -> dict[str, Any]:
    done = cluster.kubectl("get", "validatingwebhookconfiguration", NAME, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_inject_live_sets_every_ca_bundle_once(control_plane: ControlPlane, configuration: Path,
                                               tmp_path: Path) -> None:
    certs = generate_certs(tmp_path / "certs")
    expected = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    args = ("certs", "inject", "--ca", str(certs / "ca.crt"), "--live",
            f"validatingwebhookconfiguration/{NAME}", "--kubeconfig",
            str(control_plane.kubeconfig))
    first = gpuguard(*args)
    assert first.returncode == 0, first.stderr
    after = _live(control_plane)
    assert [w["clientConfig"]["caBundle"] for w in after["webhooks"]] == \
        [expected] * len(after["webhooks"])
    second = gpuguard(*args)
    assert second.returncode == 0, second.stderr
    # nothing sent the second time: the object did not change at all
    assert _live(control_plane)["metadata"]["resourceVersion"] == \
        after["metadata"]["resourceVersion"]


class _WriterInBetween:
    """The real AdmissionregistrationV1Api, with another writer's update between read and patch.

    Not a fake: both the read and the patch reach the API server; only the interleaving, which
    the test cannot otherwise pin down, is arranged.
    """

    def __init__(self, api: Any, cluster: ControlPlane) -> None:
        self._api = api
        self._cluster = cluster
        self.api_client = api.api_client

    def read_validating_webhook_configuration(self, name: str) -> Any:
        current = self._api.read_validating_webhook_configuration(name)
        labelled = self._cluster.kubectl("label", "validatingwebhookconfiguration", name,
                                         "--overwrite", "edited-meanwhile=yes")
        assert labelled.returncode == 0, labelled.stderr
        return current

    def patch_validating_webhook_configuration(self, name: str, body: Any, **kw: Any) -> Any:
        return self._api.patch_validating_webhook_configuration(name, body, **kw)


def test_inject_live_refuses_to_overwrite_a_concurrent_change(
        control_plane: ControlPlane, configuration: Path, tmp_path: Path) -> None:
    bundle = base64.b64encode((generate_certs(tmp_path / "certs") / "ca.crt").read_bytes()
                              ).decode()
    api_client = control_plane.api_client()
    try:
        api = _WriterInBetween(admission_api(api_client), control_plane)
        with pytest.raises(WebhookConfigError) as refused:
            set_ca_bundle(api, "ValidatingWebhookConfiguration", NAME, bundle)
        assert str(refused.value) == (f"ValidatingWebhookConfiguration/{NAME}: changed while "
                                      "being patched (resourceVersion moved); run again")
        live = _live(control_plane)
        assert live["metadata"]["labels"]["edited-meanwhile"] == "yes"  # their change stays
        assert all("caBundle" not in w["clientConfig"] for w in live["webhooks"])
        # run again, as the message says: now it applies
        done = set_ca_bundle(admission_api(api_client), "ValidatingWebhookConfiguration", NAME,
                             bundle)
        assert done.changed == tuple(w["name"] for w in live["webhooks"])
        assert {w["clientConfig"]["caBundle"] for w in _live(control_plane)["webhooks"]} == \
            {bundle}
    finally:
        api_client.close()


def test_inject_live_names_a_missing_configuration(control_plane: ControlPlane,
                                                   tmp_path: Path) -> None:
    certs = generate_certs(tmp_path / "certs")
    done = gpuguard("certs", "inject", "--ca", str(certs / "ca.crt"), "--live",
                    "mutatingwebhookconfiguration/not-there", "--kubeconfig",
                    str(control_plane.kubeconfig))
    assert done.returncode == 2
    assert "MutatingWebhookConfiguration/not-there: not found in the cluster" in done.stderr
