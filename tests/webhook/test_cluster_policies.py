"""The served set from files and cluster objects (issue 17 item 2): the merge, whole-or-refused
per object, the last accepted version kept, and the status conditions and their writer.

Objects are injected into a :class:`PolicyObjectWatch` the way its worker threads apply a list
and watch events (``replace`` / ``apply``), and every reload is a call of
:meth:`ClusterPolicyStore.check`: no threads, no API server, no timing. The same flows against a
real kube-apiserver are in ``tests/controlplane/test_cluster_policies_live.py``.
"""

from __future__ import annotations

import copy
import datetime
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from gpuguard import policy_set
from kube.policy_objects import PolicyObject, PolicyObjectWatch, policy_object
from kube.policy_status import StatusPublisher
from kube.served_set import conditions, merge, status_differs
from policies.facts.resource_names import GPUSettings
from policies.facts.review import from_request
from policies.sources import Snapshot
from tests.fakes.webhook_harness import bug_review, gpu_policy, write_policies
from tests.paths import ROOT
from webhook.cluster_store import ClusterPolicyStore
from webhook.health import Health
from webhook.policy_store import LOADED, REJECTED, RETRY, UNCHANGED

LOADER = functools.partial(policy_set.load, settings=GPUSettings())
NOW = datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.UTC)
DENY_GPUS = {"validationActions": ["Deny"],
             "validations": [{"expression": "gpu.count <= 0", "message": "no GPUs here"}]}
# Valid for the CRD's schema (a non-empty string), refused by lint (CEL does not compile).
BROKEN = {"validationActions": ["Deny"],
          "validations": [{"expression": "gpu.count <=", "message": "broken"}]}


