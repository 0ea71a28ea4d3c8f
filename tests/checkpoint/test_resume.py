"""Resume from a checkpoint with the in-memory fake source: no relist while the RV is valid, only
the differences after a 410, full resync on a corrupt checkpoint."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bridge.clock import FakeClock
from bridge.delivery.pipeline import BridgePipeline
from bridge.storage.checkpoint import Checkpoint, CheckpointStoreError, FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from tests.checkpoint.helpers import CONFIGMAPS, WATCHED, RecordingSink, cm, fake_builder, until

IDENT = WATCHED.informer_id


def make(source: FakeControllerSource, tmp_path: Path, sink: RecordingSink,
         clock: FakeClock | None = None) -> BridgePipeline:
    clock = clock or FakeClock()
    return BridgePipeline(
        resources=[WATCHED], sinks=[sink], checkpoint_store=FileCheckpointStore(directory=tmp_path),
        build_informer=fake_builder(source, clock), clock=clock,
        cluster="test", checkpoint_interval=3600,
    )


async def run_first(source: FakeControllerSource, tmp_path: Path) -> RecordingSink:
    """A first bridge: full list, everything acked, checkpoint written on shutdown."""
    sink = RecordingSink("k")
    p = make(source, tmp_path, sink)
    await p.start()
    assert await p.wait_for_sync(10)
    await until(lambda: p.tracker(IDENT).resource_version == str(source.resource_version), what="acks")
    await p.shutdown(5)
    assert sink.closed
    return sink


async def test_fresh_start_delivers_adds_and_checkpoints(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(3):
        source.add(cm(f"c{i}", v=str(i)))
    sink = await run_first(source, tmp_path)
    assert sink.changes() == [("added", f"default/c{i}", str(i + 1), False) for i in range(3)]
    assert all(e.cluster == "test" and e.resource == CONFIGMAPS for e in sink.events)
    cp = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert cp is not None
    assert cp.resource_version == "3"
    assert dict(cp.objects) == {f"default/c{i}": (source.items()[i]["metadata"]["uid"], str(i + 1))
                                for i in range(3)}


async def test_resume_delivers_every_change_since_without_relist(tmp_path: Path) -> None:
    source = FakeControllerSource()
    a = source.add(cm("a"))
    b = source.add(cm("b"))
    await run_first(source, tmp_path)
    # While the bridge is down: several updates of one object (each must be delivered), a delete, an add.
    for v in ("1", "2", "3"):
        source.modify(cm("a", v=v))
    source.delete(b)
    source.add(cm("c"))
    calls_before = len(source.list_calls())

    sink = RecordingSink("k")
    p = make(source, tmp_path, sink)
    await p.start()
    assert p.resumed(IDENT)
    await until(lambda: len(sink.changes()) == 5, what="5 changes")
    assert sink.changes() == [
        ("updated", "default/a", "3", False),
        ("updated", "default/a", "4", False),
        ("updated", "default/a", "5", False),
        ("deleted", "default/b", "6", False),
        ("added", "default/c", "7", False),
    ]
    assert len(source.list_calls()) == calls_before  # no relist
    assert source.watch_calls()[-1].resource_version == "2"
    # The update's old state is the checkpoint's stub: metadata only.
    assert sink.events[0].old == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "a", "namespace": "default", "uid": a["metadata"]["uid"], "resourceVersion": "1"}}
    await until(lambda: p.tracker(IDENT).resource_version == "7", what="acked rv 7")
    await p.shutdown(5)
    cp = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert cp is not None
    assert cp.resource_version == "7"
    assert sorted(cp.objects) == ["default/a", "default/c"]


async def test_expired_resume_point_emits_only_the_differences(tmp_path: Path) -> None:
    source = FakeControllerSource()
    source.add(cm("same"))
    changed = source.add(cm("changed"))
    gone = source.add(cm("gone"))
    recreated = source.add(cm("recreated"))
    await run_first(source, tmp_path)
    source.modify(cm("changed", v="1"))
    source.modify(cm("changed", v="2"))  # two updates: coalesced into the latest state
    source.delete(gone)
    source.delete(recreated)
    new = source.add(cm("recreated", v="new"))
    source.add(cm("fresh"))
    source.compact()  # the checkpoint's RV (4) is now too old: 410

    sink = RecordingSink("k")
    p = make(source, tmp_path, sink)
    await p.start()
    await until(lambda: len(sink.changes()) == 5, what="5 changes")
    await until(lambda: p.tracker(IDENT).resource_version == str(source.resource_version), what="acks")
    got = sorted(sink.changes())
    assert got == sorted([
        ("updated", "default/changed", "6", False),
        ("deleted", "default/gone", "3", True),
        ("deleted", "default/recreated", "4", True),
        ("added", "default/recreated", "9", False),
        ("added", "default/fresh", "10", False),
    ])
    # The re-creation arrives as delete of the old uid, then add of the new one.
    rec = [e for e in sink.events if e.subject == "default/recreated"]
    assert [(e.type.value, e.uid) for e in rec] == [
        ("deleted", recreated["metadata"]["uid"]), ("added", new["metadata"]["uid"])]
    # The unchanged object was not re-sent; the listener saw it only as a skipped same-RV update.
    assert not [e for e in sink.events if e.subject == "default/same"]
    assert len(source.list_calls()) >= 2
    tomb = next(e for e in sink.events if e.subject == "default/gone")
    assert tomb.obj is not None
    assert tomb.uid == gone["metadata"]["uid"]
    assert changed["metadata"]["uid"] == next(e.uid for e in sink.events if e.subject == "default/changed")
    await p.shutdown(5)
    cp = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert cp is not None
    assert sorted(cp.objects) == ["default/changed", "default/fresh", "default/recreated", "default/same"]
    assert cp.objects["default/recreated"] == (new["metadata"]["uid"], "9")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
async def test_corrupt_checkpoint_warns_and_resyncs_fully(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    source.add(cm("b"))
    await run_first(source, tmp_path)
    path = FileCheckpointStore(directory=tmp_path).path_for(IDENT)
    data = path.read_bytes()
    path.write_bytes(data[:-10] if damage == "truncate" else b"\x00garbage")
    sink = RecordingSink("k")
    p = make(source, tmp_path, sink)
    with caplog.at_level(logging.WARNING, logger="bridge.delivery"):
        await p.start()
    assert not p.resumed(IDENT)
    assert any("corrupt or unreadable" in r.getMessage() and r.informer == IDENT  # type: ignore[attr-defined]
               for r in caplog.records if r.levelno == logging.WARNING)
    await until(lambda: len(sink.changes()) == 2, what="full resync")
    assert sorted(sink.changes()) == [("added", "default/a", "1", False), ("added", "default/b", "2", False)]
    await until(lambda: p.tracker(IDENT).resource_version == "2", what="acks")
    await p.shutdown(5)
    cp = await FileCheckpointStore(directory=tmp_path).load(IDENT)  # repaired
    assert cp is not None
    assert cp.resource_version == "2"


async def test_checkpoint_waits_for_every_sink(tmp_path: Path) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    clock = FakeClock()
    fast, slow = RecordingSink("fast"), RecordingSink("slow", auto_ack=False)
    p = BridgePipeline(
        resources=[WATCHED], sinks=[fast, slow], checkpoint_store=FileCheckpointStore(directory=tmp_path),
        build_informer=fake_builder(source, clock), clock=clock,
        checkpoint_interval=10,
    )
    await p.start()
    await until(lambda: len(slow.unacked) == 1 and len(fast.events) == 1, what="delivery")
    await clock.advance(10)
    assert p.tracker(IDENT).pending == 1
    assert await FileCheckpointStore(directory=tmp_path).load(IDENT) is None  # nothing acked by all
    slow.ack_all()
    assert p.tracker(IDENT).resource_version == "1"
    await clock.advance(10)  # the periodic writer saves it
    await until(lambda: p.stats().checkpoint_rv[IDENT] == "1", what="periodic checkpoint")
    st = p.stats()
    none = {"filtered": 0, "dead_lettered": 0, "dropped": 0}  # every outcome is there, zero too
    assert st.sinks == {"fast": {"delivered": 1, **none}, "slow": {"delivered": 1, **none}}
    assert st.received[IDENT] == {"add": 1}
    assert st.checkpoint_age[IDENT] == 0.0
    assert st.checkpoint_lag[IDENT] == 0
    assert p.ready()
    await p.shutdown(5)
    assert not p.ready()


async def test_shutdown_with_a_stuck_sink_keeps_its_deadline_and_checkpoints_only_acks(
    tmp_path: Path,
) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    clock = FakeClock()
    ok, stuck = RecordingSink("ok"), RecordingSink("stuck", auto_ack=False)
    p = BridgePipeline(
        resources=[WATCHED], sinks=[ok, stuck], checkpoint_store=FileCheckpointStore(directory=tmp_path),
        build_informer=fake_builder(source, clock), clock=clock, checkpoint_interval=3600,
    )
    await p.start()
    await until(lambda: len(stuck.unacked) == 1, what="delivery")
    stuck.ack_all()
    await until(lambda: p.tracker(IDENT).resource_version == "1", what="first ack")
    source.add(cm("b"))
    await until(lambda: len(stuck.unacked) == 1 and len(ok.events) == 2, what="second delivery")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await p.shutdown(1.0)
    # Its 1 s deadline, not the stuck sink (which never acknowledges): what comes on top is closing,
    # which a loaded machine stretches; a shutdown that waited for the sink would never end.
    assert loop.time() - started < 1.0 + 20
    assert ok.closed
    assert stuck.closed
    cp = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert cp is not None
    assert cp.resource_version == "1"  # "b" was never acked by the stuck sink: it will be re-sent
    assert sorted(cp.objects) == ["default/a"]
    assert p.failed_tasks == []


class FlakyStore(FileCheckpointStore):
    """A file store whose saves fail while ``failing`` is set."""

    failing = True
    attempts = 0

    async def save(self, checkpoint: Checkpoint) -> None:
        self.attempts += 1
        if self.failing:
            raise CheckpointStoreError("disk full (injected)")
        await super().save(checkpoint)


async def test_failed_checkpoint_writes_are_retried_and_metrics_are_exposed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    clock = FakeClock()
    sink = RecordingSink("s")
    store = FlakyStore(directory=tmp_path)
    seen: list[tuple[str, str]] = []
    p = BridgePipeline(
        resources=[WATCHED], sinks=[sink], checkpoint_store=store,
        build_informer=fake_builder(source, clock), clock=clock, checkpoint_interval=5,
        on_event=lambda resource, kind: seen.append((resource, kind)),
    )
    await p.start()
    await until(lambda: p.tracker(IDENT).resource_version == "1", what="ack")
    with caplog.at_level(logging.WARNING, logger="bridge.delivery"):
        await clock.advance(5)
        await until(lambda: store.attempts == 1, what="first attempt")
    assert any("retrying at the next interval" in r.getMessage() for r in caplog.records)
    assert p.stats().checkpoint_age[IDENT] is None
    store.failing = False
    await clock.advance(5)
    await until(lambda: p.stats().checkpoint_rv[IDENT] == "1", what="second attempt")
    assert store.attempts == 2
    assert p.failed_tasks == []
    assert seen == [("configmaps", "add")]
    assert p.queue_depths() == {"s": 0}
    gauges = p.informer_gauges()
    assert list(gauges) == ["configmaps"]
    assert (gauges["configmaps"].cached_objects, gauges["configmaps"].checkpoint_lag) == (1, 0)
    assert gauges["configmaps"].relists == 1
    snap = p.telemetry_snapshot()
    assert snap.sinks["s"].up is True
    assert p.not_ready_reasons() == []
    await p.shutdown(5)
