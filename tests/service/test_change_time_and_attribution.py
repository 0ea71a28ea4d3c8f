"""One ``time`` per change in every sink, and "who changed it", end to end: the simulator records
managedFields for requests naming a ``fieldManager`` (as kube-apiserver does), the bridge reads the
newest entry before cutting managedFields, and every sink carries the same ``time`` (the entry's)
and the ``manager`` / ``operation`` / ``subresource`` extensions."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bridge.contracts import Notification, NotificationKind
from bridge.delivery.pipeline import SinkListener
from bridge.rawobject import RawObject, decode_object
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from bridge.testing import Reply, WebhookReceiver
from sinks.contract import ChangeEvent, EventType
from tests.service.test_service import eventually, lines
from tests.sinks import PODS

pytestmark = pytest.mark.usefixtures("own_cwd")


def _config(sim: Simulator, tmp_path: Path, hook: WebhookReceiver, compact: bool) -> BridgeConfig:
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                       "in_cluster": "false"},
        "resources": [{"resource": "pods"}],
        "sinks": [
            {"name": "file", "kind": "file", "path": str(tmp_path / "events.jsonl")},
            {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "batch": {"max_events": 10}},
        ],
        "cache": {"compact": compact},
        "checkpoint": {"store": "none"},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "default"},
    "spec": {"containers": [{"name": "web", "image": "nginx:1.25"}]},
}


async def _write(
    s: aiohttp.ClientSession, method: str, url: str, body: Any, content_type: str = "application/json"
) -> dict[str, Any]:
    async with s.request(method, url, json=body, headers={"Content-Type": content_type}) as r:
        assert r.status in (200, 201), await r.text()
        result: dict[str, Any] = await r.json()
        return result


def _seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()


@pytest.fixture
async def hook() -> Any:
    async with WebhookReceiver(reply=Reply(200)) as h:
        yield h


async def test_every_sink_carries_the_same_time_and_who_changed_it(tmp_path: Path,
                                                                  hook: WebhookReceiver) -> None:
    async with Simulator() as sim:
        service = BridgeService(config=_config(sim, tmp_path, hook, compact=True))
        task = asyncio.create_task(service.run(), name="service-under-test")
        events = tmp_path / "events.jsonl"
        base = f"{sim.url}/api/v1/namespaces/default/pods"
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            async with aiohttp.ClientSession() as s:
                created = await _write(s, "POST", f"{base}?fieldManager=kubectl-create", POD)
                await eventually(lambda: len(lines(events)) == 1, what="the add")
                await asyncio.sleep(1.1)  # the next write lands in a later second
                status = {**created, "status": {"phase": "Running"}}
                await _write(s, "PUT", f"{base}/web-0/status?fieldManager=kubelet", status)
                await eventually(lambda: len(lines(events)) == 2, what="the status update")
                labelled = await _write(s, "PATCH", f"{base}/web-0?fieldManager=kubectl-label",
                                        {"metadata": {"labels": {"tier": "web"}}},
                                        "application/merge-patch+json")
                async with s.delete(f"{base}/web-0") as r:
                    assert r.status == 200
            await eventually(lambda: len(lines(events)) == 4 and len(hook.events) == 4, what="all events")
        finally:
            service.stop_event.set()
            await task
    in_file = lines(events)
    by_id = {e["id"]: e for e in hook.events}
    assert [e["type"].rsplit(".", 1)[1] for e in in_file] == ["added", "updated", "updated", "deleted"]
    for e in in_file:
        assert by_id[e["id"]]["time"] == e["time"], e["type"]  # one time per change, in every sink
    who = [(e.get("manager"), e.get("operation"), e.get("subresource")) for e in in_file]
    assert who == [("kubectl-create", "Update", None), ("kubelet", "Update", "status"),
                   ("kubectl-label", "Update", None), ("kubectl-label", "Update", None)]
    # The time the API server recorded for the write (whole seconds), not when a sink sent it.
    entries = {m["manager"]: m["time"] for m in labelled["metadata"]["managedFields"]}
    assert _seconds(in_file[0]["time"]) == _seconds(created["metadata"]["creationTimestamp"])
    assert _seconds(in_file[1]["time"]) == _seconds(entries["kubelet"])
    assert _seconds(in_file[2]["time"]) == _seconds(entries["kubectl-label"])
    assert _seconds(in_file[1]["time"]) > _seconds(in_file[0]["time"])
    # Nothing of managedFields is sent.
    assert all("managedFields" not in e["data"]["metadata"] for e in in_file)


def test_the_time_survives_cutting_managed_fields_and_is_the_newest_entry() -> None:
    raw = (b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"d","uid":"u",'
           b'"resourceVersion":"5","managedFields":[{"manager":"late","operation":"Update",'
           b'"time":"2024-05-01T12:00:09Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}}},'
           b'{"manager":"kubelet","operation":"Update","subresource":"status",'
           b'"time":"2024-05-01T12:00:07Z"},{"manager":"early","operation":"Apply",'
           b'"time":"2024-05-01T11:59:00Z"}]},"spec":{}}')
    obj = decode_object(raw, drop_managed_fields=True)
    assert b"managedFields" not in obj.raw
    assert obj.change is not None
    assert (obj.change.manager, obj.change.operation, obj.change.subresource) == ("late", "Update", "")
    assert obj.fresh().change == obj.change
    # Two listeners (two sinks) turn one notification into events with one time.
    listeners = [SinkListener(sink=None, resource=PODS, cluster="c", clock=_Clock(t))  # type: ignore[arg-type]
                 for t in (100.0, 200.0)]
    n = Notification(kind=NotificationKind.UPDATE, obj=obj, old=obj, time=150.0)
    times = {ev.time for lst in listeners for ev in lst.events_for(n)}
    assert times == {_seconds("2024-05-01T12:00:09Z")}
    # Without managedFields (and for deletes) the first observation, the same for every listener.
    bare = RawObject.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "uid": "v"}})
    for kind in (NotificationKind.ADD, NotificationKind.DELETE):
        n = Notification(kind=kind, obj=bare, time=150.0)
        assert {ev.time for lst in listeners for ev in lst.events_for(n)} == {150.0}
    n = Notification(kind=NotificationKind.DELETE, obj=obj, time=150.0)
    deleted: list[ChangeEvent] = [ev for lst in listeners for ev in lst.events_for(n)]
    assert {ev.time for ev in deleted} == {150.0}
    assert {ev.type for ev in deleted} == {EventType.DELETED}


class _Clock:
    def __init__(self, wall: float) -> None:
        self._wall = wall

    def now(self) -> float:
        return self._wall

    def wall(self) -> float:
        return self._wall

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


async def test_a_redelivery_after_a_restart_carries_the_same_time(tmp_path: Path,
                                                                  hook: WebhookReceiver) -> None:
    """The webhook refuses everything during the first run (nothing acknowledged, the checkpoint stays
    behind); the second run re-sends those changes: same ids as the file sink wrote in the first run,
    and the same times."""
    async with Simulator() as sim:
        cfg = _config(sim, tmp_path, hook, compact=True).model_dump(mode="json", exclude_unset=True)
        cfg["checkpoint"] = {"store": "file", "directory": str(tmp_path / "checkpoints"), "interval": 0.1}
        cfg["sinks"][1]["retry"] = {"initial": 0.05, "max": 0.1}
        config = BridgeConfig.model_validate(cfg)
        base = f"{sim.url}/api/v1/namespaces/default/pods"
        events = tmp_path / "events.jsonl"
        hook.reply = Reply(503, retry_after=0)
        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="first-run")
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            async with aiohttp.ClientSession() as s:
                await _write(s, "POST", f"{base}?fieldManager=kubectl-create", POD)
                await _write(s, "PATCH", f"{base}/web-0?fieldManager=kubectl-label",
                             {"metadata": {"labels": {"tier": "web"}}}, "application/merge-patch+json")
            await eventually(lambda: len(lines(events)) == 2, what="the file sink's events")
            await asyncio.sleep(0.5)  # a few refused attempts at the webhook
        finally:
            service.stop_event.set()
            await task
        first = {e["id"]: e["time"] for e in lines(events)}
        assert hook.events == []
        await asyncio.sleep(1.1)  # a re-stamped time would differ
        hook.reply = Reply(200)
        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="second-run")
        try:
            await eventually(lambda: len(hook.events) >= 2, what="the redelivery")
        finally:
            service.stop_event.set()
            await task
    again = {e["id"]: e["time"] for e in hook.events}
    assert set(first) <= set(again)
    assert {i: again[i] for i in first} == first


async def test_kubectl_writes_are_attributed_to_kubectl(tmp_path: Path,
                                                                  hook: WebhookReceiver) -> None:
    """Real kubectl against the simulator: it names itself (``kubectl-create``, ``kubectl-label``) as
    the field manager of each write, and the events say so."""
    manifest = tmp_path / "cm.json"
    manifest.write_text('{"apiVersion": "v1", "kind": "ConfigMap", '
                        '"metadata": {"name": "settings", "namespace": "default"}, "data": {"a": "1"}}')
    async with Simulator() as sim:
        cfg = _config(sim, tmp_path, hook, compact=True).model_dump(mode="json", exclude_unset=True)
        cfg["resources"] = [{"resource": "configmaps", "namespace": "default"}]
        config = BridgeConfig.model_validate(cfg)
        kubeconfig = tmp_path / "kubeconfig"

        def kubectl(*args: str) -> None:
            done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args],
                                  capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr

        service = BridgeService(config=config)
        task = asyncio.create_task(service.run(), name="service-under-test")
        events = tmp_path / "events.jsonl"
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            await asyncio.to_thread(kubectl, "create", "--validate=false", "-f", str(manifest))
            await asyncio.to_thread(kubectl, "label", "configmap", "settings", "tier=web")
            await eventually(lambda: len(lines(events)) == 2, what="both events")
        finally:
            service.stop_event.set()
            await task
    got = [(e["type"].rsplit(".", 1)[1], e["manager"], e["operation"]) for e in lines(events)]
    assert got == [("added", "kubectl-create", "Update"), ("updated", "kubectl-label", "Update")]