def raw(kind: str, name: str, spec: dict[str, Any], *, namespace: str = "",
        generation: int = 1, uid: str = "", resource_version: str = "1",
        status: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object as the API server returns it in a list or a watch event."""
    metadata: dict[str, Any] = {
        "name": name, "uid": uid or f"uid-{kind}-{namespace}-{name}", "generation": generation,
        "resourceVersion": resource_version, "creationTimestamp": "2026-12-01T00:00:00Z",
        "managedFields": [{"manager": "kubectl"}]}
    if namespace:
        metadata["namespace"] = namespace
    body: dict[str, Any] = {"apiVersion": "gpuguard.io/v1alpha1", "kind": kind,
                            "metadata": metadata, "spec": spec}
    if status is not None:
        body["status"] = status
    return body


def obj(kind: str, name: str, spec: dict[str, Any], **kwargs: Any) -> PolicyObject:
    made = policy_object(raw(kind, name, spec, **kwargs), kind)
    assert made is not None
    return made


def review(namespace: str = "default") -> Any:
    """A pod asking for a GPU (HAMi-160) in ``namespace``."""
    request = copy.deepcopy(bug_review("Project-HAMi-HAMi-160.yaml", "gpu_pod")["request"])
    request["namespace"] = namespace
    request["object"]["metadata"]["namespace"] = namespace
    return from_request(request)


def allowed(store: ClusterPolicyStore, namespace: str = "default") -> bool:
    assert store.current is not None
    return store.current.engine.evaluate(review(namespace)).allowed


class Recorder:
    """Records each merge handed to the publisher."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[PolicyObject], Any, bool]] = []

    def publish(self, objects: Any, result: Any, serving: bool) -> None:
        self.calls.append((list(objects), result, serving))


def watch() -> tuple[PolicyObjectWatch, list[int]]:
    """A watch that is never started (its threads would talk to an API server); tests apply
    lists and events to it as its threads do. Returns it and the list its on_change appends to."""
    changes: list[int] = []
    made = PolicyObjectWatch(k8s_client.ApiClient())
    made._on_change = lambda: changes.append(1)  # what start(on_change) sets
    return made, changes


def synced(*objects: PolicyObject) -> PolicyObjectWatch:
    made, _ = watch()
    for kind in ("GPUPolicy", "GPUQuota", "GPUPolicyException"):
        made.replace(kind, [o for o in objects if o.kind == kind])
    return made


def files(tmp_path: Path, *documents: str) -> list[str]:
    directory = tmp_path / "policies"
    directory.mkdir(exist_ok=True)
    write_policies(directory, *documents)
    return [str(directory)]


PASS = gpu_policy("always-pass", {"validations": [{"expression": "true"}]})


# --- the watch: what counts as a change -----------------------------------------------------


def test_a_status_write_or_a_new_resource_version_is_no_change_a_spec_edit_is():
    made, changes = watch()
    made.replace("GPUPolicy", [obj("GPUPolicy", "no-gpus", DENY_GPUS)])
    assert changes == [1]
    made.apply("MODIFIED", obj("GPUPolicy", "no-gpus", DENY_GPUS, resource_version="2",
                               status={"observedGeneration": 1, "conditions": []}))
    assert changes == [1]  # the status subresource's write: nothing served changes
    assert made.objects()[0].resource_version == "2"  # but the writer sees the new status
    made.apply("MODIFIED", obj("GPUPolicy", "no-gpus", {**DENY_GPUS, "failurePolicy": "Ignore"},
                               generation=2, resource_version="3"))
    assert changes == [1, 1]
    made.apply("DELETED", obj("GPUPolicy", "no-gpus", DENY_GPUS))
    assert changes == [1, 1, 1] and made.objects() == []
    made.replace("GPUPolicy", [])  # a relist (410 Gone) with the same content: no change
    assert changes == [1, 1, 1]


def test_not_synced_until_every_resource_is_listed_and_nothing_is_served_before():
    made, _ = watch()
    made.replace("GPUPolicy", [obj("GPUPolicy", "no-gpus", DENY_GPUS)])
    assert not made.synced
    store = ClusterPolicyStore(None, LOADER, made)
    result = store.load()
    assert result.outcome == REJECTED and store.current is None
    assert "gpuquotas.gpuguard.io: listing" in store.last_errors[0]
    assert "gpupolicyexceptions.gpuguard.io: listing" in store.last_errors[0]
    made.replace("GPUQuota", [])
    made.replace("GPUPolicyException", [])
    assert store.check().outcome == LOADED and not allowed(store)


def test_the_object_body_keeps_the_servers_namespace_and_drops_what_is_not_the_document():
    made = obj("GPUPolicyException", "x", {"policies": ["p"], "reason": "r"}, namespace="team-a",
               status={"conditions": [{"type": "Ready"}]})
    assert made.body == {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicyException",
                         "metadata": {"name": "x", "namespace": "team-a"},
                         "spec": {"policies": ["p"], "reason": "r"}}
    assert made.key == "GPUPolicyException/team-a/x"
    assert made.source == "cluster:GPUPolicyException/team-a/x"


# --- merging files and objects ----------------------------------------------------------------


def test_objects_are_served_with_the_files_and_the_identity_covers_both(tmp_path):
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(files(tmp_path, PASS), LOADER, objects)
    assert store.load().outcome == LOADED
    first = store.current
    assert first is not None and set(first.names) == {"always-pass", "no-gpus"}
    assert not allowed(store)
    assert "cluster:GPUPolicy/no-gpus" in first.files
    assert store.check().outcome == UNCHANGED  # the same files and objects: nothing to do
    objects.apply("MODIFIED", obj("GPUPolicy", "no-gpus", {**DENY_GPUS, "validationActions":
                                                           ["Warn"]}, generation=2))
    assert store.check().outcome == LOADED
    second = store.current
    assert second is not None and second.generation == 2 and second.digest != first.digest
    assert allowed(store)  # Warn now
    objects.apply("DELETED", obj("GPUPolicy", "no-gpus", DENY_GPUS))
    assert store.check().outcome == LOADED
    assert store.current is not None and store.current.names == ("always-pass",)


def test_a_broken_update_is_refused_with_its_field_path_and_the_last_good_version_served():
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS),
                     obj("GPUPolicy", "other", {"validations": [{"expression": "true"}]}))
    recorder = Recorder()
    store = ClusterPolicyStore(None, LOADER, objects, publisher=recorder)
    assert store.load().outcome == LOADED
    digest = store.current.digest  # type: ignore[union-attr]
    objects.apply("MODIFIED", obj("GPUPolicy", "no-gpus", BROKEN, generation=2))
    assert store.check().outcome == UNCHANGED  # the same set: generation 1 of no-gpus
    assert store.current is not None and store.current.digest == digest
    assert not allowed(store)  # still enforced
    assert any("cluster:GPUPolicy/no-gpus" in e and "spec.validations[0].expression" in e
               for e in store.last_errors)
    current, result, serving = recorder.calls[-1]
    broken = next(o for o in current if o.name == "no-gpus")
    generation, (accepted, ready) = conditions(broken, result, serving=serving,
                                               now="2026-12-02T03:00:00Z")
    assert generation == 2
    assert accepted["status"] == "False" and accepted["observedGeneration"] == 2
    assert accepted["message"].startswith("spec.validations[0].expression: ")
    assert ready == {"type": "Ready", "status": "True", "reason": "ServingPreviousGeneration",
                     "message": "generation 1 is served; generation 2 was refused (see "
                     "Accepted)", "observedGeneration": 1,
                     "lastTransitionTime": "2026-12-02T03:00:00Z"}
    other = next(o for o in current if o.name == "other")
    assert [c["status"] for c in conditions(other, result, serving=True, now="t")[1]] == \
        ["True", "True"]
    # Fixed: served again at its new generation.
    objects.apply("MODIFIED", obj("GPUPolicy", "no-gpus", {**DENY_GPUS, "failurePolicy":
                                                           "Ignore"}, generation=3))
    assert store.check().outcome == LOADED
    assert not any("no-gpus" in e for e in store.last_errors)


