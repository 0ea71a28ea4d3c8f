"""The watch read a batch at a time (``HttpWatchStream.batches``) and the reflector applying such
batches, against a real HTTP server writing exactly the bytes a test wants: a batch mixing objects, a
bookmark and a garbled line; order across batch boundaries cut mid-line; and a garbled line in the
middle of a batch ending the watch so that the reflector watches again from the last good
resourceVersion, the change on the garbled line coming again."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from bridge.clock import RealClock
from bridge.contracts import BatchedWatchStream, KubeObject, WatchEvent, WatchEventType, WatchOptions
from bridge.informer.backoff import Backoff
from bridge.informer.delta_fifo import Delta, DeltaType, ResourceVersionMarker
from bridge.informer.real_fifo import RealFIFO
from bridge.informer.reflector import Reflector
from bridge.kube.apiclient import ApiClient
from bridge.kube.listwatch import DECODE_ERROR_CAUSE, HttpListerWatcher, decode_watch_event
from bridge.kube.sharding import ShardFilter, shard_of, sharded_decoder

from .conftest import ScriptedServer
from .test_sharding_decode import UIDS
from .test_watch_stream import PODS, line, streaming


def bookmark(rv: int) -> bytes:
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}}
    return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"


async def read_batches(server: ScriptedServer, chunks: list[bytes]) -> tuple[list[list[WatchEvent]], int]:
    server.handler = streaming(chunks)  # type: ignore[assignment]
    url = await server.start()
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        assert isinstance(stream, BatchedWatchStream)
        batches = [batch async for batch in stream.batches()]
        await stream.close()
    return batches, stream.events


def described(events: list[WatchEvent]) -> list[tuple[str, str]]:
    out = []
    for e in events:
        meta = e.object.get("metadata") or {}
        label = meta.get("name") or meta.get("resourceVersion") or e.object.get("code")
        out.append((e.type.value, str(label)))
    return out


async def test_one_read_is_one_batch_of_objects_a_bookmark_and_the_garbled_line_ending_it(
    server: ScriptedServer,
) -> None:
    """Lines written at once come as one batch (not one item per line); the garbled line ends the
    batch with the decoding ERROR and ends the stream: the line after it is never read."""
    one_write = (line("ADDED", "a", 8) + bookmark(9) + b"\n" + line("MODIFIED", "a", 10)
                 + b"{not json\n" + line("ADDED", "b", 11))
    batches, events = await read_batches(server, [one_write])
    assert all(batches)
    assert len(batches) < 4  # 5 lines (and a blank one) did not come one per item
    flat = [e for batch in batches for e in batch]
    assert described(flat) == [("ADDED", "a"), ("BOOKMARK", "9"), ("MODIFIED", "a"), ("ERROR", "500")]
    error = flat[-1].object
    assert [c["type"] for c in error["details"]["causes"]] == [DECODE_ERROR_CAUSE]
    assert events == 3  # the ERROR is not counted as an event


async def test_order_across_batch_boundaries_cut_mid_line(server: ScriptedServer) -> None:
    data = b"".join(line("MODIFIED", f"p{i % 5}", 100 + i) for i in range(60))
    rng = random.Random(3)
    chunks, at = [], 0
    while at < len(data):
        step = rng.randrange(200, 9000)
        chunks.append(data[at:at + step])
        at += step
    batches, events = await read_batches(server, chunks)
    assert len(batches) > 1
    assert all(batches)
    flat = [e for batch in batches for e in batch]
    assert [int(e.object["metadata"]["resourceVersion"]) for e in flat] == list(range(100, 160))
    assert [e.object["metadata"]["name"] for e in flat] == [f"p{i % 5}" for i in range(60)]
    assert events == 60


async def test_batches_and_events_share_the_one_reader(server: ScriptedServer) -> None:
    server.handler = streaming([line("ADDED", "a", 8)])  # type: ignore[assignment]
    url = await server.start()
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        batches = stream.batches()
        with pytest.raises(RuntimeError, match="iterated only once"):
            aiter(stream)
        assert described([e async for b in batches for e in b]) == [("ADDED", "a")]
        await stream.close()


class _RecordingFifo:
    """The reflector's store side as the RealFIFO would see it: every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def _note(self, what: str, value: str) -> None:
        self.calls.append((what, value))
        self.changed.set()

    def add(self, obj: KubeObject) -> None:
        self._note("add", _name_rv(obj))

    def update(self, obj: KubeObject) -> None:
        self._note("update", _name_rv(obj))

    def delete(self, obj: KubeObject) -> None:
        self._note("delete", _name_rv(obj))

    def replace(self, items: list[KubeObject], resource_version: str) -> None:
        self._note("replace", resource_version)

    def resync(self) -> None:
        pass

    def update_resource_version(self, resource_version: str) -> None:
        self._note("rv", resource_version)

    async def wait_for(self, call: tuple[str, str]) -> None:
        """Returns once ``call`` was made; fails after 10 s."""
        async with asyncio.timeout(10):
            while call not in self.calls:
                self.changed.clear()
                await self.changed.wait()


