"""Acknowledgements as a test sees them, and change events to feed a sink with.

:class:`AckRecorder` hands out the ``ack`` callbacks a test passes to ``Sink.deliver``: each records
its outcome under a label and counts a second call as a breach of the contract (an event is
acknowledged exactly once). :func:`deliver_all` drives a sink through the contract's lifecycle with
a list of events and checks what the contract promises of any sink. :func:`change_event` and
:func:`kube_object` build the events, as the bridge hands them over, without a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType, ResourceRef, Sink

__all__ = ["PODS", "AckRecorder", "ContractBreach", "change_event", "deliver_all", "kube_object"]

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")


class ContractBreach(AssertionError):
    """A sink did what :mod:`sinks.contract` says a sink never does."""


class AckRecorder:
    """Acknowledgement callbacks that record every outcome, in the order they are called."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, DeliveryOutcome]] = []
        """(label, outcome) of every first acknowledgement, in order."""
        self.repeated: list[str] = []
        """Labels acknowledged more than once (each extra call; the contract says exactly once)."""
        self._issued: list[str] = []
        self._changed = asyncio.Event()

    def callback(self, label: str) -> AckCallback:
        """The ``ack`` for one event, recorded under ``label``."""
        self._issued.append(label)
        done = False

        def ack(outcome: DeliveryOutcome) -> None:
            nonlocal done
            if done:
                self.repeated.append(label)
                raise ContractBreach(f"event {label!r} acknowledged twice (now {outcome.value})")
            done = True
            self.outcomes.append((label, outcome))
            self._changed.set()

        return ack

    def of(self, outcome: DeliveryOutcome) -> list[str]:
        """The labels acknowledged with ``outcome``, in order."""
        return [label for label, o in self.outcomes if o is outcome]

    @property
    def pending(self) -> list[str]:
        """Labels of callbacks handed out and not called yet."""
        acked = {label for label, _ in self.outcomes}
        return [label for label in self._issued if label not in acked]

    async def wait_for(self, count: int, timeout: float | None = None) -> None:
        """Returns once ``count`` acknowledgements were made (:class:`TimeoutError` after
        ``timeout`` seconds; None: as long as it takes)."""
        async with asyncio.timeout(timeout):
            while len(self.outcomes) < count:
                self._changed.clear()
                await self._changed.wait()


async def deliver_all(sink: Sink, events: Sequence[ChangeEvent], *, timeout: float = 10.0,
                      labels: Sequence[str] | None = None) -> AckRecorder:
    """Starts ``sink``, delivers ``events`` in order, flushes and closes it (twice: close is
    idempotent), and checks the contract's promises on the way: it is a
    :class:`~sinks.contract.Sink`, its flush reports every event acknowledged, exactly once each,
    and nothing is in flight after it. ``labels`` name the events in the recorder (default: their
    positions). Raises :class:`ContractBreach` when a promise is broken."""
    if not isinstance(sink, Sink):
        raise ContractBreach(f"{type(sink).__name__} lacks members of sinks.contract.Sink")
    names = list(labels) if labels is not None else [str(i) for i in range(len(events))]
    if len(names) != len(events):
        raise ValueError(f"{len(names)} labels for {len(events)} events")
    acks = AckRecorder()
    await sink.start()
    try:
        for label, event in zip(names, events, strict=True):
            await sink.deliver(event, acks.callback(label))
        if not await sink.flush(timeout):
            raise ContractBreach(f"flush({timeout}) reported events not acknowledged: {acks.pending}")
        if acks.pending:
            raise ContractBreach(f"flush returned True before acknowledging {acks.pending}")
        if sink.in_flight:
            raise ContractBreach(f"{sink.in_flight} events still in flight after a flush")
    finally:
        await sink.close()
        await sink.close()
    if acks.repeated:
        raise ContractBreach(f"acknowledged more than once: {acks.repeated}")
    return acks


def kube_object(name: str = "web-0", namespace: str | None = "default", *, uid: str | None = None,
                rv: str = "1", kind: str = "Pod", api_version: str = "v1",
                labels: Mapping[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """A Kubernetes object as decoded JSON: metadata from the arguments, the other top-level fields
    (``spec``, ``data``, ``status`` …) from ``fields``; ``namespace=None`` for a cluster-scoped one."""
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **fields}


def change_event(type_: EventType = EventType.ADDED, obj: Mapping[str, Any] | None = None, *,
                 old: Mapping[str, Any] | None = None, resource: ResourceRef = PODS,
                 cluster: str = "test", time: float = 1_700_000_000.0, **fields: Any) -> ChangeEvent:
    """A :class:`~sinks.contract.ChangeEvent` as the bridge hands it to a sink; ``obj`` defaults to
    :func:`kube_object`'s for object changes (markers and heartbeats carry none). ``fields``: the
    event's other fields (``snapshot``, ``gap``, ``final_state_unknown``, ``extensions``)."""
    if obj is None and type_ in (EventType.ADDED, EventType.UPDATED, EventType.DELETED, EventType.SYNC):
        obj = kube_object()
    return ChangeEvent(type=type_, resource=resource, cluster=cluster, obj=obj, old=old, time=time,
                       **fields)
