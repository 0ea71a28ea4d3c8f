"""Per-event telemetry is cheap and still exact where it must be.

The meter stage counts no outcomes (the exported counts are the pipeline's); the latency histogram is
sampled in time (at most one record per ``LATENCY_SAMPLE_INTERVAL`` per sink); spans are decided by
one draw per event and, when not drawn, never created. The clock and the draw are injected, so
nothing here depends on speed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bridge.delivery.chain import DeliveryChain
from bridge.service.config import BridgeConfig
from bridge.service.metered import MeterStage
from bridge.service.service import BridgeService
from bridge.service.telemetry import (
    LATENCY_SAMPLE_INTERVAL,
    InformerGauges,
    SinkGauges,
    Telemetry,
    TelemetrySnapshot,
)
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType, ResourceRef
from tests.service.test_service import eventually, metric

pytestmark = pytest.mark.usefixtures("own_cwd")

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")


class FakeClock:
    """Monotonic seconds that move only when the test (or the fake sink) says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class AckingSink:
    """A sink that acknowledges at once, after ``latency`` seconds on the fake clock, with the
    outcomes it is given in turn (delivered when none are left)."""

    def __init__(self, clock: FakeClock, *, latency: float = 0.0,
                 outcomes: Sequence[DeliveryOutcome] = ()) -> None:
        self.name = "s"
        self.delivery = DeliveryOptions()
        self.last_error = ""
        self.in_flight = 0
        self.clock = clock
        self.latency = latency
        self._outcomes: Iterator[DeliveryOutcome] = iter(outcomes)
        self.delivered: list[ChangeEvent] = []

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.delivered.append(event)
        self.clock.t += self.latency
        ack(next(self._outcomes, DeliveryOutcome.DELIVERED))

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass

    def healthy(self) -> bool:
        return True


class RecordingTracer:
    """Stands in for the tracer to prove that no span is started."""

    def __init__(self) -> None:
        self.started = 0

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        self.started += 1
        raise AssertionError("a span was started for an event that was not drawn")


def event(i: int) -> ChangeEvent:
    return ChangeEvent(type=EventType.UPDATED, resource=PODS, cluster="test",
                       obj={"metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"}})


def metered(telemetry: Telemetry, sink: AckingSink, clock: FakeClock,
            draw: Callable[[], float] | None = None) -> DeliveryChain:
    """``sink`` in a delivery chain with a meter stage alone, as the service meters it."""
    if draw is None:
        meter = MeterStage(sink=sink.name, telemetry=telemetry, clock=clock)
    else:
        meter = MeterStage(sink=sink.name, telemetry=telemetry, clock=clock, draw=draw)
    return DeliveryChain(sink=sink, stages=[meter])


def meter_of(chain: DeliveryChain) -> MeterStage:
    meter = chain.stages[0]
    assert isinstance(meter, MeterStage)
    return meter


def exposed(telemetry: Telemetry, m: DeliveryChain) -> str:
    telemetry.set_snapshot_source(lambda: TelemetrySnapshot(
        sinks={m.name: SinkGauges(in_flight=m.in_flight)}))
    return telemetry.render_prometheus().decode()


async def deliver_spaced(m: DeliveryChain, clock: FakeClock, count: int, spacing: float) -> None:
    for i in range(count):
        await m.deliver(event(i), lambda _outcome: None)
        clock.t += spacing


# --- counts ---------------------------------------------------------------------------------------


async def test_the_meter_keeps_no_count_per_event() -> None:
    """The exported outcome counts are the pipeline's (its listeners count every acknowledgement):
    after a burst of every outcome, the meter stage holds what it held before, but for its in-flight
    gauge (back to 0) and the time of its last latency sample."""
    clock = FakeClock()
    outcomes = [DeliveryOutcome.FILTERED, DeliveryOutcome.DEAD_LETTERED, DeliveryOutcome.DROPPED]
    m = metered(Telemetry(trace_sample_ratio=0.0), AckingSink(clock, outcomes=outcomes), clock)
    meter = meter_of(m)
    sampling = {"_last_latency"}
    before = {k: repr(v) for k, v in vars(meter).items() if k not in sampling}
    await deliver_spaced(m, clock, 1000, 0.0)
    await m.deliver_batch([event(i) for i in range(100)], [lambda _o: None] * 100)
    meter._telemetry.shutdown()
    assert {k: repr(v) for k, v in vars(meter).items() if k not in sampling} == before


