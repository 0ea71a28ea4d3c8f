"""A sink's delivery chain: the service's stages in their order, each declaring what it reads and
adds; the sink's own status read from the sink; one run per event for a sink without
``deliver_batch``; the fence last, so that nothing a stage held reaches the sink after leadership
ended; flushing and closing through every stage."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from bridge.clock import FakeClock
from bridge.delivery.chain import DeliveryChain, HandOn, as_chain
from bridge.service.chains import delivery_chains
from bridge.service.events.config import EventsConfig
from bridge.service.events.profile import EventsProfile, EventsStage
from bridge.service.fencing import FenceStage
from bridge.service.metered import MeterStage
from bridge.service.telemetry import Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType, Sink
from tests.events.helpers import change, core_event


class OneByOne:
    """A sink without ``deliver_batch``: records each event, acknowledges when the test says."""

    def __init__(self, name: str = "one") -> None:
        self.name = name
        self.delivery = DeliveryOptions(buffer_capacity=7)
        self.last_error = ""
        self.in_flight = 0
        self.up = True
        self.got: list[ChangeEvent] = []
        self.acks: list[AckCallback] = []
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.got.append(event)
        self.acks.append(ack)
        self.in_flight += 1

    async def flush(self, timeout: float) -> bool:
        self.calls.append("flush")
        return True

    async def close(self) -> None:
        self.calls.append("close")

    def healthy(self) -> bool:
        return self.up


class Batches(OneByOne):
    """The same sink, with ``deliver_batch``."""

    def __init__(self, name: str = "batches") -> None:
        super().__init__(name)
        self.sizes: list[int] = []

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.sizes.append(len(events))
        for event, ack in zip(events, acks, strict=True):
            await self.deliver(event, ack)


class Seen:
    """A stage recording the batch sizes it was given, in a shared journal of the stages' calls."""

    reads = ("type",)
    adds = ()

    def __init__(self, name: str, journal: list[str]) -> None:
        self.name = name
        self.journal = journal
        self.sizes: list[int] = []

    async def start(self, hand_on: HandOn) -> None:
        self.journal.append(f"start {self.name}")

    async def process(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                      hand_on: HandOn) -> None:
        self.sizes.append(len(events))
        await hand_on(events, acks)

    async def flush(self, hand_on: HandOn) -> None:
        self.journal.append(f"flush {self.name}")

    async def close(self) -> None:
        self.journal.append(f"close {self.name}")
        if self.name == "broken":
            raise RuntimeError("closing failed")


def pods(n: int) -> list[ChangeEvent]:
    return [change(core_event(name=f"e{i}.1", uid=f"ev-{i}")) for i in range(n)]


def profile() -> EventsProfile:
    return EventsProfile(profiled=lambda ref: True, enricher=None, counter=None)


def test_the_service_builds_meter_events_fence_each_declaring_what_it_reads_and_adds() -> None:
    telemetry = Telemetry(trace_sample_ratio=0.0)
    try:
        sinks: list[Sink] = [Batches("a"), OneByOne("b")]
        plain = delivery_chains(sinks, telemetry=telemetry, clock=FakeClock())
        full = delivery_chains(sinks, telemetry=telemetry, clock=FakeClock(),
                               events=(profile(), EventsConfig()), is_leader=lambda: True)
    finally:
        telemetry.shutdown()
    assert [c.sink for c in full] == sinks
    assert [s.name for s in plain[0].stages] == ["meter"]
    assert [type(s) for s in full[1].stages] == [MeterStage, EventsStage, FenceStage]
    assert full[0].describe() == "meter → events → fence → sink a"
    for declared in full[0].declarations():
        assert declared.reads, declared
        assert declared.adds, declared
    assert any("extensions: reason" in added for added in full[0].declarations()[1].adds)
    # One stage object per sink: nothing is shared between two sinks' chains but the profile.
    assert not set(map(id, full[0].stages)) & set(map(id, full[1].stages))


async def test_the_status_is_the_sinks_own_and_in_flight_the_meters() -> None:
    sink = OneByOne()
    bare = DeliveryChain(sink=sink)
    assert bare.delivery is sink.delivery
    sink.last_error, sink.up, sink.in_flight = "HTTP 503", False, 3
    assert (bare.last_error, bare.healthy(), bare.in_flight) == ("HTTP 503", False, 3)
    assert isinstance(bare, Sink)  # what the pipeline is handed

    telemetry = Telemetry(trace_sample_ratio=0.0)
    try:
        sink = OneByOne()
        metered = DeliveryChain(sink=sink, stages=[MeterStage(sink=sink.name, telemetry=telemetry)])
        await metered.deliver_batch(pods(2), [lambda _o: None] * 2)
        sink.in_flight = 0  # the sink's own figure is not what the chain reports with a meter
        assert metered.in_flight == 2
        sink.acks[0](DeliveryOutcome.DELIVERED)
        assert metered.in_flight == 1
    finally:
        telemetry.shutdown()


