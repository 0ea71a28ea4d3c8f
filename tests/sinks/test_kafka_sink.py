"""KafkaSink against a real Tansu broker: what the broker stores is read back and compared exactly."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import orjson
import pytest

from sinks.cloudevents import KAFKA_PREFIX, decode_binary, event_id, to_cloudevent
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, SinkConfigError
from sinks.kafka import KafkaSink, KafkaSinkOptions
from sinks.redaction import REDACTED
from tests import brokers
from tests.brokers import TansuBroker, free_port, unique_name
from tests.sinks import SECRETS, Acks, close_after_test, event, obj

kafka_broker = brokers.kafka_broker


def make_sink(broker: TansuBroker, name: str = "kafka", **opts: Any) -> KafkaSink:
    options = {"brokers": broker.bootstrap, "linger_ms": 1, **opts}
    sink = KafkaSink.from_options(name, options)
    close_after_test(sink)
    return sink


async def deliver_all(sink: KafkaSink, events: list[ChangeEvent]) -> Acks:
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(f"{i}"))
    assert await sink.flush(30), sink.stats.as_dict()
    return acks


def read(broker: TansuBroker, topic: str, expect: int) -> list[brokers.KafkaRecord]:
    return broker.read_all(topic, expect=expect)


async def test_structured_events_round_trip_field_by_field(kafka_broker: TansuBroker) -> None:
    topic = unique_name("events")
    kafka_broker.create_topic(topic, partitions=2)
    sink = make_sink(kafka_broker, destination=topic)
    await sink.start()
    pod = obj("web-0", uid="u-web", rv="5", labels={"app": "web"}, spec={"nodeName": "n1"})
    pod2 = obj("web-0", uid="u-web", rv="6", labels={"app": "web"}, spec={"nodeName": "n2"})
    secret = obj("creds", uid="u-sec", rv="7", kind="Secret", data={"password": "aHVudGVyMg=="},
                 stringData={"token": "plain"})
    events = [
        event(EventType.ADDED, pod),
        event(EventType.UPDATED, pod2, old=pod),
        event(EventType.ADDED, secret, resource=SECRETS),
        event(EventType.DELETED, pod2),
    ]
    acks = await deliver_all(sink, events)
    assert sorted(acks.outcomes) == [(str(i), DeliveryOutcome.DELIVERED) for i in range(4)]
    assert sink.healthy()
    await sink.close()

    records = await asyncio.to_thread(read, kafka_broker, topic, 4)
    assert len(records) == 4
    by_id = {orjson.loads(r.value or b"")["id"]: r for r in records}
    for ev in events:
        rec = by_id[event_id(ev)]
        assert rec.key == ev.uid.encode()
        assert rec.headers == {"content-type": b"application/cloudevents+json"}
        ce = orjson.loads(rec.value or b"")
        assert ce["specversion"] == "1.0"
        assert ce["type"] == f"io.kube-event-bridge.{ev.type.value}"
        assert ce["source"] == f"/clusters/prod/api/v1/{ev.resource.resource}"
        assert ce["subject"] == f"default/{ev.name}"
        assert ce["time"] == "2023-11-14T22:13:20.250000Z"
        assert ce["datacontenttype"] == "application/json"
        assert (ce["cluster"], ce["kind"], ce["apiversion"]) == ("prod", ev.resource.kind, "v1")
        assert (ce["namespace"], ce["name"], ce["uid"]) == ("default", ev.name, ev.uid)
        assert ce["resourceversion"] == ev.resource_version
    # Same object → same partition, in order.
    pod_records = [r for r in records if r.key == b"u-web"]
    assert len({r.partition for r in pod_records}) == 1
    assert [orjson.loads(r.value or b"")["type"] for r in pod_records] == [
        "io.kube-event-bridge.added", "io.kube-event-bridge.updated", "io.kube-event-bridge.deleted",
    ]
    assert orjson.loads(by_id[event_id(events[1])].value or b"")["data"]["spec"] == {"nodeName": "n2"}
    # Redaction holds in what the broker stores: keys kept, values gone.
    stored_secret = orjson.loads(by_id[event_id(events[2])].value or b"")["data"]
    assert stored_secret["data"] == {"password": REDACTED}
    assert stored_secret["stringData"] == {"token": REDACTED}
    assert b"aHVudGVyMg==" not in (by_id[event_id(events[2])].value or b"")


async def test_binary_mode_puts_attributes_in_ce_headers(kafka_broker: TansuBroker) -> None:
    topic = unique_name("binary")
    kafka_broker.create_topic(topic)
    sink = make_sink(kafka_broker, destination=topic, content_mode="binary", payload="object_and_old")
    await sink.start()
    old = obj("api-1", uid="u-api", rv="10", labels={"tier": "b ä"})
    new = obj("api-1", uid="u-api", rv="11", labels={"tier": "b ä"}, status={"phase": "Running"})
    ev = event(EventType.UPDATED, new, old=old)
    await deliver_all(sink, [ev])
    await sink.close()

    (rec,) = await asyncio.to_thread(read, kafka_broker, topic, 1)
    assert rec.key == b"u-api"
    assert rec.headers["content-type"] == b"application/json"
    assert rec.headers["ce_specversion"] == b"1.0"
    assert rec.headers["ce_id"] == event_id(ev).encode()
    assert rec.headers["ce_type"] == b"io.kube-event-bridge.updated"
    assert rec.headers["ce_subject"] == b"default/api-1"
    assert rec.headers["ce_resourceversion"] == b"11"
    text_headers = {k: v.decode() for k, v in rec.headers.items()}
    decoded = decode_binary(text_headers, rec.value or b"", KAFKA_PREFIX)
    expected = to_cloudevent(ev, data={"object": new, "oldObject": old})
    assert decoded == expected


async def test_per_object_order_holds_across_partitions(kafka_broker: TansuBroker) -> None:
    topic = unique_name("order")
    kafka_broker.create_topic(topic, partitions=4)
    sink = make_sink(kafka_broker, destination=topic, max_in_flight=64)
    await sink.start()
    objects, versions = 40, 8
    events = []
    for v in range(1, versions + 1):
        for i in range(objects):
            o = obj(f"pod-{i}", uid=f"u-{i}", rv=str(v * 1000 + i), spec={"v": v})
            events.append(event(EventType.ADDED if v == 1 else EventType.UPDATED, o))
    acks = await deliver_all(sink, events)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == objects * versions
    await sink.close()

    records = await asyncio.to_thread(read, kafka_broker, topic, objects * versions)
    assert len(records) == objects * versions
    per_key: dict[bytes, list[int]] = collections.defaultdict(list)
    partitions: dict[bytes, set[int]] = collections.defaultdict(set)
    for rec in records:  # sorted by (partition, offset)
        assert rec.key is not None
        per_key[rec.key].append(orjson.loads(rec.value or b"")["data"]["spec"]["v"])
        partitions[rec.key].add(rec.partition)
    assert set(per_key) == {f"u-{i}".encode() for i in range(objects)}
    assert all(seq == list(range(1, versions + 1)) for seq in per_key.values())
    assert all(len(p) == 1 for p in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) > 1  # keys really spread over partitions


async def test_snapshot_topic_is_a_compacted_materialised_view(kafka_broker: TansuBroker) -> None:
    topic, snap = unique_name("main"), unique_name("view")
    sink = make_sink(
        kafka_broker, destination=topic, snapshot_topic=snap, auto_create_topics=True,
        topic_partitions=2, topic_replication_factor=1,
    )
    await sink.start()
    a1, b1 = obj("a", uid="u-a", rv="1"), obj("b", uid="u-b", rv="2")
    a2 = obj("a", uid="u-a", rv="3", spec={"x": 1})
    events = [
        event(EventType.ADDED, a1),
        event(EventType.ADDED, b1),
        event(EventType.UPDATED, a2, old=a1),
        event(EventType.DELETED, b1),
    ]
    await deliver_all(sink, events)
    await sink.close()

    assert kafka_broker.partitions(topic) == 2
    assert kafka_broker.topic_config(snap)["cleanup.policy"] == "compact"
    main = await asyncio.to_thread(read, kafka_broker, topic, 4)
    assert len(main) == 4
    view_records = await asyncio.to_thread(read, kafka_broker, snap, 4)
    view: dict[bytes, Any] = {}
    for rec in view_records:  # per-key order is per-partition order
        assert rec.key is not None
        view[rec.key] = None if rec.value is None else orjson.loads(rec.value)["data"]
    assert view == {b"u-a": a2, b"u-b": None}
    tombstone = next(r for r in view_records if r.value is None)
    assert tombstone.key == b"u-b"
    assert tombstone.headers["content-type"] == b"application/cloudevents+json"


async def test_message_too_large_goes_to_the_dead_letter_topic(kafka_broker: TansuBroker) -> None:
    topic, dlq = unique_name("big"), unique_name("dlq")
    kafka_broker.create_topic(topic)
    kafka_broker.create_topic(dlq)
    # Uncompressed, and the policy that sends nothing in its place (see tests/sinks/test_oversize.py).
    sink = make_sink(kafka_broker, destination=topic, dead_letter={"kind": "kafka", "target": dlq},
                     compression="none", oversize="dead_letter")
    await sink.start()
    huge = obj("huge", uid="u-huge", rv="9", metadata_blob="x" * 1_200_000)
    small = obj("small", uid="u-small", rv="10")
    acks = await deliver_all(sink, [event(EventType.ADDED, huge), event(EventType.ADDED, small)])
    assert sorted(acks.outcomes) == [("0", DeliveryOutcome.DEAD_LETTERED), ("1", DeliveryOutcome.DELIVERED)]
    assert sink.stats.dead_lettered == 1
    await sink.close()

    (stored,) = await asyncio.to_thread(read, kafka_broker, topic, 1)
    assert stored.key == b"u-small"
    (dead,) = await asyncio.to_thread(read, kafka_broker, dlq, 1)
    assert dead.key == b"u-huge"
    record = orjson.loads(dead.value or b"")
    assert "MSG_SIZE_TOO_LARGE" in record["reason"]
    assert dead.headers["reason"] == record["reason"].encode()
    assert record["event_id"] == event_id(event(EventType.ADDED, huge))
    assert record["destination"] == topic
    assert record["message"] is None
    assert record["message_bytes"] > 1_200_000


async def test_message_too_large_goes_to_a_dead_letter_file(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    topic = unique_name("bigfile")
    kafka_broker.create_topic(topic)
    dlq = tmp_path / "dead.jsonl"
    sink = make_sink(kafka_broker, destination=topic, max_message_bytes=5000, compression="none",
                     oversize="dead_letter", dead_letter={"kind": "file", "target": str(dlq)})
    await sink.start()
    big = obj("big", uid="u-big", rv="3", blob="y" * 6000)
    acks = await deliver_all(sink, [event(EventType.ADDED, big)])
    assert acks.outcomes == [("0", DeliveryOutcome.DEAD_LETTERED)]
    await sink.close()
    (line,) = dlq.read_bytes().splitlines()
    record = orjson.loads(line)
    assert "MSG_SIZE_TOO_LARGE" in record["reason"]
    assert record["message"]["data"]["blob"] == "y" * 6000
    assert record["key"] == "u-big"


async def test_topic_template_is_sanitised_per_field(kafka_broker: TansuBroker) -> None:
    prefix = unique_name("tpl")
    sink = make_sink(kafka_broker, destination=prefix + ".{namespace}.{labels[app]}", auto_create_topics=True,
                     topic_partitions=1, topic_replication_factor=1)
    await sink.start()
    ev = event(EventType.ADDED, obj("w", namespace="team a", uid="u-w", labels={"app": "web/v2"}))
    await deliver_all(sink, [ev])
    await sink.close()
    (rec,) = await asyncio.to_thread(read, kafka_broker, f"{prefix}.team_a.web_v2", 1)
    assert rec.key == b"u-w"


async def test_secret_files_are_read_at_start(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    secret = tmp_path / "client-id"
    secret.write_text("from-a-file\n")
    sink = make_sink(kafka_broker, secret_files={"client.id": str(secret)})
    await sink.start()
    assert sink.kafka.client is not None
    assert sink.kafka.client.config["client.id"] == "from-a-file"
    await sink.close()
    missing = make_sink(kafka_broker, secret_files={"sasl.password": str(tmp_path / "nope")})
    with pytest.raises(SinkConfigError, match=r"secret_files\['sasl.password'\]: cannot read"):
        await missing.start()
    await missing.close()


def test_bad_configuration_fails_with_a_clear_message() -> None:
    with pytest.raises(SinkConfigError, match=r"sink 'k' \(kafka\): brokers: Field required"):
        KafkaSink.from_options("k", {})
    with pytest.raises(SinkConfigError, match="idempotent producer needs acks 'all'"):
        KafkaSink.from_options("k", {"brokers": "x:1", "acks": "1"})
    with pytest.raises(SinkConfigError, match="dead_letter: kind 'nats' is not supported"):
        KafkaSink.from_options("k", {"brokers": "x:1", "dead_letter": {"kind": "nats", "target": "s"}})
    with pytest.raises(SinkConfigError, match="unknown template field 'pod'"):
        KafkaSink.from_options("k", {"brokers": "x:1", "destination": "t.{pod}"})
    with pytest.raises(SinkConfigError, match="compression"):
        KafkaSink.from_options("k", {"brokers": "x:1", "compression": "brotli"})
    mapping = {"brokers": "b:9", "librdkafka": {"linger.ms": 50}}
    opts = KafkaSinkOptions.from_mapping("k", mapping, kind="kafka")
    conf = opts.producer_config()
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert conf["message.timeout.ms"] == 0
    assert conf["linger.ms"] == 50  # passthrough wins
    with pytest.raises(SinkConfigError, match=r"destination: 'k8s events\.\{resource\}' is not a valid"):
        KafkaSink.from_options("k", {"brokers": "x:1", "destination": "k8s events.{resource}"})
    with pytest.raises(SinkConfigError, match=r"snapshot_topic: 'state/all' is not a valid Kafka topic"):
        KafkaSink.from_options("k", {"brokers": "x:1", "snapshot_topic": "state/all"})
    with pytest.raises(SinkConfigError, match=r"dead_letter\.target: 'dl q' is not a valid Kafka topic"):
        KafkaSink.from_options("k", {"brokers": "x:1", "dead_letter": {"kind": "kafka", "target": "dl q"}})
    assert KafkaSink.from_options("k", {"brokers": "x:1", "destination": "{resource}"}).name == "k"
    alias = KafkaSinkOptions.from_mapping("k", {"bootstrap_servers": "k:9092"}, kind="kafka")
    assert alias.producer_config()["bootstrap.servers"] == "k:9092"


def test_registered_kind_builds_the_kafka_sink() -> None:
    from sinks.registry import create_sink

    sink = create_sink("kafka", "audit", {"bootstrap_servers": "k:9092"})
    assert isinstance(sink, KafkaSink)
    assert sink.options.brokers == "k:9092"


async def test_invalid_librdkafka_setting_fails_at_start() -> None:
    sink = KafkaSink.from_options("k", {"brokers": "127.0.0.1:1", "librdkafka": {"no.such.setting": "1"}})
    with pytest.raises(SinkConfigError, match=r"sink 'k' \(kafka\): .*no.such.setting"):
        await sink.start()
    await sink.close()


async def test_readiness_comes_back_without_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sinks.kafka_producer._PROBE_INTERVAL", 0.3)
    port = free_port()
    sink = make_sink(TansuBroker(binary="", port=port), connect_timeout=0.5)
    await sink.start()
    assert not sink.healthy()
    with brokers.running_tansu(port=port):
        for _ in range(200):
            if sink.healthy():
                break
            await asyncio.sleep(0.1)
        assert sink.healthy()


async def test_unreachable_broker_does_not_fail_start_but_is_unhealthy() -> None:
    sink = KafkaSink.from_options("k", {"brokers": f"127.0.0.1:{free_port()}", "connect_timeout": 0.5})
    await sink.start()
    assert not sink.healthy()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("p", uid="u-p")), acks.cb("p"))
    assert not await sink.flush(0.3)  # kept and retried by librdkafka, not failed
    assert acks.outcomes == []
    await sink.close()
    assert acks.outcomes == []  # unacked: re-sent after a restart


async def test_records_are_produced_without_a_task_per_event(kafka_broker: TansuBroker) -> None:
    topic = unique_name("pipelined")
    kafka_broker.create_topic(topic, partitions=2)
    sink = make_sink(kafka_broker, destination=topic, max_in_flight=500)
    await sink.start()
    tasks_before = {t.get_name() for t in asyncio.all_tasks()}
    acks = Acks()
    for i in range(300):  # 30 objects, 10 versions each, all accepted at once
        o = obj(f"pod-{i % 30}", uid=f"u-{i % 30}", rv=str(i + 1), spec={"v": i // 30})
        await sink.deliver(event(EventType.ADDED, o), acks.cb(str(i)))
    assert sink.stats.in_flight > 0
    assert {t.get_name() for t in asyncio.all_tasks()} == tasks_before  # produce() + delivery reports
    assert await sink.flush(30)
    assert sorted(acks.of(DeliveryOutcome.DELIVERED), key=int) == [str(i) for i in range(300)]
    await sink.close()
    records = await asyncio.to_thread(read, kafka_broker, topic, 300)
    per_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for rec in records:
        assert rec.key is not None
        per_key[rec.key].append(orjson.loads(rec.value or b"")["data"]["spec"]["v"])
    assert per_key == {f"u-{i}".encode(): list(range(10)) for i in range(30)}
