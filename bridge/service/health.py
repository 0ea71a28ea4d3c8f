"""The service's HTTP endpoints: liveness, readiness and Prometheus metrics on the public listener,
the mutating admin endpoint on a listener of its own.

The public listener (``server.host`` / ``server.port``, what the Service and the probes reach):

=================  ============================================================================
``GET /healthz``   200 while the event loop answers (liveness), during a shutdown as well
``GET /readyz``    200 when every informer has synced and can list and watch, and every sink is
                   connected, else 503 with the reasons' kinds as JSON (``starting`` until every
                   informer is built; ``informer X cannot list or watch`` while its last
                   list/watch failed and it has made no progress since; ``sink X unhealthy``;
                   ``stopping`` alone from SIGTERM on, while the shutdown drains, until the
                   listener closes); the details (the error, a receiver's answer) are withheld
                   here, as kube-apiserver does: they go to the logs and to the admin listener's
                   ``GET /readyz``. A standby replica (leader election) is ready: it serves
                   metrics and waits
``GET /metrics``   Prometheus text exposition (OpenTelemetry Prometheus reader)
=================  ============================================================================

The admin listener (``server.admin_host`` / ``server.admin_port``, by default ``127.0.0.1:8081``:
reachable only from inside the pod, i.e. through ``kubectl port-forward``, never through the Service
or another pod, with or without a service-mesh sidecar):

=================  ============================================================================
``GET /readyz``    the public ``/readyz`` with each reason in full
``POST /snapshot`` asks the leader for a resync snapshot (``?resource=pods`` for one resource,
                   ``?sink=NAME`` for one sink alone);
                   202 with the resources snapshotted, 409 on a standby
=================  ============================================================================

With ``server.admin_token_file`` every admin request must also carry ``Authorization: Bearer
<token>`` (401 otherwise); the file is read on every request, so a rotated Secret takes effect
without a restart. The public listener answers ``POST /snapshot`` with 403 and where to go instead.

Either port may be 0: the kernel picks a free one, which the ``... endpoint listening`` log lines
name, and which ``server.address_file`` (when set) receives as JSON once both listeners listen
(``{"pid", "host", "port", "admin_host", "admin_port"}``, written whole by a rename), so that
whatever started the process can reach it without picking a port that another process may take first.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from bridge.errors import ConfigurationError

__all__ = ["HealthServer", "Readiness", "reason_kind"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...] = ()
    role: str = "leader"
    """"leader", "standby" or "single"."""


def reason_kind(reason: str) -> str:
    """What the public ``/readyz`` says of a not-ready reason: its kind (``sink hook unhealthy``),
    without the detail after the first ``": "`` or in the closing parentheses (an error, a
    receiver's answer, a backlog). A worker's reasons (``worker 0: …``) keep the worker's number."""
    prefix, sep, rest = reason.partition(": ")
    if sep and prefix.startswith("worker ") and prefix[7:].isdigit():
        return f"{prefix}: {reason_kind(rest)}"
    return prefix.split(" (", 1)[0]


def public_reasons(reasons: Iterable[str]) -> list[str]:
    """The kinds of ``reasons``, each once, in order."""
    return list(dict.fromkeys(reason_kind(r) for r in reasons))


class HealthServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        metrics: Callable[[], bytes],
        snapshot: Callable[..., Awaitable[list[str]]] | None = None,
        admin_host: str = "127.0.0.1",
        admin_port: int = 8081,
        admin_token_file: str | None = None,
        address_file: str | None = None,
        metrics_render: Callable[[], Callable[[], bytes]] | None = None,
    ) -> None:
        """``metrics_render``: called on the event loop at each scrape, returns what renders the
        exposition in a worker thread (``metrics`` is then unused): a scrape of many series never
        holds the loop for its rendering."""
        self._host = host
        self._metrics_render = metrics_render
        self._port = port
        self._readiness = readiness
        self._metrics = metrics
        self._snapshot = snapshot
        self._admin_host = admin_host
        self._admin_token_file = admin_token_file
        self._address_file = address_file
        self._runners: list[web.AppRunner] = []
        self._logged_reasons: tuple[str, ...] = ()
        self.port = port
        self.admin_port = admin_port

    def app(self) -> web.Application:
        """The public listener's application."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_handler)
        app.router.add_post("/snapshot", self._not_here)
        return app

    def admin_app(self) -> web.Application:
        """The admin listener's application: every route behind :meth:`_authorized`."""
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/readyz", self._readyz_detail)
        app.router.add_post("/snapshot", self._snapshot_handler)
        return app

    async def start(self) -> None:
        """Listens on both ports; one that cannot be bound (another process holds it, say) is a
        :class:`ConfigurationError` naming its field, and neither listener is left open."""
        try:
            self.port = await self._serve(self.app(), self._host, self.port, "server.port")
            self.admin_port = await self._serve(self.admin_app(), self._admin_host, self.admin_port,
                                                "server.admin_port")
        except ConfigurationError:
            await self.stop()
            raise
        log.info("health endpoint listening", extra={"host": self._host, "port": self.port})
        log.info("admin endpoint listening", extra={
            "host": self._admin_host, "port": self.admin_port,
            "auth": "bearer token" if self._admin_token_file else "none (loopback only)"})
        if self._address_file:
            self._write_address(Path(self._address_file))

    def _write_address(self, path: Path) -> None:
        """The bound addresses as JSON, written to a temporary file and renamed (never seen half)."""
        body = {"pid": os.getpid(), "host": self._host, "port": self.port,
                "admin_host": self._admin_host, "admin_port": self.admin_port}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps(body))
        os.replace(tmp, path)

    async def _serve(self, app: web.Application, host: str, port: int, name: str) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            raise ConfigurationError(_cannot_listen(name, host, port, e)) from e
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    def _token(self) -> bytes | None:
        """The admin token, read now (a rotated Secret applies at once); None when unreadable."""
        if self._admin_token_file is None:
            return None
        try:
            token = Path(self._admin_token_file).read_bytes().strip()
        except OSError as e:
            log.error("cannot read server.admin_token_file %s: %s", self._admin_token_file, e.strerror)
            return None
        return token or None

    @web.middleware
    async def _authorize(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._admin_token_file is not None:
            expected = self._token()
            given = request.headers.get("Authorization", "")
            scheme, _, presented = given.partition(" ")
            if (expected is None or scheme.lower() != "bearer"
                    or not hmac.compare_digest(presented.strip().encode(), expected)):
                return web.json_response({"error": "a valid 'Authorization: Bearer <token>' is required"},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def _not_here(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"error": "POST /snapshot is served on the admin listener (server.admin_host:admin_port, "
                      "127.0.0.1:8081 by default): use kubectl port-forward and "
                      "'kube-event-bridge snapshot'"},
            status=403)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        r = self._readiness()
        self._log_reasons(r.reasons)
        body = orjson.dumps({"ready": r.ready, "role": r.role, "reasons": public_reasons(r.reasons)})
        return web.Response(body=body, status=200 if r.ready else 503, content_type="application/json")

    async def _readyz_detail(self, _: web.Request) -> web.Response:
        r = self._readiness()
        body = orjson.dumps({"ready": r.ready, "role": r.role, "reasons": list(r.reasons)})
        return web.Response(body=body, status=200 if r.ready else 503, content_type="application/json")

    def _log_reasons(self, reasons: tuple[str, ...]) -> None:
        """The details the public answer withholds, logged when they change (not on every probe)."""
        if reasons != self._logged_reasons:
            self._logged_reasons = reasons
            if reasons:
                log.info("not ready: %s", "; ".join(reasons), extra={"reasons": list(reasons)})

    async def _metrics_handler(self, _: web.Request) -> web.Response:
        if self._metrics_render is not None:
            render = self._metrics_render()
            body = await asyncio.get_running_loop().run_in_executor(None, render)
        else:
            body = self._metrics()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _snapshot_handler(self, request: web.Request) -> web.Response:
        if self._snapshot is None:
            return web.json_response({"error": "this replica is not running the bridge (standby)"},
                                     status=409)
        resource = request.query.get("resource") or None
        sink = request.query.get("sink") or None
        try:
            done = await (self._snapshot(resource, sink) if sink else self._snapshot(resource))
        except LookupError as e:
            return web.json_response({"error": str(e)}, status=404)
        return web.json_response({"snapshot": "requested", "resources": done}, status=202)

    def set_snapshot_handler(self, handler: Callable[..., Awaitable[list[str]]] | None) -> None:
        self._snapshot = handler


def _cannot_listen(name: str, host: str, port: int, e: OSError) -> str:
    """What to tell the operator when ``host:port`` (the ``name`` field) cannot be bound."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    host_field = "server.admin_host" if name == "server.admin_port" else "server.host"
    if e.errno == errno.EADDRINUSE:
        return (f"{name}: cannot listen on {address}: address already in use (another process "
                f"holds it, perhaps another kube-event-bridge); stop that process, or choose another "
                f"{name} (0 lets the kernel pick a free port, which server.address_file reports)")
    reason = os.strerror(e.errno).lower() if e.errno else str(e)
    return (f"{name}: cannot listen on {address}: {reason}; check {host_field} and {name} "
            "(a port below 1024 needs privileges; the host must be an address of this machine)")
