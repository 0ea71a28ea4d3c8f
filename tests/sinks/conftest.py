"""The sink tests' fixture: every sink a test handed to :func:`tests.sinks.close_after_test` is
closed when the test ends, even when it failed half-way (a sink left open keeps its connections and
tasks past the test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.sinks import close_opened_sinks


@pytest.fixture(autouse=True)
async def close_sinks() -> AsyncIterator[None]:
    yield
    await close_opened_sinks()
