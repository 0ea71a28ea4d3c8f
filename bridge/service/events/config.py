"""The ``events:`` section of the configuration: how the events profile treats Kubernetes Events.

It applies to the resource entries with ``profile: events`` (core ``events`` and/or
``events.events.k8s.io``). Defaults live here; docs/events.md and docs/configuration.md describe
each option.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_ENRICHMENT_KINDS", "EnrichmentConfig", "EventMetricsConfig", "EventsConfig"]

DEFAULT_ENRICHMENT_KINDS = ("pods", "replicasets.apps", "deployments.apps", "statefulsets.apps",
                            "daemonsets.apps", "jobs.batch", "cronjobs.batch", "nodes")
"""The kinds whose Events are most common, and the controllers that own their Pods."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnrichmentConfig(_Model):
    enabled: bool = True
    kinds: list[str] = Field(default_factory=lambda: list(DEFAULT_ENRICHMENT_KINDS))
    """Resources whose metadata the bridge may watch (list/watch; the chart's RBAC grants exactly
    these): the involved objects' kinds and their owners' kinds."""
    annotations: list[str] = Field(default_factory=list)
    """Annotation keys copied from the involved object (none by default: annotations can be large)."""
    max_objects: int = Field(default=200_000, ge=1)
    """Objects cached per kind; beyond it new objects are not cached (their Events: ``unknown``)."""
    max_gone: int = Field(default=10_000, ge=0)
    """Deleted objects remembered per kind, so late Events about them still get their labels."""
    wait: float = Field(default=1.0, ge=0)
    """Seconds a new Event waits for its object's cache to catch up with it."""
    sync_timeout: float = Field(default=10.0, gt=0)
    """Seconds the first Event of a kind waits for that kind's metadata cache to sync."""
    max_owner_depth: int = Field(default=4, ge=0, le=16)


class EventMetricsConfig(_Model):
    """``keb_kubernetes_events_total``: cardinality bounded, kube-state-metrics style."""

    enabled: bool = True
    reasons: list[str] = Field(default_factory=list)
    """Allow-list of reasons kept as label values (others count as ``other``); empty = any, up to
    ``max_values``."""
    namespaces: list[str] = Field(default_factory=list)
    involved_kinds: list[str] = Field(default_factory=list)
    types: list[str] = Field(default_factory=lambda: ["Normal", "Warning"])
    max_values: int = Field(default=100, ge=1)
    """Distinct values kept per label when it has no allow-list; later ones count as ``other``."""
    max_series: int = Field(default=2000, ge=1)
    """Distinct label combinations kept; later ones count under ``other`` in every label."""


class EventsConfig(_Model):
    coalesce_window: float = Field(default=0.0, ge=0)
    """Seconds over which repetitions of one Event (count / series bumps) are merged into their last
    state, per sink; 0 = off (every repetition delivered)."""
    coalesce_max_pending: int = Field(default=100_000, ge=1)
    """Events held in a sink's window at most; beyond it the oldest held one is sent at once."""
    enrichment: EnrichmentConfig = EnrichmentConfig()
    metrics: EventMetricsConfig = EventMetricsConfig()
