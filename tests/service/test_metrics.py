"""/metrics of a running service, read over HTTP: one label vocabulary across every metric, the
leader gauge, the process's own metrics and a sink's lag and spill while it falls behind."""

from __future__ import annotations

import asyncio
import re
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.storage.checkpoint import informer_id
from bridge.testing import Reply, WebhookReceiver
from sinks.contract import EventType
from tests.service.in_process import running_service, simulator_config
from tests.service.test_service import eventually, get, lines, metric

pytestmark = pytest.mark.usefixtures("own_cwd")

SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def labels_by_metric(text: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[m.group(1)].append(dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))))
    return out


async def test_one_label_vocabulary_leader_gauge_and_process_metrics(tmp_path: Path) -> None:
    async with Simulator() as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        sim.store.create("deployments.apps", {"metadata": {"name": "d", "namespace": "web"}, "spec": {}})
        # Short name and kind: the labels must still say pods and deployments.apps.
        resources = [{"resource": "po", "namespace": "default"}, {"resource": "Deployment"}]
        async with running_service(simulator_config(sim, tmp_path, resources=resources)) as service:
            await eventually(lambda: service.readiness().ready, what="readiness")
            pod = sim.store.get("pods", "p0", namespace="default")
            pod["metadata"]["labels"]["touched"] = "yes"
            sim.store.update("pods", pod)
            sim.store.delete("pods", "p1", namespace="default")
            events = tmp_path / "events.jsonl"
            await eventually(lambda: len(lines(events)) == 6, what="6 events")
            pipeline = service._state.pipeline
            assert pipeline is not None
            await pipeline.snapshot_now("pods")
            # 4 added + updated + deleted + snapshot (begin, 2 sync, end)
            await eventually(lambda: len(lines(events)) == 10, what="10 events")
            base = f"http://127.0.0.1:{service.health.port}"
            await eventually(lambda: all(a is not None for a in pipeline.stats().checkpoint_age.values()),
                             what="a checkpoint of each informer")
            status, text = await get(f"{base}/metrics")
            assert status == 200

    by_metric = labels_by_metric(text)
    informers = {"pods": informer_id("po", "default"), "deployments.apps": informer_id("Deployment")}
    resource_metrics = [name for name, samples in by_metric.items()
                        if name.startswith("keb_") and any("resource" in s for s in samples)]
    assert {"keb_events_received_total", "keb_informer_relists_total", "keb_informer_cached_objects",
            "keb_checkpoint_age_seconds", "keb_checkpoint_lag"} <= set(resource_metrics)
    for name in resource_metrics:
        for sample in by_metric[name]:
            # The same resource value (plural.group) and informer id for one informer, everywhere.
            assert sample["resource"] in informers, (name, sample)
            assert sample["informer"] == informers[sample["resource"]], (name, sample)
    ce_types = {t.value for t in EventType}
    types = {s["type"] for s in by_metric["keb_events_received_total"]}
    assert types <= ce_types
    assert metric(text, "keb_events_received_total", resource="pods", type="added") == 3
    assert metric(text, "keb_events_received_total", resource="pods", type="updated") == 1
    assert metric(text, "keb_events_received_total", resource="pods", type="deleted") == 1
    assert metric(text, "keb_events_received_total", resource="pods", type="sync") == 2
    assert metric(text, "keb_events_received_total", resource="deployments.apps", type="added") == 1
    assert metric(text, "keb_informer_cached_objects", resource="pods") == 2

    assert metric(text, "keb_leader") == 1
    assert metric(text, "process_resident_memory_bytes") > 10_000_000
    assert metric(text, "process_cpu_seconds_total") > 0
    assert metric(text, "process_open_fds") > 0
    assert "python_gc_collections_total" in by_metric


async def test_a_standby_reports_zero_on_the_leader_gauge(tmp_path: Path) -> None:
    config = BridgeConfig.model_validate({
        "resources": [{"resource": "pods"}],
        "sinks": [{"name": "s", "kind": "stdout"}],
        "leader_election": {"enabled": True},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
    })
    service = BridgeService(config=config)
    text = service.telemetry.render_prometheus().decode()
    service.telemetry.shutdown()
    assert metric(text, "keb_leader") == 0


