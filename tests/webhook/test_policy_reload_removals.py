"""A reload that removes content from a policy waits longer (issue 13, item 1; a trial's find).

Before: a file truncated at a line break after the first of two validations — still valid YAML,
still a valid policy — was served at the next check, and a writer that stalled for more than one
check interval had its half-written file served: 2,178 and 5,436 wrong ``allowed: true`` answers
in the trial. Such a file always reads as a loss of content (a validation, a field, the end of
an expression), and an edit that only adds or changes content never does, so losses are held for
``removal_quiet_s`` and named in the log, the metrics and ``/readyz`` meanwhile.

Reloads are driven by calling :meth:`PolicyStore.check` with a clock the test moves by hand.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from policies.facts.resource_names import GPUSettings
from policies.facts.review import from_request
from policies.policy.loader import read_policy_files
from policies.policy.revisions import lost_content, lost_paths
from tests.fakes.fake_timer import ManualTimer
from tests.fakes.webhook_harness import bug_review
from webhook.cluster_store import ClusterPolicyStore
from webhook.health import Health
from webhook.policy_store import HELD, LOADED, REJECTED, RETRY, UNCHANGED, PolicyStore
from webhook.server import Server
from webhook.settings import ServerSettings

LOADER = functools.partial(policy_set.load, settings=GPUSettings())
REMOVAL_QUIET_S = 60.0

# The trial's policy: the second validation is the one that denies the sample review.
TWO = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: two
spec:
  validationActions: [Deny]
  validations:
  - expression: gpu.count <= 8
    message: at most 8 GPUs
  - expression: gpu.count <= 0
    message: no GPU here
"""
FIRST_VALIDATION_ONLY = TWO[:TWO.index("  - expression: gpu.count <= 0")]
BLOCK = """\
apiVersion: gpuguard.io/v1alpha1
kind: GPUPolicy
metadata:
  name: block
spec:
  validations:
  - expression: |
      gpu.count <= 8
      && gpu.count <= 0
    message: no GPU here
"""


