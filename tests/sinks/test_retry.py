"""Backoff delays, jitter bounds, Retry-After and give-up budgets."""

from __future__ import annotations

import pytest

from sinks.options import RetryOptions
from sinks.retry import RetryPolicy


def test_exponential_delays_capped_without_jitter() -> None:
    p = RetryPolicy(RetryOptions(initial=0.5, max=3.0, factor=2.0, jitter=0.0))
    assert [p.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_bounds() -> None:
    opts = RetryOptions(initial=1.0, max=10.0, factor=2.0, jitter=0.25)
    assert RetryPolicy(opts, rng=lambda: 0.0).delay(2) == pytest.approx(1.5)
    assert RetryPolicy(opts, rng=lambda: 1.0).delay(2) == pytest.approx(2.5)
    assert RetryPolicy(opts, rng=lambda: 0.5).delay(2) == pytest.approx(2.0)


def test_retry_after_replaces_backoff_and_is_capped() -> None:
    p = RetryPolicy(RetryOptions(initial=0.1, max=1.0, max_retry_after=60.0))
    assert p.delay(1, retry_after=7.0) == 7.0
    assert p.delay(9, retry_after=0.0) == 0.0
    assert p.delay(1, retry_after=3600.0) == 60.0
    assert p.delay(1, retry_after=-5.0) == 0.0


def test_give_up_budgets() -> None:
    forever = RetryPolicy(RetryOptions())
    assert not forever.give_up(10_000, 1e9)
    attempts = RetryPolicy(RetryOptions(max_attempts=3))
    assert [attempts.give_up(n, 0.0) for n in (1, 2, 3)] == [False, False, True]
    elapsed = RetryPolicy(RetryOptions(max_elapsed=30.0))
    assert not elapsed.give_up(100, 29.9)
    assert elapsed.give_up(2, 30.0)
