"""The service end to end in-process: simulator → bridge → file + webhook sinks, with the health,
readiness and metrics endpoints read over real HTTP."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing import Reply, WebhookReceiver
from bridge.testing.files import written_events

pytestmark = pytest.mark.usefixtures("own_cwd")


async def eventually(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def hook() -> AsyncIterator[WebhookReceiver]:
    """A webhook receiver whose answers the test controls."""
    async with WebhookReceiver(reply=Reply(200)) as h:
        yield h


def lines(path: Path) -> list[dict[str, Any]]:
    return written_events(path)


def changes(path: Path) -> list[dict[str, Any]]:
    """The events of object changes (no markers)."""
    return [e for e in lines(path) if "subject" in e]


def config(sim: Simulator, tmp_path: Path, hook: WebhookReceiver) -> BridgeConfig:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "pods"}, {"resource": "configmaps", "namespace": "web"}],
        "sinks": [
            {"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")},
            {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "retry": {"initial": 0.05, "max": 0.2}, "routing": {"resources": ["pods"]}},
        ],
        "checkpoint": {"store": "file", "directory": str(tmp_path / "checkpoints"), "interval": 0.2},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name}{labels} not exposed")


async def test_service_delivers_and_exposes_health_readiness_and_metrics(
        tmp_path: Path, hook: WebhookReceiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="bridge.service.service")
    async with Simulator() as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        sim.store.create("configmaps", {"metadata": {"name": "cfg", "namespace": "web"}, "data": {"a": "1"}})
        service = BridgeService(config=config(sim, tmp_path, hook))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            base = f"http://127.0.0.1:{service.health.port}"
            await eventually(lambda: any(r.getMessage() == "initial sync done" for r in caplog.records),
                             what="the initial sync report")
            done = next(r for r in caplog.records if r.getMessage() == "initial sync done")
            assert done.objects_cached == 4  # type: ignore[attr-defined]
            assert (await get(f"{base}/healthz"))[0] == 200
            status, body = await get(f"{base}/readyz")
            assert status == 200
            assert orjson.loads(body)["ready"] is True

            pod = sim.store.get("pods", "p0", namespace="default")
            pod["metadata"]["labels"]["touched"] = "yes"
            sim.store.update("pods", pod)
            sim.store.delete("pods", "p1", namespace="default")
            events = tmp_path / "events.jsonl"
            await eventually(lambda: len(lines(events)) == 6, what="6 events in the file")
            types = sorted(e["type"].rsplit(".", 1)[-1] for e in lines(events))
            assert types == ["added", "added", "added", "added", "deleted", "updated"]
            await eventually(lambda: len(hook.events) == 5, what="5 pod events at the webhook")
            assert {e["subject"] for e in hook.events} == {"default/p0", "default/p1", "default/p2"}

            _, text = await get(f"{base}/metrics")
            assert metric(text, "keb_sink_events_total", sink="file", outcome="delivered") == 6
            assert metric(text, "keb_sink_events_total", sink="hook", outcome="delivered") == 5
            # The latency histogram is sampled in time (at most one record per 5 ms per sink, see
            # bridge.service.telemetry): it has samples, never more than the deliveries counted above.
            assert 0 < metric(text, "keb_sink_delivery_duration_seconds_count", sink="file") <= 6
            assert metric(text, "keb_informer_cached_objects") in (2.0, 1.0)
            assert metric(text, "keb_sink_up", sink="hook") == 1
            assert sum(metric(text, "keb_events_received_total", type=t) for t in ("added",)) >= 3

            # The webhook goes down: the bridge keeps the file sink going and reports not ready.
            hook.reply = Reply(503, retry_after=0)
            sim.store.create("pods", make_pod("p9", "default"))
            await eventually(lambda: not service.readiness().ready, what="readiness to drop")
            status, body = await get(f"{base}/readyz")
            assert status == 503
            # The public port names the sink and the kind of reason; the detail (its error) is the
            # admin listener's.
            assert "sink hook unhealthy" in orjson.loads(body)["reasons"]
            assert "HTTP 503" not in body
            status, body = await get(f"http://127.0.0.1:{service.health.admin_port}/readyz")
            assert status == 503
            assert any(r.startswith("sink hook unhealthy: ") and "HTTP 503" in r
                       for r in orjson.loads(body)["reasons"])
            await eventually(lambda: len(lines(events)) == 7, what="file sink unaffected")
            # It comes back: the held event is delivered and readiness returns.
            hook.reply = Reply(200)
            await eventually(lambda: any(e["subject"] == "default/p9" for e in hook.events), what="retry")
            await eventually(lambda: service.readiness().ready, what="readiness to return")

            # The server expires the open watches (410): counted, and the informers relist.
            assert sim.expire_watches() == 2
            sim.store.create("pods", make_pod("p10", "default"))
            await eventually(lambda: len(changes(events)) == 8, what="the event after the relist")
            # Each relist (one per informer) is framed by gap markers; p10 came within the pods one.
            await eventually(lambda: len(lines(events)) == 12, what="the gap markers")
            kinds = [e["type"].removeprefix("io.kube-event-bridge.") for e in lines(events)[7:]]
            assert sorted(kinds) == ["added", "gap.begin", "gap.begin", "gap.end", "gap.end"]
            p10 = next(e for e in lines(events) if e.get("subject") == "default/p10")
            assert p10["gapid"] == next(e["gapid"] for e in lines(events)
                                        if e["type"].endswith("gap.begin") and e["kind"] == "Pod")
            _, text = await get(f"{base}/metrics")
            pods = {"resource": "pods"}
            assert metric(text, "keb_informer_expired_total", **pods) == 1
            assert metric(text, "keb_informer_watch_restarts_total", **pods) >= 1
            assert metric(text, "keb_informer_relists_total", **pods) == 2
        finally:
            service.stop_event.set()
            code = await task
        assert code == 0
        files = sorted(p.suffix for p in (tmp_path / "checkpoints").iterdir())
        # One checkpoint per informer, written on shutdown at the latest, and its known-object journal.
        assert files == [".ckpt", ".ckpt", ".journal", ".journal"]


async def test_unknown_resource_is_reported_and_others_keep_running(tmp_path: Path,
                                                                   hook: WebhookReceiver) -> None:
    async with Simulator() as sim:
        sim.store.create("pods", make_pod("p0", "default"))
        cfg = config(sim, tmp_path, hook).model_copy(update={})
        data = cfg.model_dump(exclude_unset=True)
        data["resources"] = [{"resource": "pods"}, {"resource": "gizmos.example.com"}]
        service = BridgeService(config=BridgeConfig.model_validate(data))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            events = tmp_path / "events.jsonl"
            await eventually(lambda: len(lines(events)) == 1, what="the pod event")
            r = service.readiness()
            assert not r.ready
            assert any("gizmos.example.com" in reason for reason in r.reasons)
        finally:
            service.stop_event.set()
            await task


async def test_snapshot_on_demand_through_the_endpoint_and_the_cli(tmp_path: Path,
                                                                  hook: WebhookReceiver) -> None:
    from bridge.service.cli import main as cli_main

    async with Simulator() as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        service = BridgeService(config=config(sim, tmp_path, hook))
        task = asyncio.create_task(service.run(), name="service-under-test")
        events = tmp_path / "events.jsonl"
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            await eventually(lambda: len(lines(events)) == 3, what="the three adds")
            public = f"http://127.0.0.1:{service.health.port}"
            url = f"http://127.0.0.1:{service.health.admin_port}"
            # Not on the port the Service exposes.
            async with aiohttp.ClientSession() as s, s.post(f"{public}/snapshot") as r:
                assert r.status == 403
                assert "admin listener" in (await r.json())["error"]
            code = await asyncio.to_thread(cli_main, ["snapshot", "--url", url, "--resource", "pods"])
            assert code == 0
            await eventually(lambda: len(lines(events)) == 3 + 5, what="begin, 3 syncs, end")
            snap = lines(events)[3:]
            assert [e["type"].removeprefix("io.kube-event-bridge.") for e in snap] == [
                "snapshot.begin", "sync", "sync", "sync", "snapshot.end"]
            assert sorted(e["subject"] for e in snap[1:4]) == ["default/p0", "default/p1", "default/p2"]
            assert snap[-1]["snapshotcount"] in (3, "3")
            async with aiohttp.ClientSession() as s, s.post(f"{url}/snapshot",
                                                            params={"resource": "nope"}) as r:
                assert r.status == 404
            assert await asyncio.to_thread(cli_main, ["snapshot", "--url", "http://127.0.0.1:1"]) == 1
        finally:
            service.stop_event.set()
            await task
