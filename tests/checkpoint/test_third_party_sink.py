"""A sink written against the Sink Protocol alone (no BaseSink) gets what every sink gets from the
bridge: its configuration's routing, its in-memory buffer and, beyond it, its spill on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.clock import RealClock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.discovery import APIResource
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    ResourceRef,
    Sink,
)
from sinks.options import delivery_options
from tests.checkpoint.helpers import WATCHED, cm, fake_builder, until

SECRETS = WatchedResource(
    key=InformerKey("secrets"),
    api=APIResource(group="", version="v1", resource="secrets", kind="Secret", namespaced=True,
                    verbs=("list", "watch")),
    ref=ResourceRef(group="", version="v1", resource="secrets", kind="Secret"))


class Outbox:
    """A third-party sink: the Protocol's members, nothing inherited. It accepts nothing until
    ``open`` is set, then acknowledges every event."""

    def __init__(self, name: str, options: dict[str, object]) -> None:
        self.name = name
        self.delivery: DeliveryOptions = delivery_options(options)
        self.last_error = ""
        self.in_flight = 0
        self.open = asyncio.Event()
        self.events: list[ChangeEvent] = []

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.in_flight += 1
        await self.open.wait()
        self.in_flight -= 1
        self.events.append(event)
        ack(DeliveryOutcome.DELIVERED)

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        self.open.set()

    def healthy(self) -> bool:
        return True


async def test_a_sink_written_against_the_protocol_alone_gets_routing_buffering_and_spill(
        tmp_path: Path) -> None:
    sink = Outbox("outbox", {"routing": {"resources": ["ConfigMaps"]},
                             "buffer": {"capacity": 2, "policy": "spill"}, "url": "its own option"})
    assert isinstance(sink, Sink)
    source = FakeControllerSource()
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED, SECRETS], sinks=[sink], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill")
    await p.start()
    try:
        # Routing: only the resource its configuration names has a listener for it.
        assert set(p.informers) == {WATCHED.informer_id, SECRETS.informer_id}
        # Its listener delivers to the sink's delivery chain, of no stages: the sink as it is.
        chain = p.listener(WATCHED.informer_id, "outbox").sink
        assert isinstance(chain, DeliveryChain)
        assert chain.sink is sink
        assert chain.stages == ()
        with pytest.raises(KeyError):
            p.listener(SECRETS.informer_id, "outbox")
        for i in range(40):
            source.add(cm(f"o{i}"))
        # Buffering, then spill: a sink that accepts nothing holds its buffer of 2, the rest on disk.
        await until(lambda: p.sink_backlog("outbox").spilled > 0, what="the backlog spilling")
        backlog = p.sink_backlog("outbox")
        assert backlog.spill_bytes > 0
        assert backlog.degraded == 0
        sink.open.set()
        await until(lambda: len([e for e in sink.events if e.type is EventType.ADDED]) == 40,
                    what="every change, once it accepts")
        added = sorted(e.name for e in sink.events if e.type is EventType.ADDED)
        assert added == sorted(f"o{i}" for i in range(40))
        assert {e.resource.resource for e in sink.events} == {"configmaps"}
    finally:
        await p.shutdown(5)
