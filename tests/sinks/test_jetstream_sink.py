"""JetStreamSink against a real nats-server -js: what the stream stores is read back exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from nats.js.api import StorageType, StreamConfig

from sinks.cloudevents import event_id
from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.nats import JetStreamSink
from sinks.redaction import REDACTED
from tests import brokers
from tests.brokers import NatsServer, subscribed
from tests.sinks import SECRETS, Acks, close_after_test, event, obj

nats_server = brokers.nats_server


def make_sink(url: str, name: str = "js", **opts: Any) -> JetStreamSink:
    sink = JetStreamSink.from_options(name, {"servers": [url], **opts})
    close_after_test(sink)
    return sink


async def stored(url: str, stream: str) -> list[Any]:
    """Every message of ``stream`` in sequence order."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        return [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
    finally:
        await nc.close()


async def test_created_stream_stores_events_with_msg_id(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, stream={"name": "KUBE", "create": True, "duplicate_window": 60})
    await sink.start()
    nc = await nats.connect(nats_server.url)
    info = await nc.jetstream().stream_info("KUBE")
    await nc.close()
    assert info.config.subjects == ["k8s.*.*.*"]
    assert info.config.duplicate_window == 60
    assert info.config.storage == StorageType.FILE

    pod = obj("web-0", uid="u-w", rv="2", spec={"a": 1})
    secret = obj("s", uid="u-s", rv="3", kind="Secret", stringData={"pw": "x"})
    events = [event(EventType.ADDED, pod), event(EventType.ADDED, secret, resource=SECRETS),
              event(EventType.DELETED, pod)]
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(5)
    assert sorted(acks.outcomes) == [(str(i), DeliveryOutcome.DELIVERED) for i in range(3)]

    msgs = await stored(nats_server.url, "KUBE")
    assert len(msgs) == 3
    by_id = {m.headers["Nats-Msg-Id"]: m for m in msgs}
    assert set(by_id) == {event_id(ev) for ev in events}
    for ev in events:
        m = by_id[event_id(ev)]
        assert m.subject == f"k8s.{ev.resource.resource}.default.{ev.name}"
        assert m.headers["content-type"] == "application/cloudevents+json"
        assert m.headers["Nats-Expected-Stream"] == "KUBE"
        ce = orjson.loads(m.data)
        assert ce["id"] == event_id(ev)
        assert ce["type"] == f"io.kube-event-bridge.{ev.type.value}"
        assert ce["resourceversion"] == ev.resource_version
    assert orjson.loads(by_id[event_id(events[1])].data)["data"]["stringData"] == {"pw": REDACTED}
    pod_seq = [orjson.loads(m.data)["type"] for m in msgs if m.subject == "k8s.pods.default.web-0"]
    assert pod_seq == ["io.kube-event-bridge.added", "io.kube-event-bridge.deleted"]


async def test_the_same_event_twice_is_stored_once(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, destination="dedup.{name}",
                     stream={"name": "DEDUP", "create": True, "storage": "memory"})
    await sink.start()
    ev = event(EventType.UPDATED, obj("a", uid="u-a", rv="42", spec={"n": 2}),
               old=obj("a", uid="u-a", rv="41", spec={"n": 1}))
    acks = Acks()
    await sink.deliver(ev, acks.cb("first"))
    await sink.deliver(ev, acks.cb("again"))
    assert await sink.flush(5)
    assert acks.outcomes == [("first", DeliveryOutcome.DELIVERED), ("again", DeliveryOutcome.DELIVERED)]
    msgs = await stored(nats_server.url, "DEDUP")
    assert len(msgs) == 1
    assert msgs[0].headers["Nats-Msg-Id"] == event_id(ev)


async def test_per_object_order_in_the_stream(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, max_in_flight=40, stream={"name": "ORDER", "create": True})
    await sink.start()
    acks = Acks()
    for v in range(1, 6):
        for i in range(25):
            o = obj(f"p{i}", uid=f"u{i}", rv=str(v * 100 + i), spec={"v": v})
            await sink.deliver(event(EventType.UPDATED if v > 1 else EventType.ADDED, o), acks.cb("x"))
    assert await sink.flush(10)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 125
    msgs = await stored(nats_server.url, "ORDER")
    per_subject: dict[str, list[int]] = {}
    for m in msgs:
        per_subject.setdefault(m.subject, []).append(orjson.loads(m.data)["data"]["spec"]["v"])
    assert len(per_subject) == 25
    assert all(seq == [1, 2, 3, 4, 5] for seq in per_subject.values())


async def test_message_rejected_by_the_stream_goes_to_the_dead_letter_file(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    dlq = tmp_path / "dlq.jsonl"
    sink = make_sink(nats_server.url, stream={"name": "SMALL", "create": True, "max_msg_size": 2000},
                     dead_letter={"kind": "file", "target": str(dlq)})
    await sink.start()
    big = obj("big", uid="u-b", rv="1", blob="q" * 3000)
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, big), acks.cb("big"))
    await sink.deliver(event(EventType.ADDED, obj("small", uid="u-s")), acks.cb("small"))
    assert await sink.flush(5)
    assert sorted(acks.outcomes) == [
        ("big", DeliveryOutcome.DEAD_LETTERED), ("small", DeliveryOutcome.DELIVERED),
    ]
    (line,) = dlq.read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["event_id"] == event_id(event(EventType.ADDED, big))
    assert "jetstream rejected the message" in record["reason"]
    assert record["message"]["data"]["blob"] == "q" * 3000
    assert [m.subject for m in await stored(nats_server.url, "SMALL")] == ["k8s.pods.default.small"]


