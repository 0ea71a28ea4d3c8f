"""The official ``kubernetes`` client drives the simulator: CRUD, patches, selectors, pages, watch.

The client is synchronous, so each call runs in a thread while the simulator serves on the test loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from bridge.sim import Simulator
from tests.sim.conftest import kube


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs one blocking official-client call in a thread; its typed result is used untyped here."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def _pod(name: str, labels: dict[str, str] | None = None, image: str = "nginx:1.25") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    }


async def test_pod_crud_round_trip(sim: Simulator, api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    created = await call(core.create_namespaced_pod, "default", _pod("web", {"app": "web"}))
    assert created.metadata.name == "web"
    assert created.metadata.namespace == "default"
    assert created.metadata.generation == 1
    assert len(created.metadata.uid) == 36
    assert created.metadata.creation_timestamp is not None
    rv1 = int(created.metadata.resource_version)
    assert rv1 == sim.store.resource_version

    got = await call(core.read_namespaced_pod, "web", "default")
    assert got.metadata.uid == created.metadata.uid
    assert got.spec.containers[0].image == "nginx:1.25"

    # merge patch: labels change, spec does not → generation stays
    patched = await call(
        core.patch_namespaced_pod, "web", "default", {"metadata": {"labels": {"tier": "front"}}},
        _content_type="application/merge-patch+json")
    assert patched.metadata.labels == {"app": "web", "tier": "front"}
    assert patched.metadata.generation == 1
    assert int(patched.metadata.resource_version) == rv1 + 1

    # strategic merge patch (the client's default for dicts), treated as a merge patch; spec changes
    patched2 = await call(
        core.patch_namespaced_pod, "web", "default",
        {"metadata": {"labels": {"app": None}}, "spec": {"activeDeadlineSeconds": 30}})
    assert patched2.metadata.labels == {"tier": "front"}
    assert patched2.spec.active_deadline_seconds == 30
    assert patched2.metadata.generation == 2

    # replace with the current RV succeeds; replaying the old RV conflicts
    body = api_client.sanitize_for_serialization(patched2)
    body["metadata"]["annotations"] = {"note": "replaced"}
    replaced = await call(core.replace_namespaced_pod, "web", "default", body)
    assert replaced.metadata.annotations == {"note": "replaced"}
    with pytest.raises(ApiException) as conflict:
        await call(core.replace_namespaced_pod, "web", "default", body)
    assert conflict.value.status == 409
    status = json.loads(conflict.value.body or "")
    assert status["kind"] == "Status"
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]

    deleted = await call(core.delete_namespaced_pod, "web", "default")
    assert deleted is not None
    stored_delete = sim.store.resource_version
    assert stored_delete == int(replaced.metadata.resource_version) + 1
    with pytest.raises(ApiException) as missing:
        await call(core.read_namespaced_pod, "web", "default")
    assert missing.value.status == 404
    assert json.loads(missing.value.body or "") == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'pods "web" not found', "reason": "NotFound", "code": 404,
        "details": {"name": "web", "kind": "pods"},
    }
    with pytest.raises(ApiException) as missing_delete:
        await call(core.delete_namespaced_pod, "web", "default")
    assert missing_delete.value.status == 404


async def test_create_existing_name_conflicts(sim: Simulator, api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    cm = {"metadata": {"name": "settings"}, "data": {"a": "1"}}
    await call(core.create_namespaced_config_map, "default", cm)
    with pytest.raises(ApiException) as exists:
        await call(core.create_namespaced_config_map, "default", cm)
    assert exists.value.status == 409
    body = json.loads(exists.value.body or "")
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'configmaps "settings" already exists'
    # same name in another namespace is fine
    other = await call(core.create_namespaced_config_map, "kube-system", cm)
    assert other.metadata.namespace == "kube-system"
    updated = await call(core.patch_namespaced_config_map, "settings", "default",
                                      {"data": {"b": "2"}})
    assert updated.data == {"a": "1", "b": "2"}
    assert updated.metadata.generation is None  # ConfigMaps have no spec, so no generation


async def test_label_and_field_selectors(sim: Simulator, api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    for name, ns, app in [("a", "default", "web"), ("b", "default", "db"), ("c", "kube-system", "web")]:
        await call(core.create_namespaced_pod, ns, _pod(name, {"app": app}))
    web = await call(core.list_pod_for_all_namespaces, label_selector="app=web")
    assert [(p.metadata.namespace, p.metadata.name) for p in web.items] == [("default", "a"),
                                                                          ("kube-system", "c")]
    not_web = await call(core.list_namespaced_pod, "default", label_selector="app notin (web)")
    assert [p.metadata.name for p in not_web.items] == ["b"]
    by_name = await call(core.list_pod_for_all_namespaces, field_selector="metadata.name=c")
    assert [p.metadata.name for p in by_name.items] == ["c"]
    by_ns = await call(core.list_pod_for_all_namespaces,
                                    field_selector="metadata.namespace!=kube-system")
    assert [p.metadata.name for p in by_ns.items] == ["a", "b"]
    with pytest.raises(ApiException) as bad:
        await call(core.list_pod_for_all_namespaces, label_selector="app in (web")
    assert bad.value.status == 400


async def test_pagination_with_limit_and_continue(sim: Simulator, api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    for i in range(7):
        sim.store.create("configmaps", {"metadata": {"name": f"cm-{i}"}}, namespace="default")
    list_rv = sim.store.resource_version
    names: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        kwargs: dict[str, Any] = {"limit": 3}
        if token:
            kwargs["_continue"] = token
        page = await call(core.list_namespaced_config_map, "default", **kwargs)
        pages += 1
        assert page.metadata.resource_version == str(list_rv)
        names += [cm.metadata.name for cm in page.items]
        if pages == 1:
            assert page.metadata.remaining_item_count == 4
            # changes after the first page do not show up in later pages: the token pins the RV
            sim.store.create("configmaps", {"metadata": {"name": "cm-9"}}, namespace="default")
            sim.store.delete("configmaps", "cm-5", namespace="default")
        token = page.metadata._continue
        if not token:
            break
    assert pages == 3
    assert names == [f"cm-{i}" for i in range(7)]


async def test_deployments_leases_nodes_and_crd(sim: Simulator, api_client: Any) -> None:
    apps = kube.client.AppsV1Api(api_client)
    deploy = {
        "metadata": {"name": "api"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"}},
                              "spec": {"containers": [{"name": "api", "image": "api:1"}]}}},
    }
    created = await call(apps.create_namespaced_deployment, "default", deploy)
    assert created.spec.replicas == 2
    scaled = await call(apps.patch_namespaced_deployment, "api", "default",
                                     {"spec": {"replicas": 5}})
    assert scaled.spec.replicas == 5
    assert scaled.metadata.generation == 2
    listed = await call(apps.list_deployment_for_all_namespaces)
    assert [d.metadata.name for d in listed.items] == ["api"]

    coord = kube.client.CoordinationV1Api(api_client)
    lease = await call(coord.create_namespaced_lease, "kube-system", {
        "metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
    assert lease.spec.holder_identity == "a"

    core = kube.client.CoreV1Api(api_client)
    node = await call(core.create_node, {"metadata": {"name": "node-1"}})
    assert node.metadata.namespace is None
    namespaces = await call(core.list_namespace)
    assert [n.metadata.name for n in namespaces.items] == ["default", "kube-system"]

    custom = kube.client.CustomObjectsApi(api_client)
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"},
              "spec": {"size": 3}}
    made = await call(custom.create_namespaced_custom_object, "example.com", "v1", "default",
                                   "widgets", widget)
    assert made["metadata"]["generation"] == 1
    patched = await call(custom.patch_namespaced_custom_object, "example.com", "v1", "default",
                                      "widgets", "w1", {"spec": {"size": 4}})
    assert patched["spec"] == {"size": 4}
    assert patched["metadata"]["generation"] == 2
    items = await call(custom.list_cluster_custom_object, "example.com", "v1", "widgets")
    assert [w["metadata"]["name"] for w in items["items"]] == ["w1"]
    gone = await call(custom.delete_namespaced_custom_object, "example.com", "v1", "default",
                                   "widgets", "w1")
    assert gone["metadata"]["name"] == "w1"
    assert sim.store.list("widgets.example.com") == []


async def test_watch_stream_sees_added_modified_deleted(sim: Simulator,
                                                        api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    sim.store.create("pods", _pod("first"), namespace="default")
    start_rv = str(sim.store.resource_version)
    seen: list[tuple[str, str, str]] = []
    done = threading.Event()
    watcher = kube.watch.Watch()

    def consume() -> None:
        for event in watcher.stream(core.list_namespaced_pod, "default", resource_version=start_rv,
                                    timeout_seconds=5):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if event["type"] == "DELETED":
                watcher.stop()
        done.set()

    reader = asyncio.create_task(asyncio.to_thread(consume), name="official-watch")
    await asyncio.sleep(0.2)
    a = sim.store.create("pods", _pod("second"), namespace="default")
    b = sim.store.patch("pods", "second", {"metadata": {"labels": {"x": "y"}}}, namespace="default")
    c = sim.store.delete("pods", "second", namespace="default")
    await asyncio.wait_for(reader, 10)
    assert done.is_set()
    assert seen == [
        ("ADDED", "second", a["metadata"]["resourceVersion"]),
        ("MODIFIED", "second", b["metadata"]["resourceVersion"]),
        ("DELETED", "second", c["metadata"]["resourceVersion"]),
    ]


async def test_delete_collection_with_selector(sim: Simulator, api_client: Any) -> None:
    core = kube.client.CoreV1Api(api_client)
    for ns, name, tier in [("default", "a", "x"), ("default", "b", "y"), ("default", "c", "x"),
                           ("kube-system", "d", "x")]:
        sim.store.create("configmaps", {"metadata": {"name": name, "labels": {"tier": tier}}}, namespace=ns)
    await call(core.delete_collection_namespaced_config_map, "default", label_selector="tier=x")
    left = sorted((c["metadata"]["namespace"], c["metadata"]["name"]) for c in sim.store.list("configmaps"))
    assert left == [("default", "b"), ("kube-system", "d")]


async def test_token_from_the_written_kubeconfig_is_used(tmp_path: Any) -> None:
    async with Simulator(token="abc123") as sim:
        path = sim.write_kubeconfig(tmp_path / "kc")
        api = kube.config.new_client_from_config(config_file=str(path))
        try:
            core = kube.client.CoreV1Api(api)
            namespaces = await call(core.list_namespace)
            assert [n.metadata.name for n in namespaces.items] == ["default", "kube-system"]
        finally:
            api.close()
        sim.token = "rotated"
        api = kube.config.new_client_from_config(config_file=str(path))
        try:
            with pytest.raises(ApiException) as denied:
                await call(kube.client.CoreV1Api(api).list_namespace)
            assert denied.value.status == 401
        finally:
            api.close()