def test_a_broken_new_object_is_refused_alone_and_never_served():
    objects = synced(obj("GPUPolicy", "other", {"validations": [{"expression": "true"}]}),
                     obj("GPUPolicy", "no-gpus", BROKEN))
    store = ClusterPolicyStore(None, LOADER, objects)
    assert store.load().outcome == LOADED
    assert store.current is not None and store.current.names == ("other",)
    result = store.last_merge
    assert result is not None and set(result.refused) == {"GPUPolicy/no-gpus"}
    broken = next(o for o in objects.objects() if o.name == "no-gpus")
    _, (accepted, ready) = conditions(broken, result, serving=True, now="t")
    assert accepted["status"] == "False" and ready["status"] == "False"
    assert ready["reason"] == "NotServed"


def test_an_object_may_not_take_a_name_a_policy_file_uses(tmp_path):
    objects = synced(obj("GPUPolicy", "always-pass", DENY_GPUS))
    store = ClusterPolicyStore(files(tmp_path, PASS), LOADER, objects)
    assert store.load().outcome == LOADED
    assert allowed(store)  # the file's policy, not the object's
    refusal = store.last_merge.refused["GPUPolicy/always-pass"]  # type: ignore[union-attr]
    assert refusal.errors[0][0] == "metadata.name"
    assert refusal.errors[0][1].startswith("GPUPolicy 'always-pass' is defined twice (first in ")


def test_a_policy_exception_exempts_its_own_namespace_only():
    exception = obj("GPUPolicyException", "team-a-validation",
                    {"policies": ["no-gpus"], "reason": "validation pods"}, namespace="team-a")
    store = ClusterPolicyStore(None, LOADER,
                               synced(obj("GPUPolicy", "no-gpus", DENY_GPUS), exception))
    assert store.load().outcome == LOADED
    assert allowed(store, "team-a")
    assert not allowed(store, "team-b")
    assert not allowed(store, "default")


def test_a_policy_exception_naming_another_namespace_is_refused():
    # The CRD prunes unknown fields, so this reaches gpuguard only past a CRD that keeps them;
    # it is refused (lint's schema has no such field), never widened to team-b.
    exception = obj("GPUPolicyException", "reach-out",
                    {"policies": ["no-gpus"], "reason": "r", "namespaces": ["team-b"]},
                    namespace="team-a")
    store = ClusterPolicyStore(None, LOADER,
                               synced(obj("GPUPolicy", "no-gpus", DENY_GPUS), exception))
    assert store.load().outcome == LOADED
    assert not allowed(store, "team-b") and not allowed(store, "team-a")
    refusal = store.last_merge.refused["GPUPolicyException/team-a/reach-out"]  # type: ignore
    assert any("namespaces" in message for _, message in refusal.errors)


