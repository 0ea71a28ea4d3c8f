"""What the delivery layer reports of itself at each metrics scrape: plain frozen snapshots of
per-sink and per-informer state. The service's telemetry reads them; the delivery layer never
imports the telemetry SDK, so it stays free of the service layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["InformerGauges", "SinkGauges", "TelemetrySnapshot"]


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
