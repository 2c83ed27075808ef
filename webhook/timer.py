"""The monotonic clock the server measures request deadlines, time slices and its shutdown
delay on, and waits against.

Owns reading that clock (any thread may: the engine's ``expired`` check runs in the evaluation
pool) and the two ways the event loop waits on it: a timeout around an awaited result and a
sleep. :class:`MonotonicTimer` is the process's monotonic clock (``time.monotonic``, the clock
asyncio's event loop uses). Tests inject a timer they advance by hand, so that no answer depends
on how fast or how loaded the machine is.

Must not know about requests, policies or HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Timer(Protocol):
    """A monotonic clock in seconds (its zero is arbitrary), and waiting on it."""

    def now(self) -> float:
        """The current time, in seconds; safe to call from any thread."""
        ...

    def timeout_at(self, when: float) -> contextlib.AbstractAsyncContextManager[object]:
        """An ``async with`` block that is cancelled, raising ``TimeoutError``, once
        :meth:`now` reaches ``when`` (as :func:`asyncio.timeout_at`; already past: at once).
        Call it and enter it on the event loop."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once :meth:`now` has advanced by ``seconds``."""
        ...


class MonotonicTimer:
    """The process's monotonic clock (``time.monotonic``)."""

    def now(self) -> float:
        """``time.monotonic()``, in seconds."""
        return time.monotonic()

    def timeout_at(self, when: float) -> contextlib.AbstractAsyncContextManager[object]:
        """:func:`asyncio.timeout` for the seconds left until ``when`` (negative: at once)."""
        return asyncio.timeout(when - time.monotonic())

    async def sleep(self, seconds: float) -> None:
        """:func:`asyncio.sleep`."""
        await asyncio.sleep(seconds)
