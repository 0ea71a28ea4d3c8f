"""Per-sink progress never loses a delete: a sink that holds an object gets its delete after any crash.

The fault schedule found sinks left with objects the cluster had deleted (phantoms) after a
SIGKILL with per-sink progress. Two ways, each reproduced here in-process against the simulator
(two sinks: ``fast`` acknowledges everything, ``slow`` stops acknowledging; see
:mod:`tests.checkpoint.test_per_sink_progress`):

* **after the checkpoint write, a sink received an object its own progress says it does not have**
  (its section says it saw the key deleted, or does not know it at all). The known-object journal
  records that object (the base does not know it), but the sink's filter trusted its section and
  dropped the relist's delete of it. An object the journal records past a sink's own resume point
  may be held by that sink: its delete always goes out.
* **a sink's own-progress scan began at the first checkpoint write of a run**, so the changes the
  base applied before that write were missing from the sink's knowledge: the section written kept
  "saw it deleted" for an object the sink had since received again, and after the next crash its
  delete was dropped.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.checkpoint import Checkpoint, FileCheckpointStore, SinkProgress
from bridge.testing import BareCheckpointStore
from sinks.contract import EventType
from tests.checkpoint.helpers import RecordingSink, until
from tests.checkpoint.test_per_sink_progress import (
    IDENT,
    NS,
    PATH,
    crash_with_slow_sink_behind,
    pipeline,
    sim,
    store_for,
)

__all__ = ["sim"]  # the simulator fixture


def deletes_of(sink: RecordingSink, uid: str) -> list[str]:
    return [e.resource_version for e in sink.events if e.type is EventType.DELETED and e.uid == uid]


def holds(sink: RecordingSink, name: str) -> str | None:
    """The uid ``sink`` holds under ``name`` after its events, in order (None: nothing)."""
    uid: str | None = None
    for e in sink.events:
        if e.name != name:
            continue
        if e.type in (EventType.ADDED, EventType.UPDATED):
            uid = e.uid
        elif e.type is EventType.DELETED and e.uid == uid:
            uid = None
    return uid


async def restart_and_settle(client: ApiClient, ckpt: Path | BareCheckpointStore
                             ) -> tuple[RecordingSink, RecordingSink]:
    """Restarts the bridge with both sinks acknowledging, until the informer passed the current
    resourceVersion and every sink acknowledged everything; then shuts it down."""
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await pipeline(client, ckpt, [fast, slow])
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        marker = await client.create(PATH, {"metadata": {"name": "marker"}})
        rv = int(marker["metadata"]["resourceVersion"])
        tracker = p.tracker(IDENT)
        await until(lambda: tracker.resource_version.isdigit() and int(tracker.resource_version) >= rv
                    and tracker.lag == 0, what="everything acknowledged")
    finally:
        await p.shutdown(5)
    return fast, slow


async def test_an_object_a_fast_sink_received_after_the_checkpoint_gets_its_delete_after_a_relist(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    """fast's section says it saw o1 deleted; after the write o1 is re-created and fast receives it;
    crash; o1 is deleted while the bridge is down and the history compacted: the relist's delete of
    the re-created o1 reaches fast (seed 13 of the fault schedule: kafka, webhook, file)."""
    _, client = sim
    ckpt = tmp_path / "ckpt"
    created: dict[str, str] = {}

    async def recreate(p: BridgePipeline, fast: RecordingSink, slow: RecordingSink) -> None:
        o1 = await client.create(PATH, {"metadata": {"name": "o1"}})
        created["uid"] = o1["metadata"]["uid"]
        await until(lambda: holds(fast, "o1") == created["uid"], what="fast receives the new o1")

    await crash_with_slow_sink_behind(client, ckpt, after_write=recreate)
    cp = await store_for(ckpt).load(IDENT)
    assert cp is not None
    assert cp.sinks is not None
    assert cp.sinks["fast"].objects[f"{NS}/o1"] is None  # it saw o1 deleted, as of the write
    await client.delete(f"{PATH}/o1")
    await client.request("POST", "/_sim/compact")
    fast, _ = await restart_and_settle(client, ckpt)
    assert deletes_of(fast, created["uid"]), fast.changes()


async def test_an_object_a_slow_sink_received_after_the_checkpoint_gets_its_delete_after_a_relist(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    """slow is the base and does not know n1 (only fast's section does); after the write slow
    catches up, receiving n1; crash; n1 is deleted while the bridge is down and the history
    compacted: the relist's delete of n1 reaches slow (seed 13 of the fault schedule: jetstream)."""
    _, client = sim
    ckpt = tmp_path / "ckpt"

    async def catch_up(p: BridgePipeline, fast: RecordingSink, slow: RecordingSink) -> None:
        slow.auto_ack = True
        slow.ack_all()
        tracker = p.tracker(IDENT)
        await until(lambda: not tracker.pending, what="slow acknowledges what it missed")

    await crash_with_slow_sink_behind(client, ckpt, after_write=catch_up)
    cp = await store_for(ckpt).load(IDENT)
    assert cp is not None
    assert cp.sinks is not None
    assert cp.sinks["slow"].at_base
    assert f"{NS}/n1" not in cp.objects
    n1 = await client.get(f"{PATH}/n1")
    await client.delete(f"{PATH}/n1")
    await client.request("POST", "/_sim/compact")
    fast, slow = await restart_and_settle(client, ckpt)
    uid = n1["metadata"]["uid"]
    assert deletes_of(slow, uid), slow.changes()
    assert deletes_of(fast, uid), fast.changes()


async def test_a_sinks_section_takes_the_changes_applied_before_the_first_write_of_a_run(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    """fast's section says it saw o1 deleted; the next run re-creates o1 and every sink acknowledges
    it before that run's first checkpoint write: the section written must not say fast saw o1
    deleted (it has the new one); after a crash, o1's delete reaches fast."""
    _, client = sim
    ckpt = tmp_path / "ckpt"
    await crash_with_slow_sink_behind(client, ckpt)
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await pipeline(client, ckpt, [fast, slow])
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        o1 = await client.create(PATH, {"metadata": {"name": "o1"}})
        rv = int(o1["metadata"]["resourceVersion"])
        tracker = p.tracker(IDENT)
        await until(lambda: tracker.resource_version.isdigit() and int(tracker.resource_version) >= rv
                    and tracker.lag == 0, what="the new o1 acknowledged by both")
        assert holds(fast, "o1") == o1["metadata"]["uid"]
        assert await p.write_checkpoints() == 1
    finally:
        await p.abort()
    cp = await store_for(ckpt).load(IDENT)
    assert cp is not None
    assert cp.sinks is not None
    assert cp.objects[f"{NS}/o1"][0] == o1["metadata"]["uid"]
    assert f"{NS}/o1" not in cp.sinks["fast"].objects, cp.sinks["fast"]  # it agrees with the base
    await client.delete(f"{PATH}/o1")
    fast, slow = await restart_and_settle(client, ckpt)
    assert deletes_of(fast, o1["metadata"]["uid"]), fast.changes()
    assert deletes_of(slow, o1["metadata"]["uid"]), slow.changes()


@pytest.mark.parametrize(("first_in_index", "journal"), [(False, True), (True, True), (False, False),
                                                        (True, False)])
async def test_a_later_incarnation_gets_its_delete_after_an_acknowledged_delete_of_its_key(
        sim: tuple[Simulator, ApiClient], tmp_path: Path, first_in_index: bool, journal: bool) -> None:
    """Every sink acknowledged o1's delete beyond the checkpoint's resourceVersion (the base has o1
    deleted in its delivered-ahead map; its index has the first o1 when its create was before the
    checkpoint's resourceVersion); then o1 was created again and fast received and acknowledged the
    new one (its section knows it; the journal, if the store keeps one, records it); crash. The new
    o1 is deleted while the bridge is down and the history compacted: the relist finds o1 gone, which
    for fast is the new o1's delete — not the acknowledged one repeated — and slow gets it too when
    the journal says it may have had the new o1 (seed 29 of the random per-sink test). The
    checkpoint and journal are written as that run left them."""
    _, client = sim
    ckpt: Path | BareCheckpointStore = tmp_path / "ckpt" if journal else BareCheckpointStore()
    o0 = await client.create(PATH, {"metadata": {"name": "o0"}})
    first = await client.create(PATH, {"metadata": {"name": "o1"}})
    first_delete = await client.delete(f"{PATH}/o1")
    o1 = await client.create(PATH, {"metadata": {"name": "o1"}})
    uid, rv = o1["metadata"]["uid"], o1["metadata"]["resourceVersion"]
    base = first if first_in_index else o0
    index = {f"{NS}/o0": (o0["metadata"]["uid"], o0["metadata"]["resourceVersion"])}
    if first_in_index:
        index[f"{NS}/o1"] = (first["metadata"]["uid"], first["metadata"]["resourceVersion"])
    await store_for(ckpt).save(Checkpoint(
        informer_id=IDENT, resource_version=base["metadata"]["resourceVersion"], objects=index,
        ahead={f"{NS}/o1": ("", first_delete["metadata"]["resourceVersion"], True)},
        sinks={"fast": SinkProgress(resource_version=rv, objects={f"{NS}/o1": (uid, rv)}),
               "slow": SinkProgress()}))
    if isinstance(ckpt, Path):
        FileCheckpointStore(directory=ckpt).journal_path(IDENT).write_bytes(
            orjson.dumps({"journal": 1, "informer_id": IDENT}) + b"\n"
            + orjson.dumps(["a", f"{NS}/o1", uid, rv]) + b"\n")
    await client.delete(f"{PATH}/o1")
    await client.request("POST", "/_sim/compact")
    fast, slow = await restart_and_settle(client, ckpt)
    assert deletes_of(fast, uid), fast.changes()
    assert holds(fast, "o1") is None
    if journal:
        assert deletes_of(slow, uid), slow.changes()  # the journal says it may have had it
    # Nobody is sent the first o1's delete again (every sink has it): an older, inferred one.
    assert not deletes_of(fast, first["metadata"]["uid"]), fast.changes()
    assert not deletes_of(slow, first["metadata"]["uid"]), slow.changes()
