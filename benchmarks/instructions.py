"""Instruction counts of one admission and of the audit, under valgrind's callgrind.

Run: .venv/bin/python benchmarks/instructions.py [--quick] [--serial] [--keep DIR]

Needs valgrind (``apt-get install -y valgrind``). Wall time swings ±20-60 % on shared machines;
the instruction count of the same work does not (two runs agree within about 0.4 %), so this
benchmark prints instructions only, never seconds. Figures (each also one ``name: value`` line at
the end, for scripts and closing notes):

- ``validate_library_instructions``: one in-process ``/validate`` of
  ``examples/admission/gpu-pod-review.json`` with the built-in library (denied), split into
  phases: the wire (JSON decode + envelope + response, what the null handler does), the
  ReviewInput, the GPU facts (``workload_facts`` + the ``gpu`` CEL view), the CEL data
  (Python re-check by ``prepare``, which takes the objects the wire checked unwalked;
  activations; the runtime's lazy conversion on first use),
  the CEL programs, and the rest (matching, results, glue: the whole minus the phases);
- ``validate_no_policy_instructions``: the same request when no policy applies (a set holding
  only a ConfigMap policy; an empty set is refused, it would allow everything);
- ``validate_library_compact_instructions``, ``validate_no_policy_compact_instructions``: the
  two requests above with the review written as kube-apiserver writes it, compact JSON (the
  example file is indented for people to read; the duplicate-key check compares whitespace
  aside, a few C passes over the bytes the compact body does not need);
- ``validate_synthetic_<N>_instructions`` for N = 0, 10, 50, 200 of the project's synthetic
  one-rule policies (``benchmarks/webhook.py``), plus the ConfigMap policy in each set (so N = 0
  is the no-policy request), and the per-policy cost from a least-squares fit over N >= 10 (0 is
  left out: the GPU facts and CEL data are paid once as soon as any policy applies);
- ``audit_instructions_per_pod``: ``gpuguard audit -f DIR -o json --jobs 0`` over two snapshots
  from ``benchmarks/audit.py``'s generator (same nodes, two pod counts), difference per pod.

The path measured is the webhook's own: :class:`webhook.admission.Admitter` over a
:class:`webhook.policy_store.PolicyStore` loaded as ``gpuguard serve`` loads it, and
:mod:`webhook.wire` for the body and the answer — what ``AdmissionHandlers.admission`` runs for
``POST /validate``, without aiohttp's request / response objects, the metrics and the log line.
Only the inline slice and the deadline are raised (to an hour): under callgrind's ~50x slowdown
they would otherwise send the evaluation to the thread pool or to the failurePolicy fallback.
Each measured request's verdict is checked (denied by the library, allowed with no or synthetic
policies, no fallback, no hand-off, the expected number of matching policies), so a broken path
cannot produce a cheap number.

How it counts: two child processes (admission, audit; in parallel unless ``--serial``) run under
``valgrind --tool=callgrind --instr-atstart=no --dump-before=ctermid``. Set-up — imports, loading
each policy set and its first request (which compiles the combined program of the matching
policies), the audit's warm-up run — runs uninstrumented (several times faster); the child then
asks the parent to switch instrumentation on (``callgrind_control -i on``, through request / ack
files) and calls ``os.ctermid()``, which nothing measured calls, to cut the profile into parts,
one dump each. A figure is (instructions of a part running the step N times - those of an empty
part) / N, minus the same for an empty step (the loop's own cost), after 10 instrumented warm-up
runs (Python's specialising interpreter settles in about 8; measured per request, the runs after
that agree within 1 %, a garbage collection adding ~1 % to one in 15). ``PYTHONHASHSEED=0``
keeps dict and set orders the same in every run. The phases replay, on their own, exactly the
calls the measured request made (recorded once by wrapping the functions, then unwrapped):
``workload_facts`` / ``gpu_data`` / ``prepare`` wherever they are called from, and the CEL
runtime through :mod:`policies.cel.runtime` (the one module talking to it): activations, and each
program on a fresh runtime activation (conversion + program) and on the already used one
(program only, with its result turned back into Python; the runtime keeps what it converted).
A phase the request does not run is shown as "not run", never as a cost. A program that calls
the authorizer cannot be replayed (its checks belong to the request's session, gone once it is
answered): with the library's ``gpu-requesters`` in the combined program, the CEL programs and the
runtime's lazy conversion are "not run" and counted in the rest, whose label says so.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:  # imported where used: the audit child must not pay for the webhook's imports
    from webhook.admission import Decision
    from webhook.wire import Envelope

BODY = ROOT / "examples" / "admission" / "gpu-pod-review.json"
MARKER = "ctermid"
"""The C function whose every entry makes callgrind dump a part (``--dump-before``): libc's
``ctermid``, reached by ``os.ctermid()`` — pure (no system call) and called by nothing else
(``zlib.adler32`` is not: the audit compresses with zlib)."""
SERIES = (0, 10, 50, 200)
QUICK_SERIES = (0, 10, 50)
HOUR_MS = 3_600_000
CONTROL_WAIT_S = 300.0
AUDIT_PODS, AUDIT_NODES = (500, 1500), 50
AUDIT_PODS_QUICK, AUDIT_NODES_QUICK = (200, 600), 20
NO_POLICY = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUPolicy",
             "metadata": {"name": "configmaps-only"},
             "spec": {"match": {"resources": ["configmaps"]},
                      "validations": [{"expression": "true"}]}}


# --- the child: measured steps, cut into parts -------------------------------------------------


def mark() -> None:
    """Cut the callgrind profile here (a no-op without valgrind)."""
    os.ctermid()


@dataclass
class Parts:
    """The plan of one child: which dump parts hold which figure.

    ``plan`` entries: ``{"figure", "empty", "part", "iterations", "loop"}`` — ``empty`` and
    ``part`` are 1-based dump numbers (dump k holds the cost between the k-1th and the kth
    :func:`mark`), ``loop`` the calibration figure whose per-iteration cost is subtracted.
    """

    control: Path | None = None
    marks: int = 0
    requests: int = 0
    plan: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def instrument(self, on: bool) -> None:
        """Have the parent switch callgrind's instrumentation on or off, and wait until it has.

        Set-up (imports, loading policies, the first request, which compiles the combined
        program) runs uninstrumented, several times faster; parts are only cut while on. A
        no-op without ``control`` (not under callgrind): the request goes to the parent as a
        file in ``control``, answered by an ``ack`` file once ``callgrind_control`` is done.
        """
        if self.control is None:
            return
        self.requests += 1
        pending = self.control / f".request-{self.requests}"
        pending.write_text("on" if on else "off", encoding="utf-8")
        pending.rename(self.control / f"request-{self.requests}")
        ack = self.control / f"ack-{self.requests}"
        give_up = time.monotonic() + CONTROL_WAIT_S
        while not ack.exists():  # running, not blocked: valgrind serves vgdb between sleeps
            if time.monotonic() > give_up:
                raise RuntimeError(f"no answer to instrumentation request {self.requests} "
                                   f"within {CONTROL_WAIT_S:.0f} s: is the parent gone?")
            time.sleep(0.005)

    def mark(self) -> int:
        mark()
        self.marks += 1
        return self.marks

    def _enter(self) -> int:
        gc.collect()  # the same starting heap for every measurement
        self.mark()
        return self.mark()

    def _leave(self, figure: str, empty: int, iterations: int, loop: str | None) -> None:
        part = self.mark()
        self.plan.append({"figure": figure, "empty": empty, "part": part,
                          "iterations": iterations, "loop": loop})

    def measure(self, figure: str, step: Callable[[], Any], iterations: int, *,
                warmup: int = 10, loop: str | None = "_call") -> Any:
        """Run ``step`` ``warmup`` times, then ``iterations`` times in one part; its last value."""
        result = None
        for _ in range(warmup):
            result = step()
        empty = self._enter()
        for _ in range(iterations):
            result = step()
        self._leave(figure, empty, iterations, loop)
        return result

    async def measure_async(self, figure: str, step: Callable[[], Awaitable[Any]],
                            iterations: int, *, warmup: int = 10,
                            loop: str | None = "_await") -> Any:
        """:meth:`measure` for a coroutine function (run on the current event loop)."""
        result = None
        for _ in range(warmup):
            result = await step()
        empty = self._enter()
        for _ in range(iterations):
            result = await step()
        self._leave(figure, empty, iterations, loop)
        return result

    async def calibrate(self, iterations: int) -> None:
        """The loop's own cost per iteration, sync and awaited (subtracted from every figure)."""
        def nothing() -> None:
            return None

        async def nothing_awaited() -> None:
            return None

        self.measure("_call", nothing, iterations, loop=None)
        await self.measure_async("_await", nothing_awaited, iterations, loop=None)


