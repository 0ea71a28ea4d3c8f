"""A checkpoint whose resourceVersion the API server has not reached: the bridge says so (a WARNING
with the wait before the relist, a readiness detail while it waits), then relists and delivers.

In-process service against the simulator over real HTTP: a first run against a busy simulator leaves
a checkpoint at a high resourceVersion; the second run meets a fresh simulator that is far behind it
(as after restoring an older etcd backup), which answers 504 "Too large resource version"."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from tests.service.test_service import eventually, get, lines

pytestmark = pytest.mark.usefixtures("own_cwd")


def _config(sim: Simulator, tmp_path: Path, name: str) -> BridgeConfig:
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / f"{name}.kubeconfig")),
                       "in_cluster": "false"},
        "resources": [{"resource": "pods", "namespace": "default"}],
        "sinks": [{"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")}],
        "checkpoint": {"store": "file", "directory": str(tmp_path / "checkpoints"), "interval": 0.2},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


async def test_a_checkpoint_ahead_of_the_server_is_reported_until_the_relist(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with Simulator() as busy:
        for i in range(60):
            busy.store.create("pods", make_pod(f"old{i}", "default"))
        service = BridgeService(config=_config(busy, tmp_path, "busy"))
        task = asyncio.create_task(service.run())
        try:
            await eventually(lambda: len(lines(tmp_path / "events.jsonl")) >= 60, what="the first run")
        finally:
            service.stop_event.set()
            assert await task == 0
        high = int(busy.store.resource_version)

    caplog.set_level(logging.INFO, logger="bridge.service.api_waits")
    # Each 504 is held 0.2 s, then Retry-After: 1; ten retries: about 12 s before the relist.
    async with Simulator(too_large_wait=0.2) as behind:
        behind.store.create("pods", make_pod("fresh", "default"))
        assert int(behind.store.resource_version) < high
        service = BridgeService(config=_config(behind, tmp_path, "behind"))
        task = asyncio.create_task(service.run())
        try:
            await eventually(lambda: any("ahead of the API server" in r for r in service.readiness().reasons),
                             timeout=20, what="the readiness detail")
            status, body = await get(f"http://127.0.0.1:{service.health.admin_port}/readyz")
            assert status == 503
            detail = next(r for r in orjson.loads(body)["reasons"] if "ahead of the API server" in r)
            assert "pods" in detail
            assert "relisting from a consistent read in about" in detail
            left = float(detail.rsplit("about ", 1)[1].split(" s")[0])
            assert 4 <= left <= 16, detail
            warning = next(r for r in caplog.records if r.levelno == logging.WARNING
                           and "ahead of the API server" in r.getMessage())
            assert "Too large resource version" in warning.getMessage()
            assert 4 <= warning.wait_seconds <= 16  # type: ignore[attr-defined]
            # The retries run out, the bridge relists and delivers what the server holds.
            await eventually(lambda: any(e.get("subject") == "default/fresh"
                                         for e in lines(tmp_path / "events.jsonl")),
                             timeout=30, what="the object after the relist")
            await eventually(lambda: service.readiness().ready, timeout=10, what="readiness after the relist")
            assert any("relisting from a consistent read now" in r.getMessage() for r in caplog.records)
        finally:
            service.stop_event.set()
            await task
