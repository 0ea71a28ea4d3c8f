"""OpenTelemetry metrics and traces for the bridge, exposed to Prometheus.

One :class:`Telemetry` per service owns a private Prometheus registry (so tests and several bridges
in one process never collide), a ``MeterProvider`` with the Prometheus reader, and a
``TracerProvider`` with a ratio sampler and, when configured, an OTLP exporter.

Instruments and their Prometheus names (OpenTelemetry adds unit suffixes):

=====================================  =====================================================
``keb_events_received_total``          changes an informer processed, by resource and type
``keb_sink_events_total``              events a sink finished, by sink and outcome
                                       (delivered, filtered, dead_lettered, dropped)
``keb_sink_delivery_duration_seconds`` time from hand-over to the sink until its ack
``keb_sink_queue_depth``               notifications waiting in a sink's listener buffer
``keb_sink_in_flight``                 events handed to a sink and not yet acked
``keb_sink_up``                        1 while the sink's destination is reachable
``keb_informer_relists_total``         full relists, by resource
``keb_informer_watch_restarts_total``  watches re-opened, by resource
``keb_informer_expired_total``         410 Gone / Expired answers, by resource
``keb_informer_cached_objects``        objects in the informer's cache
``keb_checkpoint_age_seconds``         time since the last checkpoint write, by resource
``keb_checkpoint_lag``                 notifications not yet acked by every sink
=====================================  =====================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry, generate_latest

from bridge import __version__

__all__ = ["InformerGauges", "SinkGauges", "Telemetry", "TelemetrySnapshot"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SinkGauges:
    queue_depth: int = 0
    in_flight: int = 0
    up: bool = True


@dataclass(frozen=True, slots=True)
class InformerGauges:
    relists: int = 0
    watch_restarts: int = 0
    expired: int = 0
    cached_objects: int = 0
    checkpoint_age: float | None = None
    checkpoint_lag: int = 0


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """What the observable instruments read at each scrape."""

    sinks: Mapping[str, SinkGauges] = field(default_factory=dict)
    informers: Mapping[str, InformerGauges] = field(default_factory=dict)


class Telemetry:
    def __init__(
        self,
        *,
        service_name: str = "kube-event-bridge",
        otlp_endpoint: str | None = None,
        trace_sample_ratio: float = 0.01,
        snapshot: Callable[[], TelemetrySnapshot] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._snapshot = snapshot or TelemetrySnapshot
        resource = Resource.create({"service.name": service_name, "service.version": __version__})
        self._reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self.meter_provider = MeterProvider(metric_readers=[self._reader], resource=resource)
        meter = self.meter_provider.get_meter("kube_event_bridge", __version__)

        self.events_received = meter.create_counter(
            "keb.events.received", unit="{event}",
            description="Changes processed by an informer, by resource and type")
        self.sink_events = meter.create_counter(
            "keb.sink.events", unit="{event}",
            description="Events a sink finished, by sink and outcome")
        self.delivery_duration = meter.create_histogram(
            "keb.sink.delivery.duration", unit="s",
            description="Time from handing an event to a sink until the sink acknowledged it",
            explicit_bucket_boundaries_advisory=[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
        )
        meter.create_observable_gauge("keb.sink.queue.depth", [self._sink_queue], unit="{notification}",
                                      description="Notifications waiting in a sink's listener buffer")
        meter.create_observable_gauge("keb.sink.in_flight", [self._sink_in_flight], unit="{event}",
                                      description="Events handed to a sink and not yet acknowledged")
        meter.create_observable_gauge("keb.sink.up", [self._sink_up],
                                      description="1 while the sink's destination is reachable")
        meter.create_observable_counter("keb.informer.relists", [self._relists], unit="{relist}",
                                        description="Full relists, by resource")
        meter.create_observable_counter("keb.informer.watch_restarts", [self._watch_restarts],
                                        unit="{watch}", description="Watches re-opened, by resource")
        meter.create_observable_counter("keb.informer.expired", [self._expired], unit="{response}",
                                        description="410 Gone / Expired answers, by resource")
        meter.create_observable_gauge("keb.informer.cached_objects", [self._cached], unit="{object}",
                                      description="Objects in the informer's cache")
        meter.create_observable_gauge("keb.checkpoint.age", [self._checkpoint_age], unit="s",
                                      description="Seconds since the last checkpoint was written")
        meter.create_observable_gauge("keb.checkpoint.lag", [self._checkpoint_lag], unit="{event}",
                                      description="Notifications not yet acknowledged by every sink")

        sampler = ParentBased(TraceIdRatioBased(trace_sample_ratio))
        self.tracer_provider = TracerProvider(resource=resource, sampler=sampler)
        if otlp_endpoint:
            self._add_otlp(otlp_endpoint)
        self.tracer: Tracer = self.tracer_provider.get_tracer("kube_event_bridge", __version__)

    def _add_otlp(self, endpoint: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError:
            log.warning("telemetry.otlp_endpoint is set but the OTLP exporter is not installed; "
                        "install kube-event-bridge[otlp] to export traces")
            return
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))

    def set_snapshot_source(self, snapshot: Callable[[], TelemetrySnapshot]) -> None:
        self._snapshot = snapshot

    def render_prometheus(self) -> bytes:
        """The Prometheus text exposition of every instrument."""
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()

    # --- observable callbacks -------------------------------------------------------------------

    def _sinks(self) -> Iterable[tuple[str, SinkGauges]]:
        try:
            return list(self._snapshot().sinks.items())
        except Exception:  # a scrape must never take the service down
            log.exception("telemetry snapshot failed")
            return []

    def _informers(self) -> Iterable[tuple[str, InformerGauges]]:
        try:
            return list(self._snapshot().informers.items())
        except Exception:
            log.exception("telemetry snapshot failed")
            return []

    def _sink_queue(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.queue_depth, {"sink": n}) for n, g in self._sinks()]

    def _sink_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.in_flight, {"sink": n}) for n, g in self._sinks()]

    def _sink_up(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if g.up else 0, {"sink": n}) for n, g in self._sinks()]

    def _relists(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.relists, {"resource": n}) for n, g in self._informers()]

    def _watch_restarts(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.watch_restarts, {"resource": n}) for n, g in self._informers()]

    def _expired(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.expired, {"resource": n}) for n, g in self._informers()]

    def _cached(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.cached_objects, {"resource": n}) for n, g in self._informers()]

    def _checkpoint_age(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.checkpoint_age, {"resource": n}) for n, g in self._informers()
                if g.checkpoint_age is not None]

    def _checkpoint_lag(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.checkpoint_lag, {"resource": n}) for n, g in self._informers()]
