"""Tests of the sink layer; shared builders for change events live here, the recording
:class:`~sinks.base.BaseSink` the tests of the base class's own work send through (a sink that
only stands in for a destination is the test kit's, :class:`bridge.testing.RecordingSink`), and
:func:`close_after_test`, which hands a sink a test builds to tests/sinks/conftest.py to close."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

from sinks.base import BaseSink, OutgoingMessage
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, ResourceRef, SnapshotInfo
from sinks.options import SinkOptions

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
SECRETS = ResourceRef(group="", version="v1", resource="secrets", kind="Secret")
DEPLOYMENTS = ResourceRef(group="apps", version="v1", resource="deployments", kind="Deployment")
NODES = ResourceRef(group="", version="v1", resource="nodes", kind="Node", namespaced=False)
T0 = 1_700_000_000.25

AnySink = TypeVar("AnySink", bound=BaseSink[Any])
_opened: list[BaseSink[Any]] = []


def close_after_test(sink: AnySink) -> AnySink:
    """Returns ``sink``, to be closed when the test ends (the last built first), even when the test
    failed half-way: tests/sinks/conftest.py closes it."""
    _opened.append(sink)
    return sink


async def close_opened_sinks() -> None:
    """Closes every sink handed to :func:`close_after_test` and not closed yet, the last first."""
    while _opened:
        await _opened.pop().close()


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
    o: Mapping[str, Any] | None = None,
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


class RecordingSink(BaseSink[SinkOptions]):
    """Records sent messages; a test can script failures per event id or gate sends.

    Not the kit's :class:`bridge.testing.RecordingSink`: that one implements the sink contract
    (``sinks.contract.Sink``) directly, for tests of what drives a sink; the tests here test
    :class:`~sinks.base.BaseSink` itself (its retries, breaker, batching, dead letter), so they need a
    BaseSink subclass whose ``_send`` is the scripted part."""

    kind = "recording"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.sent: list[OutgoingMessage] = []
        self.attempts: list[str] = []
        self.failures: dict[str, list[Exception]] = {}
        self.gate: asyncio.Event | None = None

    async def _send(self, msg: OutgoingMessage) -> None:
        self.attempts.append(msg.event.name)
        if self.gate is not None:
            await self.gate.wait()
        script = self.failures.get(msg.event.name)
        if script:
            raise script.pop(0)
        self.sent.append(msg)