def test_a_rejected_file_update_keeps_the_files_served_and_objects_still_apply(tmp_path):
    paths = files(tmp_path, PASS)
    objects = synced()
    store = ClusterPolicyStore(paths, LOADER, objects)
    assert store.load().outcome == LOADED
    (Path(paths[0]) / "policies.yaml").write_text("")  # truncated
    assert store.check().outcome == RETRY  # first sighting: waits to hold still
    result = store.check()
    assert result.outcome == REJECTED and "empty" in result.errors[0]
    objects.apply("ADDED", obj("GPUPolicy", "no-gpus", DENY_GPUS))
    assert store.check().outcome == LOADED
    assert store.current is not None and set(store.current.names) == {"always-pass", "no-gpus"}
    health = Health(store, _Namespaces())
    health.tls_up = True
    ready, detail = health.readiness()
    assert ready
    assert detail["checks"]["policies"]["ok"] and any(
        "empty" in e for e in detail["checks"]["policies"]["rejectedUpdate"])


def test_no_objects_and_no_files_is_an_empty_set_and_refused():
    store = ClusterPolicyStore(None, LOADER, synced())
    result = store.load()
    assert result.outcome == REJECTED and "no policies found" in result.errors[0]


def test_deleting_the_last_policy_keeps_the_last_set_as_an_empty_one_would_allow_everything():
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(None, LOADER, objects)
    assert store.load().outcome == LOADED
    objects.apply("DELETED", obj("GPUPolicy", "no-gpus", DENY_GPUS))
    assert store.check().outcome == REJECTED
    assert not allowed(store)


def test_merge_replaces_a_refused_version_only_with_the_same_object():
    good = obj("GPUPolicy", "no-gpus", DENY_GPUS, uid="first")
    recreated = obj("GPUPolicy", "no-gpus", BROKEN, uid="second")
    result = merge(Snapshot((), ()), [recreated], {good.key: good}, LOADER)
    assert result.served == {}  # deleted and created again: the old one is not its version
    updated = obj("GPUPolicy", "no-gpus", BROKEN, uid="first", generation=2)
    result = merge(Snapshot((), ()), [updated], {good.key: good}, LOADER)
    assert result.served == {good.key: good}


# --- status conditions and their writer --------------------------------------------------------


class _Namespaces:
    def status(self) -> tuple[bool, str]:
        return True, "none"

    def get(self, name: str) -> Any:
        return {}


def test_conditions_keep_their_transition_time_while_the_verdict_stays():
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(None, LOADER, objects)
    store.load()
    policy = objects.objects()[0]
    generation, first = conditions(policy, store.last_merge, serving=True,  # type: ignore
                                   now="2026-12-02T03:00:00Z")
    written = obj("GPUPolicy", "no-gpus", DENY_GPUS,
                  status={"observedGeneration": generation, "conditions": first})
    again = conditions(written, store.last_merge, serving=True,  # type: ignore[arg-type]
                       now="2026-12-02T04:00:00Z")[1]
    assert again == first
    assert not status_differs(written, generation, again)


def test_the_publisher_writes_each_change_once_and_nothing_when_not_leading():
    writes: list[tuple[str, dict[str, Any]]] = []
    leading = [True]
    publisher = StatusPublisher(None, lambda: leading[0], clock=lambda: NOW,
                                patch=lambda o, body: writes.append((o.key, body)))
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS),
                     obj("GPUPolicy", "broken", BROKEN))
    store = ClusterPolicyStore(None, LOADER, objects, publisher=publisher)
    store.load()
    assert sorted(key for key, _ in writes) == ["GPUPolicy/broken", "GPUPolicy/no-gpus"]
    broken = dict(writes)["GPUPolicy/broken"]["status"]
    assert broken["observedGeneration"] == 1
    assert broken["conditions"][0]["status"] == "False"
    assert "spec.validations[0].expression" in broken["conditions"][0]["message"]
    store.check()  # the watch has not delivered the writes yet: not written again
    assert len(writes) == 2
    for key, body in list(writes):  # the watch delivers them (new resourceVersion)
        name = key.split("/")[1]
        objects.apply("MODIFIED", obj("GPUPolicy", name, BROKEN if name == "broken"
                                      else DENY_GPUS, resource_version="2",
                                      status=body["status"]))
    store.check()
    assert len(writes) == 2 and publisher.writes == 2
    leading[0] = False
    objects.apply("MODIFIED", obj("GPUPolicy", "broken", DENY_GPUS, generation=2,
                                  resource_version="3"))
    store.check()
    assert len(writes) == 2  # a follower writes nothing
    leading[0] = True
    store.check()  # leading again: the fix is reported
    assert writes[-1][0] == "GPUPolicy/broken"
    assert writes[-1][1]["status"]["conditions"][0]["status"] == "True"


