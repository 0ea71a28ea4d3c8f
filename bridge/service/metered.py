"""A sink decorator that measures delivery: events in flight, ack latency and sampled trace spans.

The service wraps every configured sink in a :class:`MeteredSink`, so sinks (built-in or third-party)
need no telemetry code of their own. It forwards the sink's declared status (``delivery``,
``last_error``); other attributes reach the wrapped sink through ``__getattr__``, for tools and tests
only (the bridge reads nothing undeclared).

It runs once per event, so it makes no OpenTelemetry SDK call unless it must (each costs 7-10 µs,
see :mod:`bridge.service.telemetry`) and counts no outcomes (the exported counts are the pipeline's,
from its listeners, which see every acknowledgement anyway); a delivery's latency is recorded only
when :data:`~bridge.telemetry.LATENCY_SAMPLE_INTERVAL` has passed since the sink's last recorded one;
and a span is started only for the events that one random draw at
:attr:`Telemetry.trace_sample_ratio <bridge.telemetry.Telemetry.trace_sample_ratio>` picks. An event
that is not picked creates no span object at all.

:meth:`MeteredSink.deliver_batch` hands a batch to the wrapped sink's ``deliver_batch`` (a loop over
its ``deliver`` when it has none) and costs one small closure per event: the batch is timed from one
clock reading, at most one latency per batch is sampled (its first delivery, under the same interval
rule), and the traced events are chosen by drawing the gaps between them (a geometric distribution:
each event is still picked with probability ``trace_sample_ratio``, independently of the others)
instead of one draw per event.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from bridge.service.telemetry import LATENCY_SAMPLE_INTERVAL, Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, Sink, takes_batches

__all__ = ["MeteredSink"]

_DELIVERED = DeliveryOutcome.DELIVERED


class MeteredSink:
    def __init__(self, *, inner: Sink, telemetry: Telemetry,
                 clock: Callable[[], float] = time.perf_counter,
                 draw: Callable[[], float] = random.random,
                 latency_sample_interval: float = LATENCY_SAMPLE_INTERVAL) -> None:
        """``clock`` (monotonic seconds) times deliveries and spaces the latency samples; ``draw``
        (uniform in [0, 1)) decides which events get a span. Both are injectable for tests."""
        self.inner = inner
        self.name = inner.name
        self._telemetry = telemetry
        self._clock = clock
        self._draw = draw
        self._sample_ratio = telemetry.trace_sample_ratio
        self._latency_interval = latency_sample_interval
        self._last_latency = -float("inf")
        self._attrs = {"sink": inner.name}
        self.in_flight = 0
        self._inner_batch = inner if takes_batches(inner) else None
        self._next_traced: int | None = None
        """``deliver_batch``: events still to pass before the next traced one (drawn when needed)."""

    def __getattr__(self, item: str) -> Any:
        # Only called for attributes this wrapper does not define (the wrapped sink's stats, …).
        return getattr(self.inner, item)

    @property
    def delivery(self) -> DeliveryOptions:
        return self.inner.delivery

    @property
    def last_error(self) -> str:
        return self.inner.last_error

    async def start(self) -> None:
        await self.inner.start()

    def _finished(self, outcome: DeliveryOutcome, started: float) -> None:
        """One acknowledged event: no longer in flight; its latency sampled when it is a delivery."""
        self.in_flight -= 1
        if outcome is _DELIVERED:
            now = self._clock()
            if now - self._last_latency >= self._latency_interval:
                self._last_latency = now
                self._telemetry.delivery_duration.record(now - started, self._attrs)

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if self._sample_ratio and self._draw() < self._sample_ratio:
            await self._deliver_traced(event, ack)
            return
        started = self._clock()
        finished = self._finished

        def metered_ack(outcome: DeliveryOutcome) -> None:
            finished(outcome, started)
            ack(outcome)

        self.in_flight += 1
        try:
            await self.inner.deliver(event, metered_ack)
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

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        count = len(events)
        if count != len(acks):
            raise ValueError(f"deliver_batch: {count} events but {len(acks)} acks")
        if not count:
            return
        started = self._clock()
        clock = self._clock
        telemetry = self._telemetry
        attrs = self._attrs
        interval = self._latency_interval
        me = self
        unsampled = True  # the batch's first delivery is a latency sample candidate
        live = True  # False once the hand-over failed: in_flight was settled for the whole batch
        pending = count  # wrapped acks not called yet

        wrapped: list[AckCallback] = []
        for ack in acks:
            def metered_ack(outcome: DeliveryOutcome, ack: AckCallback = ack) -> None:
                nonlocal unsampled, pending
                pending -= 1
                if live:
                    me.in_flight -= 1
                if unsampled and outcome is _DELIVERED:
                    unsampled = False
                    now = clock()
                    if now - me._last_latency >= interval:
                        me._last_latency = now
                        telemetry.delivery_duration.record(now - started, attrs)
                ack(outcome)

            wrapped.append(metered_ack)
        spans: list[Any] = []
        if self._sample_ratio:
            at = self._next_traced
            if at is None:
                at = self._gap()
            while at < count:
                wrapped[at], span = self._traced_ack(events[at], wrapped[at])
                spans.append(span)
                at += 1 + self._gap()
            self._next_traced = at - count
        self.in_flight += count
        try:
            inner_batch = self._inner_batch
            if inner_batch is not None:
                await inner_batch.deliver_batch(events, wrapped)
            else:
                deliver = self.inner.deliver
                for i in range(count):
                    await deliver(events[i], wrapped[i])
        except BaseException:
            # Which events the sink took before it raised is unknown: the gauge forgets the batch's
            # unacknowledged events (acks that still come are not subtracted again).
            live = False
            self.in_flight -= pending
            for span in spans:
                if span.is_recording():  # not acknowledged (yet): ended without an outcome
                    span.end()
            raise

    def _traced_ack(self, event: ChangeEvent, ack: AckCallback) -> tuple[AckCallback, Any]:
        """A span for ``event`` and the ack that ends it (then calls ``ack``, which settles the
        gauge and samples the latency)."""
        span = self._telemetry.tracer.start_span(
            f"deliver {self.name}", kind=SpanKind.PRODUCER,
            attributes={"keb.sink": self.name, "keb.event.type": event.type.value,
                        "keb.resource": event.resource.qualified, "keb.subject": event.subject},
        )

        def traced_ack(outcome: DeliveryOutcome) -> None:
            if span.is_recording():  # else ended when the hand-over of its batch failed
                span.set_attribute("keb.outcome", outcome.value)
                if outcome is DeliveryOutcome.DEAD_LETTERED:
                    span.set_status(Status(StatusCode.ERROR, "dead-lettered"))
                span.end()
            ack(outcome)

        return traced_ack, span

    async def _deliver_traced(self, event: ChangeEvent, ack: AckCallback) -> None:
        span = self._telemetry.tracer.start_span(
            f"deliver {self.name}", kind=SpanKind.PRODUCER,
            attributes={"keb.sink": self.name, "keb.event.type": event.type.value,
                        "keb.resource": event.resource.qualified, "keb.subject": event.subject},
        )
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
            await self.inner.deliver(event, metered_ack)
        except BaseException:
            self.in_flight -= 1
            span.end()
            raise

    async def flush(self, timeout: float) -> bool:
        return await self.inner.flush(timeout)

    async def close(self) -> None:
        await self.inner.close()

    def healthy(self) -> bool:
        return self.inner.healthy()
