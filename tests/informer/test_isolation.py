"""Issue #13: the informer never waits on a listener; a slow one spills to disk, then degrades alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    ListenerOptions,
    Notification,
    NotificationKind,
    ObjectKey,
    OverflowPolicy,
)
from bridge.delivery.spill import SegmentSpill
from bridge.informer.processor import ProcessorListener, SharedProcessor
from bridge.informer.registration import HandlerRegistration
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.loop import running_informer, spin_until
from bridge.testing.recorder import RecordingHandler
from tests.informer.slow_and_fast import add_then_modify, adds_then_modifies, cm, slow_beside_fast


def rv(n: Notification) -> str:
    assert not isinstance(n.obj, DeletedFinalStateUnknown)
    return str(n.obj["metadata"]["resourceVersion"])


class Kinds:
    """A NotificationHandler recording (kind, key or gap end) and acking at once."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.objects: list[Notification] = []

    async def handle(self, n: Notification, ack: Any) -> None:
        what = ("end" if n.gap.end else "begin") if n.gap is not None else str(n.key)
        self.seen.append((n.kind.value, what))
        self.objects.append(n)
        ack()


@pytest.fixture
async def source() -> FakeControllerSource:
    return FakeControllerSource()


async def test_a_blocked_listener_with_2000_cached_objects_never_stalls_another(
        source: FakeControllerSource) -> None:
    """The reported repro: one listener blocked forever, the default options, 2,000 cached objects."""
    for i in range(2000):
        source.add(cm(f"o{i}"))
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    gate = asyncio.Event()  # never set: the first listener is stuck in its first call
    stuck, other = RecordingHandler(gate=gate), RecordingHandler()
    stuck_reg = informer.add_event_handler(stuck, ListenerOptions(name="stuck"))
    informer.add_event_handler(other, ListenerOptions(name="other"))
    async with running_informer(informer, release=[gate]):
        assert len(await asyncio.wait_for(other.wait_for(2000), 20)) == 2000
        source.add(cm("new"))
        calls = await asyncio.wait_for(other.wait_for(2001), 20)
        assert calls[-1][:2] == ("add", "ns/new")
        assert stuck_reg.stats().depth >= 2000  # everything still waits for the stuck one


async def test_backlog_spills_to_disk_and_arrives_complete_and_in_order(
        source: FakeControllerSource, tmp_path: Path) -> None:
    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20)
    gate = asyncio.Event()
    slow, fast = RecordingHandler(gate=gate), RecordingHandler()
    async with slow_beside_fast(source, slow=slow, fast=fast, gate=gate, spill=spill,
                                buffer_capacity=8) as pair:
        adds_then_modifies(source, 300)
        # 50 adds + 250 modifies: the fast one gets all of them while the slow one is held.
        await asyncio.wait_for(fast.wait_for(300), 20)
        stats = pair.slow.stats()
        assert stats.spilled > 0
        assert stats.spill_depth > 0
        assert stats.spill_bytes > 0
        assert stats.degraded == 0
        assert list((tmp_path / "spill").iterdir())  # on disk
        gate.set()
        assert await asyncio.wait_for(slow.wait_for(300), 20) == fast.calls
        await spin_until(lambda: pair.slow.stats().depth == 0, "spill drained")
        assert pair.slow.stats().spill_bytes == 0


