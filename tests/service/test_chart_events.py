"""The chart and the events profile, through the real Helm engine: the RBAC grants exactly what the
enrichment reads (list/watch of the involved kinds configured, on top of the Event resources), and
the values schema validates the new options."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helm_python import Chart, HelmError

from bridge.service.events.config import DEFAULT_ENRICHMENT_KINDS
from tests.service.test_chart import CHART, find, render


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def values(**events: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "resources": [{"resource": "events", "profile": "events"},
                      {"resource": "events.events.k8s.io", "profile": "events"}],
        "sinks": [{"name": "s", "kind": "stdout",
                   "routing": {"events": {"match": [{"types": ["Warning"], "message": "^Back-off"}]}}}]}
    if events:
        config["events"] = events
    return {"config": config}


def rules(docs: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    (cr,) = find(docs, "ClusterRole")
    out: dict[tuple[str, str], list[str]] = {}
    for rule in cr["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in out, f"{group}/{resource} granted twice"
                out[(group, resource)] = rule["verbs"]
    return out


def as_rules(kinds: list[str] | tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    out = {}
    for k in kinds:
        plural, _, group = k.partition(".")
        out[(group, plural)] = ["list", "watch"]
    return out


EVENTS = {("", "events"): ["list", "watch"], ("events.k8s.io", "events"): ["list", "watch"]}


def test_the_default_enrichment_kinds_are_granted_list_and_watch_only(chart: Any) -> None:
    assert rules(render(chart, values())) == {**EVENTS, **as_rules(DEFAULT_ENRICHMENT_KINDS)}


def test_configured_kinds_replace_the_default_and_overlap_with_watched_resources_once(chart: Any) -> None:
    v = values(enrichment={"kinds": ["pods", "deployments.apps"]}, coalesce_window=2)
    v["config"]["resources"].append({"resource": "pods"})
    assert rules(render(chart, v)) == {**EVENTS, **as_rules(["pods", "deployments.apps"])}


def test_without_the_profile_or_with_enrichment_off_nothing_more_is_granted(chart: Any) -> None:
    assert rules(render(chart, values(enrichment={"enabled": False}))) == EVENTS
    plain = values()
    for r in plain["config"]["resources"]:
        del r["profile"]
    assert rules(render(chart, plain)) == EVENTS


@pytest.mark.parametrize(("events", "resource_extra", "message"), [
    pytest.param({"coalesce_window": -1}, {}, "coalesce_window", id="negative-window"),
    pytest.param({"enrichment": {"kind": ["pods"]}}, {}, "'kind' not allowed", id="misspelled-kinds"),
    pytest.param({"metrics": {"max_series": 0}}, {}, "max_series", id="no-series"),
    pytest.param({}, {"profile": "event"}, "profile", id="unknown-profile"),
])
def test_bad_events_options_are_rejected(chart: Any, events: dict[str, Any], resource_extra: dict[str, Any],
                                         message: str) -> None:
    v = values(**events)
    v["config"]["resources"][0].update(resource_extra)
    with pytest.raises(HelmError, match=message):
        chart.render(values=v, name="keb", namespace="ops")


def test_bad_routing_rules_are_rejected(chart: Any) -> None:
    v = values()
    v["config"]["sinks"][0]["routing"]["events"]["drop"] = [{"reason": ["BackOff"]}]
    with pytest.raises(HelmError, match="'reason' not allowed"):
        chart.render(values=v, name="keb", namespace="ops")