def changes_of(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What a recording FIFO was given, without its progress markers."""
    return [c for c in calls if c[0] != "rv"]


def assert_markers_per_read(calls: list[tuple[str, str]], *, last: str) -> None:
    """The watch phase queues one progress marker per read, at the read's last resourceVersion:
    how many reads a server's writes take is up to the network, so what holds whatever the read
    boundaries is that markers only move forward, each at the resourceVersion of a change or
    bookmark applied before it, and the last at the stream's last one."""
    marked = [int(rv) for kind, rv in calls if kind == "rv"]
    assert marked == sorted(set(marked)), calls
    assert calls[-1] == ("rv", last), calls


def _name_rv(obj: KubeObject) -> str:
    meta = obj["metadata"]
    return f"{meta['name']}@{meta['resourceVersion']}"


@contextlib.asynccontextmanager
async def reflecting(server: ScriptedServer, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                     *, hold: asyncio.Event, quick_backoff: bool = True,
                     use_watch_list: bool = False) -> AsyncIterator[tuple[_RecordingFifo, Reflector]]:
    """A reflector of ``pods`` in ``ns`` over the real HttpListerWatcher, against ``server``
    answering with ``handler``, storing into a :class:`_RecordingFifo`, running for the block.
    ``quick_backoff``: a backoff of 0.01 s to 0.05 s, no jitter (else the reflector's default). On
    the way out ``hold`` is set (the handler's open watch ends), the reflector stops and its run is
    awaited (10 s at most)."""
    server.handler = handler
    url = await server.start()
    fifo = _RecordingFifo()
    clock = RealClock()
    options: dict[str, Any] = {"use_watch_list": use_watch_list}
    if quick_backoff:
        options["backoff"] = Backoff(clock=clock, initial=0.01, cap=0.05, jitter=0.0)
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        reflector = Reflector(name="pods", lister_watcher=lw, store=fifo, clock=clock, rng=random.Random(1),
                              **options)
        task = asyncio.create_task(reflector.run(), name="test-watch-batches-reflector")
        try:
            yield fifo, reflector
        finally:
            hold.set()
            reflector.stop()
            await asyncio.wait_for(task, 10)


async def popped_by_one_run(fifo: RealFIFO) -> tuple[int, list[object]]:
    """What one ``pop_ready`` run of ``fifo`` pops, in order: (delta type, resourceVersion) for each
    delta, the resourceVersion of each progress marker; with the count ``pop_ready`` returned."""
    popped: list[object] = []

    async def process(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        if isinstance(item, ResourceVersionMarker):
            popped.append(item.resource_version)
        else:
            popped.append((item.type, item.object["metadata"]["resourceVersion"]))  # type: ignore[index]

    count = await fifo.pop_ready(process)
    return count, popped


async def test_a_garbled_line_mid_batch_rewatches_from_the_last_good_resource_version(
    server: ScriptedServer,
) -> None:
    """The events before the garbled line of a batch are applied (and their read's marker queued),
    the rest of the batch is not; the watch is opened again from the last resourceVersion applied
    (the bookmark's here) and the change the garbled line carried comes again, in order."""
    watches: list[str] = []
    hold = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}
            return web.json_response(body)
        watches.append(request.query["resourceVersion"])
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if len(watches) == 1:
            await response.write(line("ADDED", "a", 8) + bookmark(9) + b'{"type": "MODIFIED", "obj\n'
                                 + line("ADDED", "b", 11))
        else:
            await response.write(line("MODIFIED", "a", 10) + line("ADDED", "b", 11))
            await hold.wait()
        await response.write_eof()
        return response

    async with reflecting(server, handler, hold=hold) as (fifo, reflector):
        await fifo.wait_for(("add", "b@11"))
    assert watches == ["7", "9"]
    assert changes_of(fifo.calls) == [("replace", "7"), ("add", "a@8"), ("update", "a@10"), ("add", "b@11")]
    # The events before the garbled line get their marker (the bookmark's 9) before the watch ends.
    assert fifo.calls[:3] == [("replace", "7"), ("add", "a@8"), ("rv", "9")]
    assert_markers_per_read(fifo.calls, last="11")
    assert reflector.last_sync_resource_version == "11"
    assert reflector.list_count == 1


async def test_a_batch_reaches_the_fifo_and_the_informer_in_order(server: ScriptedServer) -> None:
    """Deltas of a batch land in the RealFIFO as single events would: each in arrival order with a
    progress marker after it, popped in one ``pop_ready`` run in queue order."""
    one_write = (line("ADDED", "a", 8) + line("ADDED", "b", 9) + line("MODIFIED", "a", 10)
                 + bookmark(11) + line("DELETED", "b", 12))
    server.handler = streaming([one_write])  # type: ignore[assignment]
    url = await server.start()
    fifo = RealFIFO()
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        assert isinstance(stream, BatchedWatchStream)
        for batch in [b async for b in stream.batches()]:
            for event in batch:
                meta = event.object["metadata"]
                if event.type is WatchEventType.ADDED:
                    fifo.add(event.object)
                elif event.type is WatchEventType.MODIFIED:
                    fifo.update(event.object)
                elif event.type is WatchEventType.DELETED:
                    fifo.delete(event.object)
                fifo.update_resource_version(meta["resourceVersion"])
        await stream.close()
    count, popped = await popped_by_one_run(fifo)
    assert count == 8
    # The bookmark's marker (11) coalesces with the one before it (10).
    assert popped == [(DeltaType.ADDED, "8"), "8", (DeltaType.ADDED, "9"), "9", (DeltaType.UPDATED, "10"),
                      "11", (DeltaType.DELETED, "12"), "12"]


async def test_an_error_event_mid_batch_stops_the_batch_there(server: ScriptedServer) -> None:
    """A 410 the server sends in the middle of what one read brings: nothing after it is applied,
    and the reflector relists (from the list's resourceVersion it then watches)."""
    lists: list[str] = []
    watches: list[str] = []
    hold = asyncio.Event()
    rewatched = asyncio.Event()
    expired = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
               "code": 410, "message": "too old resource version: 7 (8)", "metadata": {}}

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            lists.append(request.query.get("resourceVersion", ""))
            rv = "7" if len(lists) == 1 else "20"
            return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": rv}, "items": []})
        watches.append(request.query["resourceVersion"])
        if len(watches) == 2:
            rewatched.set()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if len(watches) == 1:
            await response.write(line("ADDED", "a", 8) + orjson.dumps({"type": "ERROR", "object": expired})
                                 + b"\n" + line("ADDED", "b", 9))
            await hold.wait()
        else:
            await hold.wait()
        await response.write_eof()
        return response

    async with reflecting(server, handler, hold=hold) as (fifo, reflector):
        async with asyncio.timeout(10):
            await rewatched.wait()
    assert watches == ["7", "20"]
    assert fifo.calls[:4] == [("replace", "7"), ("add", "a@8"), ("rv", "8"), ("replace", "20")]
    assert ("add", "b@9") not in fifo.calls
    assert reflector.expired_count == 1


