"""The object store's own rules: resourceVersions, generation, status, no-op updates, patches, watchers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from bridge.sim import ObjectStore, Simulator, WatchFilter
from bridge.sim.status import AlreadyExists, BadRequest, Conflict, Expired, Invalid, NotFound
from bridge.sim.store import apply_json_patch, json_merge_patch


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i:1"}]},
            "status": {"phase": "Pending"}}


def test_global_rv_is_shared_by_all_resources() -> None:
    store = ObjectStore(initial_namespaces=())
    assert store.resource_version == 1
    a = store.create("pods", _pod("a"), namespace="x")
    b = store.create("configmaps", {"metadata": {"name": "b"}}, namespace="x")
    c = store.create("nodes", {"metadata": {"name": "n", "namespace": "ignored"}})
    assert [o["metadata"]["resourceVersion"] for o in (a, b, c)] == ["2", "3", "4"]
    assert "namespace" not in c["metadata"]
    assert c["apiVersion"] == "v1"
    assert c["kind"] == "Node"


def test_generation_status_and_noop_updates() -> None:
    store = ObjectStore()
    pod = store.create("pods", _pod("a"), namespace="default")
    rv = pod["metadata"]["resourceVersion"]
    # status on the main resource is ignored (pods have a status subresource) → nothing changes
    pod["status"] = {"phase": "Running"}
    same = store.update("pods", pod, namespace="default")
    assert same["metadata"]["resourceVersion"] == rv
    assert same["status"] == {"phase": "Pending"}
    # the status subresource changes status only, generation untouched
    st = store.patch("pods", "a", {"status": {"phase": "Running"}, "spec": {"x": 1}}, namespace="default",
                     subresource="status")
    assert st["status"] == {"phase": "Running"}
    assert "x" not in st["spec"]
    assert st["metadata"]["generation"] == 1
    assert int(st["metadata"]["resourceVersion"]) == int(rv) + 1
    # a label change keeps the generation, a spec change bumps it
    lab = store.patch("pods", "a", {"metadata": {"labels": {"k": "v"}}}, namespace="default")
    assert lab["metadata"]["generation"] == 1
    spec = store.patch("pods", "a", {"spec": {"nodeName": "n1"}}, namespace="default")
    assert spec["metadata"]["generation"] == 2
    # uid and creationTimestamp cannot be changed by an update
    spec["metadata"]["creationTimestamp"] = "1999-01-01T00:00:00Z"
    spec["metadata"]["labels"] = {"k": "w"}
    kept = store.update("pods", spec, namespace="default")
    assert kept["metadata"]["creationTimestamp"] == pod["metadata"]["creationTimestamp"]
    assert kept["metadata"]["uid"] == pod["metadata"]["uid"]


def test_errors_are_status_errors() -> None:
    store = ObjectStore()
    store.create("configmaps", {"metadata": {"name": "a"}}, namespace="default")
    with pytest.raises(AlreadyExists) as exists:
        store.create("configmaps", {"metadata": {"name": "a"}}, namespace="default")
    assert exists.value.status()["code"] == 409
    with pytest.raises(NotFound):
        store.get("configmaps", "zzz", namespace="default")
    with pytest.raises(Conflict):
        store.update("configmaps", {"metadata": {"name": "a", "resourceVersion": "1"}}, namespace="default")
    with pytest.raises(Conflict, match="Precondition failed"):
        store.delete("configmaps", "a", namespace="default", precondition_rv="1")
    with pytest.raises(BadRequest, match="should not be set"):
        store.create("configmaps", {"metadata": {"name": "b", "resourceVersion": "5"}}, namespace="default")
    with pytest.raises(BadRequest, match="does not match"):
        store.create("configmaps", {"metadata": {"name": "b", "namespace": "x"}}, namespace="y")
    with pytest.raises(Invalid):
        store.create("configmaps", {"metadata": {}}, namespace="default")
    generated = store.create("configmaps", {"metadata": {"generateName": "gen-"}}, namespace="default")
    assert generated["metadata"]["name"].startswith("gen-")
    assert len(generated["metadata"]["name"]) == len("gen-") + 5


def test_delete_returns_last_state_at_the_delete_rv() -> None:
    store = ObjectStore()
    made = store.create("configmaps", {"metadata": {"name": "a"}, "data": {"x": "1"}}, namespace="default")
    gone = store.delete("configmaps", "a", namespace="default")
    assert gone["data"] == {"x": "1"}
    assert gone["metadata"]["uid"] == made["metadata"]["uid"]
    assert int(gone["metadata"]["resourceVersion"]) == int(made["metadata"]["resourceVersion"]) + 1
    assert store.list("configmaps") == []


def test_merge_and_json_patch() -> None:
    assert json_merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {
        "a": {"c": 2, "d": 3}, "l": [2]}
    doc = {"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2]}}
    out = apply_json_patch(doc, [
        {"op": "add", "path": "/metadata/labels/b", "value": "2"},
        {"op": "remove", "path": "/metadata/labels/a"},
        {"op": "replace", "path": "/spec/list/0", "value": 9},
        {"op": "add", "path": "/spec/list/-", "value": 3},
        {"op": "test", "path": "/spec/list/1", "value": 2},
        {"op": "copy", "from": "/spec/list", "path": "/spec/copy"},
        {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/c"},
    ])
    assert out == {"metadata": {"labels": {"c": "2"}}, "spec": {"list": [9, 2, 3], "copy": [9, 2, 3]}}
    assert doc == {"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2]}}
    with pytest.raises(Invalid):
        apply_json_patch(doc, [{"op": "test", "path": "/spec/list/0", "value": 5}])


def test_watcher_falling_behind_is_closed() -> None:
    store = ObjectStore(watcher_buffer=3)
    rt = store.resolve("configmaps")
    watcher = store.watch(rt, from_rv=store.resource_version, scope=WatchFilter())
    for i in range(3):
        store.create("configmaps", {"metadata": {"name": f"c{i}"}}, namespace="default")
    assert not watcher.closed
    assert watcher.pending == 3
    store.create("configmaps", {"metadata": {"name": "c3"}}, namespace="default")
    assert watcher.closed
    assert watcher.closed_reason == "too slow: buffer full"
    assert store.watcher_count() == 0


def test_snapshot_and_watch_after_compaction() -> None:
    store = ObjectStore(history_size=100)
    rt = store.resolve("configmaps")
    store.create("configmaps", {"metadata": {"name": "a"}}, namespace="default")
    old = store.resource_version
    store.create("configmaps", {"metadata": {"name": "b"}}, namespace="default")
    assert [k for k, _ in store.snapshot(rt, at_rv=old)] == [("default", "a")]
    store.compact()
    with pytest.raises(Expired, match=f"too old resource version: {old} "):
        store.snapshot(rt, at_rv=old)
    with pytest.raises(Expired):
        store.watch(rt, from_rv=old, scope=WatchFilter())


async def test_wait_for_rv() -> None:
    store = ObjectStore()
    target = store.resource_version + 1
    assert not await store.wait_for_rv(target, 0.05)

    async def later() -> None:
        await asyncio.sleep(0.02)
        store.create("configmaps", {"metadata": {"name": "x"}}, namespace="default")

    task = asyncio.create_task(later(), name="later")
    assert await store.wait_for_rv(target, 2)
    await task


async def test_http_json_patch_status_subresource_and_unsupported_patch(sim: Simulator) -> None:
    sim.store.create("pods", _pod("p"), namespace="default")
    base = f"{sim.url}/api/v1/namespaces/default/pods/p"
    async with aiohttp.ClientSession() as http:
        resp = await http.patch(base, data=b'[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]',
                                headers={"Content-Type": "application/json-patch+json"})
        assert resp.status == 200
        assert (await resp.json())["metadata"]["labels"] == {"a": "b"}
        resp = await http.patch(f"{base}/status", data=b'{"status":{"phase":"Running"}}',
                                headers={"Content-Type": "application/merge-patch+json"})
        assert (await resp.json())["status"] == {"phase": "Running"}
        resp = await http.get(f"{base}/status")
        assert (await resp.json())["status"] == {"phase": "Running"}
        resp = await http.patch(base, data=b"{}", headers={"Content-Type": "text/plain"})
        assert resp.status == 415
        resp = await http.patch(base, data=b"{not json",
                                headers={"Content-Type": "application/merge-patch+json"})
        assert resp.status == 400
        resp = await http.put(base, json={"metadata": {"name": "other"}})
        assert resp.status == 400
        resp = await http.delete(base, json={"preconditions": {"uid": "nope"}})
        assert resp.status == 409
        resp = await http.delete(base)
        assert resp.status == 200
        assert (await resp.json())["metadata"]["name"] == "p"
        resp = await http.post(f"{sim.url}/api/v1/pods", json=_pod("q"))
        assert resp.status == 405


async def test_an_internal_failure_is_a_500_status(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(sim.store, "get_raw", broken)
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/namespaces/default/pods/x")
        assert resp.status == 500
        body = await resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "InternalError", 500)
    assert "boom" in body["message"]
