"""Fixtures for the API-access tests: a small scripted HTTP(S) server that records what it is sent,
throwaway TLS certificates made with the openssl CLI, and a clock whose sleeps return at once."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    authorization: str | None
    content_type: str | None
    body: bytes
    accept: str | None = None


@dataclass
class ScriptedServer:
    """A real aiohttp server on 127.0.0.1; ``handler`` answers every request, ``requests`` records
    them in order."""

    handler: Handler
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""
    runner: web.AppRunner | None = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                authorization=request.headers.get("Authorization"),
                content_type=request.headers.get("Content-Type"),
                body=body,
                accept=request.headers.get("Accept"),
            )
        )
        return await self.handler(request)

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def _not_set(request: web.Request) -> web.StreamResponse:
    return web.json_response({"kind": "Status", "code": 500, "message": "no handler"}, status=500)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    srv = ScriptedServer(handler=_not_set)
    yield srv
    await srv.stop()


class InstantClock:
    """A clock whose sleeps return at once but are recorded (REST-layer retry waits)."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return 1_700_000_000.0 + self._now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.load_verify_locations(self.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    for name in ("ca", "other"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}-ca",
                 "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "bridge-client")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        extra = ["-extfile", "san.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra, cwd=d)
    return Certs(
        ca=d / "ca.crt",
        server_cert=d / "server.crt",
        server_key=d / "server.key",
        client_cert=d / "client.crt",
        client_key=d / "client.key",
        other_ca=d / "other.crt",
    )


WIDGET_CRD = {"group": "example.com", "version": "v1", "plural": "widgets", "kind": "Widget",
              "shortNames": ["wd"], "namespaced": True}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    """The API-server simulator with one CRD, on a free port; fast bookmarks and too-large waits."""
    simulator = Simulator(crds=[WIDGET_CRD], bookmark_interval=0.2, too_large_wait=0.05,
                          forbidden=[("", "secrets")])
    await simulator.start()
    yield simulator
    await simulator.stop()


@pytest.fixture
async def sim_client(sim: Simulator) -> AsyncIterator[ApiClient]:
    client = ApiClient(server=sim.url, clock=InstantClock())
    yield client
    await client.close()


def make_pod(
    name: str, namespace: str = "default", labels: dict[str, str] | None = None
) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]},
    }