class Clock:
    """A monotonic clock that moves only when the test says (``now`` in seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def allowed(store: PolicyStore) -> bool:
    """The served set's answer to a pod asking for a GPU (HAMi-160's)."""
    assert store.current is not None
    review = from_request(bug_review("Project-HAMi-HAMi-160.yaml", "gpu_pod")["request"])
    return store.current.engine.evaluate(review).allowed


def started(tmp_path: Path, text: str = TWO) -> tuple[PolicyStore, Clock, Path]:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "two.yaml").write_text(text)
    clock = Clock()
    store = PolicyStore([str(directory)], LOADER, clock=clock,
                        removal_quiet_s=REMOVAL_QUIET_S)
    assert store.load().outcome == LOADED
    return store, clock, directory / "two.yaml"


def test_a_file_cut_after_a_whole_validation_is_held_then_served(tmp_path):
    store, clock, path = started(tmp_path)
    assert not allowed(store)
    path.write_text(FIRST_VALIDATION_ONLY)
    assert store.check().outcome == RETRY
    clock.now = 5.0
    held = store.check()
    assert held.outcome == HELD and held.first and held.held_s == 55.0
    assert held.errors == (f"{path}: GPUPolicy/two loses spec.validations[1]",)
    assert store.held == held.errors and store.pending
    assert store.current.generation == 1 and not allowed(store)  # the whole file still serves
    clock.now = 59.9
    again = store.check()
    assert again.outcome == HELD and not again.first  # said once
    clock.now = 60.0
    assert store.check().outcome == LOADED  # held still for 60 s: a deliberate removal
    assert store.current.generation == 2 and allowed(store) and store.held == ()


# A cut that loses the second validation and leaves the first one's expression broken.
BROKEN_AND_SHORTER = FIRST_VALIDATION_ONLY.replace("gpu.count <= 8", "gpu.count <=")


def test_a_change_that_is_broken_as_well_as_shorter_is_refused_at_once_not_held(tmp_path):
    """Refusal comes before a hold: the error is said when the files hold still, not a minute
    later, and ``/readyz`` never shows a broken change as a pending removal."""
    store, clock, path = started(tmp_path)
    path.write_text(BROKEN_AND_SHORTER)
    assert store.check().outcome == RETRY
    clock.now = 5.0
    result = store.check()
    assert result.outcome == REJECTED and store.held == () and not store.pending
    assert len(result.errors) == 1 and f"{path}:8:" in result.errors[0] \
        and "spec.validations[0].expression" in result.errors[0], result.errors
    assert store.current.generation == 1 and not allowed(store)  # the last good set serves
    clock.now = 70.0
    assert store.check().outcome == UNCHANGED and store.current.generation == 1


def test_a_file_that_loses_a_whole_document_is_refused_at_once_not_held(tmp_path):
    second = TWO.replace("name: two", "name: three")
    store, clock, path = started(tmp_path, TWO + "---\n" + second)
    path.write_text(TWO + "---\n" + second[:second.index("spec:")])  # cut inside document 2
    store.check()
    clock.now = 5.0
    result = store.check()
    assert result.outcome == REJECTED and store.held == ()
    assert store.current.generation == 1 and store.current.names == ("two", "three")


def test_a_stalled_writer_never_has_its_half_written_file_served(tmp_path):
    """The trial's slow writer: truncate, write the first 14 lines, stall for 9 s, write the
    rest. The stall spans two checks, which was enough to serve the prefix."""
    store, clock, path = started(tmp_path)
    path.write_text(FIRST_VALIDATION_ONLY)
    for now in (0.0, 5.0, 10.0):
        clock.now = now
        assert store.check().outcome in (RETRY, HELD)
    assert store.current.generation == 1 and not allowed(store)
    path.write_text(TWO)  # the writer finishes: the same bytes as served
    clock.now = 15.0
    assert store.check().outcome == UNCHANGED and not store.pending and store.held == ()


def test_a_block_scalar_expression_cut_at_a_line_break_is_a_loss(tmp_path):
    store, clock, path = started(tmp_path, BLOCK)
    # The expression's second line lost: what is left still compiles.
    path.write_text(BLOCK.replace("      && gpu.count <= 0\n", ""))
    assert store.check().outcome == RETRY
    clock.now = 5.0
    result = store.check()
    assert result.outcome == HELD
    assert result.errors == (
        f"{path}: GPUPolicy/block loses spec.validations[0].expression (shortened)",)


@pytest.mark.parametrize("edit", [
    TWO.replace("<= 8", "<= 4"),  # a value changed
    TWO + "  - expression: gpu.count <= 2\n    message: two\n",  # a validation added
    TWO.replace("message: no GPU here", "message: no GPU in this namespace"),  # longer text
], ids=["changed", "added", "longer-message"])
def test_edits_that_add_or_change_content_load_after_the_ordinary_quiet_period(tmp_path, edit):
    store, clock, path = started(tmp_path)
    path.write_text(edit)
    assert store.check().outcome == RETRY
    clock.now = 5.0
    assert store.check().outcome == LOADED and store.held == ()


def test_a_loss_reverted_while_held_leaves_nothing_pending_and_a_new_loss_is_said_again(
        tmp_path):
    store, clock, path = started(tmp_path)
    path.write_text(FIRST_VALIDATION_ONLY)
    store.check()
    clock.now = 5.0
    assert store.check().first
    path.write_text(TWO)
    assert store.check().outcome == UNCHANGED and store.held == () and not store.pending
    path.write_text(FIRST_VALIDATION_ONLY)  # the same loss once more: a new hold, a new word
    clock.now = 10.0
    assert store.check().outcome == RETRY
    clock.now = 15.0
    result = store.check()
    assert result.outcome == HELD and result.first and result.held_s == 55.0


def test_removal_quiet_s_zero_serves_a_loss_like_any_change(tmp_path):
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "two.yaml").write_text(TWO)
    clock = Clock()
    store = PolicyStore([str(directory)], LOADER, clock=clock, removal_quiet_s=0.0)
    store.load()
    (directory / "two.yaml").write_text(FIRST_VALIDATION_ONLY)
    store.check()
    clock.now = 5.0
    assert store.check().outcome == LOADED


def test_readyz_names_what_a_held_update_removes(tmp_path):
    store, clock, path = started(tmp_path)
    path.write_text(FIRST_VALIDATION_ONLY)
    store.check()
    clock.now = 5.0
    store.check()
    health = Health(store, StaticNamespaces({}, "test"))
    health.tls_up = True
    ready, detail = health.readiness()
    assert ready
    policies = detail["checks"]["policies"]
    assert policies["pendingUpdate"] == (
        "the policy files changed and remove content from policies; served once they read the "
        f"same for 60 s: {path}: GPUPolicy/two loses spec.validations[1]")
    assert policies["generation"] == 1


@pytest.mark.asyncio
async def test_the_server_logs_a_held_update_once_and_counts_it(tmp_path, caplog):
    store, clock, path = started(tmp_path)
    server = Server(ServerSettings(host="127.0.0.1", port=0), store,
                    StaticNamespaces({}, "test"), None, timer=ManualTimer())
    caplog.set_level("INFO", logger="gpuguard.webhook.server")
    path.write_text(FIRST_VALIDATION_ONLY)
    await server.load_policies()
    for now in (5.0, 10.0):
        clock.now = now
        assert (await server.load_policies()).outcome == HELD
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].msg.startswith("policy update removes content from policies; serving it "
                                      "once the files read the same for 60 s")
    assert warnings[0].fields["removes"] == [f"{path}: GPUPolicy/two loses spec.validations[1]"]
    assert warnings[0].fields["loads_in_s"] == 55.0
    assert 'gpuguard_policy_reloads_total{outcome="held"} 1.0' in \
        server.metrics.exposition().decode()
    for executor in (server.executor, server.quota_executor, server.decode_executor):
        if executor is not None:
            executor.shutdown()


class _Synced:
    """No cluster objects, listed (the watch's interface as ClusterPolicyStore reads it)."""

    synced = True

    def objects(self) -> list:
        return []

    def status(self) -> tuple[bool, str]:
        return True, "synced"


def cluster_store_rewritten(tmp_path: Path, text: str) -> tuple[ClusterPolicyStore, Clock]:
    """A cluster store serving TWO from its files, then ``text`` written over the file and
    seen once (RETRY: not quiet yet)."""
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "two.yaml").write_text(TWO)
    clock = Clock()
    store = ClusterPolicyStore([str(directory)], LOADER, _Synced(), clock=clock,
                               removal_quiet_s=REMOVAL_QUIET_S)
    assert store.load().outcome == LOADED
    (directory / "two.yaml").write_text(text)
    assert store.check().outcome == RETRY
    return store, clock


