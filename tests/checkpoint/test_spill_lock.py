"""A spill root belongs to one bridge process: at start a bridge removes every directory under its
``checkpoint.spill_directory`` that is not one of its sinks' spills, so a second bridge on the same
root (the cwd-relative default, a shared volume) would delete the first's backlog. The first to start
locks the root for its life (the kernel drops the lock when it dies, even by SIGKILL); another one
refuses to start with exit code 2. The workers of one supervisor share the supervisor's lock."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.delivery.assembly import safe_name
from bridge.errors import ConfigurationError
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.service.spill_lock import lock_spill_root
from bridge.sim import Simulator
from bridge.testing.processes import ServiceProcess, SimulatorProcess
from tests.service.test_service import eventually


def write_config(tmp: Path, name: str, kubeconfig: Path, spill: Path, **extra: Any) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "configmaps"}],
        "sinks": [{"name": name, "kind": "file", "path": str(tmp / f"{name}.jsonl")}],
        "checkpoint": {"store": "file", "directory": str(tmp / f"cp-{name}"),
                       "spill_directory": str(spill)},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "logging": {"level": "info", "format": "text"},
        "shutdown_deadline": 5,
        **extra,
    }))
    return cfg


def backlog(spill: Path, sink: str) -> Path:
    """A file standing for the backlog of ``sink`` under the spill root."""
    canary = spill / safe_name(sink) / "backlog.canary"
    canary.parent.mkdir(parents=True, exist_ok=True)
    canary.write_text("the first bridge's backlog\n")
    return canary


async def refused(tmp: Path, name: str, kubeconfig: Path, spill: Path) -> str:
    """Starts a bridge with sink ``name`` on ``spill``: it must exit 2 with the operational error."""
    cfg = write_config(tmp, name, kubeconfig, spill)
    second = ServiceProcess(config=cfg, log=tmp / f"{name}.log")
    await second.start()
    try:
        assert await second.wait(timeout=60) == 2, second.log_tail()
    finally:
        if second.running:
            await second.kill()
    out = second.output()
    assert "Traceback" not in out, out
    assert "checkpoint.spill_directory" in out, out
    assert str(spill) in out, out
    assert "another bridge" in out, out
    assert "removing the spill" not in out, out
    return out


async def test_a_second_bridge_on_a_locked_spill_root_refuses_and_leaves_the_spill(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    async with SimulatorProcess(log=tmp_path / "sim.log") as sim:
        first_cfg = write_config(tmp_path, "first", sim.kubeconfig, spill)
        async with ServiceProcess(config=first_cfg, log=tmp_path / "first.log") as first:
            await first.wait_ready()
            canary = backlog(spill, "first")
            await refused(tmp_path, "second", sim.kubeconfig, spill)
            assert canary.is_file(), "the second bridge removed the first's spill"
            first.check_running("after the second bridge was refused")
            # SIGKILL: the kernel releases the lock, so a successor on the root starts.
            first.send_signal(signal.SIGKILL)
            await first.wait()
            successor = ServiceProcess(config=write_config(tmp_path, "first", sim.kubeconfig, spill),
                                       log=tmp_path / "successor.log")
            async with successor:
                await successor.wait_ready()
                assert await successor.stop() == 0


async def test_the_workers_of_one_supervisor_share_its_spill_root(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    async with SimulatorProcess(log=tmp_path / "sim.log") as sim:
        cfg = write_config(tmp_path, "pod", sim.kubeconfig, spill, workers=2)
        async with ServiceProcess(config=cfg, log=tmp_path / "pod.log") as pod:
            await pod.wait_ready()
            for index in (0, 1):
                await pod.wait_log(f"worker {index} of 2 started")
            canary = backlog(spill, "pod")
            await refused(tmp_path, "other", sim.kubeconfig, spill)
            assert canary.is_file(), "the second bridge removed the pod's spill"
            pod.check_running("after the other bridge was refused")
            assert "exited with code" not in pod.output(), pod.log_tail()
            assert await pod.stop() == 0


def test_the_lock_is_per_open_file_and_absent_without_a_spill(tmp_path: Path) -> None:
    assert lock_spill_root("") is None
    fd = lock_spill_root(str(tmp_path / "spill"))
    assert fd is not None
    try:
        with pytest.raises(ConfigurationError, match="in use by another bridge process"):
            lock_spill_root(str(tmp_path / "spill"))
    finally:
        os.close(fd)
    again = lock_spill_root(str(tmp_path / "spill"))  # released with its descriptor
    assert again is not None
    os.close(again)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match=r"checkpoint\.spill_directory: .* cannot be used"):
        lock_spill_root(str(tmp_path / "file" / "spill"))


async def test_an_in_process_bridge_holds_its_spill_root_for_its_run(tmp_path: Path) -> None:
    """``BridgeService.run`` in a process of its own's stead (tests, embedders): the same lock, held
    for the run and released when it returns."""
    spill = tmp_path / "spill"
    async with Simulator() as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")

        def service(name: str) -> BridgeService:
            data = yaml.safe_load(write_config(tmp_path, name, kubeconfig, spill).read_text())
            return BridgeService(config=BridgeConfig.model_validate(data))

        first = service("first")
        running = asyncio.create_task(first.run(), name="first-bridge")
        await eventually(lambda: first.readiness().ready, timeout=60, what="the first bridge ready")
        canary = backlog(spill, "first")
        with pytest.raises(ConfigurationError, match="in use by another bridge process"):
            await service("second").run()
        assert canary.is_file(), "the second bridge removed the first's spill"
        assert not running.done()
        first.stop_event.set()
        assert await running == 0
        successor = service("first")  # the run released the root
        running = asyncio.create_task(successor.run(), name="successor-bridge")
        await eventually(lambda: successor.readiness().ready, timeout=60, what="the successor ready")
        successor.stop_event.set()
        assert await running == 0
