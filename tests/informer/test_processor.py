"""sharedProcessor and processorListener: ordering, acks, bounded buffers, resync bookkeeping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import (
    AckFunc,
    DeletedFinalStateUnknown,
    Gap,
    ListenerOptions,
    Notification,
    NotificationKind,
    ObjectKey,
    OverflowPolicy,
)
from bridge.informer.processor import ProcessorListener, SharedProcessor, determine_resync_period
from bridge.testing.recorder import RecordingHandler
from tests.informer.observer import RecordingObserver


def pod(name: str, rv: str, uid: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv, "uid": uid or f"u-{name}"}}


def add(name: str, rv: str, initial: bool = False) -> Notification:
    return Notification(kind=NotificationKind.ADD, obj=pod(name, rv), is_in_initial_list=initial,
                        key=ObjectKey(f"ns/{name}"))


def update(name: str, old_rv: str, rv: str) -> Notification:
    return Notification(kind=NotificationKind.UPDATE, obj=pod(name, rv), old=pod(name, old_rv),
                        is_resync=old_rv == rv, key=ObjectKey(f"ns/{name}"))


def delete(name: str, rv: str) -> Notification:
    return Notification(kind=NotificationKind.DELETE, obj=pod(name, rv), key=ObjectKey(f"ns/{name}"))


class DeferredAckSink:
    """A NotificationHandler that keeps the ack functions for the test to call."""

    def __init__(self) -> None:
        self.received: list[Notification] = []
        self.acks: list[AckFunc] = []
        self.got = asyncio.Event()

    async def handle(self, notification: Notification, ack: AckFunc) -> None:
        self.received.append(notification)
        self.acks.append(ack)
        self.got.set()


Proc = tuple[SharedProcessor, "RecordingObserver"]


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def processor(clock: FakeClock) -> AsyncIterator[tuple[SharedProcessor, RecordingObserver]]:
    observer = RecordingObserver()
    p = SharedProcessor(clock=clock, observer=observer, name="pods")
    p.start()
    yield p, observer
    await p.shutdown(1.0)


def listener(
    handler: Any, clock: FakeClock, name: str, observer: RecordingObserver | None = None, **opts: Any
) -> ProcessorListener:
    return ProcessorListener(handler=handler, options=ListenerOptions(name=name, **opts), clock=clock,
                             name=name, observer=observer)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_calls_in_order_and_acks_each_seq(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    rec = RecordingHandler()
    p.add_listener(listener(rec, clock, "rec", observer))
    await p.distribute(add("a", "1"), sync=False)
    await p.distribute(update("a", "1", "2"), sync=False)
    await p.distribute(delete("a", "2"), sync=False)
    p.progress("2")
    assert await rec.wait_for(3) == [
        ("add", "ns/a", "1", False),
        ("update", "ns/a", "1", "2"),
        ("delete", "ns/a", "2", False),
    ]
    await settle()
    assert [e for e in observer.events if e[0] != "acked"] == [
        ("dispatched", 0, "add", ("rec",)),
        ("dispatched", 1, "update", ("rec",)),
        ("dispatched", 2, "delete", ("rec",)),
        ("progress", 3, "2"),
    ]
    assert observer.acks("rec") == [0, 1, 2]
    stats = p.listeners[0].stats()
    assert (stats.received, stats.delivered, stats.acked, stats.handler_errors) == (3, 3, 3, 0)


async def test_tombstone_delete_reaches_handler(processor: Proc, clock: FakeClock) -> None:
    p, _ = processor
    rec = RecordingHandler()
    p.add_listener(listener(rec, clock, "rec"))
    tomb = DeletedFinalStateUnknown(ObjectKey("ns/a"), pod("a", "7"))
    await p.distribute(Notification(kind=NotificationKind.DELETE, obj=tomb, key=ObjectKey("ns/a")), False)
    assert await rec.wait_for(1) == [("delete", "ns/a", "7", True)]


async def test_raising_handler_counted_acked_carries_on(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    rec = RecordingHandler(fail_on=lambda call: call[1] == "ns/bad")
    lst = listener(rec, clock, "rec", observer)
    p.add_listener(lst)
    await p.distribute(add("bad", "1"), False)
    await p.distribute(add("good", "2"), False)
    assert await rec.wait_for(2) == [("add", "ns/bad", "1", False), ("add", "ns/good", "2", False)]
    await settle()
    stats = lst.stats()
    assert (stats.delivered, stats.handler_errors, stats.acked) == (1, 1, 2)
    assert observer.acks("rec") == [0, 1]


async def test_notification_handler_acks_when_it_calls_ack(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    sink = DeferredAckSink()
    p.add_listener(listener(sink, clock, "sink", observer))
    await p.distribute(add("a", "1"), False)
    await p.distribute(add("b", "2"), False)
    await settle()
    assert [n.seq for n in sink.received] == [0, 1]
    assert observer.acks("sink") == []
    sink.acks[1]()
    sink.acks[1]()  # a second call is ignored
    sink.acks[0]()
    assert observer.acks("sink") == [1, 0]


async def test_slow_listener_does_not_delay_another(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    slow = RecordingHandler(gate=gate)
    fast = RecordingHandler()
    p.add_listener(listener(slow, clock, "slow", observer))
    p.add_listener(listener(fast, clock, "fast", observer))
    for i in range(5):
        await p.distribute(add(f"o{i}", str(i + 1)), False)
    assert len(await fast.wait_for(5)) == 5
    await settle()
    assert slow.calls == []
    assert observer.acks("fast") == [0, 1, 2, 3, 4]
    assert observer.acks("slow") == []
    gate.set()
    assert len(await slow.wait_for(5)) == 5


async def test_block_policy_waits_for_room(processor: Proc, clock: FakeClock) -> None:
    p, _ = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", buffer_capacity=2, overflow_policy=OverflowPolicy.BLOCK)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)  # taken by the worker, which blocks in the handler
    await settle()
    await p.distribute(add("b", "2"), False)
    await p.distribute(add("c", "3"), False)
    assert lst.depth == 2
    blocked = asyncio.create_task(p.distribute(add("d", "4"), False), name="blocked-distribute")
    await settle()
    assert not blocked.done()
    gate.set()
    await blocked
    calls = await rec.wait_for(4)
    assert [c[1] for c in calls] == ["ns/a", "ns/b", "ns/c", "ns/d"]
    stats = lst.stats()
    assert (stats.dropped, stats.coalesced, stats.high_water) == (0, 0, 2)


async def test_coalesce_policy_merges_per_key_and_acks_superseded(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", observer, buffer_capacity=2, overflow_policy=OverflowPolicy.COALESCE)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)  # seq 0, in the handler
    await settle()
    await p.distribute(add("b", "2"), False)  # seq 1, buffered
    await p.distribute(update("a", "1", "3"), False)  # seq 2, buffered: full now
    await p.distribute(update("a", "3", "4"), False)  # seq 3 merges into seq 2
    await p.distribute(delete("b", "2"), False)  # seq 4 merges into seq 1
    assert observer.acks("rec") == [2, 1]
    assert lst.stats().coalesced == 2
    assert lst.depth == 2
    # Nothing pending for ns/c and no spill: never waits; ns/c is kept as a degraded latest state.
    await p.distribute(add("c", "5"), False)
    assert lst.stats().degraded == 1
    gate.set()
    assert await rec.wait_for(4) == [
        ("add", "ns/a", "1", False),
        ("delete", "ns/b", "2", False),
        ("update", "ns/a", "1", "4"),
        ("add", "ns/c", "5", False),
    ]
    await settle()
    assert sorted(observer.acks("rec")) == [0, 1, 2, 3, 4, 5]
    stats = lst.stats()
    # Delivered: the 4 changes and the listener's own gap begin and end around ns/c.
    assert (stats.received, stats.delivered, stats.coalesced, stats.dropped, stats.gaps) == (6, 6, 2, 0, 1)


async def test_coalesce_finds_its_objects_place_behind_what_was_taken(processor: Proc,
                                                                      clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", observer, buffer_capacity=3, overflow_policy=OverflowPolicy.COALESCE)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)  # seq 0, taken from the front: in the handler
    await settle()
    await p.distribute(add("b", "2"), False)  # seq 1
    await p.distribute(add("c", "3"), False)  # seq 2
    await p.distribute(add("d", "4"), False)  # seq 3: full now
    await p.distribute(update("c", "3", "5"), False)  # seq 4 merges into seq 2, in its place
    await p.distribute(update("a", "1", "6"), False)  # seq 5: nothing of ns/a waits, so it degrades
    assert observer.acks("rec") == [2]
    gate.set()
    assert (await rec.wait_for(5))[:4] == [
        ("add", "ns/a", "1", False),
        ("add", "ns/b", "2", False),
        ("add", "ns/c", "5", False),
        ("add", "ns/d", "4", False),
    ]
    await settle()
    assert sorted(observer.acks("rec")) == [0, 1, 2, 3, 4, 5]
    assert (lst.stats().coalesced, lst.stats().degraded) == (1, 1)


async def test_coalesce_add_then_update_stays_an_add() -> None:
    clock = FakeClock()
    p = SharedProcessor(clock=clock)
    rec = RecordingHandler()
    lst = listener(rec, clock, "rec", buffer_capacity=1, overflow_policy=OverflowPolicy.COALESCE)
    p.add_listener(lst)  # not started: the buffer only fills
    await p.distribute(add("a", "1", initial=True), False)
    await p.distribute(update("a", "1", "2"), False)
    assert lst.stats().coalesced == 1
    assert not lst.has_synced()
    p.start()
    assert await rec.wait_for(1) == [("add", "ns/a", "2", True)]
    await settle()
    assert lst.has_synced()
    await p.shutdown(1.0)


async def test_drop_policy_discards_counts_and_acks(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", observer, buffer_capacity=1, overflow_policy=OverflowPolicy.DROP)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)  # seq 0, in the handler
    await settle()
    await p.distribute(add("b", "2"), False)  # seq 1, buffered
    await p.distribute(add("c", "3"), False)  # seq 2, dropped
    await p.distribute(update("b", "2", "4"), False)  # seq 3, dropped
    assert observer.acks("rec") == [2, 3]
    gate.set()
    assert await rec.wait_for(2) == [("add", "ns/a", "1", False), ("add", "ns/b", "2", False)]
    await settle()
    stats = lst.stats()
    assert (stats.received, stats.delivered, stats.dropped, stats.acked) == (4, 2, 2, 4)


async def test_snapshot_never_dropped_plain_handler_gets_updates(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", observer, buffer_capacity=1, overflow_policy=OverflowPolicy.DROP)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)  # in the handler
    await settle()
    await p.distribute(add("b", "2"), False)  # fills the buffer
    snap = Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[pod("a", "1"), pod("b", "2")],
                        resource_version="2")
    await p.send(snap, [lst])  # queued past the capacity: a marker neither waits nor is dropped
    assert lst.stats().dropped == 0
    assert lst.depth == 2
    gate.set()
    assert await rec.wait_for(4) == [
        ("add", "ns/a", "1", False),
        ("add", "ns/b", "2", False),
        ("update", "ns/a", "1", "1"),
        ("update", "ns/b", "2", "2"),
    ]
    await settle()
    assert ("dispatched", 2, "snapshot", ("rec",)) in observer.events
    assert observer.acks("rec") == [0, 1, 2]


async def test_resync_notifications_go_only_to_due_listeners(clock: FakeClock) -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=clock, observer=observer)
    every5, every10, never = RecordingHandler(), RecordingHandler(), RecordingHandler()
    for name, h, period in (("every5", every5, 5.0), ("every10", every10, 10.0), ("never", never, 0.0)):
        opts = ListenerOptions(resync_period=period)
        p.add_listener(ProcessorListener(handler=h, options=opts, clock=clock, name=name,
                                         resync_period=period, observer=observer))
    p.start()
    assert p.should_resync() is False
    await clock.advance(5)
    assert p.should_resync() is True
    await p.distribute(update("a", "1", "1"), sync=True)  # seq 0 → every5 only
    await p.distribute(update("a", "1", "2"), sync=False)  # seq 1 → everyone
    await clock.advance(4)
    assert p.should_resync() is False
    await p.distribute(update("a", "2", "2"), sync=True)  # nobody due: not numbered
    await clock.advance(1)
    assert p.should_resync() is True  # both due at t+10
    await p.distribute(update("a", "2", "2"), sync=True)  # seq 2
    assert await every5.wait_for(3) == [("update", "ns/a", "1", "1"), ("update", "ns/a", "1", "2"),
                                        ("update", "ns/a", "2", "2")]
    assert await every10.wait_for(2) == [("update", "ns/a", "1", "2"), ("update", "ns/a", "2", "2")]
    assert await never.wait_for(1) == [("update", "ns/a", "1", "2")]
    dispatched = [e for e in observer.events if e[0] == "dispatched"]
    assert dispatched == [
        ("dispatched", 0, "update", ("every5",)),
        ("dispatched", 1, "update", ("every5", "every10", "never")),
        ("dispatched", 2, "update", ("every5", "every10")),
    ]
    await p.shutdown(1.0)


def test_determine_resync_period_follows_client_go() -> None:
    assert determine_resync_period(0, 10) == 0
    assert determine_resync_period(30, 0) == 0  # the informer never checks
    assert determine_resync_period(5, 10) == 10
    assert determine_resync_period(30, 10) == 30


async def test_remove_listener_is_idempotent_and_discards_pending(processor: Proc, clock: FakeClock) -> None:
    p, observer = processor
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = listener(rec, clock, "rec", observer)
    p.add_listener(lst)
    await p.distribute(add("a", "1"), False)
    await p.distribute(add("b", "2"), False)
    await settle()
    p.remove_listener(lst)
    p.remove_listener(lst)
    gate.set()
    await settle()
    # The call in progress ("a") finishes, as client-go lets it (tests/informer/test_remove_handler.py);
    # "b", pending, is discarded; a removed listener's acknowledgements no longer count.
    assert rec.calls == [("add", "ns/a", "1", False)]
    assert observer.events.count(("removed", "rec")) == 1
    assert observer.acks("rec") == []
    await p.distribute(add("c", "3"), False)
    assert [e for e in observer.events if e[0] == "dispatched"][-1] == ("dispatched", 2, "add", ())


async def test_unique_names(processor: Proc, clock: FakeClock) -> None:
    p, _ = processor
    first = listener(RecordingHandler(), clock, p.unique_name("rec"))
    p.add_listener(first)
    second = listener(RecordingHandler(), clock, p.unique_name("rec"))
    p.add_listener(second)
    assert (first.name, second.name) == ("rec", "rec#2")


async def test_shutdown_drains_then_returns(clock: FakeClock) -> None:
    p = SharedProcessor(clock=clock)
    rec = RecordingHandler()
    p.add_listener(listener(rec, clock, "rec"))
    runner = asyncio.create_task(p.run(), name="processor-run")
    for i in range(10):
        await p.distribute(add(f"o{i}", str(i)), False)
    await p.shutdown(5.0)
    await runner
    assert len(rec.calls) == 10
    await p.distribute(add("late", "99"), False)  # intake stopped
    assert len(rec.calls) == 10


async def test_shutdown_cancels_a_stuck_handler_after_the_deadline(clock: FakeClock) -> None:
    p = SharedProcessor(clock=clock)
    stuck = RecordingHandler(gate=asyncio.Event())
    lst = listener(stuck, clock, "stuck")
    p.add_listener(lst)
    p.start()
    await p.distribute(add("a", "1"), False)
    await settle()
    await p.shutdown(0.01)
    assert lst.task is not None
    assert lst.task.cancelled()


async def test_replayed_initial_adds_and_own_has_synced(clock: FakeClock) -> None:
    p = SharedProcessor(clock=clock)
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    lst = ProcessorListener(handler=rec, options=ListenerOptions(), clock=clock, name="late",
                            replay=[pod("a", "1"), pod("b", "2")])
    p.add_listener(lst)
    p.start()
    await p.distribute(update("a", "1", "3"), False)
    await settle()
    assert not lst.has_synced()
    assert lst.depth == 2  # one replayed add in the handler, one replay + one buffered waiting
    gate.set()
    assert await rec.wait_for(3) == [
        ("add", "ns/a", "1", True),
        ("add", "ns/b", "2", True),
        ("update", "ns/a", "1", "3"),
    ]
    assert lst.has_synced()
    await p.shutdown(1.0)


class _Kinds:
    """A NotificationHandler recording (kind, key or gap edge) and acking at once."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def handle(self, notification: Notification, ack: Any) -> None:
        n = notification
        what = ("end" if n.gap.end else "begin") if n.gap is not None else str(n.key)
        self.seen.append((n.kind.value, what))
        ack()


