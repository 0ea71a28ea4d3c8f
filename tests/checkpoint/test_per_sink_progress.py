"""Issue #13: per-sink resume points and known indices, in-process against the simulator over HTTP.

Two sinks: ``fast`` acknowledges everything, ``slow`` stops acknowledging, then the bridge crashes
(:meth:`BridgePipeline.abort`: nothing drained, nothing flushed) after a checkpoint write. The
checkpoint keeps the slow sink's state as the shared base and the fast sink's as differences. After
the restart the watch resumes from the base:

* with the history intact, the fast sink receives nothing it acknowledged, the slow one every change
  it missed, in order;
* with the history expired (410 on resume, relist), each sink receives exactly the differences
  against its own index: deletes only of objects it knew, adds of objects it never knew, updates of
  objects it knew at another resourceVersion, nothing for what it has.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.checkpoint import CheckpointStore, FileCheckpointStore, informer_id
from bridge.testing import BareCheckpointStore
from sinks.contract import EventType
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until, watched_over_http

NS = "persink"
IDENT = informer_id("configmaps", NS, "", "")
PATH = f"/api/v1/namespaces/{NS}/configmaps"
CHANGES = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.2) as world:
        yield world


def store_for(ckpt: Path | BareCheckpointStore) -> CheckpointStore:
    return ckpt if isinstance(ckpt, BareCheckpointStore) else FileCheckpointStore(directory=ckpt)


async def pipeline(client: ApiClient, ckpt: Path | BareCheckpointStore, sinks: list[RecordingSink], *,
                   checkpoint_interval: float = 3600, store: CheckpointStore | None = None) -> BridgePipeline:
    """``store`` replaces the one ``ckpt`` names (a test's own wrapper of the file store)."""
    factory, watched = await watched_over_http(client, "configmaps", "ConfigMap", NS)
    for sink in sinks:
        sink.overflow_policy = "spill"  # never holds the informer (no spill directory: memory only)
    return BridgePipeline(factory=factory, resources=[watched],
                          sinks=sinks, checkpoint_store=store or store_for(ckpt),
                          checkpoint_interval=checkpoint_interval, cluster="sim")


def changes(sink: RecordingSink) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of the change events the sink received, in order."""
    return [(e.type.value, e.name, e.resource_version) for e in sink.events if e.type in CHANGES]


def meta(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["name"], obj["metadata"]["resourceVersion"]


async def crash_with_slow_sink_behind(
        client: ApiClient, ckpt: Path | BareCheckpointStore,
        after_write: Callable[[BridgePipeline, RecordingSink, RecordingSink], Awaitable[None]] | None = None,
) -> list[tuple[str, str, str]]:
    """Both sinks synced on o0..o4, then slow stops acknowledging while o0 is updated, n1 created,
    o1 deleted, n3 created; a checkpoint is written and the bridge crashes (``after_write(pipeline,
    fast, slow)`` runs between the write and the crash). Returns the changes slow missed."""
    for i in range(5):
        await client.create(PATH, {"metadata": {"name": f"o{i}"}, "data": {"v": "0"}})
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await pipeline(client, ckpt, [fast, slow])
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        await until(lambda: len(slow.events) == 5 and len(fast.events) == 5, what="the initial adds")
        tracker = p.tracker(IDENT)
        await until(lambda: not tracker.pending and tracker.lag == 0, what="everything acked")
        slow.auto_ack = False
        missed = []
        o0 = await client.patch(f"{PATH}/o0", {"data": {"v": "1"}})
        missed.append(("updated", *meta(o0)))
        n1 = await client.create(PATH, {"metadata": {"name": "n1"}})
        missed.append(("added", *meta(n1)))
        o1 = await client.delete(f"{PATH}/o1")
        missed.append(("deleted", *meta(o1)))
        n3 = await client.create(PATH, {"metadata": {"name": "n3"}})
        missed.append(("added", *meta(n3)))
        await until(lambda: len(fast.events) == 9 and len(slow.unacked) == 4, what="the changes")
        await until(lambda: int(tracker.resource_version) >= int(o1["metadata"]["resourceVersion"])
                    or tracker.pending == 4, what="the progress marker")
        assert await p.write_checkpoints() == 1
        if after_write is not None:
            await after_write(p, fast, slow)
    finally:
        await p.abort()
    cp = await store_for(ckpt).load(IDENT)
    assert cp is not None
    assert cp.sinks is not None
    assert cp.sinks["slow"].at_base
    own = cp.sinks["fast"]
    assert int(own.resource_version) >= int(o1["metadata"]["resourceVersion"])
    assert int(cp.resource_version) < int(o0["metadata"]["resourceVersion"])  # the base: slow's
    # Only the differences: o0's new state, n1 and n3, and o1 gone.
    assert set(own.objects) | set(own.ahead) == {f"{NS}/o0", f"{NS}/n1", f"{NS}/o1", f"{NS}/n3"}
    assert len(cp.objects) == 5
    return missed


async def test_after_a_crash_each_sink_resumes_from_its_own_point(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    _, client = sim
    missed = await crash_with_slow_sink_behind(client, tmp_path / "ckpt")
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await pipeline(client, tmp_path / "ckpt", [fast, slow])
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        await until(lambda: len(slow.events) == 4, what="slow's missed changes")
        assert p.listener(IDENT, "fast").own_progress is not None
        later = await client.patch(f"{PATH}/o2", {"data": {"v": "2"}})
        await until(lambda: len(fast.events) == 1 and len(slow.events) == 5, what="a new change")
        # Caught up: the informer passed each sink's own point and they agree on every object, so
        # the filters are gone (a later change costs them nothing).
        await client.patch(f"{PATH}/o2", {"data": {"v": "3"}})
        await until(lambda: len(fast.events) == 2, what="one more change")
        assert p.listener(IDENT, "fast").own_progress is None
        assert p.listener(IDENT, "slow").own_progress is None
    finally:
        await p.shutdown(5)
    assert changes(slow)[:5] == [*missed, ("updated", *meta(later))]
    assert changes(fast)[:1] == [("updated", *meta(later))]  # nothing it had acknowledged


@pytest.mark.parametrize("store", ["file", "no journal"])
async def test_with_history_expired_each_sink_gets_the_differences_against_its_own_index(
        sim: tuple[Simulator, ApiClient], tmp_path: Path, store: str) -> None:
    simulator, client = sim
    # The bare store has no known-object journal (a third-party store may have none): what a sink
    # needs after a relist then rests on the per-sink progress alone.
    ckpt: Path | BareCheckpointStore = tmp_path / "ckpt" if store == "file" else BareCheckpointStore()
    await crash_with_slow_sink_behind(client, ckpt)
    # While the bridge is down: n1 (known to fast only) goes, o2 changes, o3 goes, n2 comes.
    await client.delete(f"{PATH}/n1")
    o2 = await client.patch(f"{PATH}/o2", {"data": {"v": "2"}})
    await client.delete(f"{PATH}/o3")
    n2 = await client.create(PATH, {"metadata": {"name": "n2"}})
    await client.request("POST", "/_sim/compact")
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await pipeline(client, ckpt, [fast, slow])
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        await until(lambda: any(e.type is EventType.GAP_END for e in fast.events)
                    and any(e.type is EventType.GAP_END for e in slow.events), what="the relists' ends")
        reflector = p.informers[IDENT].reflector
        assert reflector is not None
        assert reflector.list_count == 1  # the resume got 410
    finally:
        await p.shutdown(5)
    o0 = (await client.get(f"{PATH}/o0"))["metadata"]["resourceVersion"]

    def diff(sink: RecordingSink) -> set[tuple[str, str, str]]:
        got = changes(sink)
        assert len(got) == len(set(got)), got
        return {(t, n, rv if t != "deleted" else "") for t, n, rv in got}

    # fast knew o0 (new state), n1, o2, o3 and o4: n1 and o3 are deleted, o2 updated, n2 added.
    assert diff(fast) == {("deleted", "n1", ""), ("updated", *meta(o2)), ("deleted", "o3", ""),
                          ("added", *meta(n2))}
    # slow knew o0 (old state), o1, o2, o3, o4; never n3, which the relist finds unchanged (the
    # informer, seeded with what fast knows, has it as it is): an add. It never acknowledged n1, but
    # n1 was in flight to it at the crash (created after its own resume point): with a journal,
    # which records n1 as delivered to some sink, slow gets n1's delete too; without one, the
    # per-sink progress alone says slow never had n1.
    n3 = (await client.get(f"{PATH}/n3"))["metadata"]["resourceVersion"]
    in_flight = {("deleted", "n1", "")} if store == "file" else set()
    assert diff(slow) == {("updated", "o0", o0), ("deleted", "o1", ""), ("updated", *meta(o2)),
                          ("deleted", "o3", ""), ("added", *meta(n2)), ("added", "n3", n3), *in_flight}
    assert simulator is not None
