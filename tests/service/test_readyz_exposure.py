"""What ``/readyz`` tells whoever reaches the public port: the kind of each reason only (``sink hook
unhealthy``), never the sink's error, its URL's path or query (a Slack-style token) or the start of
the receiver's answer (which may echo the request's headers). The detail is the admin listener's,
behind its token; URLs in it and in the logs keep scheme, host and port only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.health import reason_kind
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from tests.service.test_service import eventually

pytestmark = pytest.mark.usefixtures("own_cwd")

PATH_SECRET = "T0PATHSECRET/B0PATHSECRET"
QUERY_SECRET = "QUERYSECRET0"
TOKEN = "BEARERSECRET0"


@pytest.fixture
async def echoing() -> AsyncIterator[int]:
    """A receiver (the kit's) answering 500 with the request's headers in its body."""
    async def respond(request: ReceivedRequest) -> Reply:
        return Reply(500, body=f"refused; you sent {dict(request.headers)!r}".encode())

    async with WebhookReceiver(path="", respond=respond) as hook:
        yield hook.port


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers or {}) as r:
        return r.status, await r.text()


async def test_public_readyz_names_the_kind_and_the_admin_listener_the_detail(
        tmp_path: Path, echoing: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    admin_token = tmp_path / "admin-token"
    admin_token.write_text("admin-s3cret\n")
    async with Simulator() as sim:
        sim.store.create("pods", make_pod("p0", "default"))
        config = BridgeConfig.model_validate({
            "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
            "resources": [{"resource": "pods"}],
            "sinks": [{"name": "hook", "kind": "webhook",
                       "url": f"http://127.0.0.1:{echoing}/services/{PATH_SECRET}?token={QUERY_SECRET}",
                       "auth": {"bearer_token": TOKEN}, "retry": {"initial": 0.05, "max": 0.2}}],
            "checkpoint": {"store": "none"},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0,
                       "admin_token_file": str(admin_token)},
            "shutdown_deadline": 5,
        })
        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: any(r.startswith("sink hook unhealthy: ") and "HTTP 500" in r
                                         for r in service.readiness().reasons),
                             timeout=30, what="the sink to fail")
            status, public = await _get(f"http://127.0.0.1:{service.health.port}/readyz")
            assert status == 503
            assert orjson.loads(public)["reasons"] == ["sink hook unhealthy"]
            for secret in ("PATHSECRET", QUERY_SECRET, TOKEN, "HTTP 500", "/services"):
                assert secret not in public
            admin = f"http://127.0.0.1:{service.health.admin_port}/readyz"
            status, _ = await _get(admin)
            assert status == 401
            status, detail = await _get(admin, {"Authorization": "Bearer admin-s3cret"})
            assert status == 503
            (reason,) = orjson.loads(detail)["reasons"]
            assert reason.startswith("sink hook unhealthy: ")
            assert f"HTTP 500 from http://127.0.0.1:{echoing}: refused" in reason
            assert TOKEN not in reason  # the receiver echoed it: the sink's own credentials are masked
            assert "PATHSECRET" not in detail
            assert QUERY_SECRET not in detail
        finally:
            service.stop_event.set()
            await asyncio.wait_for(task, 30)
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records
                       if r.name.split(".")[0] in ("bridge", "sinks"))
    assert "sink hook unhealthy: " in logged  # the detail the public answer withholds
    for secret in ("PATHSECRET", QUERY_SECRET, TOKEN):
        assert secret not in logged


@pytest.mark.parametrize(("reason", "kind"), [
    ("starting", "starting"),
    ("informer pods cannot list or watch: ServerError: HTTP 500 …", "informer pods cannot list or watch"),
    ("sink hook unhealthy (3 changes waiting, 0 bytes spilled)", "sink hook unhealthy"),
    ("sink hook unhealthy: HTTP 500 from http://h: echo (1 changes waiting, 0 bytes spilled)",
     "sink hook unhealthy"),
    ("informer pods stalled: no event for 300 s", "informer pods stalled"),
    ("stored resourceVersion ahead of the API server: list pods (…)",
     "stored resourceVersion ahead of the API server"),
    ("worker 1: sink hook unhealthy: HTTP 500", "worker 1: sink hook unhealthy"),
    ("worker 0: not answering (ClientConnectorError: …)", "worker 0: not answering"),
])
def test_the_kind_of_each_reason(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind
