"""The meter stage of a sink's delivery chain: events in flight, ack latency and sampled trace spans.

The service puts a :class:`MeterStage` first in every sink's delivery chain
(:mod:`bridge.delivery.chain`), so sinks (built-in or third-party) need no telemetry code of their
own. It reads nothing of a change but what a span names (its type, resource and subject) and adds
to each acknowledgement: the in-flight gauge (the chain's ``in_flight``: events it passed on and
that are not acknowledged, held ones included), the sampled latency and the span.

It runs once per event, so it makes no OpenTelemetry SDK call unless it must (each costs 7-10 µs,
see :mod:`bridge.service.telemetry`) and counts no outcomes (the exported counts are the pipeline's,
from its listeners, which see every acknowledgement anyway); a delivery's latency is recorded only
when :data:`~bridge.telemetry.LATENCY_SAMPLE_INTERVAL` has passed since the sink's last recorded one;
and a span is started only for the events that one random draw at
:attr:`Telemetry.trace_sample_ratio <bridge.telemetry.Telemetry.trace_sample_ratio>` picks. An event
that is not picked creates no span object at all.

A batch of one event (what a single ``deliver`` is) takes one draw for its span and samples its
latency under the interval rule. A larger batch costs one small object per batch, whose bound
method, partially applied to each event's index, is that event's ack (no Python function is built
per event; the in-flight gauge still moves per acknowledged event): it is timed from one clock
reading, at most one latency per batch is sampled (its first delivery, under the same interval
rule), and the traced events are chosen by drawing the gaps between them (a geometric
distribution: each event is still picked with probability ``trace_sample_ratio``, independently of
the others) instead of one draw per event. The two draws may interleave: the geometric gap is
memoryless, so a pending gap stays right for the next batch whatever single events came between.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from bridge.delivery.chain import HandOn
from bridge.service.telemetry import LATENCY_SAMPLE_INTERVAL, Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome

__all__ = ["MeterStage"]

_DELIVERED = DeliveryOutcome.DELIVERED


class _Batch:
    """The acknowledgements of one batch (module docs): one object per batch, the ack of its i-th
    event a ``functools.partial`` of :meth:`acked` (no Python function built per event)."""

    __slots__ = ("acks", "live", "meter", "pending", "started", "unsampled")

    def __init__(self, meter: MeterStage, acks: Sequence[AckCallback], started: float) -> None:
        self.meter = meter
        self.acks = acks
        self.started = started
        """The batch's one clock reading: its latency sample is timed from it."""
        self.unsampled = True
        """The batch's first delivery is a latency sample candidate."""
        self.live = True
        """False once the hand-over failed: in_flight was settled for the whole batch."""
        self.pending = len(acks)
        """Acks not called yet."""

    def acked(self, i: int, outcome: DeliveryOutcome) -> None:
        self.pending -= 1
        meter = self.meter
        if self.live:
            meter.in_flight -= 1
        if self.unsampled and outcome is _DELIVERED:
            self.unsampled = False
            now = meter._clock()
            if now - meter._last_latency >= meter._latency_interval:
                meter._last_latency = now
                meter._telemetry.delivery_duration.record(now - self.started, meter._attrs)
        self.acks[i](outcome)


