"""The watch stream decoder against a scripted HTTP server writing exactly the bytes a test wants:
lines split across chunks, garbage lines (logged, counted, skipped), a half-written last line at a
connection drop (discarded), a last line without its newline (kept), a reset mid-stream (the stream
ends), an oversized line, and the three decoders agreeing on real events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence

import orjson
import pytest
from aiohttp import web

from bridge.contracts import WatchEvent, WatchEventType, WatchOptions
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.kube.discovery import APIResource
from bridge.kube.listwatch import (
    DECODE_ERROR_CAUSE,
    SKIPPED_LINE_CAUSE,
    WATCH_EVENT_DECODERS,
    HttpListerWatcher,
    HttpWatchStream,
    WatchDecodeError,
    decode_list,
    decode_watch_event,
)

from .conftest import ScriptedServer, make_pod

PODS = APIResource(group="", version="v1", resource="pods", kind="Pod", namespaced=True,
                   verbs=("list", "watch"))


def line(kind: str, name: str, rv: int) -> bytes:
    obj = make_pod(name, "ns")
    obj["metadata"]["resourceVersion"] = str(rv)  # type: ignore[index]
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def streaming(chunks: Sequence[bytes], *, abort: bool = False) -> object:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.005)
        if abort:
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    return handler


async def watch_all(server: ScriptedServer, chunks: Sequence[bytes], *, abort: bool = False,
                    options: ApiClientOptions | None = None
                    ) -> tuple[list[WatchEvent], HttpWatchStream, HttpListerWatcher]:
    server.handler = streaming(chunks, abort=abort)  # type: ignore[assignment]
    url = await server.start()
    async with ApiClient(server=url, options=options) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns", label_selector="app=web")
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        events = [e async for e in stream]
        await stream.close()
    [req] = server.requests
    assert req.path == "/api/v1/namespaces/ns/pods"
    assert req.query == {"watch": "true", "resourceVersion": "7", "timeoutSeconds": "300",
                         "allowWatchBookmarks": "true", "labelSelector": "app=web"}
    return events, stream, lw


def names(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type.value, e.object["metadata"]["name"]) for e in events]


async def test_lines_split_across_chunks(server: ScriptedServer) -> None:
    data = line("ADDED", "a", 8) + line("MODIFIED", "a", 9) + line("DELETED", "a", 10)
    chunks = [data[i:i + 37] for i in range(0, len(data), 37)]
    events, stream, _ = await watch_all(server, chunks)
    assert names(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert [e.object["metadata"]["resourceVersion"] for e in events] == ["8", "9", "10"]
    assert stream.events == 3


@pytest.mark.parametrize("garbage", [
    b"this is not json",
    b'{"type": "ADDED"}',  # no object
    b'{"type": "EXPLODED", "object": {}}',  # unknown type
    b"[1, 2, 3]",
    b'{"type": "ADDED", "object": [1]}',
])
async def test_an_undecodable_line_ends_the_watch_with_a_decoding_error(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    """As client-go's stream watcher: the stream ends at the line with an ERROR event (500,
    cause ClientWatchDecoding), so that the reflector re-watches from the last event it applied and
    the change the line carried comes again; reading on past it would lose that change."""
    chunks = [
        line("ADDED", "a", 8),
        b"\n\n",  # blank lines are keep-alives, not garbage
        garbage + b"\n",
        line("ADDED", "b", 9),
    ]
    with caplog.at_level(logging.WARNING, logger="bridge.kube.listwatch"):
        events, stream, lw = await watch_all(server, chunks)
    assert names(events[:1]) == [("ADDED", "a")]
    [error] = events[1:]
    assert error.type is WatchEventType.ERROR
    assert error.object["code"] == 500
    assert error.object["reason"] == "InternalError"
    assert error.object["message"].startswith("unable to decode an event from the watch stream: ")
    assert [c["type"] for c in error.object["details"]["causes"]] == [DECODE_ERROR_CAUSE]
    assert stream.garbage_lines == 1
    assert lw.garbage_lines == 1
    assert stream.truncated_lines == 0
    [warning] = [r.getMessage() for r in caplog.records if r.name == "bridge.kube.listwatch"]
    assert warning.startswith("watch pods in namespace ns: a line is not a watch event")
    assert warning.endswith("ending the watch after 1 events")


async def test_a_watch_stream_is_iterated_once(server: ScriptedServer) -> None:
    server.handler = streaming([line("ADDED", "a", 8), line("ADDED", "b", 9)])  # type: ignore[assignment]
    url = await server.start()
    async with ApiClient(server=url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        stream = await lw.watch(WatchOptions(resource_version="7", timeout_seconds=300))
        events = aiter(stream)
        first = await anext(events)
        with pytest.raises(RuntimeError, match="iterated only once"):
            aiter(stream)
        # The first reader still has everything after its first event.
        rest = [e async for e in events]
        await stream.close()
    assert names([first, *rest]) == [("ADDED", "a"), ("ADDED", "b")]


async def test_half_written_last_line_is_discarded(server: ScriptedServer) -> None:
    cut = line("ADDED", "c", 10)
    events, stream, _ = await watch_all(
        server, [line("ADDED", "a", 8), line("ADDED", "b", 9), cut[: len(cut) // 2]], abort=True
    )
    assert names(events) == [("ADDED", "a"), ("ADDED", "b")]
    assert stream.truncated_lines == 1
    assert stream.garbage_lines == 0


async def test_complete_last_line_without_newline_is_kept(server: ScriptedServer) -> None:
    events, stream, _ = await watch_all(
        server, [line("ADDED", "a", 8), line("ADDED", "b", 9).rstrip(b"\n")]
    )
    assert names(events) == [("ADDED", "a"), ("ADDED", "b")]
    assert stream.truncated_lines == 0


async def test_connection_reset_mid_stream_ends_the_stream(server: ScriptedServer) -> None:
    events, stream, _ = await watch_all(server, [line("ADDED", "a", 8)], abort=True)
    assert names(events) == [("ADDED", "a")]
    assert stream.truncated_lines == 0


async def test_oversized_line_ends_the_stream(server: ScriptedServer) -> None:
    big = line("ADDED", "x" * 5000, 9)
    events, stream, _ = await watch_all(
        server, [line("ADDED", "a", 8), big[:3000], big[3000:], line("ADDED", "b", 10)],
        options=ApiClientOptions(max_line_bytes=2048),
    )
    # What the line carried is unknown, and a watch from the same resourceVersion would meet it again:
    # the stream ends with the ERROR event that makes the reflector relist (framed by gap markers).
    assert names(events[:1]) == [("ADDED", "a")]
    [error] = events[1:]
    assert error.type is WatchEventType.ERROR
    assert [c["type"] for c in error.object["details"]["causes"]] == [SKIPPED_LINE_CAUSE]
    assert isinstance(stream.broken, ValueError)
    assert stream.malformed == 1


async def test_close_stops_an_open_watch(server: ScriptedServer) -> None:
    release = asyncio.Event()
    finished = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(line("ADDED", "a", 8))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 5)
        finished.set()
        return response

    server.handler = endless
    url = await server.start()
    async with ApiClient(server=url) as client:
        stream = await HttpListerWatcher(client=client, resource=PODS).watch(WatchOptions())
        iterator = aiter(stream)
        first = await anext(iterator)
        assert first.object["metadata"]["name"] == "a"
        await stream.close()
        await stream.close()  # idempotent
        assert [e async for e in iterator] == []
    release.set()
    await asyncio.wait_for(finished.wait(), 5)
    await asyncio.sleep(0.01)


# --------------------------------------------------------------------------------------------------
# decoders


SAMPLES = [
    line("ADDED", "a", 1).strip(),
    orjson.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "5"}}}),
    orjson.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                              "message": "too old resource version: 1 (5)"}}),
    json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "ü", "labels": {"k": "v"}},
                                               "n": [1, 2.5, None, True]}}).encode(),
]
GARBAGE = [b"nope", b"{}", b'{"type": 1, "object": {}}', b'{"type": "ADDED", "object": []}',
           b'{"type": "WHAT", "object": {}}', b'{"type": "ADDED", "object": {"a": 1}']


@pytest.mark.parametrize("decoder_name", sorted(WATCH_EVENT_DECODERS))
def test_decoders_agree(decoder_name: str) -> None:
    decoder = WATCH_EVENT_DECODERS[decoder_name]
    for sample in SAMPLES:
        expected = json.loads(sample)
        event = decoder(sample)
        assert event.type is WatchEventType(expected["type"])
        assert event.object == expected["object"]
    for bad in GARBAGE:
        with pytest.raises(WatchDecodeError):
            decoder(bad)


def test_default_decoder_is_msgspec() -> None:
    assert WATCH_EVENT_DECODERS["msgspec"] is decode_watch_event


def test_decode_list_fills_kind_and_reads_metadata() -> None:
    body = orjson.dumps({"kind": "PodList", "apiVersion": "v1",
                         "metadata": {"resourceVersion": "42", "continue": "tok", "remainingItemCount": 3},
                         "items": [{"metadata": {"name": "a"}}, {"kind": "Pod", "apiVersion": "v1",
                                                                 "metadata": {"name": "b"}}]})
    page = decode_list(body, api_version="v1", kind="Pod")
    assert page.resource_version == "42"
    assert page.continue_token == "tok"
    assert page.remaining_item_count == 3
    assert page.items == [{"metadata": {"name": "a"}, "apiVersion": "v1", "kind": "Pod"},
                          {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "b"}}]
    empty = decode_list(b'{"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": null}')
    assert (empty.items, empty.continue_token, empty.remaining_item_count) == ([], None, None)
    with pytest.raises(WatchDecodeError):
        decode_list(b"<html>")


async def test_a_garbled_watch_line_does_not_lose_its_change(server: ScriptedServer) -> None:
    """The reflector over HTTP: the line carrying b@12 arrives garbled between a@11 and c@13. The
    watch ends at that line and the reflector watches again from 11 (no relist), so b@12 and c@13
    come again and nothing is lost."""
    from bridge.informer.backoff import Backoff
    from bridge.informer.reflector import Reflector
    from bridge.informer.store import IndexedCache

    from .conftest import InstantClock

    hold = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            item = make_pod("a", "ns")
            item["metadata"]["resourceVersion"] = "10"  # type: ignore[index]
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "10"},
                                      "items": [item]})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if request.query["resourceVersion"] == "10":
            good_b = line("ADDED", "b", 12)
            for chunk in (line("MODIFIED", "a", 11), good_b[:30] + b"\x00garbled" + good_b[40:],
                          line("ADDED", "c", 13)):
                await response.write(chunk)
            await response.write_eof()
            return response
        for chunk in (line("ADDED", "b", 12), line("ADDED", "c", 13)):
            await response.write(chunk)
        await hold.wait()
        return response

    server.handler = handler
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, namespace="ns")
        cache = IndexedCache()
        reflector = Reflector(name="pods", lister_watcher=lw, store=cache, clock=clock,
                              backoff=Backoff(clock=clock, jitter=0.0))
        task = asyncio.create_task(reflector.run(), name="test-garbled-reflector")
        try:
            for _ in range(500):
                if len(cache.list()) == 3:
                    break
                await asyncio.sleep(0.01)
            state = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in cache.list()}
            assert state == {"a": "11", "b": "12", "c": "13"}
            requests = [(r.query.get("watch"), r.query.get("resourceVersion")) for r in server.requests]
            assert requests == [(None, "0"), ("true", "10"), ("true", "11")]
            assert lw.garbage_lines == 1
        finally:
            hold.set()
            reflector.stop()
            await asyncio.wait_for(task, 5)
