"""Per-event cost of the bridge's telemetry: what metering a sink and counting changes adds per event.

N change events are delivered, one after another in one event loop, to a pass-through sink that
acknowledges at once, three ways:

(a) **bare**: the informer's ``Counter`` update and the pass-through sink, no telemetry at all;
(b) **baseline**: the telemetry as it was before it was made cheap, rebuilt here: per event a
    ``tracer.start_span`` under the SDK's ``ParentBased(TraceIdRatioBased)`` sampler,
    ``Counter.add`` for the sink outcome, ``Histogram.record`` for every delivery's latency and
    ``Counter.add`` for the received change through the pipeline's ``on_event`` callback;
(c) **metered**: today's meter stage (:class:`~bridge.service.metered.MeterStage`, in the sink's
    delivery chain; no outcome counts: the exported ones are the pipeline's listeners'; latency
    sampled at most every 5 ms, one random draw per span) and the tracker's plain ``Counter``.

All three use the service's default span ratio (1%) and no span exporter, as a service without
``telemetry.otlp_endpoint`` runs. The figures are µs per event (best of ``repeats``) and
``overhead_ratio`` = (c - a) / (b - a): the share of the old telemetry cost that is left.

Run ``python -m bench.bench_telemetry [--quick]``: prints a table and writes
``bench/results/telemetry.json``. :func:`run` returns the same figures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry

from bench.common import machine_info, write_result
from bridge.delivery.chain import DeliveryChain
from bridge.service.metered import MeterStage
from bridge.service.telemetry import Telemetry
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    ResourceRef,
    Sink,
)

__all__ = ["main", "run"]

FULL_EVENTS = 200_000
QUICK_EVENTS = 20_000
REPEATS = 3
WARMUP = 1000
SAMPLE_RATIO = 0.01  # the service's default telemetry.trace_sample_ratio
PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")


class PassThroughSink:
    """Acknowledges every event as delivered, at once: what is left to measure is the wrapper."""

    name = "bench"
    delivery = DeliveryOptions()
    last_error = ""
    in_flight = 0

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        ack(DeliveryOutcome.DELIVERED)

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return True


# --------------------------------------------------------------------------------------------------
# (b) the telemetry as it was: synchronous SDK instruments and an SDK-sampled span per event


class BaselineTelemetry:
    """The instruments and sampler :class:`bridge.telemetry.Telemetry` had before counts moved to
    scrape time."""

    def __init__(self, ratio: float) -> None:
        reader = PrometheusMetricReader(registry=CollectorRegistry(), scope_info_enabled=False)
        self.meter_provider = MeterProvider(metric_readers=[reader])
        meter = self.meter_provider.get_meter("kube_event_bridge_baseline")
        self.events_received = meter.create_counter("keb.events.received", unit="{event}")
        self.sink_events = meter.create_counter("keb.sink.events", unit="{event}")
        self.delivery_duration = meter.create_histogram(
            "keb.sink.delivery.duration", unit="s",
            explicit_bucket_boundaries_advisory=[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])
        self.tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        self.tracer = self.tracer_provider.get_tracer("kube_event_bridge_baseline")

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()


class BaselineMeteredSink:
    """The sink metering decorator's ``deliver`` as it was: every call goes through the SDK."""

    def __init__(self, *, inner: Sink, telemetry: BaselineTelemetry) -> None:
        self.inner = inner
        self.name = inner.name
        self._telemetry = telemetry
        self._attrs = {"sink": inner.name}
        self._outcome_attrs = {o: {"sink": inner.name, "outcome": o.value} for o in DeliveryOutcome}
        self.in_flight = 0

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


# --------------------------------------------------------------------------------------------------
# the measurement


def make_events(count: int) -> list[ChangeEvent]:
    """Pod updates over 1000 distinct objects (the subject is part of a span's attributes)."""
    objects = [{"metadata": {"name": f"pod-{i}", "namespace": f"team-{i % 20}", "uid": f"uid-{i}",
                             "resourceVersion": str(i)}} for i in range(1000)]
    return [ChangeEvent(type=EventType.UPDATED, resource=PODS, cluster="bench",
                        obj=objects[i % len(objects)]) for i in range(count)]


