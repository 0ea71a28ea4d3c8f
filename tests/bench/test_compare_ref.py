"""Smoke test of ``python -m bench.run --compare-ref REF``: both sides run, each from its own tree.

Cheap on purpose (the quick telemetry scenario, a few seconds per side): it proves the comparison
checks out REF in a temporary worktree, imports the project from there on one side and from a
snapshot of this tree on the other, pairs the figures with their ratio, and removes its worktrees.
It never asserts wall-clock limits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def test_compare_ref_runs_both_trees_and_reports_their_ratio(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--compare-ref", "HEAD", "--quick", "--only", "telemetry",
         "--results-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "compare-HEAD.json").read_text())
    assert report["ref_commit"] == head
    block = report["scenarios"]["telemetry"]
    assert block["ref"]["status"] == "ok", block["ref"].get("error")
    assert block["here"]["status"] == "ok", block["here"].get("error")

    # Each side imported the project (and the harness) from its own temporary tree, not from here.
    imports = report["imports"]
    ref_root = Path(imports["ref"]["bridge"]).parents[1]
    here_root = Path(imports["here"]["bridge"]).parents[1]
    assert ref_root != here_root
    for side, root in (("ref", ref_root), ("here", here_root)):
        assert root != REPO
        assert all(Path(p).is_relative_to(root) for p in imports[side].values()), imports[side]
        assert not root.exists()  # removed afterwards

    # The figure is paired, with its ratio, in the JSON and in the printed table.
    (row,) = block["rows"]
    assert row["ref"] > 0
    assert row["here"] > 0
    assert row["ratio"] == round(row["here"] / row["ref"], 3)
    assert row["figure"] in proc.stdout
    assert (tmp_path / "compare-HEAD.txt").read_text().strip() in proc.stdout
    after = _worktrees()
    assert str(ref_root) not in after
    assert str(here_root) not in after
