"""The meter stage on batches: the same acks and in-flight gauge as per-event delivery, sampled
latency per batch, the traced share kept, and a sink without ``deliver_batch`` fed by a loop over
``deliver``."""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge.delivery.chain import DeliveryChain
from bridge.service.metered import MeterStage
from bridge.service.telemetry import LATENCY_SAMPLE_INTERVAL, Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, SinkError
from tests.service.test_service import metric
from tests.service.test_telemetry_cost import (
    AckingSink,
    FakeClock,
    RecordingTracer,
    event,
    exposed,
    meter_of,
    metered,
)


class BatchAckingSink(AckingSink):
    """AckingSink with ``deliver_batch``; records the batch sizes it was given."""

    def __init__(self, clock: FakeClock, **kw: object) -> None:
        super().__init__(clock, **kw)  # type: ignore[arg-type]
        self.batches: list[int] = []
        self.closed = False
        self.held: list[tuple[ChangeEvent, AckCallback]] = []
        self.hold = False

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if self.closed:
            raise SinkError("closed")
        if self.hold:
            self.held.append((event, ack))
            return
        await super().deliver(event, ack)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.batches.append(len(events))
        for ev, ack in zip(events, acks, strict=True):
            await self.deliver(ev, ack)


def batches(count: int, size: int) -> list[list[ChangeEvent]]:
    events = [event(i) for i in range(count)]
    return [events[i:i + size] for i in range(0, count, size)]


async def test_acks_and_in_flight_equal_per_event_delivery() -> None:
    outcomes = [DeliveryOutcome.FILTERED] * 7 + [DeliveryOutcome.DEAD_LETTERED] * 3
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    inner = BatchAckingSink(clock, outcomes=outcomes)
    m = metered(telemetry, inner, clock)
    acked: list[DeliveryOutcome] = []
    for chunk in batches(1000, 64):
        await m.deliver_batch(chunk, [acked.append] * len(chunk))
        assert m.in_flight == 0
    telemetry.shutdown()
    assert inner.batches == [64] * 15 + [40]
    assert acked == outcomes + [DeliveryOutcome.DELIVERED] * 990


async def test_a_sink_without_deliver_batch_gets_a_loop_over_deliver() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    inner = AckingSink(clock)
    assert not hasattr(inner, "deliver_batch")
    m = metered(telemetry, inner, clock)
    acked: list[DeliveryOutcome] = []
    await m.deliver_batch([event(i) for i in range(5)], [acked.append] * 5)
    telemetry.shutdown()
    assert [ev.name for ev in inner.delivered] == [f"p{i}" for i in range(5)]
    assert acked == [DeliveryOutcome.DELIVERED] * 5


async def test_latency_is_sampled_once_per_batch_under_the_interval_rule() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    m = metered(telemetry, BatchAckingSink(clock, latency=0.0001), clock)
    # 40 batches of 10, spaced by more than the interval: one sample each, its first delivery's.
    for chunk in batches(400, 10):
        await m.deliver_batch(chunk, [lambda _o: None] * len(chunk))
        clock.t += LATENCY_SAMPLE_INTERVAL
    # 40 more batches of 10 without spacing: one sample per interval at most.
    for chunk in batches(400, 10):
        await m.deliver_batch(chunk, [lambda _o: None] * len(chunk))
    text = exposed(telemetry, m)
    telemetry.shutdown()
    count = metric(text, "keb_sink_delivery_duration_seconds_count", sink="s")
    # The unspaced part lasts 400 x 0.1 ms = 40 ms: at most 40 / 5 + 1 samples.
    assert 40 < count <= 40 + 0.04 / LATENCY_SAMPLE_INTERVAL + 1
    # The first batch's sample: its first event acknowledged 0.1 ms after the batch was handed over.
    assert metric(text, "keb_sink_delivery_duration_seconds_bucket", sink="s", le="0.0005") >= 1


async def test_ratio_one_traces_every_event_and_zero_none() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=1.0)
    exporter = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    inner = BatchAckingSink(clock, outcomes=[DeliveryOutcome.DEAD_LETTERED])
    m = metered(telemetry, inner, clock)
    for chunk in batches(20, 6):
        await m.deliver_batch(chunk, [lambda _o: None] * len(chunk))
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    subjects = [s.attributes["keb.subject"] for s in spans if s.attributes]
    assert subjects == [f"default/p{i}" for i in range(20)]
    outcomes = [s.attributes["keb.outcome"] for s in spans if s.attributes]
    assert outcomes == ["dead_lettered"] + ["delivered"] * 19

    zero = Telemetry(trace_sample_ratio=0.0)
    tracer = RecordingTracer()
    zero.tracer = tracer  # type: ignore[assignment]
    inner = BatchAckingSink(clock)
    m = metered(zero, inner, clock, draw=lambda: pytest.fail("no draw at ratio 0"))
    for chunk in batches(200, 50):
        await m.deliver_batch(chunk, [lambda _o: None] * len(chunk))
    zero.shutdown()
    assert tracer.started == 0
    assert len(inner.delivered) == 200


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5])
async def test_the_traced_share_is_the_ratio(ratio: float) -> None:
    """Each event is picked with probability ``ratio``: over 40,000 events the share is within five
    standard deviations (a fixed seed: the test is deterministic), and gaps between picks are
    geometric (their mean is (1 - ratio) / ratio)."""
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=ratio)
    rng = random.Random(18)
    m = metered(telemetry, BatchAckingSink(clock), clock, draw=rng.random)
    picked: list[int] = []

    def pick(ev: ChangeEvent, ack: AckCallback) -> tuple[AckCallback, object]:
        picked.append(int(ev.name[1:]))
        return ack, None

    meter_of(m)._traced_ack = pick  # type: ignore[method-assign,assignment]
    n = 40_000
    events = [event(i) for i in range(n)]
    size = 97
    for start in range(0, n, size):
        chunk = events[start:start + size]
        await m.deliver_batch(chunk, [lambda _o: None] * len(chunk))
    telemetry.shutdown()
    sd = math.sqrt(n * ratio * (1 - ratio))
    assert abs(len(picked) - n * ratio) < 5 * sd
    assert picked == sorted(set(picked))
    gaps = [b - a - 1 for a, b in itertools.pairwise(picked)]
    assert sum(gaps) / len(gaps) == pytest.approx((1 - ratio) / ratio, rel=0.1)