async def test_events_after_the_initial_events_end_in_the_same_batch_are_applied(
    server: ScriptedServer,
) -> None:
    """WatchList: the read holding the initial-events-end bookmark also holds the first changes
    after it; the watch loop takes those over first, in order, before reading on."""
    watches: list[str] = []
    hold = asyncio.Event()
    end = {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "8", "annotations": {"k8s.io/initial-events-end": "true"}}}

    async def handler(request: web.Request) -> web.StreamResponse:
        watches.append(request.query.get("resourceVersion", ""))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(line("ADDED", "a", 8) + orjson.dumps({"type": "BOOKMARK", "object": end})
                             + b"\n" + line("MODIFIED", "a", 9) + line("ADDED", "b", 10))
        await response.write(line("DELETED", "b", 11))
        await hold.wait()
        await response.write_eof()
        return response

    async with reflecting(server, handler, hold=hold, quick_backoff=False, use_watch_list=True) as (fifo, _):
        await fifo.wait_for(("delete", "b@11"))
    assert watches == [""]
    assert changes_of(fifo.calls) == [("replace", "8"), ("update", "a@9"), ("add", "b@10"),
                                      ("delete", "b@11")]
    assert_markers_per_read(fifo.calls, last="11")


async def test_a_watch_list_answered_too_large_from_a_consistent_read_is_asked_again(
    server: ScriptedServer,
) -> None:
    """reflector.go watchList(): an in-stream ERROR 504 "Too large resource version" (a watch cache
    not yet as fresh as etcd) while the WatchList was already from "" marks the RV unavailable and
    asks for the WatchList again (after the bridge's backoff); no list is made for that cycle."""
    requests: list[tuple[str, str]] = []
    hold = asyncio.Event()
    too_large = {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 504, "reason": "Timeout",
        "message": "Timeout: Too large resource version: 12, current: 11",
        "details": {"causes": [{"reason": "ResourceVersionTooLarge",
                                "message": "Too large resource version"}], "retryAfterSeconds": 1}}}
    end = {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "12", "annotations": {"k8s.io/initial-events-end": "true"}}}}

    async def handler(request: web.Request) -> web.StreamResponse:
        kind = "watchlist" if request.query.get("sendInitialEvents") == "true" else (
            "watch" if request.query.get("watch") == "true" else "list")
        requests.append((kind, request.query.get("resourceVersion", "")))
        if kind == "list":
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if len(requests) == 1:
            await response.write(orjson.dumps(too_large) + b"\n")
        else:
            await response.write(line("ADDED", "a", 12) + orjson.dumps(end) + b"\n")
            await hold.wait()
        await response.write_eof()
        return response

    async with reflecting(server, handler, hold=hold, use_watch_list=True) as (fifo, reflector):
        await fifo.wait_for(("replace", "12"))
    assert requests[:2] == [("watchlist", ""), ("watchlist", "")]
    assert fifo.calls[0] == ("replace", "12")
    assert reflector.watch_list_rejected is False
    assert reflector.expired_count == 1