async def scrape(base: str) -> str:
    status, text = await get(f"{base}/metrics")
    assert status == 200
    return text


async def scraped(base: str, predicate: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
    """The first /metrics text ``predicate`` accepts, scraped over HTTP until ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate(text := await scrape(base)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last scrape:\n{text}"
        await asyncio.sleep(0.1)
    return text


async def test_a_sink_falling_behind_shows_its_lag_and_spill_until_it_catches_up(tmp_path: Path) -> None:
    async with WebhookReceiver(reply=Reply(200)) as hook:
        await _falling_behind(tmp_path, hook)


async def _falling_behind(tmp_path: Path, hook: WebhookReceiver) -> None:
    """A webhook answering 503 behind a 2-change buffer, scraped over HTTP while it falls behind and
    after it catches up."""
    async with Simulator() as sim:
        sim.store.create("pods", make_pod("p0", "default"))
        config = simulator_config(sim, tmp_path, resources=[{"resource": "pods"}], sinks=[
            {"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")},
            # Two changes in flight, two in memory: the rest of its backlog goes to its spill.
            {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "retry": {"initial": 0.05, "max": 0.2}, "max_in_flight": 2, "buffer": {"capacity": 2}},
        ], checkpoint={"spill_directory": str(tmp_path / "spill")})
        async with running_service(config) as service:
            await eventually(lambda: service.readiness().ready, what="readiness")
            base = f"http://127.0.0.1:{service.health.port}"
            await eventually(lambda: len(hook.events) == 1, what="p0 at the webhook")
            text = await scrape(base)
            for sink in ("file", "hook"):
                assert metric(text, "keb_sink_lag_seconds", sink=sink) == 0
                assert metric(text, "keb_sink_spill_bytes", sink=sink) == 0

            hook.reply = Reply(503, retry_after=0)
            for i in range(1, 21):
                sim.store.create("pods", make_pod(f"p{i}", "default"))
            text = await scraped(base, lambda t: metric(t, "keb_sink_spill_bytes", sink="hook") > 0
                                 and metric(t, "keb_sink_lag_seconds", sink="hook") > 0.5,
                                 what="the webhook's spill and lag")
            assert metric(text, "keb_sink_queue_depth", sink="hook") > 2  # beyond its memory buffer
            assert metric(text, "keb_sink_in_flight", sink="hook") > 0
            assert metric(text, "keb_checkpoint_lag", resource="pods") > 0  # the webhook owes them
            # The file sink keeps up: it owes nothing and spills nothing.
            events = tmp_path / "events.jsonl"
            await eventually(lambda: len(lines(events)) == 21, what="21 events in the file")
            text = await scraped(base, lambda t: metric(t, "keb_sink_lag_seconds", sink="file") == 0,
                                 what="the file sink to owe nothing")
            assert metric(text, "keb_sink_spill_bytes", sink="file") == 0
            assert metric(text, "keb_sink_up", sink="hook") == 0

            hook.reply = Reply(200)
            text = await scraped(base, lambda t: metric(t, "keb_sink_lag_seconds", sink="hook") == 0
                                 and metric(t, "keb_sink_spill_bytes", sink="hook") == 0
                                 and metric(t, "keb_sink_queue_depth", sink="hook") == 0
                                 and metric(t, "keb_sink_in_flight", sink="hook") == 0,
                                 what="the webhook to catch up")
            assert len({e["subject"] for e in hook.events}) == 21
            assert metric(text, "keb_sink_events_total", sink="hook", outcome="delivered") >= 21
            assert metric(text, "keb_sink_events_total", sink="hook", outcome="dropped") == 0
            assert metric(text, "keb_sink_up", sink="hook") == 1
            await scraped(base, lambda t: metric(t, "keb_checkpoint_lag", resource="pods") == 0,
                          what="every sink to have acknowledged everything")
