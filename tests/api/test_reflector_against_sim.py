"""A real Reflector driven through a real HttpListerWatcher against the simulator, through every
fault the simulator can inject (watches closed after N events, lines cut in half, 429/503 with
Retry-After on list and watch, ERROR 410 in the stream, compaction while the watch is down): after
each, the cache converges to exactly the simulator's state (same keys, same resourceVersions)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator

import pytest

from bridge.clock import RealClock
from bridge.informer.backoff import Backoff
from bridge.informer.reflector import Reflector
from bridge.informer.store import IndexedCache
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher, lister_watcher_for
from bridge.sim import Simulator

from .conftest import InstantClock, make_pod


def sim_state(sim: Simulator) -> dict[str, str]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
            for o in sim.store.list("pods")}


def cache_state(cache: IndexedCache) -> dict[str, str]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
            for o in cache.list()}


async def converged(sim: Simulator, cache: IndexedCache, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while cache_state(cache) != sim_state(sim):
        if loop.time() > deadline:
            missing = set(sim_state(sim).items()) ^ set(cache_state(cache).items())
            pytest.fail(f"cache did not converge; differing entries: {sorted(missing)[:10]}")
        await asyncio.sleep(0.02)


class Churn:
    """Creates, updates and deletes pods in the simulator, deterministically."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.rng = random.Random(7)
        self.next = 0

    def step(self, n: int) -> None:
        for _ in range(n):
            live = self.sim.store.list("pods")
            roll = self.rng.random()
            if not live or roll < 0.4:
                self.next += 1
                self.sim.store.create("pods", make_pod(f"p{self.next:03d}", f"ns{self.next % 3}"))
            elif roll < 0.8:
                o = self.rng.choice(live)
                self.sim.store.patch("pods", o["metadata"]["name"],
                                     {"metadata": {"labels": {"gen": str(self.next)}}},
                                     namespace=o["metadata"]["namespace"])
                self.next += 1
            else:
                o = self.rng.choice(live)
                self.sim.store.delete("pods", o["metadata"]["name"], namespace=o["metadata"]["namespace"])


@pytest.fixture
async def running(sim: Simulator) -> AsyncIterator[tuple[Reflector, IndexedCache, ApiClient]]:
    client = ApiClient(server=sim.url, clock=InstantClock())
    lw: HttpListerWatcher = await lister_watcher_for(client, Discovery(client=client), "pods")
    cache = IndexedCache()
    clock = RealClock()
    reflector = Reflector(
        name="pods", lister_watcher=lw, store=cache, clock=clock, page_size=7,
        backoff=Backoff(clock=clock, initial=0.01, cap=0.05, jitter=0.0), rng=random.Random(1),
    )
    task = asyncio.create_task(reflector.run(), name="test-reflector")
    yield reflector, cache, client
    reflector.stop()
    await asyncio.wait_for(task, 10)
    await client.close()


async def test_reflector_converges_through_every_fault(
    sim: Simulator, running: tuple[Reflector, IndexedCache, ApiClient]
) -> None:
    reflector, cache, client = running
    churn = Churn(sim)
    churn.step(30)
    await converged(sim, cache)
    lists = reflector.list_count
    assert lists >= 1

    # A watch closed cleanly after 3 events: re-watch from the last RV, no relist needed.
    watches = sim.requests["watch"]
    sim.set_faults(watch_close_after=3)
    churn.step(20)
    await converged(sim, cache)
    assert sim.requests["watch"] - watches >= 2
    sim.set_faults({})

    # Lines cut in half at the connection drop.
    watches = sim.requests["watch"]
    sim.set_faults(watch_cut_after=2)
    churn.step(15)
    await converged(sim, cache)
    assert sim.requests["watch"] - watches >= 2
    sim.set_faults({})

    # 429 / 503 with Retry-After on lists and watches: retried by the REST layer.
    retries = client.retries
    sim.set_faults(error_code=429, error_count=4, error_retry_after=1, error_target="any")
    sim.expire_watches()  # forces a new watch (and a relist) through the errors
    churn.step(10)
    await converged(sim, cache)
    sim.set_faults(error_code=503, error_count=3, error_retry_after=1)
    sim.expire_watches()
    churn.step(10)
    await converged(sim, cache)
    assert client.retries - retries == 7
    sim.set_faults({})

    # ERROR 410 in the stream after a few events → relist.
    lists = reflector.list_count
    sim.set_faults(watch_expire_after=4)
    churn.step(12)
    await converged(sim, cache)
    assert reflector.list_count > lists
    sim.set_faults({})

    # History compacted while changes happen: whatever the watch asks for next is too old → relist.
    lists = reflector.list_count
    sim.compact()
    sim.expire_watches()
    churn.step(10)
    sim.compact()
    await converged(sim, cache)
    assert reflector.list_count > lists

    # And the normal path still works afterwards.
    churn.step(10)
    await converged(sim, cache)
    assert reflector.last_sync_resource_version
    assert int(reflector.last_sync_resource_version) <= sim.store.resource_version


async def test_watch_list_keeps_its_one_stream_under_churn(sim: Simulator) -> None:
    """WatchList: the initial state and every later change come through one request; the stream
    is never abandoned after the initial-events-end bookmark (no re-list, no second watch)."""
    churn = Churn(sim)
    churn.step(40)
    client = ApiClient(server=sim.url, clock=InstantClock())
    lw = await lister_watcher_for(client, Discovery(client=client), "pods")
    cache = IndexedCache()
    clock = RealClock()
    reflector = Reflector(
        name="pods", lister_watcher=lw, store=cache, clock=clock, use_watch_list=True,
        min_watch_timeout=300, backoff=Backoff(clock=clock, initial=0.01, cap=0.05, jitter=0.0),
        rng=random.Random(1),
    )
    before = dict(sim.requests)
    task = asyncio.create_task(reflector.run(), name="test-reflector-watchlist")
    try:
        await converged(sim, cache)
        # Churn for a while (bookmarks every 0.2 s in this simulator), converging at every step.
        loop = asyncio.get_running_loop()
        # KEB_WATCHLIST_SOAK_SECONDS=180 makes this the minutes-long soak (docs/performance.md).
        deadline = loop.time() + float(os.environ.get("KEB_WATCHLIST_SOAK_SECONDS", "6"))
        while loop.time() < deadline:
            churn.step(15)
            await asyncio.sleep(0.1)
        await converged(sim, cache)
        assert sim.requests["watch"] - before.get("watch", 0) == 1
        assert sim.requests["list"] - before.get("list", 0) == 0
        assert reflector.list_count == 1
        assert reflector.watch_count == 1
        assert reflector.watch_list_rejected is False
    finally:
        reflector.stop()
        await asyncio.wait_for(task, 10)
        await client.close()
