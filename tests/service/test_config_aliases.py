"""YAML aliases in the configuration are bounded: an alias bomb (a few hundred bytes standing for
hundreds of millions of nodes) is refused at composition, naming the line, before anything copies
the expanded tree; ordinary anchors still work."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from bridge.errors import ConfigurationError
from bridge.service.config import load_config
from bridge.service.config_yaml import MAX_ALIAS_NODES, safe_load_bounded

BOMB = "\n".join(
    [f'a: &a [{",".join(["lol"] * 9)}]']
    + [f"{c}: &{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
) + "\n"
"""Nine levels of nine aliases: 9**9 (387 million) strings, in 342 bytes."""


def test_the_alias_bomb_is_refused_naming_its_line_without_expanding_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigurationError) as err:
            load_config(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert f"more than {MAX_ALIAS_NODES} nodes" in message
    # Level e (line 5) is the first whose aliases pass the limit: 9 + 81 + 729 + 6561 + 59049.
    assert f'"{path}", line 5' in message
    assert peak < 20 * 2**20, f"refusing the bomb took {peak / 2**20:.0f} MiB"


def test_check_config_exits_2_on_the_bomb_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    done = subprocess.run([sys.executable, "-m", "bridge.service.cli", "check-config", "-c", str(path)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "line 5" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_ordinary_anchors_still_load() -> None:
    text = ("common: &common {retry: {initial: 0.1}, timeout: 5}\n"
            "sinks:\n  - {name: a, <<: *common}\n  - {name: b, <<: *common}\n  - *common\n")
    data = safe_load_bounded(text)
    assert data["sinks"][0] == {"name": "a", "retry": {"initial": 0.1}, "timeout": 5}
    assert data["sinks"][2] == data["common"]


def test_an_alias_to_its_own_container_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="refers to the node that contains it"):
        load_config_text("a: &x [1, *x]\n", tmp_path)


def load_config_text(text: str, tmp_path: Path) -> object:
    (tmp_path / "c.yaml").write_text(text)
    return load_config(tmp_path / "c.yaml")


def test_the_limit_counts_expanded_nodes_not_alias_events() -> None:
    # One alias of a large anchored list counts every node of it.
    items = ",".join(str(i) for i in range(MAX_ALIAS_NODES))
    with pytest.raises(Exception, match=f"more than {MAX_ALIAS_NODES} nodes"):
        safe_load_bounded(f"a: &a [{items}]\nb: *a\n")
    assert len(safe_load_bounded(f"a: &a [{items}]\n")["a"]) == MAX_ALIAS_NODES
