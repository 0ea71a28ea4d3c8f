"""Every example in the README and docs/ is exercised: configuration snippets load and build their
sinks, the configuration-error example is what the bridge prints, alert rules name real metrics,
and the documented commands exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.errors import ConfigurationError
from bridge.service.config import load_config
from bridge.service.telemetry import InformerGauges, SinkGauges, Telemetry, TelemetrySnapshot
from bridge.service.validation import validate_sinks

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(lang: str) -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for m in FENCE.finditer(path.read_text()):
            if m.group(1) == lang:
                found.append((f"{path.name}:{path.read_text()[:m.start()].count(chr(10)) + 1}", m.group(2)))
    return found


YAML = blocks("yaml")


def _is_config(text: str) -> bool:
    data = yaml.safe_load(text)
    if isinstance(data, dict):
        return "sinks" in data
    return isinstance(data, list) and all(isinstance(d, dict) and "kind" in d for d in data)


CONFIGS = [(where, text) for where, text in YAML if _is_config(text)]
ALERTS = [(where, text) for where, text in YAML if "groups:" in text]


def test_the_docs_have_examples() -> None:
    assert len(CONFIGS) >= 7
    assert ALERTS


@pytest.mark.parametrize(("where", "text"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_configuration_examples_are_valid(where: str, text: str, tmp_path: Path) -> None:
    loaded = yaml.safe_load(text)
    data: dict[str, Any] = {"sinks": loaded} if isinstance(loaded, list) else loaded
    data.setdefault("resources", [{"resource": "pods"}])
    # Secrets named by path in the examples: give them something to read.
    def materialise(value: Any) -> Any:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                if k.endswith("_file") and isinstance(v, str):
                    out[k] = _file(tmp_path, v)
                elif k == "secret_files" and isinstance(v, dict):
                    out[k] = {prop: _file(tmp_path, path) for prop, path in v.items()}
                else:
                    out[k] = materialise(v)
            return out
        if isinstance(value, list):
            return [materialise(v) for v in value]
        return value

    data = materialise(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    sinks = validate_sinks(config)
    assert [s.name for s in sinks] == [s.name for s in config.sinks]


def _file(tmp_path: Path, original: str) -> str:
    p = tmp_path / Path(original).name
    p.write_text("example-secret-value\n")
    return str(p)


def test_configuration_error_example_is_what_the_bridge_prints(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    (example,) = [m.group(2) for m in FENCE.finditer(doc) if m.group(1) == "text"
                  and m.group(2).startswith("kube-event-bridge: invalid configuration")]
    bad = tmp_path / "config.yaml"
    bad.write_text("resources: [{resource: pods, namspace: x}]\nsinks: [{name: s, kind: stdout}]\n"
                   "checkpoint: {store: rdis}\n")
    with pytest.raises(ConfigurationError) as info:
        load_config(bad)
    for line in example.splitlines()[1:]:
        assert line.strip() in str(info.value)


def test_alert_rules_use_exposed_metrics() -> None:
    telemetry = Telemetry(snapshot=lambda: TelemetrySnapshot(
        sinks={"s": SinkGauges()}, informers={"pods": InformerGauges(checkpoint_age=1.0)}))
    telemetry.events_received.add(1, {"resource": "pods", "informer": "pods.all.0", "type": "added"})
    telemetry.sink_events.add(1, {"sink": "s", "outcome": "delivered"})
    telemetry.set_shard(0, 1)  # the shard gauges the sharded alerts use exist once a replica is sharded
    text = telemetry.render_prometheus().decode()
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    telemetry.shutdown()
    for _where, text in ALERTS:
        rules = yaml.safe_load(text)["groups"][0]["rules"]
        for rule in rules:
            for name in re.findall(r"\b(keb_[a-z_]+)", rule["expr"]):
                assert name in exposed, f"alert {rule['alert']} uses {name}, which is not exposed"


def test_documented_commands_exist() -> None:
    from bridge.service.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = set(sub.choices)
    readme = (ROOT / "README.md").read_text()
    for cmd in re.findall(r"`kube-event-bridge ([a-z-]+)", readme):
        assert cmd in commands, cmd
    assert (ROOT / "scripts" / "demo").exists()
    assert (ROOT / "scripts" / "test").exists()
    first_block = FENCE.search(readme)
    assert first_block is not None
    assert first_block.group(2).splitlines()[:2] == [
        line for line in first_block.group(2).splitlines()[:2] if line.startswith("bash scripts/")]


def _malformed_reasons() -> dict[str, str]:
    """The values the decoders can give ``malformed`` (an object's attribute, the metric's ``reason``
    label), read from the code: the text constants :mod:`bridge.kube.bounded` exports, each of which
    some decoder in bridge/ passes on (checked here, so that a constant no code uses is not taken for
    one it emits)."""
    import ast

    from bridge.kube import bounded

    reasons = {name: value for name, value in vars(bounded).items()
               if name in bounded.__all__ and isinstance(value, str)}
    used: set[str] = set()
    for path in (ROOT / "bridge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in reasons:
                used.add(node.id)
    assert used == set(reasons), f"exported by bridge.kube.bounded but used nowhere: {set(reasons) - used}"
    return reasons


def test_every_malformed_value_the_code_emits_is_documented_with_what_sink_and_dead_letter_get() -> None:
    """docs/event-format.md, *Malformed objects*: one row per value, no more, no fewer; a value that
    reaches a sink as an event has the dead letter's reason text (sinks/malformed.py) too."""
    from sinks.malformed import _WHY

    text = (ROOT / "docs" / "event-format.md").read_text()
    section = text.split("\n## Malformed objects\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z]+)` \|(.*)\|$", section, re.M)}
    assert set(rows) == set(_malformed_reasons().values())
    for value, row in rows.items():
        why, sink_gets, dead_letter_gets = (cell.strip() for cell in row.split("|"))
        assert "" not in (why, sink_gets, dead_letter_gets), value
        if sink_gets.startswith("the event"):
            assert f"`malformed: {value}`" in sink_gets
            assert value in _WHY, f"sinks/malformed.py has no dead-letter reason for {value!r}"
