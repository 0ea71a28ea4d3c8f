"""Smoke test of bench/bench_restart.py in quick mode: the figures must be exact counts."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_restart


def test_quick_restart_bench(tmp_path: Path) -> None:
    result = bench_restart.run(quick=True, results_dir=tmp_path)
    assert json.loads((tmp_path / "restart.json").read_text())["resumed"] == result["resumed"]
    made = bench_restart.QUICK["pods"] * bench_restart.QUICK["rounds"]
    r, f = result["resumed"], result["fresh"]
    assert r["completed"] is True
    assert f["completed"] is True
    # Resumed from the checkpoint: every change delivered, nothing re-sent, no relist.
    assert (r["changes_made_while_down"], r["changes_delivered"], r["events_delivered"]) == (made, made, made)
    assert (r["duplicates"], r["relists"], r["objects_resent_as_added"]) == (0, 0, 0)
    # Without a checkpoint: every Pod re-sent as added, only its latest state survives.
    pods = bench_restart.QUICK["pods"]
    assert (f["objects_resent_as_added"], f["events_delivered"], f["relists"]) == (pods, pods, 1)
    assert f["intermediate_changes_lost"] == made - pods
    assert r["seconds_to_deliver"] > 0
