"""The delivery contract under a seeded random fault schedule (see tests/contract/fault_schedule.py).

A few short schedules run here, and one short run of the combined profile (issue 34's incident: 150
Pods churned at 200 changes/s, a checkpoint every 2 s, dead letters on every sink; every sink's
outage at once, 410s into the open watches, SIGKILLs before, during and after the outages, one while
Kafka drains its backlog; ``KEB_FAULT_SCALE`` stretches its timeline, 1.0 being the incident's 52 s);
``KEB_FAULT_SEED=N`` replays one seed (``KEB_FAULT_DURATION`` lengthens it), and
``scripts/fault-schedule`` runs long ones (``--profile combined --scale 1``). A failure prints the
seed and the verifier's findings for every sink, and what a consumer that drops repeated ids ends
with (the contract's specification, :mod:`bridge.testing.spec`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.fault_schedule import FAULTS, PROFILES, Infra, infrastructure, run_seed

SEEDS = [int(os.environ["KEB_FAULT_SEED"])] if os.environ.get("KEB_FAULT_SEED") else [11, 22, 33]
DURATION = float(os.environ.get("KEB_FAULT_DURATION", "4"))
SCALE = float(os.environ.get("KEB_FAULT_SCALE", "0.15"))
COMBINED_SEED = int(os.environ.get("KEB_FAULT_SEED", "44"))


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


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_every_sink_matches_the_cluster_after_every_outage_at_once(infra: Infra,
                                                                     tmp_path: Path) -> None:
    log: list[str] = []
    outcome = await run_seed(infra, COMBINED_SEED, DURATION, tmp_path, say=log.append, profile="combined",
                             scale=SCALE)
    print(outcome.summary())
    assert outcome.ok, (f"combined fault profile failed; replay with KEB_FAULT_SEED={COMBINED_SEED}"
                        f"\n{outcome.summary()}\n" + "\n".join(log))
    assert {"kill:before", "kill:during", "kill:draining", "kill:after", "outages:kafka+nats+webhook",
            "expire:0", "expire:2"} <= set(outcome.faults)
    assert outcome.restarts >= 5


def test_the_profiles() -> None:
    assert PROFILES == ("random", "combined")
