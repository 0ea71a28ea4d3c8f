"""``GET /readyz`` during a graceful shutdown: 503 ("stopping") from the SIGTERM on, while the sinks
drain and the final checkpoint is written, until the health endpoint closes, so that a pod being
terminated leaves the Service's endpoints at once; ``GET /healthz`` stays 200 all along (the process
still answers: a liveness failure now would only get it killed before its final checkpoint).

The bridge runs as ``kube-event-bridge run`` in its own process against the simulator over HTTP; its
webhook sink posts to a receiver that answers slowly, one request at a time, so that the drain after
the SIGTERM takes a visible while."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing import Reply, WebhookReceiver
from bridge.testing.processes import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
PODS = 20
ANSWER_AFTER = 0.15
"""Seconds the receiver takes to answer each POST."""


@pytest.fixture
async def slow_hook() -> AsyncIterator[WebhookReceiver]:
    """A webhook receiver that takes :data:`ANSWER_AFTER` seconds to acknowledge each event."""
    async with WebhookReceiver(reply=Reply(200, delay=ANSWER_AFTER)) as h:
        yield h


def write_config(tmp_path: Path, kubeconfig: Path, hook: WebhookReceiver) -> Path:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods, namespace: default}]\n"
        f"sinks: [{{name: hook, kind: webhook, url: 'http://127.0.0.1:{hook.port}/events',\n"
        "          max_in_flight: 1}]\n"
        # A long interval: only the shutdown writes the checkpoint.
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 3600,\n"
        f"             spill_directory: '{tmp_path / 'spill'}'}}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
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
        tmp_path: Path, slow_hook: WebhookReceiver) -> None:
    async with Simulator() as sim:
        for i in range(PODS):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        cfg = write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kubeconfig"), slow_hook)
        log_path = tmp_path / "bridge.log"
        bridge = ServiceProcess(config=cfg, log=log_path, cwd=ROOT)
        await bridge.start()
        readyz: list[tuple[int, Any, int]] = []
        """After the SIGTERM: (status, body, events the receiver had acknowledged by then)."""
        healthz: list[tuple[int, Any]] = []
        try:
            await bridge.wait_listening()
            ready, live = bridge.url("/readyz"), bridge.url("/healthz")
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + 60
                while True:  # ready, and the receiver has acknowledged a few events, not all
                    bridge.check_running("ready")
                    assert time.monotonic() < deadline, "never ready: " + log_path.read_text()[-2000:]
                    answer = await probe(http, ready)
                    if answer is not None and answer[0] == 200 and len(slow_hook.accepted) >= 2:
                        break
                    await asyncio.sleep(0.05)
                at_sigterm = len(slow_hook.accepted)
                assert at_sigterm < PODS - 5, "the receiver was not slow enough to leave a drain"
                bridge.send_signal(signal.SIGTERM)
                # The signal is handled by the service's event loop, not when it is sent: a probe
                # already read by then is answered as before. From the line on, it is handled.
                await bridge.wait_log("shutting down: stopping intake", timeout=20)
                while True:
                    r, h = await probe(http, ready), await probe(http, live)
                    if r is not None:
                        readyz.append((r[0], r[1], len(slow_hook.accepted)))
                    if h is not None:
                        healthz.append(h)
                    if r is None and h is None:
                        break
                    assert time.monotonic() < deadline + 30, "the health endpoint never closed"
                    await asyncio.sleep(0.02)
            code = await bridge.wait(120)  # a hang guard: the endpoint closed, the exit follows
        finally:
            await bridge.kill()
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
