"""The kit's recording sink: a Sink by the contract, acknowledging as its script says (outcomes,
held acknowledgements, delays on a fake clock, failures, back-pressure), and checked by the kit's own
contract check."""

from __future__ import annotations

import asyncio

import pytest

from bridge.clock import FakeClock
from bridge.contracts import OverflowPolicy
from bridge.testing import (
    AckRecorder,
    ContractBreach,
    RecordingBatchSink,
    RecordingSink,
    Step,
    change_event,
    deliver_all,
    kube_object,
)
from sinks.contract import (
    AckCallback,
    BatchSink,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    Sink,
    SinkTransientError,
    takes_batches,
)


def ev(name: str, rv: str = "1", type_: EventType = EventType.ADDED) -> ChangeEvent:
    return change_event(type_, kube_object(name, rv=rv))


async def test_it_is_a_sink_and_by_default_acknowledges_every_event_at_once() -> None:
    sink = RecordingSink("rec", routing_resources=frozenset({"pods"}), buffer_capacity=8)
    assert isinstance(sink, Sink)
    assert not takes_batches(sink)
    acks = await deliver_all(sink, [ev("a"), ev("b", "2", EventType.UPDATED)])
    assert acks.outcomes == [("0", DeliveryOutcome.DELIVERED), ("1", DeliveryOutcome.DELIVERED)]
    assert sink.changes() == [("added", "default/a", "1", False), ("updated", "default/b", "2", False)]
    assert (sink.started, sink.closed, sink.last_error, sink.healthy()) == (True, True, "closed", False)
    assert (sink.delivery.routing, sink.delivery.buffer_capacity) == (frozenset({"pods"}), 8)
    assert sink.delivery.overflow_policy is OverflowPolicy.BLOCK
    sink.overflow_policy = "spill"  # read when asked
    assert sink.delivery.overflow_policy.value == "spill"


async def test_scripted_outcomes_holds_and_failures_apply_in_order_and_per_subject() -> None:
    sink = RecordingSink("rec")
    sink.script(Step.ack(DeliveryOutcome.DEAD_LETTERED), Step.hold())
    sink.script(Step.fail(SinkTransientError("broker down")), subject="default/bad")
    acks = AckRecorder()
    with pytest.raises(SinkTransientError, match="broker down"):  # its own script first
        await sink.deliver(ev("bad"), acks.callback("bad"))
    assert sink.last_error == "broker down"
    await sink.deliver(ev("bad", "2"), acks.callback("bad-2"))  # its own script is used up
    await sink.deliver(ev("held"), acks.callback("held"))
    await sink.deliver(ev("later"), acks.callback("later"))  # beyond the script: the default
    assert acks.outcomes == [("bad-2", DeliveryOutcome.DEAD_LETTERED), ("later", DeliveryOutcome.DELIVERED)]
    assert [e.name for e, _ in sink.refused] == ["bad"]
    assert [e.name for e, _ in sink.unacked] == ["held"]
    assert (sink.in_flight, sink.last_error) == (1, "")
    assert not await sink.flush(0)
    assert sink.ack_all(DeliveryOutcome.FILTERED) == 1
    assert await sink.flush(0)
    assert sink.outcomes() == [("default/bad", DeliveryOutcome.DEAD_LETTERED),
                               ("default/later", DeliveryOutcome.DELIVERED),
                               ("default/held", DeliveryOutcome.FILTERED)]
    assert acks.pending == ["bad"]  # refused: never acknowledged


async def test_delays_run_on_the_sinks_clock() -> None:
    clock = FakeClock()
    sink = RecordingSink("rec", clock=clock)
    sink.script(Step.ack(after=5.0), Step.ack().accepted_after(2.0))
    acks = AckRecorder()
    await sink.deliver(ev("late"), acks.callback("late"))
    blocked = asyncio.create_task(sink.deliver(ev("slow"), acks.callback("slow")), name="slow-deliver")
    await asyncio.sleep(0)
    assert (sink.in_flight, acks.outcomes, blocked.done()) == (1, [], False)
    await clock.advance(2.0)
    await blocked
    assert acks.outcomes == [("slow", DeliveryOutcome.DELIVERED)]
    await clock.advance(3.0)
    await asyncio.sleep(0)
    assert acks.outcomes[1:] == [("late", DeliveryOutcome.DELIVERED)]
    assert await sink.flush(0)


async def test_an_acknowledgement_timed_after_close_is_never_made() -> None:
    clock = FakeClock()
    sink = RecordingSink("rec", clock=clock, auto_ack=True)
    sink.script(Step.ack(after=1.0))
    acks = AckRecorder()
    await sink.deliver(ev("a"), acks.callback("a"))
    await sink.close()
    await clock.advance(2.0)
    assert acks.pending == ["a"]


async def test_the_batch_sink_takes_batches_through_deliver() -> None:
    sink = RecordingBatchSink("batch", auto_ack=False)
    assert isinstance(sink, BatchSink)
    assert takes_batches(sink)
    acks = AckRecorder()
    await sink.deliver_batch([ev("a"), ev("b")], [acks.callback("a"), acks.callback("b")])
    assert (sink.calls, sink.in_flight) == ([2], 2)
    sink.ack_all()
    assert acks.of(DeliveryOutcome.DELIVERED) == ["a", "b"]


class Twice(RecordingSink):
    """A sink that breaks the contract: it acknowledges every event twice."""

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        ack(DeliveryOutcome.DELIVERED)
        ack(DeliveryOutcome.DELIVERED)


async def test_the_contract_check_catches_a_second_acknowledgement_and_an_early_flush() -> None:
    with pytest.raises(ContractBreach, match="acknowledged twice"):
        await deliver_all(Twice("twice"), [ev("a")])
    held = RecordingSink("held", auto_ack=False)
    held.flush = lambda timeout: _true()  # type: ignore[method-assign]
    with pytest.raises(ContractBreach, match=r"flush returned True before acknowledging \['0'\]"):
        await deliver_all(held, [ev("a")])
    with pytest.raises(ContractBreach, match="reported events not acknowledged"):
        await deliver_all(RecordingSink("slow", auto_ack=False), [ev("a")], timeout=0)


async def _true() -> bool:
    return True
