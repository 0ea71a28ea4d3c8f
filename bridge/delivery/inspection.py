"""The read-only views of a running pipeline: what it received, what waits for each sink, the
gauges the telemetry reads at each scrape.

:class:`PipelineInspection` is the part of :class:`~bridge.delivery.pipeline.BridgePipeline` that
only reads: its informers' runs, its sinks and its clock. The gauges are plain frozen snapshots: the
service's telemetry reads them, and the delivery layer never imports the telemetry SDK.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bridge.clock import Clock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.informer_run import InformerRun
from bridge.delivery.progress import AckTracker
from bridge.delivery.sink_listener import SinkListener
from bridge.delivery.stall import StallDetector
from bridge.informer.namespaces import NamespaceFilteredListerWatcher
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.kube.listwatch import HttpListerWatcher
from sinks.contract import DeliveryOutcome

__all__ = ["InformerGauges", "PipelineInspection", "PipelineStats", "SinkBacklog", "SinkGauges",
           "TelemetrySnapshot"]

_EVENT_TYPE = {"add": "added", "update": "updated", "delete": "deleted"}
"""Notification kind → the CloudEvents type of its events (a snapshot's objects are counted apart)."""


@dataclass(frozen=True, slots=True)
class SinkBacklog:
    """What waits for one sink, summed over its informers."""

    depth: int
    """Notifications waiting: in memory, in the spill and as degraded latest states."""
    spill_bytes: int
    """Bytes its spills occupy on disk now."""
    spilled: int
    """Notifications ever written to its spills."""
    degraded: int
    """Notifications kept only as the latest state of their object (spill full or absent)."""
    gaps: int
    """Gap windows it opened because it degraded."""


@dataclass(frozen=True, slots=True)
class SinkGauges:
    queue_depth: int = 0
    """Changes waiting for the sink: in memory, in its spill and as degraded latest states."""
    spill_bytes: int = 0
    lag_seconds: float = 0.0
    """Age of the oldest change the sink has not acknowledged."""
    in_flight: int = 0
    up: bool = True
    outcomes: Mapping[str, int] = field(default_factory=dict)
    """Outcome (``delivered``, ``filtered``, ``dead_lettered``, ``dropped``) → events finished so
    far; monotonic for as long as the sink lives."""


@dataclass(frozen=True, slots=True)
class InformerGauges:
    resource: str = ""
    """The watched resource as kubectl spells it, plural and group (``pods``, ``deployments.apps``),
    whatever name the configuration used: the ``resource`` label of every metric."""
    informer: str = ""
    """The informer's id (resource, namespace and a hash of the selectors: ``pods.web.3f2a9c1d7e0b``,
    the checkpoint's name): the ``informer`` label, distinct for two scopes of one resource."""
    received: Mapping[str, int] = field(default_factory=dict)
    """CloudEvents type (``added``, ``updated``, ``deleted``, ``sync``) → changes processed so far
    (``sync``: objects of the snapshots taken)."""
    relists: int = 0
    watch_restarts: int = 0
    expired: int = 0
    cached_objects: int = 0
    checkpoint_age: float | None = None
    checkpoint_lag: int = 0
    stalled: bool = False
    """Its watch delivers nothing while the server's resourceVersion moved (:mod:`bridge.delivery.stall`)."""
    malformed: Mapping[str, int] = field(default_factory=dict)
    """Reason (``depth``, ``size``) → objects its lister-watcher quarantined (bridge/kube/bounded.py)."""


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """What the observable instruments read at each scrape."""

    sinks: Mapping[str, SinkGauges] = field(default_factory=dict)
    informers: Mapping[str, InformerGauges] = field(default_factory=dict)
    events_received: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Resource (``pods``, ``deployments.apps``) → notification kind (``add``, ``update``,
    ``delete``, ``snapshot``) → changes processed so far by the live pipeline. For callers of
    :meth:`~bridge.delivery.pipeline.BridgePipeline.telemetry_snapshot`; the exported metrics read
    :attr:`InformerGauges.received` (by informer, in CloudEvents types)."""


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """A point-in-time view for metrics and tests."""

    received: Mapping[str, Mapping[str, int]]
    """informer id → notification kind → count."""
    sinks: Mapping[str, Mapping[str, int]]
    """sink name → outcome (delivered, filtered, dead_lettered, dropped; each one, zero too) → count."""
    queue_depth: Mapping[str, int]
    """sink name → notifications waiting in its listeners' buffers."""
    checkpoint_rv: Mapping[str, str]
    checkpoint_age: Mapping[str, float | None]
    checkpoint_lag: Mapping[str, int]
    relists: Mapping[str, int]


class PipelineInspection:
    """Read-only views of a pipeline (module docs)."""

    _informers: dict[str, InformerRun]
    _sinks: Sequence[DeliveryChain]
    _clock: Clock
    _stalls: StallDetector | None

    @property
    def informers(self) -> dict[str, SharedIndexInformer]:
        return {i: inf.informer for i, inf in self._informers.items()}

    def tracker(self, ident: str) -> AckTracker:
        return self._informers[ident].tracker

    def listener(self, ident: str, sink_name: str) -> SinkListener:
        return self._informers[ident].listeners[sink_name]

    def resumed(self, ident: str) -> bool:
        return self._informers[ident].plan.resumed

    def stats(self) -> PipelineStats:
        now = self._clock.now()
        sink_outcomes: dict[str, collections.Counter[str]] = {  # every outcome, zero too (increase())
            s.name: collections.Counter({o.value: 0 for o in DeliveryOutcome}) for s in self._sinks}
        depth: dict[str, int] = {s.name: 0 for s in self._sinks}
        for inf in self._informers.values():
            for name, listener in inf.listeners.items():
                sink_outcomes[name].update(listener.stats.outcomes)
                depth[name] += inf.registrations[name].listener.depth
        return PipelineStats(
            received={i: dict(inf.counts.received) for i, inf in self._informers.items()},
            sinks={n: dict(c) for n, c in sink_outcomes.items()},
            queue_depth=depth,
            checkpoint_rv={i: inf.saved_rv for i, inf in self._informers.items()},
            checkpoint_age={i: (None if inf.last_saved is None else now - inf.last_saved)
                            for i, inf in self._informers.items()},
            checkpoint_lag={i: inf.tracker.lag for i, inf in self._informers.items()},
            relists={i: (inf.informer.reflector.list_count if inf.informer.reflector else 0)
                     for i, inf in self._informers.items()},
        )

    def events_received(self) -> dict[str, dict[str, int]]:
        """Resource (``pods``, ``deployments.apps``) → change kind → changes processed so far, summed
        over the informers that watch that resource (several scopes may)."""
        totals: dict[str, collections.Counter[str]] = {}
        for inf in self._informers.values():
            totals.setdefault(inf.counts.resource, collections.Counter()).update(inf.counts.received)
        return {resource: dict(c) for resource, c in totals.items()}

    def sink_backlog(self, name: str) -> SinkBacklog:
        """What waits for one sink, summed over its informers: in memory, on disk, degraded."""
        stats = [inf.registrations[name].listener.stats() for inf in self._informers.values()
                 if name in inf.registrations]
        return SinkBacklog(depth=sum(s.depth for s in stats), spill_bytes=sum(s.spill_bytes for s in stats),
                           spilled=sum(s.spilled for s in stats), degraded=sum(s.degraded for s in stats),
                           gaps=sum(s.gaps for s in stats))

    def sink_lag(self, name: str) -> float:
        """Seconds since the oldest change this sink has not acknowledged was dispatched (0 if none)."""
        oldest = [t for inf in self._informers.values() if name in inf.registrations
                  if (t := inf.tracker.oldest_unacked(name)) is not None]
        return max(0.0, self._clock.now() - min(oldest)) if oldest else 0.0

    def delivered(self, name: str) -> int:
        """Events ``name`` acknowledged as delivered so far."""
        return sum(inf.listeners[name].stats.outcomes.get("delivered", 0)
                   for inf in self._informers.values() if name in inf.listeners)

    def queue_depths(self) -> dict[str, int]:
        """Sink name → notifications waiting in its listeners' buffers."""
        return dict(self.stats().queue_depth)

    def informer_gauges(self) -> dict[str, InformerGauges]:
        """Informer (its key, as text) → the gauges the telemetry reads."""
        st = self.stats()
        gauges: dict[str, InformerGauges] = {}
        for i, inf in self._informers.items():
            reflector = inf.informer.reflector
            counts = inf.counts
            received = {_EVENT_TYPE[k]: n for k, n in counts.received.items() if k in _EVENT_TYPE}
            if counts.synced:
                received["sync"] = counts.synced
            gauges[str(inf.watched.key)] = InformerGauges(
                resource=inf.watched.ref.qualified,
                informer=i,
                received=received,
                relists=st.relists[i],
                watch_restarts=max(0, reflector.watch_count - 1) if reflector else 0,
                expired=reflector.expired_count if reflector else 0,
                cached_objects=len(inf.informer.get_indexer()),
                checkpoint_age=st.checkpoint_age[i],
                checkpoint_lag=st.checkpoint_lag[i],
                stalled=self._stalls is not None and bool(self._stalls.stalled(i)),
                malformed=_malformed(reflector.lister_watcher) if reflector else {},
            )
        return gauges

    def telemetry_snapshot(self) -> TelemetrySnapshot:
        """The gauges :class:`bridge.telemetry.Telemetry` reads at each scrape."""
        st = self.stats()
        sinks = {
            s.name: SinkGauges(queue_depth=st.queue_depth[s.name],
                               spill_bytes=self.sink_backlog(s.name).spill_bytes,
                               lag_seconds=self.sink_lag(s.name),
                               in_flight=s.in_flight,
                               up=s.healthy(), outcomes=st.sinks[s.name])
            for s in self._sinks
        }
        return TelemetrySnapshot(sinks=sinks, informers=self.informer_gauges(),
                                 events_received=self.events_received())


def _malformed(lister_watcher: object) -> dict[str, int]:
    """What an HTTP lister-watcher quarantined, by reason, looking through the wrapper a
    ``namespace_selector`` puts around it (other lister-watchers count none)."""
    while isinstance(lister_watcher, NamespaceFilteredListerWatcher):
        lister_watcher = lister_watcher.inner
    return dict(lister_watcher.malformed) if isinstance(lister_watcher, HttpListerWatcher) else {}
