"""OpenTelemetry metrics and traces for the bridge, exposed to Prometheus.

One :class:`Telemetry` per service owns a private Prometheus registry (so tests and several bridges
in one process never collide), a ``MeterProvider`` with the Prometheus reader, and a
``TracerProvider`` with, when configured, an OTLP exporter.

Instruments and their Prometheus names (OpenTelemetry adds unit suffixes), with one label vocabulary:
``resource`` is the resource as kubectl spells it (``pods``, ``deployments.apps``) whatever name the
configuration used, ``informer`` the informer's id (``pods.web.3f2a9c1d7e0b``: resource, namespace,
hash of the selectors; the checkpoint's name), ``type`` a CloudEvents type (``added``, ``updated``,
``deleted``, ``sync``), ``sink`` the sink's name, ``outcome`` a delivery outcome:

=====================================  =====================================================
``keb_events_received_total``          changes an informer processed, by resource, informer
                                       and type (``sync``: objects of snapshots)
``keb_sink_events_total``              events a sink finished, by sink and outcome
                                       (delivered, filtered, dead_lettered, dropped)
``keb_kubernetes_events_total``        Kubernetes Events seen by the events profile, by
                                       reason, type, namespace and involved kind (bounded:
                                       docs/events.md)
``keb_sink_delivery_duration_seconds`` time from hand-over to the sink until its ack, sampled
                                       in time (see below)
``keb_sink_filter_errors_total``       events a sink's CEL ``filter`` failed on (then kept or
                                       dropped as its ``filter_errors`` says), by sink
``keb_sink_queue_depth``               changes waiting for a sink (memory, spill, degraded)
``keb_sink_spill_bytes``               bytes of a sink's spill on disk
``keb_sink_lag_seconds``               age of the oldest change a sink has not acknowledged
``keb_sink_in_flight``                 events handed to a sink and not yet acked
``keb_sink_up``                        1 while the sink's destination is reachable
``keb_informer_relists_total``         full relists, by resource and informer
``keb_informer_watch_restarts_total``  watches re-opened
``keb_malformed_objects_total``        objects quarantined by the decoders' bounds (nested too
                                       deep, too large), by resource, informer and reason
                                       (``depth``, ``size``)
``keb_informer_expired_total``         410 Gone / Expired answers
``keb_informer_cached_objects``        objects in the informer's cache
``keb_informer_stalled``               1 while the informer's watch delivers nothing though the
                                       server's resourceVersion moved (``kubernetes.stall_after``)
``keb_checkpoint_age_seconds``         time since the last checkpoint write
``keb_checkpoint_lag``                 notifications not yet acknowledged by every sink
``keb_leader``                         1 while this replica runs the pipeline (the leader, or
                                       the only replica without leader election), else 0
``keb_shard_ordinal``                  this replica's shard (0 to total - 1), once sharded
``keb_total_shards``                   the number of shards this replica was started with
``keb_api_client_throttled_seconds``   seconds requests waited for the API client's client-side
``_total``                             rate limit (``kubernetes.qps``/``burst``)
``keb_api_client_throttled_requests``  requests that waited for it
``_total``
``keb_api_client_waiting_requests``    requests waiting for it now
``process_*``, ``python_*``            CPU seconds, resident memory, open file descriptors,
                                       start time; garbage collections; interpreter version
=====================================  =====================================================

Sharding. Once the service knows this replica's shard (:meth:`Telemetry.set_shard`, called after
``sharding`` is resolved), every sample the endpoint exposes carries the labels ``shard`` and
``total_shards``, as kube-state-metrics' shards do, and the two shard gauges appear: a dashboard can
sum across shards or split by shard, and an alert can compare the totals the shards were started
with (a replica that has not restarted since the StatefulSet was scaled still has the old total).
The labels are added to the exposition at scrape time, so nothing on the per-event path knows them.

Cost per event. The OpenTelemetry Python SDK spends 7-10 µs on every synchronous ``Counter.add``,
``Histogram.record`` or ``Tracer.start_span`` (even for a span its sampler then drops), which was
about a third of the bridge's whole per-event cost. So nothing on the per-event path calls the SDK
unless it has to:

* **Counts** (``keb_events_received_total``, ``keb_sink_events_total``) are plain Python integers
  kept where the event passes (the pipeline's ack tracker counts received changes, its sink
  listeners count outcomes as the acks arrive). They are exported by *observable* counters whose
  callbacks read them from the pipeline's :class:`TelemetrySnapshot` at scrape time; totals from a
  pipeline that has ended are carried in :attr:`Telemetry.events_received` and
  :attr:`Telemetry.sink_events` (:class:`ScrapedCounter`), so the exported counts never go down.
* **Latency** (``keb_sink_delivery_duration_seconds``) is a *time-sampled* distribution: a sink
  records a delivery's latency only when at least :data:`LATENCY_SAMPLE_INTERVAL` (5 ms) has passed
  since its previously recorded one. At low rates every delivery is recorded; at high rates at most
  about 200 per second per sink are, spread over time (above that rate the distribution weighs
  time, not events). The histogram's ``_count`` is therefore the number of *samples*, not of deliveries:
  counts of deliveries come from ``keb_sink_events_total{outcome="delivered"}``.
* **Spans** are sampled by the caller with one random draw per event at
  :attr:`Telemetry.trace_sample_ratio` before any span object exists; the ``TracerProvider``
  records every span it is asked to start (``ALWAYS_ON``), so the decision is not taken twice.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bridge.delivery.inspection import InformerGauges, SinkGauges, TelemetrySnapshot
from bridge.kube.ratelimit import TokenBucket
from bridge.version import __version__

__all__ = [
    "LATENCY_SAMPLE_INTERVAL",
    "InformerGauges",
    "ScrapedCounter",
    "SinkGauges",
    "Telemetry",
    "TelemetrySnapshot",
]

log = logging.getLogger(__name__)

LATENCY_SAMPLE_INTERVAL = 0.005
"""Seconds that must pass after a sink's last recorded delivery latency before it records another:
bounds ``keb_sink_delivery_duration_seconds`` to about 200 records per second per sink."""


class ScrapedCounter:
    """A monotonic count by label values, kept in plain Python and exported at scrape time.

    ``add`` costs a dict update, not an SDK call; the observable counter of the same metric adds these
    totals to what the :class:`TelemetrySnapshot` reports. The service uses it to carry the counts of
    a pipeline that has ended; anything off the per-event path may use it directly.
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = tuple(labels)
        self._totals: collections.Counter[tuple[str, ...]] = collections.Counter()
        self._lock = threading.Lock()
        """``totals`` is read by the scrape's rendering thread while the loop adds."""

    def add(self, amount: int, attributes: Mapping[str, str]) -> None:
        """Adds ``amount`` (>= 0) for the label values in ``attributes`` (every label is required)."""
        if amount < 0:
            raise ValueError(f"a counter only goes up, got {amount}")
        key = tuple(attributes[label] for label in self.labels)
        with self._lock:
            self._totals[key] += amount

    def totals(self) -> dict[tuple[str, ...], int]:
        """Label values (in :attr:`labels` order) → total added."""
        with self._lock:
            return dict(self._totals)


