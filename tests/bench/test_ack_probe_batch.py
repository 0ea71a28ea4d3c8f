"""AckProbe.deliver_batch passes a batch through and counts each acknowledgement as deliver does."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bench.common import STAMP_ANNOTATION, AckProbe
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType
from tests.sinks import event, obj


class Recorder:
    """Acknowledges at once; records how events arrived (per call or per batch)."""

    name = "rec"

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def start(self) -> None:
        pass

    async def deliver(self, ev: ChangeEvent, ack: AckCallback) -> None:
        self.calls.append(1)
        ack(DeliveryOutcome.DELIVERED if ev.name != "skip" else DeliveryOutcome.FILTERED)

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return True

    delivery = DeliveryOptions()
    last_error = ""
    in_flight = 0


class BatchRecorder(Recorder):
    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.calls.append(len(events))
        for ev, ack in zip(events, acks, strict=True):
            ack(DeliveryOutcome.DELIVERED if ev.name != "skip" else DeliveryOutcome.FILTERED)


def events() -> list[ChangeEvent]:
    stamped = obj("a", rv="7")
    stamped["metadata"]["annotations"] = {STAMP_ANNOTATION: str(time.time())}
    return [event(EventType.ADDED, stamped), event(EventType.ADDED, obj("skip", rv="8")),
            event(EventType.ADDED, obj("b", rv="9"))]


async def test_batches_pass_through_and_every_ack_counts() -> None:
    for inner, calls in ((BatchRecorder(), [3]), (Recorder(), [1, 1, 1])):
        probe = AckProbe(inner)
        probe.final_after = 7
        probe.arm()
        acked: list[DeliveryOutcome] = []
        await probe.deliver_batch(events(), [acked.append] * 3)
        assert inner.calls == calls
        assert acked == [DeliveryOutcome.DELIVERED, DeliveryOutcome.FILTERED, DeliveryOutcome.DELIVERED]
        assert probe.acked == 3
        assert probe.final_acked == 2  # resourceVersions 8 and 9
        assert probe.outcomes == {"delivered": 2, "filtered": 1}
        assert probe.acked_rvs == {7, 8, 9}
        assert len(probe.latencies) == 1
        assert probe.latencies[0] >= 0
        assert await probe.wait_acked(3, 1.0)
