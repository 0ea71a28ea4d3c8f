"""HttpListerWatcher with objects kept as JSON bytes (``raw_objects=True``), against the simulator over
real HTTP: paginated lists and watches hand out RawObjects without managedFields that equal what the
dict decoder yields (managedFields dropped), list items carry apiVersion/kind, and lines that are not
watch events (from a scripted server) are skipped."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from bridge.contracts import KubeObject, ListOptions, WatchEvent, WatchEventType, WatchOptions
from bridge.informer.transform import drop_managed_fields
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery
from bridge.kube.listwatch import HttpListerWatcher, HttpWatchStream
from bridge.rawobject import RawObject, object_key
from bridge.sim import Simulator
from bridge.sim.objects import make_pod as realistic_pod

from .conftest import ScriptedServer

ADDED, MODIFIED, DELETED = WatchEventType.ADDED, WatchEventType.MODIFIED, WatchEventType.DELETED


async def both(client: ApiClient, namespace: str = "") -> tuple[HttpListerWatcher, HttpListerWatcher]:
    """Pods as RawObjects (managedFields cut) and, for reference, as dicts."""
    pods = await Discovery(client=client).resolve("pods")
    raw = HttpListerWatcher(client=client, resource=pods, namespace=namespace, raw_objects=True,
                            drop_managed_fields=True)
    return raw, HttpListerWatcher(client=client, resource=pods, namespace=namespace)


def check_raw(objs: Sequence[KubeObject], reference: Sequence[KubeObject]) -> None:
    assert len(objs) == len(reference)
    for got, ref in zip(objs, reference, strict=True):
        assert type(got) is RawObject
        assert not got.managed_fields
        assert "managedFields" not in got["metadata"]
        assert orjson.loads(got.raw) == drop_managed_fields(ref)
        assert got == drop_managed_fields(ref)
        meta = ref["metadata"]
        assert got.identity == (meta["name"], meta["namespace"], meta["uid"], meta["resourceVersion"], False)


async def list_all(lw: HttpListerWatcher, limit: int) -> tuple[list[KubeObject], list[int]]:
    items: list[KubeObject] = []
    sizes: list[int] = []
    token: str | None = None
    while True:
        page = await lw.list(ListOptions(limit=limit, continue_token=token))
        items.extend(page.items)
        sizes.append(len(page.items))
        token = page.continue_token
        if token is None:
            return items, sizes


async def test_paginated_list_of_raw_objects(sim: Simulator, sim_client: ApiClient) -> None:
    rng = random.Random(7)
    for i in range(12):
        sim.store.create("pods", realistic_pod(f"p{i:02d}", "a" if i % 3 else "b", rng=rng))
    raw_lw, dict_lw = await both(sim_client)
    items, sizes = await list_all(raw_lw, 5)
    reference, _ = await list_all(dict_lw, 5)
    assert sizes == [5, 5, 2]
    assert all("managedFields" in o["metadata"] for o in reference)  # the server sent them
    check_raw(items, reference)
    assert {(o["apiVersion"], o["kind"]) for o in items} == {("v1", "Pod")}
    # apiVersion/kind are in the bytes, not only in the mapping.
    assert all(orjson.loads(o.raw)["kind"] == "Pod" for o in items if type(o) is RawObject)
    keys = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in items]
    assert keys == sorted(f"{'a' if i % 3 else 'b'}/p{i:02d}" for i in range(12))  # each once, in order

    in_a, _ = await list_all((await both(sim_client, "a"))[0], 100)
    assert {o["metadata"]["namespace"] for o in in_a} == {"a"}
    assert len(in_a) == 8


async def collect(stream: HttpWatchStream, until: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    try:
        async for event in stream:
            out.append(event)
            if len(out) >= until:
                break
    finally:
        await stream.close()
    return out


async def test_watch_yields_raw_objects_equal_to_the_dict_decoders(
    sim: Simulator, sim_client: ApiClient
) -> None:
    rng = random.Random(11)
    sim.store.create("pods", realistic_pod("before", "ns", rng=rng))
    raw_lw, dict_lw = await both(sim_client, "ns")
    options = WatchOptions(resource_version=str(sim.store.resource_version), allow_watch_bookmarks=False,
                           timeout_seconds=5)
    raw_stream = await raw_lw.watch(options)
    dict_stream = await dict_lw.watch(options)
    sim.store.create("pods", realistic_pod("x", "ns", rng=rng))
    sim.store.patch("pods", "x", {"metadata": {"labels": {"v": "2"}}}, namespace="ns")
    sim.store.delete("pods", "x", namespace="ns")
    events = await collect(raw_stream, 3)
    reference = await collect(dict_stream, 3)
    assert [e.type for e in events] == [ADDED, MODIFIED, DELETED]
    assert [e.type for e in reference] == [ADDED, MODIFIED, DELETED]
    check_raw([e.object for e in events], [e.object for e in reference])
    assert events[1].object["metadata"]["labels"]["v"] == "2"
    assert raw_stream.garbage_lines == 0


async def test_watch_from_empty_rv_adds_raw_objects(sim: Simulator, sim_client: ApiClient) -> None:
    rng = random.Random(3)
    for n in ("a", "b"):
        sim.store.create("pods", realistic_pod(n, "ns", rng=rng))
    raw_lw, dict_lw = await both(sim_client)
    options = WatchOptions(allow_watch_bookmarks=False, timeout_seconds=5)
    events = await collect(await raw_lw.watch(options), 2)
    reference = await collect(await dict_lw.watch(options), 2)
    by_name = {e.object["metadata"]["name"]: e.object for e in reference}
    assert {e.type for e in events} == {ADDED}
    check_raw([e.object for e in events], [by_name[e.object["metadata"]["name"]] for e in events])


PODS = APIResource(group="", version="v1", resource="pods", kind="Pod", namespaced=True,
                   verbs=("list", "watch"))


def watch_line(kind: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


async def test_raw_decoder_skips_nothing_but_ends_the_watch_at_garbage(server: ScriptedServer) -> None:
    a = realistic_pod("a", "ns", rng=random.Random(1)) | {"metadata": {"name": "a", "namespace": "ns",
                                                                       "resourceVersion": "8",
                                                                       "managedFields": [{"m": 1}]}}
    b = {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "9"}}
    body = b"".join([
        watch_line("ADDED", a),
        b'{"type": "ADDED", "object": {"metadata": [1]}}\n',  # metadata not a mapping
        b'{"type": "ADDED", "object": {"spec": {}}}\n',  # no metadata
        b"this is not json\n",
        watch_line("MODIFIED", b),
    ])

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
        return response

    server.handler = handler
    url = await server.start()
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns", raw_objects=True,
                               drop_managed_fields=True)
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=30))
        events = [e async for e in stream]
        await stream.close()
    # Objects without a metadata mapping are well-formed events the reflector skips (no name);
    # the other lines each end a watch with a decoding ERROR (one watch per line here).
    kinds = [(e.type, e.object.get("metadata", {}).get("name")) for e in events]
    assert kinds[:3] == [(ADDED, "a"), (ADDED, None), (ADDED, None)]
    assert events[3].type is WatchEventType.ERROR
    assert events[3].object["code"] == 500
    assert len(events) == 4
    assert all(type(e.object) is RawObject for e in events[:3])
    assert events[0].object == drop_managed_fields(a)
    assert [object_key(e.object) for e in events[1:3]] == ["", ""]
    assert stream.garbage_lines == 1
    assert lw.garbage_lines == 1