async def test_a_full_spill_degrades_that_listener_alone_behind_a_gap_marker(
        source: FakeControllerSource, tmp_path: Path) -> None:
    spill = SegmentSpill(tmp_path / "spill", limit_bytes=4096)
    gate = asyncio.Event()
    slow, fast = Kinds(), Kinds()

    class Held(Kinds):
        async def handle(self, n: Notification, ack: Any) -> None:
            await gate.wait()
            await super().handle(n, ack)

    slow = Held()
    async with slow_beside_fast(source, slow=slow, fast=fast, gate=gate, spill=spill,
                                buffer_capacity=4) as pair:
        add_then_modify(source, objects=10, rounds=20)
        await spin_until(lambda: len(fast.seen) == 210, "fast got everything")
        assert fast.seen.count(("gap", "begin")) == 0
        stats = pair.slow.stats()
        assert stats.degraded > 0
        assert stats.coalesced > 0
        assert stats.spill_bytes <= 4096
        assert pair.slow.stats().depth < 210  # coalesced: latest state per object
        gate.set()
        await spin_until(lambda: pair.slow.stats().depth == 0 and ("gap", "end") in slow.seen,
                         "slow caught up")
        begin, end = slow.seen.index(("gap", "begin")), slow.seen.index(("gap", "end"))
        assert slow.seen[:begin] == fast.seen[:begin]  # everything before the gap, exactly
        inside = slow.objects[begin + 1:end]
        # Inside the window: one latest state per object, each the final one.
        latest = {str(n.key): rv(n) for n in inside}
        final = {str(n.key): rv(n) for n in fast.objects}
        assert latest == {k: final[k] for k in latest}
        assert len(inside) == len(latest)
        gap_begin, gap_end = slow.objects[begin].gap, slow.objects[end].gap
        assert gap_begin is not None
        assert gap_end is not None
        assert gap_begin.id == gap_end.id
        assert gap_end.to_resource_version == max(final.values(), key=int)
        # Everything tracked was acknowledged: nothing waits forever for the degraded listener.
        assert all(n.kind is not NotificationKind.GAP or n.seq == -1 for n in slow.objects)


async def test_block_policy_still_backpressures_when_asked_for(source: FakeControllerSource) -> None:
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    gate = asyncio.Event()
    blocked, other = RecordingHandler(gate=gate), RecordingHandler()
    informer.add_event_handler(blocked, ListenerOptions(name="b", buffer_capacity=2,
                                                        overflow_policy=OverflowPolicy.BLOCK))
    informer.add_event_handler(other, ListenerOptions(name="o"))
    async with running_informer(informer, release=[gate]):
        assert await informer.wait_for_cache_sync(5)
        for i in range(10):
            source.add(cm(f"o{i}"))
        await spin_until(lambda: len(other.calls) >= 3, "some delivered")
        for _ in range(200):
            await asyncio.sleep(0)
        assert len(other.calls) < 10  # the informer waits for the blocked one
        gate.set()
        assert len(await asyncio.wait_for(other.wait_for(10), 10)) == 10


