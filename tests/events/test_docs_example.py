"""docs/events.md's worked example, run as written: the configuration block under
``<!-- worked-example -->`` (only its addresses pointed at this test's Kafka broker and webhook, and
the connection, checkpoint and server settings added) against the simulator's Events, read back from
Kafka with the CloudEvents SDK's binding and from the webhook."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.events import EventGenerator
from bridge.testing import WebhookReceiver
from tests import brokers
from tests.brokers import TansuBroker, unique_name

pytestmark = pytest.mark.usefixtures("own_cwd")

kafka_broker = brokers.kafka_broker
DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def worked_example() -> dict[str, Any]:
    text = DOC.read_text()
    m = re.search(r"<!-- worked-example -->\n```yaml\n(.*?)^```", text, re.S | re.M)
    assert m is not None
    loaded: dict[str, Any] = yaml.safe_load(m.group(1))
    return loaded


async def eventually(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_the_worked_example_routes_enriches_and_coalesces_as_documented(
        tmp_path: Path, kafka_broker: TansuBroker) -> None:
    hook = await WebhookReceiver(path="/k8s").start()

    config = worked_example()
    archive, oncall = config["sinks"]
    assert (archive["brokers"], archive["destination"], oncall["url"]) == (
        "kafka-0.kafka:9092", "kube-events", "https://hooks.example.com/k8s")
    topic = unique_name("kube-events")
    kafka_broker.create_topic(topic, partitions=2)
    archive.update(brokers=kafka_broker.bootstrap, destination=topic)
    oncall["url"] = hook.url
    try:
        async with Simulator() as sim:
            gen = EventGenerator(store=sim.store, namespaces=["web", "test"], deployments=6,
                                 pods_per_deployment=3, new_api_share=1.0, seed=11)
            config.update(
                kubernetes={"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
                checkpoint={"store": "file", "directory": str(tmp_path / "cp"), "interval": 0.2},
                server={"host": "127.0.0.1", "port": 0, "admin_port": 0})
            service = BridgeService(config=BridgeConfig.model_validate(config))
            task = asyncio.create_task(service.run(), name="docs-example")
            try:
                await eventually(lambda: service.readiness().ready, what="readiness")
                for i in range(400):
                    gen.step()
                    if i % 40 == 0:
                        await asyncio.sleep(0.05)
                finals = {o["metadata"]["uid"]: o for o in sim.store.list("events.events.k8s.io")}
                fmt = JSONFormat()

                def kafka_events() -> list[dict[str, Any]]:
                    out = []
                    for rec in kafka_broker.read_all(topic, timeout=5):
                        msg = ce_kafka.KafkaMessage(headers=rec.headers, key=rec.key, value=rec.value or b"")
                        out.append(dict(ce_kafka.from_kafka(msg, fmt).get_attributes()))
                    return out

                records: list[dict[str, Any]] = []

                def all_final() -> bool:
                    records[:] = kafka_events()
                    have = {(r["uid"], r["resourceversion"]) for r in records}
                    return all((u, o["metadata"]["resourceVersion"]) in have for u, o in finals.items())

                await eventually(all_final, timeout=60, what="the last state of every Event in Kafka")
            finally:
                service.stop_event.set()
                assert await task == 0
    finally:
        await hook.close()
    received = [(r.headers, r.json()) for r in hook.accepted]

    # Kafka: every Event, with the documented headers, enriched (the simulator's Pods all exist here
    # or were seen deleted), repetitions merged.
    assert {r["uid"] for r in records} == {e.uid for e in gen.ledger}
    ledger = {e.uid: e for e in gen.ledger}
    for r in records:
        assert r["reason"] == ledger[r["uid"]].reason
        assert r["eventtype"] == ledger[r["uid"]].type
        if ledger[r["uid"]].existed:
            assert r["enrichment"] in ("ok", "gone")
            assert r["involvedlabels"]
    assert sum(1 for r in records if r["type"].endswith(".updated")) < gen.stats.bumped

    # The webhook: exactly the Events the routes select, with the configured header.
    def selected(e: Any) -> bool:
        if e.namespace == "test" or e.type == "Normal" or e.reason == "BackOff":
            return False
        note = finals[e.uid]["note"] if e.uid in finals else ""
        return e.involved_kind in ("Pod", "Deployment") or note.startswith("Liveness probe failed") \
            or e.labels.get("team") == "payments"

    assert all(h.get("X-Team") == "platform" for h, _ in received)
    got = {body["uid"] for _, body in received}
    assert got == {e.uid for e in gen.ledger if selected(e)}
    assert got
    assert all(body["eventtype"] == "Warning" and body["data"]["note"] for _, body in received)
