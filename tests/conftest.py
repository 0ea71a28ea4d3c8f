"""Suite-wide fixtures: a guard that fails any test leaking asyncio tasks; and the bridges the tests
run see no CPU limit, whatever the machine's, so that ``workers`` unset is one process everywhere
(tests/service/test_workers.py sets a fake cgroup of its own to test the default)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator

import pytest

from bridge.service.workers import CGROUP_ENV

os.environ[CGROUP_ENV] = tempfile.mkdtemp(prefix="keb-no-cgroup-")


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
