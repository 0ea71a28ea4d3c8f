"""The NATS internals benchmark measures both paths and leaves the sinks as they were."""

from __future__ import annotations

from pathlib import Path

import orjson

import sinks.nats
import sinks.nats_base
from bench.bench_nats_internals import public_api_only, run


def test_public_api_only_switches_the_fast_paths_off_and_back() -> None:
    end_of_pass = sinks.nats.JetStreamTransport._end_of_pass
    with public_api_only():
        assert not sinks.nats_base._HAS_CLIENT_INTERNALS
        assert not sinks.nats_base._HAS_PUBLISH_INTERNALS
        assert sinks.nats.JetStreamTransport._end_of_pass is sinks.nats_base.NatsTransportBase._end_of_pass
    assert sinks.nats_base._HAS_CLIENT_INTERNALS
    assert sinks.nats_base._HAS_PUBLISH_INTERNALS
    assert sinks.nats.JetStreamTransport._end_of_pass is end_of_pass


def test_bench_nats_internals_smoke(tmp_path: Path) -> None:
    result = run(reps=2, counts={"nats": 120, "jetstream": 60}, batch=32, results_dir=tmp_path)
    for kind in ("nats", "jetstream"):
        figures = result["sinks"][kind]
        assert len(figures["reps"]) == 2, kind
        for row in figures["reps"]:
            for path in ("internals", "public"):
                assert row[path]["events_per_s"] > 0, (kind, path)
                assert row[path]["cpu_us_per_event"] > 0, (kind, path)
        assert figures["median_cpu_ratio"] > 0, kind
    written = orjson.loads((tmp_path / "nats-internals.json").read_bytes())
    assert written["sinks"].keys() == {"nats", "jetstream"}
