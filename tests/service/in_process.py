"""The bridge run in the test's own process for the length of a block: ``BridgeService.run`` as a
task, stopped on the way out as a SIGTERM would stop it, its exit code checked.

A test that runs a bridge in-process gives it a spill root of its own (``checkpoint.spill_directory``
under ``tmp_path``, or the ``own_cwd`` fixture): a spill root belongs to one bridge at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService


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
