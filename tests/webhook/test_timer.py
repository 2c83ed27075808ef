"""The server's deadline clock (:mod:`webhook.timer`) and the manual one the tests drive it with
(:class:`tests.fakes.fake_timer.ManualTimer`): what expires, and when, in readings of the clock — never
in seconds of the machine."""

import asyncio

import pytest

from tests.fakes.fake_timer import ManualTimer
from webhook.timer import MonotonicTimer

pytestmark = pytest.mark.asyncio
WAIT_S = 30.0


async def test_monotonic_timeout_already_past_expires_at_once():
    timer = MonotonicTimer()
    never = asyncio.Event()
    with pytest.raises(TimeoutError):
        async with timer.timeout_at(timer.now() - 1.0):
            await never.wait()


async def test_monotonic_timeout_not_reached_lets_the_result_through():
    timer = MonotonicTimer()
    async with timer.timeout_at(timer.now() + 3600.0):
        assert await asyncio.sleep(0, "result") == "result"


async def test_manual_timeout_expires_only_when_advanced_past_it():
    timer = ManualTimer()
    never = asyncio.Event()
    entered = asyncio.Event()

    async def guarded():
        async with timer.timeout_at(timer.now() + 0.05):
            entered.set()
            await never.wait()

    task = asyncio.create_task(guarded())
    await entered.wait()
    timer.advance(0.04)  # short of it: nothing becomes due
    assert timer._waiters and not task.done()
    # From another thread (as an evaluation in the pool would): the loop wakes it.
    await asyncio.to_thread(timer.advance, 0.01)
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(TimeoutError):
            await task
    assert not timer._waiters


async def test_manual_timeout_reached_before_it_is_entered_expires_at_once():
    timer = ManualTimer()
    when = timer.now() + 0.05
    timer.advance(1.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(WAIT_S), timer.timeout_at(when):
            await asyncio.Event().wait()


async def test_manual_timeout_left_in_time_does_not_cancel_later():
    timer = ManualTimer()
    async with timer.timeout_at(timer.now() + 0.05):
        pass
    timer.advance(1.0)  # the block is over: waking it must do nothing
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert asyncio.current_task().cancelling() == 0


async def test_manual_sleep_ends_when_the_timer_has_moved_by_its_length():
    timer = ManualTimer()
    sleeper = asyncio.create_task(timer.sleep(0.3))
    await asyncio.sleep(0)
    timer.advance(0.2)
    await asyncio.sleep(0)
    assert not sleeper.done()  # 0.2 of 0.3 s: nothing became due
    timer.advance(0.1)
    async with asyncio.timeout(WAIT_S):
        await sleeper
    assert timer.now() == pytest.approx(1000.3)
