"""A 1.5 MB object through the whole bridge to real brokers, then ``kube-event-bridge verify`` as a
consumer rebuilding state from what each sink holds: under the default ``oversize`` policy no object
is missing (from Kafka nor from JetStream); under ``dead_letter`` the object is missing, as before.

The service runs in-process against the simulator; Tansu (Kafka) and nats-server (JetStream) are real
broker processes; ``verify`` is a separate process."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.service.config import load_config
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from tests import brokers
from tests.brokers import NatsServer, TansuBroker, unique_name
from tests.service.test_service import eventually, lines

pytestmark = pytest.mark.usefixtures("own_cwd")

kafka_broker = brokers.kafka_broker
nats_server = brokers.nats_server
ROOT = Path(__file__).resolve().parents[2]


def configmap(name: str, blob: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default"}, "data": {"blob": blob}}


async def verify(cfg: Path, sink: str) -> tuple[int, dict[str, Any]]:
    """``verify --json`` of one sink: its exit code and the report of its one resource."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.service.cli", "verify", "--config", str(cfg), "--sink", sink, "--json",
        "--timeout", "60", cwd=str(ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode in (0, 1), err.decode()
    (resource,) = orjson.loads(out)["resources"]
    return proc.returncode, resource


async def test_verify_finds_no_missing_object_under_the_default_policy(
        tmp_path: Path, kafka_broker: TansuBroker, nats_server: NatsServer) -> None:
    ref_topic, dl_topic = unique_name("ov-ref"), unique_name("ov-dl")
    for topic in (ref_topic, dl_topic):
        kafka_broker.create_topic(topic)
    async with Simulator() as sim:
        for i in range(5):
            sim.store.create("configmaps", configmap(f"small-{i}", f"v{i}"))
        # Random bytes: lz4 cannot bring it under the topics' 1 MB.
        sim.store.create("configmaps", configmap("huge", base64.b64encode(os.urandom(1_100_000)).decode()))
        cfg = tmp_path / "bridge.yaml"
        cfg.write_text(
            "cluster: test\n"
            f"kubernetes: {{kubeconfig: '{sim.write_kubeconfig(tmp_path / 'kc')}', in_cluster: 'false'}}\n"
            "resources: [{resource: configmaps, namespace: default}]\n"
            "sinks:\n"
            f"  - {{name: ref, kind: kafka, brokers: '{kafka_broker.bootstrap}', destination: {ref_topic},\n"
            f"     dead_letter: {{kind: file, target: '{tmp_path / 'ref-dead.jsonl'}'}}}}\n"
            f"  - {{name: dl, kind: kafka, brokers: '{kafka_broker.bootstrap}', destination: {dl_topic},\n"
            "     oversize: dead_letter,\n"
            f"     dead_letter: {{kind: file, target: '{tmp_path / 'dl-dead.jsonl'}'}}}}\n"
            f"  - {{name: js, kind: jetstream, servers: ['{nats_server.url}'], destination: 'k8s.{{name}}',\n"
            "     stream: {name: KUBE, create: true, subjects: ['k8s.>']},\n"
            f"     dead_letter: {{kind: file, target: '{tmp_path / 'js-dead.jsonl'}'}}}}\n"
            f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 0.2}}\n"
            "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
            "shutdown_deadline: 10\n")
        service = BridgeService(config=load_config(str(cfg)))
        task = asyncio.create_task(service.run())
        try:
            deads = [tmp_path / d for d in ("ref-dead.jsonl", "dl-dead.jsonl", "js-dead.jsonl")]
            await eventually(lambda: all(len(lines(d)) == 1 for d in deads), timeout=60,
                             what="the three dead letters")
            await eventually(lambda: service.readiness().ready, timeout=30, what="readiness")
            for sink in ("ref", "js"):
                code, resource = await verify(cfg, sink)
                assert resource["missing"] == 0, (sink, resource)
                assert resource["stale"] == 0, (sink, resource)
                assert resource["sink_objects"] == 6, (sink, resource)
                assert code == 0, (sink, resource)
            code, resource = await verify(cfg, "dl")
            assert code == 1
            assert resource["missing"] == 1
            assert [m["object"] for m in resource["examples"]["missing"]] == ["default/huge"]
        finally:
            service.stop_event.set()
            await task
    # Each dead letter holds the whole object.
    for dead in ("ref-dead.jsonl", "dl-dead.jsonl", "js-dead.jsonl"):
        (record,) = [orjson.loads(line) for line in (tmp_path / dead).read_bytes().splitlines()]
        assert len(record["message"]["data"]["data"]["blob"]) > 1_400_000
