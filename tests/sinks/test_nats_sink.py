"""NatsSink (core publish) against a real nats-server: subscribers receive exactly what was sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from nats.aio.msg import Msg

from sinks.cloudevents import HTTP_PREFIX, decode_binary, event_id, to_cloudevent
from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.nats import NatsSink, stream_subjects_for
from sinks.redaction import REDACTED
from tests import brokers
from tests.brokers import NatsServer, running_nats, subscribed
from tests.sinks import NODES, SECRETS, Acks, close_after_test, event, obj

nats_server = brokers.nats_server


def make_sink(url: str, name: str = "nats", **opts: Any) -> NatsSink:
    sink = NatsSink.from_options(name, {"servers": [url], **opts})
    close_after_test(sink)
    return sink


class Collector:
    """Subscribes on its own connection and keeps every message received."""

    def __init__(self) -> None:
        self.msgs: list[Msg] = []
        self.nc: Any = None
        self._arrived = asyncio.Event()

    async def start(self, url: str, subject: str = ">") -> None:
        self.nc = await nats.connect(url)

        async def cb(msg: Msg) -> None:
            self.msgs.append(msg)
            self._arrived.set()

        await subscribed(self.nc, subject, cb=cb)

    async def wait_for(self, n: int, timeout: float = 5.0) -> list[Msg]:
        async with asyncio.timeout(timeout):
            while len(self.msgs) < n:
                self._arrived.clear()
                await self._arrived.wait()
        return self.msgs

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


@pytest.fixture
async def collector(nats_server: NatsServer) -> AsyncIterator[Collector]:
    c = Collector()
    await c.start(nats_server.url)
    yield c
    await c.close()


async def test_structured_events_arrive_on_per_object_subjects(
    nats_server: NatsServer, collector: Collector
) -> None:
    sink = make_sink(nats_server.url)
    await sink.start()
    assert sink.healthy()
    pod = obj("web.v1*", uid="u-w", rv="3", labels={"app": "web"})
    node = obj("node-1", namespace=None, uid="u-n", rv="4", kind="Node")
    secret = obj("creds", uid="u-s", rv="5", kind="Secret", data={"k": "c2VjcmV0"})
    events = [event(EventType.ADDED, pod), event(EventType.ADDED, node, resource=NODES),
              event(EventType.ADDED, secret, resource=SECRETS)]
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(5)
    assert sorted(acks.outcomes) == [(str(i), DeliveryOutcome.DELIVERED) for i in range(3)]

    msgs = await collector.wait_for(3)
    by_subject = {m.subject: m for m in msgs}
    # Dots and wildcards in names do not break the subject; cluster-scoped objects get "_".
    assert set(by_subject) == {"k8s.pods.default.web_v1_", "k8s.nodes._.node-1", "k8s.secrets.default.creds"}
    ce = orjson.loads(by_subject["k8s.pods.default.web_v1_"].data)
    assert ce["id"] == event_id(events[0])
    assert ce["subject"] == "default/web.v1*"
    assert ce["type"] == "io.kube-event-bridge.added"
    assert ce["data"] == pod
    assert by_subject["k8s.pods.default.web_v1_"].headers == {"content-type": "application/cloudevents+json"}
    node_ce = orjson.loads(by_subject["k8s.nodes._.node-1"].data)
    assert node_ce["subject"] == "node-1"
    assert "namespace" not in node_ce
    assert orjson.loads(by_subject["k8s.secrets.default.creds"].data)["data"]["data"] == {"k": REDACTED}


async def test_binary_mode_uses_ce_dash_headers(nats_server: NatsServer, collector: Collector) -> None:
    sink = make_sink(nats_server.url, content_mode="binary", destination="events.{kind}")
    await sink.start()
    ev = event(EventType.DELETED, obj("gone", uid="u-g", rv="8"))
    acks = Acks()
    await sink.deliver(ev, acks.cb("d"))
    assert await sink.flush(5)
    (msg,) = await collector.wait_for(1)
    assert msg.subject == "events.Pod"
    assert msg.headers is not None
    assert msg.headers["ce-id"] == event_id(ev)
    assert msg.headers["ce-type"] == "io.kube-event-bridge.deleted"
    assert msg.headers["content-type"] == "application/json"
    assert decode_binary(msg.headers, msg.data, HTTP_PREFIX) == to_cloudevent(ev)


async def test_per_object_order_is_kept(nats_server: NatsServer, collector: Collector) -> None:
    sink = make_sink(nats_server.url, max_in_flight=50)
    await sink.start()
    acks = Acks()
    for v in range(1, 6):
        for i in range(20):
            o = obj(f"p{i}", uid=f"u{i}", rv=str(v * 100 + i), spec={"v": v})
            await sink.deliver(event(EventType.UPDATED if v > 1 else EventType.ADDED, o), acks.cb("x"))
    assert await sink.flush(10)
    msgs = await collector.wait_for(100)
    per_subject: dict[str, list[int]] = {}
    for m in msgs:
        per_subject.setdefault(m.subject, []).append(orjson.loads(m.data)["data"]["spec"]["v"])
    assert len(per_subject) == 20
    assert all(seq == [1, 2, 3, 4, 5] for seq in per_subject.values())


async def test_too_large_for_max_payload_goes_to_the_dead_letter_subject(
    nats_server: NatsServer, collector: Collector
) -> None:
    dlq = {"kind": "nats", "target": "dlq.pods"}
    sink = make_sink(nats_server.url, destination="ev.{name}", dead_letter=dlq, oversize="dead_letter")
    await sink.start()
    huge = obj("huge", uid="u-h", rv="1", blob="z" * 1_100_000)
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, huge), acks.cb("huge"))
    await sink.deliver(event(EventType.ADDED, obj("ok", uid="u-ok")), acks.cb("ok"))
    assert await sink.flush(5)
    assert sorted(acks.outcomes) == [
        ("huge", DeliveryOutcome.DEAD_LETTERED), ("ok", DeliveryOutcome.DELIVERED),
    ]
    msgs = await collector.wait_for(2)
    dead = next(m for m in msgs if m.subject == "dlq.pods")
    record = orjson.loads(dead.data)
    assert "too large" in record["reason"]
    assert record["event_id"] == event_id(event(EventType.ADDED, huge))
    assert record["destination"] == "ev.huge"
    assert record["message"] is None
    assert record["message_bytes"] > 1_100_000
    assert dead.headers is not None
    assert dead.headers["reason"] == record["reason"]
    assert [m.subject for m in msgs if m.subject != "dlq.pods"] == ["ev.ok"]


async def test_token_and_password_auth(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    with running_nats("--auth", "s3cr3t-token") as server:
        good = make_sink(server.url, token_file=str(token))
        await good.start()
        acks = Acks()
        await good.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
        assert await good.flush(5)
        assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
        wrong = tmp_path / "wrong"
        wrong.write_text("nope")
        bad = make_sink(server.url, name="bad", token_file=str(wrong))
        with pytest.raises(SinkConfigError, match="sink 'bad': NATS rejected the credentials"):
            await bad.start()
    password = tmp_path / "pw"
    password.write_text("hunter2")
    with running_nats("--user", "bridge", "--pass", "hunter2") as server:
        sink = make_sink(server.url, user="bridge", password_file=str(password))
        await sink.start()
        assert sink.healthy()


async def test_server_down_at_start_connects_later_and_delivers(tmp_path: Path) -> None:
    with running_nats(start=False) as server:
        sink = make_sink(server.url, reconnect_wait=0.1, connect_timeout=0.5)
        await sink.start()  # does not fail: the server is merely down
        assert not sink.healthy()
        acks = Acks()
        deliver = asyncio.create_task(sink.deliver(event(EventType.ADDED, obj("late")), acks.cb("late")))
        await deliver
        await asyncio.sleep(0.3)
        assert acks.outcomes == []
        server.start()
        c = Collector()
        await c.start(server.url)
        try:
            assert await sink.flush(15)
            assert acks.outcomes == [("late", DeliveryOutcome.DELIVERED)]
            assert sink.healthy()
        finally:
            await c.close()


def test_bad_configuration_fails_with_a_clear_message() -> None:
    with pytest.raises(SinkConfigError, match=r"sink 'n' \(nats\): servers: Field required"):
        NatsSink.from_options("n", {})
    with pytest.raises(SinkConfigError, match="choose one authentication method"):
        NatsSink.from_options("n", {"servers": ["nats://x:1"], "token_file": "/t", "creds_file": "/c"})
    with pytest.raises(SinkConfigError, match="user and password_file go together"):
        NatsSink.from_options("n", {"servers": ["nats://x:1"], "user": "u"})
    with pytest.raises(SinkConfigError, match="not a valid NATS subject"):
        NatsSink.from_options(
            "n", {"servers": ["nats://x:1"], "dead_letter": {"kind": "nats", "target": "a.*"}}
        )
    with pytest.raises(SinkConfigError, match="unknown template field 'pod'"):
        NatsSink.from_options("n", {"servers": ["nats://x:1"], "destination": "a.{pod}"})
    for bad in ("k8s..{name}", "k8s.*.{name}", "events >", ".{name}"):
        with pytest.raises(SinkConfigError, match="is not a NATS subject"):
            NatsSink.from_options("n", {"servers": ["nats://x:1"], "destination": bad})
    assert stream_subjects_for("k8s.{resource}.{namespace}.{name}") == ["k8s.*.*.*"]
    assert stream_subjects_for("audit.x-{cluster}.all") == ["audit.*.all"]


def test_registered_kinds_build_the_nats_sinks() -> None:
    from sinks.nats import JetStreamSink
    from sinks.registry import create_sink

    assert isinstance(create_sink("nats", "n", {"servers": ["nats://x:1"]}), NatsSink)
    assert isinstance(create_sink("jetstream", "j", {"servers": ["nats://x:1"]}), JetStreamSink)


async def test_missing_secret_file_fails_at_start(tmp_path: Path) -> None:
    sink = make_sink("nats://127.0.0.1:1", token_file=str(tmp_path / "missing"))
    with pytest.raises(SinkConfigError, match="token_file: cannot read"):
        await sink.start()
