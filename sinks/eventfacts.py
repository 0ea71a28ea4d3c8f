"""What a Kubernetes Event says, read the same way from both Event APIs.

Two APIs serve Events: core ``v1`` ``events`` (``involvedObject``, ``message``, ``count``,
``source``) and ``events.k8s.io/v1`` ``events`` (``regarding``, ``note``, ``deprecatedCount``,
``series``, ``reportingController``). Routing rules, the events profile's CloudEvent attributes and
the Events counter all need the same handful of facts — reason, type, the involved object, the
message and how many times the Event was seen — so they are read here once, in one place, from
either shape.

Reading them from an object kept as bytes (:class:`~bridge.rawobject.RawObject`) decodes only
these fields (one msgspec pass over the bytes), not the whole tree; the last few answers are
remembered by (uid, resourceVersion), since one change is read by the profile, by each sink's
routing and by the counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bridge.rawobject import RawObject

__all__ = ["EVENT_GROUPS", "EventFacts", "InvolvedObject", "event_facts", "is_event_resource"]

EVENT_GROUPS: Final = frozenset({"", "events.k8s.io"})
"""The API groups serving a resource named ``events``: core and ``events.k8s.io``."""


def is_event_resource(group: str, resource: str) -> bool:
    """True for core ``events`` and ``events.events.k8s.io``."""
    return resource == "events" and group in EVENT_GROUPS


@dataclass(frozen=True, slots=True)
class InvolvedObject:
    """The object an Event is about (``involvedObject`` / ``regarding``)."""

    kind: str = ""
    api_version: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


@dataclass(frozen=True, slots=True)
class EventFacts:
    reason: str
    type: str
    """``Normal`` or ``Warning`` (any string the reporter wrote)."""
    message: str
    """``message`` (core) or ``note`` (events.k8s.io)."""
    involved: InvolvedObject
    count: int
    """Times the Event was seen: ``series.count`` when there is a series, else ``count`` /
    ``deprecatedCount``, else 1."""
    series_count: int | None
    """``series.count`` when the Event has a series (the newer API's way of counting repeats)."""
    reporter: str
    """``reportingController`` / ``reportingComponent``, else ``source.component``."""


class _Ref(msgspec.Struct):
    kind: str | None = ""
    apiVersion: str | None = ""
    namespace: str | None = ""
    name: str | None = ""
    uid: str | None = ""


class _Series(msgspec.Struct):
    count: int | None = None


class _Source(msgspec.Struct):
    component: str | None = ""


class _Event(msgspec.Struct):
    reason: str | None = ""
    type: str | None = ""
    message: str | None = None
    note: str | None = None
    involvedObject: _Ref | None = None
    regarding: _Ref | None = None
    count: int | None = None
    deprecatedCount: int | None = None
    series: _Series | None = None
    reportingController: str | None = ""
    reportingComponent: str | None = ""
    source: _Source | None = None


_decoder = msgspec.json.Decoder(_Event)
_CACHE_MAX = 4096
_cache: dict[tuple[str, str], EventFacts] = {}


def _from_struct(e: _Event) -> EventFacts:
    ref = e.regarding if e.regarding is not None else e.involvedObject
    involved = InvolvedObject() if ref is None else InvolvedObject(
        kind=ref.kind or "", api_version=ref.apiVersion or "", namespace=ref.namespace or "",
        name=ref.name or "", uid=ref.uid or "")
    series = e.series.count if e.series is not None and e.series.count is not None else None
    plain = e.count if e.count is not None else e.deprecatedCount
    count = series if series is not None else (plain if plain else 1)
    reporter = e.reportingController or e.reportingComponent or (e.source.component if e.source else "") or ""
    message = e.note if e.note is not None else (e.message or "")
    return EventFacts(reason=e.reason or "", type=e.type or "", message=message, involved=involved,
                      count=count, series_count=series, reporter=reporter)


def event_facts(obj: Mapping[str, Any]) -> EventFacts:
    """The facts of an Event object of either API. Fields that are absent read as empty."""
    if type(obj) is RawObject:
        key = (obj.uid, obj.resource_version)
        cached = _cache.get(key)
        if cached is not None:
            return cached
        try:
            facts = _from_struct(_decoder.decode(obj.raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            facts = _from_struct(msgspec.convert(_loose(obj), _Event))
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = facts
        return facts
    try:
        return _from_struct(msgspec.convert(_loose(obj), _Event))
    except msgspec.ValidationError:
        return _from_struct(_Event())


def _loose(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Event's fields with values of an unexpected type left out (a malformed Event still
    yields what it has)."""
    out: dict[str, Any] = {}
    for key in ("reason", "type", "message", "note", "reportingController", "reportingComponent"):
        value = obj.get(key)
        if isinstance(value, str):
            out[key] = value
    for key in ("count", "deprecatedCount"):
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    for key in ("involvedObject", "regarding"):
        value = obj.get(key)
        if isinstance(value, Mapping):
            out[key] = {k: v for k, v in value.items()
                        if k in ("kind", "apiVersion", "namespace", "name", "uid") and isinstance(v, str)}
    series = obj.get("series")
    if isinstance(series, Mapping) and isinstance(series.get("count"), int):
        out["series"] = {"count": series["count"]}
    source = obj.get("source")
    if isinstance(source, Mapping) and isinstance(source.get("component"), str):
        out["source"] = {"component": source["component"]}
    return out
