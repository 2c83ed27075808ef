"""Hot reload never fails open (issue 13, item 1): an emptied, truncated or half-written policy
file is refused or waited out, never served, and the served set's identity is visible in
``/readyz``, the metrics and each decision log line.

Every reload here is driven by calling :meth:`PolicyStore.check` with a clock the test moves by
hand: no sleeps, no background task, no dependence on timing.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from gpuguard import policy_set
from policies.facts.resource_names import GPUSettings
from policies.facts.review import from_object, from_request
from policies.policy.loader import read_policy_files
from tests.builders.environment import ADMISSION_NOW
from tests.fakes.webhook_harness import JSON, Harness, bug_review
from tests.paths import ROOT, TESTS
from webhook.policy_store import LOADED, REJECTED, RETRY, UNCHANGED, PolicyStore

LOADER = functools.partial(policy_set.load, settings=GPUSettings())

DENY = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: {name}
spec:
  validationActions: [Deny]
  validations:
  - expression: gpu.count <= 0
    message: {name} allows no GPU
"""
PASS = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: {name}
spec:
  validations:
  - expression: "true"
"""


class Clock:
    """A monotonic clock that moves only when the test says (``now`` in seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample_review() -> dict:
    """The issue's sample: a pod asking for a GPU (HAMi-160), denied by a ``DENY`` policy."""
    return bug_review("Project-HAMi-HAMi-160.yaml", "gpu_pod")


def allowed(store: PolicyStore) -> bool:
    """The served set's answer to the sample review."""
    assert store.current is not None
    review = from_request(sample_review()["request"])
    return store.current.engine.evaluate(review).allowed


def policies(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.yaml").write_text(text)
    return directory


def started(directory: Path, quiet_s: float = 0.0) -> tuple[PolicyStore, Clock]:
    clock = Clock()
    store = PolicyStore([str(directory)], LOADER, clock=clock, quiet_s=quiet_s)
    assert store.load().outcome == LOADED
    return store, clock


def settle(store: PolicyStore, clock: Clock, step: float = 5.0) -> object:
    """Two checks one step apart: the first sees the change, the second confirms it."""
    assert store.check().outcome == RETRY
    clock.now += step
    return store.check()


@pytest.mark.parametrize("emptied", ["", "# limits: moved to the team repo\n", "---\n"],
                         ids=["zero-bytes", "comment-only", "separator-only"])
def test_an_emptied_file_is_refused_and_the_sample_stays_denied(tmp_path, emptied):
    """Before: the update was accepted, ``limits`` silently left the set and the sample review
    flipped from denied to allowed, with nothing in /readyz or the log."""
    directory = policies(tmp_path, limits=DENY.format(name="limits"),
                         other=PASS.format(name="other"))
    store, clock = started(directory)
    assert not allowed(store)
    (directory / "limits.yaml").write_text(emptied)
    result = settle(store, clock)
    assert result.outcome == REJECTED
    limits = directory / "limits.yaml"
    assert result.errors[0].startswith(f"{limits}: no policy document: the file ")
    assert result.errors[1].startswith(f"{limits}: no longer holds GPUPolicy/limits (loaded "
                                       "from it in generation 1)")
    assert store.current.generation == 1 and store.current.names == ("limits", "other")
    assert not allowed(store)
    assert store.last_errors == result.errors  # what /readyz shows as rejectedUpdate
    assert store.check().outcome == UNCHANGED  # the same broken content: said once


def test_an_emptied_file_at_start_means_no_set_is_served(tmp_path):
    """``gpuguard serve`` loads through the same loader: not ready, nothing served."""
    directory = policies(tmp_path, limits="", other=PASS.format(name="other"))
    store = PolicyStore([str(directory)], LOADER, clock=Clock())
    result = store.load()
    assert result.outcome == REJECTED and store.current is None
    assert "limits.yaml: no policy document: the file is empty (0 bytes)" in result.errors[0]


def test_a_file_truncated_after_a_whole_document_is_refused(tmp_path):
    """The cut lands between documents: what is left is valid YAML and a valid, smaller set."""
    whole = DENY.format(name="first") + "---\n" + DENY.format(name="second")
    directory = policies(tmp_path, limits=whole)
    store, clock = started(directory)
    limits = directory / "limits.yaml"
    limits.write_text(whole[:whole.index("---")])
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert result.errors == (
        f"{limits}: no longer holds GPUPolicy/second (loaded from it in generation 1); a file "
        "that loses a policy is refused, as a truncated or half-written file looks the same: "
        "to remove a policy delete or rename its file, or restart gpuguard",)
    assert store.current.names == ("first", "second")


# Where a truncation can land inside a document, and what catches each cut.
CUTS = {
    "before-metadata": ("kind: GPUPolicy\n", "document 0: 'metadata' is required"),
    "before-spec": ("  name: max\n", "document 0: 'spec' is required"),
    "empty-spec": ("spec:\n", "spec: expected a map, got null"),
    "before-validations": ("validationActions: [Deny]\n",
                           "spec: validations, mutations or auditAnnotations must contain at "
                           "least one item: GPUPolicy 'max' would have no effect"),
    "empty-validations": ("  validations:\n", "spec.validations: expected a list, got null"),
    "inside-the-expression": ("gpu.count <", "spec.validations[0].expression: CEL error"),
    "inside-a-field-name": ("gpu.cou", "gpu.cou is not a GPU fact (did you mean gpu.count?)"),
}


@pytest.mark.parametrize("cut", CUTS)
def test_a_document_cut_short_is_refused(tmp_path, cut):
    """A truncation inside a document that is still valid YAML: the schema, the CEL compiler
    or the reference check refuses what is left, so the set being served stays."""
    text = DENY.format(name="max")
    directory = policies(tmp_path, limits=text)
    store, clock = started(directory)
    end, message = CUTS[cut]
    (directory / "limits.yaml").write_text(text[:text.index(end) + len(end)])
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert any(message in error for error in result.errors), result.errors
    assert store.current.generation == 1 and not allowed(store)


@pytest.mark.parametrize("end", ["  - expression: gpu.count", "    message: max allows"])
def test_a_cut_that_still_loads_stays_closed(tmp_path, end):
    """Cuts a loader cannot tell from an edit: ``gpu.count`` alone compiles (the facts are
    dynamically typed) but is not a boolean, so evaluating it is an error and the policy's
    failurePolicy (Fail) denies; a shorter message changes only the words. Either way the
    sample stays denied. (The quiet period keeps such a prefix out while the write is under
    way: test_a_half_written_file_is_never_served.)"""
    text = DENY.format(name="max")
    directory = policies(tmp_path, limits=text)
    store, clock = started(directory)
    (directory / "limits.yaml").write_text(text[:text.index(end) + len(end)])
    assert settle(store, clock).outcome == LOADED
    assert not allowed(store)


def test_a_half_written_file_is_never_served(tmp_path):
    """A writer that rewrites in place: one check sees the file half-written (here a prefix that
    would load cleanly, with one validation of two), the next sees it complete. The prefix is
    never served; the complete file is, once it holds still. Before: the prefix was served."""
    directory = policies(tmp_path, limits=DENY.format(name="limits"))
    store, clock = started(directory)
    complete = DENY.format(name="limits") + "  - expression: gpu.count <= 8\n" \
        "    message: at most 8\n"
    limits = directory / "limits.yaml"
    limits.write_text(complete[:len(DENY.format(name="limits"))])  # the old bytes: unchanged
    assert store.check().outcome == UNCHANGED
    limits.write_text(complete[:complete.index("    message: at most 8")])  # under way
    assert store.check().outcome == RETRY
    clock.now += 5
    limits.write_text(complete)  # done
    assert store.check().outcome == RETRY  # changed since the last check: wait
    assert store.current.generation == 1
    clock.now += 5
    result = store.check()
    assert result.outcome == LOADED and result.snapshot.generation == 2
    validations = store.current.engine.policies.policies[0].validations
    assert [r.path for r in validations] == ["spec.validations[0].expression",
                                             "spec.validations[1].expression"]
    assert [r.message for r in validations] == ["limits allows no GPU", "at most 8"]


def test_the_quiet_period_is_measured_on_the_injected_clock(tmp_path):
    directory = policies(tmp_path, limits=DENY.format(name="limits"))
    store, clock = started(directory, quiet_s=10.0)
    (directory / "limits.yaml").write_text(DENY.format(name="limits").replace("<= 0", "<= 1"))
    assert store.check().outcome == RETRY and store.pending
    clock.now = 9.9
    assert store.check().outcome == RETRY  # the same bytes, but not for 10 s yet
    (directory / "limits.yaml").write_text(DENY.format(name="limits").replace("<= 0", "<= 2"))
    clock.now = 12.0
    assert store.check().outcome == RETRY  # changed again: the period starts over at 12
    clock.now = 21.9
    assert store.check().outcome == RETRY
    clock.now = 22.0
    assert store.check().outcome == LOADED and not store.pending
    assert "gpu.count <= 2" in (directory / "limits.yaml").read_text()
    assert store.current.engine.policies.policies[0].validations[0].expression.expression == \
        "gpu.count <= 2"


def test_a_write_reverted_before_it_settles_leaves_nothing_pending(tmp_path):
    directory = policies(tmp_path, limits=DENY.format(name="limits"))
    store, _ = started(directory)
    original = (directory / "limits.yaml").read_text()
    (directory / "limits.yaml").write_text("")
    assert store.check().outcome == RETRY and store.pending
    (directory / "limits.yaml").write_text(original)
    assert store.check().outcome == UNCHANGED and not store.pending
    assert store.last_errors == () and store.current.generation == 1


def test_removing_a_file_removes_its_policies(tmp_path):
    directory = policies(tmp_path, limits=DENY.format(name="limits"),
                         other=PASS.format(name="other"))
    store, clock = started(directory)
    (directory / "limits.yaml").unlink()
    assert settle(store, clock).outcome == LOADED
    assert store.current.names == ("other",) and allowed(store)


def test_moving_a_policy_or_renaming_its_file_is_accepted(tmp_path):
    directory = policies(tmp_path, limits=DENY.format(name="limits") + "---\n"
                         + PASS.format(name="other"))
    store, clock = started(directory)
    # "other" moves to its own file; "limits" stays: nothing is lost.
    (directory / "limits.yaml").write_text(DENY.format(name="limits"))
    (directory / "other.yaml").write_text(PASS.format(name="other"))
    assert settle(store, clock).outcome == LOADED
    assert store.current.names == ("limits", "other")
    # a rename is a removal plus a new file
    (directory / "limits.yaml").rename(directory / "gpu-limits.yaml")
    assert settle(store, clock).outcome == LOADED
    assert set(store.current.names) == {"limits", "other"}


def test_deleting_one_policy_of_a_file_is_refused_until_a_restart(tmp_path):
    """A deliberate deletion and a truncation look the same: the message says how to remove a
    policy, and a fresh start (no previous set) accepts the smaller file."""
    directory = policies(tmp_path, limits=DENY.format(name="limits") + "---\n"
                         + PASS.format(name="other"))
    store, clock = started(directory)
    (directory / "limits.yaml").write_text(PASS.format(name="other"))
    result = settle(store, clock)
    assert result.outcome == REJECTED and "no longer holds GPUPolicy/limits" in result.errors[0]
    assert "delete or rename its file, or restart gpuguard" in result.errors[0]
    restarted, _ = started(directory)
    assert restarted.current.names == ("other",)


NATIVE = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: gpu-limit}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  validations:
  - expression: "object.spec.containers.all(c, !has(c.resources.limits))"
"""
BINDINGS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: gpu-limit-deny}
spec: {policyName: gpu-limit, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: gpu-limit-audit}
spec: {policyName: gpu-limit, validationActions: [Audit]}
"""


def test_a_bindings_file_that_loses_a_binding_is_refused(tmp_path):
    """A native policy's enforcement lives in its Binding, often in another file: losing the
    Deny binding turns the policy into audit-only. The file that lost it is named."""
    directory = policies(tmp_path, policy=NATIVE, bindings=BINDINGS)
    store, clock = started(directory)
    assert store.current.names == ("gpu-limit/gpu-limit-deny", "gpu-limit/gpu-limit-audit")
    bindings = directory / "bindings.yaml"
    bindings.write_text(BINDINGS.split("---\n")[1])
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert result.errors[0].startswith(
        f"{bindings}: no longer holds ValidatingAdmissionPolicyBinding/gpu-limit-deny")


def test_the_set_is_built_from_the_bytes_that_were_fingerprinted(tmp_path):
    """A write that lands while the set is being built does not reach it: the loader gets the
    bytes the check read (and fingerprinted), not the files again."""
    directory = policies(tmp_path, limits=DENY.format(name="limits"))
    limits = directory / "limits.yaml"
    writes = iter([PASS.format(name="limits")])

    def loader_with_a_concurrent_write(snapshot):
        text = next(writes, None)
        if text is not None:
            limits.write_text(text)  # the writer, between the read and the build
        return LOADER(snapshot)

    clock = Clock()
    store = PolicyStore([str(directory)], loader_with_a_concurrent_write, clock=clock)
    before = read_policy_files([str(directory)]).digest
    assert store.load().outcome == LOADED
    assert store.current.digest == before and not allowed(store)  # the bytes read: DENY
    assert store.check().outcome == RETRY  # the write is noticed as a change
    clock.now += 5
    assert store.check().outcome == LOADED and allowed(store)


# --- the served set's identity -------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_served_set_is_named_in_readyz_metrics_and_each_decision_log_line(
        aiohttp_client, tmp_path, caplog):
    from webhook.metrics import Metrics

    directory = policies(tmp_path, limits=DENY.format(name="limits"),
                         other=PASS.format(name="other"))
    digest = read_policy_files([str(directory)]).digest
    harness = Harness([directory])
    client = await aiohttp_client(harness.app)
    response = await client.get("/readyz")
    check = (await response.json())["checks"]["policies"]
    assert {k: check[k] for k in ("generation", "hash", "policies")} == {
        "generation": 1, "hash": digest, "policies": 2}
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    response = await client.post("/validate", data=json.dumps(sample_review()), headers=JSON)
    assert (await response.json())["response"]["allowed"] is False
    record = next(r for r in caplog.records if r.msg == "admission")
    assert record.fields["policySet"] == {"generation": 1, "hash": digest, "policies": 2}
    metrics = Metrics()
    metrics.policy_set_served(harness.store.current.identity)
    value = metrics.registry.get_sample_value
    assert value("gpuguard_policy_set_generation") == 1.0
    assert value("gpuguard_policy_set_hash") == float(int(digest[7:19], 16))
    assert value("gpuguard_policies_loaded") == 2.0
    harness.close()


