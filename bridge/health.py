"""The health and metrics HTTP server on ``SEB_LISTEN``: /healthz, /readyz, /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bridge.metrics import Metrics

__all__ = ["HealthServer"]


class HealthServer:
    """``ready`` returns (ok, reasons) and decides /readyz."""

    def __init__(
        self, host: str, port: int, metrics: Metrics, ready: Callable[[], tuple[bool, list[str]]]
    ) -> None:
        self.host = host
        self.port = port
        self.metrics = metrics
        self.ready = ready
        self.started = time.time()
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the real port when 0 was asked
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "uptime": round(time.time() - self.started, 1)})

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, reasons = self.ready()
        return web.json_response(
            {"status": "ready" if ok else "not ready", "reasons": reasons},
            status=200 if ok else 503,
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
