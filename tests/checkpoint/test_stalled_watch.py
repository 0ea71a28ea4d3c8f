"""Issue #27: a watch that stays open but delivers nothing while the resource changes is reported.

The simulator over real HTTP holds every watch open without sending anything (its ``watch_stall``
fault); the pipeline (the service's wiring: factory, HTTP lister-watcher) checks silent watches with a
``limit=1`` list after ``AFTER`` seconds. A silent watch of a quiet resource is not stalled; once the
resource changes behind the silent watch, the stalled condition is reported (readiness reason, gauge,
WARNING) within ``AFTER`` seconds of the watch's last delivery plus one check period, and it clears
when the fault is lifted and the held changes flow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.delivery.stall import StallCheck
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.storage.checkpoint import FileCheckpointStore
from sinks.contract import ResourceRef
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until
from tests.service.test_service import eventually, get, lines, metric

pytestmark = pytest.mark.usefixtures("own_cwd")

NS = "stall"
PATH = f"/api/v1/namespaces/{NS}/configmaps"
AFTER = 2.0
PERIOD = AFTER / 4


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.5) as world:
        yield world


async def server_rv(client: ApiClient, watched: WatchedResource) -> str:
    listed = await client.get(watched.api.path(watched.key.namespace or None), params={"limit": 1})
    return str(listed["metadata"]["resourceVersion"])


async def pipeline(client: ApiClient, tmp_path: Path, sink: RecordingSink,
                   calls: list[str]) -> BridgePipeline:
    api = await Discovery(client=client).resolve("configmaps")
    key = InformerKey("configmaps", namespace=NS)
    ref = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
    factory = SharedInformerFactory(
        lister_watcher_factory=lambda k: HttpListerWatcher(client=client, resource=api,
                                                           namespace=k.namespace),
        clock=RealClock())

    async def current(watched: WatchedResource) -> str:
        calls.append(watched.informer_id)
        return await server_rv(client, watched)

    return BridgePipeline(factory=factory, resources=[WatchedResource(key=key, api=api, ref=ref)],
                          sinks=[sink], checkpoint_store=FileCheckpointStore(directory=tmp_path / "ckpt"),
                          cluster="sim", stall_check=StallCheck(after=AFTER, server_resource_version=current))


@pytest.mark.timeout(60)
async def test_a_stalled_watch_is_reported_in_time_and_clears_when_events_flow(
        sim: tuple[Simulator, ApiClient], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    simulator, client = sim
    sink = RecordingSink("rec")
    calls: list[str] = []
    p = await pipeline(client, tmp_path, sink, calls)
    caplog.set_level(logging.INFO, logger="bridge.delivery.stall")
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        ident = next(iter(p.informers))
        await client.create(PATH, {"metadata": {"name": "before"}, "data": {"v": "1"}})
        await until(lambda: len(sink.events) == 1, what="the first change delivered")

        # Silent, but nothing changed: a quiet resource is not a stalled watch.
        simulator.set_faults(watch_stall=True)
        loop = asyncio.get_running_loop()
        silent_from = loop.time()
        await asyncio.sleep(AFTER + 2 * PERIOD)
        # Checked against the server at least once (a loaded machine may run the first check late).
        await until(lambda: bool(calls), timeout=30, what="the silent watch checked against the server")
        assert p.ready(), p.not_ready_reasons()
        assert not p.stalled()

        # The resource changes behind the silent watch.
        for i in range(3):
            await client.create(PATH, {"metadata": {"name": f"held-{i}"}, "data": {"v": "1"}})
        changed_at = loop.time()
        checks_at_change = len(calls)
        await until(lambda: bool(p.stalled()), timeout=30, what="the stalled watch reported")
        reported_after = loop.time() - changed_at
        assert len(sink.events) == 1  # the watch really delivered nothing
        assert not p.ready()
        assert any(r.startswith(f"informer {ident} stalled: its watch delivered nothing")
                   for r in p.not_ready_reasons()), p.not_ready_reasons()
        assert p.informer_gauges()[str(p._informers[ident].watched.key)].stalled
        assert any(r.levelno == logging.WARNING and "is stalled" in r.getMessage() for r in caplog.records)
        # Silent for longer than AFTER already: reported at the next check (counted in checks, not
        # seconds: one already asking the server when the changes were made may see none of them).
        assert len(calls) - checks_at_change <= 2, (len(calls) - checks_at_change, reported_after)
        print(f"\nstalled watch reported {reported_after:.2f}s after the change "
              f"({loop.time() - silent_from:.2f}s of silence; after={AFTER}s)")

        simulator.set_faults(watch_stall=False)
        await until(lambda: len(sink.events) == 4, timeout=10, what="the held changes delivered")
        await until(lambda: not p.stalled(), timeout=30, what="the stalled condition cleared")
        assert p.ready(), p.not_ready_reasons()
        assert not p.informer_gauges()[str(p._informers[ident].watched.key)].stalled
        assert any("delivers again" in r.getMessage() for r in caplog.records)
    finally:
        await p.shutdown(5)


@pytest.mark.timeout(60)
async def test_a_watch_stalled_from_its_last_delivery_is_reported_within_the_configured_time(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    simulator, client = sim
    sink = RecordingSink("rec")
    calls: list[str] = []
    p = await pipeline(client, tmp_path, sink, calls)
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        simulator.set_faults(watch_stall=True)
        loop = asyncio.get_running_loop()
        stalled_at = loop.time()
        await client.create(PATH, {"metadata": {"name": "held"}, "data": {"v": "1"}})
        await until(lambda: bool(p.stalled()), timeout=30, what="the stalled watch reported")
        took = loop.time() - stalled_at
        # Reported at the first check of the watch once it was silent for AFTER (a silent watch is
        # asked about only then; counted in checks, not seconds, which a loaded machine stretches).
        assert len(calls) <= 2, (len(calls), took)
        assert not sink.events
        simulator.set_faults(watch_stall=False)
        await until(lambda: len(sink.events) == 1 and not p.stalled(), timeout=10, what="delivery again")
    finally:
        await p.shutdown(5)


@pytest.mark.timeout(60)
async def test_the_service_reports_a_stalled_watch_on_readyz_and_metrics(tmp_path: Path) -> None:
    async with Simulator(bookmark_interval=0.5, namespaces=("default", NS)) as simulator:
        kubeconfig = simulator.write_kubeconfig(tmp_path / "kubeconfig")
        config = BridgeConfig.model_validate({
            "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false", "stall_after": AFTER},
            "resources": [{"resource": "configmaps", "namespace": NS}],
            "sinks": [{"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")}],
            "checkpoint": {"store": "file", "directory": str(tmp_path / "cp")},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "shutdown_deadline": 10,
        })
        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            # /readyz may answer 200 before the pipeline prepared its informers: wait for their sync.
            await eventually(lambda: service._state.pipeline is not None
                             and bool(service._state.pipeline.informers), what="the pipeline's informer")
            assert service._state.pipeline is not None
            assert await service._state.pipeline.wait_for_sync(10)
            await eventually(lambda: service.readiness().ready, what="readiness")
            base = f"http://127.0.0.1:{service.health.port}"
            simulator.set_faults(watch_stall=True)
            simulator.store.create("configmaps", {"metadata": {"name": "held", "namespace": NS}, "data": {}})
            await eventually(lambda: not service.readiness().ready, timeout=AFTER + 4 * PERIOD + 2,
                             what="the stalled watch on readiness")
            status, text = await get(f"{base}/readyz")
            assert status == 503
            assert "stalled" in text, text  # the kind; the detail is the admin listener's
            status, text = await get(f"http://127.0.0.1:{service.health.admin_port}/readyz")
            assert status == 503
            assert "stalled: its watch delivered nothing" in text, text
            status, text = await get(f"{base}/metrics")
            assert metric(text, "keb_informer_stalled", resource="configmaps") == 1
            simulator.set_faults(watch_stall=False)
            await eventually(lambda: service.readiness().ready, timeout=10, what="ready again")
            status, text = await get(f"{base}/metrics")
            assert metric(text, "keb_informer_stalled", resource="configmaps") == 0
            assert [e["subject"] for e in lines(tmp_path / "events.jsonl")] == [f"{NS}/held"]
        finally:
            service.stop_event.set()
            assert await task == 0
