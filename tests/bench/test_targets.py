"""The harness's verdicts on issue #28's targets (bench/run.py, ``evaluate_targets``): a rate the
simulator did not reach judges nothing, a reached one is judged against the goal."""

from __future__ import annotations

from typing import Any

from bench.run import evaluate_targets


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "result": result}


def _by_name(scenarios: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["target"].split(":")[0]: t for t in evaluate_targets(scenarios, quick=False)}


def _latency(sent: int, p99: float) -> dict[str, Any]:
    return {"sinks": {kind: {"5000": {"p99_ms": p99, "achieved_rate": sent}} for kind in ("file", "kafka")}}


def test_p99_at_5k_is_judged_only_when_the_simulator_reached_the_rate() -> None:
    short = _by_name({"latency": _ok(_latency(3_000, 900.0))})["p99 latency at 5k events/s (worst sink)"]
    assert short["met"] is None
    assert "the simulator sent at file 3,000/s, kafka 3,000/s" in short["note"]
    reached = _by_name({"latency": _ok(_latency(4_990, 30.0))})["p99 latency at 5k events/s (worst sink)"]
    assert reached["met"] is False
    assert _by_name({"latency": _ok(_latency(4_990, 20.0))})[
        "p99 latency at 5k events/s (worst sink)"]["met"] is True


def test_the_long_target_needs_the_rate_and_no_410() -> None:
    def long(achieved: int, expired: int, rate: float = 12_000, seconds: float = 60) -> dict[str, Any]:
        return _by_name({"long": _ok({"rate": rate, "seconds": seconds, "achieved_rate": achieved,
                                      "expired_410": expired})})["long"]

    assert long(9_000, 2)["met"] is None
    assert "achieved 9,000/s" in long(9_000, 2)["note"]
    assert long(11_900, 1)["met"] is False
    assert long(11_900, 0)["met"] is True
    assert long(10_000, 0, rate=10_000)["met"] is None  # slower than the target's rate


def test_issue_28_goals_for_the_ratios_and_the_sync() -> None:
    targets = _by_name({
        "throughput": _ok({"sinks": {"kafka": {"ratio_to_ceiling": 0.21},
                                     "jetstream": {"ratio_to_ceiling": 0.79}}}),
        "initial_sync": _ok({"pods": 100_000, "delivered_seconds": 6.5, "cpu_seconds": 5.9}),
    })
    assert targets["kafka throughput vs raw producer"]["met"] is True
    assert targets["jetstream throughput vs raw publish loop"]["met"] is False
    sync = targets["100k Pods listed and delivered to the file sink"]
    assert (sync["met"], sync["goal"], sync["note"]) == (False, "<= 6 s", "bridge CPU 5.9 s")
