"""``python -m bridge.sim`` as a separate process: it serves, writes a kubeconfig, churns, and stops."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from pathlib import Path

import aiohttp
import yaml

from bridge.sim import Simulator
from bridge.sim.cli import _freeze_after_full_collections


async def _start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.sim", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
    assert line.startswith("simulator listening on http://127.0.0.1:"), line
    return proc, line.rsplit(" ", 1)[1].strip()


async def test_subprocess_serves_with_kubeconfig_and_churn(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    proc, url = await _start("--kubeconfig", str(kubeconfig), "--churn-rate", "200", "--churn-objects", "5",
                             "--namespaces", "a,b", "--seed", "1", "--token", "t0k",
                             "--crd", "example.com/v1/widgets/Widget", "--bookmark-interval", "0.5")
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == url
        assert config["users"][0]["user"] == {"token": "t0k"}
        headers = {"Authorization": "Bearer t0k"}
        async with aiohttp.ClientSession(headers=headers) as http:
            pods = await (await http.get(f"{url}/api/v1/pods")).json()
            assert 1 <= len(pods["items"]) <= 5
            assert {p["metadata"]["namespace"] for p in pods["items"]} <= {"a", "b"}
            first_rv = int(pods["metadata"]["resourceVersion"])
            await asyncio.sleep(0.3)
            state = await (await http.get(f"{url}/_sim/state")).json()
            assert int(state["resourceVersion"]) > first_rv  # churn keeps going
            widgets = await http.get(f"{url}/apis/example.com/v1/widgets")
            assert widgets.status == 200
            assert (await http.get(f"{url}/api/v1/pods", headers={"Authorization": "Bearer x"})).status == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 10)
    assert rc == 0


async def test_sigint_stops_with_open_watch() -> None:
    proc, url = await _start()
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{url}/api/v1/pods", params={"watch": "1"})
        assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert await asyncio.wait_for(resp.content.read(), 5) == b""


async def test_busy_port_is_a_clear_error() -> None:
    async with Simulator() as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.sim", "--port", str(sim.port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    assert b"cannot listen on 127.0.0.1:" in err
    assert out == b""


def test_the_simulator_process_leaves_what_survived_a_full_collection_out_of_the_next() -> None:
    survivor = [{"metadata": {"name": f"p-{i}"}} for i in range(100)]
    gc.unfreeze()
    try:
        _freeze_after_full_collections("start", {"generation": 2})
        _freeze_after_full_collections("stop", {"generation": 1})
        assert gc.get_freeze_count() == 0  # only after a full collection
        _freeze_after_full_collections("stop", {"generation": 2})
        assert gc.get_freeze_count() >= len(survivor)
    finally:
        gc.unfreeze()
