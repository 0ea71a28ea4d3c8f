"""The service's HTTP endpoint: liveness, readiness, Prometheus metrics and the admin snapshot.

=================  ============================================================================
``GET /healthz``   200 while the event loop answers (liveness)
``GET /readyz``    200 when every informer has synced and can list and watch, and every sink is
                   connected, else 503 with the reasons as JSON (``informer X cannot list or
                   watch: ServerError: …`` while its last list/watch failed and it has made no
                   progress since); a standby replica (leader election) is ready: it serves
                   metrics and waits
``GET /metrics``   Prometheus text exposition (OpenTelemetry Prometheus reader)
``POST /snapshot`` asks the leader for a resync snapshot (``?resource=pods`` for one resource);
                   202 with the resources snapshotted, 409 on a standby
=================  ============================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

__all__ = ["HealthServer", "Readiness"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...] = ()
    role: str = "leader"
    """"leader", "standby" or "single"."""


class HealthServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        metrics: Callable[[], bytes],
        snapshot: Callable[[str | None], Awaitable[list[str]]] | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._readiness = readiness
        self._metrics = metrics
        self._snapshot = snapshot
        self._runner: web.AppRunner | None = None
        self.port = port

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_handler)
        app.router.add_post("/snapshot", self._snapshot_handler)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("health endpoint listening", extra={"host": self._host, "port": self.port})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        r = self._readiness()
        body = orjson.dumps({"ready": r.ready, "role": r.role, "reasons": list(r.reasons)})
        return web.Response(body=body, status=200 if r.ready else 503, content_type="application/json")

    async def _metrics_handler(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _snapshot_handler(self, request: web.Request) -> web.Response:
        if self._snapshot is None:
            return web.json_response({"error": "this replica is not running the bridge (standby)"},
                                     status=409)
        resource = request.query.get("resource") or None
        try:
            done = await self._snapshot(resource)
        except LookupError as e:
            return web.json_response({"error": str(e)}, status=404)
        return web.json_response({"snapshot": "requested", "resources": done}, status=202)

    def set_snapshot_handler(self, handler: Callable[[str | None], Awaitable[list[str]]] | None) -> None:
        self._snapshot = handler
