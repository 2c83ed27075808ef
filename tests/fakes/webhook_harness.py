"""Shared set-up for the webhook tests: the app built in-process over test or library policies.

Not a test module (it holds no tests); it lives under the ``test_webhook*`` name so that the
webhook's test files stay together.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from policies.authorization import Authorizer
from policies.facts.resource_names import GPUSettings
from policies.sources import Snapshot
from tests.builders.environment import ADMISSION_NOW as NOW
from tests.builders.rbac import gpu_roles
from tests.fakes.fake_timer import ManualTimer
from tests.paths import TESTS
from webhook.admission import Admitter, Recorder
from webhook.app import build_app
from webhook.health import Health
from webhook.metrics import Metrics
from webhook.policy_store import PolicyStore
from webhook.settings import ServerSettings

JSON = {"Content-Type": "application/json"}
DATA = TESTS / "data"


@functools.cache
def _library() -> policy_set.Loaded:
    return policy_set.load(None, GPUSettings())


def loader(source: Snapshot | None, *, skip_broken: bool = False) -> policy_set.Loaded:
    """policy_set.load (of the snapshot the store read), with the built-in library loaded once
    per test run."""
    return _library() if source is None else \
        policy_set.load(source, GPUSettings(), skip_broken=skip_broken)


def gpu_policy(name: str, spec: Mapping[str, Any]) -> str:
    """A GPUPolicy document as YAML text."""
    return yaml.safe_dump({"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
                           "metadata": {"name": name}, "spec": dict(spec)})


def write_policies(directory: Path, *documents: str, name: str = "policies.yaml") -> Path:
    """Write ``documents`` as one multi-document YAML file; returns the file.

    The file is replaced whole (a hidden temporary file renamed over it), so a server
    reloading meanwhile reads the old content or the new, never a half-written file: what a
    test of a reload sees does not depend on when the reload ran.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    temporary = directory / f".{name}.tmp"
    temporary.write_text("---\n".join(documents), encoding="utf-8")
    os.replace(temporary, path)
    return path


class Harness:
    """The webhook app and its collaborators, without sockets or TLS.

    Args:
        policies: policy paths, or None for the built-in library.
        namespaces: Namespace objects by name (a standalone source), or a namespace source.
        settings: server settings (defaults, deadline included).
        recorder: side effects of admitted requests.
        quota: the GPUQuota step (:class:`webhook.quota.QuotaGate`), or None.
        timer: the deadline clock; default a :class:`ManualTimer` that never moves by itself,
            so no answer depends on the machine's speed (a test advances it to reach a deadline).
        authorizer: what CEL ``authorizer`` checks ask; default the RBAC objects of
            tests/data/rbac/gpu-roles.yaml (what a cluster with those roles answers the
            SubjectAccessReviews of the library's gpu-requesters with).
    """

    def __init__(self, policies: Sequence[str | Path] | None, *,
                 namespaces: Mapping[str, Mapping[str, Any]] | Any | None = None,
                 settings: ServerSettings | None = None,
                 recorder: Recorder | None = None, quota: Any = None,
                 timer: ManualTimer | None = None,
                 authorizer: Authorizer | None = None, skip_broken: bool = False) -> None:
        self.settings = settings or ServerSettings(port=0, benchmark_routes=True)
        self.store = PolicyStore([str(p) for p in policies] if policies is not None else None,
                                 functools.partial(loader, skip_broken=skip_broken))
        self.result = self.store.load()
        self.namespaces = namespaces if hasattr(namespaces, "status") else \
            StaticNamespaces(namespaces or {}, "test")
        self.metrics = Metrics()
        self.executor = concurrent.futures.ThreadPoolExecutor(self.settings.eval_threads)
        self.timer = timer if timer is not None else ManualTimer()
        self.admitter = Admitter(self.store, self.namespaces, self.settings, self.metrics,
                                 self.executor, clock=lambda: NOW, recorder=recorder,
                                 quota=quota, timer=self.timer,
                                 authorizer=authorizer if authorizer is not None else gpu_roles())
        self.health = Health(self.store, self.namespaces,
                             quota_status=getattr(quota, "status", None))
        self.health.tls_up = True
        self.app = build_app(self.admitter, self.health, self.metrics, self.settings)

    def close(self) -> None:
        """Release the evaluation threads."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def review_file(name: str) -> dict[str, Any]:
    """An AdmissionReview from tests/data/admissionreviews (bare requests wrapped in v1)."""
    body = json.loads((DATA / "admissionreviews" / name).read_text(encoding="utf-8"))
    if body.get("kind") != "AdmissionReview":
        body = envelope(body)
    return body


def envelope(request: Mapping[str, Any],
             api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    """An AdmissionReview around ``request``."""
    return {"apiVersion": api_version, "kind": "AdmissionReview",
            "request": copy.deepcopy(dict(request))}


def bug_review(name: str, key: str | None = None) -> dict[str, Any]:
    """The ``input`` AdmissionReview of a bug case (or its sub-case ``key``)."""
    case = yaml.safe_load((DATA / "bugs" / name).read_text(encoding="utf-8"))
    review = case["input"] if key is None else case["input"][key]
    return copy.deepcopy(review)


def bug_expected(name: str) -> dict[str, Any]:
    """The ``expected`` section of a bug case."""
    case = yaml.safe_load((DATA / "bugs" / name).read_text(encoding="utf-8"))
    return case["expected"]


def patch_of(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The decoded JSONPatch of an AdmissionReview response, or None when there is none."""
    response = body["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def check_review_response(body: Mapping[str, Any], request_body: Mapping[str, Any],
                          endpoint: str) -> None:
    """Assert the AdmissionReview response contract for a 200 answer."""
    assert body["kind"] == "AdmissionReview"
    assert body["apiVersion"] == request_body["apiVersion"]
    response = body["response"]
    assert response["uid"] == request_body["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    assert set(response) <= {"uid", "allowed", "status", "warnings", "auditAnnotations",
                             "patchType", "patch"}
    if response["allowed"]:
        assert "status" not in response
    else:
        status = response["status"]
        assert status["status"] == "Failure"
        assert isinstance(status["code"], int) and 400 <= status["code"] < 500
        assert isinstance(status["reason"], str) and status["reason"]
        assert isinstance(status["message"], str) and status["message"]
    for warning in response.get("warnings", []):
        assert isinstance(warning, str) and "\n" not in warning
    for key, value in response.get("auditAnnotations", {}).items():
        assert isinstance(value, str)
        assert 0 < len(key) <= 63
    patch = patch_of(body)
    if endpoint != "mutate":
        assert patch is None
    elif patch is not None:
        assert isinstance(patch, list) and patch


def check_status_body(body: Mapping[str, Any], status: int) -> None:
    """Assert the ``Status`` body of a 4xx answer."""
    assert body["kind"] == "Status"
    assert body["status"] == "Failure"
    assert body["code"] == status
    assert isinstance(body["message"], str) and body["message"]
