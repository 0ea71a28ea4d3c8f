"""The events options are checked at start with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import ConfigurationError
from bridge.service.config import load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("sinks: [{name: s, kind: stdout}]\n" + text)
    return path


def test_the_profile_is_for_events_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"resources\.0\.profile.*applies to Kubernetes Events"):
        load_config(write(tmp_path, "resources: [{resource: pods, profile: events}]\n"))
    for name in ("events", "ev", "events.events.k8s.io", "events.events.k8s.io/v1"):
        config = load_config(write(tmp_path, f"resources: [{{resource: {name}, profile: events}}]\n"))
        assert config.resources[0].profile == "events"


def test_events_options_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"events\.coalesce_window"):
        load_config(write(tmp_path, "resources: [{resource: events}]\nevents: {coalesce_window: -1}\n"))
    with pytest.raises(ConfigurationError, match=r"events\.enrichment\.kind"):
        load_config(write(tmp_path, "resources: [{resource: events}]\n"
                                    "events: {enrichment: {kind: [pods]}}\n"))
    config = load_config(write(tmp_path, "resources: [{resource: events, profile: events}]\n"
                                         "events: {coalesce_window: 2.5, metrics: {reasons: [BackOff]}}\n"))
    assert config.events.coalesce_window == 2.5
    assert config.events.metrics.reasons == ["BackOff"]
    assert config.events.enrichment.kinds[0] == "pods"
