"""NatsSink writes a pass's publishes into nats-py's buffer itself (no coroutine per message): what a
subscriber receives is what nats-py's own ``publish`` sends, and its checks still apply."""

from __future__ import annotations

import nats
import pytest

from sinks.cloudevents import decode_binary
from sinks.contract import DeliveryOutcome, EventType
from sinks.nats import NatsSink
from sinks.nats_base import header_block
from tests.brokers import NatsServer, subscribed
from tests.sinks import Acks, event, obj
from tests.sinks.test_nats_sink import Collector, collector, make_sink, nats_server

__all__ = ["collector", "nats_server"]


def test_header_block_is_what_nats_py_sends() -> None:
    assert header_block({"content-type": "application/json", " ce-id ": " a\r\nb "}) == (
        b"NATS/1.0\r\ncontent-type: application/json\r\nce-id: a  b\r\n\r\n")
    assert header_block({"": "skipped"}) == b"NATS/1.0\r\n\r\n"
    with pytest.raises(ValueError, match="invalid header name"):
        header_block({"bad name": "x"})


async def test_published_in_one_pass_and_read_back_exactly(
    nats_server: NatsServer, collector: Collector
) -> None:
    sink = make_sink(nats_server.url, destination="direct.{name}", content_mode="binary",
                     reconnect_buffer_bytes=4096)  # smaller than a pass: the buffer is written mid-pass
    await sink.start()
    events = [event(EventType.ADDED, obj(f"p{i}", uid=f"u{i}", rv=str(i + 1), blob="x" * 500))
              for i in range(50)]
    acks = Acks()
    await sink.deliver_batch(events, [acks.cb(str(i)) for i in range(50)])
    assert await sink.flush(10)
    assert sorted(acks.outcomes) == sorted((str(i), DeliveryOutcome.DELIVERED) for i in range(50))
    msgs = await collector.wait_for(50)
    assert [m.subject for m in msgs] == [f"direct.p{i}" for i in range(50)]
    for m, ev in zip(msgs, events, strict=True):
        ce = decode_binary(dict(m.headers or {}), m.data)
        assert ce["subject"] == f"default/{ev.name}"
        assert ce["data"]["blob"] == "x" * 500
    nc = sink.nats.conn.client
    assert nc is not None
    assert nc.stats["out_msgs"] >= 50  # nats-py's statistics count them as its publish would
    await sink.close()


async def test_plain_nats_py_subscriber_sees_headers_as_sent(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    sub = await subscribed(nc, "hdr.>")
    sink: NatsSink = make_sink(nats_server.url, destination="hdr.{name}")
    await sink.start()
    await sink.deliver_batch([event(EventType.ADDED, obj("h"))], [lambda _o: None])
    assert await sink.flush(5)
    msg = await sub.next_msg(timeout=5)
    assert msg.headers == {"content-type": "application/cloudevents+json"}
    await sink.close()
    await nc.close()