def test_the_cluster_store_holds_a_loss_in_its_files_too(tmp_path):
    store, clock = cluster_store_rewritten(tmp_path, FIRST_VALIDATION_ONLY)
    clock.now = 5.0
    assert store.check().outcome == HELD and not allowed(store)
    clock.now = 60.0
    assert store.check().outcome == LOADED and allowed(store)


def test_the_cluster_store_refuses_a_broken_shorter_file_at_once(tmp_path):
    store, clock = cluster_store_rewritten(tmp_path, BROKEN_AND_SHORTER)
    clock.now = 5.0
    assert store.check().outcome == REJECTED and store.held == () and not allowed(store)
    assert store.current.generation == 1


# --- the comparison itself ---------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "lost"), [
    ({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2}}, ["b.d"]),
    ({"l": [1, 2, 3]}, {"l": [1]}, ["l[1]", "l[2]"]),
    ({"s": "abc def"}, {"s": "abc"}, ["s (shortened)"]),
    ({"s": "abc"}, {"s": "abd"}, []),  # changed, not shortened
    ({"x": {"y": 1}}, {"x": [1]}, []),  # a type change is an edit
    ({"a": 1}, {"a": 1, "b": 2}, []),  # added
], ids=["key", "list-tail", "string-prefix", "string-changed", "retyped", "added"])
def test_lost_paths(before, after, lost):
    assert list(lost_paths(before, after)) == lost


def test_lost_content_names_at_most_three_paths_and_skips_unchanged_and_new_files(tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    many = TWO + "  - expression: gpu.count <= 3\n  - expression: gpu.count <= 4\n"
    (directory / "two.yaml").write_text(many)
    (directory / "same.yaml").write_text(TWO.replace("name: two", "name: same"))
    before = read_policy_files([str(directory)])
    (directory / "two.yaml").write_text(FIRST_VALIDATION_ONLY)
    (directory / "new.yaml").write_text(TWO.replace("name: two", "name: new"))
    after = read_policy_files([str(directory)])
    assert lost_content(before, after) == [
        f"{directory / 'two.yaml'}: GPUPolicy/two loses spec.validations[1], "
        "spec.validations[2], spec.validations[3]"]


def test_serve_and_audit_watch_take_the_flag():
    from gpuguard import cli
    from gpuguard.serve_run import build_config

    parser, _ = cli.build_parser("serve")
    args = parser.parse_args(["serve", "--cert", "c", "--key", "k"])
    config = build_config(args, GPUSettings(), cert_file="c", key_file="k")
    assert config.server.policy_removal_quiet_s == 60.0
    args = parser.parse_args(["serve", "--cert", "c", "--key", "k",
                              "--policy-removal-quiet-s", "0"])
    assert build_config(args, GPUSettings(), cert_file="c",
                        key_file="k").server.policy_removal_quiet_s == 0.0
    with pytest.raises(ValueError, match="policy_removal_quiet_s: must not be negative"):
        ServerSettings(policy_removal_quiet_s=-1.0)
    audit, _ = cli.build_parser("audit")
    assert audit.parse_args(["audit", "--watch", "--policy-removal-quiet-s", "30"]) \
        .policy_removal_quiet_s == 30.0
    # audit --help may not import webhook/: its default is a literal, equal to serve's
    assert audit.parse_args(["audit", "--watch"]).policy_removal_quiet_s == \
        ServerSettings.policy_removal_quiet_s


def test_a_comparison_that_fails_holds_the_change(tmp_path, monkeypatch):
    """Never fail open: if the comparison itself raises, the change is held like a loss."""
    from webhook import policy_store

    def broken(before, after):
        raise RuntimeError("boom")

    monkeypatch.setattr(policy_store, "lost_content", broken)
    store, clock, path = started(tmp_path)
    path.write_text(TWO.replace("<= 8", "<= 4"))
    store.check()
    clock.now = 5.0
    result = store.check()
    assert result.outcome == HELD and store.current.generation == 1
    assert result.errors == ("the change could not be compared with the set served "
                             "(RuntimeError: boom)",)
