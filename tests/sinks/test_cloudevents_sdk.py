"""Conformance with the official CloudEvents SDK (``cloudevents`` on PyPI): every sink's output, in
every content mode, read back the way a consumer reads it — the file sink's lines, webhook
requests (structured, binary, batch) received by a real HTTP server, Kafka records (binary and
structured, through the SDK's Kafka binding) read from a real Tansu broker, NATS messages from a real
nats-server (structured; binary through the HTTP binding's rules, which NATS headers follow: the SDK
has no NATS binding) — for every event type, native and Knative. Each parsed event must equal the
event the sink built, attribute by attribute, with a ``source`` that is a valid URI-reference and
non-ASCII attribute values intact.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from bridge.rawobject import Change, RawObject
from bridge.testing import WebhookReceiver
from sinks.base import BaseSink
from sinks.contract import ChangeEvent, EventType, SnapshotInfo
from sinks.file import FileSink
from sinks.kafka import KafkaSink
from sinks.nats import NatsSink
from sinks.webhook import WebhookSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, subscribed, unique_name
from tests.sinks import NODES, PODS, Acks

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server

FMT = JSONFormat()
MANAGER = "bötchen-ünïcode/\u03c1"  # a field manager name is free text: not ASCII, with a slash
T = 1_714_564_800.5


def _pod(name: str, rv: str, phase: str) -> RawObject:
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "resourceVersion": rv,
                        "labels": {"app": "web"}, "annotations": {"note": "grüße \"quoted\" %41"}},
           "status": {"phase": phase}}
    raw = RawObject.from_dict(obj)
    raw.change = Change(MANAGER, "Update", "status", "2024-05-01T12:00:00Z")
    return raw


def events() -> list[ChangeEvent]:
    v1, v2 = _pod("web-0", "10", "Pending"), _pod("web-0", "11", "Running")
    node = RawObject.from_dict({"apiVersion": "v1", "kind": "Node",
                                "metadata": {"name": "n1", "uid": "uid-n1", "resourceVersion": "3"}})
    snap = SnapshotInfo(id="pods:12:abc", resource_version="12")
    end = SnapshotInfo(id="pods:12:abc", resource_version="12", count=1)
    return [
        ChangeEvent(type=EventType.ADDED, resource=PODS, cluster="eu-1", obj=v1, time=T),
        ChangeEvent(type=EventType.UPDATED, resource=PODS, cluster="eu-1", obj=v2, old=v1, time=T),
        ChangeEvent(type=EventType.ADDED, resource=NODES, cluster="eu-1", obj=node, time=T),
        ChangeEvent(type=EventType.SNAPSHOT_BEGIN, resource=PODS, cluster="eu-1", obj=None, time=T,
                    snapshot=snap),
        ChangeEvent(type=EventType.SYNC, resource=PODS, cluster="eu-1", obj=v2, time=T, snapshot=snap),
        ChangeEvent(type=EventType.SNAPSHOT_END, resource=PODS, cluster="eu-1", obj=None, time=T,
                    snapshot=end),
        ChangeEvent(type=EventType.DELETED, resource=PODS, cluster="eu-1", obj=v2, time=T,
                    final_state_unknown=True),
    ]


_URI_REFERENCE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?(//[A-Za-z0-9._~%!$&'()*+,;=:@-]*)?"
                            r"[A-Za-z0-9._~%!$&'()*+,;=:@/-]*(\?[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*)?$")


def normalized(ev: BaseCloudEvent) -> dict[str, Any]:
    """The SDK's view of an event: its attributes (time as a UTC datetime) and its data."""
    attrs = dict(ev.get_attributes())
    attrs.pop("partitionkey", None)  # the SDK's Kafka binding adds the record key
    time = attrs.get("time")
    assert isinstance(time, datetime)
    attrs["time"] = time.astimezone(UTC)
    data = ev.get_data()
    if isinstance(data, (bytes, str)):
        data = orjson.loads(data)
    return {**attrs, "data": data}


def expected(sink: BaseSink[Any]) -> list[dict[str, Any]]:
    """What the sink built for each event (its own encoding, decoded), as the SDK would show it."""
    out = []
    for ev in events():
        if ev.obj is None and sink.options.compat == "knative":
            continue  # Knative mode sends no snapshot markers
        msg = sink._build(ev, lambda _: None)
        ce = msg.cloudevent
        ce["time"] = datetime.fromisoformat(ce["time"]).astimezone(UTC)
        out.append(ce)
    return out