def _gap(end: bool = False) -> Notification:
    return Notification(kind=NotificationKind.GAP, obj={}, gap=Gap(id="g", from_resource_version="1",
                                                                    end=end))


@pytest.mark.parametrize("policy", [OverflowPolicy.COALESCE, OverflowPolicy.DROP])
async def test_gap_markers_are_never_dropped_nor_coalesced_across(policy: OverflowPolicy) -> None:
    clock = FakeClock()
    p = SharedProcessor(clock=clock)
    rec = _Kinds()
    lst = listener(rec, clock, "rec", buffer_capacity=2, overflow_policy=policy)
    p.add_listener(lst)  # not started: the buffer only fills
    await p.distribute(update("a", "1", "2"), False)
    await p.distribute(_gap(), False)
    # Full: under COALESCE this change does not merge into the one before the marker; with no
    # spill it degrades (never waits) and arrives inside the listener's own gap window.
    await p.distribute(update("a", "2", "3"), False)
    await p.distribute(_gap(end=True), False)
    p.start()
    await settle()
    if policy is OverflowPolicy.COALESCE:
        assert rec.seen == [("update", "ns/a"), ("gap", "begin"), ("gap", "begin"), ("update", "ns/a"),
                            ("gap", "end"), ("gap", "end")]
    else:  # the second update found the buffer full and was dropped; the end marker waited
        assert rec.seen == [("update", "ns/a"), ("gap", "begin"), ("gap", "end")]
    assert lst.stats().coalesced == 0
    await p.shutdown(1.0)
