"""``kube-event-bridge verify`` as a user runs it: a real process against a simulator process, reading a
file, a Kafka topic (Tansu) and a JetStream stream (nats-server) written by hand, with the exit codes
and both output formats."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from tests.brokers import NatsServer, TansuBroker, kafka_broker, nats_server, unique_name
from tests.checkpoint.crash_harness import ROOT

__all__ = ["kafka_broker", "nats_server"]



def to_ce(kind: str, o: dict[str, Any]) -> dict[str, Any]:
    meta = o["metadata"]
    ns = meta["namespace"]
    return {
        "specversion": "1.0", "id": f"{meta['uid']}-{meta['resourceVersion']}-{kind}",
        "source": "/clusters/lab/api/v1/configmaps", "type": f"io.kube-event-bridge.{kind}",
        "subject": f"{ns}/{meta['name']}", "time": "2024-05-01T12:00:00.500000Z",
        "datacontenttype": "application/json", "cluster": "lab", "kind": "ConfigMap", "apiversion": "v1",
        "namespace": ns, "name": meta["name"], "uid": meta["uid"], "resourceversion": meta["resourceVersion"],
        "data": {"apiVersion": "v1", "kind": "ConfigMap", **o},
    }


class World:
    """A namespace of the simulator with two ConfigMaps (a third one was deleted), and the events a
    faithful sink would hold."""

    def __init__(self, kubeconfig: Path, client: ApiClient, ns: str) -> None:
        self.kubeconfig = kubeconfig
        self.client = client
        self.ns = ns
        self.path = f"/api/v1/namespaces/{ns}/configmaps"
        self.good: list[dict[str, Any]] = []
        self.gone: dict[str, Any] = {}

    async def populate(self) -> None:
        await self.client.create("/api/v1/namespaces", {"metadata": {"name": self.ns}})
        path = self.path
        a = await self.client.create(path, {"metadata": {"name": "a"}, "data": {"v": "1"}})
        b = await self.client.create(path, {"metadata": {"name": "b"}})
        a2 = await self.client.patch(f"{path}/a", {"data": {"v": "2"}})
        gone = await self.client.create(path, {"metadata": {"name": "gone"}})
        deleted = await self.client.delete(f"{path}/gone")
        self.gone = gone
        self.good = [to_ce("added", a), to_ce("added", b), to_ce("updated", a2), to_ce("added", gone),
                     to_ce("deleted", deleted)]


@pytest.fixture(scope="module")
def sim_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One simulator process for the module (each test has its own namespace)."""
    kubeconfig = tmp_path_factory.mktemp("verify-sim") / "sim.kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "bridge.sim", "--port", "0", "--kubeconfig",
                             str(kubeconfig)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        while b"simulator listening on" not in proc.stdout.readline():
            assert proc.poll() is None, "the simulator exited"
        yield kubeconfig
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
async def world(sim_kubeconfig: Path) -> AsyncIterator[World]:
    client = ApiClient.from_kubeconfig(str(sim_kubeconfig))
    try:
        w = World(sim_kubeconfig, client, unique_name("audit"))
        await w.populate()
        yield w
    finally:
        await client.close()


async def run_verify(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.service.cli", "verify", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def write_lines(path: Path, ces: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in ces))


async def test_file_sink_consistent_then_a_lost_delete_is_a_phantom(tmp_path: Path, world: World) -> None:
    events = tmp_path / "events.jsonl"
    write_lines(events, world.good)
    common = ["--kubeconfig", str(world.kubeconfig), "--resource", f"configmaps@{world.ns}",
              "--cluster", "lab"]
    code, out, err = await run_verify(*common, "--file", str(events))
    assert (code, err) == (0, ""), out
    assert "verdict: the sink's state equals the cluster's" in out
    assert f"configmaps ({world.ns})" in out

    # The delete never reached the sink, and a torn line was left by a crash mid-write.
    write_lines(events, world.good[:-1])
    with events.open("ab") as fh:
        fh.write(b'{"specversion": "1.0", "id": "tor')
    code, out, err = await run_verify(*common, "--file", str(events), "--json")
    assert code == 1, err
    report = orjson.loads(out)
    (r,) = report["resources"]
    assert (r["missing"], r["phantom"], r["stale"]) == (0, 1, 0)
    assert r["examples"]["phantom"][0]["uid"] == world.gone["metadata"]["uid"]
    assert report["undecodable"] == 1


async def test_kafka_topic_structured_and_binary_records(world: World, kafka_broker: TansuBroker) -> None:
    from confluent_kafka import Producer

    topic = unique_name("verify")
    kafka_broker.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i, c in enumerate(world.good):
        if i % 2:  # binary content mode: attributes as ce_ headers, data alone as the body
            headers = [(f"ce_{k}", urllib.parse.quote(str(v), safe="").encode())
                       for k, v in c.items() if k not in ("data", "datacontenttype")]
            headers.append(("content-type", b"application/json"))
            producer.produce(topic, key=c["uid"], value=orjson.dumps(c["data"]),
                             headers=headers)  # type: ignore[arg-type]
        else:
            producer.produce(topic, key=c["uid"], value=orjson.dumps(c))
    # An update the cluster made that never reached the topic: the first state of b is stale.
    await world.client.patch(f"{world.path}/b", {"data": {"late": "yes"}})
    assert producer.flush(15) == 0
    code, out, err = await run_verify("--kubeconfig", str(world.kubeconfig),
                                      "--resource", f"configmaps@{world.ns}",
                                      "--kafka", kafka_broker.bootstrap, "--topic", topic, "--json")
    assert code == 1, err
    (r,) = orjson.loads(out)["resources"]
    assert orjson.loads(out)["undecodable"] == 0, out
    assert (r["events"], r["missing"], r["phantom"], r["stale"]) == (5, 0, 0, 1)
    assert r["examples"]["stale"][0]["object"] == f"{world.ns}/b"


async def test_jetstream_stream(world: World, nats_server: NatsServer) -> None:
    import nats

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="KUBE", subjects=["k8s.>"])
        for c in world.good[:2]:  # a's update and everything about "gone" are missing
            await js.publish(f"k8s.configmaps.{world.ns}.{c['name']}", orjson.dumps(c),
                             headers={"Nats-Msg-Id": c["id"]})
    finally:
        await nc.close()
    code, out, err = await run_verify("--kubeconfig", str(world.kubeconfig),
                                      "--resource", f"configmaps@{world.ns}",
                                      "--jetstream", nats_server.url, "--stream", "KUBE")
    assert code == 1, err
    assert "1 stale (older than the cluster)" in out
    assert "MISMATCH" in out


