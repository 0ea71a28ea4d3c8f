"""Suite-wide fixtures: a guard that fails any test leaking asyncio tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Every background task a test starts must have ended when the test ends."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    if leaked:
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        names = ", ".join(sorted(t.get_name() for t in leaked))
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")
