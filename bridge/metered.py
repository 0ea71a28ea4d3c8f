"""A sink decorator that measures delivery: outcome counts, ack latency and sampled trace spans.

The service wraps every configured sink in a :class:`MeteredSink`, so sinks (built-in or third-party)
need no telemetry code of their own. Attributes the bridge reads from a sink (routing, buffer and
resync settings) are forwarded to the wrapped sink.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from bridge.telemetry import Telemetry
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, Sink

__all__ = ["MeteredSink"]


class MeteredSink:
    def __init__(self, *, inner: Sink, telemetry: Telemetry) -> None:
        self.inner = inner
        self.name = inner.name
        self._telemetry = telemetry
        self._attrs = {"sink": inner.name}
        self._outcome_attrs = {o: {"sink": inner.name, "outcome": o.value} for o in DeliveryOutcome}
        self.in_flight = 0

    def __getattr__(self, item: str) -> Any:
        # Only called for attributes this wrapper does not define: routing_resources,
        # buffer_capacity, overflow_policy, resync_period, stats, …
        return getattr(self.inner, item)

    async def start(self) -> None:
        await self.inner.start()

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        telemetry = self._telemetry
        started = time.perf_counter()
        span = telemetry.tracer.start_span(
            f"deliver {self.name}", kind=SpanKind.PRODUCER,
            attributes={"keb.sink": self.name, "keb.event.type": event.type.value,
                        "keb.resource": event.resource.qualified, "keb.subject": event.subject},
        )
        self.in_flight += 1

        def metered_ack(outcome: DeliveryOutcome) -> None:
            self.in_flight -= 1
            telemetry.sink_events.add(1, self._outcome_attrs[outcome])
            if outcome is DeliveryOutcome.DELIVERED:
                telemetry.delivery_duration.record(time.perf_counter() - started, self._attrs)
            if span.is_recording():
                span.set_attribute("keb.outcome", outcome.value)
                if outcome is DeliveryOutcome.DEAD_LETTERED:
                    span.set_status(Status(StatusCode.ERROR, "dead-lettered"))
            span.end()
            ack(outcome)

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