def synthetic_policies(count: int) -> str:
    """The ConfigMap policy plus ``count`` of ``benchmarks/webhook.py``'s synthetic policies."""
    import yaml

    from benchmarks.webhook import synthetic_policies as synthetic

    text = yaml.safe_dump(NO_POLICY)
    return text if count == 0 else text + "---\n" + synthetic(count)


class Admission:
    """The webhook's ``/validate`` path in-process over one policy set (see module docstring).

    Args:
        paths: policy files (None: the built-in library), loaded as ``gpuguard serve`` does.

    Raises:
        RuntimeError: the policy set did not load (the message lists its errors).
    """

    def __init__(self, paths: Sequence[str] | None) -> None:
        from gpuguard import policy_set
        from kube.namespaces import StaticNamespaces
        from policies.facts.resource_names import GPUSettings
        from webhook import wire
        from webhook.admission import Admitter, Endpoint, fail_closed_policies
        from webhook.metrics import Metrics
        from webhook.policy_store import PolicyStore
        from webhook.settings import ServerSettings

        self.wire, self.endpoint, self.fail_closed_policies = (
            wire, Endpoint.VALIDATE, fail_closed_policies)
        self.settings = ServerSettings(deadline_ms=HOUR_MS, inline_slice_ms=HOUR_MS)
        self.store = PolicyStore(paths, functools.partial(policy_set.load, settings=GPUSettings()))
        result = self.store.load()
        if self.store.current is None:
            raise RuntimeError(f"policy set {paths or 'library'} did not load: "
                               f"{result.outcome} {'; '.join(self.store.last_errors)}")
        from policies.rbac import RBACAuthorizer
        from policies.sources import read_documents

        self.metrics = Metrics()
        self.executor = concurrent.futures.ThreadPoolExecutor(1)
        # gpu-requesters' authorizer checks answered as a cluster with these roles would (the
        # webhook's SubjectAccessReviews need an API server; the sample's user-a is in gpu-users)
        roles, _ = read_documents([str(ROOT / "tests" / "data" / "rbac" / "gpu-roles.yaml")])
        self.admitter = Admitter(self.store, StaticNamespaces({}, "none"), self.settings,
                                 self.metrics, self.executor,
                                 authorizer=RBACAuthorizer(d.body for d in roles))

    def close(self) -> None:
        """Release the evaluation thread pool (policy sets that call the authorizer use it)."""
        self.executor.shutdown(wait=True)

    def envelope(self, body: bytes) -> Envelope:
        """The body decoded and checked as the handler does."""
        wire = self.wire
        return wire.decode_envelope(body, max_depth=self.settings.max_depth)

    def answer(self, envelope: Envelope, decision: Decision) -> bytes:
        """The AdmissionReview response bytes for ``decision``."""
        wire = self.wire
        return wire.encode(wire.response(
            envelope, allowed=decision.allowed, message=decision.message,
            reason=decision.reason, warnings=decision.warnings,
            audit_annotations=decision.audit_annotations, patch=decision.patch))

    def null(self, body: bytes) -> bytes:
        """What ``POST /null-validate`` does: read the AdmissionReview, allow it unevaluated."""
        return self.wire.encode(self.wire.response(self.envelope(body), allowed=True))

    async def validate(self, body: bytes) -> tuple[Decision, bytes]:
        """One ``POST /validate``: body in, decision and response bytes out."""
        envelope = self.envelope(body)
        decision = await self.admitter.admit(envelope, self.endpoint)
        return decision, self.answer(envelope, decision)

    def check(self, body: bytes, decision: Decision, answer: bytes, *, allowed: bool,
              matching: int | None) -> None:
        """Assert the measured request was really decided (see module docstring).

        ``matching``: how many policies must match it (None: at least one).

        Raises:
            AssertionError: naming what differs.
        """
        envelope = self.envelope(body)
        response = json.loads(answer)["response"]
        snapshot = self.store.current
        assert snapshot is not None
        matched = self.fail_closed_policies(snapshot, self.admitter.review_input(envelope),
                                            self.endpoint)[1]
        handoffs = self.metrics.registry.get_sample_value(
            "gpuguard_admission_inline_handoffs_total")
        problems = [
            f"allowed is {decision.allowed}, expected {allowed}"
            if decision.allowed is not allowed else "",
            f"the response says allowed={response.get('allowed')}"
            if response.get("allowed") is not allowed or response.get("uid") != envelope.uid
            else "",
            f"decided by the failurePolicy fallback ({decision.fallback})"
            if decision.fallback else "",
            f"{handoffs:.0f} evaluations handed to the thread pool" if handoffs else "",
            "denied without a message" if not allowed and not decision.message else "",
            f"{matched} policies match, expected {matching}"
            if (matched != matching if matching is not None else matched == 0) else "",
        ]
        problems = [p for p in problems if p]
        if problems:  # raised, not asserted: python -O must not skip it
            raise AssertionError("the measured /validate is not the expected one: "
                                 + "; ".join(problems))