class MeterStage:
    """Meters one sink's deliveries (see the module docs); first in the sink's chain."""

    name = "meter"
    reads = ("type, resource, subject (of a traced event, for its span)",)
    adds = ("to each ack: the in-flight count, a sampled latency (keb_sink_delivery_duration_seconds), "
            "a sampled span",)

    def __init__(self, *, sink: str, telemetry: Telemetry,
                 clock: Callable[[], float] = time.perf_counter,
                 draw: Callable[[], float] = random.random,
                 latency_sample_interval: float = LATENCY_SAMPLE_INTERVAL) -> None:
        """``sink`` names the metered sink (the metrics' label, the spans' name). ``clock``
        (monotonic seconds) times deliveries and spaces the latency samples; ``draw`` (uniform in
        [0, 1)) decides which events get a span. Both are injectable for tests."""
        self.sink = sink
        self._telemetry = telemetry
        self._clock = clock
        self._draw = draw
        self._sample_ratio = telemetry.trace_sample_ratio
        self._latency_interval = latency_sample_interval
        self._last_latency = -float("inf")
        self._attrs = {"sink": sink}
        self.in_flight = 0
        """Events handed on and not acknowledged yet (the sink's ``keb_sink_in_flight``)."""
        self._next_traced: int | None = None
        """Batches: events still to pass before the next traced one (drawn when needed)."""

    async def start(self, hand_on: HandOn) -> None:
        pass

    def has_room(self, count: int) -> bool:
        """Always: the meter never waits (:class:`~sinks.contract.Admits`)."""
        return True

    async def flush(self, hand_on: HandOn) -> None:
        pass

    async def close(self) -> None:
        pass

    async def process(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                      hand_on: HandOn) -> None:
        if len(events) == 1:
            await self._one(events[0], acks[0], hand_on)
        else:
            await self._batch(events, acks, hand_on)

    def _finished(self, outcome: DeliveryOutcome, started: float) -> None:
        """One acknowledged event: no longer in flight; its latency sampled when it is a delivery."""
        self.in_flight -= 1
        if outcome is _DELIVERED:
            now = self._clock()
            if now - self._last_latency >= self._latency_interval:
                self._last_latency = now
                self._telemetry.delivery_duration.record(now - started, self._attrs)

    async def _one(self, event: ChangeEvent, ack: AckCallback, hand_on: HandOn) -> None:
        if self._sample_ratio and self._draw() < self._sample_ratio:
            await self._one_traced(event, ack, hand_on)
            return
        started = self._clock()
        finished = self._finished

        def metered_ack(outcome: DeliveryOutcome) -> None:
            finished(outcome, started)
            ack(outcome)

        self.in_flight += 1
        try:
            await hand_on((event,), (metered_ack,))
        except BaseException:
            self.in_flight -= 1
            raise

    def _gap(self) -> int:
        """How many events pass untraced before the next traced one: geometric with parameter
        ``trace_sample_ratio`` (the number of failures before the first success)."""
        ratio = self._sample_ratio
        if ratio >= 1.0:
            return 0
        u = 1.0 - self._draw()  # in (0, 1]
        return int(math.log(u) / math.log1p(-ratio))

    async def _batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                     hand_on: HandOn) -> None:
        count = len(events)
        batch = _Batch(self, acks, self._clock())
        acked = batch.acked
        wrapped: list[AckCallback] = [functools.partial(acked, i) for i in range(count)]
        spans = self._trace_batch(events, wrapped) if self._sample_ratio else []
        self.in_flight += count
        try:
            await hand_on(events, wrapped)
        except BaseException:
            # Which events the sink took before it raised is unknown: the gauge forgets the batch's
            # unacknowledged events (acks that still come are not subtracted again).
            batch.live = False
            self.in_flight -= batch.pending
            for span in spans:
                if span.is_recording():  # not acknowledged (yet): ended without an outcome
                    span.end()
            raise

    def _trace_batch(self, events: Sequence[ChangeEvent], wrapped: list[AckCallback]) -> list[Any]:
        """Gives the batch's traced events (drawn by gaps) a span, ended by their ack in ``wrapped``."""
        count = len(events)
        spans: list[Any] = []
        at = self._next_traced
        if at is None:
            at = self._gap()
        while at < count:
            wrapped[at], span = self._traced_ack(events[at], wrapped[at])
            spans.append(span)
            at += 1 + self._gap()
        self._next_traced = at - count
        return spans

    def _span(self, event: ChangeEvent) -> Any:
        return self._telemetry.tracer.start_span(
            f"deliver {self.sink}", kind=SpanKind.PRODUCER,
            attributes={"keb.sink": self.sink, "keb.event.type": event.type.value,
                        "keb.resource": event.resource.qualified, "keb.subject": event.subject},
        )

    def _traced_ack(self, event: ChangeEvent, ack: AckCallback) -> tuple[AckCallback, Any]:
        """A span for ``event`` and the ack that ends it (then calls ``ack``, which settles the
        gauge and samples the latency)."""
        span = self._span(event)

        def traced_ack(outcome: DeliveryOutcome) -> None:
            if span.is_recording():  # else ended when the hand-over of its batch failed
                span.set_attribute("keb.outcome", outcome.value)
                if outcome is DeliveryOutcome.DEAD_LETTERED:
                    span.set_status(Status(StatusCode.ERROR, "dead-lettered"))
                span.end()
            ack(outcome)

        return traced_ack, span

    async def _one_traced(self, event: ChangeEvent, ack: AckCallback, hand_on: HandOn) -> None:
        span = self._span(event)
        started = self._clock()

        def metered_ack(outcome: DeliveryOutcome) -> None:
            self._finished(outcome, started)
            span.set_attribute("keb.outcome", outcome.value)
            if outcome is DeliveryOutcome.DEAD_LETTERED:
                span.set_status(Status(StatusCode.ERROR, "dead-lettered"))
            span.end()
            ack(outcome)

        self.in_flight += 1
        try:
            await hand_on((event,), (metered_ack,))
        except BaseException:
            self.in_flight -= 1
            span.end()
            raise
