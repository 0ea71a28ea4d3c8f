"""``deliver_batch`` against the real destinations: the same messages as ``deliver`` per event.

For every built-in sink, two sinks with the same settings on two destinations of one real broker
(Tansu Kafka, nats-server core and JetStream, an aiohttp webhook receiver, a file) are fed the same
events, one per ``deliver`` call, the other in ``deliver_batch`` calls; what each destination stored
is read back with the broker's own client and compared: the same messages in the same order (per
object for the webhook, whose requests run concurrently), each ack called once, filtered events
acked FILTERED, snapshot markers after everything before them and before everything after them, a
small in-flight window respected, and a closed sink refusing a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest

from bridge.rawobject import RawObject
from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.base import BaseSink
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType, SinkError, SnapshotInfo
from sinks.file import FileSink
from sinks.kafka import KafkaSink
from sinks.nats import JetStreamSink, NatsSink
from sinks.webhook import WebhookSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.sinks import event, marker, obj
from tests.sinks.test_nats_sink import Collector
from tests.sinks.test_webhook_sink import Hook

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server
WINDOW = 3
BATCH_CUTS = (1, 2, 7, 8, 20, 21, 22, 40)


def raw(o: dict[str, Any]) -> Any:
    return RawObject.from_dict(o)


def contract_events() -> tuple[list[ChangeEvent], set[int]]:
    """Adds, a snapshot (markers and syncs), real updates, resourceVersion-only updates (the change
    filter drops them), an excluded namespace (routing drops it), deletes; and the filtered indexes."""
    names = [f"p{i}" for i in range(6)]
    events: list[ChangeEvent] = []
    filtered: set[int] = set()
    current: dict[str, Any] = {}
    rv = 0

    def add(ev: ChangeEvent, dropped: bool = False) -> None:
        if dropped:
            filtered.add(len(events))
        events.append(ev)

    for name in names:
        rv += 1
        current[name] = raw(obj(name, rv=str(rv), spec={"v": 0}, labels={"app": "web"}))
        add(event(EventType.ADDED, current[name]))
    add(event(EventType.ADDED, raw(obj("hidden", namespace="kube-system", rv="100"))), dropped=True)
    snap = SnapshotInfo(id="snap-1", resource_version=str(rv))
    add(marker(EventType.SNAPSHOT_BEGIN, snap))
    for name in names:
        add(event(EventType.SYNC, current[name], snapshot=snap))
    add(marker(EventType.SNAPSHOT_END, SnapshotInfo(id="snap-1", resource_version=str(rv), count=len(names))))
    for round_ in range(1, 5):
        for name in names[: 4 if round_ % 2 else 6]:
            rv += 1
            old = current[name]
            same = round_ == 3 and name in ("p0", "p1")  # only the resourceVersion moves
            spec = old["spec"] if same else {"v": round_}
            current[name] = raw(obj(name, rv=str(rv), spec=spec, labels={"app": "web"}))
            add(event(EventType.UPDATED, current[name], old=old), dropped=same)
    for name in names[:2]:
        add(event(EventType.DELETED, current[name]))
    return events, filtered


Feeder = Callable[[BaseSink[Any], Sequence[ChangeEvent], list[AckCallback]], Any]


async def per_event(sink: BaseSink[Any], events: Sequence[ChangeEvent], acks: list[AckCallback]) -> None:
    for ev, ack in zip(events, acks, strict=True):
        await sink.deliver(ev, ack)


async def in_batches(sink: BaseSink[Any], events: Sequence[ChangeEvent], acks: list[AckCallback]) -> None:
    start = 0
    for end in [*BATCH_CUTS, len(events)]:
        await sink.deliver_batch(events[start:end], acks[start:end])
        start = end


async def feed(sink: BaseSink[Any], events: Sequence[ChangeEvent],
               feeder: Feeder) -> dict[int, list[DeliveryOutcome]]:
    """Feeds the events, waits for every ack, closes the sink; the outcomes per event index. Checks
    the in-flight window at every ack and that the closed sink refuses a batch."""
    outcomes: dict[int, list[DeliveryOutcome]] = {}
    peak = 0

    def ack_of(i: int) -> AckCallback:
        def ack(outcome: DeliveryOutcome) -> None:
            nonlocal peak
            if outcome is not DeliveryOutcome.FILTERED:  # was in flight until just before its ack
                peak = max(peak, sink.stats.in_flight + 1)
            outcomes.setdefault(i, []).append(outcome)
        return ack

    await sink.start()
    try:
        await feeder(sink, events, [ack_of(i) for i in range(len(events))])
        assert await sink.flush(30), sink.stats.as_dict()
    finally:
        await sink.close()
    assert peak <= WINDOW
    with pytest.raises(SinkError, match="closed"):
        await sink.deliver_batch(events[:1], [lambda _o: None])
    return outcomes


def check_acks(outcomes: dict[int, list[DeliveryOutcome]], events: Sequence[ChangeEvent],
               filtered: set[int]) -> None:
    assert sorted(outcomes) == list(range(len(events)))
    for i, got in outcomes.items():
        expected = DeliveryOutcome.FILTERED if i in filtered else DeliveryOutcome.DELIVERED
        assert got == [expected], (i, got)


def check_barriers(ids: Sequence[str], events: Sequence[ChangeEvent], filtered: set[int]) -> None:
    """In the stored order ``ids`` (CloudEvent ids), each marker comes after every event handed
    over before it and before every event handed over after it."""
    from sinks.cloudevents import event_id

    sent = [event_id(ev) for i, ev in enumerate(events) if i not in filtered]
    assert sorted(ids) == sorted(sent)
    for index, ev in enumerate(events):
        if ev.obj is not None:
            continue
        mid = event_id(ev)
        at = ids.index(mid)
        before = {event_id(e) for i, e in enumerate(events[:index]) if i not in filtered}
        assert set(ids[:at]) == before, ev.type


@pytest.fixture
def scenario() -> tuple[list[ChangeEvent], set[int]]:
    return contract_events()


SINK_OPTS: dict[str, Any] = {"max_in_flight": WINDOW, "routing": {"exclude_namespaces": ["kube-system"]}}


async def test_file_sink(tmp_path: Path, scenario: tuple[list[ChangeEvent], set[int]]) -> None:
    events, filtered = scenario
    stored: list[list[bytes]] = []
    for label, feeder in (("one", per_event), ("batch", in_batches)):
        path = tmp_path / f"{label}.jsonl"
        sink = FileSink.from_options(label, {"path": str(path), **SINK_OPTS})
        check_acks(await feed(sink, events, feeder), events, filtered)
        stored.append(path.read_bytes().splitlines())
    assert stored[1] == stored[0]
    check_barriers([orjson.loads(line)["id"] for line in stored[1]], events, filtered)


@pytest.mark.parametrize("content_mode", ["structured", "binary"])
async def test_kafka_sink(kafka_broker: TansuBroker, scenario: tuple[list[ChangeEvent], set[int]],
                          content_mode: str) -> None:
    events, filtered = scenario
    stored = []
    for label, feeder in (("one", per_event), ("batch", in_batches)):
        topic = unique_name(f"batch-{label}")
        kafka_broker.create_topic(topic, partitions=1)  # one partition: one total order to compare
        sink = KafkaSink.from_options(label, {
            "brokers": kafka_broker.bootstrap, "linger_ms": 1, "destination": topic,
            "content_mode": content_mode, **SINK_OPTS})
        check_acks(await feed(sink, events, feeder), events, filtered)
        records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=len(events) - len(filtered))
        stored.append([(r.key, r.headers, r.value) for r in records])
    assert stored[1] == stored[0]
    assert len(stored[1]) == len(events) - len(filtered)
    if content_mode == "structured":
        ids = [orjson.loads(value or b"")["id"] for _, _, value in stored[1]]
    else:
        ids = [headers["ce_id"].decode() for _, headers, _ in stored[1]]
    check_barriers(ids, events, filtered)


@pytest.mark.parametrize("content_mode", ["structured", "binary"])
async def test_nats_sink(nats_server: NatsServer, scenario: tuple[list[ChangeEvent], set[int]],
                         content_mode: str) -> None:
    events, filtered = scenario
    stored = []
    for label, feeder in (("one", per_event), ("batch", in_batches)):
        collector = Collector()
        await collector.start(nats_server.url, f"{label}.>")
        try:
            sink = NatsSink.from_options(label, {
                "servers": [nats_server.url], "content_mode": content_mode,
                "destination": f"{label}.{{namespace}}.{{name}}", **SINK_OPTS})
            check_acks(await feed(sink, events, feeder), events, filtered)
            msgs = await collector.wait_for(len(events) - len(filtered))
            stored.append([(m.subject.split(".", 1)[1], dict(m.headers or {}), m.data) for m in msgs])
        finally:
            await collector.close()
    assert stored[1] == stored[0]
    ids = [orjson.loads(data)["id"] if content_mode == "structured" else headers["ce-id"]
           for _, headers, data in stored[1]]
    check_barriers(ids, events, filtered)


async def test_jetstream_sink(nats_server: NatsServer, scenario: tuple[list[ChangeEvent], set[int]]) -> None:
    events, filtered = scenario
    stored = []
    for label, feeder in (("one", per_event), ("batch", in_batches)):
        stream = unique_name(label).upper()
        sink = JetStreamSink.from_options(label, {
            "servers": [nats_server.url], "destination": f"{label}.{{namespace}}.{{name}}",
            "stream": {"name": stream, "create": True, "subjects": [f"{label}.>"]}, **SINK_OPTS})
        check_acks(await feed(sink, events, feeder), events, filtered)
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            seqs = range(info.state.first_seq, info.state.last_seq + 1)
            msgs = [await js.get_msg(stream, seq) for seq in seqs]
        finally:
            await nc.close()
        # Each sink names its own stream in Nats-Expected-Stream.
        stored.append([(str(m.subject).split(".", 1)[1],
                        {k: v for k, v in (m.headers or {}).items() if k != "Nats-Expected-Stream"}, m.data)
                       for m in msgs])
    assert stored[1] == stored[0]
    assert len(stored[1]) == len(events) - len(filtered)
    check_barriers([h["Nats-Msg-Id"] for _, h, _ in stored[1]], events, filtered)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    async with WebhookReceiver(path="") as h:
        yield h


async def test_webhook_sink(hook: Hook, scenario: tuple[list[ChangeEvent], set[int]]) -> None:
    events, filtered = scenario

    async def slow_then_ok(_request: ReceivedRequest) -> Reply:
        await asyncio.sleep(0.001)  # requests overlap: the window and the lanes do the ordering
        return Reply(204)

    hook.respond = slow_then_ok
    stored: dict[str, list[dict[str, Any]]] = {}
    for label, feeder in (("one", per_event), ("batch", in_batches)):
        url = f"{hook.url}/{label}/{{namespace}}/{{name}}"
        sink = WebhookSink.from_options(label, {"url": url, **SINK_OPTS})
        check_acks(await feed(sink, events, feeder), events, filtered)
        stored[label] = [orjson.loads(r.body) for r in hook.accepted if r.path.startswith(f"/{label}/")]
    one, batch = stored["one"], stored["batch"]
    assert sorted(orjson.dumps(e) for e in batch) == sorted(orjson.dumps(e) for e in one)
    for subject in {e.get("subject") for e in one}:
        assert [e["id"] for e in batch if e.get("subject") == subject] == \
            [e["id"] for e in one if e.get("subject") == subject]
    check_barriers([e["id"] for e in batch], events, filtered)