def test_ready_is_left_as_it_was_while_the_merged_set_is_not_served():
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(None, LOADER, objects)
    store.load()
    held = {"type": "Ready", "status": "True", "reason": "Served", "message": "m",
            "observedGeneration": 1, "lastTransitionTime": "x"}
    policy = obj("GPUPolicy", "no-gpus", DENY_GPUS, status={"conditions": [held]})
    ready = conditions(policy, store.last_merge, serving=False, now="t")[1][1]  # type: ignore
    assert ready == held


def test_a_rejected_input_is_not_rebuilt_at_every_check(tmp_path):
    calls: list[int] = []

    def counting(snapshot: Snapshot) -> Any:
        calls.append(1)
        return LOADER(snapshot)

    paths = files(tmp_path, "")  # an empty file: the files are refused
    store = ClusterPolicyStore(paths, counting, synced(obj("GPUPolicy", "no-gpus", DENY_GPUS)))
    assert store.load().outcome == REJECTED and store.current is None
    built = len(calls)
    assert store.check().outcome == UNCHANGED and store.check().outcome == UNCHANGED
    assert len(calls) == built and any("empty" in e for e in store.last_errors)
    (Path(paths[0]) / "policies.yaml").write_text(PASS)  # fixed: loaded at once (nothing served)
    assert store.check().outcome == LOADED and not allowed(store)


def test_a_failing_status_writer_never_stops_serving():
    class Failing:
        def publish(self, objects: Any, result: Any, serving: bool) -> None:
            raise RuntimeError("API server gone")

    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(None, LOADER, objects, publisher=Failing())
    assert store.load().outcome == LOADED and not allowed(store)
    objects.apply("MODIFIED", obj("GPUPolicy", "no-gpus", {**DENY_GPUS, "validationActions":
                                                           ["Warn"]}, generation=2))
    assert store.check().outcome == LOADED and allowed(store)


def test_serve_cluster_policies_without_a_cluster_exits_2_with_one_line(tmp_path):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    environment["HOME"] = str(tmp_path)  # no ~/.kube/config
    result = subprocess.run([sys.executable, "-m", "gpuguard", "serve", "--dev",
                             "--cluster-policies"], cwd=ROOT, env=environment,
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "gpuguard serve: error: --cluster-policies: no cluster configured (no kubeconfig, not "
        "in a pod): give --kubeconfig FILE")


def test_readyz_names_a_failing_watch_while_the_last_listed_objects_serve():
    objects = synced(obj("GPUPolicy", "no-gpus", DENY_GPUS))
    store = ClusterPolicyStore(None, LOADER, objects)
    assert store.load().outcome == LOADED
    assert store.describe() == "no files and the cluster's gpuguard.io objects (1 gpuguard.io " \
        "objects, watching)"
    objects.failed("GPUPolicy", "API error 503 Service Unavailable")
    assert objects.status() == (True, "1 gpuguard.io objects; watch failing, retrying: "
                                "gpupolicies.gpuguard.io: API error 503 Service Unavailable")
    health = Health(store, _Namespaces())
    health.tls_up = True
    ready, detail = health.readiness()
    assert ready and "watch failing" in detail["checks"]["policies"]["detail"]
    assert not allowed(store)
    objects.replace("GPUPolicy", objects.objects())  # the relist after the retry
    assert objects.status() == (True, "1 gpuguard.io objects, watching")