def test_carried_totals_add_to_the_live_snapshot() -> None:
    telemetry = Telemetry(snapshot=lambda: TelemetrySnapshot(
        sinks={"s": SinkGauges(outcomes={"delivered": 2})},
        informers={"po": InformerGauges(resource="pods", informer="pods.all.1", received={"added": 5}),
                   "deploy": InformerGauges(resource="deployments.apps", informer="deploy.all.2",
                                            received={"updated": 1})}))
    telemetry.sink_events.add(3, {"sink": "s", "outcome": "delivered"})
    telemetry.events_received.add(4, {"resource": "pods", "informer": "pods.all.1", "type": "added"})
    with pytest.raises(ValueError, match="only goes up"):
        telemetry.sink_events.add(-1, {"sink": "s", "outcome": "delivered"})
    text = telemetry.render_prometheus().decode()
    telemetry.shutdown()
    assert metric(text, "keb_sink_events_total", sink="s", outcome="delivered") == 5
    assert metric(text, "keb_events_received_total", resource="pods", informer="pods.all.1",
                  type="added") == 9
    assert metric(text, "keb_events_received_total", resource="deployments.apps", informer="deploy.all.2",
                  type="updated") == 1


# --- latency --------------------------------------------------------------------------------------


async def test_latency_at_a_high_rate_is_sampled_at_most_every_interval() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    m = metered(telemetry, AckingSink(clock, latency=0.0001), clock)
    await deliver_spaced(m, clock, 1000, 0.0)  # 1000 deliveries in 0.1 s of the fake clock
    text = exposed(telemetry, m)
    telemetry.shutdown()
    count = metric(text, "keb_sink_delivery_duration_seconds_count", sink="s")
    assert 0 < count <= 1000
    assert count == pytest.approx(0.1 / LATENCY_SAMPLE_INTERVAL, abs=1)
    # What is recorded is the sampled deliveries' true latency.
    total = metric(text, "keb_sink_delivery_duration_seconds_sum", sink="s")
    assert total == pytest.approx(count * 0.0001)


async def test_latency_of_spaced_deliveries_is_recorded_every_time() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    m = metered(telemetry, AckingSink(clock, latency=0.002), clock)
    await deliver_spaced(m, clock, 50, LATENCY_SAMPLE_INTERVAL + 0.001)
    text = exposed(telemetry, m)
    telemetry.shutdown()
    assert metric(text, "keb_sink_delivery_duration_seconds_count", sink="s") == 50
    assert metric(text, "keb_sink_delivery_duration_seconds_sum", sink="s") == pytest.approx(50 * 0.002)
    # 2 ms falls in the (1 ms, 2.5 ms] bucket.
    assert metric(text, "keb_sink_delivery_duration_seconds_bucket", sink="s", le="0.001") == 0
    assert metric(text, "keb_sink_delivery_duration_seconds_bucket", sink="s", le="0.0025") == 50


async def test_only_deliveries_are_timed() -> None:
    clock = FakeClock()
    telemetry = Telemetry(trace_sample_ratio=0.0)
    m = metered(telemetry, AckingSink(clock, outcomes=[DeliveryOutcome.FILTERED] * 3), clock)
    await deliver_spaced(m, clock, 3, 1.0)
    text = exposed(telemetry, m)
    telemetry.shutdown()
    assert "keb_sink_delivery_duration_seconds_count" not in text


# --- spans ----------------------------------------------------------------------------------------


