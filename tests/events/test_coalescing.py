"""Coalescing of Event repetitions in :class:`~bridge.service.events.profile.EventsStage`: held for
the window, replaced by newer states (the replaced ones acknowledged as filtered), the last state
always handed on with its own acknowledgement, never before the window ends unless something must
follow it (a delete of the Event, a marker, a flush)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bridge.clock import FakeClock
from bridge.delivery.chain import DeliveryChain
from bridge.service.events.profile import EventsProfile, EventsStage
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType, SnapshotInfo
from tests.events.helpers import PODS, change, core_event


class Recorder:
    """The sink behind the profile: records what it was handed, acks only when the test says."""

    def __init__(self) -> None:
        self.name = "rec"
        self.got: list[ChangeEvent] = []
        self.acks: list[AckCallback] = []
        self.closed = False

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.got.append(event)
        self.acks.append(ack)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.got += events
        self.acks += acks

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        self.closed = True

    delivery = DeliveryOptions()
    last_error = ""
    in_flight = 0

    def healthy(self) -> bool:
        return True

    def counts(self) -> list[str]:
        return [f"{e.type.value}:{e.extensions['count']}" if e.obj is not None else e.type.value
                for e in self.got]


class Outcomes:
    def __init__(self) -> None:
        self.seen: dict[str, DeliveryOutcome] = {}

    def cb(self, name: str) -> AckCallback:
        def ack(outcome: DeliveryOutcome) -> None:
            assert name not in self.seen, f"{name} acked twice"
            self.seen[name] = outcome
        return ack


def profile() -> EventsProfile:
    return EventsProfile(profiled=lambda ref: True, enricher=None, counter=None)


def events_chain(rec: Recorder, **options: Any) -> tuple[DeliveryChain, EventsStage]:
    """``rec`` behind a delivery chain with the events stage alone, and the stage."""
    stage = EventsStage(sink=rec.name, profile=profile(), **options)
    return DeliveryChain(sink=rec, stages=[stage]), stage


async def test_repetitions_within_the_window_become_their_last_state() -> None:
    clock = FakeClock()
    rec = Recorder()
    sink, stage = events_chain(rec, coalesce_window=10.0, clock=clock)
    await sink.start()
    out = Outcomes()
    try:
        await sink.deliver(change(core_event(count=1)), out.cb("c1"))
        assert rec.counts() == ["added:1"]  # a new Event is never held
        for n in (2, 3, 4):
            await sink.deliver(change(core_event(count=n), EventType.UPDATED), out.cb(f"c{n}"))
            await clock.advance(2.0)
        # Held: nothing handed on; the replaced states are acknowledged as filtered, the last one not.
        assert rec.counts() == ["added:1"]
        assert out.seen == {"c2": DeliveryOutcome.FILTERED, "c3": DeliveryOutcome.FILTERED}
        assert stage.held == 1
        await clock.advance(3.9)
        assert rec.counts() == ["added:1"]  # 9.9 s after the first repetition was held
        await clock.advance(0.2)
        assert rec.counts() == ["added:1", "updated:4"]
        # Acknowledged only when the sink acknowledges it: the checkpoint cannot pass it before.
        assert "c4" not in out.seen
        rec.acks[1](DeliveryOutcome.DELIVERED)
        assert out.seen["c4"] is DeliveryOutcome.DELIVERED
        # The next repetition opens a new window.
        await sink.deliver(change(core_event(count=5), EventType.UPDATED), out.cb("c5"))
        await clock.advance(9.0)
        assert rec.counts() == ["added:1", "updated:4"]
        await clock.advance(1.5)
        assert rec.counts() == ["added:1", "updated:4", "updated:5"]
    finally:
        await sink.close()


async def test_a_delete_a_marker_and_a_flush_release_what_is_held_first() -> None:
    clock = FakeClock()
    rec = Recorder()
    sink, stage = events_chain(rec, coalesce_window=60.0, clock=clock)
    await sink.start()
    out = Outcomes()
    try:
        a = dict(uid="ev-a", name="a.1")
        b = dict(uid="ev-b", name="b.1")
        await sink.deliver(change(core_event(count=2, **a), EventType.UPDATED), out.cb("a2"))
        await sink.deliver(change(core_event(count=3, **b), EventType.UPDATED), out.cb("b3"))
        # The Event expires: its held repetition goes first, then the delete, in order.
        await sink.deliver(change(core_event(count=2, **a), EventType.DELETED), out.cb("a-del"))
        assert rec.counts() == ["updated:2", "deleted:2"]
        marker = ChangeEvent(type=EventType.SNAPSHOT_BEGIN, resource=PODS, cluster="test", obj=None,
                             snapshot=SnapshotInfo(id="s", resource_version="5"))
        await sink.deliver(marker, out.cb("marker"))
        assert rec.counts() == ["updated:2", "deleted:2", "updated:3", "snapshot.begin"]
        await sink.deliver(change(core_event(count=4, **b), EventType.UPDATED), out.cb("b4"))
        assert await sink.flush(1.0)
        assert rec.counts()[-1] == "updated:4"
        assert stage.held == 0
        assert not out.seen  # nothing replaced, nothing acknowledged by the profile itself
    finally:
        await sink.close()


async def test_closing_leaves_held_repetitions_unacknowledged() -> None:
    clock = FakeClock()
    rec = Recorder()
    sink, _stage = events_chain(rec, coalesce_window=30.0, clock=clock)
    await sink.start()
    out = Outcomes()
    await sink.deliver(change(core_event(count=2), EventType.UPDATED), out.cb("held"))
    await sink.close()
    await clock.advance(60.0)
    await asyncio.sleep(0)
    assert rec.closed
    assert rec.got == []
    assert out.seen == {}  # re-read from the watch after a restart: the checkpoint never passed it


async def test_without_a_window_every_repetition_goes_on_at_once_with_its_attributes() -> None:
    rec = Recorder()
    sink, _stage = events_chain(rec, clock=FakeClock())
    await sink.start()
    try:
        for n in (1, 2, 3):
            await sink.deliver_batch([change(core_event(count=n), EventType.UPDATED)], [lambda _: None])
        assert rec.counts() == ["updated:1", "updated:2", "updated:3"]
        ext = rec.got[0].extensions
        assert ext["reason"] == "BackOff"
        assert ext["eventtype"] == "Warning"
        assert ext["involvedkind"] == "Pod"
        assert "enrichment" not in ext  # enrichment off
    finally:
        await sink.close()


async def test_the_pending_bound_sends_the_oldest_held_at_once() -> None:
    clock = FakeClock()
    rec = Recorder()
    sink, stage = events_chain(rec, coalesce_window=30.0, max_pending=2, clock=clock)
    await sink.start()
    try:
        for i in range(3):
            await sink.deliver(change(core_event(count=2, uid=f"ev-{i}", name=f"e{i}"), EventType.UPDATED),
                               lambda _: None)
        assert [e.uid for e in rec.got] == ["ev-0"]
        assert stage.held == 2
    finally:
        await sink.close()


class SlowRecorder(Recorder):
    """A sink whose hand-over takes until the test opens ``gate`` (a full in-flight window)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().deliver_batch(events, acks)


async def test_a_repetition_arriving_during_a_slow_hand_over_is_held_a_window_from_its_end() -> None:
    # What the burst test relies on: two repetitions of one Event are handed on at least the window
    # apart, measured from the end of the first hand-over, however long that takes.
    clock = FakeClock()
    rec = SlowRecorder()
    sink, stage = events_chain(rec, coalesce_window=10.0, clock=clock)
    await sink.start()
    try:
        await sink.deliver(change(core_event(count=2), EventType.UPDATED), lambda _: None)
        await clock.advance(10.0)
        await rec.entered.wait()  # the timer is handing count 2 on
        arriving = asyncio.create_task(
            sink.deliver(change(core_event(count=3), EventType.UPDATED), lambda _: None))
        await clock.advance(4.0)  # the hand-over takes 4 s; count 3 waits for it
        assert not arriving.done()
        rec.gate.set()
        await arriving
        assert rec.counts() == ["updated:2"]
        assert stage.held == 1
        await clock.advance(9.9)
        assert rec.counts() == ["updated:2"]  # 9.9 s after the first hand-over ended
        await clock.advance(0.2)
        assert rec.counts() == ["updated:2", "updated:3"]
    finally:
        await sink.close()
