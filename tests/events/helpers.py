"""Event objects of both APIs, for the events tests."""

from __future__ import annotations

import itertools
from typing import Any

from bridge.rawobject import RawObject
from sinks.contract import ChangeEvent, EventType, ResourceRef

CORE_EVENTS = ResourceRef(group="", version="v1", resource="events", kind="Event")
NEW_EVENTS = ResourceRef(group="events.k8s.io", version="v1", resource="events", kind="Event")
PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
_rvs = itertools.count(1000)


def core_event(name: str = "web-0.1", *, rv: str = "", count: int = 1, reason: str = "BackOff",
               type_: str = "Warning", message: str = "Back-off restarting failed container",
               kind: str = "Pod", involved: str = "web-0", uid: str = "ev-1") -> RawObject:
    return RawObject.from_dict({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop", "uid": uid,
                     "resourceVersion": rv or str(next(_rvs))},
        "involvedObject": {"kind": kind, "namespace": "shop", "name": involved, "uid": f"uid-{involved}",
                           "apiVersion": "v1"},
        "reason": reason, "type": type_, "message": message, "count": count,
        "source": {"component": "kubelet"}})


def new_event(name: str = "web-0.2", *, rv: str = "20", series: int | None = None,
              reason: str = "Unhealthy", type_: str = "Warning", note: str = "Readiness probe failed",
              uid: str = "ev-2") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop", "uid": uid, "resourceVersion": rv},
        "regarding": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "uid-web-0",
                      "apiVersion": "v1"},
        "reason": reason, "type": type_, "note": note, "reportingController": "kubelet",
        "deprecatedCount": 0}
    if series is not None:
        obj["series"] = {"count": series, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}
    return obj


def change(obj: Any, type_: EventType = EventType.ADDED, ref: ResourceRef = CORE_EVENTS) -> ChangeEvent:
    return ChangeEvent(type=type_, resource=ref, cluster="test", obj=obj, time=1_700_000_000.0)