# --- --skip-broken ---------------------------------------------------------------------------

BROKEN = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: broken
spec:
  validations:
  - expression: "gpu.count <="
"""


def test_a_broken_policy_refuses_the_whole_set_by_default(tmp_path):
    directory = policies(tmp_path, limits=DENY.format(name="limits"), broken=BROKEN)
    store = PolicyStore([str(directory)], LOADER)
    result = store.load()
    assert result.outcome == REJECTED and store.current is None
    assert any("broken.yaml" in e and "spec.validations[0].expression" in e
               for e in result.errors)


@pytest.mark.asyncio
async def test_skip_broken_serves_the_rest_and_names_the_skipped_policy(
        aiohttp_client, tmp_path, caplog):
    directory = policies(tmp_path, limits=DENY.format(name="limits"), broken=BROKEN)
    harness = Harness([directory], skip_broken=True)
    assert harness.store.current is not None
    assert harness.store.current.names == ("limits",)
    skipped = [f"{directory / 'broken.yaml'}: document 0"]
    client = await aiohttp_client(harness.app)
    check = (await (await client.get("/readyz")).json())["checks"]["policies"]
    assert check["ok"] is True and check["skipped"] == skipped
    caplog.set_level("INFO", logger="gpuguard.webhook.admission")
    response = await client.post("/validate", data=json.dumps(sample_review()), headers=JSON)
    assert (await response.json())["response"]["allowed"] is False  # limits still enforced
    record = next(r for r in caplog.records if r.msg == "admission")
    assert record.fields["policySet"]["skipped"] == skipped
    assert any(w.startswith("skipped (--skip-broken): ") and "broken.yaml" in w
               for w in harness.store.current.warnings)
    harness.close()


def test_skip_broken_never_skips_a_file_level_error(tmp_path):
    """An empty file is not a policy that failed to load: it still refuses the set."""
    directory = policies(tmp_path, limits=DENY.format(name="limits"), empty="")
    loaded = policy_set.load([str(directory)], GPUSettings(), skip_broken=True)
    assert [e.path for e in loaded.errors] == [""] and loaded.engine.policies.skipped == ()


@pytest.mark.parametrize(("argv", "skip"), [([], False), (["--skip-broken"], True)])
def test_serve_skip_broken_reaches_the_config(argv, skip):
    from gpuguard import cli
    from gpuguard.serve_run import build_config

    parser, _ = cli.build_parser("serve")
    args = parser.parse_args(["serve", "--cert", "c.pem", "--key", "k.pem", *argv])
    config = build_config(args, GPUSettings(), cert_file="c.pem", key_file="k.pem")
    assert config.skip_broken is skip


PRIVILEGED_GPU_POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True},
                             "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def test_a_reload_to_a_policy_without_rules_is_refused_and_the_last_good_set_stays(tmp_path):
    """The trial's empty-validations.yaml (no-privileged-gpu with ``validations: []``): the
    reload took it and the privileged GPU pod went from denied to allowed. Now the reload is
    refused naming the file and the policy, and the last good set keeps denying."""
    library = ROOT / "policies" / "library" / "no-privileged-gpu.yaml"
    directory = policies(tmp_path, **{"no-privileged-gpu": library.read_text()})
    store, clock = started(directory)

    def denied() -> bool:
        assert store.current is not None
        review = from_object(PRIVILEGED_GPU_POD, now=ADMISSION_NOW)
        return not store.current.engine.evaluate(review).allowed

    assert denied()
    path = directory / "no-privileged-gpu.yaml"
    path.write_text((TESTS / "data" / "loader" / "empty-validations.yaml").read_text())
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert result.errors == (
        f"{path}:28: document 0: spec: validations, mutations or auditAnnotations must contain "
        "at least one item: GPUPolicy 'no-privileged-gpu' would have no effect",)
    assert store.current.generation == 1 and store.current.names == ("no-privileged-gpu",)
    assert denied()
    assert store.last_errors == result.errors


def test_serve_starting_on_a_policy_without_rules_serves_nothing(tmp_path):
    directory = policies(tmp_path, **{"no-privileged-gpu": (
        TESTS / "data" / "loader" / "empty-validations.yaml").read_text()})
    store = PolicyStore([str(directory)], LOADER, clock=Clock())
    result = store.load()
    assert result.outcome == REJECTED and store.current is None
    assert "GPUPolicy 'no-privileged-gpu' would have no effect" in result.errors[0]


def test_a_duplicate_key_in_a_reloaded_file_is_said_alone(tmp_path):
    """A trial's find: the duplicate-key error came with "no longer holds GPUPolicy/limits",
    although the file still holds it (only its reading is refused)."""
    directory = policies(tmp_path, limits=DENY.format(name="limits"),
                         other=PASS.format(name="other"))
    store, clock = started(directory)
    limits = directory / "limits.yaml"
    limits.write_text(DENY.format(name="limits") + "  validationActions: [Audit]\n")
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert len(result.errors) == 1, result.errors
    assert result.errors[0] == (f"{limits}:10: document 0: duplicate key 'validationActions' "
                                "(first at line 6)")
    assert not allowed(store)
    # A file that is not YAML even with the last key winning may really have lost it: said too.
    limits.write_text(DENY.format(name="limits") + "  validationActions: [Audit]\n  x: [\n")
    result = settle(store, clock)
    assert result.outcome == REJECTED
    assert any("no longer holds GPUPolicy/limits" in e for e in result.errors), result.errors
