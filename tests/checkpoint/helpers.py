"""Test helpers for the pipeline tests: a recording sink and polling on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from bridge.contracts import DeliveryObserver, OverflowPolicy
from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource
from bridge.sim import Simulator
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType, ResourceRef

CONFIGMAPS = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
CONFIGMAPS_API = APIResource(group="", version="v1", resource="configmaps", kind="ConfigMap", namespaced=True,
                             verbs=("list", "watch"))
WATCHED = WatchedResource(key=InformerKey("configmaps"), api=CONFIGMAPS_API, ref=CONFIGMAPS)


class RecordingSink:
    """A sink that records every event; acks at once unless ``auto_ack`` is False."""

    def __init__(self, name: str, *, resync_period: float = 0.0, auto_ack: bool = True,
                 routing_resources: frozenset[str] = frozenset(), buffer_capacity: int = 1024) -> None:
        self.name = name
        self.resync_period = resync_period
        self.routing_resources = routing_resources
        self.buffer_capacity = buffer_capacity
        self.overflow_policy = "block"
        self.auto_ack = auto_ack
        self.events: list[ChangeEvent] = []
        self.unacked: list[tuple[ChangeEvent, AckCallback]] = []
        self.started = False
        self.closed = False

    async def start(self) -> None:
        self.started = True

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.events.append(event)
        if self.auto_ack:
            ack(DeliveryOutcome.DELIVERED)
        else:
            self.unacked.append((event, ack))

    def ack_all(self) -> int:
        pending, self.unacked = self.unacked, []
        for _, ack in pending:
            ack(DeliveryOutcome.DELIVERED)
        return len(pending)

    async def flush(self, timeout: float) -> bool:
        return not self.unacked

    async def close(self) -> None:
        self.closed = True

    def healthy(self) -> bool:
        return not self.closed

    @property
    def delivery(self) -> DeliveryOptions:
        """What its attributes say (tests change ``overflow_policy`` and others after construction)."""
        return DeliveryOptions(routing=self.routing_resources, buffer_capacity=self.buffer_capacity,
                               overflow_policy=OverflowPolicy(self.overflow_policy),
                               resync_period=self.resync_period)

    @property
    def last_error(self) -> str:
        return "closed" if self.closed else ""

    @property
    def in_flight(self) -> int:
        return len(self.unacked)

    def changes(self) -> list[tuple[str, str, str, bool]]:
        """(type, subject, resourceVersion, final_state_unknown) of every non-snapshot event."""
        return [(e.type.value, e.subject, e.resource_version, e.final_state_unknown) for e in self.events
                if e.type in (EventType.ADDED, EventType.UPDATED, EventType.DELETED)]


class BatchSink(RecordingSink):
    """A recording sink with ``deliver_batch`` (each call's size kept in ``calls``)."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.calls: list[int] = []

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.calls.append(len(events))
        for event, ack in zip(events, acks, strict=True):
            await self.deliver(event, ack)


def fake_builder(source: FakeControllerSource, clock: Any) -> Callable[
    [WatchedResource, DeliveryObserver], SharedIndexInformer
]:
    def build(watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        return SharedIndexInformer(lister_watcher=source, clock=clock, observer=observer,
                                   name=watched.informer_id)

    return build


async def until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Polls ``predicate`` on the event loop until it holds (fails the test after ``timeout``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def cm(name: str, ns: str = "default", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": dict(data)}


@contextlib.asynccontextmanager
async def simulated_cluster(tmp_path: Path, namespace: str, *, bookmark_interval: float
                            ) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    """A simulator over real HTTP holding the namespaces ``default`` and ``namespace``, and a
    client reaching it through the kubeconfig it writes."""
    simulator = Simulator(bookmark_interval=bookmark_interval, namespaces=("default", namespace))
    await simulator.start()
    client = ApiClient.from_kubeconfig(str(simulator.write_kubeconfig(tmp_path / "kc")))
    try:
        yield simulator, client
    finally:
        await client.close()
        await simulator.stop()
