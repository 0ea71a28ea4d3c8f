"""Process tests and ports: a bridge started by a test must not lose its port to another process.

The old way (``tests.brokers.free_port``: bind to 0, close, write the number into the
configuration) leaves a window between the close and the child's bind in which any process on the
machine may take the port: the bridge then exits with "address already in use". Here that window is
made deterministic: a process of its own takes the very port the old way returned, before the bridge
starts. :mod:`bridge.testing.processes` closes the window: the child binds port 0 itself and writes
what it got to ``server.address_file`` (the simulator prints its URL)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.testing.processes import ProcessFailed, ServiceProcess, SimulatorProcess
from tests.brokers import free_port

THIEF = ("import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
         "print('bound', flush=True); time.sleep(600)\n")


@pytest.fixture
async def thief() -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    """Another process holding the port :func:`free_port` returned (what the old way would use)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", THIEF, str(port),
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"bound"
    yield port, proc
    proc.kill()
    await proc.wait()


def write_config(tmp: Path, kubeconfig: Path, port: int, admin_port: int = 0) -> Path:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "configmaps"}],
        "sinks": [{"name": "file", "kind": "file", "path": str(tmp / "events.jsonl")}],
        "checkpoint": {"store": "file", "directory": str(tmp / "cp")},
        "server": {"host": "127.0.0.1", "port": port, "admin_port": admin_port},
        "logging": {"level": "info", "format": "text"},
        "shutdown_deadline": 5,
    }))
    return cfg


async def test_a_port_taken_between_pick_and_bind_does_not_stop_the_bridge(
        tmp_path: Path, thief: tuple[int, asyncio.subprocess.Process]) -> None:
    """The kit lets the bridge bind port 0 and read back what it got: the configuration may name
    the stolen port (as the old tests wrote it), the bridge still serves."""
    stolen, _ = thief
    async with SimulatorProcess(log=tmp_path / "sim.log") as sim:
        cfg = write_config(tmp_path, sim.kubeconfig, stolen)
        async with ServiceProcess(config=cfg, log=tmp_path / "bridge.log") as bridge:
            address = await bridge.wait_ready()
            assert address.pid == bridge.pid
            assert stolen not in (address.port, address.admin_port)
            assert f"port={address.port}" in await bridge.wait_log("health endpoint listening")
            health = await bridge.get("/healthz")
            assert health == (200, b"ok\n")
            # Restarted, it listens again (on a port of its own) and the address file says where.
            await bridge.kill()
            await bridge.restart()
            again = await bridge.wait_ready()
            assert again.pid == bridge.pid != address.pid
            assert await bridge.stop() == 0


@pytest.mark.parametrize(("taken", "workers"), [("port", 1), ("admin_port", 1), ("port", 2)])
async def test_a_configured_port_that_is_taken_stops_the_service(
        tmp_path: Path, thief: tuple[int, asyncio.subprocess.Process], taken: str, workers: int) -> None:
    """Production behaviour unchanged: a port the configuration names is used as it is, and when
    another process holds it the service exits saying so (no port of its own choosing): an
    operational error naming the field, the address and what to do, with the exit code of a
    configuration error (2), and no traceback. With workers, the supervisor's listeners are the
    configured ones: it stops before starting any worker."""
    stolen, _ = thief
    async with Simulator() as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        cfg = write_config(tmp_path, kubeconfig, *((stolen, 0) if taken == "port" else (0, stolen)))
        cfg.write_text(cfg.read_text() + f"workers: {workers}\n")
        bridge = ServiceProcess(config=cfg, log=tmp_path / "bridge.log", fixed_ports=True)
        async with bridge:
            with pytest.raises(ProcessFailed, match="exited with code 2"):
                await bridge.wait_listening()
        output = bridge.output()
        assert (f"kube-event-bridge: server.{taken}: cannot listen on 127.0.0.1:{stolen}: "
                "address already in use") in output, output
        assert "another process" in output, output
        assert f"choose another server.{taken}" in output, output
        assert "Traceback" not in output, output
        assert "this is a bug" not in output, output
        assert "worker 0 of" not in output, output
        assert not bridge.address_file.exists()


async def test_the_simulator_reports_the_port_it_bound(
        tmp_path: Path, thief: tuple[int, asyncio.subprocess.Process]) -> None:
    stolen, _ = thief
    async with SimulatorProcess(log=tmp_path / "sim.log", args=("--namespaces", "web")) as sim:
        assert sim.url.startswith("http://127.0.0.1:")
        assert not sim.url.endswith(f":{stolen}")
        assert sim.url in sim.kubeconfig.read_text()
        client = ApiClient.from_kubeconfig(str(sim.kubeconfig))
        try:
            listed = await client.get("/api/v1/namespaces")
        finally:
            await client.close()
        assert "web" in {n["metadata"]["name"] for n in listed["items"]}
        assert await sim.stop() == 0
