"""Backoff: client-go's reflector numbers (0.8 s doubling up to 30 s, jitter 1.0, reset after 2 min)."""

from __future__ import annotations

import asyncio
import random

import pytest

from bridge.clock import FakeClock
from bridge.informer.backoff import Backoff, BackoffOptions


def test_defaults_are_client_go_reflector_values() -> None:
    b = Backoff(clock=FakeClock())
    assert b.options == BackoffOptions(initial=0.8, factor=2.0, jitter=1.0, cap=30.0, reset_after=120.0)


def test_without_jitter_doubles_up_to_the_cap() -> None:
    b = Backoff(jitter=0.0, clock=FakeClock())
    delays = [b.next_delay() for _ in range(9)]
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0])


def test_jitter_adds_up_to_one_times_the_base_with_the_injected_rng() -> None:
    b = Backoff(clock=FakeClock(), rng=random.Random(42))
    reference = random.Random(42)
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    expected = [base + reference.random() * base for base in bases]
    assert [b.next_delay() for _ in bases] == pytest.approx(expected)
    # Jitter comes on top of the cap, as in client-go: a capped delay lies in [30, 60).
    assert all(30.0 <= d < 60.0 for d in [b.next_delay() for _ in range(50)])


def test_same_seed_same_delays() -> None:
    a = Backoff(clock=FakeClock(), rng=random.Random(7))
    b = Backoff(clock=FakeClock(), rng=random.Random(7))
    assert [a.next_delay() for _ in range(10)] == [b.next_delay() for _ in range(10)]


async def test_resets_after_two_minutes_without_backoff() -> None:
    clock = FakeClock()
    b = Backoff(jitter=0.0, clock=clock)
    assert [b.next_delay() for _ in range(3)] == pytest.approx([0.8, 1.6, 3.2])
    await clock.advance(120.0)  # exactly the reset interval: not more, so no reset
    assert b.next_delay() == pytest.approx(6.4)
    await clock.advance(120.5)
    assert b.next_delay() == pytest.approx(0.8)
    assert b.next_delay() == pytest.approx(1.6)


def test_reset_starts_over() -> None:
    b = Backoff(jitter=0.0, clock=FakeClock())
    b.next_delay()
    b.next_delay()
    b.reset()
    assert b.next_delay() == pytest.approx(0.8)


async def test_wait_sleeps_the_delay_on_the_clock() -> None:
    clock = FakeClock()
    b = Backoff(jitter=0.0, clock=clock)
    task = asyncio.create_task(b.wait(), name="backoff-wait")
    await asyncio.sleep(0)
    assert clock.next_deadline() == pytest.approx(clock.now() + 0.8)
    await clock.advance(0.79)
    assert not task.done()
    await clock.advance(0.01)
    assert task.done()
    assert task.result() == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("min_delay", "expected"),
    [(None, 0.8), (0.1, 0.8), (5.0, 5.0)],
)
async def test_wait_honours_a_longer_retry_after(min_delay: float | None, expected: float) -> None:
    clock = FakeClock()
    b = Backoff(jitter=0.0, clock=clock)
    task = asyncio.create_task(b.wait(min_delay), name="backoff-wait")
    await asyncio.sleep(0)
    assert clock.next_deadline() == pytest.approx(clock.now() + expected)
    await clock.advance(expected)
    assert await task == pytest.approx(expected)
    assert b.last_delay == pytest.approx(expected)
    # The retry-after still consumed a step of the policy.
    assert b.next_delay() == pytest.approx(1.6)


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0.0}, {"factor": 0.5}, {"jitter": -1.0}, {"cap": 0.1}, {"reset_after": -1.0}],
)
def test_invalid_options_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        BackoffOptions(**kwargs)
    with pytest.raises(ValueError, match="backoff"):
        Backoff(clock=FakeClock(), **kwargs)  # type: ignore[arg-type]