@dataclass
class Recorded:
    """The calls one request made into the phases' functions (see :func:`recording`)."""

    facts: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    views: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    # prepare's arguments, and the values of its data that the request had checked
    prepares: list[tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...]]] = field(
        default_factory=list)
    activations: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    runtimes: list[tuple[Any, Any, Any]] = field(default_factory=list)  # env, data, runtime
    runs: list[tuple[Any, Any, Any]] = field(default_factory=list)  # expression, runtime, value


_FAILED: Any = object()  # a recorded program run that raised CelEvaluationError


def _patch_function(original: Callable[..., Any], wrapper: Callable[..., Any],
                    undo: list[tuple[Any, str, Any]]) -> int:
    """Replace ``original`` by ``wrapper`` in every gpuguard module that holds it; how many."""
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in ("policies", "webhook", "audit", "kube"):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                undo.append((module, attribute, value))
                setattr(module, attribute, wrapper)
                count += 1
    return count


@contextlib.contextmanager
def recording() -> Iterator[Recorded]:
    """Record, while the block runs, every call of the functions the phases replay.

    Raises:
        RuntimeError: a function is no longer where this harness looks for it (the harness
            must follow the product: the message names it).
    """
    from policies.cel import runtime as cel
    from policies.cel.gpu import gpu_data
    from policies.facts.workloads import workload_facts

    calls = Recorded()
    undo: list[tuple[Any, str, Any]] = []

    def recorder(target: list[Any], original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            target.append((args, kwargs))
            return original(*args, **kwargs)
        return wrapper

    prepare, is_checked = cel.prepare, cel._is_checked

    def record_prepare(data: Any, **kwargs: Any) -> Any:
        # The values the request had checked (cel.checked_json): the replay checks them too.
        checked = tuple(v for v in data.values() if is_checked(v))
        calls.prepares.append(((data,), kwargs, checked))
        return prepare(data, **kwargs)

    environment, expression = cel.CelEnvironment, cel.CompiledExpression
    for owner, name in ((environment, "activation"), (environment, "_runtime_activation"),
                        (expression, "_run")):
        if not callable(getattr(owner, name, None)):
            raise RuntimeError(f"policies.cel.runtime.{owner.__name__}.{name} is gone: update "
                               f"benchmarks/instructions.py to the CEL data path")
    activation, runtime, run = (environment.activation, environment._runtime_activation,
                                expression._run)

    def record_activation(env: Any, *args: Any, **kwargs: Any) -> Any:
        calls.activations.append((env, args, kwargs))
        return activation(env, *args, **kwargs)

    def record_runtime(env: Any, data: Any) -> Any:
        made = runtime(env, data)
        calls.runtimes.append((env, data, made))
        return made

    def record_run(compiled: Any, made: Any) -> Any:
        try:
            value = run(compiled, made)
        except cel.CelEvaluationError:
            calls.runs.append((compiled, made, _FAILED))
            raise
        calls.runs.append((compiled, made, value))
        return value

    try:
        for original, wrapper in ((workload_facts, recorder(calls.facts, workload_facts)),
                                  (gpu_data, recorder(calls.views, gpu_data)),
                                  (cel.prepare, record_prepare)):
            if _patch_function(original, wrapper, undo) == 0:
                raise RuntimeError(f"{original.__module__}.{original.__name__} is held by no "
                                   f"gpuguard module: update benchmarks/instructions.py")
        for owner, name, wrapper in ((environment, "activation", record_activation),
                                     (environment, "_runtime_activation", record_runtime),
                                     (expression, "_run", record_run)):
            undo.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, wrapper)
        yield calls
    finally:
        for owner, name, value in reversed(undo):
            setattr(owner, name, value)


