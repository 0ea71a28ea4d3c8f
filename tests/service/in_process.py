"""The bridge run in the test's own process for the length of a block: ``BridgeService.run`` as a
task, stopped on the way out as a SIGTERM would stop it, its exit code checked; and the
configuration most such tests give it against the in-process simulator.

A test that runs a bridge in-process gives it a spill root of its own (``checkpoint.spill_directory``
under ``tmp_path``, or the ``own_cwd`` fixture): a spill root belongs to one bridge at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator


def simulator_config(sim: Simulator, tmp_path: Path, *, resources: Sequence[Mapping[str, Any]],
                     sinks: Sequence[Mapping[str, Any]] | None = None,
                     checkpoint: Mapping[str, Any] | None = None) -> BridgeConfig:
    """A bridge against ``sim`` (its kubeconfig written to ``tmp_path / "kubeconfig"``) watching
    ``resources`` and delivering to ``sinks``, by default one file sink ``file`` writing
    ``tmp_path / "events.jsonl"``; checkpoints in the file store under ``tmp_path / "cp"`` every
    0.2 s (``checkpoint``: settings added to those); the servers on ports the system picks; a
    shutdown deadline of 10 s."""
    if sinks is None:
        sinks = [{"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")}]
    return BridgeConfig.model_validate({
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                       "in_cluster": "false"},
        "resources": list(resources),
        "sinks": list(sinks),
        "checkpoint": {"store": "file", "directory": str(tmp_path / "cp"), "interval": 0.2,
                       **(checkpoint or {})},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


@contextlib.asynccontextmanager
async def running_service(config: BridgeConfig, *, exit_code: int | None = 0) -> AsyncIterator[BridgeService]:
    """Runs a :class:`BridgeService` of ``config`` in a task named ``service-under-test`` and yields
    the service. On leaving the block (whatever it raised) sets its stop event, awaits the run and
    asserts that it ended with ``exit_code`` (0: a graceful stop, every sink flushed and closed;
    None: the run is awaited, its exit code not checked)."""
    service = BridgeService(config=config)
    task = asyncio.create_task(service.run(), name="service-under-test")
    try:
        yield service
    finally:
        service.stop_event.set()
        code = await task
        if exit_code is not None:
            assert code == exit_code
