"""Resync snapshots: framing markers, counts and contents matching the cache; per-sink periods
(FakeClock), on-demand and first-start snapshots; SinkListener conversion of every notification."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from bridge.clock import FakeClock
from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind, ObjectKey
from bridge.delivery.pipeline import BridgePipeline, SinkListener
from bridge.service.cli import main as cli_main
from bridge.service.health import HealthServer, Readiness
from bridge.storage.checkpoint import FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType
from tests.checkpoint.helpers import CONFIGMAPS, WATCHED, RecordingSink, cm, fake_builder, until

IDENT = WATCHED.informer_id


def snapshots(events: list[ChangeEvent]) -> list[list[ChangeEvent]]:
    """Groups the events between each begin and end marker (markers included)."""
    out: list[list[ChangeEvent]] = []
    current: list[ChangeEvent] | None = None
    for e in events:
        if e.type is EventType.SNAPSHOT_BEGIN:
            assert current is None, "nested snapshot"
            current = [e]
        elif current is not None:
            current.append(e)
            if e.type is EventType.SNAPSHOT_END:
                out.append(current)
                current = None
        else:
            assert e.type is not EventType.SYNC, "sync event outside a snapshot"
    assert current is None, "unterminated snapshot"
    return out


def check_snapshot(snap: list[ChangeEvent], cache: Sequence[Mapping[str, object]]) -> None:
    begin, *syncs, end = snap
    assert begin.type is EventType.SNAPSHOT_BEGIN
    assert end.type is EventType.SNAPSHOT_END
    assert begin.snapshot is not None
    assert end.snapshot is not None
    assert begin.snapshot.id == end.snapshot.id
    assert begin.obj is None
    assert end.obj is None
    assert end.snapshot.count == len(syncs) == len(cache)
    assert all(e.type is EventType.SYNC and e.snapshot is not None and e.snapshot.id == begin.snapshot.id
               for e in syncs)
    assert sorted((e.subject, e.resource_version, dict(e.obj or {}).get("data")) for e in syncs) == sorted(
        (f"{o['metadata']['namespace']}/{o['metadata']['name']}", o["metadata"]["resourceVersion"],  # type: ignore[index]
         o.get("data")) for o in cache
    )


async def test_per_sink_resync_periods_with_fake_clock(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(4):
        source.add(cm(f"o{i}", v=str(i)))
    clock = FakeClock()
    every10, every25, never = (RecordingSink("ten", resync_period=10), RecordingSink("q", resync_period=25),
                               RecordingSink("never"))
    p = BridgePipeline(resources=[WATCHED], sinks=[every10, every25, never],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path),
                       build_informer=fake_builder(source, clock),
                       clock=clock, checkpoint_interval=1000)
    await p.start()
    await until(lambda: all(len(s.events) == 4 for s in (every10, every25, never)), what="initial adds")
    source.modify(cm("o1", v="changed"))
    await until(lambda: len(never.events) == 5, what="update")
    for _ in range(5):  # t = 10, 20, 30, 40, 50
        await clock.advance(10)
        await until(lambda: p.stats().queue_depth == {"ten": 0, "q": 0, "never": 0})
    informer = p.informers[IDENT]
    await until(lambda: len(snapshots(every10.events)) == 5, what="five snapshots of 'ten'")
    await until(lambda: len(snapshots(every25.events)) == 2, what="two snapshots of 'q'")
    assert snapshots(never.events) == []
    cache = informer.get_indexer().list()
    for snap in snapshots(every10.events) + snapshots(every25.events):
        check_snapshot(snap, cache)
        assert snap[-1].snapshot is not None
        assert snap[-1].snapshot.resource_version == "5"
    # Each snapshot is acked as a whole: the checkpoint still advances.
    assert p.tracker(IDENT).pending == 0
    assert p.listener(IDENT, "ten").stats.snapshots == 5
    await p.shutdown(5)


async def test_snapshot_now_and_unknown_resource(tmp_path: Path) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    source.add(cm("b", ns="other"))
    clock = FakeClock()
    s1, s2 = RecordingSink("s1"), RecordingSink("s2", routing_resources=frozenset({"pods"}))
    p = BridgePipeline(resources=[WATCHED], sinks=[s1, s2],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path),
                       build_informer=fake_builder(source, clock), clock=clock)
    await p.start()
    assert await p.wait_for_sync(5)
    assert await p.snapshot_now("configmaps") == [IDENT]
    assert await p.snapshot_now("ConfigMap") == [IDENT]
    assert await p.snapshot_now() == [IDENT]
    with pytest.raises(LookupError, match="pods"):
        await p.snapshot_now("pods")
    # Requests waiting together make one snapshot; one asked once it is through, another.
    await until(lambda: len(snapshots(s1.events)) == 1, what="a snapshot")
    listener = p.informers[IDENT]._processor.listeners[0]
    await until(lambda: listener.snapshots_pending == 0, what="the snapshot handled")
    assert await p.snapshot_now() == [IDENT]
    await until(lambda: len(snapshots(s1.events)) == 2, what="2 snapshots")
    for snap in snapshots(s1.events):
        check_snapshot(snap, p.informers[IDENT].get_indexer().list())
    assert s2.events == []  # routed to pods only: no listener on configmaps
    await p.shutdown(5)


async def test_snapshot_on_first_start_only(tmp_path: Path) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))

    async def run_once() -> RecordingSink:
        clock = FakeClock()
        sink = RecordingSink("s")
        p = BridgePipeline(resources=[WATCHED], sinks=[sink],
                           checkpoint_store=FileCheckpointStore(directory=tmp_path),
                           build_informer=fake_builder(source, clock), clock=clock,
                           snapshot_on_first_start=True)
        await p.start()
        assert await p.wait_for_sync(5)
        await until(lambda: p.tracker(IDENT).resource_version != "", what="acks")
        if not p.resumed(IDENT):
            await until(lambda: len(snapshots(sink.events)) == 1, what="first-start snapshot")
        await p.shutdown(5)
        return sink

    first = await run_once()
    assert [e.type.value for e in first.events] == ["added", "snapshot.begin", "sync", "snapshot.end"]
    second = await run_once()  # resumed from the checkpoint: no snapshot, nothing re-sent
    assert second.events == []


def listener_events(n: Notification) -> list[tuple[str, str, bool]]:
    lst = SinkListener(sink=RecordingSink("x"), resource=CONFIGMAPS, cluster="c", clock=FakeClock())
    return [(e.type.value, e.resource_version, e.final_state_unknown) for e in lst.events_for(n)]


def obj(name: str, rv: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}


def test_sink_listener_maps_every_notification_kind() -> None:
    add = Notification(kind=NotificationKind.ADD, obj=obj("a", "1"), seq=0)
    upd = Notification(kind=NotificationKind.UPDATE, obj=obj("a", "2"), old=obj("a", "1"), seq=1)
    resync = Notification(kind=NotificationKind.UPDATE, obj=obj("a", "2"), old=obj("a", "2"),
                          is_resync=True, seq=2)
    dele = Notification(kind=NotificationKind.DELETE, obj=obj("a", "3"), seq=3)
    tomb = Notification(kind=NotificationKind.DELETE,
                        obj=DeletedFinalStateUnknown(key=ObjectKey("ns/a"), obj=obj("a", "2")), seq=4)
    snap = Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[obj("a", "2"), obj("b", "5")],
                        resource_version="7", seq=5)
    assert listener_events(add) == [("added", "1", False)]
    assert listener_events(upd) == [("updated", "2", False)]
    assert listener_events(resync) == []
    assert listener_events(dele) == [("deleted", "3", False)]
    assert listener_events(tomb) == [("deleted", "2", True)]
    assert listener_events(snap) == [("snapshot.begin", "7", False), ("sync", "2", False),
                                     ("sync", "5", False), ("snapshot.end", "7", False)]


async def test_sink_listener_acks_the_notification_after_every_event() -> None:
    sink = RecordingSink("x", auto_ack=False)
    clock = FakeClock()
    lst = SinkListener(sink=sink, resource=CONFIGMAPS, cluster="c", clock=clock)
    acks: list[int] = []
    snap = Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[obj("a", "2"), obj("b", "5")],
                        resource_version="7", seq=5)
    await lst.handle(snap, lambda: acks.append(5))
    assert len(sink.unacked) == 4
    events = sink.unacked
    events[3][1](DeliveryOutcome.DELIVERED)
    events[0][1](DeliveryOutcome.FILTERED)
    events[0][1](DeliveryOutcome.DELIVERED)  # a duplicate ack counts once
    events[1][1](DeliveryOutcome.DEAD_LETTERED)
    assert acks == []
    events[2][1](DeliveryOutcome.DELIVERED)
    assert acks == [5]
    assert dict(lst.stats.outcomes) == {"delivered": 2, "filtered": 1, "dead_lettered": 1}
    assert all(e.time == clock.wall() for e, _ in events)
    resync = Notification(kind=NotificationKind.UPDATE, obj=obj("a", "2"), old=obj("a", "2"),
                          is_resync=True, seq=6)
    await lst.handle(resync, lambda: acks.append(6))
    assert acks == [5, 6]
    assert lst.stats.resync_skipped == 1
    # A one-event notification: acked with its event, once, however often the sink acks it.
    upd = Notification(kind=NotificationKind.UPDATE, obj=obj("a", "3"), old=obj("a", "2"), seq=7)
    await lst.handle(upd, lambda: acks.append(7))
    assert acks == [5, 6]
    (event, event_ack), = sink.unacked[4:]
    assert event.type is EventType.UPDATED
    event_ack(DeliveryOutcome.DELIVERED)
    event_ack(DeliveryOutcome.DEAD_LETTERED)
    assert acks == [5, 6, 7]
    assert dict(lst.stats.outcomes) == {"delivered": 3, "filtered": 1, "dead_lettered": 1}
    assert lst.stats.events == 5


async def test_a_snapshot_for_one_sink_through_the_admin_endpoint_and_the_cli(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(3):
        source.add(cm(f"o{i}", v=str(i)))
    clock = FakeClock()
    a, b = RecordingSink("a"), RecordingSink("b")
    p = BridgePipeline(resources=[WATCHED], sinks=[a, b],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path),
                       build_informer=fake_builder(source, clock), clock=clock)
    server = HealthServer(host="127.0.0.1", port=0, readiness=lambda: Readiness(True), metrics=lambda: b"",
                          snapshot=p.snapshot_now, admin_host="127.0.0.1", admin_port=0)
    await p.start()
    await server.start()
    try:
        await until(lambda: len(a.events) == 3 and len(b.events) == 3, what="initial adds")
        url = f"http://127.0.0.1:{server.admin_port}"
        assert await asyncio.to_thread(cli_main, ["snapshot", "--url", url, "--sink", "b"]) == 0
        await until(lambda: len(snapshots(b.events)) == 1, what="b's snapshot")
        check_snapshot(snapshots(b.events)[0], p.informers[IDENT].get_indexer().list())
        source.modify(cm("o1", v="live"))
        await until(lambda: len(a.events) == 4 and b.events[-1].type is EventType.UPDATED, what="live change")
        assert [e.type for e in a.events] == [EventType.ADDED] * 3 + [EventType.UPDATED]  # no re-sends
        assert p.tracker(IDENT).pending == 0  # a owed nothing for b's snapshot
        assert await asyncio.to_thread(cli_main, ["snapshot", "--url", url, "--sink", "nope"]) == 1
        with pytest.raises(LookupError, match="no sink is called 'nope'"):
            await p.snapshot_now(sink="nope")
        with pytest.raises(LookupError, match="receives no watched resource called 'pods'"):
            await p.snapshot_now("pods", sink="b")
    finally:
        await server.stop()
        await p.shutdown(5)
