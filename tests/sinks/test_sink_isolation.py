"""Issue #13 with real brokers: Kafka frozen (SIGSTOP) while changes keep coming; JetStream and a file
sink keep their delivery rate, and Kafka receives everything, in order, once it is back.

Durations (kept short for CI; the ratio is what matters): 6 s of steady churn measured before the
pause, a 12 s pause measured whole, at 150 changes/s. Kafka's in-memory buffer is 100 notifications
and its in-flight window 50, so before the isolation the informer stalled for every sink within a
second of the pause."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline
from bridge.storage.checkpoint import FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from sinks.file import FileSink
from sinks.kafka import KafkaSink
from sinks.nats import JetStreamSink
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.checkpoint.helpers import WATCHED, cm, fake_builder, until

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server

OBJECTS = 40
RATE = 150.0
BEFORE, PAUSE = 6.0, 12.0


async def churn(source: FakeControllerSource, stop: asyncio.Event, sent: dict[str, list[str]]) -> None:
    """Modifies the objects round-robin at ``RATE`` changes per second until ``stop``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n in itertools.count():
        if stop.is_set():
            return
        name = f"o{n % OBJECTS}"
        stored = source.modify(cm(name, v=str(n + 1)))
        sent[f"default/{name}"].append(str(stored["metadata"]["resourceVersion"]))
        delay = start + (n + 1) / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


def delivered(p: BridgePipeline, name: str) -> int:
    return int(p.stats().sinks[name].get("delivered", 0))


@pytest.mark.timeout(180)
async def test_a_frozen_kafka_holds_back_no_other_sink_and_catches_up_in_order(
        kafka_broker: TansuBroker, nats_server: NatsServer, tmp_path: Path) -> None:
    topic = unique_name("isolation")
    kafka_broker.create_topic(topic, partitions=3)
    kafka = KafkaSink.from_options("kafka", {
        "brokers": kafka_broker.bootstrap, "destination": topic, "linger_ms": 2, "max_in_flight": 50,
        "buffer": {"capacity": 100}})
    js = JetStreamSink.from_options("js", {
        "servers": [nats_server.url], "stream": {"name": unique_name("ISO").upper(), "create": True},
        "destination": unique_name("iso"), "max_in_flight": 200})
    file = FileSink.from_options("file", {"path": str(tmp_path / "events.jsonl")})
    source = FakeControllerSource()
    sent: dict[str, list[str]] = collections.defaultdict(list)
    for i in range(OBJECTS):
        stored = source.add(cm(f"o{i}", v="0"))
        sent[f"default/o{i}"].append(str(stored["metadata"]["resourceVersion"]))
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[kafka, js, file],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path / "cp"),
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill")
    await p.start()
    stop = asyncio.Event()
    driver: asyncio.Task[None] | None = None
    paused = False
    try:
        await until(lambda: all(delivered(p, s) == OBJECTS for s in ("kafka", "js", "file")), 30,
                    "initial adds")
        driver = asyncio.create_task(churn(source, stop, sent), name="test-churn")
        await asyncio.sleep(1.0)  # steady state
        before = {s: delivered(p, s) for s in ("js", "file")}
        t0 = time.monotonic()
        await asyncio.sleep(BEFORE)
        rate_before = {s: (delivered(p, s) - before[s]) / (time.monotonic() - t0) for s in before}

        kafka_broker.pause()
        paused = True
        at_pause = {s: delivered(p, s) for s in ("js", "file", "kafka")}
        t1 = time.monotonic()
        await asyncio.sleep(PAUSE)
        elapsed = time.monotonic() - t1
        rate_during = {s: (delivered(p, s) - at_pause[s]) / elapsed for s in before}
        kafka_during = delivered(p, "kafka") - at_pause["kafka"]
        spill = p.sink_backlog("kafka")
        kafka_broker.resume()
        paused = False
        print(f"rates before {rate_before}, during the pause {rate_during}; kafka during {kafka_during}")
        for s in before:
            assert rate_during[s] >= 0.9 * rate_before[s], (s, rate_before, rate_during)
        assert kafka_during <= 50 + 100  # what was in flight or buffered, at most
        assert spill.spill_bytes > 0  # the backlog went to disk, not to memory

        stop.set()
        await driver
        total = sum(len(v) for v in sent.values())
        try:
            await until(lambda: all(delivered(p, s) == total for s in ("kafka", "js", "file")), 60,
                        "every sink caught up")
        except AssertionError:
            raise AssertionError(f"not caught up: {total} sent, {p.stats().sinks}, "
                                 f"{p.sink_backlog('kafka')}") from None
    finally:
        stop.set()
        if paused:
            kafka_broker.resume()
        if driver is not None:
            await asyncio.gather(driver, return_exceptions=True)
        await p.shutdown(30)

    records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=total, timeout=60)
    got: dict[str, list[str]] = collections.defaultdict(list)
    ids = set()
    for r in records:
        ce: dict[str, Any] = orjson.loads(r.value or b"")
        ids.add(ce["id"])
        meta = ce["data"]["metadata"]
        got[f"{meta['namespace']}/{meta['name']}"].append(str(meta["resourceVersion"]))
    assert len(ids) == len(records) == total, "missing or duplicated events"
    assert got == sent  # every change of every object, in order
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert len(lines) == total
