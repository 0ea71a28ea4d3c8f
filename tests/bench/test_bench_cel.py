"""The filter benchmark (bench/bench_cel.py) runs and reports, for every documented example, a cost
per event, the same verdicts with and without pruning, and the projection's saving."""

from __future__ import annotations

from pathlib import Path

from bench import bench_cel


def test_the_filter_benchmark_reports_each_example(tmp_path: Path) -> None:
    summary = bench_cel.run(quick=True, out=tmp_path)
    assert set(summary["examples"]) == set(bench_cel.EXAMPLES)
    for name, e in summary["examples"].items():
        assert e["filter_us"] > 0, name
        assert e["whole_us"] > 0, name
        assert 0 < e["passed"] < e["events"], name  # some objects match, some do not
        assert e["bytes_projected"] < e["bytes_whole"], name
    assert summary["examples"]["failed"]["reads"] == ["status.phase"]
    assert (tmp_path / "cel.json").is_file()
    assert "sink without a filter" in bench_cel.table(summary)
