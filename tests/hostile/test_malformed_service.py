"""A malformed object through the whole bridge (BridgeService in-process, the hostile API server over
real HTTP, file sinks): its event reaches every sink marked ``malformed`` with its identity as
``data``, the dead letter gets its bytes (its identity only where the sink redacts the resource),
the metric and the log say so, a later valid update and the delete of the same object go out as
usual, and the other resource keeps delivering throughout."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.service.in_process import running_service
from tests.service.test_service import eventually

from .apiserver import HostileApiServer, deep_value, event_line, obj
from .bridge_config import bridge_config, file_sink


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def events_of(path: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in lines(path) if e.get("name") == name]


async def test_a_malformed_object_is_sent_marked_dead_lettered_counted_and_followed_by_its_later_changes(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="bridge.kube.listwatch")
    deep = obj("Pod", "deep", 2, body=deep_value(300))
    server.resources["pods"].items = [obj("Pod", "ok-0", 1), deep]
    server.resources["pods"].list_rv = 2
    server.resources["configmaps"].items = [obj("ConfigMap", "cm-0", 1)]
    plain, redacting = tmp_path / "plain.jsonl", tmp_path / "redacting.jsonl"
    plain_dl, redacting_dl = tmp_path / "plain-dl.jsonl", tmp_path / "redacting-dl.jsonl"
    config = bridge_config(server, tmp_path, resources=["pods", "configmaps"], sinks=[
        file_sink("plain", plain, dead_letter=plain_dl),
        file_sink("redacting", redacting, dead_letter=redacting_dl, redact={"paths": ["spec.a"]})])
    async with running_service(config) as service:
        await eventually(lambda: events_of(plain, "deep") and events_of(redacting, "deep")
                         and events_of(plain, "cm-0") and lines(plain_dl) and lines(redacting_dl),
                         what="the malformed object's event and dead letters")
        for path in (plain, redacting):
            (event,) = events_of(path, "deep")
            assert event["malformed"] == "depth"
            assert event["type"] == "io.kube-event-bridge.added"
            assert (event["uid"], event["resourceversion"]) == ("uid-deep", "2")
            assert event["data"] == {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "deep", "namespace": "default", "uid": "uid-deep", "resourceVersion": "2"}}
            assert "malformed" not in events_of(path, "ok-0")[0]
        (record,) = lines(plain_dl)
        assert record["event_id"] == events_of(plain, "deep")[0]["id"]
        assert "malformed object (depth)" in record["reason"]
        # The whole object, as the API server sent it.
        assert b'"message":' + deep + b"}" in plain_dl.read_bytes()
        (redacted,) = lines(redacting_dl)
        assert redacted["message"] == events_of(redacting, "deep")[0]["data"]  # identity only
        assert "identity only" in redacted["reason"]
        metrics = service.telemetry.render_prometheus().decode()
        counted = [line for line in metrics.splitlines() if line.startswith("keb_malformed_objects_total{")]
        assert len(counted) == 1
        assert 'reason="depth"' in counted[0]
        assert 'resource="pods"' in counted[0]
        assert 'informer="pods.all.' in counted[0]
        assert counted[0].endswith(" 1.0")
        assert any("quarantined" in r.getMessage() and "default/deep" in r.getMessage()
                   for r in caplog.records)

        # The same object, now well-formed, then deleted: both go out as for any object; the
        # other resource keeps delivering.
        fixed = obj("Pod", "deep", 3)
        server.push("pods", event_line("MODIFIED", fixed))
        server.push("configmaps", event_line("ADDED", obj("ConfigMap", "cm-1", 3)))
        server.push("pods", event_line("DELETED", obj("Pod", "deep", 4)))
        await eventually(lambda: len(events_of(plain, "deep")) == 3 and events_of(plain, "cm-1"),
                         what="the update and delete of the object, and the other resource's change")
        _added, updated, deleted = events_of(plain, "deep")
        assert updated["type"] == "io.kube-event-bridge.updated"
        assert "malformed" not in updated
        assert updated["data"]["spec"] == {"x": 1}
        assert deleted["type"] == "io.kube-event-bridge.deleted"
        assert len(lines(plain_dl)) == 1  # the dead letter got the bytes once, with the change


async def test_a_quarantined_object_that_is_not_utf8_reaches_the_dead_letter_byte_exact(
    server: HostileApiServer, tmp_path: Path
) -> None:
    """A List item with invalid UTF-8, over real HTTP: the dead-letter record gives back exactly the
    bytes the API server sent (base64, since they are neither JSON nor text), not U+FFFD."""
    bad = obj("Pod", "bad", 2, body=b'{"s":"\xff\xfe","t":"\xc3\x28","u":"caf\xc3\xa9"}')
    server.resources["pods"].items = [obj("Pod", "ok-0", 1), bad]
    server.resources["pods"].list_rv = 2
    out, dead = tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    config = bridge_config(server, tmp_path, resources=["pods"],
                           sinks=[file_sink("plain", out, dead_letter=dead)])
    async with running_service(config):
        await eventually(lambda: events_of(out, "bad") and lines(dead), what="the event and its dead letter")
        (event,) = events_of(out, "bad")
        assert event["malformed"] == "encoding"
        (record,) = lines(dead)
        assert record["event_id"] == event["id"]
        assert record["message"] is None
        assert base64.b64decode(record["message_base64"], validate=True) == bad