async def test_a_degraded_initial_add_merged_into_a_delete_does_not_hold_has_synced_back() -> None:
    clock = FakeClock()
    p = SharedProcessor(clock=clock)
    rec = RecordingHandler()
    lst = ProcessorListener(handler=rec, options=ListenerOptions(name="r", buffer_capacity=1),
                            clock=clock, name="r")
    p.add_listener(lst)  # not started: the buffer only fills
    obj = {"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "1", "uid": "u"}}
    await p.distribute(Notification(kind=NotificationKind.ADD, obj=obj, is_in_initial_list=True,
                                    key=ObjectKey("ns/a")), False)
    b = {"metadata": {"namespace": "ns", "name": "b", "resourceVersion": "2", "uid": "v"}}
    await p.distribute(Notification(kind=NotificationKind.ADD, obj=b, is_in_initial_list=True,
                                    key=ObjectKey("ns/b")), False)  # degraded: no room, no spill
    await p.distribute(Notification(kind=NotificationKind.DELETE, obj=b, key=ObjectKey("ns/b")), False)
    assert lst.stats().degraded == 2
    p.start()
    await spin_until(lambda: lst.depth == 0 and not lst.degraded, "drained")
    assert lst.has_synced()
    assert [c[:2] for c in rec.calls] == [("add", "ns/a"), ("delete", "ns/b")]
    await p.shutdown(1)


class Yielding:
    """A NotificationHandler that is quick but not instant: every call gives the loop one turn (as a
    sink handing the event to its client does), then acknowledges."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def handle(self, n: Notification, ack: Any) -> None:
        await asyncio.sleep(0)
        self.keys.append(str(n.key))
        ack()


async def test_a_burst_to_a_draining_listener_is_caught_up_in_memory_not_spilled(tmp_path: Path) -> None:
    """Issue #18: a burst larger than the buffer, to a listener that keeps finishing its calls,
    never touches the spill (writing it and reading it back made the never-wait path far slower
    than the blocking one); order and completeness hold."""
    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20)
    handler = Yielding()
    processor = SharedProcessor(clock=FakeClock(), name="burst")
    listener = ProcessorListener(handler=handler, options=ListenerOptions(
        name="draining", buffer_capacity=8, overflow_policy=OverflowPolicy.SPILL, spill=spill),
        clock=FakeClock(), name="draining")
    processor.add_listener(listener)
    processor.start()
    try:
        for i in range(500):
            await processor.distribute(Notification(kind=NotificationKind.ADD, obj=cm(f"o{i}"),
                                                    key=ObjectKey(f"ns/o{i}")), False)
        await spin_until(lambda: len(handler.keys) == 500, "all delivered")
        assert handler.keys == [f"ns/o{i}" for i in range(500)]
        stats = listener.stats()
        assert stats.spilled == 0
        assert stats.high_water <= 8
    finally:
        await processor.shutdown(2)


async def test_a_stuck_listener_still_spills_after_a_few_turns_and_never_holds_the_producer(
        tmp_path: Path) -> None:
    """The catch-up turns end when the worker finishes nothing: a stuck listener's overflow spills
    (after at most CATCH_UP_TURNS turns, once), and what follows goes to the spill with no turn."""
    from bridge.informer.processor import CATCH_UP_TURNS

    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20)
    gate = asyncio.Event()
    stuck = RecordingHandler(gate=gate)
    processor = SharedProcessor(clock=FakeClock(), name="stuck")
    listener = ProcessorListener(handler=stuck, options=ListenerOptions(
        name="stuck", buffer_capacity=4, overflow_policy=OverflowPolicy.SPILL, spill=spill),
        clock=FakeClock(), name="stuck")
    processor.add_listener(listener)
    processor.start()
    loop = asyncio.get_running_loop()
    turns = 0

    def count() -> None:
        nonlocal turns
        turns += 1
        if not done:
            loop.call_soon(count)

    done = False
    try:
        await asyncio.sleep(0)
        loop.call_soon(count)
        for i in range(100):
            await processor.distribute(Notification(kind=NotificationKind.ADD, obj=cm(f"o{i}"),
                                                    key=ObjectKey(f"ns/o{i}")), False)
        done = True
        stats = listener.stats()
        assert stats.spilled >= 100 - 4 - 1
        assert turns <= CATCH_UP_TURNS + 2
        gate.set()
        await spin_until(lambda: len(stuck.calls) == 100, "all delivered")
        assert [c[1] for c in stuck.calls] == [f"ns/o{i}" for i in range(100)]
    finally:
        gate.set()
        await processor.shutdown(2)


async def test_without_a_spill_a_full_buffer_degrades_at_once() -> None:
    """Catching up replaces spilling, never degrading: a listener without a spill keeps the latest
    state per object as soon as its buffer is full, even while it is draining (holding the
    informer first only delayed that, and a sustained overload then delivered less)."""
    handler = Yielding()
    processor = SharedProcessor(clock=FakeClock(), name="nospill")
    listener = ProcessorListener(handler=handler, options=ListenerOptions(
        name="nospill", buffer_capacity=8, overflow_policy=OverflowPolicy.SPILL),
        clock=FakeClock(), name="nospill")
    processor.add_listener(listener)
    processor.start()
    try:
        for i in range(200):
            await processor.distribute(Notification(kind=NotificationKind.ADD, obj=cm(f"o{i % 20}", v=str(i)),
                                                    key=ObjectKey(f"ns/o{i % 20}")), False)
        assert listener.stats().degraded > 0
    finally:
        await processor.shutdown(2)


async def test_catching_up_ends_when_its_owner_says_so(tmp_path: Path) -> None:
    """``may_catch_up`` is asked before every turn: refused, a full buffer spills at once, even for
    a listener that is draining."""
    asked: list[str] = []

    def refuse(listener: ProcessorListener) -> bool:
        asked.append(listener.name)
        return False

    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20)
    handler = Yielding()
    processor = SharedProcessor(clock=FakeClock(), name="bounded")
    listener = ProcessorListener(handler=handler, options=ListenerOptions(
        name="bounded", buffer_capacity=8, overflow_policy=OverflowPolicy.SPILL, spill=spill),
        clock=FakeClock(), name="bounded", may_catch_up=refuse)
    processor.add_listener(listener)
    processor.start()
    try:
        for i in range(200):
            await processor.distribute(Notification(kind=NotificationKind.ADD, obj=cm(f"o{i}"),
                                                    key=ObjectKey(f"ns/o{i}")), False)
        assert listener.stats().spilled > 0
        assert set(asked) == {"bounded"}
        await spin_until(lambda: len(handler.keys) == 200, "all delivered")
        assert handler.keys == [f"ns/o{i}" for i in range(200)]
    finally:
        await processor.shutdown(2)


class Slow:
    """A NotificationHandler that keeps finishing its calls, but slower than its sibling: three
    turns of the loop per call (a sink slower than the watch, not down)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def handle(self, n: Notification, ack: Any) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        self.keys.append(str(n.key))
        ack()


@contextlib.asynccontextmanager
async def a_burst_to_two_quick_listeners(source: FakeControllerSource, tmp_path: Path) -> AsyncIterator[
        tuple[list[Yielding], list[HandlerRegistration]]]:
    """An informer over ``source`` with two quick listeners (buffers of 16, a spill each under
    ``tmp_path``), running and synced; the block runs once both received a burst of 600 changes
    over 50 objects. Yields the two handlers and their registrations."""
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    quick = [Yielding(), Yielding()]
    regs = [informer.add_event_handler(h, ListenerOptions(
        name=f"quick{i}", buffer_capacity=16,
        spill=SegmentSpill(tmp_path / f"q{i}", limit_bytes=10 << 20))) for i, h in enumerate(quick)]
    async with running_informer(informer):
        assert await informer.wait_for_cache_sync(5)
        adds_then_modifies(source, 600)
        await spin_until(lambda: all(len(h.keys) == 600 for h in quick), "burst delivered", turns=200000)
        yield quick, regs


async def test_two_quick_listeners_take_a_burst_in_memory_and_a_slow_one_spills_alone(
        source: FakeControllerSource, tmp_path: Path) -> None:
    """Through a real informer: a burst that outruns two quick listeners is caught up in memory
    (nothing spilled); a listener slower than its sibling gets no catch-up turns while the sibling
    is idle, so the sibling keeps its pace (section 7b of the delivery contract) and the slow one's
    overflow spills, arriving complete and in order."""
    async with a_burst_to_two_quick_listeners(source, tmp_path) as (_, regs):
        assert [r.stats().spilled for r in regs] == [0, 0]

    source2 = FakeControllerSource()
    informer = SharedIndexInformer(lister_watcher=source2, clock=FakeClock(), name="cm2")
    slow, fast = Slow(), Kinds()
    slow_reg = informer.add_event_handler(slow, ListenerOptions(
        name="slow", buffer_capacity=16, spill=SegmentSpill(tmp_path / "slow", limit_bytes=10 << 20)))
    informer.add_event_handler(fast, ListenerOptions(
        name="fast", buffer_capacity=16, spill=SegmentSpill(tmp_path / "fast", limit_bytes=10 << 20)))
    async with running_informer(informer):
        assert await informer.wait_for_cache_sync(5)
        for i in range(300):
            if i < 50:
                source2.add(cm(f"s{i}"))
            else:
                source2.modify(cm(f"s{i % 50}", v=str(i)))
            if i % 10 == 9:
                await asyncio.sleep(0)
        await spin_until(lambda: len(fast.seen) == 300, "the quick sibling got everything", turns=200000)
        assert len(slow.keys) < 150  # the quick one did not wait for the slow one
        assert slow_reg.stats().spilled > 0
        await spin_until(lambda: len(slow.keys) == 300, "the slow one got everything", turns=2_000_000)
        assert slow.keys == [k for _, k in fast.seen]


async def test_catching_up_stops_once_catch_up_bytes_wait_in_the_informer_queue(
        source: FakeControllerSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory a burst takes stays bounded: past CATCH_UP_BYTES queued in the informer's
    DeltaFIFO (here lowered to one ConfigMap's worth), the quick listeners' overflow spills."""
    import bridge.informer.shared_informer as shared_informer

    monkeypatch.setattr(shared_informer, "CATCH_UP_BYTES", 1)
    async with a_burst_to_two_quick_listeners(source, tmp_path) as (quick, regs):
        assert all(r.stats().spilled > 0 for r in regs)
        assert quick[0].keys == quick[1].keys
