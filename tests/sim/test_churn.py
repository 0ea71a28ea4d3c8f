"""The Pod factory and the churn generator: sizes, mix, rate (on a fake clock), and what watchers see."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import orjson
import pytest

from bridge.clock import FakeClock
from bridge.sim import ChurnGenerator, ChurnMix, ObjectStore, Simulator, make_pod
from tests.sim.helpers import read_events


@pytest.mark.parametrize("size", [6_000, 10_000, 65_536])
def test_make_pod_reaches_the_requested_size(size: int) -> None:
    pod = make_pod("p", "ns", size, random.Random(3))
    assert len(orjson.dumps(pod)) == size


def test_make_pod_is_realistic_and_deterministic() -> None:
    a = make_pod("p", "team-a", None, random.Random(7))
    b = make_pod("p", "team-a", None, random.Random(7))
    assert a == b
    assert 3_500 < len(orjson.dumps(a)) < 6_000
    meta = a["metadata"]
    assert meta["namespace"] == "team-a"
    assert {"app", "pod-template-hash"} <= set(meta["labels"])
    assert meta["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert [m["manager"] for m in meta["managedFields"]] == ["kube-controller-manager", "kubelet"]
    assert a["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert a["status"]["phase"] == "Running"
    assert a["status"]["containerStatuses"][0]["ready"] is True
    store = ObjectStore()
    created = store.create("pods", a)
    assert created["metadata"]["uid"]
    assert created["status"] == a["status"]


def test_churn_mix_parsing() -> None:
    assert ChurnMix.parse("create=1,update=2,delete=0.5") == ChurnMix(1, 2, 0.5)
    assert ChurnMix.parse({"update": 1}) == ChurnMix(create=1.0, update=1.0, delete=1.0)
    assert ChurnMix.parse((0, 1, 0)) == ChurnMix(0, 1, 0)
    with pytest.raises(ValueError, match="unknown churn mix"):
        ChurnMix.parse({"explode": 1})
    with pytest.raises(ValueError, match="not all zero"):
        ChurnMix(0, 0, 0)


async def test_mix_and_population_by_count() -> None:
    store = ObjectStore()
    gen = ChurnGenerator(store=store, rate=1e9, mix={"create": 1, "update": 2, "delete": 1}, objects=60,
                         object_size=2_000, namespaces=("a", "b"), seed=11)
    assert gen.prefill() == 60
    assert store.counts()["pods"] == 60
    gen.stats.created = 0
    stats = await gen.run(max_events=2_000)
    assert stats.total == 2_000
    assert stats.skipped == 0
    assert 0.20 <= stats.deleted / stats.total <= 0.30
    assert 0.45 <= stats.updated / stats.total <= 0.62
    assert abs(stats.created - stats.deleted) <= 60
    assert store.counts()["pods"] == gen.population <= 60
    assert set(stats.by_kind) == {"status", "labels", "spec"}
    assert stats.by_kind["status"] > stats.by_kind["labels"] > stats.by_kind["spec"]
    namespaces = {p["metadata"]["namespace"] for p in store.list("pods")}
    assert namespaces == {"a", "b"}


async def test_rate_is_kept_on_a_fake_clock() -> None:
    clock = FakeClock()
    store = ObjectStore()
    gen = ChurnGenerator(store=store, rate=200, objects=50, seed=1, clock=clock)
    task = asyncio.create_task(gen.run(duration=2.0), name="churn")
    while not task.done():
        if not await clock.step():
            await asyncio.sleep(0)
    stats = await task
    assert 399 <= stats.total <= 401


async def test_stop_ends_an_unbounded_run() -> None:
    gen = ChurnGenerator(store=ObjectStore(), rate=1_000, objects=10, seed=2)
    task = asyncio.create_task(gen.run(), name="churn")
    await asyncio.sleep(0.1)
    gen.stop()
    stats = await asyncio.wait_for(task, 30)  # unbounded unless stopped: the deadline stops a hang
    assert stats.total > 0


async def test_a_watcher_sees_every_churn_event() -> None:
    async with Simulator() as sim, aiohttp.ClientSession() as http:
        gen = ChurnGenerator(store=sim.store, rate=2_000, objects=20, seed=5)
        gen.prefill()
        rv = str(sim.store.resource_version)
        resp = await http.get(f"{sim.url}/api/v1/pods",
                              params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"})
        stats = await gen.run(max_events=300)
        events = await read_events(resp)
    assert stats.skipped == 0
    assert len(events) == stats.total - 20 == 300
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == list(range(int(rv) + 1, int(rv) + 301))
    counts = {t: sum(1 for e in events if e["type"] == t) for t in ("ADDED", "MODIFIED", "DELETED")}
    assert counts == {"ADDED": stats.created - 20, "MODIFIED": stats.updated, "DELETED": stats.deleted}
