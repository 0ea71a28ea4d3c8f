"""Process tests and ports: a bridge started by a test must not lose its port to another process.

The old way (``tests.brokers.free_port``: bind to 0, close, write the number into the
configuration) leaves a window between the close and the child's bind in which any process on the
machine may take the port: the bridge then exits with "address already in use". Here that window is
made deterministic: a process of its own takes the very port the old way returned, before the bridge
starts."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from bridge.sim import Simulator
from tests.brokers import free_port

ROOT = Path(__file__).resolve().parents[2]
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


def write_config(tmp: Path, kubeconfig: Path, port: int) -> Path:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "configmaps"}],
        "sinks": [{"name": "file", "kind": "file", "path": str(tmp / "events.jsonl")}],
        "checkpoint": {"store": "file", "directory": str(tmp / "cp")},
        "server": {"host": "127.0.0.1", "port": port, "admin_port": 0},
        "logging": {"level": "info", "format": "text"},
        "shutdown_deadline": 5,
    }))
    return cfg


async def test_a_port_taken_between_pick_and_bind_does_not_stop_the_bridge(
        tmp_path: Path, thief: tuple[int, asyncio.subprocess.Process]) -> None:
    stolen, _ = thief
    async with Simulator() as sim:
        cfg = write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kubeconfig"), stolen)
        log = tmp_path / "bridge.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bridge.service.cli", "run", "--config", str(cfg), cwd=ROOT,
                stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 60
            async with aiohttp.ClientSession() as http:
                while True:
                    assert proc.returncode is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, log.read_text()[-3000:]
                    try:
                        async with http.get(f"http://127.0.0.1:{stolen}/readyz",
                                            timeout=aiohttp.ClientTimeout(total=1)) as r:
                            if r.status == 200:
                                break
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    await asyncio.sleep(0.05)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
