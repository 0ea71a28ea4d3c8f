"""What the bridge writes to its log: JSON lines only (client libraries' own logs included), the
informer, resource and sink as fields, and durations that are measured."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import time
from pathlib import Path

import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.logconfig import configure_logging
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.storage.checkpoint import informer_id
from bridge.testing.processes import ServiceProcess, wait_until
from tests.service.test_cli import sim_process  # noqa: F401 - the fixture
from tests.service.test_service import eventually

pytestmark = pytest.mark.usefixtures("own_cwd")


def closed_port(held: list[socket.socket]) -> int:
    """A port that refuses connections for as long as its socket in ``held`` stays open: bound and
    not listening, so the OS cannot hand it to another listener (the bridge's own servers bind port
    0 too, and a released port came back as the bridge's HTTP port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
    return int(s.getsockname()[1])


async def test_client_library_logs_are_json_lines_with_the_sink(tmp_path: Path,
                                                         sim_process: tuple[str, Path]) -> None:  # noqa: F811
    _, kubeconfig = sim_process
    held: list[socket.socket] = []
    kafka, nats = closed_port(held), closed_port(held)
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods}]\n"
        "sinks:\n"
        f"  - {{name: events, kind: kafka, brokers: '127.0.0.1:{kafka}', connect_timeout: 0.5}}\n"
        f"  - {{name: bus, kind: nats, servers: ['nats://127.0.0.1:{nats}'], connect_timeout: 0.5,\n"
        "     reconnect_wait: 0.2}\n"
        f"checkpoint: {{store: nats-kv, nats_url: 'nats://127.0.0.1:{nats}'}}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
        "logging: {level: info, format: json}\n"
        "shutdown_deadline: 2\n")
    proc = ServiceProcess(config=cfg, log=tmp_path / "bridge.log")

    def both_refused() -> bool:
        """What six seconds used to show: librdkafka retries the connection about every second;
        the checkpoint store's and the NATS sink's connection errors."""
        lines = proc.output().splitlines()
        refused = sum(1 for line in lines if '"sinks.kafka.librdkafka"' in line
                      and f"127.0.0.1:{kafka}" in line and "Connection refused" in line)
        store = any('"bridge.storage.checkpoint_natskv"' in line and "NATS connection error" in line
                    for line in lines)
        sink = any('"sink":"bus"' in line and "NATS" in line for line in lines)
        return refused >= 5 and store and sink

    try:
        async with proc:
            await wait_until(both_refused, timeout=60, what="both connections refused", alive=proc)
            await proc.stop(timeout=30)
        stderr = proc.output()
    finally:
        for sock in held:
            sock.close()
    records = []
    for line in stderr.splitlines():
        assert not line.startswith("%"), f"a raw librdkafka line reached stderr: {line}"
        records.append(orjson.loads(line))  # every line is JSON
    librdkafka = [r for r in records if r["logger"] == "sinks.kafka.librdkafka"]
    assert librdkafka, "librdkafka's own log lines were not routed into the log"
    assert all(r["sink"] == "events" for r in librdkafka)
    assert any(f"127.0.0.1:{kafka}" in r["message"] and "Connection refused" in r["message"]
               for r in librdkafka), librdkafka
    nats_records = [r for r in records if r.get("sink") == "bus"]
    assert any("NATS" in r["message"] for r in nats_records), records
    # nats-py's connection errors (the checkpoint store's here) as one line each, not nats-py's
    # default error record carrying a traceback.
    assert any(r["logger"] == "bridge.storage.checkpoint_natskv" and "NATS connection error" in r["message"]
               for r in records), records
    assert not any(r["logger"].startswith("nats") for r in records), records
    # The sink is a field, not part of the text.
    assert not any("'events'" in r["message"] or "'bus'" in r["message"] for r in records)


async def test_initial_sync_duration_is_measured(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="bridge.service.service")
    caplog.set_level("INFO", logger="bridge.informer.reflector")
    async with Simulator() as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        config = BridgeConfig.model_validate({
            "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
            "resources": [{"resource": "po"}],
            "sinks": [{"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")}],
            "checkpoint": {"store": "none"},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "shutdown_deadline": 5,
        })
        service = BridgeService(config=config)
        started = time.monotonic()
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: any(r.getMessage() == "initial sync done" for r in caplog.records),
                             what="the initial sync report")
            reported_by = time.monotonic() - started
        finally:
            service.stop_event.set()
            assert await task == 0
    done = next(r for r in caplog.records if r.getMessage() == "initial sync done")
    synced = next(r for r in caplog.records if r.getMessage() == "informer synced")
    # The duration is what it took, not the progress interval (5 s) it used to be rounded up to.
    assert 0 < done.seconds <= reported_by  # type: ignore[attr-defined]
    assert synced.seconds <= done.seconds  # type: ignore[attr-defined]
    assert synced.objects_cached == 3  # type: ignore[attr-defined]
    # One informer id in every record about it (and in the metrics' informer label).
    assert synced.informer == informer_id("po")  # type: ignore[attr-defined]
    starting = next(r for r in caplog.records
                    if r.name == "bridge.informer.reflector" and r.getMessage() == "starting")
    assert starting.informer == informer_id("po")  # type: ignore[attr-defined]


def test_fields_in_json_and_text() -> None:
    for fmt in ("json", "text"):
        out = io.StringIO()
        configure_logging("info", fmt, stream=out)
        try:
            logging.getLogger("t").warning("watch closed: %s", "gone", extra={"informer": "pods.all.1",
                                                                              "resource": "pods"})
        finally:
            configure_logging("warning", "text")
        line = out.getvalue().strip()
        if fmt == "json":
            record = orjson.loads(line)
            assert (record["message"], record["informer"], record["resource"]) == \
                ("watch closed: gone", "pods.all.1", "pods")
        else:
            assert line.endswith("t: watch closed: gone informer=pods.all.1 resource=pods")
