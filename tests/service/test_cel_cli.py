"""A sink's CEL ``filter``, ``filter_errors`` and ``fields`` as ``check-config`` and ``run`` meet them:
a bad expression stops both with exit code 2, the sink and the field named, CEL's own message and
position, never a traceback (docs/filters.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.test_cli import run_cli
from tests.service.test_cli_errors import assert_config_error

BASE = "resources: [{resource: pods}]\n"


def write(tmp_path: Path, sink_options: str) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "sinks:\n  - name: failed\n    kind: file\n"
                   f"    path: {tmp_path / 'out.jsonl'}\n{sink_options}")
    return cfg


@pytest.mark.parametrize(("expression", "needles"), [
    ("object.status.phase ==", ("<input>:1:23: Syntax error: mismatched input '<EOF>'",)),
    ("object.metadata.name.frobnicate() == 'x'",
     ("<input>:1:32: undeclared reference to 'frobnicate'", "| object.metadata.name.frobnicate() == 'x'",
      "| ...............................^")),
    ("type == 3", ("<input>:1:6: found no matching overload for '_==_' applied to '(string, int)'",
                   "| type == 3")),
], ids=["syntax", "unknown-function", "wrong-type"])
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_bad_expression_exits_2_naming_the_sink_and_the_field(
    tmp_path: Path, command: str, expression: str, needles: tuple[str, ...]
) -> None:
    cfg = write(tmp_path, f'    filter: "{expression}"\n')
    r = run_cli(command, "--config", str(cfg))
    assert_config_error(r, "sinks.0", "sink 'failed' (file)", "filter: ERROR:", *needles)


@pytest.mark.parametrize(("options", "needles"), [
    ("    filter: 3\n", ("filter: Input should be a valid string",)),
    ("    filter: namespace\n", ("filter: the expression must be a condition (bool), not string",)),
    ("    filter: 'true'\n    filter_errors: ignore\n", ("filter_errors: Input should be 'keep' or 'drop'",)),
    ("    fields: ['status..phase']\n", ("fields", "malformed path")),
], ids=["not-a-string", "not-a-condition", "filter-errors", "fields"])
def test_other_bad_options_exit_2_naming_the_field(
    tmp_path: Path, options: str, needles: tuple[str, ...]
) -> None:
    r = run_cli("check-config", "--config", str(write(tmp_path, options)))
    assert_config_error(r, "sinks.0", "sink 'failed' (file)", *needles)


def test_a_good_filter_and_fields_pass_check_config(tmp_path: Path) -> None:
    cfg = write(tmp_path, "    filter: \"has(object.status) && object.status.phase == 'Failed'\"\n"
                          "    filter_errors: drop\n    fields: [metadata.name, status]\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 0, r.stderr


def test_the_documented_error_is_what_check_config_prints(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "filters.md").read_text()
    block = doc.split("$ kube-event-bridge check-config --config bridge.yaml\n", 1)[1].split("```", 1)[0]
    cfg = write(tmp_path, "    filter: type == 3\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr == block