async def test_dead_letter_subject_captured_by_a_stream_is_stored(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    await nc.jetstream().add_stream(StreamConfig(name="DLQ", subjects=["dlq.>"]))
    await nc.close()
    sink = make_sink(nats_server.url, stream={"name": "LIMITED", "create": True, "max_msg_size": 1500},
                     dead_letter={"kind": "nats", "target": "dlq.kube"})
    await sink.start()
    big = obj("big", uid="u-b", rv="7", blob="w" * 2000)
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, big), acks.cb("big"))
    assert await sink.flush(5)
    assert acks.outcomes == [("big", DeliveryOutcome.DEAD_LETTERED)]
    (dead,) = await stored(nats_server.url, "DLQ")
    assert dead.subject == "dlq.kube"
    assert dead.headers["Nats-Msg-Id"] == "dlq-" + event_id(event(EventType.ADDED, big))
    assert orjson.loads(dead.data)["message"]["data"]["blob"] == "w" * 2000


async def test_existing_stream_is_used_and_bad_stream_fails_at_start(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    await nc.jetstream().add_stream(StreamConfig(name="MINE", subjects=["mine.>"]))
    await nc.close()
    sink = make_sink(nats_server.url, destination="mine.{namespace}.{name}",
                     stream={"name": "MINE", "create": True})
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("x")), acks.cb("x"))
    assert await sink.flush(5)
    assert [m.subject for m in await stored(nats_server.url, "MINE")] == ["mine.default.x"]
    clash = make_sink(nats_server.url, name="clash", destination="mine.{name}",
                      stream={"name": "OTHER", "create": True})
    with pytest.raises(SinkConfigError, match=r"sink 'clash' \(jetstream\): stream 'OTHER': cannot create"):
        await clash.start()


async def test_mutual_tls(tmp_path: Path) -> None:
    tls = brokers.make_tls_files(tmp_path)
    args = ("--tlsverify", "--tlscert", tls.server_cert, "--tlskey", tls.server_key, "--tlscacert", tls.ca)
    with brokers.running_nats(*args) as server:
        url = f"tls://127.0.0.1:{server.port}"
        sink = make_sink(url, tls_ca_file=tls.ca, tls_cert_file=tls.client_cert, tls_key_file=tls.client_key,
                         stream={"name": "TLS", "create": True})
        await sink.start()
        acks = Acks()
        await sink.deliver(event(EventType.ADDED, obj("secure")), acks.cb("s"))
        assert await sink.flush(5)
        assert acks.outcomes == [("s", DeliveryOutcome.DELIVERED)]
        no_cert = make_sink(url, name="nocert", tls_ca_file=tls.ca, connect_timeout=1)
        await no_cert.start()  # the handshake is refused: not a credentials error, retried in background
        assert not no_cert.healthy()
        with pytest.raises(SinkConfigError, match="TLS files"):
            await make_sink(url, name="badca", tls_ca_file=str(tmp_path / "missing.crt")).start()


def test_stream_options_are_validated() -> None:
    servers = ["nats://x:1"]
    with pytest.raises(SinkConfigError, match=r"stream\.name"):
        JetStreamSink.from_options("j", {"servers": servers, "stream": {"name": "a.b"}})
    with pytest.raises(SinkConfigError, match=r"stream\.storage"):
        JetStreamSink.from_options("j", {"servers": servers, "stream": {"name": "S", "storage": "disk"}})


async def test_lost_puback_times_out_and_is_retried_with_the_same_msg_id(nats_server: NatsServer) -> None:
    # A responder in place of a stream: it swallows the first publish (its PubAck is "lost") and
    # acknowledges the retry.
    nc = await nats.connect(nats_server.url)
    seen: list[tuple[str, str]] = []

    async def respond(msg: Any) -> None:
        seen.append((msg.subject, msg.headers["Nats-Msg-Id"]))
        if len(seen) > 1:
            await msg.respond(b'{"stream":"FAKE","seq":1}')

    await subscribed(nc, "k8s.pods.default.*", cb=respond)
    sink = make_sink(nats_server.url, publish_timeout=0.3, retry={"initial": 0.01, "max": 0.01})
    await sink.start()
    acks = Acks()
    ev = event(EventType.ADDED, obj("web-0", uid="u-w"))
    await sink.deliver(ev, acks.cb("web-0"))
    assert await sink.flush(5)
    await nc.close()
    assert acks.outcomes == [("web-0", DeliveryOutcome.DELIVERED)]
    assert seen == [("k8s.pods.default.web-0", event_id(ev))] * 2
    assert sink.stats.retries == 1


async def test_no_stream_yet_is_retried_until_one_captures_the_subject(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, destination="late.{name}", retry={"initial": 0.02, "max": 0.05})
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("web-0", uid="u-w")), acks.cb("web-0"))
    assert not await sink.flush(0.3)  # no stream answers: not acked, retried
    assert acks.outcomes == []
    assert sink.stats.retries >= 2
    assert not sink.healthy()
    nc = await nats.connect(nats_server.url)
    await nc.jetstream().add_stream(StreamConfig(name="LATE", subjects=["late.>"]))
    await nc.close()
    assert await sink.flush(5)
    assert acks.outcomes == [("web-0", DeliveryOutcome.DELIVERED)]
    assert sink.healthy()
    assert [m.subject for m in await stored(nats_server.url, "LATE")] == ["late.web-0"]
