"""Watch and list semantics over raw HTTP, as the bridge's reflector relies on them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bridge.sim import INITIAL_EVENTS_END_ANNOTATION, Simulator
from tests.sim.helpers import read_events, summary


def _cm(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": {"k": name}}


async def test_watch_without_rv_sends_current_state_then_live_events(sim: Simulator) -> None:
    sim.store.create("configmaps", _cm("a"), namespace="default")
    sim.store.create("configmaps", _cm("b"), namespace="kube-system")
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1", "timeoutSeconds": "1"})
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        await asyncio.sleep(0.05)
        sim.store.create("configmaps", _cm("c"), namespace="default")
        events = await read_events(resp)
    assert summary(events) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    assert events[0]["object"]["kind"] == "ConfigMap"
    assert events[0]["object"]["apiVersion"] == "v1"


async def test_watch_from_rv_replays_history_in_order(sim: Simulator) -> None:
    store = sim.store
    store.create("configmaps", _cm("a"), namespace="default")
    from_rv = store.resource_version
    store.patch("configmaps", "a", {"data": {"k": "2"}}, namespace="default")
    store.create("configmaps", _cm("b"), namespace="default")
    store.delete("configmaps", "a", namespace="default")
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/namespaces/default/configmaps",
                              params={"watch": "true", "resourceVersion": str(from_rv),
                                      "timeoutSeconds": "1"})
        events = await read_events(resp)
    assert summary(events) == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == [from_rv + 1, from_rv + 2, from_rv + 3]
    assert events[2]["object"]["data"] == {"k": "2"}


async def test_watch_from_compacted_rv_gets_one_410_error_event(sim: Simulator) -> None:
    store = sim.store
    store.create("configmaps", _cm("a"), namespace="default")
    old = store.resource_version
    store.create("configmaps", _cm("b"), namespace="default")
    compacted = sim.compact()
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": str(old)})
        assert resp.status == 200
        events = await read_events(resp)
    assert events == [{"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {old} ({compacted})", "reason": "Expired", "code": 410}}]


async def test_bounded_history_expires_old_rvs(tmp_path: Any) -> None:
    async with Simulator(history_size=3) as sim, aiohttp.ClientSession() as http:
        store = sim.store
        first = store.create("configmaps", _cm("a"), namespace="default")["metadata"]["resourceVersion"]
        for i in range(4):
            store.patch("configmaps", "a", {"data": {"k": str(i)}}, namespace="default")
        # history holds the last 3 configmap changes: resuming from the first RV is no longer possible
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1", "resourceVersion": first})
        events = await read_events(resp)
        assert [e["type"] for e in events] == ["ERROR"]
        assert events[0]["object"]["code"] == 410
        ok_from = str(store.resource_version - 3)
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": ok_from, "timeoutSeconds": "1"})
        events = await read_events(resp)
        assert [e["type"] for e in events] == ["MODIFIED"] * 3
        # other resources keep their own history
        resp = await http.get(f"{sim.url}/api/v1/namespaces",
                              params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "1"})
        assert summary(await read_events(resp)) == [("ADDED", "default"), ("ADDED", "kube-system")]


async def test_bookmarks_carry_progress_and_come_before_timeout(sim: Simulator) -> None:
    sim.store.create("configmaps", _cm("a"), namespace="default")
    rv = str(sim.store.resource_version)
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "1"})
        await asyncio.sleep(0.3)
        # a change to another resource advances the global RV; the bookmark reports it
        sim.store.create("secrets", {"metadata": {"name": "s"}}, namespace="default")
        events = await read_events(resp)
    types = [e["type"] for e in events]
    assert set(types) == {"BOOKMARK"}
    assert 3 <= len(types) <= 7  # every 0.2 s for 1 s, plus one just before the timeout
    last = events[-1]["object"]
    assert last == {"kind": "ConfigMap", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(sim.store.resource_version)}}
    assert events[0]["object"]["metadata"]["resourceVersion"] == rv


async def test_no_bookmarks_unless_asked(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "1"})
        assert await read_events(resp) == []


async def test_send_initial_events_ends_with_annotated_bookmark(sim: Simulator) -> None:
    sim.store.create("configmaps", _cm("a"), namespace="default")
    sim.store.create("configmaps", _cm("b"), namespace="default")
    initial_rv = sim.store.resource_version
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true", "timeoutSeconds": "1"})
        assert resp.status == 200
        await asyncio.sleep(0.05)
        sim.store.delete("configmaps", "a", namespace="default")
        events = await read_events(resp)
    assert summary(events[:4]) == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", str(initial_rv)),
                                   ("DELETED", "a")]
    assert events[2]["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    assert {e["type"] for e in events[4:]} <= {"BOOKMARK"}


async def test_watch_list_disabled_rejects_send_initial_events() -> None:
    async with Simulator(watch_list=False) as sim, aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true"})
        assert resp.status == 422
        body = await resp.json()
        assert body["reason"] == "Invalid"
        assert "WatchList" in body["message"]


async def test_send_initial_events_requires_not_older_than(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "true"})
        assert resp.status == 422


async def test_watch_with_selector_turns_updates_into_adds_and_deletes(sim: Simulator) -> None:
    store = sim.store
    store.create("configmaps", _cm("a", {"app": "web"}), namespace="default")
    rv = str(store.resource_version)
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "resourceVersion": rv, "labelSelector": "app=web", "timeoutSeconds": "1"})
        await asyncio.sleep(0.05)
        store.create("configmaps", _cm("b", {"app": "db"}), namespace="default")
        store.patch("configmaps", "b", {"metadata": {"labels": {"app": "web"}}}, namespace="default")
        moved = store.patch("configmaps", "a", {"metadata": {"labels": {"app": "db"}}}, namespace="default")
        events = await read_events(resp)
    assert summary(events) == [("ADDED", "b"), ("DELETED", "a")]
    # the object leaving the selection is sent in its last matching state at the change's RV
    assert events[1]["object"]["metadata"]["labels"] == {"app": "web"}
    assert events[1]["object"]["metadata"]["resourceVersion"] == moved["metadata"]["resourceVersion"]


async def test_watch_future_rv_waits_then_504(sim: Simulator) -> None:
    future = sim.store.resource_version + 5
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": str(future)})
        assert resp.status == 504
        assert resp.headers["Retry-After"] == "1"
        body = await resp.json()
        assert body["message"] == f"Timeout: Too large resource version: {future}, current: {future - 5}"


async def test_list_too_large_rv_waits_then_504_or_succeeds_when_reached(sim: Simulator) -> None:
    store = sim.store
    async with aiohttp.ClientSession() as http:
        target = store.resource_version + 1
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"resourceVersion": str(target)})
        assert resp.status == 504
        body = await resp.json()
        assert body["code"] == 504
        assert body["reason"] == "Timeout"
        assert body["details"]["retryAfterSeconds"] == 1
        assert "Too large resource version" in body["message"]

        async def create_soon() -> None:
            await asyncio.sleep(0.1)
            store.create("configmaps", _cm("late"), namespace="default")

        creator = asyncio.create_task(create_soon(), name="create-soon")
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"resourceVersion": str(target)})
        await creator
        assert resp.status == 200
        body = await resp.json()
        assert body["metadata"]["resourceVersion"] == str(target)
        assert [i["metadata"]["name"] for i in body["items"]] == ["late"]


async def test_list_exact_rv_rebuilds_the_past_and_410_when_compacted(sim: Simulator) -> None:
    store = sim.store
    store.create("configmaps", _cm("a"), namespace="default")
    store.create("configmaps", _cm("b"), namespace="default")
    past = store.resource_version
    store.patch("configmaps", "a", {"data": {"k": "new"}}, namespace="default")
    store.delete("configmaps", "b", namespace="default")
    store.create("configmaps", _cm("c"), namespace="default")
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"resourceVersion": str(past), "resourceVersionMatch": "Exact"})
        body = await resp.json()
        assert body["metadata"]["resourceVersion"] == str(past)
        assert [(i["metadata"]["name"], i["data"]["k"]) for i in body["items"]] == [("a", "a"), ("b", "b")]
        # NotOlderThan (and "0") serve the latest state
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"resourceVersion": str(past), "resourceVersionMatch": "NotOlderThan"})
        body = await resp.json()
        assert body["metadata"]["resourceVersion"] == str(store.resource_version)
        assert [(i["metadata"]["name"], i["data"]["k"]) for i in body["items"]] == [("a", "new"), ("c", "c")]
        sim.compact()
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"resourceVersion": str(past), "resourceVersionMatch": "Exact"})
        assert resp.status == 410
        body = await resp.json()
        assert body["reason"] == "Expired"
        assert body["message"] == "The resourceVersion for the provided list is too old."


async def test_expired_continue_token_gets_410_with_inconsistent_token(sim: Simulator) -> None:
    store = sim.store
    for i in range(5):
        store.create("configmaps", _cm(f"cm-{i}"), namespace="default")
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"limit": "2"})
        first = await resp.json()
        assert [i["metadata"]["name"] for i in first["items"]] == ["cm-0", "cm-1"]
        token = first["metadata"]["continue"]
        store.delete("configmaps", "cm-3", namespace="default")
        sim.compact()
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"limit": "2", "continue": token})
        assert resp.status == 410
        body = await resp.json()
        assert body["reason"] == "Expired"
        assert body["code"] == 410
        assert body["message"].startswith("The provided continue parameter is too old")
        inconsistent = body["metadata"]["continue"]
        # the inconsistent token continues from the same place, on the latest state
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"limit": "5", "continue": inconsistent})
        rest = await resp.json()
        assert [i["metadata"]["name"] for i in rest["items"]] == ["cm-2", "cm-4"]
        assert rest["metadata"]["resourceVersion"] == str(store.resource_version)
        assert "continue" not in rest["metadata"]
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"continue": "garbage!"})
        assert resp.status == 400


async def test_discovery_documents(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        core = await (await http.get(f"{sim.url}/api/v1")).json()
        names = {r["name"]: r for r in core["resources"]}
        assert {"pods", "configmaps", "secrets", "services", "namespaces", "events", "nodes"} <= set(names)
        assert names["namespaces"]["namespaced"] is False
        assert names["nodes"]["namespaced"] is False
        assert names["pods"] == {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
                                 "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                                           "update", "watch"],
                                 "shortNames": ["po"], "categories": ["all"]}
        groups = await (await http.get(f"{sim.url}/apis")).json()
        assert [g["name"] for g in groups["groups"]] == ["coordination.k8s.io", "apps", "events.k8s.io",
                                                         "authorization.k8s.io", "example.com"]
        leases = await (await http.get(f"{sim.url}/apis/coordination.k8s.io/v1")).json()
        assert leases["groupVersion"] == "coordination.k8s.io/v1"
        assert leases["resources"][0]["kind"] == "Lease"
        # a CRD registered at run time appears in discovery and is served
        resp = await http.post(f"{sim.url}/_sim/crds", json={"group": "stable.example.org", "version": "v2",
                                                            "plural": "gadgets", "kind": "Gadget",
                                                            "namespaced": False})
        assert resp.status == 201
        gadgets = await (await http.get(f"{sim.url}/apis/stable.example.org/v2")).json()
        assert gadgets["resources"][0]["name"] == "gadgets"
        assert gadgets["resources"][0]["namespaced"] is False
        resp = await http.post(f"{sim.url}/apis/stable.example.org/v2/gadgets",
                               json={"apiVersion": "stable.example.org/v2", "kind": "Gadget",
                                     "metadata": {"name": "g"}})
        assert resp.status == 201
        assert "namespace" not in (await resp.json())["metadata"]
        resp = await http.get(f"{sim.url}/apis/nope.example.org/v1")
        assert resp.status == 404
        resp = await http.get(f"{sim.url}/api/v1/namespaces/default/unicorns")
        assert resp.status == 404
        assert (await resp.json())["reason"] == "NotFound"


async def test_stop_closes_open_watches_promptly() -> None:
    sim = Simulator()
    sim.shutdown_timeout = 60.0  # what an open watch would wait out were it not closed first
    await sim.start()
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/pods", params={"watch": "1"})
        reader = asyncio.create_task(read_events(resp), name="reader")
        await asyncio.sleep(0.05)
        assert sim.store.watcher_count() == 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        await sim.stop()
        assert loop.time() - started < 30.0
        assert await asyncio.wait_for(reader, 30) == []
    assert sim.store.watcher_count() == 0


async def test_client_disconnect_unregisters_an_idle_watch(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/pods", params={"watch": "1"})
        await asyncio.sleep(0.05)
        assert sim.store.watcher_count() == 1
        resp.close()
        for _ in range(100):
            if sim.store.watcher_count() == 0:
                break
            await asyncio.sleep(0.01)
        assert sim.store.watcher_count() == 0


async def test_list_items_carry_no_type_fields_except_for_crds(sim: Simulator) -> None:
    sim.store.create("configmaps", _cm("a"), namespace="default")
    sim.store.create("widgets.example.com", {"apiVersion": "example.com/v1", "kind": "Widget",
                                             "metadata": {"name": "w"}}, namespace="default")
    async with aiohttp.ClientSession() as http:
        cms = await (await http.get(f"{sim.url}/api/v1/configmaps")).json()
        widgets = await (await http.get(f"{sim.url}/apis/example.com/v1/widgets")).json()
    assert (cms["kind"], cms["apiVersion"]) == ("ConfigMapList", "v1")
    assert set(cms["items"][0]) == {"metadata", "data"}
    assert (widgets["kind"], widgets["apiVersion"]) == ("WidgetList", "example.com/v1")
    assert widgets["items"][0]["kind"] == "Widget"
    assert widgets["items"][0]["apiVersion"] == "example.com/v1"


async def test_rv_zero_lists_paginate_unless_cache_pagination_is_off() -> None:
    for cache_pagination, expected in ((True, 2), (False, 5)):
        async with Simulator(cache_pagination=cache_pagination) as sim, aiohttp.ClientSession() as http:
            for i in range(5):
                sim.store.create("configmaps", _cm(f"c{i}"), namespace="default")
            body = await (await http.get(f"{sim.url}/api/v1/configmaps",
                                         params={"resourceVersion": "0", "limit": "2"})).json()
            assert len(body["items"]) == expected
            assert ("continue" in body["metadata"]) is cache_pagination
            # a consistent list (RV unset) always honours the limit
            body = await (await http.get(f"{sim.url}/api/v1/configmaps", params={"limit": "2"})).json()
            assert len(body["items"]) == 2


async def test_bookmarks_are_sent_while_events_trickle_in(sim: Simulator) -> None:
    rv = str(sim.store.resource_version)
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={
            "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "1"})
        for i in range(15):  # an event every 50 ms: never 0.2 s of silence
            sim.store.create("configmaps", _cm(f"c{i}"), namespace="default")
            await asyncio.sleep(0.05)
        events = await read_events(resp)
    types = [e["type"] for e in events]
    assert types.count("ADDED") == 15
    assert types.count("BOOKMARK") >= 3
    # every bookmark reports an RV no older than the events before it
    last = 0
    for e in events:
        rv_now = int(e["object"]["metadata"]["resourceVersion"])
        assert rv_now >= last
        last = rv_now
