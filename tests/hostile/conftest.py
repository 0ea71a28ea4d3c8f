"""The hostile suite's fixture: a scripted API server (tests/hostile/apiserver.py) per test, on a
port the system picks, stopped when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .apiserver import HostileApiServer


@pytest.fixture
async def server() -> AsyncIterator[HostileApiServer]:
    srv = HostileApiServer()
    await srv.start()
    yield srv
    await srv.stop()