async def test_a_failed_hand_over_settles_the_in_flight_gauge() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=1.0)
    exporter = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    inner = BatchAckingSink(clock)
    m = metered(telemetry, inner, clock)
    inner.hold = True
    acked: list[DeliveryOutcome] = []
    await m.deliver_batch([event(0), event(1)], [acked.append] * 2)
    assert m.in_flight == 2
    inner.closed = True
    with pytest.raises(SinkError):
        await m.deliver_batch([event(2)], [acked.append])
    assert m.in_flight == 2  # the held two are still out; the refused one is not
    # A late ack of an earlier batch still counts.
    for _ev, ack in inner.held:
        ack(DeliveryOutcome.DELIVERED)
    assert m.in_flight == 0
    assert acked == [DeliveryOutcome.DELIVERED] * 2
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    assert len(spans) == 3  # the refused event's span ended too, without an outcome
    assert sorted(str(s.attributes.get("keb.outcome")) for s in spans if s.attributes is not None) == \
        ["None", "delivered", "delivered"]


class Forwarding:
    """A third-party wrapper: its own ``deliver``, everything else forwarded to the wrapped sink."""

    def __init__(self, inner: BatchAckingSink) -> None:
        self.inner = inner
        self.seen: list[str] = []

    def __getattr__(self, item: str) -> object:
        return getattr(self.inner, item)

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.seen.append(event.name)
        await self.inner.deliver(event, ack)


async def test_a_forwarding_wrapper_keeps_its_own_deliver() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    inner = BatchAckingSink(clock)
    wrapper = Forwarding(inner)
    m = DeliveryChain(sink=wrapper, stages=[MeterStage(sink="s", telemetry=telemetry, clock=clock)])  # type: ignore[arg-type]
    acked: list[DeliveryOutcome] = []
    await m.deliver_batch([event(i) for i in range(3)], [acked.append] * 3)
    telemetry.shutdown()
    assert wrapper.seen == ["p0", "p1", "p2"]
    assert inner.batches == []
    assert acked == [DeliveryOutcome.DELIVERED] * 3


async def test_a_batch_builds_one_ack_object_and_exports_the_figures_per_event() -> None:
    """A batch's acks are partials of one object's method (no function built per event), and what is
    exported is what per-event acks gave: the in-flight gauge moves with every acknowledged event, one
    latency sample per batch (its first delivery, timed from the hand-over), outcomes passed on."""
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    inner = BatchAckingSink(clock)
    inner.hold = True
    m = metered(telemetry, inner, clock)
    acked: list[DeliveryOutcome] = []
    await m.deliver_batch([event(i) for i in range(5)], [acked.append] * 5)
    acks = [ack for _ev, ack in inner.held]
    assert all(isinstance(ack, functools.partial) for ack in acks)
    owners = {id(getattr(ack.func, "__self__", None)) for ack in acks if isinstance(ack, functools.partial)}
    assert len(owners) == 1
    assert metric(exposed(telemetry, m), "keb_sink_in_flight", sink="s") == 5
    clock.t += 0.003
    acks[0](DeliveryOutcome.FILTERED)  # not a delivery: no latency sample
    clock.t += 0.004
    acks[1](DeliveryOutcome.DELIVERED)  # the sample: 7 ms after the hand-over
    assert metric(exposed(telemetry, m), "keb_sink_in_flight", sink="s") == 3
    clock.t += LATENCY_SAMPLE_INTERVAL
    for ack in acks[2:]:
        ack(DeliveryOutcome.DELIVERED)
    text = exposed(telemetry, m)
    telemetry.shutdown()
    assert metric(text, "keb_sink_in_flight", sink="s") == 0
    assert metric(text, "keb_sink_delivery_duration_seconds_count", sink="s") == 1
    assert metric(text, "keb_sink_delivery_duration_seconds_sum", sink="s") == pytest.approx(0.007)
    assert acked == [DeliveryOutcome.FILTERED] + [DeliveryOutcome.DELIVERED] * 4
