"""Kubernetes Events as first-class citizens: the events profile, its enrichment, its counter.

See docs/events.md. :mod:`.profile` annotates and coalesces, :mod:`.enrichment` keeps the involved
objects' metadata, :mod:`.metrics` counts Events with bounded cardinality, :mod:`.config` is the
``events:`` configuration section.
"""

from __future__ import annotations

from bridge.service.events.config import EnrichmentConfig, EventMetricsConfig, EventsConfig
from bridge.service.events.enrichment import Enricher, Enrichment, EnrichmentStatus, MetadataStore
from bridge.service.events.metrics import EventCounter
from bridge.service.events.profile import EventsProfile, EventsStage, event_extensions

__all__ = [
    "Enricher",
    "Enrichment",
    "EnrichmentConfig",
    "EnrichmentStatus",
    "EventCounter",
    "EventMetricsConfig",
    "EventsConfig",
    "EventsProfile",
    "EventsStage",
    "MetadataStore",
    "event_extensions",
]