class _LabelledCollector(Collector):
    """Every family of ``registry``, with ``labels`` added to each of its samples."""

    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self._registry = registry
        self._labels = dict(labels)

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration: the names are the wrapped registry's

    def collect(self) -> Iterable[Metric]:
        # A copy of each family: a collector may keep its families between scrapes (prometheus_client's
        # platform collector does, and it is shared by every Telemetry of the process).
        for family in self._registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**s.labels, **self._labels}) for s in family.samples]
            yield labelled


class Telemetry:
    def __init__(
        self,
        *,
        service_name: str = "kube-event-bridge",
        otlp_endpoint: str | None = None,
        trace_sample_ratio: float = 0.01,
        snapshot: Callable[[], TelemetrySnapshot] | None = None,
        leader: Callable[[], bool] | None = None,
    ) -> None:
        """``trace_sample_ratio`` (0 to 1) is the share of deliveries that get a span; callers draw
        against it (see the module docs). ``snapshot`` is read at each scrape, and so is ``leader``
        (whether this replica runs the pipeline; None = always, a single replica)."""
        if not 0.0 <= trace_sample_ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio must be between 0 and 1, got {trace_sample_ratio}")
        self.trace_sample_ratio = trace_sample_ratio
        self.registry = CollectorRegistry()
        # The process's own figures, from prometheus_client's collectors (they read /proc at scrape).
        for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
            self.registry.register(collector)
        self._leader = leader or (lambda: True)
        self._snapshot = snapshot or TelemetrySnapshot
        self._scrape: TelemetrySnapshot | None = None
        self._render_lock = threading.Lock()
        self._shard: tuple[int, int] | None = None
        self._limiter: TokenBucket | None = None
        self._exposed = self.registry
        """What :meth:`render_prometheus` exposes: the registry, or it with the shard labels."""
        self.events_received = ScrapedCounter(("resource", "informer", "type"))
        """Changes received beyond the live snapshot's (a finished pipeline's), by resource, informer
        and CloudEvents type."""
        self.sink_events = ScrapedCounter(("sink", "outcome"))
        """Sink outcomes beyond the live snapshot's (finished sinks'), by sink and outcome."""
        self.filter_errors = ScrapedCounter(("sink",))
        """Filter evaluation errors beyond the live sinks' (finished sinks'), by sink."""
        self._filter_errors_source: Callable[[], Mapping[str, int]] = dict

        self.kube_events = ScrapedCounter(("reason", "type", "namespace", "involved_kind"))
        """Kubernetes Events seen by the events profile (:mod:`bridge.service.events.metrics`), by
        reason, type, namespace and involved kind, label values already bounded by the caller."""
        resource = Resource.create({"service.name": service_name, "service.version": __version__})
        self._reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self.meter_provider = MeterProvider(metric_readers=[self._reader], resource=resource)
        meter = self.meter_provider.get_meter("kube_event_bridge", __version__)

        self._count_events(meter)
        self.delivery_duration = self._delivery_histogram(meter)
        self._observe_sinks(meter)
        self._observe_informers(meter)
        self._observe_api_client(meter)

        # Sampling is decided by the caller before a span exists (one random draw per event is far
        # cheaper than the SDK sampler, which runs and builds a NonRecordingSpan on every call), so a
        # span that is started is always recorded.
        self.tracer_provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        if otlp_endpoint:
            self._add_otlp(otlp_endpoint)
        self.tracer: Tracer = self.tracer_provider.get_tracer("kube_event_bridge", __version__)

    def _count_events(self, meter: Meter) -> None:
        """The counters of changes received, sink outcomes and Kubernetes Events."""
        meter.create_observable_counter("keb.events.received", [self._received], unit="{event}",
                                        description="Changes processed by an informer, by resource and type")
        meter.create_observable_counter("keb.sink.events", [self._sink_events], unit="{event}",
                                        description="Events a sink finished, by sink and outcome")
        meter.create_observable_counter("keb.kubernetes.events", [self._kube_events], unit="{event}",
                                        description="Kubernetes Events (new ones and repetitions) seen by "
                                                    "the events profile, by reason, type, namespace and "
                                                    "involved kind; rare values counted as 'other'")

    @staticmethod
    def _delivery_histogram(meter: Meter) -> Histogram:
        return meter.create_histogram(
            "keb.sink.delivery.duration", unit="s",
            description="Time from handing an event to a sink until the sink acknowledged it, "
                        "sampled at most every 5 ms per sink",
            explicit_bucket_boundaries_advisory=[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
        )

    def _observe_sinks(self, meter: Meter) -> None:
        """Each sink's filter errors, queue, spill, lag, in-flight events and reachability."""
        meter.create_observable_counter("keb.sink.filter_errors", [self._sink_filter_errors], unit="{event}",
                                        description="Events a sink's CEL filter failed on, by sink")
        meter.create_observable_gauge("keb.sink.queue.depth", [self._sink_queue], unit="{notification}",
                                      description="Changes waiting for a sink: in memory, in its "
                                                  "spill and as degraded latest states")
        meter.create_observable_gauge("keb.sink.spill", [self._sink_spill], unit="By",
                                      description="Bytes of a sink's spill on disk")
        meter.create_observable_gauge("keb.sink.lag", [self._sink_lag], unit="s",
                                      description="Age of the oldest change a sink has not acknowledged")
        meter.create_observable_gauge("keb.sink.in_flight", [self._sink_in_flight], unit="{event}",
                                      description="Events handed to a sink and not yet acknowledged")
        meter.create_observable_gauge("keb.sink.up", [self._sink_up],
                                      description="1 while the sink's destination is reachable")

    def _observe_informers(self, meter: Meter) -> None:
        """Each informer's relists, watches and cache; the checkpoint; leadership and the shard."""
        meter.create_observable_counter("keb.informer.relists", [self._relists], unit="{relist}",
                                        description="Full relists, by resource")
        meter.create_observable_counter(
            "keb.malformed.objects", [self._malformed], unit="{object}",
            description="Objects quarantined by the decoders' bounds, by resource and reason")
        meter.create_observable_counter("keb.informer.watch_restarts", [self._watch_restarts],
                                        unit="{watch}", description="Watches re-opened, by resource")
        meter.create_observable_counter("keb.informer.expired", [self._expired], unit="{response}",
                                        description="410 Gone / Expired answers, by resource")
        meter.create_observable_gauge("keb.informer.cached_objects", [self._cached], unit="{object}",
                                      description="Objects in the informer's cache")
        meter.create_observable_gauge("keb.informer.stalled", [self._stalled],
                                      description="1 while the informer's watch delivers nothing though "
                                                  "the server's resourceVersion moved")
        meter.create_observable_gauge("keb.checkpoint.age", [self._checkpoint_age], unit="s",
                                      description="Seconds since the last checkpoint was written")
        meter.create_observable_gauge("keb.checkpoint.lag", [self._checkpoint_lag], unit="{event}",
                                      description="Notifications not yet acknowledged by every sink")
        meter.create_observable_gauge("keb.leader", [self._leader_gauge],
                                      description="1 while this replica runs the pipeline (the leader, "
                                                  "or the only replica without leader election)")
        meter.create_observable_gauge("keb.shard.ordinal", [self._shard_ordinal],
                                      description="This replica's shard, 0 to keb_total_shards - 1")
        meter.create_observable_gauge("keb.total_shards", [self._total_shards],
                                      description="The number of shards this replica was started with")

    def _observe_api_client(self, meter: Meter) -> None:
        """The API client's client-side rate limit."""
        meter.create_observable_counter(
            "keb.api_client.throttled", [self._throttled_seconds], unit="s",
            description="Seconds requests waited for the API client's client-side rate limit")
        meter.create_observable_counter(
            "keb.api_client.throttled_requests", [self._throttled_requests], unit="{request}",
            description="Requests that waited for the API client's client-side rate limit")
        meter.create_observable_gauge(
            "keb.api_client.waiting_requests", [self._waiting_requests], unit="{request}",
            description="Requests waiting for the API client's client-side rate limit now")

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

    def set_filter_errors_source(self, source: Callable[[], Mapping[str, int]]) -> None:
        """``source`` gives, at each scrape, the live sinks' filter evaluation errors by sink name."""
        self._filter_errors_source = source

    def set_shard(self, ordinal: int, total: int) -> None:
        """Labels everything exposed from now on with ``shard="<ordinal>"`` and
        ``total_shards="<total>"`` and exposes ``keb_shard_ordinal`` and ``keb_total_shards``.
        Called when the service has resolved its shard; calling it again with the same shard (a
        pipeline started again) changes nothing, with another one is refused: a replica changes shard
        by restarting, so its series never switch labels mid-process."""
        if total < 1 or not 0 <= ordinal < total:
            raise ValueError(f"shard {ordinal} of {total}: need 0 <= ordinal < total")
        if self._shard == (ordinal, total):
            return
        if self._shard is not None:
            raise RuntimeError(f"the shard is already set ({self._shard[0]} of {self._shard[1]}), "
                               f"not {ordinal} of {total}")
        exposed = CollectorRegistry(auto_describe=False)
        exposed.register(_LabelledCollector(self.registry, {"shard": str(ordinal),
                                                            "total_shards": str(total)}))
        # Under the render lock: a scrape renders in another thread, and one between the two
        # assignments would expose the shard gauges on the unlabelled registry.
        with self._render_lock:
            self._shard = (ordinal, total)
            self._exposed = exposed

    def set_rate_limiter(self, limiter: TokenBucket) -> None:
        """The API client's rate limiter, whose waits the ``keb_api_client_*`` series report."""
        self._limiter = limiter

    @property
    def shard(self) -> tuple[int, int] | None:
        """``(ordinal, total)`` once :meth:`set_shard` was called, else None."""
        return self._shard

    def render_prometheus(self) -> bytes:
        """The Prometheus text exposition of every instrument (the snapshot is taken once)."""
        return self.prepare_render()()

    def prepare_render(self) -> Callable[[], bytes]:
        """Takes the pipeline's snapshot now (on the event loop, where its counters live) and
        returns what renders the exposition from it: a function that may run in another thread
        (the collection and the text, the costly part, then leave the loop free). Renders are
        serialised (one scrape's snapshot at a time)."""
        snapshot = self._take_snapshot()

        def render() -> bytes:
            with self._render_lock:
                self._scrape = snapshot
                try:
                    return generate_latest(self._exposed)
                finally:
                    self._scrape = None

        return render

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()

    # --- observable callbacks -------------------------------------------------------------------

    def _take_snapshot(self) -> TelemetrySnapshot:
        try:
            return self._snapshot()
        except Exception:  # a scrape must never take the service down
            log.exception("telemetry snapshot failed")
            return TelemetrySnapshot()

    def _current(self) -> TelemetrySnapshot:
        return self._scrape if self._scrape is not None else self._take_snapshot()

    def _sinks(self) -> Iterable[tuple[str, SinkGauges]]:
        return list(self._current().sinks.items())

    def _informers(self) -> Iterable[tuple[str, InformerGauges]]:
        return list(self._current().informers.items())

    def _informer_labels(self) -> list[tuple[dict[str, str], InformerGauges]]:
        out = []
        for key, g in self._informers():
            out.append(({"resource": g.resource or key, "informer": g.informer or key}, g))
        return out

    def _received(self, _: CallbackOptions) -> Iterable[Observation]:
        totals = collections.Counter(self.events_received.totals())
        for labels, g in self._informer_labels():
            for type_, count in g.received.items():
                totals[labels["resource"], labels["informer"], type_] += count
        return [Observation(n, {"resource": r, "informer": i, "type": t}) for (r, i, t), n in totals.items()]

    def _sink_events(self, _: CallbackOptions) -> Iterable[Observation]:
        totals = collections.Counter(self.sink_events.totals())
        for sink, gauges in self._current().sinks.items():
            for outcome, count in gauges.outcomes.items():
                totals[sink, outcome] += count
        return [Observation(n, {"sink": s, "outcome": o}) for (s, o), n in totals.items()]

    def _sink_filter_errors(self, _: CallbackOptions) -> Iterable[Observation]:
        totals = collections.Counter({sink: n for (sink,), n in self.filter_errors.totals().items()})
        try:
            totals.update(self._filter_errors_source())
        except Exception:  # a scrape must never take the service down
            log.exception("reading the sinks' filter errors failed")
        return [Observation(n, {"sink": s}) for s, n in totals.items()]

    def _kube_events(self, _: CallbackOptions) -> Iterable[Observation]:
        labels = self.kube_events.labels
        return [Observation(n, dict(zip(labels, values, strict=True)))
                for values, n in self.kube_events.totals().items()]

    def _sink_queue(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.queue_depth, {"sink": n}) for n, g in self._sinks()]

    def _sink_spill(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.spill_bytes, {"sink": n}) for n, g in self._sinks()]

    def _sink_lag(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.lag_seconds, {"sink": n}) for n, g in self._sinks()]

    def _sink_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.in_flight, {"sink": n}) for n, g in self._sinks()]

    def _sink_up(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if g.up else 0, {"sink": n}) for n, g in self._sinks()]

    def _malformed(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {**labels, "reason": reason})
                for labels, g in self._informer_labels() for reason, n in sorted(g.malformed.items())]

    def _relists(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.relists, labels) for labels, g in self._informer_labels()]

    def _watch_restarts(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.watch_restarts, labels) for labels, g in self._informer_labels()]

    def _expired(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.expired, labels) for labels, g in self._informer_labels()]

    def _cached(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.cached_objects, labels) for labels, g in self._informer_labels()]

    def _checkpoint_age(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.checkpoint_age, labels) for labels, g in self._informer_labels()
                if g.checkpoint_age is not None]

    def _stalled(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(g.stalled), labels) for labels, g in self._informer_labels()]

    def _checkpoint_lag(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g.checkpoint_lag, labels) for labels, g in self._informer_labels()]

    def _shard_ordinal(self, _: CallbackOptions) -> Iterable[Observation]:
        return [] if self._shard is None else [Observation(self._shard[0])]

    def _total_shards(self, _: CallbackOptions) -> Iterable[Observation]:
        return [] if self._shard is None else [Observation(self._shard[1])]

    def _throttled_seconds(self, _: CallbackOptions) -> Iterable[Observation]:
        return [] if self._limiter is None else [Observation(self._limiter.throttled_seconds)]

    def _throttled_requests(self, _: CallbackOptions) -> Iterable[Observation]:
        return [] if self._limiter is None else [Observation(self._limiter.throttled_requests)]

    def _waiting_requests(self, _: CallbackOptions) -> Iterable[Observation]:
        return [] if self._limiter is None else [Observation(self._limiter.waiting)]

    def _leader_gauge(self, _: CallbackOptions) -> Iterable[Observation]:
        try:
            leading = self._leader()
        except Exception:  # a scrape must never take the service down
            log.exception("leader callback failed")
            return []
        return [Observation(1 if leading else 0)]
