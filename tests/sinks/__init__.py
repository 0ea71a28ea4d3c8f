"""Tests of the sink layer; shared builders for change events live here."""

from __future__ import annotations

from typing import Any

from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, ResourceRef, SnapshotInfo

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
SECRETS = ResourceRef(group="", version="v1", resource="secrets", kind="Secret")
DEPLOYMENTS = ResourceRef(group="apps", version="v1", resource="deployments", kind="Deployment")
NODES = ResourceRef(group="", version="v1", resource="nodes", kind="Node", namespaced=False)
T0 = 1_700_000_000.25


def obj(
    name: str = "web-0",
    namespace: str | None = "default",
    *,
    uid: str | None = None,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    kind: str = "Pod",
    api_version: str = "v1",
    **extra: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **extra}


def event(
    type_: EventType = EventType.ADDED,
    o: dict[str, Any] | None = None,
    *,
    old: dict[str, Any] | None = None,
    resource: ResourceRef = PODS,
    cluster: str = "prod",
    time: float = T0,
    **kw: Any,
) -> ChangeEvent:
    return ChangeEvent(
        type=type_,
        resource=resource,
        cluster=cluster,
        obj=o if o is not None or type_ in (EventType.SNAPSHOT_BEGIN, EventType.SNAPSHOT_END) else obj(),
        old=old,
        time=time,
        **kw,
    )


def marker(type_: EventType, snap: SnapshotInfo, resource: ResourceRef = PODS) -> ChangeEvent:
    return ChangeEvent(type=type_, resource=resource, cluster="prod", obj=None, time=T0, snapshot=snap)


class Acks:
    """Records every ack, in order, with the event it belongs to."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, DeliveryOutcome]] = []

    def cb(self, label: str):  # type: ignore[no-untyped-def]
        def ack(outcome: DeliveryOutcome) -> None:
            self.outcomes.append((label, outcome))

        return ack

    def of(self, outcome: DeliveryOutcome) -> list[str]:
        return [label for label, o in self.outcomes if o is outcome]