def test_the_pipeline_gives_a_plain_sink_a_chain_of_no_stages_and_keeps_a_chain_as_it_is() -> None:
    sink = OneByOne()
    chain = as_chain(sink)
    assert chain.sink is sink
    assert (chain.stages, chain.name) == ((), "one")
    assert as_chain(chain) is chain


async def test_a_chain_of_no_stages_is_the_sink_as_it_is() -> None:
    sink = OneByOne()
    chain = DeliveryChain(sink=sink)
    await chain.start()
    await chain.deliver_batch(pods(2), [lambda _o: None] * 2)
    assert await chain.flush(1.0)
    await chain.close()
    assert sink.calls == ["start", "flush", "close"]
    assert [e.name for e in sink.got] == ["e0.1", "e1.1"]


async def test_a_sink_without_deliver_batch_gets_the_chain_once_per_event() -> None:
    journal: list[str] = []
    one, batches = OneByOne(), Batches()
    first, second, third = Seen("first", journal), Seen("second", journal), Seen("third", journal)
    per_event = DeliveryChain(sink=one, stages=[first, second])
    batched = DeliveryChain(sink=batches, stages=[third])
    events = pods(3)
    await per_event.deliver_batch(events, [lambda _o: None] * 3)
    await batched.deliver_batch(events, [lambda _o: None] * 3)
    assert first.sizes == second.sizes == [1, 1, 1]
    assert [e.name for e in one.got] == ["e0.1", "e1.1", "e2.1"]
    assert third.sizes == [3]
    assert batches.sizes == [3]
    with pytest.raises(ValueError, match="3 events but 2 acks"):
        await batched.deliver_batch(events, [lambda _o: None] * 2)


async def test_start_flush_and_close_go_through_every_stage_and_the_sink(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[str] = []
    sink = OneByOne()
    chain = DeliveryChain(sink=sink, stages=[Seen("broken", journal), Seen("after", journal)])
    await chain.start()
    assert sink.calls == ["start"]
    assert journal == ["start broken", "start after"]
    assert await chain.flush(1.0)
    assert journal[2:] == ["flush broken", "flush after"]
    assert sink.calls == ["start", "flush"]
    with caplog.at_level(logging.ERROR, logger="bridge.delivery.chain"):
        await chain.close()
    # A stage that fails to close is logged; the stages after it and the sink are closed all the same.
    assert journal[4:] == ["close broken", "close after"]
    assert sink.calls == ["start", "flush", "close"]
    assert "closing the broken stage of sink one failed" in caplog.text


async def test_a_coalesced_update_released_after_leadership_ended_never_reaches_the_sink() -> None:
    """The fence is the chain's last stage: what the events stage held and releases when its window
    ends (or at a flush) passes the fence too."""
    clock = FakeClock()
    leading = True
    sink = Batches()
    events = EventsStage(sink=sink.name, profile=profile(), coalesce_window=10.0, clock=clock)
    fence = FenceStage(is_leader=lambda: leading)
    chain = DeliveryChain(sink=sink, stages=[events, fence])
    await chain.start()
    acked: list[DeliveryOutcome] = []
    try:
        await chain.deliver(change(core_event(count=1)), acked.append)
        await chain.deliver(change(core_event(count=2), EventType.UPDATED), acked.append)
        assert [e.type for e in sink.got] == [EventType.ADDED]
        assert events.held == 1
        leading = False  # the renew deadline passed
        await clock.advance(11.0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert events.held == 0  # released by the window's end …
        assert fence.refused == 1  # … and refused by the fence
        assert [e.type for e in sink.got] == [EventType.ADDED]
    finally:
        await chain.close()  # the pipeline's abort: cancels the refused hand-over
    assert sink.calls == ["start", "close"]
    assert acked == []  # nothing acknowledged: the next leader sends it again


def test_the_delivery_layer_types_the_chain_as_what_it_is() -> None:
    """The listener, the heartbeats, the outage reporter and the inspection hand changes to, and read
    the status of, the sink's chain: typed as the chain (or what the listener uses of it), never as a
    sink, which the chain does not imitate."""
    import ast
    import inspect

    import bridge.delivery.heartbeat
    import bridge.delivery.inspection
    import bridge.delivery.outages
    import bridge.delivery.sink_listener

    for module in (bridge.delivery.sink_listener, bridge.delivery.heartbeat, bridge.delivery.outages,
                   bridge.delivery.inspection):
        tree = ast.parse(inspect.getsource(module))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "Sink" not in names, module.__name__


def test_a_chain_receives_batches_and_a_deliver_only_receiver_does_not() -> None:
    from bridge.delivery.chain import receives_batches

    sink = OneByOne()
    assert receives_batches(as_chain(sink))
    assert not receives_batches(sink)