def traced(ratio: float) -> tuple[Telemetry, InMemorySpanExporter]:
    telemetry = Telemetry(trace_sample_ratio=ratio)
    exporter = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return telemetry, exporter


async def test_ratio_one_gives_every_delivery_a_recorded_span() -> None:
    clock = FakeClock()
    telemetry, exporter = traced(1.0)
    m = metered(telemetry, AckingSink(clock, outcomes=[DeliveryOutcome.DEAD_LETTERED]), clock)
    await deliver_spaced(m, clock, 20, 0.0)
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    assert len(spans) == 20
    assert all(s.name == "deliver s" and s.context is not None and s.context.trace_flags.sampled
               for s in spans)
    assert [s.attributes["keb.outcome"] for s in spans if s.attributes] == \
        ["dead_lettered"] + ["delivered"] * 19
    assert spans[0].status.status_code is StatusCode.ERROR
    subjects = {s.attributes["keb.subject"] for s in spans if s.attributes}
    assert subjects == {f"default/p{i}" for i in range(20)}


async def test_ratio_zero_creates_no_span_at_all() -> None:
    clock = FakeClock()
    telemetry, exporter = traced(0.0)
    tracer = RecordingTracer()
    telemetry.tracer = tracer  # type: ignore[assignment]
    sink = AckingSink(clock)
    m = metered(telemetry, sink, clock)
    await deliver_spaced(m, clock, 200, 0.0)
    telemetry.shutdown()
    assert tracer.started == 0
    assert exporter.get_finished_spans() == ()
    assert len(sink.delivered) == 200


async def test_one_draw_per_event_decides_its_span() -> None:
    clock = FakeClock()
    telemetry, exporter = traced(0.25)
    draws = itertools.cycle([0.1, 0.5, 0.9, 0.24])  # events 0, 3, 4, 7, … are drawn
    m = metered(telemetry, AckingSink(clock), clock, draw=lambda: next(draws))
    await deliver_spaced(m, clock, 8, 0.0)
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    assert [s.attributes["keb.subject"] for s in spans if s.attributes] == \
        ["default/p0", "default/p3", "default/p4", "default/p7"]


def test_sample_ratio_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        Telemetry(trace_sample_ratio=1.5)


# --- the service ------------------------------------------------------------------------------------


async def test_service_exports_exact_counts_after_a_burst(tmp_path: Path) -> None:
    count = 300
    async with Simulator() as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        config = BridgeConfig.model_validate({
            "cluster": "test",
            "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
            "resources": [{"resource": "pods"}],
            "sinks": [{"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")}],
            "checkpoint": {"store": "none"},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "shutdown_deadline": 10,
        })
        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="service-under-test")

        def delivered() -> float:
            text = service.telemetry.render_prometheus().decode()
            try:
                return metric(text, "keb_sink_events_total", sink="file", outcome="delivered")
            except AssertionError:
                return 0.0

        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            for i in range(count):
                sim.store.create("pods", make_pod(f"p{i}", "default"))
            await eventually(lambda: delivered() == count, what=f"{count} deliveries")
            # The service counts through the tracker and the listeners' acks, not a per-event callback.
            pipeline = service._state.pipeline
            assert pipeline is not None
            assert pipeline._on_event is None
            text = service.telemetry.render_prometheus().decode()
            assert metric(text, "keb_events_received_total", resource="pods", type="added") == count
            assert metric(text, "keb_sink_events_total", sink="file", outcome="dead_lettered") == 0
            samples = metric(text, "keb_sink_delivery_duration_seconds_count", sink="file")
            assert 0 < samples <= count
        finally:
            service.stop_event.set()
            code = await task
        assert code == 0
        # The ended pipeline's counts are carried, so the counters would not go down if it started again.
        assert service._telemetry_snapshot() == TelemetrySnapshot()
        assert service.telemetry.sink_events.totals()[("file", "delivered")] == count
        assert sum(n for (resource, _informer, type_), n in service.telemetry.events_received.totals().items()
                   if (resource, type_) == ("pods", "added")) == count
