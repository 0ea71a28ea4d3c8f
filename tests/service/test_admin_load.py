"""The endpoints under load: ``POST /snapshot`` requests that arrive while a snapshot is pending are
coalesced into it (20 requests make one or two resyncs, counted at the sink), and ``/metrics`` is
rendered in a worker thread, not on the event loop (the collection is observed from its thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing.files import written_events
from tests.service.test_service import eventually

pytestmark = pytest.mark.usefixtures("own_cwd")

PODS = 300


def _config(sim: Simulator, tmp_path: Path) -> BridgeConfig:
    return BridgeConfig.model_validate({
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
        "resources": [{"resource": "pods"}],
        "sinks": [{"name": "out", "kind": "file", "path": str(tmp_path / "events.jsonl")}],
        "checkpoint": {"store": "none"},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 5,
    })


def _begins(path: Path) -> int:
    return sum(1 for e in written_events(path) if e["type"].endswith("snapshot.begin"))


def _ends(path: Path) -> int:
    return sum(1 for e in written_events(path) if e["type"].endswith("snapshot.end"))


async def test_twenty_snapshot_requests_make_one_or_two_resyncs(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    async with Simulator() as sim:
        for i in range(PODS):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        service = BridgeService(config=_config(sim, tmp_path))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, timeout=60, what="ready")
            url = f"http://127.0.0.1:{service.health.admin_port}/snapshot?resource=pods"
            async with aiohttp.ClientSession() as s:

                async def post() -> int:
                    async with s.post(url) as r:
                        return r.status

                assert await asyncio.gather(*(post() for _ in range(20))) == [202] * 20
                await eventually(lambda: _ends(events) >= 1 and _ends(events) == _begins(events),
                                 timeout=60, what="the snapshots to end")
                # One more request, alone, once those are through: every snapshot the 20 made is
                # before its own in the sink's order.
                assert await post() == 202
                before = _begins(events)
                await eventually(lambda: _ends(events) == before + 1 and _begins(events) == before + 1,
                                 timeout=60, what="the last snapshot")
        finally:
            service.stop_event.set()
            await asyncio.wait_for(task, 30)
    assert 1 <= before <= 2, f"20 requests made {before} snapshots"


class _ThreadProbe(Collector):
    """Records the thread each collection runs in."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("keb_test_probe", "which thread collected", value=1)


async def test_metrics_are_rendered_off_the_event_loop(tmp_path: Path) -> None:
    async with Simulator() as sim:
        sim.store.create("pods", make_pod("p0", "default"))
        service = BridgeService(config=_config(sim, tmp_path))
        probe = _ThreadProbe()
        service.telemetry.registry.register(probe)
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, timeout=60, what="ready")
            async with aiohttp.ClientSession() as s, \
                    s.get(f"http://127.0.0.1:{service.health.port}/metrics") as r:
                text = await r.text()
        finally:
            service.stop_event.set()
            await asyncio.wait_for(task, 30)
    assert "keb_test_probe" in text
    assert "keb_sink_events_total" in text
    loop_thread = threading.get_ident()  # the test's loop is the service's
    assert probe.threads
    assert loop_thread not in probe.threads