def check(parsed: list[dict[str, Any]], sink: BaseSink[Any]) -> None:
    want = expected(sink)
    key = lambda e: (e["type"], e["id"])  # noqa: E731
    assert sorted(parsed, key=key) == sorted(want, key=key)
    for e in parsed:
        assert _URI_REFERENCE.match(e["source"]), e["source"]
        assert e["specversion"] == "1.0"
        assert e["time"] == datetime.fromtimestamp(T, UTC)
        if e.get("kind") == "Pod" and "snapshotid" not in e:  # added, updated, deleted
            assert (e["manager"], e["operation"], e["subresource"]) == (MANAGER, "Update", "status")
    types = {e["type"] for e in parsed}
    assert len(types) >= 3


async def deliver(sink: BaseSink[Any]) -> None:
    await sink.start()
    acks = Acks()
    for i, ev in enumerate(events()):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(30)
    assert len(acks.outcomes) == len(events())


COMPATS = ["native", "knative", "knative-reference"]


def compat_options(compat: str) -> dict[str, str]:
    if compat == "knative-reference":
        return {"compat": "knative", "knative_mode": "reference"}
    return {"compat": compat}


@pytest.mark.parametrize("compat", COMPATS)
async def test_file_sink_lines_parse_with_the_sdk(tmp_path: Path, compat: str) -> None:
    path = tmp_path / "events.jsonl"
    sink = FileSink.from_options("file", {"path": str(path), **compat_options(compat)})
    try:
        await deliver(sink)
    finally:
        await sink.close()
    parsed = [normalized(FMT.read(None, line)) for line in path.read_bytes().splitlines()]
    check(parsed, sink)


@pytest.fixture
async def server() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver() as receiver:
        yield receiver


@pytest.mark.parametrize(
    ("mode", "compat"),
    # Knative mode is one event per request (a batch with it is refused: test_webhook_concurrency).
    [(mode, compat) for mode in ("structured", "binary", "batch") for compat in COMPATS
     if mode != "batch" or compat == "native"],
)
async def test_webhook_requests_parse_with_the_sdk(
    server: WebhookReceiver, mode: str, compat: str
) -> None:
    opts: dict[str, Any] = {"url": server.url, **compat_options(compat)}
    if mode == "batch":
        opts["batch"] = {"max_events": 50, "linger": 0.05}
    else:
        opts["content_mode"] = mode
    sink = WebhookSink.from_options("hook", opts)
    try:
        await deliver(sink)
    finally:
        await sink.close()
    parsed = []
    for headers, body in ((r.headers, r.body) for r in server.requests):
        if mode == "batch":
            assert headers["Content-Type"] == "application/cloudevents-batch+json"
            parsed += [normalized(FMT.read(None, orjson.dumps(doc))) for doc in orjson.loads(body)]
        else:
            parsed.append(normalized(ce_http.from_http(ce_http.HTTPMessage(headers=headers, body=body), FMT)))
    check(parsed, sink)


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_kafka_records_parse_with_the_sdk_kafka_binding(
    kafka_broker: TansuBroker, mode: str, compat: str
) -> None:
    topic = unique_name("ce-sdk")
    kafka_broker.create_topic(topic, partitions=1)
    sink = KafkaSink.from_options("kafka", {"brokers": kafka_broker.bootstrap, "linger_ms": 1,
                                            "destination": topic, "content_mode": mode,
                                            **compat_options(compat)})
    try:
        await deliver(sink)
    finally:
        await sink.close()
    records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=len(expected(sink)))
    parsed = []
    for rec in records:
        message = ce_kafka.KafkaMessage(headers=rec.headers, key=rec.key, value=rec.value or b"")
        parsed.append(normalized(ce_kafka.from_kafka(message, FMT)))
    check(parsed, sink)


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_nats_messages_parse_with_the_sdk(nats_server: NatsServer, mode: str) -> None:
    nc = await nats.connect(nats_server.url)
    got: list[Any] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        got.append(msg)
        if len(got) == len(events()):
            done.set()

    await subscribed(nc, "k8s.>", cb=cb)
    sink = NatsSink.from_options("nats", {"servers": [nats_server.url], "content_mode": mode})
    try:
        await deliver(sink)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await sink.close()
        await nc.close()
    parsed = []
    for msg in got:
        if mode == "structured":
            parsed.append(normalized(FMT.read(None, msg.data)))
        else:
            message = ce_http.HTTPMessage(headers=dict(msg.headers or {}), body=msg.data)
            parsed.append(normalized(ce_http.from_binary(message, FMT)))
    check(parsed, sink)