async def _through(deliver: Callable[[ChangeEvent, AckCallback], Any], events: Sequence[ChangeEvent],
                   on_event: Callable[[str, str], None] | None) -> float:
    """Seconds to count and deliver every event as the pipeline does (tracker count, optional
    ``on_event`` hook, then the sink)."""
    received: collections.Counter[str] = collections.Counter()
    acked = 0

    def ack(_outcome: DeliveryOutcome) -> None:
        nonlocal acked
        acked += 1

    resource = PODS.qualified
    t0 = time.perf_counter()
    for event in events:
        received["update"] += 1
        if on_event is not None:
            on_event(resource, "update")
        await deliver(event, ack)
    seconds = time.perf_counter() - t0
    if acked != len(events) or received["update"] != len(events):
        raise RuntimeError(f"{acked} of {len(events)} events acknowledged")
    return seconds


async def _measure(events: Sequence[ChangeEvent], repeats: int) -> dict[str, Any]:
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    baseline = BaselineTelemetry(SAMPLE_RATIO)
    telemetry = Telemetry(trace_sample_ratio=SAMPLE_RATIO)
    try:
        bare = PassThroughSink()
        old = BaselineMeteredSink(inner=PassThroughSink(), telemetry=baseline)
        passed = PassThroughSink()
        new = DeliveryChain(sink=passed, stages=[MeterStage(sink=passed.name, telemetry=telemetry)])

        def old_on_event(resource: str, type_: str) -> None:
            baseline.events_received.add(1, {"resource": resource, "type": type_})

        warmup = events[:WARMUP]
        await _through(new.deliver, warmup, None)
        await _through(old.deliver, warmup, old_on_event)
        for _ in range(repeats):
            keep("bare", await _through(bare.deliver, events, None))
            keep("baseline", await _through(old.deliver, events, old_on_event))
            keep("metered", await _through(new.deliver, events, None))
        samples = _histogram_count(telemetry)
    finally:
        baseline.shutdown()
        telemetry.shutdown()

    n = len(events)
    us = {name: seconds / n * 1e6 for name, seconds in best.items()}
    old_cost = us["baseline"] - us["bare"]
    new_cost = us["metered"] - us["bare"]
    return {
        "bare_us_per_event": round(us["bare"], 3),
        "baseline_us_per_event": round(us["baseline"], 3),
        "metered_us_per_event": round(us["metered"], 3),
        "baseline_overhead_us_per_event": round(old_cost, 3),
        "metered_overhead_us_per_event": round(new_cost, 3),
        "overhead_ratio": round(new_cost / old_cost, 4) if old_cost > 0 else None,
        "metered_latency_samples": samples,
        "metered_events": n * repeats + len(warmup),
    }


def _histogram_count(telemetry: Telemetry) -> int:
    """Latency records the metered runs made (time-sampled, so far fewer than events)."""
    for line in telemetry.render_prometheus().decode().splitlines():
        if line.startswith("keb_sink_delivery_duration_seconds_count"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def run(quick: bool = False, *, events: int | None = None, repeats: int = REPEATS,
        results_dir: Path | None = None) -> dict[str, Any]:
    """Measures (a), (b) and (c); ``events`` overrides the count (smoke tests). Writes
    ``telemetry.json`` to ``results_dir`` (default ``bench/results``) and returns the figures."""
    count = events if events is not None else (QUICK_EVENTS if quick else FULL_EVENTS)
    figures = asyncio.run(_measure(make_events(count), repeats))
    result: dict[str, Any] = {"scenario": "telemetry", "quick": quick, "machine": machine_info(),
                              "events": count, "repeats": repeats, "trace_sample_ratio": SAMPLE_RATIO,
                              **figures}
    write_result("telemetry", result, results_dir)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts (a few seconds)")
    args = parser.parse_args(argv)
    r = run(args.quick)
    print(f"{'variant':<10}  {'µs/event':>9}  {'telemetry µs/event':>18}")
    print(f"{'bare':<10}  {r['bare_us_per_event']:>9.2f}  {'':>18}")
    for name in ("baseline", "metered"):
        print(f"{name:<10}  {r[f'{name}_us_per_event']:>9.2f}  "
              f"{r[f'{name}_overhead_us_per_event']:>18.2f}")
    print(f"overhead ratio (metered - bare) / (baseline - bare): {r['overhead_ratio']}")
    print(f"latency samples recorded by the metered runs: {r['metered_latency_samples']} "
          f"of {r['metered_events']} deliveries")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
