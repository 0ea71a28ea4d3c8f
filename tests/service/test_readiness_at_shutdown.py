"""``GET /readyz`` during a graceful shutdown: 503 ("stopping") from the SIGTERM on, while the sinks
drain and the final checkpoint is written, until the health endpoint closes, so that a pod being
terminated leaves the Service's endpoints at once; ``GET /healthz`` stays 200 all along (the process
still answers: a liveness failure now would only get it killed before its final checkpoint).

The bridge runs as ``kube-event-bridge run`` in its own process against the simulator over HTTP; its
webhook sink posts to a receiver that answers slowly, one request at a time, so that the drain after
the SIGTERM takes a visible while."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from tests.brokers import free_port

EXE = [sys.executable, "-m", "bridge.service.cli"]
ROOT = Path(__file__).resolve().parents[2]
PODS = 20
ANSWER_AFTER = 0.15
"""Seconds the receiver takes to answer each POST."""


class SlowHook:
    """A webhook receiver that takes :data:`ANSWER_AFTER` seconds to acknowledge each event."""

    def __init__(self) -> None:
        self.received = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(ANSWER_AFTER)
        self.received += 1
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def slow_hook() -> AsyncIterator[SlowHook]:
    h = SlowHook()
    await h.start()
    yield h
    await h.stop()


def write_config(tmp_path: Path, kubeconfig: Path, hook: SlowHook, port: int) -> Path:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods, namespace: default}]\n"
        f"sinks: [{{name: hook, kind: webhook, url: 'http://127.0.0.1:{hook.port}/events',\n"
        "          max_in_flight: 1}]\n"
        # A long interval: only the shutdown writes the checkpoint.
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 3600}}\n"
        f"server: {{host: 127.0.0.1, port: {port}, admin_port: 0}}\n"
        "logging: {level: info, format: json}\n"
        "shutdown_deadline: 10\n")
    return cfg


async def probe(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any] | str] | None:
    """The status and body of a GET, or None once nothing listens any more."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            text = await r.text()
            return r.status, (orjson.loads(text) if r.content_type == "application/json" else text)
    except (aiohttp.ClientConnectionError, TimeoutError):
        return None


async def test_readyz_answers_503_stopping_from_sigterm_until_the_endpoint_closes_healthz_stays_200(
        tmp_path: Path, slow_hook: SlowHook) -> None:
    async with Simulator() as sim:
        for i in range(PODS):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        port = free_port()
        cfg = write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kubeconfig"), slow_hook, port)
        log_path = tmp_path / "bridge.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *EXE, "run", "--config", str(cfg), cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
        ready = f"http://127.0.0.1:{port}/readyz"
        live = f"http://127.0.0.1:{port}/healthz"
        readyz: list[tuple[int, Any, int]] = []
        """After the SIGTERM: (status, body, events the receiver had acknowledged by then)."""
        healthz: list[tuple[int, Any]] = []
        try:
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + 60
                while True:  # ready, and the receiver has acknowledged a few events, not all
                    assert proc.returncode is None, log_path.read_text()
                    assert time.monotonic() < deadline, "never ready: " + log_path.read_text()[-2000:]
                    answer = await probe(http, ready)
                    if answer is not None and answer[0] == 200 and slow_hook.received >= 2:
                        break
                    await asyncio.sleep(0.05)
                at_sigterm = slow_hook.received
                assert at_sigterm < PODS - 5, "the receiver was not slow enough to leave a drain"
                proc.send_signal(signal.SIGTERM)
                while True:
                    # Judged from the bridge's handling of the signal on (its "shutting down" line
                    # follows it): a probe that reaches it before its loop ran the handler is answered
                    # as before, which a loaded machine makes happen.
                    handled = "shutting down" in log_path.read_text()
                    r, h = await probe(http, ready), await probe(http, live)
                    if r is not None and handled:
                        readyz.append((r[0], r[1], slow_hook.received))
                    if h is not None:
                        healthz.append(h)
                    if r is None and h is None:
                        break
                    assert time.monotonic() < deadline + 30, "the health endpoint never closed"
                    await asyncio.sleep(0.02)
            code = await asyncio.wait_for(proc.wait(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    logs = log_path.read_text()
    assert code == 0, logs[-2000:]
    not_stopping = [(s, b) for s, b, _ in readyz if (s, b) != (503, {"ready": False, "role": "single",
                                                                      "reasons": ["stopping"]})]
    assert not not_stopping, f"/readyz after the SIGTERM: {not_stopping[:5]} of {len(readyz)} answers"
    # The drain went on (the receiver acknowledged more) while /readyz answered 503.
    assert len(readyz) >= 5
    assert readyz[-1][2] > readyz[0][2], f"no delivery during the drain: {readyz[0][2]} -> {readyz[-1][2]}"
    assert healthz
    assert all(h == (200, "ok\n") for h in healthz), healthz[:5]
    assert len(healthz) >= len(readyz) - 1
    assert list((tmp_path / "cp").glob("*.ckpt")), "no final checkpoint"
