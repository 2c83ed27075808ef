"""Large requests decided in evaluation processes (webhook/evaluators.py): the same answer as in
this process, the generation served when the request arrived, failures that deny and a pool that
recovers, deadlines on an injected clock. The processes are real (forkserver): what crosses to
them must pickle."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpuguard import policy_set
from kube.namespaces import StaticNamespaces
from policies.authorization import Unavailable
from policies.facts.resource_names import GPUSettings
from tests.fakes.fake_timer import ManualTimer
from tests.fakes.webhook_harness import Harness
from tests.paths import ROOT
from webhook import wire
from webhook.admission import Admitter, Endpoint
from webhook.app import HANDLERS_KEY, build_app
from webhook.connections import handler_args
from webhook.evaluators import Evaluation, EvaluationProcesses, evaluate_job
from webhook.metrics import Metrics
from webhook.policy_store import PolicySnapshot, PolicyStore
from webhook.server import Server
from webhook.settings import ServerSettings

LOADER = functools.partial(policy_set.load, settings=GPUSettings())
REVIEWS = sorted((ROOT / "tests" / "data" / "admissionreviews").glob("*.json"))
SAMPLE = ROOT / "examples" / "admission" / "gpu-pod-review.json"
LIBRARY = ROOT / "policies" / "library"


def admitter(timer: ManualTimer, authorizer=None) -> Admitter:
    store = PolicyStore(None, LOADER)
    assert store.load().outcome == "loaded"
    namespaces = StaticNamespaces({"team-a": {"metadata": {"name": "team-a", "labels": {
        "team": "a"}}}}, "test")
    return Admitter(store, namespaces, ServerSettings(deadline_ms=2500), Metrics(),
                    concurrent.futures.ThreadPoolExecutor(1), timer=timer,
                    authorizer=authorizer)


def comparable(decision):
    return (decision.allowed, decision.decision, decision.message, decision.reason,
            decision.warnings, dict(decision.audit_annotations), decision.patch,
            decision.denied_by, decision.policy_outcomes, decision.fallback)


async def in_process(adm: Admitter, body: bytes, endpoint: Endpoint):
    try:
        envelope = wire.decode_envelope(body, max_depth=adm.settings.max_depth)
        return envelope.uid, comparable(await adm.admit(envelope, endpoint))
    except wire.WireError as error:
        return error.status, error.message


async def in_worker(pool: EvaluationProcesses, adm: Admitter, body: bytes, endpoint: Endpoint,
                    snapshot: PolicySnapshot | None = None):
    await pool.turns.acquire()
    try:
        envelope, decision = await pool.decide(adm, snapshot or adm.store.current, body, None,
                                               endpoint, 0.0)
    except wire.WireError as error:
        return error.status, error.message
    assert decision.policy_set is (snapshot or adm.store.current)
    return envelope.uid, comparable(decision)


def bodies() -> list[bytes]:
    found = [path.read_bytes() for path in [*REVIEWS, SAMPLE]]
    big = json.loads(SAMPLE.read_text())  # an env-heavy pod, as in benchmarks/webhook_burst.py
    big["request"]["object"]["spec"]["containers"][0]["env"] = [
        {"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(3000)]
    duplicate = SAMPLE.read_bytes().replace(b'"uid": "0b8f', b'"uid": "x", "uid": "0b8f', 1)
    return [*found, json.dumps(big).encode(), duplicate, b"[]"]


def test_a_worker_answers_as_this_process_does_on_the_corpus_reviews():
    async def main():
        timer = ManualTimer()
        # gpu-requesters asks the authorizer: standalone's answers the same in both processes
        adm = admitter(timer, Unavailable("gpuguard serve runs standalone"))
        assert adm.store.current.engine.uses_authorizer and \
            adm.offloadable(adm.store.current, Endpoint.VALIDATE)
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=2.5)
        try:
            for body in bodies():
                for endpoint in (Endpoint.VALIDATE, Endpoint.MUTATE):
                    assert await in_worker(pool, adm, body, endpoint) == \
                        await in_process(adm, body, endpoint)
        finally:
            pool.shutdown()
        return adm

    adm = asyncio.run(main())
    denied = adm.metrics.registry.get_sample_value(
        "gpuguard_admission_fallbacks_total", {"endpoint": "validate", "cause": "deadline"})
    assert not denied  # nothing ran out of time: the answers above are the engine's


def test_a_request_is_answered_by_the_generation_served_when_it_arrived(tmp_path: Path):
    policy = tmp_path / "policies" / "equal.yaml"
    policy.parent.mkdir()
    policy.write_bytes((LIBRARY / "gpu-requests-equal-limits.yaml").read_bytes())
    store = PolicyStore([str(policy.parent)], LOADER)
    assert store.load().outcome == "loaded"
    first = store.current
    # The reload: the same file now holds another policy as well (nothing lost), which the
    # sample pod passes too; the request that arrived before it is decided by generation 1.
    policy.write_bytes(policy.read_bytes() + b"\n---\n" +
                       (LIBRARY / "require-queue-label.yaml").read_bytes())
    assert store.check().outcome == "retry" and store.check().outcome == "loaded"
    second = store.current
    assert (first.generation, second.generation) == (1, 2)
    assert first.digest != second.digest

    async def main():
        timer = ManualTimer()
        adm = admitter(timer)
        adm.store = store
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=2.5)
        try:
            body = SAMPLE.read_bytes()
            old = await in_worker(pool, adm, body, Endpoint.VALIDATE, first)  # arrived first
            new = await in_worker(pool, adm, body, Endpoint.VALIDATE, second)
            envelope = wire.decode_envelope(body, max_depth=100)
            review = adm.review_input(envelope)
            expected = []
            for snapshot in (first, second):
                verdict = snapshot.engine.evaluate(review, mutate=False, validate=True)
                expected.append(verdict.denied_by)
        finally:
            pool.shutdown()
        return old, new, expected

    old, new, expected = asyncio.run(main())
    assert old[1][7] == expected[0] == ("gpu-requests-equal-limits",)  # denied_by
    assert new[1][7] == expected[1]


def _stale(job: Evaluation):
    """A worker told of a generation whose recipe builds another set."""
    from dataclasses import replace
    return evaluate_job(replace(job, digest="sha256:" + "0" * 64))


def test_a_recipe_that_builds_another_set_is_refused_not_evaluated():
    async def main():
        timer = ManualTimer()
        adm = admitter(timer)
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=2.5,
                                   evaluate=_stale)
        try:
            return await in_worker(pool, adm, SAMPLE.read_bytes(), Endpoint.VALIDATE)
        finally:
            pool.shutdown()

    _, decision = asyncio.run(main())
    allowed, kind, message, reason = decision[:4]
    assert (allowed, kind, reason) == (False, "denied", "InternalError")
    assert "is not generation 1" in message


def _crash_first(job: Evaluation):
    if job.token == 1:
        os._exit(3)
    return evaluate_job(job)


def _raise_first(job: Evaluation):
    if job.token == 1:
        raise RuntimeError("engine bug")
    return evaluate_job(job)


@pytest.mark.parametrize("worker", [_crash_first, _raise_first], ids=["exits", "raises"])
def test_a_failing_worker_denies_with_a_status_and_the_pool_recovers(worker):
    async def main():
        timer = ManualTimer()
        adm = admitter(timer)
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=2.5,
                                   evaluate=worker)
        try:
            body = SAMPLE.read_bytes()
            failed = await in_worker(pool, adm, body, Endpoint.VALIDATE)
            after = await in_worker(pool, adm, body, Endpoint.VALIDATE)
            expected = await in_process(adm, body, Endpoint.VALIDATE)
            return failed, after, expected, pool.replaced
        finally:
            pool.shutdown()

    failed, after, expected, replaced = asyncio.run(main())
    allowed, kind, message, reason = failed[1][:4]
    assert (allowed, kind, reason) == (False, "denied", "InternalError")
    assert message.startswith("gpuguard: the evaluation failed")
    wire_answer = wire.response(wire.Envelope("admission.k8s.io/v1", "u", {}), allowed=allowed,
                                message=message, reason=reason)
    assert wire_answer["response"]["status"]["code"] == 500  # a Kubernetes Status, not a 5xx
    assert after == expected
    assert replaced == (1 if worker is _crash_first else 0)


def _hang(mark: str, job: Evaluation):
    Path(mark).write_text("running")
    time.sleep(3600)  # killed when the pool replaces the process


def test_a_hung_worker_is_answered_at_the_deadline_and_replaced(tmp_path: Path):
    mark = tmp_path / "mark"

    async def main():
        timer = ManualTimer()
        adm = admitter(timer)
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=5.0,
                                   evaluate=functools.partial(_hang, str(mark)))
        try:
            task = asyncio.create_task(in_worker(pool, adm, SAMPLE.read_bytes(),
                                                 Endpoint.VALIDATE))
            # Wait (bounded, not timed) until the job is known to run in the worker.
            for _ in range(12_000):
                if mark.exists() or task.done():
                    break
                await asyncio.sleep(0.01)
            assert mark.exists() and not task.done()
            timer.advance(2.5)  # the deadline
            answer = await task
            assert pool.replaced == 0 and pool.turns.locked()  # held by the abandoned job
            timer.advance(5.0)  # the grace: the worker is replaced
            await pool.turns.acquire()
            replaced = pool.replaced
            pool.turns.release()
            return answer, replaced
        finally:
            pool.shutdown()

    (_, decision), replaced = asyncio.run(main())
    allowed, kind, message = decision[:3]
    assert not allowed and kind == "denied"
    assert "did not finish within the 2500 ms deadline" in message
    assert "gpu-requests-equal-limits" in message  # a failurePolicy Fail policy of the library
    assert decision[9] == "deadline"
    assert replaced == 1


def test_the_server_sends_large_requests_to_the_processes_and_keeps_small_ones():
    big = bodies()[-3]
    duplicate = big.replace(b'"uid": "', b'"uid": "x", "uid": "', 1)
    assert len(big) > ServerSettings().inline_max_bytes

    async def answers(processes: int):
        store = PolicyStore(None, LOADER)
        server = Server(ServerSettings(host="127.0.0.1", port=0, shutdown_delay_s=0.0,
                                       eval_processes=processes),
                        store, StaticNamespaces({}, "test"), None, timer=ManualTimer())
        await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                out = []
                for body in (SAMPLE.read_bytes(), big, duplicate):
                    async with session.post(f"http://127.0.0.1:{server.port}/validate",
                                            data=body, headers={
                                                "Content-Type": "application/json"}) as r:
                        out.append((r.status, await r.json()))
                sent = server.processes._token if server.processes is not None else None
            return out, sent
        finally:
            await server.shutdown()

    threads, _ = asyncio.run(answers(0))
    processes, sent = asyncio.run(answers(1))
    assert processes == threads
    assert [status for status, _ in processes] == [200, 200, 400]
    assert processes[2][1]["kind"] == "Status"
    assert processes[2][1]["message"].startswith("request.uid: duplicate key")
    assert sent == 2  # the two large bodies; the sample pod stayed in this process


def test_a_large_request_past_its_deadline_waiting_for_a_process_turn_gives_the_turn_back():
    big = bodies()[-3]

    async def main():
        clock = [0.0]
        harness = Harness(None, authorizer=Unavailable("standalone"),
                          settings=ServerSettings(port=0))
        pool = EvaluationProcesses(1, harness.timer, worker_deadline=False, grace_s=2.5)
        app = build_app(harness.admitter, harness.health, harness.metrics, harness.settings,
                        processes=pool, clock=lambda: clock[0])
        server = TestServer(app)
        await server.start_server(**handler_args(keepalive_s=120.0))
        handlers = app[HANDLERS_KEY]

        async def post():
            async with aiohttp.ClientSession() as session, session.post(
                    server.make_url("/validate"), data=big,
                    headers={"Content-Type": "application/json"}) as response:
                return response.status, await response.json()

        try:
            await pool.turns.acquire()  # another large request holds the only turn
            late = asyncio.create_task(post())
            for _ in range(12_000):  # bounded wait until it waits for the turn
                if handlers.large_in_flight == 1:
                    break
                await asyncio.sleep(0.01)
            clock[0] = 3.0  # past its 2.5 s deadline
            pool.turns.release()
            first = await late
            # With the turn lost, this one would wait for ever: bounded, not timed.
            second = await asyncio.wait_for(post(), 300)
        finally:
            pool.shutdown()
            await server.close()
            harness.close()
        return first, second

    (status, body), (again, answer) = asyncio.run(main())
    assert status == 429 and body["kind"] == "Status" and "past its 2500 ms deadline" in \
        body["message"]
    assert again == 200 and answer["response"]["allowed"] is False  # decided in the process


@pytest.mark.parametrize(("growth", "replaced"), [(-1.0, 1), (1000.0, 0)],
                         ids=["grew", "did-not-grow"])
def test_an_idle_process_that_kept_memory_of_a_burst_is_replaced(growth, replaced):
    async def main():
        timer = ManualTimer()
        adm = admitter(timer)
        pool = EvaluationProcesses(1, timer, worker_deadline=False, grace_s=2.5, quiet_s=5.0,
                                   recycle_growth=growth)
        try:
            pool.warm(adm.store.current)
            before = await in_worker(pool, adm, SAMPLE.read_bytes(), Endpoint.VALIDATE)
            assert pool._slots[0].baseline > 0  # known once the warm-up job ran
            pool._slots[0].settled = True  # as after its first idle check (its working set)
            timer.advance(4.9)
            await asyncio.sleep(0)
            assert pool.replaced == 0  # not quiet long enough yet
            timer.advance(0.1)
            for _ in range(12_000):  # bounded wait for the idle check to end
                if pool._idle_check.done():
                    break
                await asyncio.sleep(0.01)
            assert pool._idle_check.done()
            after = await in_worker(pool, adm, SAMPLE.read_bytes(), Endpoint.VALIDATE)
            return before, after, pool.replaced
        finally:
            pool.shutdown()

    before, after, count = asyncio.run(main())
    assert count == replaced
    assert after == before  # a replaced process answers as the one before it