def _owned_line(kind: str, name: str, rv: int, uid: str) -> bytes:
    obj = orjson.loads(line(kind, name, rv))
    obj["object"]["metadata"]["uid"] = uid
    return orjson.dumps(obj) + b"\n"


async def test_a_run_of_another_shards_lines_is_one_bookmark(server: ScriptedServer) -> None:
    """A sharded watch decodes nothing of another shard's objects, and a run of their lines in one
    read is one bookmark at the last one's resourceVersion: what the queue makes of the bookmark per
    line anyway (consecutive progress markers coalesce), so the informer sees the same deltas and
    resourceVersions as with a bookmark per skipped line. A garbled line after such a run ends the
    watch after the run's bookmark."""
    mine = next(u for u in UIDS if shard_of(u, 2) == 1)
    theirs = [u for u in UIDS if shard_of(u, 2) == 0][:3]
    lines = [_owned_line("ADDED", "a", 8, mine)]
    lines += [_owned_line("MODIFIED", f"t{i}", 9 + i, theirs[i]) for i in range(3)]
    lines += [bookmark(12), _owned_line("MODIFIED", "t0", 13, theirs[0])]
    lines += [_owned_line("MODIFIED", "a", 14, mine)]
    lines += [_owned_line("MODIFIED", "t1", 15, theirs[1]), _owned_line("DELETED", "t2", 16, theirs[2])]
    garbled = [_owned_line("MODIFIED", "t0", 17, theirs[0]), _owned_line("MODIFIED", "t1", 18, theirs[1]),
               b'{"type":"MODIFIED","obj\n', _owned_line("MODIFIED", "a", 19, mine)]
    server.handler = streaming([b"".join(lines), b"".join(garbled)])  # type: ignore[assignment]
    url = await server.start()
    shard = ShardFilter(ordinal=1, total=2)
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns", shard=shard)
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        assert isinstance(stream, BatchedWatchStream)
        batches = [b async for b in stream.batches()]
        await stream.close()
    assert [described(b) for b in batches] == [
        [("ADDED", "a"), ("BOOKMARK", "11"), ("BOOKMARK", "12"), ("BOOKMARK", "13"), ("MODIFIED", "a"),
         ("BOOKMARK", "16")],
        [("BOOKMARK", "18"), ("ERROR", "500")],
    ]
    assert shard.skipped == 8
    per_line = sharded_decoder(decode_watch_event, ShardFilter(ordinal=1, total=2))
    flat = [e for b in batches for e in b if e.type is not WatchEventType.ERROR]
    assert await _popped(flat) == await _popped([per_line(x) for x in lines + garbled[:2]])


async def _popped(events: list[WatchEvent]) -> list[object]:
    """What the informer pops when ``events`` are applied as the reflector applies them."""
    fifo = RealFIFO()
    for event in events:
        if event.type is WatchEventType.MODIFIED:
            fifo.update(event.object)
        elif event.type is WatchEventType.ADDED:
            fifo.add(event.object)
        rv = event.object["metadata"].get("resourceVersion")
        if rv:
            fifo.update_resource_version(rv)
    _count, popped = await popped_by_one_run(fifo)
    return popped
