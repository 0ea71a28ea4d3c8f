"""What keeps the Kafka sink's per-event latency low: a short default linger, TCP_NODELAY, and
delivery reports served whenever the sink produces, not only on the poller's timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import sinks.kafka_producer
from sinks.contract import DeliveryOutcome, EventType
from sinks.kafka import KafkaSink, KafkaSinkOptions
from sinks.kafka_producer import DeliveryReport
from tests import brokers
from tests.brokers import TansuBroker, unique_name
from tests.sinks import event, obj

kafka_broker = brokers.kafka_broker


@pytest.fixture
async def sink(kafka_broker: TansuBroker) -> AsyncIterator[KafkaSink]:
    topic = unique_name("latency")
    kafka_broker.create_topic(topic, partitions=2)
    s = KafkaSink.from_options("kafka", {"brokers": kafka_broker.bootstrap, "destination": topic})
    yield s
    await s.close()


def test_latency_defaults() -> None:
    conf = KafkaSinkOptions(brokers="b:9").producer_config()
    assert conf["linger.ms"] == 1.0
    assert conf["socket.nagle.disable"] is True
    overridden = KafkaSinkOptions(brokers="b:9", librdkafka={"socket.nagle.disable": False})
    assert overridden.producer_config()["socket.nagle.disable"] is False


async def test_reports_are_served_when_the_sink_produces(
    sink: KafkaSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The poller's own timer is made far longer than a delivery: records produced in later loop
    # turns get the reports that came meanwhile served with them. Where each report was served is
    # counted (not how many seconds it took: on a loaded machine a delivery itself can take
    # longer than any bound that tells the two paths apart).
    monkeypatch.setattr(sinks.kafka_producer, "_BUSY_POLL", 3.0)
    await sink.start()
    # The idempotent producer's id and the partition leaders are fetched first (served by the poller).
    warm: list[DeliveryOutcome] = []
    await sink.deliver(event(EventType.ADDED, obj("warm", uid="w", rv="1")), warm.append)
    assert await sink.flush(30)
    assert warm == [DeliveryOutcome.DELIVERED]
    client = sink.kafka.client
    assert client is not None
    assert client.on_reports is not None
    served = {"produce": 0, "poller": 0}
    producing = False
    serve_reports, on_reports = client.serve_reports, client.on_reports

    def serve_on_produce() -> None:
        nonlocal producing
        producing = True
        try:
            serve_reports()
        finally:
            producing = False

    def count(batch: list[DeliveryReport]) -> None:
        served["produce" if producing else "poller"] += len(batch)
        on_reports(batch)

    monkeypatch.setattr(client, "serve_reports", serve_on_produce)
    monkeypatch.setattr(client, "on_reports", count)
    outcomes: list[DeliveryOutcome] = []
    for i in range(200):
        await sink.deliver(event(EventType.ADDED, obj(f"p{i}", uid=f"u{i}", rv="2")), outcomes.append)
        await asyncio.sleep(0.002)
    assert await sink.flush(30)
    assert outcomes == [DeliveryOutcome.DELIVERED] * 200
    assert sum(served.values()) == 200, served
    # Most were served by a later produce, not by the poller's next turn (nor by the flush).
    assert served["produce"] > 100, served