BAD_USAGE = [
    ([], "name the sink to read"),
    (["--file", "/nonexistent/events.jsonl"], "no such file"),
    (["--kafka", "127.0.0.1:1"], "--kafka needs at least one --topic"),
    (["--jetstream", "nats://127.0.0.1:1"], "--jetstream needs --stream"),
    (["--file", "x", "--topic", "t"], "--topic is only meaningful with --kafka"),
    (["--file", "x", "--resource", "@ns"], "expected RESOURCE or RESOURCE@NAMESPACE"),
    (["--file", "x", "--resource", "gizmos"], "gizmos"),
    (["--kafka", "127.0.0.1:1", "--topic", "t", "--timeout", "2"], "cannot reach the Kafka brokers"),
    (["--sink", "audit"], "--sink names a sink of the bridge's configuration"),
]


async def test_bad_usage_is_refused_with_a_message(tmp_path: Path, world: World) -> None:
    from bridge.errors import BridgeError
    from bridge.service.cli import _parser
    from bridge.service.verify_cli import UsageError, verify_from_args

    (tmp_path / "x").write_text("")
    for args, message in BAD_USAGE:
        base = ["verify", "--kubeconfig", str(world.kubeconfig)]
        if "--resource" not in args:
            base += ["--resource", "configmaps"]
        parsed = _parser().parse_args([*base, *[a if a != "x" else str(tmp_path / "x") for a in args]])
        with pytest.raises((UsageError, BridgeError)) as caught:
            await verify_from_args(parsed)
        assert message in str(caught.value), args


async def test_bad_usage_exits_2_without_a_traceback(world: World) -> None:
    code, out, err = await run_verify("--kubeconfig", str(world.kubeconfig), "--resource", "gizmos",
                                      "--file", "/dev/null")
    assert (code, out) == (2, "")
    assert "gizmos" in err
    assert "Traceback" not in err


async def test_nothing_to_verify_without_resources_or_config() -> None:
    code, _, err = await run_verify("--file", "/dev/null")
    assert code == 2
    assert "nothing to verify" in err


async def test_sinks_named_in_the_bridge_configuration(
        tmp_path: Path, world: World, kafka_broker: TansuBroker, nats_server: NatsServer) -> None:
    """``--config FILE --sink NAME``: where to read and how come from the sink's own options."""
    import nats
    from confluent_kafka import Producer

    from bridge.errors import BridgeError
    from bridge.service.cli import _parser
    from bridge.service.verify_cli import UsageError, verify_from_args

    write_lines(tmp_path / "events.jsonl", world.good)
    topic = f"k8s.lab.configmaps.{unique_name('t')}"
    kafka_broker.create_topic(topic)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for c in world.good:
        producer.produce(topic, key=c["uid"], value=orjson.dumps(c))
    assert producer.flush(15) == 0
    stream = unique_name("KUBE").replace("-", "_")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        for c in world.good:
            await js.publish(f"{stream}.{c['name']}", orjson.dumps(c))
    finally:
        await nc.close()
    config = tmp_path / "config.yaml"
    config.write_text(orjson.dumps({
        "cluster": "lab",
        "kubernetes": {"kubeconfig": str(world.kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "configmaps", "namespace": world.ns}],
        "sinks": [
            {"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")},
            {"name": "audit", "kind": "kafka", "brokers": kafka_broker.bootstrap,
             "destination": topic.replace("lab.configmaps", "{cluster}.{resource}")},
            {"name": "stream", "kind": "jetstream", "servers": [nats_server.url],
             "destination": f"{stream}.{{name}}", "stream": {"name": stream}},
            {"name": "hook", "kind": "webhook", "url": "http://127.0.0.1:9/x"},
            {"name": "bad", "kind": "kafka", "brokers": kafka_broker.bootstrap, "destination": topic,
             "librdkafka": {"no.such.property": "1"}},
        ],
    }).decode())

    async def run(*args: str) -> Any:
        return await verify_from_args(_parser().parse_args(["verify", "--config", str(config), *args]))

    for sink in ("file", "audit", "stream"):
        report = await run("--sink", sink)
        assert report.ok, (sink, report.render())
        (r,) = report.resources
        assert (r.events, r.cluster_objects, r.sink_objects) == (5, 2, 2), sink
    with pytest.raises(UsageError, match="webhook sink, which cannot be read back"):
        await run("--sink", "hook")
    with pytest.raises(UsageError, match="no such sink"):
        await run("--sink", "nope")
    with pytest.raises(BridgeError, match="cannot read Kafka"):
        await run("--sink", "bad")