class Phases:
    """Steps replaying one request's calls of each phase on their own (see module docstring)."""

    def __init__(self, calls: Recorded) -> None:
        from policies.cel import runtime as cel
        from policies.cel.gpu import gpu_data
        from policies.facts.workloads import workload_facts

        self.workload_facts, self.gpu_data, self.prepare = workload_facts, gpu_data, cel.prepare
        self.checked_json = cel.checked_json
        self.error = cel.CelEvaluationError
        self.calls = calls
        # Runs grouped by the runtime activation they used, in order: replayed on a fresh one.
        groups: dict[int, tuple[Any, Any, list[Any], list[Any]]] = {
            id(made): (env, data, [], []) for env, data, made in calls.runtimes}
        # Programs that call the authorizer are not replayed: its checks belong to the request's
        # session, gone once it is answered, and a Python function cannot run again on a used
        # runtime activation ("No PyCelArena found").
        self.runs = [run for run in calls.runs if "authorizer" not in run[0].expression]
        for compiled, made, value in self.runs:
            groups[id(made)][2].append(compiled)
            groups[id(made)][3].append(value)
        self.groups = list(groups.values())

    def facts(self) -> None:
        for args, kwargs in self.calls.facts:
            self.workload_facts(*args, **kwargs)
        for args, kwargs in self.calls.views:
            self.gpu_data(*args, **kwargs)

    def recheck(self) -> None:
        for args, kwargs, checked in self.calls.prepares:
            if not checked:  # as the webhook: a small body's objects are not named at all
                self.prepare(*args, **kwargs)
                continue
            with self.checked_json(*checked):
                self.prepare(*args, **kwargs)

    def activations(self) -> None:
        for env, args, kwargs in self.calls.activations:
            env.activation(*args, **kwargs)

    def runtime_activations(self) -> None:
        for env, data, _ in self.calls.runtimes:
            env._runtime_activation(data)

    def fresh(self) -> list[Any]:
        """Each program on a new runtime activation: conversion on first use + program."""
        values = []
        for env, data, expressions, _ in self.groups:
            made = env._runtime_activation(data)
            for compiled in expressions:
                try:
                    values.append(compiled._run(made))
                except self.error:
                    values.append(_FAILED)
        return values

    def programs(self) -> list[Any]:
        """Each program on the runtime activation the request used (already converted)."""
        values = []
        for compiled, made, _ in self.runs:
            try:
                values.append(compiled._run(made))
            except self.error:
                values.append(_FAILED)
        return values

    def check(self) -> None:
        """Assert the replays give the request's own values.

        Raises:
            AssertionError: a replayed program gave another value.
        """
        if self.programs() != [value for _, _, value in self.runs]:
            raise AssertionError("the programs replayed on the request's activations gave "
                                 "other values")
        if self.fresh() != [value for *_, values in self.groups for value in values]:
            raise AssertionError("the programs replayed on fresh activations gave other values")


