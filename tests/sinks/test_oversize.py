"""Oversized objects under each ``oversize`` policy, against real brokers: Tansu (Kafka), nats-server
with JetStream, and a webhook answering 413. A 1.5 MB object must never vanish from the stream under
the default policy: an event carrying its identity and resourceVersion takes its place, and the whole
event is in the dead letter."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.base import BaseSink
from sinks.cloudevents import event_id
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType
from sinks.kafka import KafkaSink
from sinks.nats import JetStreamSink, NatsSink
from sinks.webhook import WebhookSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.sinks import Acks, close_after_test, event, obj
from tests.sinks.test_jetstream_sink import stored
from tests.sinks.test_nats_sink import Collector

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server
BIG = 1_500_000


def big_object(*, compressible: bool = False) -> dict[str, Any]:
    """A 1.5 MB ConfigMap-like object: random (incompressible) or repetitive data."""
    blob = "a" * BIG if compressible else base64.b64encode(os.urandom(BIG * 3 // 4)).decode()
    return obj("huge", uid="u-huge", rv="41", labels={"app": "big"}, spec={"replicas": 2},
               data={"blob": blob})


def the_events() -> list[ChangeEvent]:
    return [event(EventType.ADDED, obj("before", uid="u-before", rv="40")),
            event(EventType.ADDED, big_object()),
            event(EventType.ADDED, obj("after", uid="u-after", rv="42"))]


async def deliver_all(sink: BaseSink[Any], events: list[ChangeEvent]) -> Acks:
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(60), sink.stats.as_dict()
    return acks


def check_cut(ce: dict[str, Any], policy: str, ref: str | None) -> None:
    """The cut event: the object's identity and resourceVersion, saying what was cut and where the
    whole event is."""
    assert ce["id"] == event_id(event(EventType.ADDED, big_object()))
    assert ce["subject"] == "default/huge"
    assert ce["uid"] == "u-huge"
    assert ce["resourceversion"] == "41"
    assert ce["oversize"] == policy
    assert int(ce["oversizebytes"]) > BIG
    assert ce.get("oversizeref") == ref
    meta = ce["data"]["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"], meta["resourceVersion"]) == (
        "huge", "default", "u-huge", "41")
    assert ce["data"]["kind"] == "Pod"
    if policy == "reference":
        assert set(ce["data"]) == {"apiVersion", "kind", "metadata"}
        assert "oversizedropped" not in ce
    else:  # truncate: what fits is kept, the blob is not
        assert meta["labels"] == {"app": "big"}
        assert ce["data"]["spec"] == {"replicas": 2}
        assert "data" not in ce["data"]
        assert ce["oversizedropped"] == "data"


def whole_in(record: dict[str, Any]) -> None:
    """A dead-letter record holding the whole event."""
    assert record["event_id"] == event_id(event(EventType.ADDED, big_object()))
    assert len(record["message"]["data"]["data"]["blob"]) == BIG
    assert "too large" in record["reason"].lower() or "MSG_SIZE_TOO_LARGE" in record["reason"]


# ---- Kafka --------------------------------------------------------------------------------------


def kafka_sink(broker: TansuBroker, topic: str, **opts: Any) -> KafkaSink:
    sink = KafkaSink.from_options("kafka", {"brokers": broker.bootstrap, "linger_ms": 1, "destination": topic,
                                            **opts})
    close_after_test(sink)
    return sink


@pytest.mark.parametrize("policy", ["reference", "truncate", "dead_letter"])
async def test_kafka_each_policy(kafka_broker: TansuBroker, policy: str) -> None:
    topic, dlq = unique_name(f"over-{policy}"), unique_name("over-dlq")
    kafka_broker.create_topic(topic)
    # The default codec (lz4) is tried first: random data does not compress below the limit. The
    # dead-letter topic is created with room for the whole event.
    options: dict[str, Any] = {"dead_letter": {"kind": "kafka", "target": dlq},
                               "dead_letter_max_message_bytes": 4_000_000}
    if policy != "reference":
        options["oversize"] = policy  # reference is the default
    sink = kafka_sink(kafka_broker, topic, **options)
    await sink.start()
    acks = await deliver_all(sink, the_events())
    expected = DeliveryOutcome.DEAD_LETTERED if policy == "dead_letter" else DeliveryOutcome.DELIVERED
    assert sorted(acks.outcomes) == [("0", DeliveryOutcome.DELIVERED), ("1", expected),
                                     ("2", DeliveryOutcome.DELIVERED)]
    await sink.close()
    expect = 2 if policy == "dead_letter" else 3
    records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=expect)
    # Different objects are sent concurrently: order holds per object only.
    subjects = sorted(orjson.loads(r.value or b"")["subject"] for r in records)
    if policy == "dead_letter":
        assert subjects == ["default/after", "default/before"]  # the object is missing from the stream
    else:
        assert subjects == ["default/after", "default/before", "default/huge"]
        cut = next(r for r in records if r.key == b"u-huge")
        assert len(cut.value or b"") < 1_000_000
        check_cut(orjson.loads(cut.value or b""), policy, f"kafka:{dlq}")
    (dead,) = await asyncio.to_thread(kafka_broker.read_all, dlq, expect=1)
    whole_in(orjson.loads(dead.value or b""))


async def test_kafka_compresses_before_cutting(kafka_broker: TansuBroker) -> None:
    topic = unique_name("over-lz4")
    kafka_broker.create_topic(topic)
    sink = kafka_sink(kafka_broker, topic)
    await sink.start()
    acks = await deliver_all(sink, [event(EventType.ADDED, big_object(compressible=True))])
    assert acks.outcomes == [("0", DeliveryOutcome.DELIVERED)]
    await sink.close()
    (record,) = await asyncio.to_thread(kafka_broker.read_all, topic, expect=1)
    ce = orjson.loads(record.value or b"")
    assert "oversize" not in ce
    assert len(ce["data"]["data"]["blob"]) == BIG  # whole: 1.5 MB that lz4 makes a few KB of


async def test_kafka_binary_mode_cut_event(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    topic = unique_name("over-bin")
    kafka_broker.create_topic(topic)
    sink = kafka_sink(kafka_broker, topic, content_mode="binary", compression="none",
                      dead_letter={"kind": "file", "target": str(tmp_path / "dead.jsonl")})
    await sink.start()
    acks = await deliver_all(sink, [event(EventType.ADDED, big_object(compressible=True))])
    assert acks.outcomes == [("0", DeliveryOutcome.DELIVERED)]
    await sink.close()
    (record,) = await asyncio.to_thread(kafka_broker.read_all, topic, expect=1)
    assert record.headers["ce_oversize"] == b"reference"
    assert record.headers["ce_oversizeref"] == f"file:{tmp_path / 'dead.jsonl'}".encode()
    assert record.headers["ce_resourceversion"] == b"41"
    assert orjson.loads(record.value or b"")["metadata"]["uid"] == "u-huge"
    (line,) = (tmp_path / "dead.jsonl").read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["headers"]["ce_resourceversion"] == "41"
    assert len(record["message"]["data"]["blob"]) == BIG  # binary mode: the body is the object


# ---- JetStream ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["reference", "truncate", "dead_letter"])
async def test_jetstream_each_policy(nats_server: NatsServer, tmp_path: Path, policy: str) -> None:
    # The server's max_payload (1 MB by default) is the limit; the dead letter holding the whole
    # event is a file (a NATS dead-letter subject has the same max_payload).
    dead = tmp_path / "dead.jsonl"
    options: dict[str, Any] = {"servers": [nats_server.url], "destination": "k8s.{namespace}.{name}",
                               "stream": {"name": "KUBE", "create": True, "subjects": ["k8s.>"]},
                               "dead_letter": {"kind": "file", "target": str(dead)}}
    if policy != "reference":
        options["oversize"] = policy
    sink = JetStreamSink.from_options("js", options)
    close_after_test(sink)
    await sink.start()
    acks = await deliver_all(sink, the_events())
    expected = DeliveryOutcome.DEAD_LETTERED if policy == "dead_letter" else DeliveryOutcome.DELIVERED
    assert sorted(acks.outcomes) == [("0", DeliveryOutcome.DELIVERED), ("1", expected),
                                     ("2", DeliveryOutcome.DELIVERED)]
    msgs = await stored(nats_server.url, "KUBE")
    subjects = sorted(m.subject for m in msgs)
    if policy == "dead_letter":
        assert subjects == ["k8s.default.after", "k8s.default.before"]
    else:
        assert subjects == ["k8s.default.after", "k8s.default.before", "k8s.default.huge"]
        check_cut(orjson.loads(next(m for m in msgs if m.subject == "k8s.default.huge").data), policy,
                  f"file:{dead}")
    (line,) = dead.read_bytes().splitlines()
    whole_in(orjson.loads(line))


async def test_core_nats_reference_in_binary_mode(nats_server: NatsServer, tmp_path: Path) -> None:
    collector = Collector()
    await collector.start(nats_server.url, "ev.>")
    try:
        sink = NatsSink.from_options("nats", {"servers": [nats_server.url], "destination": "ev.{name}",
                                              "content_mode": "binary",
                                              "dead_letter": {"kind": "file", "target": str(tmp_path / "d")}})
        close_after_test(sink)
        await sink.start()
        acks = await deliver_all(sink, the_events())
        assert sorted(acks.of(DeliveryOutcome.DELIVERED)) == ["0", "1", "2"]
        msgs = await collector.wait_for(3)
        huge = next(m for m in msgs if m.subject == "ev.huge")
        assert huge.headers is not None
        assert huge.headers["ce-oversize"] == "reference"
        assert huge.headers["ce-resourceversion"] == "41"
        assert huge.headers["ce-oversizeref"].startswith("file")
        assert orjson.loads(huge.data)["metadata"]["uid"] == "u-huge"
        assert len(huge.data) + sum(len(k) + len(v) for k, v in huge.headers.items()) < 1_048_576
    finally:
        await collector.close()


# ---- webhook ------------------------------------------------------------------------------------


async def test_a_webhook_gets_whole_objects_and_a_cut_event_only_after_a_413(tmp_path: Path) -> None:
    limit = {"bytes": 10_000_000}

    async def handle(request: ReceivedRequest) -> Reply:
        if len(request.body) > limit["bytes"]:
            return Reply(413, body="Content Too Large")
        return Reply(204)

    hook = await WebhookReceiver(respond=handle, max_body=20_000_000).start()
    try:
        url = hook.url
        dead_letter = {"kind": "file", "target": str(tmp_path / "d")}
        sink = WebhookSink.from_options("hook", {"url": url, "dead_letter": dead_letter})
        close_after_test(sink)
        await sink.start()
        acks = await deliver_all(sink, the_events())
        assert sorted(acks.of(DeliveryOutcome.DELIVERED)) == ["0", "1", "2"]
        huge = next(ce for ce in hook.events if ce["subject"] == "default/huge")
        assert len(huge["data"]["data"]["blob"]) == BIG  # no limit of its own: whole
        before = hook.event_count
        limit["bytes"] = 1_000_000  # the receiver refuses large bodies
        acks = await deliver_all(sink, the_events())
        assert sorted(acks.of(DeliveryOutcome.DELIVERED)) == ["0", "1", "2"]
        received = hook.events[before:]
        check_cut(next(ce for ce in received if ce["subject"] == "default/huge"), "reference",
                  f"file:{tmp_path / 'd'}")
    finally:
        await hook.close()


async def test_a_truncated_event_keeps_an_integer_beyond_64_bits_exact(kafka_broker: TansuBroker) -> None:
    """The ``truncate`` policy rebuilds the event from the bytes it was encoded to: an integer beyond
    64 bits in a kept field reaches the topic as the same integer (it was dropped from the cut event)."""
    exact = 123456789012345678901234567890
    topic, dlq = unique_name("over-exact"), unique_name("over-exact-dlq")
    kafka_broker.create_topic(topic)
    sink = kafka_sink(kafka_broker, topic, oversize="truncate", dead_letter={"kind": "kafka", "target": dlq},
                      dead_letter_max_message_bytes=4_000_000)
    await sink.start()
    huge = big_object()
    huge["spec"] = {"replicas": 2, "exact": exact}
    acks = await deliver_all(sink, [event(EventType.ADDED, huge)])
    assert acks.of(DeliveryOutcome.DELIVERED) == ["0"]
    await sink.close()
    (cut,) = await asyncio.to_thread(kafka_broker.read_all, topic, expect=1)
    ce = json.loads(cut.value or b"")  # the standard library keeps every integer exact
    assert ce["oversize"] == "truncate"
    assert ce["data"]["spec"] == {"replicas": 2, "exact": exact}
