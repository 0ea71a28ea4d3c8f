"""The events profile end to end in-process: the simulator's Events (both APIs, repetitions, objects
deleted and re-created) → the service → file sinks, read back as a consumer would."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.events import EventGenerator
from bridge.testing.files import written_events

pytestmark = pytest.mark.usefixtures("own_cwd")


async def eventually(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        await asyncio.sleep(0.05)


def lines(path: Path) -> list[dict[str, Any]]:
    return written_events(path)


def config(sim: Simulator, tmp_path: Path, **events: Any) -> BridgeConfig:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "events", "profile": "events"},
                      {"resource": "events.events.k8s.io", "profile": "events"}],
        "events": {"enrichment": {"kinds": ["pods", "replicasets.apps", "deployments.apps"],
                                  "annotations": ["example.com/owner-team"]}, **events},
        "sinks": [
            {"name": "all", "kind": "file", "path": str(tmp_path / "all.jsonl")},
            {"name": "warnings", "kind": "file", "path": str(tmp_path / "warnings.jsonl"),
             "routing": {"events": {"match": [{"types": ["Warning"]}],
                                    "drop": [{"reasons": ["BackOff"]}, {"message": "^Unhealthy: pod"}]}}},
        ],
        "checkpoint": {"store": "file", "directory": str(tmp_path / "checkpoints"), "interval": 0.2},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


def metric_total(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_events_are_annotated_enriched_routed_and_counted(tmp_path: Path) -> None:
    async with Simulator(bookmark_interval=0.2) as sim:
        gen = EventGenerator(store=sim.store, rate=100, namespaces=["web", "shop"], deployments=4,
                             pods_per_deployment=3, seed=7, max_events=60)
        service = BridgeService(config=config(sim, tmp_path))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            for _ in range(300):
                gen.step()
                if _ % 50 == 0:
                    await asyncio.sleep(0.05)
            total = gen.stats.changes
            everything = tmp_path / "all.jsonl"
            await eventually(lambda: len(lines(everything)) >= total, what=f"{total} changes in the file")
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{service.health.port}/metrics") as r:
                text = await r.text()
            counted = gen.stats.created + gen.stats.bumped  # new Events and repetitions, not expiries
            assert metric_total(text, "keb_kubernetes_events_total") == counted
            warnings_seen = sum(1 for e in gen.ledger if e.type == "Warning")
            assert metric_total(text, "keb_kubernetes_events_total", type="Warning") >= warnings_seen
            assert metric_total(text, "keb_kubernetes_events_total", involved_kind="Deployment",
                                namespace="web") > 0
        finally:
            service.stop_event.set()
            assert await task == 0
        got = lines(everything)
        assert len({e["id"] for e in got}) == total
        ledger = {e.uid: e for e in gen.ledger}
        for ce in got:
            uid = ce["uid"]
            entry = ledger[uid]
            assert ce["reason"] == entry.reason
            assert ce["eventtype"] == entry.type
            assert ce["involvedkind"] == entry.involved_kind
            assert ce["involveduid"] == entry.involved_uid
            assert ce["involvednamespace"] == entry.namespace
            assert int(ce["count"]) >= 1
            assert ce["apiversion"] == entry.api
            if entry.api == "events.k8s.io/v1" and ce["type"].endswith("updated"):
                assert ce["seriescount"] == ce["count"]
            if entry.existed:
                assert ce["enrichment"] in ("ok", "gone"), ce
                assert orjson.loads(ce["involvedlabels"]) == entry.labels
                if entry.involved_kind == "Pod":
                    assert ce["ownerkind"] == "Deployment"
                    assert entry.owner_top == "Deployment/" + ce["ownername"]
                    assert ce["ownerchain"].startswith("ReplicaSet/")
                    assert orjson.loads(ce["involvedannotations"]) == {
                        "example.com/owner-team": entry.labels["team"]}
            else:
                assert ce["enrichment"] in ("gone", "unknown")
        assert gen.stats.about_gone
        assert gen.stats.pods_recreated
        assert gen.stats.bumped
        gone = [ce for ce in got if not ledger[ce["uid"]].existed]
        # The bridge saw these Pods deleted: it remembers their labels.
        assert gone
        assert all(ce["enrichment"] == "gone" and "involvedlabels" in ce for ce in gone)

        warnings = lines(tmp_path / "warnings.jsonl")
        def message_of(ce: dict[str, Any]) -> str:
            return str(ce["data"].get("message", ce["data"].get("note", "")))

        expected = [ce["id"] for ce in got if ce["eventtype"] == "Warning" and ce["reason"] != "BackOff"
                    and not message_of(ce).startswith("Unhealthy: pod")]
        assert sorted(ce["id"] for ce in warnings) == sorted(expected)
        assert expected


async def test_the_cel_filter_errors_of_a_profiled_sink_are_exported(tmp_path: Path) -> None:
    """A sink with a CEL ``filter`` receiving a resource under ``profile: events``: the filter's
    evaluation errors reach ``keb_sink_filter_errors_total`` (read from the sink itself, whatever
    stages its delivery chain has)."""
    async with Simulator(bookmark_interval=0.2) as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        cfg = BridgeConfig.model_validate({
            "cluster": "test",
            "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
            "resources": [{"resource": "events", "profile": "events"}],
            "events": {"enrichment": {"enabled": False}},
            "sinks": [{"name": "failing", "kind": "file", "path": str(tmp_path / "failing.jsonl"),
                       # Core Events have no status: every evaluation fails, and the Event is kept.
                       "filter": "object.status.reason == 'Evicted'", "filter_errors": "keep"}],
            "checkpoint": {"store": "none"},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "shutdown_deadline": 10,
        })
        service = BridgeService(config=cfg)
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            count = 5
            for i in range(count):
                sim.store.create("events", {
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": f"web-{i}.1", "namespace": "shop"},
                    "involvedObject": {"kind": "Pod", "namespace": "shop", "name": f"web-{i}",
                                       "uid": f"uid-web-{i}", "apiVersion": "v1"},
                    "reason": "BackOff", "type": "Warning", "message": "Back-off", "count": 1,
                    "source": {"component": "kubelet"}})
            await eventually(lambda: len(lines(tmp_path / "failing.jsonl")) == count, what="the Events kept")
            assert all(ce["reason"] == "BackOff" for ce in lines(tmp_path / "failing.jsonl"))
            text = service.telemetry.render_prometheus().decode()
            assert metric_total(text, "keb_sink_filter_errors_total", sink="failing") == count
            (chain,) = service._state.sinks
            assert chain.describe() == "meter → events → sink failing"
        finally:
            service.stop_event.set()
            assert await task == 0
