"""Handing memory back to the operating system after a burst of large requests.

Owns :func:`fix_mmap_threshold` and :class:`MemoryReturn`. A burst of large AdmissionReviews (each
up to 3 MiB, decoded into many Python objects) raises the process's resident memory by hundreds
of MiB. Python gives the memory back to the C allocator when the requests end, but glibc's malloc
keeps most of it: after the first large block (allocated with ``mmap``) is freed, it raises its
mmap threshold to that block's size, so later blocks up to 32 MiB come from the heap arenas, whose
free pages stay resident. Two measures, both for glibc only (elsewhere — musl, macOS — nothing is
done):

- :func:`fix_mmap_threshold` pins the threshold (``mallopt(M_MMAP_THRESHOLD, 128 KiB)``, glibc's
  initial value; pinning it turns the dynamic raise off): a request body, a decoded string, a TLS
  buffer of 128 KiB or more is its own mapping and goes back to the system when freed.
- :class:`MemoryReturn`, once no large request has been in flight for ``quiet_s`` seconds (so a
  sustained load is not trimmed on every request) and when asked after connections were
  closed, first runs a full garbage collection on the event loop — objects of finished requests
  caught in reference cycles (aiohttp's request, protocol and payload objects refer to each
  other; an exception refers to its frames) would otherwise hold their bodies until a full
  collection, which a server whose start-up objects are frozen (``gc.freeze``) seldom reaches:
  measured, 200 MiB after a burst — then calls ``malloc_trim(0)`` in a thread (it can take
  milliseconds on a large heap), which returns the free pages inside every arena (what smaller
  objects leave).

Must not decide what a large request is (:mod:`webhook.app` says when one begins and ends).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Callable

LOG = logging.getLogger("gpuguard.webhook.memory")
QUIET_S = 1.0
MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's initial ``M_MMAP_THRESHOLD`` (``DEFAULT_MMAP_THRESHOLD_MIN``), kept fixed."""
_M_MMAP_THRESHOLD = -3  # malloc.h


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def fix_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold at ``size`` bytes for this process (see module docstring).

    Returns whether it was set (False without glibc's ``mallopt``).
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None or not hasattr(libc, "malloc_trim"):  # not glibc: leave it alone
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, size))


def _glibc_trim() -> Callable[[], bool] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> bool:
        return bool(trim(0))
    return run


MALLOC_TRIM = _glibc_trim()
"""glibc's ``malloc_trim(0)`` (returns whether memory was released), or None without glibc."""


class MemoryReturn:
    """Trims the heap after bursts of large requests (see module docstring).

    Args:
        trim: the trimming call (default glibc's ``malloc_trim(0)``; None: never trim).
        quiet_s: seconds with no large request in flight before trimming.
        on_trim: called on the event loop after each trim (e.g. a metric).
        collect: the garbage collection run first, on the event loop (default ``gc.collect``).
    """

    def __init__(self, trim: Callable[[], bool] | None = MALLOC_TRIM, *,
                 quiet_s: float = QUIET_S, on_trim: Callable[[], None] | None = None,
                 collect: Callable[[], object] = gc.collect) -> None:
        self.trim = trim
        self.quiet_s = quiet_s
        self.on_trim = on_trim
        self.collect = collect
        self.in_flight = 0
        self._pending: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[bool] | None = None

    def begin(self) -> None:
        """A large request starts (call on the event loop)."""
        self.in_flight += 1
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def end(self) -> None:
        """A large request ended; the last of a burst schedules a trim."""
        self.in_flight -= 1
        self.request()

    def request(self) -> None:
        """Trim after ``quiet_s`` unless a large request is in flight then (call on the event
        loop; e.g. after idle connections were closed)."""
        if self.in_flight == 0 and self.trim is not None and self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.call_later(self.quiet_s, self._start)

    def _start(self) -> None:
        self._pending = None
        if self.in_flight or self.trim is None or self._running is not None:
            return
        # On the loop thread: finalizers of what it frees may touch the loop.
        self.collect()
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(None, self.trim)
        self._running.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[bool]) -> None:
        self._running = None
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            LOG.warning("returning memory to the operating system failed",
                        extra={"fields": {"error": str(error)}})
            return
        if self.on_trim is not None:
            self.on_trim()

    @property
    def trimming(self) -> asyncio.Future[bool] | None:
        """The trim running now, if any (tests await it)."""
        return self._running
