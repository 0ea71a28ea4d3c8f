"""The sink benchmark runs end to end on small counts and reports sane figures."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.bench_sinks import KINDS, make_events, run
from sinks.contract import EventType


def test_events_are_realistic_pod_changes() -> None:
    events = make_events(30, objects=10)
    assert [ev.type for ev in events[:10]] == [EventType.ADDED] * 10
    assert all(ev.type is EventType.UPDATED and ev.old is not None for ev in events[10:])
    assert len({ev.uid for ev in events}) == 10
    assert events[10].old is events[0].obj
    assert len(orjson.dumps(events[0].obj)) > 2000


def test_bench_sinks_smoke(tmp_path: Path) -> None:
    result = run(quick=True, events=200, results_dir=tmp_path)
    assert set(result["sinks"]) == set(KINDS)
    for kind, row in result["sinks"].items():
        assert row["events"] == 200, kind
        assert row["sink_events_per_s"] > 0, kind
        assert row["raw_events_per_s"] > 0, kind
        # The ratio is the figure's arithmetic, never a speed: on 200 events a loaded machine moves
        # either side by an order of magnitude (a bound of 20 failed once beside other work).
        assert row["ratio"] == row["sink_ratio"] > 0, (kind, row)
        expected = row["sink_events_per_s"] / row["raw_events_per_s"]
        assert row["sink_ratio"] == pytest.approx(expected, rel=0.01, abs=0.002), (kind, row)
        assert row["payload_bytes_avg"] > 1000, kind
    written = orjson.loads((tmp_path / "sinks.json").read_bytes())
    assert written["sinks"].keys() == result["sinks"].keys()
