"""Suite-wide fixtures: a guard that fails any test leaking asyncio tasks; the bridges the tests
run see no CPU limit, whatever the machine's, so that ``workers`` unset is one process everywhere
(tests/service/test_workers.py sets a fake cgroup of its own to test the default); and Hypothesis's
profiles: ``ci`` (the default) is derandomised, so a CI failure replays by running the test again,
and ``random`` (``KEB_HYPOTHESIS_PROFILE=random``, used by ``scripts/flake-hunt`` with
``--hypothesis-seed``) draws fresh examples. Neither has a deadline or the too-slow health check
(wall-clock limits, which load breaks) nor an example database (no shared files).

Bytecode is cached whatever the environment says: with ``PYTHONDONTWRITEBYTECODE`` set (container
images often set it), every run's xdist workers rewrote the assertions of every test module again
(collecting the suite took 12 s of CPU instead of 4.6 s), and every bridge or simulator process
the tests start compiled the bridge's modules from source again (0.05 to 0.2 s of CPU each,
hundreds of times a run). Caches go where Python puts them (``__pycache__``, ignored by git), written
atomically, so workers and child processes share them safely."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.dont_write_bytecode = False  # pytest's rewritten test modules, and what is imported from here on
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the processes the tests start

from bridge.service.workers import CGROUP_ENV  # noqa: E402  (after the bytecode switch above)

os.environ[CGROUP_ENV] = tempfile.mkdtemp(prefix="keb-no-cgroup-")

for _name, _derandomize in (("ci", True), ("random", False)):
    settings.register_profile(_name, derandomize=_derandomize, database=None, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("KEB_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def own_cwd(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs the test in a directory of its own, so that a bridge it runs with the cwd-relative
    defaults (``checkpoint.spill_directory``, ``checkpoint.directory``) has its own spill root and
    checkpoints: a spill root belongs to one bridge (bridge/service/spill_lock.py), and tests on
    several xdist workers would otherwise share the checkout's. For the modules that run
    ``BridgeService`` in-process (``pytestmark = pytest.mark.usefixtures("own_cwd")``)."""
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    return cwd


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
