"""``GET /readyz`` while the service starts: 503 ("starting") until the pipeline has built every
configured informer, each has synced and every sink is connected; never a 200 in between.

The API client is throttled (qps 2, burst 1) and the checkpoints are ConfigMaps, so that reading each
resource's checkpoint, which the pipeline does before it builds that resource's informer, takes a
visible time: a readiness that only looked for reasons among the informers already built answered
200 while none existed yet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing import Reply, WebhookReceiver
from tests.service.test_service import eventually, get

pytestmark = pytest.mark.usefixtures("own_cwd")

RESOURCES = ("pods", "configmaps", "services")


@pytest.fixture
async def hook() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(reply=Reply(200)) as h:
        yield h


def throttled_config(sim: Simulator, tmp_path: Path, hook: WebhookReceiver) -> BridgeConfig:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false", "qps": 2, "burst": 1},
        "resources": [{"resource": r} for r in RESOURCES],
        "sinks": [
            {"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")},
            {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "retry": {"initial": 0.05, "max": 0.2}},
        ],
        "checkpoint": {"store": "configmap", "namespace": "default", "interval": 0.5},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


def informers_synced(service: BridgeService) -> bool:
    """Every configured resource has its informer in the running pipeline, synced."""
    pipeline = service._state.pipeline
    if pipeline is None:
        return False
    informers = pipeline.informers
    return len(informers) == len(RESOURCES) and all(inf.has_synced() for inf in informers.values())


async def test_readyz_answers_503_starting_until_every_informer_synced_and_every_sink_is_ready(
        tmp_path: Path, hook: WebhookReceiver) -> None:
    async with Simulator() as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        service = BridgeService(config=throttled_config(sim, tmp_path, hook))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.health.port, what="the health endpoint")
            url = f"http://127.0.0.1:{service.health.port}/readyz"
            answers: list[tuple[int, dict[str, Any]]] = []
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, f"never ready; last answers {answers[-3:]}"
                status, body = await get(url)
                answers.append((status, orjson.loads(body)))
                if status == 200:
                    # Judged after the answer: what had not synced then has not synced now either.
                    pipeline = service._state.pipeline
                    built = sorted(pipeline.informers) if pipeline is not None else None
                    assert informers_synced(service), (
                        f"/readyz answered 200 before every informer synced: {answers[-1]}; built: {built}")
                    assert all(s.healthy() for s in service._state.sinks)
                    break
                assert status == 503
                assert answers[-1][1]["ready"] is False
                await asyncio.sleep(0.02)
            reasons = [r for _, a in answers[:-1] for r in a["reasons"]]
            assert "starting" in reasons
            assert answers[-1][1] == {"ready": True, "role": "single", "reasons": []}
        finally:
            service.stop_event.set()
            await asyncio.wait_for(task, 30)
