"""What the test fakes of kube-apiserver share: an aiohttp app on 127.0.0.1 in its own thread,
Kubernetes Status errors, and a kubeconfig pointing at it."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Self

from aiohttp import web

START_S = 60.0  # upper bound of starting / stopping the server thread; never about speed


class ThreadedAPIServer:
    """Base of the fakes: subclasses build ``_app()`` and may prepare the loop in
    ``_on_loop()``. Use as a context manager; ``port`` is set once it serves."""

    thread_name = "fake-api"
    user = "gpuguard"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def _app(self) -> web.Application:
        raise NotImplementedError

    def _on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called in the server thread before serving (e.g. to make asyncio queues)."""

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}
        return web.json_response(body, status=code)

    def __enter__(self) -> Self:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._on_loop(loop)
            runner = web.AppRunner(self._app(), access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        self._thread.start()
        assert started.wait(START_S), f"{self.thread_name} did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(START_S)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, context: str = "fake",
                   extra_contexts: tuple[str, ...] = ()) -> Path:
        """Write a kubeconfig for this server (token auth, plain HTTP) and return its path."""
        contexts: list[dict[str, Any]] = [
            {"name": name, "context": {"cluster": "fake", "user": self.user}}
            for name in (context, *extra_contexts)
        ]
        config = {"apiVersion": "v1", "kind": "Config", "current-context": context,
                  "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                  "users": [{"name": self.user, "user": {"token": "fake-token"}}],
                  "contexts": contexts}
        path.write_text(json.dumps(config))
        return path