async def admission_child(parts: Parts, iterations: int, series: Sequence[int],
                          directory: Path) -> None:
    """Every admission figure (see module docstring) into ``parts``.

    Each policy set is loaded and answers its first request uninstrumented (see
    :meth:`Parts.instrument`), then is measured.
    """
    body = BODY.read_bytes()
    compact = compact_body(body)
    library = Admission(None)
    try:
        await library.validate(body)
        parts.instrument(True)
        await parts.calibrate(iterations)
        decision, answer = await parts.measure_async(
            "validate_library_instructions", lambda: library.validate(body), iterations)
        library.check(body, decision, answer, allowed=False, matching=None)
        decision, answer = await parts.measure_async(
            "validate_library_compact_instructions", lambda: library.validate(compact),
            iterations)
        library.check(compact, decision, answer, allowed=False, matching=None)
        parts.notes["library_policies"] = len(library.store.current.names)
        parts.notes["library_denied_by"] = list(decision.denied_by)
        envelope = library.envelope(body)
        parts.measure("wire_instructions",
                      lambda: library.answer(library.envelope(body), decision), iterations)
        parts.measure("null_path_instructions", lambda: library.null(body), iterations)
        parts.measure("review_input_instructions",
                      lambda: library.admitter.review_input(envelope), iterations)
        with recording() as calls:
            again, _ = await library.validate(body)
        if again.message != decision.message:
            raise AssertionError("the recorded request was decided otherwise")
        phases = Phases(calls)
        phases.check()
        parts.notes["phase_calls"] = {
            "workload_facts": len(calls.facts), "gpu_data": len(calls.views),
            "prepare": len(calls.prepares), "activation": len(calls.activations),
            "runtime_activation": len(calls.runtimes), "programs": len(phases.runs)}
        # Programs that call the authorizer are not replayed (see Phases): their cost, and the
        # runtime's conversion of what they read, stay in "the rest".
        parts.notes["programs_not_replayed"] = len(calls.runs) - len(phases.runs)
        parts.measure("gpu_facts_instructions", phases.facts, iterations)
        parts.measure("cel_recheck_instructions", phases.recheck, iterations)
        parts.measure("cel_request_activation_instructions", phases.activations, iterations)
        parts.measure("cel_runtime_activation_instructions", phases.runtime_activations,
                      iterations)
        parts.measure("cel_fresh_instructions", phases.fresh, iterations)
        parts.measure("cel_programs_instructions", phases.programs, iterations)
        parts.instrument(False)
    finally:
        library.close()
    for count in series:
        path = directory / f"synthetic-{count}.yaml"
        path.write_text(synthetic_policies(count), encoding="utf-8")
        admission = Admission([str(path)])
        try:
            await admission.validate(body)
            parts.instrument(True)
            rounds = max(5, iterations * 20 // max(count, 20))
            decision, answer = await parts.measure_async(
                f"validate_synthetic_{count}_instructions", lambda a=admission: a.validate(body),
                rounds)
            parts.instrument(False)
            admission.check(body, decision, answer, allowed=True, matching=count)
            if count == 0:
                parts.instrument(True)
                decision, answer = await parts.measure_async(
                    "validate_synthetic_0_compact_instructions",
                    lambda a=admission: a.validate(compact), iterations)
                parts.instrument(False)
                admission.check(compact, decision, answer, allowed=True, matching=0)
        finally:
            admission.close()


def compact_body(body: bytes) -> bytes:
    """``body`` as kube-apiserver writes an AdmissionReview: compact JSON (Go's
    ``json.Marshal``: no whitespace, keys as given)."""
    return json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False).encode()


