"""Event facts from both Event APIs, and the ``routing.events`` rules of a sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.contract import ChangeEvent, EventType, SinkConfigError
from sinks.eventfacts import event_facts
from sinks.file import FileSink
from tests.events.helpers import NEW_EVENTS, PODS, change, core_event, new_event


def test_core_and_new_api_events_read_the_same() -> None:
    core = event_facts(core_event(count=7))
    assert (core.reason, core.type, core.count, core.series_count, core.reporter) == (
        "BackOff", "Warning", 7, None, "kubelet")
    assert (core.involved.kind, core.involved.namespace, core.involved.name, core.involved.uid) == (
        "Pod", "shop", "web-0", "uid-web-0")
    assert core.message == "Back-off restarting failed container"
    new = event_facts(new_event(series=4))
    assert (new.reason, new.type, new.count, new.series_count, new.reporter, new.message) == (
        "Unhealthy", "Warning", 4, 4, "kubelet", "Readiness probe failed")
    assert new.involved.name == "web-0"
    # A new-API Event seen once has no series: count 1 (deprecatedCount 0 is not a count).
    assert event_facts(new_event()).count == 1


def test_malformed_fields_are_read_as_absent() -> None:
    facts = event_facts({"metadata": {"name": "x"}, "reason": 5, "count": "many",
                         "involvedObject": {"kind": "Pod", "name": ["no"]}})
    assert (facts.reason, facts.count, facts.involved.kind, facts.involved.name) == ("", 1, "Pod", "")


def sink(tmp_path: Path, events: dict[str, object]) -> FileSink:
    return FileSink.from_options("s", {"path": str(tmp_path / "out"), "routing": {"events": events}})


def test_match_and_drop_rules(tmp_path: Path) -> None:
    s = sink(tmp_path, {"match": [{"types": ["Warning"], "involved_kinds": ["Pod"]},
                                  {"reasons": ["Scheduled"]}],
                        "drop": [{"message": "(?i)readiness"}, {"reasons": ["BackOff"], "min_count": 5}]})
    assert s.accepts(change(core_event(count=1)))            # Warning about a Pod
    assert not s.accepts(change(core_event(count=5)))        # BackOff seen 5 times: dropped
    assert not s.accepts(change(new_event(), ref=NEW_EVENTS))  # note matches the drop pattern
    assert s.accepts(change(core_event(reason="Scheduled", type_="Normal", message="ok")))
    assert not s.accepts(change(core_event(reason="Pulled", type_="Normal", message="ok")))
    assert not s.accepts(change(core_event(kind="Node", message="x")))  # Warning, but not a Pod
    # Deletions (TTL expiry) are judged by the last state; other resources pass untouched.
    assert not s.accepts(change(core_event(count=9), EventType.DELETED))
    assert s.accepts(change({"metadata": {"name": "p", "namespace": "shop"}}, ref=PODS))


def test_a_bad_pattern_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(SinkConfigError, match=r"routing\.events\.drop\.0.*invalid regular expression"):
        sink(tmp_path, {"drop": [{"message": "(unclosed"}]})
    with pytest.raises(SinkConfigError, match=r"routing\.events\.match\.0\.reason: unknown option"):
        sink(tmp_path, {"match": [{"reason": "typo"}]})


def test_a_rule_on_the_involved_objects_labels_reads_the_enrichment(tmp_path: Path) -> None:
    s = sink(tmp_path, {"match": [{"involved_labels": "team=shop,tier!=debug"}]})

    def enriched(labels: str | None) -> ChangeEvent:
        event = change(core_event(message="m"))
        event.extensions["enrichment"] = "ok" if labels is not None else "unknown"
        if labels:
            event.extensions["involvedlabels"] = labels
        return event

    assert s.accepts(enriched('{"team":"shop","tier":"front"}'))
    assert not s.accepts(enriched('{"team":"shop","tier":"debug"}'))
    assert not s.accepts(enriched('{"team":"search"}'))
    assert not s.accepts(enriched(""))       # enriched, no labels
    assert not s.accepts(enriched(None))     # not enriched: unknown labels never match
    assert not s.accepts(change(core_event(message="m")))  # no profile at all
    with pytest.raises(SinkConfigError, match=r"involved_labels"):
        sink(tmp_path, {"match": [{"involved_labels": "team in (a"}]})
