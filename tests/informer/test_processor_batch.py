"""Issue #18: a listener hands a batch handler everything ready in its buffer at once.

The rules of one notification per call hold per notification of a batch: order, coalescing (never
into a notification handed out), spill and gap windows, exactly one acknowledgement each, handler
errors acknowledged and counted, the initial-list count and ``wait_drained``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import (
    AckFunc,
    BatchInterrupted,
    BatchNotificationHandler,
    Gap,
    ListenerOptions,
    Notification,
    NotificationKind,
    OverflowPolicy,
)
from bridge.delivery.spill import SegmentSpill
from bridge.informer.processor import BATCH_LIMIT, ProcessorListener, SharedProcessor
from tests.informer.observer import RecordingObserver
from tests.informer.test_processor import add, pod, update


def what(n: Notification) -> tuple[str, str, str]:
    """(kind, key or gap edge, resourceVersion) of a notification."""
    if n.gap is not None:
        return (n.kind.value, "end" if n.gap.end else "begin", "")
    if n.kind is NotificationKind.SNAPSHOT:
        return (n.kind.value, "", n.resource_version)
    assert isinstance(n.obj, dict)
    return (n.kind.value, str(n.key), str(n.obj["metadata"]["resourceVersion"]))


class BatchRecorder:
    """A batch handler recording each call's notifications; acks each notification twice (only the
    first may count). ``gate`` holds every call until set; ``fail`` names objects whose handling
    raises (reported as :class:`BatchInterrupted` at their index)."""

    def __init__(self, *, gate: asyncio.Event | None = None, fail: frozenset[str] = frozenset()) -> None:
        self.batches: list[list[tuple[str, str, str]]] = []
        self.singles: list[tuple[str, str, str]] = []
        self.seen: list[tuple[str, str, str]] = []
        """Every notification handled, in order, whichever way it came."""
        self.gate = gate
        self.fail = fail
        self.entered = asyncio.Event()

    async def handle(self, n: Notification, ack: AckFunc) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if str(n.key) in self.fail:
            raise ValueError(f"cannot handle {n.key}")
        self.singles.append(what(n))
        self.seen.append(what(n))
        ack()
        ack()

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        batch: list[tuple[str, str, str]] = []
        self.batches.append(batch)
        for i, n in enumerate(notifications):
            if str(n.key) in self.fail:
                raise BatchInterrupted(i) from ValueError(f"cannot handle {n.key}")
            batch.append(what(n))
            self.seen.append(what(n))
            acks[i]()
            acks[i]()


def make(handler: Any, observer: RecordingObserver | None = None, **opts: Any) -> ProcessorListener:
    return ProcessorListener(handler=handler, options=ListenerOptions(name="b", **opts), clock=FakeClock(),
                             name="b", observer=observer)


async def drained(listener: ProcessorListener) -> None:
    await asyncio.wait_for(listener.wait_drained(), 10)


def test_a_handler_with_handle_batch_is_a_batch_handler() -> None:
    assert isinstance(BatchRecorder(), BatchNotificationHandler)


async def test_what_is_ready_goes_in_batches_in_order_each_acked_once() -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    rec = BatchRecorder()
    p.add_listener(make(rec, observer))
    p.start()
    sent = []
    for i in range(600):  # never yields: the worker finds them all ready
        n = add(f"o{i}", str(i + 1)) if i < 100 else update(f"o{i % 100}", str(i - 99), str(i + 1))
        sent.append(what(n))
        await p.distribute(n, sync=False)
    listener = p.listeners[0]
    await drained(listener)
    assert rec.seen == sent
    assert rec.singles == []
    assert len(rec.batches) > 1  # bounded: never everything in one call
    assert max(len(b) for b in rec.batches) <= BATCH_LIMIT
    assert observer.acks("b") == list(range(600))
    stats = listener.stats()
    assert (stats.received, stats.delivered, stats.acked, stats.handler_errors) == (600, 600, 600, 0)
    await p.shutdown(1)


async def test_one_ready_notification_is_handled_at_once_on_its_own() -> None:
    rec = BatchRecorder()
    listener = make(rec)
    listener.start()
    await listener.add(add("a", "1"))
    await drained(listener)
    assert rec.singles == [("add", "ns/a", "1")]
    assert rec.batches == []
    listener.close()


async def test_nothing_coalesces_into_a_notification_handed_out() -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    gate = asyncio.Event()
    rec = BatchRecorder(gate=gate)
    p.add_listener(make(rec, observer, buffer_capacity=2, overflow_policy=OverflowPolicy.COALESCE))
    p.start()
    await p.distribute(add("a", "1"), sync=False)  # seq 0
    await p.distribute(add("b", "1"), sync=False)  # seq 1
    await asyncio.wait_for(rec.entered.wait(), 5)  # both handed out in one batch, held there
    await p.distribute(update("a", "1", "2"), sync=False)  # seq 2: into the buffer
    await p.distribute(update("b", "1", "2"), sync=False)  # seq 3: the buffer is full now
    await p.distribute(update("a", "2", "3"), sync=False)  # seq 4: merges into seq 2, not seq 0
    assert observer.acks("b") == [2]  # the superseded one, at once
    gate.set()
    listener = p.listeners[0]
    await drained(listener)
    assert rec.batches == [
        [("add", "ns/a", "1"), ("add", "ns/b", "1")],
        [("update", "ns/a", "3"), ("update", "ns/b", "2")],
    ]
    assert sorted(observer.acks("b")) == [0, 1, 2, 3, 4]
    assert listener.stats().coalesced == 1
    await p.shutdown(1)


async def test_a_failing_notification_is_acked_and_counted_and_the_rest_handled() -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    rec = BatchRecorder(fail=frozenset({"ns/o3", "ns/o7"}))
    p.add_listener(make(rec, observer))
    p.start()
    for i in range(10):
        await p.distribute(add(f"o{i}", "1"), sync=False)
    listener = p.listeners[0]
    await drained(listener)
    assert [w[1] for w in rec.seen] == [f"ns/o{i}" for i in range(10) if i not in (3, 7)]
    assert sorted(observer.acks("b")) == list(range(10))
    stats = listener.stats()
    assert (stats.delivered, stats.acked, stats.handler_errors) == (8, 10, 2)
    await p.shutdown(1)


class FailsWholeBatch:
    """handle_batch acks the first notification, then fails without saying where."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, n: Notification, ack: AckFunc) -> None:
        ack()

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        self.calls += 1
        acks[0]()
        raise RuntimeError("broken")


