"""The delivery contract under a seeded random fault schedule (see tests/contract/fault_schedule.py).

A few short schedules run here, and one short run of the combined profile (issue 34's incident: 150
Pods churned at 200 changes/s, a checkpoint every 2 s, dead letters on every sink; every sink's
outage at once, 410s into the open watches, SIGKILLs before, during and after the outages, one while
Kafka drains its backlog; ``KEB_FAULT_SCALE`` stretches its timeline, 1.0 being the incident's 52 s);
``KEB_FAULT_SEED=N`` replays one seed (``KEB_FAULT_DURATION`` lengthens it), and
``scripts/fault-schedule`` runs long ones (``--profile combined --scale 1``). The suite's combined run
churns at 50 changes/s (``KEB_FAULT_RATE``), what it reached before the churn's client stopped
rate-limiting itself to 50 requests a second: the schedule's length is the same at any rate, and a
quiet machine churning 200 changes/s would make the run four times the work. A failure prints the
seed and the verifier's findings for every sink, and what a consumer that drops repeated ids ends
with (the contract's specification, :mod:`bridge.testing.spec`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.fault_schedule import (
    FAULTS,
    PROFILES,
    SETUPS,
    Infra,
    Outcome,
    churn_workers,
    infrastructure,
    run_seed,
    slowest_rate,
)

SEEDS = [int(os.environ["KEB_FAULT_SEED"])] if os.environ.get("KEB_FAULT_SEED") else [11, 22, 33]
DURATION = float(os.environ.get("KEB_FAULT_DURATION", "4"))
SCALE = float(os.environ.get("KEB_FAULT_SCALE", "0.15"))
COMBINED_SEED = int(os.environ.get("KEB_FAULT_SEED", "44"))
COMBINED_SETUP = dataclasses.replace(SETUPS["combined"], rate=float(os.environ.get("KEB_FAULT_RATE", "50")))


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
                             scale=SCALE, setup=COMBINED_SETUP)
    print(outcome.summary())
    assert outcome.ok, (f"combined fault profile failed; replay with KEB_FAULT_SEED={COMBINED_SEED}"
                        f"\n{outcome.summary()}\n" + "\n".join(log))
    assert {"kill:before", "kill:during", "kill:draining", "kill:after", "outages:kafka+nats+webhook",
            "expire:0", "expire:2"} <= set(outcome.faults)
    assert outcome.restarts >= 5


def test_the_profiles() -> None:
    assert PROFILES == ("random", "combined")


def _outcome(asked: float, applied: int, seconds: float) -> Outcome:
    return Outcome(seed=1, faults=[], changes=applied, reports={}, problems=[], restarts=1,
                   asked_rate=asked, applied=applied, churn_seconds=seconds)


def test_a_schedule_that_churned_below_the_asked_rate_says_so() -> None:
    short = _outcome(200.0, 3000, 60.0)  # 50 a second: what the churn reached with a rate-limited client
    assert short.achieved_rate == 50.0
    assert short.rate_shortfall(0.05) == ("RATE SHORT seed 1: the simulator applied 50.0 changes/s, 25% of "
                                          "the asked 200/s (tolerance 5%)")
    assert short.ok  # the delivery contract's verdict is its own
    assert _outcome(200.0, 11_500, 60.0).rate_shortfall(0.05) is None  # 191.7/s: within 5 %
    assert _outcome(200.0, 11_300, 60.0).rate_shortfall(0.05) is not None  # 188.3/s
    assert "churn: asked 200/s; the simulator applied 3000 changes in 60.0 s = 50.0/s" in short.summary()


def test_the_slowest_window_finds_a_stall_the_average_hides() -> None:
    # 200 a second for 20 s, but nothing from 8 to 13 s, caught up by 400 a second from 13 to 18 s.
    answered = [t / 200 for t in range(20 * 200) if not 8 <= t / 200 < 13]
    answered += [13 + t / 200 for t in range(5 * 200)]
    assert len(answered) / 20 == 200
    assert slowest_rate(sorted(answered), 0.0, 20.0) == 0.0
    assert slowest_rate([t / 200 for t in range(20 * 200)], 0.0, 20.0) == 200
    assert slowest_rate([0.5, 1.5, 2.5], 0.0, 3.0) == 1.0  # shorter than the window: the whole span


def test_the_churn_has_loops_enough_for_its_rate() -> None:
    # One loop waits for each answer: at 200 changes/s over 20 loops each may wait 100 ms.
    assert churn_workers(SETUPS["combined"]) == 20
    assert churn_workers(SETUPS["random"]) == 8
    assert churn_workers(dataclasses.replace(SETUPS["combined"], objects=5)) == 5  # loops own disjoint names
