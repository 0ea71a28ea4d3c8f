"""A sink decorator that measures delivery: outcome counts, ack latency and sampled trace spans.

The service wraps every configured sink in a :class:`MeteredSink`, so sinks (built-in or third-party)
need no telemetry code of their own. Attributes the bridge reads from a sink (routing, buffer and
resync settings) are forwarded to the wrapped sink.

It runs once per event, so it makes no OpenTelemetry SDK call unless it must (each costs 7-10 µs,
see :mod:`bridge.service.telemetry`): outcomes are counted in plain integers that the service exports at
scrape time; a delivery's latency is recorded only when :data:`~bridge.telemetry.LATENCY_SAMPLE_INTERVAL`
has passed since the sink's last recorded one; and a span is started only for the events that one
random draw at :attr:`Telemetry.trace_sample_ratio <bridge.telemetry.Telemetry.trace_sample_ratio>`
picks. An event that is not picked creates no span object at all.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from bridge.service.telemetry import LATENCY_SAMPLE_INTERVAL, Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, Sink

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
        self.delivered = 0
        """Events acknowledged as delivered (the common outcome, counted apart from the others)."""
        self._other_outcomes: collections.Counter[DeliveryOutcome] = collections.Counter()

    def __getattr__(self, item: str) -> Any:
        # Only called for attributes this wrapper does not define: routing_resources,
        # buffer_capacity, overflow_policy, resync_period, stats, …
        return getattr(self.inner, item)

    def outcome_counts(self) -> dict[str, int]:
        """Outcome value → events finished through this wrapper, every outcome present (zero too, so
        that ``increase()`` sees the first dead letter or drop)."""
        counts = {o.value: self._other_outcomes[o] for o in DeliveryOutcome}
        counts[_DELIVERED.value] = self.delivered
        return counts

    async def start(self) -> None:
        await self.inner.start()

    def _finished(self, outcome: DeliveryOutcome, started: float) -> None:
        """Counts one acknowledged event; samples its latency when it is a delivery."""
        self.in_flight -= 1
        if outcome is _DELIVERED:
            self.delivered += 1
            now = self._clock()
            if now - self._last_latency >= self._latency_interval:
                self._last_latency = now
                self._telemetry.delivery_duration.record(now - started, self._attrs)
        else:
            self._other_outcomes[outcome] += 1

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
