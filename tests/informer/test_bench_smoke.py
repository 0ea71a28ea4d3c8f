"""The informer benchmark runs end to end (quick sizes), writes its JSON and reports sane numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_informer import main


def test_quick_bench_reports_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "informer.json"
    main(["--quick", "--output", str(out)])
    assert "deltas/s" in capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["quick"] is True
    for label in ("with_transform", "without_transform"):
        t = results["throughput"][label]
        assert t["deltas"] == 900  # 300 adds + 2 rounds of 300 updates
        assert t["deltas_per_second"] > 0
    with_t, without_t = results["memory"]["with_transform"], results["memory"]["without_transform"]
    assert with_t["raw_json_bytes"] == without_t["raw_json_bytes"] > 3500
    assert without_t["cached_json_bytes"] == without_t["raw_json_bytes"]
    assert with_t["cached_json_bytes"] < 0.8 * with_t["raw_json_bytes"]  # managedFields dropped
    assert with_t["bytes_per_object"] < without_t["bytes_per_object"]
    assert without_t["ratio_to_raw_json"] > 1.0  # a dict tree costs more than its JSON
