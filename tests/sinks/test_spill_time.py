"""A change has one envelope in every sink, whether or not it went through a sink's spill: the same
``time`` (the API server's for an add or update, the informer's first hand-out for a delete) and the
same attribution (``manager``, ``operation``), in a sink that kept up and in one whose backlog spilled.

Real components: the API-server simulator over real HTTP (ConfigMaps or Secrets watched through the service's
list/watch wiring, managedFields cut by the compact cache), a real file sink, a real webhook sink
posting to a local HTTP receiver that hangs until released, and that sink's real segment spill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.testing.files import written_events
from sinks.file import FileSink
from sinks.webhook import WebhookSink
from tests.checkpoint.helpers import until, watched_over_http
from tests.sinks.test_spill_redaction import NS, HangingReceiver, sim

__all__ = ["sim"]  # the fixture, shared with the spill redaction test

CHANGES = 30


@pytest.mark.parametrize(("resource", "kind"), [
    ("configmaps", "ConfigMap"),  # spilled as the object's bytes
    ("secrets", "Secret"),  # spilled as a redacted copy (sinks/redaction.py, Redactor.spill_form)
])
async def test_a_spilled_change_keeps_its_time_and_attribution(
        sim: tuple[Simulator, ApiClient], tmp_path: Path, resource: str, kind: str) -> None:
    _, client = sim
    receiver = HangingReceiver()
    await receiver.start()
    hook = WebhookSink.from_options("hook", {
        "url": receiver.url, "timeout": 120, "connections": 1, "max_in_flight": 1,
        "buffer": {"capacity": 2}, "retry": {"max_attempts": 0}})
    out = tmp_path / "events.jsonl"
    file = FileSink.from_options("file", {"path": str(out)})
    factory, watched = await watched_over_http(client, resource, kind, NS)
    p = BridgePipeline(factory=factory, resources=[watched],
                       sinks=[file, hook], checkpoint_store=None, cluster="sim",
                       spill_directory=tmp_path / "spill")
    path = f"/api/v1/namespaces/{NS}/{resource}"
    await client.create(path, {"metadata": {"name": "first"}, "data": {"k": "dg=="}})
    try:
        await p.start()
        assert await p.wait_for_sync(10)
        await until(lambda: receiver.waiting == 1, what="the first request hanging")
        for i in range(CHANGES):
            await client.create(path, {"metadata": {"name": f"c{i}"}, "data": {"n": f"{i:04d}"}})
        for i in range(0, CHANGES, 3):
            await client.patch(f"{path}/c{i}", {"data": {"n": f"{i:04d}bmV3"}})
        for i in range(1, CHANGES, 3):
            await client.delete(f"{path}/c{i}")
        expected = 1 + CHANGES + 2 * len(range(0, CHANGES, 3))

        await until(lambda: len(written_events(out)) >= expected, 30, "the file sink keeping up")
        await until(lambda: p.sink_backlog("hook").spilled >= CHANGES, what="the webhook's backlog spilled")

        receiver.release.set()
        await until(lambda: len(receiver.events) >= expected, 30, "every change delivered by the webhook")
        kept_up: dict[str, dict[str, Any]] = {e["id"]: e for e in written_events(out)}
        spilled: dict[str, dict[str, Any]] = {e["id"]: e for e in receiver.events}
        assert sorted(kept_up) == sorted(spilled)
        assert {e["type"].rsplit(".", 1)[-1] for e in spilled.values()} >= {"added", "updated", "deleted"}
        differences = sorted(
            (event["type"], name, event.get(name), kept_up[event_id].get(name))
            for event_id, event in spilled.items()
            for name in event.keys() | kept_up[event_id].keys()
            if event.get(name) != kept_up[event_id].get(name))
        assert differences == []
    finally:
        await p.shutdown(5)
        await receiver.stop()
