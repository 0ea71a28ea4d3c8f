"""Smoke test of bench/bench_decode.py: a quick run produces the documented JSON, and the bridge's
decoding beats the official client's typed models on the same data."""

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
    # Typed models cost an order of magnitude; even on a loaded machine raw decoding is far ahead.
    assert decode["msgspec"] > 3 * decode["official_typed"]
    assert decode["raw-object"] > 3 * decode["official_typed"]
    assert result["decode_only_ratio_default_vs_typed"] > 3
