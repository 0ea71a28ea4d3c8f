"""bench.bench_calls' figures: Python function calls leave C functions out, and the steady state is
the difference of two runs of one setup, per event of the difference."""

from __future__ import annotations

import cProfile

import pytest

from bench.bench_calls import counts, steady


def _helper(x: int) -> int:
    return x + 1


def _work() -> int:
    total = 0
    for i in range(10):
        total += _helper(abs(len(str(i))))  # one Python call, two C function calls (len, abs)
    return total


def test_python_calls_leave_out_c_functions() -> None:
    prof = cProfile.Profile()
    prof.enable()
    _work()
    prof.disable()
    total, python = counts(prof)
    # _work and ten _helper calls; len, abs (and the profiler's disable) are C functions.
    assert python == 11
    assert total >= python + 20


def test_steady_state_subtracts_the_base_run() -> None:
    # 10,000 events at 5,000 start-up calls + 40 a piece; 2,000 events with the same start-up.
    assert steady((10_000, 5_000 + 400_000, 1_000 + 300_000),
                  (2_000, 5_000 + 80_000, 1_000 + 60_000)) == (40.0, 30.0)
    with pytest.raises(ValueError, match="fewer events"):
        steady((2_000, 1, 1), (2_000, 1, 1))
