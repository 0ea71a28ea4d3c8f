"""One object nested too deep must not stop its resource: through real HTTP (a scripted API server),
a Reflector over the real HttpListerWatcher meets an object nested beyond the decoders' bound in its
List and in its watch, and keeps syncing and watching. The object is quarantined: the cache holds
its identity marked ``malformed``, and the resourceVersion advances past it."""

from __future__ import annotations

import asyncio
import random

import pytest

from bridge.clock import RealClock
from bridge.contracts import ObjectKey
from bridge.informer.backoff import Backoff
from bridge.informer.reflector import Reflector
from bridge.informer.store import IndexedCache
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.rawobject import RawObject
from tests.api.conftest import InstantClock

from .apiserver import HostileApiServer, deep_value, event_line, obj


async def synced_to(reflector: Reflector, rv: str, task: asyncio.Task[None]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while reflector.last_sync_resource_version != rv:
        if task.done():
            task.result()
            pytest.fail("the reflector ended")
        if loop.time() > deadline:
            pytest.fail(f"the reflector did not reach resourceVersion {rv}: it is at "
                        f"{reflector.last_sync_resource_version!r} after {reflector.list_count} lists")
        await asyncio.sleep(0.02)


async def reflector_for(
    server: HostileApiServer, *, raw_objects: bool
) -> tuple[ApiClient, Reflector, IndexedCache]:
    """A Reflector over the real HttpListerWatcher of ``pods`` (objects as bytes, or as dicts)."""
    client = ApiClient(server=server.url, clock=InstantClock())
    api = await Discovery(client=client).resolve("pods")
    lw = HttpListerWatcher(client=client, resource=api, raw_objects=raw_objects,
                           drop_managed_fields=raw_objects)
    cache = IndexedCache(compact=raw_objects)
    clock = RealClock()
    reflector = Reflector(name="pods", lister_watcher=lw, store=cache, clock=clock,
                          backoff=Backoff(clock=clock, initial=0.01, cap=0.05, jitter=0.0),
                          rng=random.Random(1))
    return client, reflector, cache


@pytest.mark.parametrize("raw_objects", [True, False], ids=["raw", "dict"])
@pytest.mark.parametrize("depth", [201, 300, 999, 5000])
async def test_a_deep_object_in_a_list_and_a_watch_is_quarantined_and_the_resource_keeps_syncing(
    server: HostileApiServer, depth: int, raw_objects: bool
) -> None:
    pods = server.resources["pods"]
    pods.items = [obj("Pod", "ok-0", 1), obj("Pod", "deep", 2, body=deep_value(depth)), obj("Pod", "ok-1", 3)]
    pods.list_rv = 3
    pods.watch_lines = [event_line("MODIFIED", obj("Pod", "deep", 4, body=deep_value(depth))),
                        event_line("ADDED", obj("Pod", "ok-2", 5))]
    client, reflector, cache = await reflector_for(server, raw_objects=raw_objects)
    task = asyncio.create_task(reflector.run(), name="hostile-reflector")
    try:
        await synced_to(reflector, "5", task)
        assert reflector.list_count == 1  # the List was taken once: no relist loop
        assert sorted(cache.list_keys()) == ["default/deep", "default/ok-0", "default/ok-1", "default/ok-2"]
        deep = cache.get_by_key(ObjectKey("default/deep"))
        assert type(deep) is RawObject
        assert deep.malformed == "depth"
        identity = (deep.name, deep.namespace, deep.uid, deep.resource_version)
        assert identity == ("deep", "default", "uid-deep", "4")
        assert dict(deep) == {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "deep", "namespace": "default", "uid": "uid-deep", "resourceVersion": "4"}}
        assert pods.watches == 1
    finally:
        reflector.stop()
        await asyncio.wait_for(task, 10)
        await client.close()


@pytest.mark.parametrize("depth", [100, 199])
async def test_an_object_within_the_bound_is_kept_whole(server: HostileApiServer, depth: int) -> None:
    pods = server.resources["pods"]
    pods.items = [obj("Pod", "nested", 1, body=deep_value(depth))]
    pods.list_rv = 1
    client, reflector, cache = await reflector_for(server, raw_objects=True)
    task = asyncio.create_task(reflector.run(), name="hostile-reflector")
    try:
        await synced_to(reflector, "1", task)
        kept = cache.get_by_key(ObjectKey("default/nested"))
        assert type(kept) is RawObject
        assert kept.malformed == ""
        assert kept.raw == obj("Pod", "nested", 1, body=deep_value(depth))
    finally:
        reflector.stop()
        await asyncio.wait_for(task, 10)
        await client.close()
