"""The delivery contract under a seeded random fault schedule (see tests/contract/fault_schedule.py).

A few short schedules run here; ``KEB_FAULT_SEED=N`` replays one seed (``KEB_FAULT_DURATION``
lengthens it), and ``scripts/fault-schedule`` runs long ones. A failure prints the seed and the
verifier's findings for every sink.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.fault_schedule import FAULTS, Infra, infrastructure, run_seed

SEEDS = [int(os.environ["KEB_FAULT_SEED"])] if os.environ.get("KEB_FAULT_SEED") else [11, 22, 33]
DURATION = float(os.environ.get("KEB_FAULT_DURATION", "4"))


@pytest.fixture(scope="module")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    with infrastructure(tmp_path_factory.mktemp("faults")) as world:
        yield world


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", SEEDS)
async def test_every_sink_matches_the_cluster_after_a_random_fault_schedule(
        infra: Infra, seed: int, tmp_path: Path) -> None:
    log: list[str] = []
    outcome = await run_seed(infra, seed, DURATION, tmp_path, say=log.append)
    print(outcome.summary())
    assert outcome.ok, (f"fault schedule failed; replay with KEB_FAULT_SEED={seed}\n{outcome.summary()}\n"
                        + "\n".join(log))
    assert outcome.changes > 100
    assert outcome.faults, "the schedule injected no fault"


def test_the_schedule_draws_every_fault_kind() -> None:
    assert set(FAULTS) == {"kill", "kill_compact", "kafka_pause", "nats_restart", "hook_storm", "watch_cut",
                           "expire", "garble"}
