"""Broker outages mid-stream lose nothing: every event is delivered once the broker is back, in order
per object, and nothing is acked while the broker cannot have stored it."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import nats
import orjson

from sinks.cloudevents import event_id
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, Sink
from sinks.kafka import KafkaSink
from sinks.nats import JetStreamSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.sinks import Acks, event, obj

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server

OBJECTS, VERSIONS = 50, 10


def stream_of_events() -> list[ChangeEvent]:
    """``OBJECTS`` objects, each changed ``VERSIONS`` times, interleaved as a busy cluster would."""
    out = []
    for v in range(1, VERSIONS + 1):
        for i in range(OBJECTS):
            o = obj(f"pod-{i}", uid=f"uid-{i}", rv=str(v * 1000 + i), spec={"v": v})
            out.append(event(EventType.ADDED if v == 1 else EventType.UPDATED, o))
    return out


async def feed(sink: Sink, events: list[ChangeEvent], acks: Acks, started: asyncio.Event) -> None:
    for n, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(event_id(ev)))
        if n == 100:
            started.set()
        await asyncio.sleep(0.002)


async def run_with_outage(
    sink: Sink, events: list[ChangeEvent], acks: Acks, *, down: Any, up: Any, seconds: float
) -> tuple[int, int]:
    """Feeds ``events`` and takes the broker down for ``seconds`` once the stream is under way.
    Returns the number of acks early in the outage and at its end."""
    started = asyncio.Event()
    feeder = asyncio.create_task(feed(sink, events, acks, started), name="test-feeder")
    try:
        await started.wait()
        down()
        await asyncio.sleep(1.0)
        early = len(acks.outcomes)
        await asyncio.sleep(seconds - 1.0)
        late = len(acks.outcomes)
        up()
        await feeder
    finally:
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
    assert await sink.flush(60), "not everything was delivered after the outage"
    return early, late


def check_complete_and_ordered(events: list[ChangeEvent], stored: list[tuple[bytes, dict[str, Any]]]) -> None:
    """Every event stored, each exactly once, and each object's versions in order."""
    ids = [ce["id"] for _, ce in stored]
    assert len(ids) == len(set(ids)), "duplicates stored"
    assert set(ids) == {event_id(ev) for ev in events}
    per_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for key, ce in stored:
        per_key[key].append(ce["data"]["spec"]["v"])
    assert len(per_key) == OBJECTS
    assert all(seq == list(range(1, VERSIONS + 1)) for seq in per_key.values())


async def test_kafka_broker_frozen_mid_stream_loses_nothing(kafka_broker: TansuBroker) -> None:
    topic = unique_name("outage")
    kafka_broker.create_topic(topic, partitions=3)
    sink = KafkaSink.from_options(
        "kafka-outage", {"brokers": kafka_broker.bootstrap, "destination": topic, "linger_ms": 2,
                         "max_in_flight": 200},
    )
    await sink.start()
    events, acks = stream_of_events(), Acks()
    try:
        early, late = await run_with_outage(
            sink, events, acks, down=kafka_broker.pause, up=kafka_broker.resume, seconds=4.0
        )
    finally:
        kafka_broker.resume()
        await sink.close()
    assert early == late, "events were acked while the broker was frozen"
    assert late < len(events)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == len(events)

    records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=len(events), timeout=30)
    check_complete_and_ordered(events, [(r.key or b"", orjson.loads(r.value or b"")) for r in records])
    partitions: dict[bytes | None, set[int]] = collections.defaultdict(set)
    for r in records:
        partitions[r.key].add(r.partition)
    assert all(len(p) == 1 for p in partitions.values())


async def test_nats_server_restarted_mid_stream_loses_nothing_in_jetstream(nats_server: NatsServer) -> None:
    sink = JetStreamSink.from_options(
        "js-outage",
        {
            "servers": [nats_server.url],
            "stream": {"name": "OUTAGE", "create": True},
            "reconnect_wait": 0.2,
            "publish_timeout": 1.0,
            "max_in_flight": 200,
            "retry": {"initial": 0.1, "max": 0.5},
        },
    )
    await sink.start()
    events, acks = stream_of_events(), Acks()
    try:
        early, late = await run_with_outage(
            sink, events, acks, down=nats_server.stop, up=nats_server.start, seconds=3.0
        )
        assert sink.healthy()
    finally:
        await sink.close()
    assert early == late, "events were acked while the server was down"
    assert late < len(events)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == len(events)

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("OUTAGE")
        msgs = [await js.get_msg("OUTAGE", seq) for seq in range(1, info.state.last_seq + 1)]
    finally:
        await nc.close()
    stored = [(str(m.subject).encode(), orjson.loads(m.data or b"")) for m in msgs]
    check_complete_and_ordered(events, stored)