def audit_snapshots(directory: Path, sizes: Sequence[int],
                    nodes: int) -> list[tuple[Path, int]]:
    """One snapshot per size from ``benchmarks/audit.py``'s generator, all with ``nodes`` nodes
    (so the difference is pods and their controllers); ``(directory, pods)`` each. Run outside
    callgrind: the generator is not what is measured."""
    from benchmarks.audit import generate

    snapshots = []
    for wanted in sizes:
        snapshot = directory / f"snapshot-{wanted}"
        snapshot.mkdir(parents=True)
        snapshots.append((snapshot, generate(snapshot, wanted, nodes)["pods"]))
    return snapshots


def audit_child(parts: Parts, snapshots: Sequence[tuple[Path, int]], nodes: int) -> None:
    """``audit_<i>_instructions``: one ``gpuguard audit`` of each snapshot, in-process, after an
    unmeasured warm-up run of the first; each report checked."""
    from gpuguard import cli

    parts.notes["audit_pods"] = [pods for _, pods in snapshots]
    parts.notes["audit_nodes"] = nodes

    def audit(snapshot: Path) -> tuple[int, str]:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            code = cli.main(["audit", "-f", str(snapshot), "-o", "json", "--jobs", "0"])
        return code, output.getvalue()

    audit(snapshots[0][0])  # warm-up, uninstrumented: first imports and caches
    parts.instrument(True)
    for index, (snapshot, pods) in enumerate(snapshots):
        code, text = parts.measure(f"audit_{index}_instructions", lambda s=snapshot: audit(s),
                                   1, warmup=0, loop=None)
        summary = json.loads(text)["summary"] if code in (0, 1) else {}
        if summary.get("pods") != pods or summary.get("errors") != 0 or \
                not summary.get("evaluated_workloads"):
            raise AssertionError(f"the audit of {pods} pods exited {code} with summary "
                                 f"{summary}")


def child_main(args: argparse.Namespace) -> int:
    parts = Parts(control=Path(args.control) if args.control else None)
    with tempfile.TemporaryDirectory(prefix="gpuguard-instructions-") as tmp:
        if args.child == "admission":
            asyncio.run(admission_child(parts, args.iterations, args.series, Path(tmp)))
        else:
            audit_child(parts, list(zip(map(Path, args.audit_snapshots), args.audit_pods,
                                        strict=True)), args.audit_nodes)
    Path(args.plan).write_text(json.dumps({"plan": parts.plan, "marks": parts.marks,
                                           "notes": parts.notes}), encoding="utf-8")
    return 0


# --- the parent: run the children under callgrind, read the parts ------------------------------


def read_parts(directory: Path) -> dict[int, int]:
    """Instructions (``summary:``) of each ``--dump-before`` part, by dump number."""
    found: dict[int, int] = {}
    for path in directory.glob("callgrind.out.*.*"):
        number = int(path.name.rsplit(".", 1)[1])
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("summary:"):
                    found[number] = int(line.split()[1])
                    break
    return found


def figures_of(plan: dict[str, Any], parts: dict[int, int]) -> dict[str, float]:
    """Instructions per iteration of each planned figure, the loop's own cost subtracted.

    Raises:
        RuntimeError: the dumps do not match the plan (something else entered the marker).
    """
    if sorted(parts) != list(range(1, plan["marks"] + 1)):
        raise RuntimeError(f"callgrind wrote {len(parts)} parts for {plan['marks']} marks: "
                           f"something other than the harness called {MARKER}()")
    raw = {entry["figure"]: (parts[entry["part"]] - parts[entry["empty"]]) / entry["iterations"]
           for entry in plan["plan"]}
    return {entry["figure"]: raw[entry["figure"]] - (raw[entry["loop"]] if entry["loop"] else 0)
            for entry in plan["plan"]}


@dataclass
class Child:
    """One child process under callgrind, and where its dumps, plan and requests go."""

    name: str
    process: subprocess.Popen[bytes]
    directory: Path

    @property
    def plan(self) -> Path:
        return self.directory / "plan.json"


