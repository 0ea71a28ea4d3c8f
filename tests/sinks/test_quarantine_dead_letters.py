"""A quarantined object's bytes reach the dead letter byte-exact, whatever they hold, on every kind of
dead-letter destination: a file, a Kafka topic (the test broker), a NATS subject (a real server).

The object comes from the bridge's own List decoder (an item that is not UTF-8 is quarantined as
``encoding``) and goes through each sink's delivery path. A body that is not JSON and not UTF-8 is
written base64-encoded (``message`` null, ``message_base64`` the bytes); JSON and UTF-8 bodies are
written as they always were (docs/sinks.md, *Dead letters*).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import nats
import orjson
from nats.aio.msg import Msg

from bridge.kube.listwatch import decode_list
from bridge.rawobject import RawObject
from sinks.base import BaseSink
from sinks.cloudevents import event_id
from sinks.contract import DeliveryOutcome, EventType
from sinks.deadletter import DeadLetterRecord, dead_letter_json
from sinks.file import FileSink
from sinks.kafka import KafkaSink
from sinks.nats import NatsSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, subscribed, unique_name
from tests.sinks import Acks, close_after_test, event

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server

BAD = (b'{"metadata":{"name":"bad","namespace":"default","uid":"uid-bad","resourceVersion":"7"},'
       b'"spec":{"s":"\xff\xfe","t":"\xc3\x28","u":"caf\xc3\xa9"}}')
"""A List item with invalid UTF-8 (a lone 0xff 0xfe, a truncated sequence) beside valid UTF-8."""


def quarantined() -> RawObject:
    body = (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":['
            + BAD + b"]}")
    (item,) = decode_list(body, api_version="v1", kind="Pod", raw_objects=True).items
    assert type(item) is RawObject
    assert item.malformed == "encoding"
    return item


def check_record(record: dict[str, Any], obj: RawObject) -> None:
    assert record["event_id"] == event_id(event(EventType.ADDED, obj))
    assert "malformed object (encoding)" in record["reason"]
    assert record["message"] is None
    assert base64.b64decode(record["message_base64"], validate=True) == BAD


async def deliver(sink: BaseSink[Any], obj: RawObject) -> None:
    close_after_test(sink)
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj), acks.cb("bad"))
    assert await sink.flush(30), sink.stats.as_dict()
    assert acks.outcomes == [("bad", DeliveryOutcome.DELIVERED)]  # its identity, marked malformed


async def test_a_file_dead_letter_gives_back_the_exact_bytes(tmp_path: Path) -> None:
    obj, dead = quarantined(), tmp_path / "dead.jsonl"
    await deliver(FileSink.from_options("f", {"path": str(tmp_path / "e.jsonl"),
                                              "dead_letter": {"kind": "file", "target": str(dead)}}), obj)
    (line,) = dead.read_bytes().splitlines()
    line.decode("utf-8")  # the record itself is UTF-8 JSON
    check_record(orjson.loads(line), obj)


async def test_a_kafka_dead_letter_gives_back_the_exact_bytes(kafka_broker: TansuBroker) -> None:
    obj, topic, dlq = quarantined(), unique_name("q"), unique_name("qdlq")
    kafka_broker.create_topic(topic)
    kafka_broker.create_topic(dlq)
    await deliver(KafkaSink.from_options("k", {"brokers": kafka_broker.bootstrap, "linger_ms": 1,
                                               "destination": topic,
                                               "dead_letter": {"kind": "kafka", "target": dlq}}), obj)
    (dead,) = await asyncio.to_thread(kafka_broker.read_all, dlq, expect=1)
    check_record(orjson.loads(dead.value or b""), obj)


async def test_a_nats_dead_letter_gives_back_the_exact_bytes(nats_server: NatsServer) -> None:
    obj = quarantined()
    got: list[Msg] = []
    arrived = asyncio.Event()

    async def cb(msg: Msg) -> None:
        got.append(msg)
        arrived.set()

    nc = await nats.connect(nats_server.url)
    try:
        await subscribed(nc, "dlq.pods", cb=cb)
        await deliver(NatsSink.from_options("n", {"servers": [nats_server.url],
                                                  "dead_letter": {"kind": "nats", "target": "dlq.pods"}}),
                      obj)
        await asyncio.wait_for(arrived.wait(), 10)
    finally:
        await nc.close()
    (dead,) = got
    check_record(orjson.loads(dead.data), obj)


def _record(body: bytes) -> DeadLetterRecord:
    return DeadLetterRecord(sink="s", reason="r", attempts=1, time=0.0, event_id="e", key=b"k",
                            destination="d", headers={}, body=body)


def test_json_and_utf8_bodies_are_written_as_before() -> None:
    """Compatibility: a JSON body is embedded as JSON, a UTF-8 body that is not JSON as a string; only
    a body that is neither gets ``message_base64``."""
    as_json = json.loads(dead_letter_json(_record(b'{"a": 12345678901234567890123, "b": [1]}')))
    assert as_json["message"] == {"a": 12345678901234567890123, "b": [1]}
    assert "message_base64" not in as_json
    assert b'"message":{"a": 12345678901234567890123, "b": [1]}' in dead_letter_json(
        _record(b'{"a": 12345678901234567890123, "b": [1]}'))
    text = orjson.loads(dead_letter_json(_record("not json, caf\u00e9".encode())))
    assert text["message"] == "not json, caf\u00e9"
    assert "message_base64" not in text
    raw = orjson.loads(dead_letter_json(_record(b"\x00\xff not json")))
    assert raw["message"] is None
    assert base64.b64decode(raw["message_base64"]) == b"\x00\xff not json"
