"""A :class:`webhook.timer.Timer` that moves only when a test says so.

A fake for what the real clock cannot do on demand: reach a request's deadline at an exact point
of an evaluation (between two policies, while an evaluation is stuck), or never reach it however
slow or loaded the machine is. With it no answer of the server under test depends on timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType


class ManualTimer:
    """Seconds that pass only through :meth:`advance`, which any thread may call (an evaluation
    in the server's thread pool, say); the timeouts and sleeps it ends wake on their event loop.

    Args:
        start: the initial reading, in seconds.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._waiters: list[tuple[float, asyncio.AbstractEventLoop, Callable[[], None]]] = []

    def now(self) -> float:
        """The current reading, in seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` and wake what became due."""
        with self._lock:
            self._now += seconds
            due = [w for w in self._waiters if w[0] <= self._now]
            self._waiters = [w for w in self._waiters if w[0] > self._now]
        for _when, loop, wake in due:
            loop.call_soon_threadsafe(wake)

    def _at(self, when: float, wake: Callable[[], None]) -> None:
        """Call ``wake`` on the running loop once the reading reaches ``when``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if when > self._now:
                self._waiters.append((when, loop, wake))
                return
        loop.call_soon(wake)

    def timeout_at(self, when: float) -> _Timeout:
        """See :meth:`webhook.timer.Timer.timeout_at`."""
        return _Timeout(self, when)

    async def sleep(self, seconds: float) -> None:
        """See :meth:`webhook.timer.Timer.sleep`."""
        future = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self._at(self._now + seconds, wake)
        await future


class _Timeout:
    """``asyncio.timeout`` that expires when the :class:`ManualTimer` reaches ``when``."""

    def __init__(self, timer: ManualTimer, when: float) -> None:
        self._timer = timer
        self._when = when
        self._inner = asyncio.timeout(None)
        self._inside = False

    async def __aenter__(self) -> _Timeout:
        await self._inner.__aenter__()
        self._inside = True
        self._timer._at(self._when, self._expire)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> bool | None:
        self._inside = False
        return await self._inner.__aexit__(kind, exc, traceback)

    def _expire(self) -> None:
        if self._inside:  # the block may have ended before the wake-up ran
            self._inner.reschedule(asyncio.get_running_loop().time())