def start_child(name: str, options: list[str], work: Path, valgrind: str) -> Child:
    directory = work / name
    directory.mkdir()
    command = [valgrind, "--tool=callgrind", "--instr-atstart=no", f"--dump-before={MARKER}",
               "--dump-line=no", f"--callgrind-out-file={directory}/callgrind.out.%p",
               sys.executable, str(Path(__file__).resolve()), "--child", name,
               "--plan", str(directory / "plan.json"), "--control", str(directory), *options]
    environment = {**os.environ, "PYTHONHASHSEED": "0"}  # same dict/set orders every run
    with (directory / "valgrind.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment)
    return Child(name, process, directory)


def serve(children: Sequence[Child], control: str) -> None:
    """Answer the children's instrumentation requests (see :meth:`Parts.instrument`) until
    they exit.

    Raises:
        RuntimeError: ``callgrind_control`` failed (its output is in the message).
    """
    running = list(children)
    while running:
        for child in list(running):
            for request in sorted(child.directory.glob("request-*")):
                state = request.read_text(encoding="utf-8")
                number = request.name.split("-", 1)[1]
                result = subprocess.run([control, "-i", state, str(child.process.pid)],
                                        capture_output=True, text=True, check=False)
                if result.returncode != 0 or "OK" not in result.stdout:
                    child.process.kill()
                    raise RuntimeError(f"callgrind_control -i {state} {child.process.pid} "
                                       f"failed: {result.stdout}{result.stderr}")
                request.unlink()
                (child.directory / f"ack-{number}").write_text("", encoding="utf-8")
            if child.process.poll() is not None:
                running.remove(child)
        time.sleep(0.02)


def finish_child(child: Child) -> tuple[dict[str, float], dict[str, Any]]:
    code = child.process.wait()
    if code != 0 or not child.plan.exists():
        log = (child.directory / "valgrind.log").read_text(errors="replace")
        raise RuntimeError(f"the {child.name} child exited {code}:\n{log[-4000:]}")
    plan = json.loads(child.plan.read_text(encoding="utf-8"))
    return figures_of(plan, read_parts(child.directory)), plan["notes"]


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """Least-squares line through ``points``: (intercept, slope, R²)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for _, y in points)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in points)
    return intercept, slope, 1 - residual / total if total else 1.0


def derive(figures: dict[str, float], notes: dict[str, Any],
           series: Sequence[int]) -> list[tuple[str, str, float | None]]:
    """The report rows ``(figure name, label, value)`` (value None: not run) from the raw parts."""
    rows: list[tuple[str, str, float | None]] = []
    calls = notes.get("phase_calls", {})

    def ran(*names: str) -> bool:
        return any(calls.get(name) for name in names)

    if "validate_library_instructions" in figures:
        whole = figures["validate_library_instructions"]
        facts = figures["gpu_facts_instructions"] if ran("workload_facts", "gpu_data") else None
        recheck = figures["cel_recheck_instructions"] if ran("prepare") else None
        activation = (figures["cel_request_activation_instructions"]
                      + figures["cel_runtime_activation_instructions"]) \
            if ran("activation", "runtime_activation") else None
        lazy = (figures["cel_fresh_instructions"] - figures["cel_programs_instructions"]
                - figures["cel_runtime_activation_instructions"]) if ran("programs") else None
        programs = figures["cel_programs_instructions"] if ran("programs") else None
        data = sum(v for v in (recheck, activation, lazy) if v is not None) \
            if ran("prepare", "activation", "runtime_activation", "programs") else None
        known = [figures["wire_instructions"], figures["review_input_instructions"], facts,
                 data, programs]
        rows += [
            ("null_path_instructions", "null handler: decode + envelope + allow (for reference)",
             figures["null_path_instructions"]),
            ("wire_instructions", "JSON decode + envelope + response (this denial)",
             figures["wire_instructions"]),
            ("review_input_instructions", "ReviewInput", figures["review_input_instructions"]),
            ("gpu_facts_instructions", "GPU facts (workload_facts + CEL view)", facts),
            ("cel_recheck_instructions", "  CEL data: Python re-check (prepare)", recheck),
            ("cel_activation_instructions", "  CEL data: activations", activation),
            ("cel_lazy_conversion_instructions", "  CEL data: lazy conversion in the runtime",
             lazy),
            ("cel_data_instructions", "CEL data conversion", data),
            ("cel_programs_instructions", "CEL programs", programs),
            ("engine_other_instructions", "other engine Python (matching, results, glue)"
             + (f", and {skipped} CEL program(s) calling the authorizer with the runtime's "
                "conversion of what they read (not replayed)"
                if (skipped := notes.get("programs_not_replayed")) else ""),
             whole - sum(v for v in known if v is not None)),
            ("validate_library_instructions",
             f"whole /validate, built-in library ({notes['library_policies']} policies, denied)",
             whole),
            ("validate_library_compact_instructions",
             "  the same review as kube-apiserver writes it (compact JSON)",
             figures["validate_library_compact_instructions"]),
        ]
    for count in series:
        name = f"validate_synthetic_{count}_instructions"
        if name in figures:
            label = "/validate, no policy applies" if count == 0 else \
                f"/validate, {count} synthetic policies"
            rows.append((name, label, figures[name]))
    if "validate_synthetic_0_instructions" in figures:
        rows.append(("validate_no_policy_instructions", "/validate, no policy applies "
                     "(= synthetic 0)", figures["validate_synthetic_0_instructions"]))
    if "validate_synthetic_0_compact_instructions" in figures:
        rows.append(("validate_no_policy_compact_instructions",
                     "  the same review as kube-apiserver writes it (compact JSON)",
                     figures["validate_synthetic_0_compact_instructions"]))
    points = [(c, figures[f"validate_synthetic_{c}_instructions"]) for c in series
              if c > 0 and f"validate_synthetic_{c}_instructions" in figures]
    if len(points) >= 2:
        intercept, slope, r2 = fit(points)
        span = f"{points[0][0]} → {points[-1][0]} policies"
        rows += [("policy_slope_instructions", f"per additional policy (fit {span})", slope),
                 ("policy_intercept_instructions", f"fit intercept ({span})", intercept),
                 ("policy_fit_r2", "fit R²", r2)]
    if "audit_0_instructions" in figures:
        (small, large) = notes["audit_pods"]
        per_pod = (figures["audit_1_instructions"] - figures["audit_0_instructions"]) / \
            (large - small)
        rows += [
            ("audit_instructions_per_pod",
             f"audit per pod ({small:,} → {large:,} pods, {notes['audit_nodes']} nodes)",
             per_pod),
            ("audit_fixed_instructions", "audit beyond its pods (policy loading, nodes, "
             "report; imports excluded)", figures["audit_0_instructions"] - per_pod * small),
            ("audit_pods_small", "pods in the smaller snapshot", small),
            ("audit_pods_large", "pods in the larger snapshot", large),
        ]
    return rows


def shown(value: float | None, name: str) -> str:
    """A figure for people: thousands separated, R² to four places."""
    if value is None:
        return "not run"
    if name.endswith("_r2"):
        return f"{value:.4f}"
    return f"{value:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations, series 0/10/50, a smaller audit")
    parser.add_argument("--serial", action="store_true",
                        help="run the admission and audit children one after the other")
    parser.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    parser.add_argument("--valgrind", default=shutil.which("valgrind") or "valgrind")
    parser.add_argument("--child", choices=("admission", "audit"), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--control", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--series", type=int, nargs="*", default=list(SERIES),
                        help=argparse.SUPPRESS)
    parser.add_argument("--audit-snapshots", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--audit-pods", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--audit-nodes", type=int, default=50, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    control = shutil.which("callgrind_control",
                           path=str(Path(shutil.which(args.valgrind) or args.valgrind).parent))
    if shutil.which(args.valgrind) is None or control is None:
        print(f"valgrind / callgrind_control not found ({args.valgrind}): "
              "apt-get install -y valgrind", file=sys.stderr)
        return 2
    series = QUICK_SERIES if args.quick else SERIES
    admission_options = ["--iterations", "5" if args.quick else "20",
                         "--series", *map(str, series)]
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        print(f"--keep {args.keep}: expected a new or empty directory", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpuguard-cg-"))
    work.mkdir(parents=True, exist_ok=True)
    nodes = AUDIT_NODES_QUICK if args.quick else AUDIT_NODES
    snapshots = audit_snapshots(work / "snapshots", AUDIT_PODS_QUICK if args.quick
                                else AUDIT_PODS, nodes)
    audit_options = ["--audit-snapshots", *(str(d) for d, _ in snapshots),
                     "--audit-pods", *(str(p) for _, p in snapshots), "--audit-nodes", str(nodes)]
    figures: dict[str, float] = {}
    notes: dict[str, Any] = {}
    try:
        print(f"callgrind ({args.valgrind}); body {BODY.relative_to(ROOT)}; "
              f"{'quick' if args.quick else 'full'} run", flush=True)
        children = [("admission", admission_options), ("audit", audit_options)]
        batches = [[child] for child in children] if args.serial else [children]
        for batch in batches:
            started = [start_child(name, options, work, args.valgrind)
                       for name, options in batch]
            try:
                serve(started, control)
            finally:
                for child in started:
                    if child.process.poll() is None:
                        child.process.kill()
            for child in started:
                found, extra = finish_child(child)
                figures.update(found)
                notes.update(extra)
    except RuntimeError as exc:  # a child failed, or callgrind_control did: say which, no trace
        print(f"benchmarks/instructions.py: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = derive(figures, notes, series)
    print(f"\nlibrary denial by: {', '.join(notes.get('library_denied_by', []))}")
    print(f"calls replayed per phase: {json.dumps(notes.get('phase_calls', {}))}\n")
    print(f"{'instructions':>14}  what")
    for name, label, value in rows:
        print(f"{shown(value, name):>14}  {label}")
    print()
    for name, _, value in rows:
        print(f"{name}: " + ("not_run" if value is None else
                             f"{value:.4f}" if name.endswith("_r2") else f"{round(value)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