async def test_a_batch_failing_without_an_index_acks_every_notification_once() -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    handler = FailsWholeBatch()
    p.add_listener(make(handler, observer))
    p.start()
    for i in range(5):
        await p.distribute(add(f"o{i}", "1"), sync=False)
    listener = p.listeners[0]
    await drained(listener)
    assert handler.calls == 1
    assert observer.acks("b") == [0, 1, 2, 3, 4]
    stats = listener.stats()
    assert (stats.delivered, stats.acked, stats.handler_errors) == (0, 5, 1)
    await p.shutdown(1)


async def test_replayed_initial_adds_go_in_batches_and_count_for_sync() -> None:
    gate = asyncio.Event()
    rec = BatchRecorder(gate=gate)
    objects = [pod(f"o{i}", str(i + 1)) for i in range(40)]
    listener = ProcessorListener(handler=rec, options=ListenerOptions(name="late"), clock=FakeClock(),
                                 name="late", replay=objects)
    listener.start()
    await asyncio.wait_for(rec.entered.wait(), 5)
    assert not listener.has_synced()
    waiting = asyncio.ensure_future(listener.wait_drained())
    await asyncio.sleep(0)
    assert not waiting.done()  # a batch in the handler is work in progress
    gate.set()
    await asyncio.wait_for(waiting, 10)
    assert listener.has_synced()
    assert [w[2] for w in rec.seen] == [str(i + 1) for i in range(40)]
    assert all(w[0] == "add" for w in rec.seen)
    assert len(rec.batches) >= 1
    listener.close()


