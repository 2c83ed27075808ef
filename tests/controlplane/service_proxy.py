"""A Service address in front of several ``gpuguard serve`` replicas: round-robin TCP on loopback.

In a cluster kube-apiserver reaches the webhook's Service, and kube-proxy spreads the connections
over its endpoints. There is no node and no kube-proxy here, so :class:`RoundRobinProxy` does that
one job: every TCP connection accepted on its port is passed, byte for byte, to the next replica
in turn. TLS is end to end (the API server verifies the replica's own certificate through the
proxy), and nothing is parsed or answered by the proxy itself.

Must not look at or change the bytes it moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Sequence

from tests.controlplane.cluster import free_port


class RoundRobinProxy:
    """Listens on 127.0.0.1 and a free port; connections go to ``upstreams`` in turn.

    Args:
        upstreams: the replicas' ports on 127.0.0.1.

    Attributes:
        port: where it listens.
        connections: per upstream port, how many connections it was given.
    """

    def __init__(self, upstreams: Sequence[int]) -> None:
        self.upstreams = tuple(upstreams)
        self.port = free_port()
        self.connections: Counter[int] = Counter()
        self._next = itertools.cycle(self.upstreams)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, name="round-robin-proxy", daemon=True)

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port, backlog=512))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._server.wait_closed())
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = next(self._next)
        self.connections[upstream] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
