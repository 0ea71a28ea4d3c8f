"""The Events counter: ``keb_kubernetes_events_total{reason, type, namespace, involved_kind}``.

Reasons and namespaces are open-ended, and a counter labelled by them can grow without bound (one
series per distinct value, for ever). So, as kube-state-metrics does with its allow-lists, each
label keeps either the values of its allow-list or the first ``max_values`` distinct values seen,
and anything else is counted as ``other``; and at most ``max_series`` label combinations exist, later
ones counted under ``other`` in every label. The bounds are per process and the mapping of a value
never changes once decided, so a series never switches between a value and ``other``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.service.events.config import EventMetricsConfig
from sinks.eventfacts import EventFacts

if TYPE_CHECKING:  # the OpenTelemetry SDK behind it is not needed to validate a configuration
    from bridge.service.telemetry import ScrapedCounter

__all__ = ["OTHER", "EventCounter"]

OTHER = "other"


class _Label:
    __slots__ = ("allowed", "max_values", "seen")

    def __init__(self, allowed: Sequence[str], max_values: int) -> None:
        self.allowed = frozenset(allowed)
        self.max_values = max_values
        self.seen: set[str] = set()

    def value(self, v: str) -> str:
        if self.allowed:
            return v if v in self.allowed else OTHER
        if v in self.seen:
            return v
        if len(self.seen) < self.max_values:
            self.seen.add(v)
            return v
        return OTHER


class EventCounter:
    def __init__(self, *, config: EventMetricsConfig, counter: ScrapedCounter) -> None:
        self._enabled = config.enabled
        self._counter = counter
        self._labels = (_Label(config.reasons, config.max_values), _Label(config.types, config.max_values),
                        _Label(config.namespaces, config.max_values),
                        _Label(config.involved_kinds, config.max_values))
        self._max_series = config.max_series
        self._series: dict[tuple[str, str, str, str], dict[str, str]] = {}
        self._other = {"reason": OTHER, "type": OTHER, "namespace": OTHER, "involved_kind": OTHER}

    @property
    def series(self) -> int:
        return len(self._series)

    def count(self, facts: EventFacts) -> None:
        if not self._enabled:
            return
        r, t, n, k = self._labels
        key = (r.value(facts.reason), t.value(facts.type), n.value(facts.involved.namespace),
               k.value(facts.involved.kind))
        attrs = self._series.get(key)
        if attrs is None:
            if len(self._series) >= self._max_series:
                attrs = self._other
            else:
                attrs = self._series[key] = {"reason": key[0], "type": key[1], "namespace": key[2],
                                             "involved_kind": key[3]}
        self._counter.add(1, attrs)
