"""Issue #27: heartbeat events reach every sink kind on schedule, with real processes.

The simulator (its own process) holds two ConfigMaps and nothing changes; the bridge
(``kube-event-bridge run``, its own process) sends them to a file, a webhook (a real HTTP server in
this process), Kafka (Tansu) and JetStream (a real nats-server), each sink with ``heartbeat:
{interval: 1s}``. Read back from each destination: after the two ``added`` events, a heartbeat per
second (``io.kube-event-bridge.heartbeat``, each with its own id), carrying the resource's current
resourceVersion and the resourceVersion the sink acknowledged (both the server's, nothing being in
flight), and nothing else; ``verify`` against the file counts them as other events, not changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.testing import WebhookReceiver
from bridge.testing.processes import ServiceProcess
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.checkpoint.crash_harness import ROOT, sim_process

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server

NS = "beat"
INTERVAL = 1.0
HEARTBEAT = "io.kube-event-bridge.heartbeat"
ADDED = "io.kube-event-bridge.added"


def read_kafka(kafka: TansuBroker, topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in kafka.read_all(topic) if r.value is not None]


async def read_stream(url: str, stream: str) -> list[dict[str, Any]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        msgs = [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
        return [orjson.loads(m.data) for m in msgs if m.data]
    finally:
        await nc.close()


def check_heartbeats(sink: str, events: list[dict[str, Any]], server_rv: str, seconds: float) -> None:
    types = [e["type"] for e in events]
    assert types[:2] == [ADDED, ADDED], (sink, types)
    beats = [e for e in events if e["type"] == HEARTBEAT]
    assert len(beats) == len(events) - 2, (sink, types)  # nothing else: no change was made
    # On schedule: one per interval over the time watched (the first one interval after the start).
    assert len(beats) >= int(seconds / INTERVAL) - 1, (sink, len(beats), seconds)
    times = [datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp() for e in beats]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.8 * INTERVAL <= g <= INTERVAL + 1.0 for g in gaps), (sink, gaps)
    assert len({e["id"] for e in beats}) == len(beats), sink
    for e in beats:
        assert e["resourceversion"] == server_rv, (sink, e)
        assert e["ackedresourceversion"] == server_rv, (sink, e)
        assert e["source"] == "/clusters/beat/api/v1/configmaps", (sink, e)
        assert e["kind"] == "ConfigMap", (sink, e)
        assert "uid" not in e, (sink, e)
        assert "subject" not in e, (sink, e)
        assert e.get("data") is None, (sink, e)
    print(f"{sink}: {len(beats)} heartbeats in {seconds:.1f}s, gaps {min(gaps):.2f}..{max(gaps):.2f}s")


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_heartbeat_arrives_on_schedule_on_every_sink_kind(
        tmp_path: Path, kafka_broker: TansuBroker, nats_server: NatsServer) -> None:
    topic = unique_name("beat")
    kafka_broker.create_topic(topic, partitions=1)
    stream = unique_name("BEAT").upper().replace("-", "")
    out = tmp_path / "events.jsonl"
    beat = {"interval": "1s"}
    async with contextlib.AsyncExitStack() as stack:
        hook = await stack.enter_async_context(WebhookReceiver())
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        path = f"/api/v1/namespaces/{NS}/configmaps"
        for name in ("a", "b"):
            await client.create(path, {"metadata": {"name": name}, "data": {"v": "1"}})
        server_rv = str((await client.get(path))["metadata"]["resourceVersion"])
        config = tmp_path / "bridge.json"
        config.write_bytes(orjson.dumps({
            "cluster": "beat",
            "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
            "resources": [{"resource": "configmaps", "namespace": NS}],
            "sinks": [
                {"name": "file", "kind": "file", "path": str(out), "heartbeat": beat},
                {"name": "hook", "kind": "webhook", "url": hook.url, "heartbeat": beat},
                {"name": "kafka", "kind": "kafka", "brokers": kafka_broker.bootstrap, "destination": topic,
                 "linger_ms": 1, "heartbeat": beat},
                {"name": "js", "kind": "jetstream", "servers": [nats_server.url], "destination": "kube.beat",
                 "stream": {"name": stream, "create": True, "subjects": ["kube.>"]}, "heartbeat": beat},
            ],
            "checkpoint": {"store": "file", "directory": str(tmp_path / "checkpoints"),
                           "spill_directory": str(tmp_path / "spill")},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "logging": {"level": "info", "format": "json"},
        }))
        async with ServiceProcess(config=config, log=tmp_path / "bridge.log", cwd=ROOT) as bridge:
            await bridge.wait_ready()
            started = time.monotonic()
            await asyncio.sleep(5.5)  # the heartbeats' schedule is what is measured
            seconds = time.monotonic() - started
            await bridge.stop()
        file_events = [orjson.loads(line) for line in out.read_bytes().splitlines() if line.strip()]
        received = {"file": file_events, "webhook": list(hook.events),
                    "kafka": await asyncio.to_thread(read_kafka, kafka_broker, topic),
                    "jetstream": await read_stream(nats_server.url, stream)}
        assert str((await client.get(path))["metadata"]["resourceVersion"]) == server_rv  # nothing changed
    print()
    for sink, events in received.items():
        check_heartbeats(sink, events, server_rv, seconds)
