"""A destination written only against the transport Protocol (``sinks.transport.Transport``) gets
the sink's delivery: per-object order, the circuit breaker, the ``oversize`` policy, retries and dead
letters, and through the bridge, its buffer and spill."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import FakeClock, RealClock
from bridge.delivery.pipeline import BridgePipeline
from bridge.testing import deliver_all
from sinks.contract import (
    DeliveryOutcome,
    EventType,
    Sink,
    SinkConfigError,
    SinkMessageTooLargeError,
    SinkTransientError,
)
from sinks.transport import EncodedMessage, Report, Transport, TransportSink
from tests.checkpoint.helpers import WATCHED, cm, fake_builder, until
from tests.sinks import Acks, event, obj


class Outbox:
    """A third-party transport: the Protocol's three methods, nothing of the sink layer. It keeps
    what it was given in ``batches`` and confirms each message on a later turn of the loop, unless
    ``down`` (a transient failure) or the body is over ``limit`` bytes (refused for its size)."""

    def __init__(self, *, limit: int = 0) -> None:
        self.limit = limit
        self.down = False
        self.batches: list[list[dict[str, Any]]] = []
        self.stored: list[dict[str, Any]] = []
        self.started = self.closed = False

    async def start(self) -> None:
        self.started = True

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        self.batches.append([orjson.loads(m.body) for m in batch])
        loop = asyncio.get_running_loop()
        for i, msg in enumerate(batch):
            if self.down:
                loop.call_soon(report, i, SinkTransientError("outbox unavailable"))
            elif self.limit and len(msg.body) > self.limit:
                report(i, SinkMessageTooLargeError(f"{len(msg.body)} bytes", limit=self.limit))
            else:
                loop.call_soon(self._store, msg.body, report, i)

    def _store(self, body: bytes, report: Report, i: int) -> None:
        self.stored.append(orjson.loads(body))
        report(i, None)
        report(i, SinkTransientError("a second report of the same message is ignored"))

    async def close(self) -> None:
        self.closed = True


def subjects(batch: list[dict[str, Any]]) -> list[str]:
    return [ce["subject"] for ce in batch]


async def test_each_objects_events_go_in_order_one_at_a_time_and_objects_together() -> None:
    outbox = Outbox()
    assert isinstance(outbox, Transport)
    sink = TransportSink.over(outbox, "outbox", {"content_mode": "structured"})
    events = [event(EventType.UPDATED, obj(name, rv=str(rv)))
              for rv in range(1, 6) for name in ("a", "b", "c")]
    recorder = await deliver_all(sink, events)
    assert [o for _, o in recorder.outcomes] == [DeliveryOutcome.DELIVERED] * 15
    assert outbox.started
    assert outbox.closed
    for name in ("a", "b", "c"):  # each object's changes in their order
        assert [ce["resourceversion"] for ce in outbox.stored if ce["subject"] == f"default/{name}"] == [
            "1", "2", "3", "4", "5"]
    for batch in outbox.batches:  # never two of one object under way at once
        assert len(set(subjects(batch))) == len(batch)
    assert subjects(outbox.batches[0]) == ["default/a", "default/b", "default/c"]  # objects together


async def test_the_breaker_opens_on_failures_probes_one_at_a_time_then_sends_everything() -> None:
    clock = FakeClock()
    outbox = Outbox()
    outbox.down = True
    sink = TransportSink.over(outbox, "outbox", {"content_mode": "structured",
                                                 "retry": {"initial": 1.0, "jitter": 0},
                                                 "breaker": {"failures": 3, "probe_interval": 1.0}},
                              clock=clock)
    acks = Acks()
    await sink.start()
    for i in range(8):
        await sink.deliver(event(EventType.ADDED, obj(f"o{i}")), acks.cb(f"o{i}"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not sink.healthy()
    assert "outbox unavailable" in sink.last_error
    first = len(outbox.batches)
    for _ in range(4):  # while open: one probe per interval, no event retried on its own
        await clock.advance(1.0)
        for _ in range(5):
            await asyncio.sleep(0)
    assert [len(b) for b in outbox.batches[first:]] == [1, 1, 1, 1]
    assert acks.outcomes == []
    outbox.down = False
    await clock.advance(1.0)
    assert await sink.flush(5)
    assert sorted(acks.of(DeliveryOutcome.DELIVERED)) == sorted(f"o{i}" for i in range(8))
    assert sink.healthy()
    await sink.close()


async def test_an_oversized_message_is_dead_lettered_whole_and_a_reference_takes_its_place(
        tmp_path: Path) -> None:
    outbox = Outbox(limit=4096)
    dead = tmp_path / "dead.jsonl"
    sink = TransportSink.over(outbox, "outbox", {"content_mode": "structured", "oversize": "reference",
                                                 "dead_letter": {"kind": "file", "target": str(dead)}})
    huge = obj("huge", uid="u-huge", rv="7", data={"blob": "x" * 10_000})
    recorder = await deliver_all(sink, [event(EventType.ADDED, obj("small")), event(EventType.ADDED, huge)])
    assert [o for _, o in recorder.outcomes] == [DeliveryOutcome.DELIVERED] * 2
    cut = next(ce for ce in outbox.stored if ce["subject"] == "default/huge")
    assert cut["oversize"] == "reference"
    assert cut["oversizeref"] == f"file:{dead}"
    assert cut["data"]["metadata"] == {"name": "huge", "namespace": "default", "uid": "u-huge",
                                       "resourceVersion": "7"}
    [record] = [json.loads(line) for line in dead.read_text().splitlines()]
    assert record["message"]["data"]["data"]["blob"] == "x" * 10_000


async def test_a_transport_that_raises_in_submit_has_its_messages_retried() -> None:
    class Flaky(Outbox):
        calls = 0

        def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
            self.calls += 1
            if self.calls == 1:
                raise SinkTransientError("not connected yet")
            super().submit(batch, report)

    outbox = Flaky()
    sink = TransportSink.over(outbox, "outbox", {"retry": {"initial": 0.001, "max": 0.01}})
    recorder = await deliver_all(sink, [event(EventType.ADDED, obj("a")), event(EventType.ADDED, obj("b"))])
    assert [o for _, o in recorder.outcomes] == [DeliveryOutcome.DELIVERED] * 2
    assert sink.stats.retries == 2


def test_a_transport_sink_is_built_over_its_transport() -> None:
    with pytest.raises(SinkConfigError, match="over its transport"):
        TransportSink.from_options("outbox", {})
    with pytest.raises(SinkConfigError, match="max_in_flight"):
        TransportSink.over(Outbox(), "outbox", {"max_in_flight": 0})


async def test_through_the_bridge_a_transport_sink_is_buffered_and_spilled(tmp_path: Path) -> None:
    from bridge.testing.fake_source import FakeControllerSource

    outbox = Outbox()
    outbox.down = True
    sink = TransportSink.over(outbox, "outbox", {"routing": {"resources": ["ConfigMaps"]},
                                                 "max_in_flight": 2,
                                                 "buffer": {"capacity": 2, "policy": "spill"},
                                                 "breaker": {"enabled": False},
                                                 "retry": {"initial": 0.01, "max": 0.05}})
    assert isinstance(sink, Sink)
    source = FakeControllerSource()
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[sink], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill")
    await p.start()
    try:
        for i in range(30):
            source.add(cm(f"o{i}"))
        await until(lambda: p.sink_backlog("outbox").spilled > 0, what="the backlog spilling")
        outbox.down = False
        await until(lambda: len({ce["subject"] for ce in outbox.stored}) == 30, what="every change, once up")
    finally:
        await p.shutdown(5)