async def test_a_spilled_backlog_arrives_complete_and_in_order_in_batches(tmp_path: Path) -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    gate = asyncio.Event()
    rec = BatchRecorder(gate=gate)
    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20)
    p.add_listener(make(rec, observer, buffer_capacity=8, spill=spill))
    p.start()
    sent = []
    for i in range(300):
        n = add(f"o{i}", str(i + 1)) if i < 50 else update(f"o{i % 50}", str(i - 49), str(i + 1))
        sent.append(what(n))
        await p.distribute(n, sync=False)
    listener = p.listeners[0]
    assert listener.stats().spilled > 0
    gate.set()
    await drained(listener)
    assert rec.seen == sent
    assert observer.acks("b") == list(range(300))
    assert listener.stats().depth == 0
    await p.shutdown(1)


async def test_a_degraded_backlog_arrives_inside_a_gap_window_in_batches() -> None:
    observer = RecordingObserver()
    p = SharedProcessor(clock=FakeClock(), observer=observer, name="pods")
    gate = asyncio.Event()
    rec = BatchRecorder(gate=gate)
    p.add_listener(make(rec, observer, buffer_capacity=4))  # no spill: degrades at once
    p.start()
    await p.distribute(add("first", "1"), sync=False)
    await asyncio.wait_for(rec.entered.wait(), 5)
    for i in range(4):
        await p.distribute(add(f"o{i}", "1"), sync=False)
    for v in range(2, 6):  # beyond the buffer: latest state per object
        for i in range(4):
            await p.distribute(update(f"o{i}", str(v - 1), str(v)), sync=False)
    gate.set()
    listener = p.listeners[0]
    await drained(listener)
    seen = rec.seen
    assert seen[:5] == [("add", "ns/first", "1")] + [("add", f"ns/o{i}", "1") for i in range(4)]
    assert seen[5] == ("gap", "begin", "")
    assert seen[-1] == ("gap", "end", "")
    inside = seen[6:-1]
    assert sorted(w[1] for w in inside) == [f"ns/o{i}" for i in range(4)]
    assert all(w == ("update", w[1], "5") for w in inside)
    assert sorted(observer.acks("b")) == list(range(1 + 4 + 16))
    assert listener.stats().gaps == 1
    await p.shutdown(1)


async def test_a_handler_without_handle_batch_gets_one_call_per_notification() -> None:
    class Single:
        def __init__(self) -> None:
            self.seen: list[str] = []

        async def handle(self, n: Notification, ack: AckFunc) -> None:
            self.seen.append(str(n.key))
            ack()

    handler = Single()
    listener = make(handler)
    listener.start()
    for i in range(30):
        await listener.add(add(f"o{i}", "1"))
    await drained(listener)
    assert handler.seen == [f"ns/o{i}" for i in range(30)]
    listener.close()


@pytest.mark.parametrize("kind", [NotificationKind.SNAPSHOT, NotificationKind.GAP])
async def test_markers_inside_a_batch_keep_their_place(kind: NotificationKind) -> None:
    rec = BatchRecorder()
    listener = make(rec)
    marker = (Notification(kind=kind, obj={}, snapshot=[], resource_version="9")
              if kind is NotificationKind.SNAPSHOT
              else Notification(kind=kind, obj={}, gap=Gap(id="g", from_resource_version="1")))
    await listener.add(add("a", "1"))
    await listener.add(marker)
    await listener.add(add("b", "2"))
    listener.start()
    await drained(listener)
    assert [w[0] for w in rec.seen] == ["add", kind.value, "add"]
    assert [w[1] for w in rec.seen][::2] == ["ns/a", "ns/b"]
    assert len(rec.batches) == 1
    listener.close()


async def test_a_stuck_batch_counts_as_waiting_but_for_its_first() -> None:
    gate = asyncio.Event()
    rec = BatchRecorder(gate=gate)
    listener = make(rec)
    for i in range(40):
        await listener.add(add(f"o{i}", "1"))
    listener.start()
    await asyncio.wait_for(rec.entered.wait(), 5)
    assert listener.depth == 40 - 1  # as with one call: all but the one in the handler
    gate.set()
    await drained(listener)
    assert listener.depth == 0
    listener.close()
