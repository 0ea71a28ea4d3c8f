"""Routing of Kubernetes Events by what they say: reason, type, involved kind, message pattern.

A sink's ``routing.events`` holds two lists of rules, as an Event exporter's routes do:

- ``match``: when not empty, an Event is accepted only if at least one rule matches it;
- ``drop``: an Event any of these rules matches is not accepted (``drop`` wins over ``match``).

A rule matches when every condition it sets holds: ``reasons`` (the Event's reason is one of them),
``types`` (``Normal``, ``Warning``), ``involved_kinds`` (the involved object's kind, e.g. ``Pod``),
``namespaces`` (the involved object's namespace), ``message`` (a regular expression searched in the
message / note), ``min_count`` (the Event was seen at least that many times) and
``involved_labels`` (a label selector, ``team=shop,tier!=debug``, on the involved object's labels as
the events profile's enrichment attached them: an Event without enrichment never matches it).
Conditions on strings are exact and case-sensitive, as Kubernetes writes them; ``message`` is a
Python regular expression compiled once when the sink is built.

The rules apply to Events only (core ``events`` and ``events.k8s.io``): other resources routed to
the same sink pass them untouched, and snapshot / gap markers too. A ``deleted`` Event (expired by
the API server's TTL) is judged by its last state like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sinks.contract import ChangeEvent
from sinks.eventfacts import EventFacts, event_facts, is_event_resource

__all__ = ["INVOLVED_LABELS", "EventRoute", "EventRule", "LabelMatcher", "involved_labels"]


LabelMatcher = Callable[[Mapping[str, Any]], bool]
"""A parsed label selector's ``matches`` (:class:`bridge.labels.LabelSelector`)."""

INVOLVED_LABELS = "involvedlabels"
"""The events profile's attribute holding the involved object's labels (a JSON object)."""


def involved_labels(event: ChangeEvent) -> Mapping[str, Any] | None:
    """The involved object's labels as the events profile attached them; None without them."""
    text = event.extensions.get(INVOLVED_LABELS)
    if text is None:
        return None if "enrichment" not in event.extensions else {}
    try:
        labels = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return labels if isinstance(labels, dict) else None


@dataclass(frozen=True, slots=True)
class EventRule:
    reasons: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    involved_kinds: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    message: re.Pattern[str] | None = None
    min_count: int = 0
    involved_labels: LabelMatcher | None = None

    @classmethod
    def build(cls, *, reasons: Sequence[str] = (), types: Sequence[str] = (),
              involved_kinds: Sequence[str] = (), namespaces: Sequence[str] = (),
              message: str | None = None, min_count: int = 0,
              involved_labels: LabelMatcher | None = None) -> EventRule:
        """Raises ValueError naming the bad pattern."""
        try:
            pattern = re.compile(message) if message else None
        except re.error as e:
            raise ValueError(f"message: invalid regular expression {message!r}: {e}") from e
        return cls(frozenset(reasons), frozenset(types), frozenset(involved_kinds), frozenset(namespaces),
                   pattern, min_count, involved_labels)

    def matches(self, facts: EventFacts, event: ChangeEvent | None = None) -> bool:
        if self.reasons and facts.reason not in self.reasons:
            return False
        if self.types and facts.type not in self.types:
            return False
        if self.involved_kinds and facts.involved.kind not in self.involved_kinds:
            return False
        if self.namespaces and facts.involved.namespace not in self.namespaces:
            return False
        if self.min_count and facts.count < self.min_count:
            return False
        if self.message is not None and self.message.search(facts.message) is None:
            return False
        if self.involved_labels is not None:
            labels = involved_labels(event) if event is not None else None
            return labels is not None and self.involved_labels(labels)
        return True


class EventRoute:
    """The ``routing.events`` of one sink (see the module docstring)."""

    __slots__ = ("drop", "match")

    def __init__(self, *, match: Sequence[EventRule] = (), drop: Sequence[EventRule] = ()) -> None:
        self.match = tuple(match)
        self.drop = tuple(drop)

    @property
    def empty(self) -> bool:
        return not (self.match or self.drop)

    def accepts(self, event: ChangeEvent) -> bool:
        obj = event.obj
        res = event.resource
        if obj is None or not is_event_resource(res.group, res.resource):
            return True
        facts = event_facts(obj)
        if self.match and not any(rule.matches(facts, event) for rule in self.match):
            return False
        return not any(rule.matches(facts, event) for rule in self.drop)
