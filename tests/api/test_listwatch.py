"""HttpListerWatcher against the simulator over real HTTP: paginated lists, scoping and selectors,
expired continue tokens, too-large resourceVersions, decoded watch events, bookmarks, WatchList,
ERROR 410 in the stream, REST-layer retries of 429/503, and watches cut or closed by faults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from bridge.contracts import ListOptions, WatchEvent, WatchEventType, WatchOptions
from bridge.errors import (
    BadRequestError,
    ResourceExpiredError,
    TooLargeResourceVersionError,
    UnauthorizedError,
)
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher, HttpWatchStream, lister_watcher_for
from bridge.sim import INITIAL_EVENTS_END_ANNOTATION, Simulator

from .conftest import InstantClock, make_pod

ADDED, MODIFIED, DELETED = WatchEventType.ADDED, WatchEventType.MODIFIED, WatchEventType.DELETED
BOOKMARK, ERROR = WatchEventType.BOOKMARK, WatchEventType.ERROR


async def pods_lw(client: ApiClient, namespace: str = "", **selectors: str) -> HttpListerWatcher:
    return await lister_watcher_for(client, Discovery(client=client), "pods", namespace, **selectors)


def names(items: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in items]


def summary(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type.value, e.object["metadata"].get("name", "")) for e in events]


async def collect(stream: HttpWatchStream, *, until: int | None = None) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    try:
        async for event in stream:
            out.append(event)
            if until is not None and len(out) >= until:
                break
    finally:
        await stream.close()
    return out


async def test_paginated_list_returns_every_item_once(sim: Simulator, sim_client: ApiClient) -> None:
    for i in range(13):
        sim.store.create("pods", make_pod(f"p{i:02d}", "a"))
    for i in range(12):
        sim.store.create("pods", make_pod(f"q{i:02d}", "b"))
    lw = await pods_lw(sim_client)
    pages = []
    token: str | None = None
    while True:
        page = await lw.list(ListOptions(limit=10, continue_token=token))
        pages.append(page)
        token = page.continue_token
        if token is None:
            break
    assert [len(p.items) for p in pages] == [10, 10, 5]
    assert [p.remaining_item_count for p in pages] == [15, 5, None]
    assert {p.resource_version for p in pages} == {str(sim.store.resource_version)}
    listed = [n for p in pages for n in names(p.items)]
    assert listed == sorted(names(sim.store.list("pods")))
    assert len(set(listed)) == 25
    # List items carry no kind on the wire; the bridge fills it in.
    assert {(o["apiVersion"], o["kind"]) for p in pages for o in p.items} == {("v1", "Pod")}
    assert sim.requests["list"] == 3


async def _until(cond: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_next_page_is_requested_before_the_caller_asks(sim: Simulator, sim_client: ApiClient) -> None:
    for i in range(5):
        sim.store.create("pods", make_pod(f"p{i}", "a"))
    lw = await pods_lw(sim_client, "a")
    first = await lw.list(ListOptions(limit=2))
    assert first.continue_token
    # The second page is on its way while the caller still holds the first one.
    await _until(lambda: sim.requests["list"] == 2)
    second = await lw.list(ListOptions(limit=2, continue_token=first.continue_token))
    assert names(second.items) == ["a/p2", "a/p3"]
    assert sim.requests["list"] >= 2
    third = await lw.list(ListOptions(limit=2, continue_token=second.continue_token))
    assert names(third.items) == ["a/p4"]
    assert third.continue_token is None
    await asyncio.sleep(0.05)
    assert sim.requests["list"] == 3  # the last page asks for nothing more


async def test_a_prefetched_page_the_caller_does_not_want_is_dropped(
    sim: Simulator, sim_client: ApiClient
) -> None:
    for i in range(5):
        sim.store.create("pods", make_pod(f"p{i}", "a"))
    lw = await pods_lw(sim_client, "a")
    first = await lw.list(ListOptions(limit=2))
    # The caller restarts with a full list instead (as the reflector does after an error) ...
    whole = await lw.list(ListOptions())
    assert len(whole.items) == 5
    assert lw._prefetched is None
    # ... and a page with another size is fetched afresh, not taken from a prefetch of size 2.
    again = await lw.list(ListOptions(limit=2))
    assert again.continue_token
    other = await lw.list(ListOptions(limit=3, continue_token=again.continue_token))
    assert names(other.items) == ["a/p2", "a/p3", "a/p4"]
    # Opening a watch drops whatever page was still being prefetched.
    page = await lw.list(ListOptions(limit=2))
    assert page.continue_token
    assert lw._prefetched is not None
    task = lw._prefetched[2]
    stream = await lw.watch(WatchOptions(resource_version=page.resource_version, timeout_seconds=1))
    await stream.close()
    assert lw._prefetched is None
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    assert task.done()
    del first


async def test_a_prefetched_page_fails_or_retries_as_the_request_would(
    sim: Simulator, sim_client: ApiClient
) -> None:
    for i in range(5):
        sim.store.create("pods", make_pod(f"p{i}", "a"))
    lw = await pods_lw(sim_client, "a")
    first = await lw.list(ListOptions(limit=2))
    # Nothing has run since list() returned: the prefetch has not sent its request yet, and meets
    # a 503 first, which the REST layer retries.
    sim.set_faults(error_code=503, error_count=1, error_retry_after=0, error_target="list")
    second = await lw.list(ListOptions(limit=2, continue_token=first.continue_token))
    assert names(second.items) == ["a/p2", "a/p3"]
    assert sim.faults.injected == 1
    # An answer that is not retried reaches the caller as the request's own error.
    sim.store.create("pods", make_pod("later", "a"))
    sim.compact()
    with pytest.raises(ResourceExpiredError) as info:
        await lw.list(ListOptions(limit=2, continue_token=second.continue_token))
    assert info.value.code == 410


async def test_namespace_and_selectors_pass_through(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("web-1", "a", {"app": "web"}))
    sim.store.create("pods", make_pod("web-2", "a", {"app": "web"}))
    sim.store.create("pods", make_pod("db-1", "a", {"app": "db"}))
    sim.store.create("pods", make_pod("web-3", "b", {"app": "web"}))
    assert names((await (await pods_lw(sim_client, "a")).list(ListOptions())).items) == [
        "a/db-1", "a/web-1", "a/web-2"
    ]
    web = await pods_lw(sim_client, label_selector="app=web")
    assert names((await web.list(ListOptions())).items) == ["a/web-1", "a/web-2", "b/web-3"]
    one = await pods_lw(sim_client, "a", field_selector="metadata.name=web-2")
    assert names((await one.list(ListOptions())).items) == ["a/web-2"]
    stream = await web.watch(WatchOptions(resource_version=str(sim.store.resource_version),
                                          allow_watch_bookmarks=False, timeout_seconds=1))
    sim.store.create("pods", make_pod("db-2", "b", {"app": "db"}))
    sim.store.create("pods", make_pod("web-4", "b", {"app": "web"}))
    assert summary(await collect(stream, until=1)) == [("ADDED", "web-4")]


async def test_expired_continue_token_is_resource_expired(sim: Simulator, sim_client: ApiClient) -> None:
    for i in range(6):
        sim.store.create("pods", make_pod(f"p{i}", "a"))
    lw = await pods_lw(sim_client, "a")
    first = await lw.list(ListOptions(limit=2))
    assert first.continue_token
    sim.store.create("pods", make_pod("later", "a"))
    sim.compact()
    with pytest.raises(ResourceExpiredError) as info:
        await lw.list(ListOptions(limit=2, continue_token=first.continue_token))
    assert info.value.code == 410
    assert info.value.reason == "Expired"
    assert str(info.value).startswith("list pods in namespace a: ")
    # A full list at the same time works: the fallback the reflector uses.
    assert len((await lw.list(ListOptions())).items) == 7


async def test_exact_list_of_a_compacted_rv_expires(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    old = str(sim.store.resource_version)
    sim.store.create("pods", make_pod("b", "ns"))
    sim.compact()
    lw = await pods_lw(sim_client)
    with pytest.raises(ResourceExpiredError):
        await lw.list(ListOptions(resource_version=old, resource_version_match="Exact"))


async def test_too_large_resource_version(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    lw = await pods_lw(sim_client)
    with pytest.raises(TooLargeResourceVersionError) as info:
        await lw.list(ListOptions(resource_version="1000", resource_version_match="NotOlderThan"))
    assert info.value.code == 504
    # Retried with Retry-After as client-go's REST layer does (up to max_retries), then left to
    # the reflector, which relists consistently.
    assert sim_client.retries == sim_client.options.max_retries


async def test_list_rv_zero_and_not_older_than(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    rv = str(sim.store.resource_version)
    lw = await pods_lw(sim_client)
    assert names((await lw.list(ListOptions(resource_version="0"))).items) == ["ns/a"]
    page = await lw.list(ListOptions(resource_version=rv, resource_version_match="NotOlderThan"))
    assert page.resource_version == rv


async def test_watch_decodes_added_modified_deleted(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("before", "ns"))
    start = str(sim.store.resource_version)
    lw = await pods_lw(sim_client, "ns")
    stream = await lw.watch(WatchOptions(resource_version=start, allow_watch_bookmarks=False,
                                         timeout_seconds=5))
    created = sim.store.create("pods", make_pod("x", "ns"))
    sim.store.patch("pods", "x", {"metadata": {"labels": {"v": "2"}}}, namespace="ns")
    sim.store.delete("pods", "x", namespace="ns")
    events = await collect(stream, until=3)
    assert summary(events) == [("ADDED", "x"), ("MODIFIED", "x"), ("DELETED", "x")]
    rvs = [int(e.object["metadata"]["resourceVersion"]) for e in events]
    assert rvs == [int(created["metadata"]["resourceVersion"]) + i for i in range(3)]
    assert events[1].object["metadata"]["labels"] == {"v": "2"}
    assert events[0].object["spec"]["containers"][0]["image"] == "nginx:1.25"
    assert stream.garbage_lines == 0


async def test_watch_from_empty_rv_starts_with_synthetic_adds(sim: Simulator, sim_client: ApiClient) -> None:
    for n in ("a", "b"):
        sim.store.create("pods", make_pod(n, "ns"))
    lw = await pods_lw(sim_client)
    events = await collect(await lw.watch(WatchOptions(allow_watch_bookmarks=False, timeout_seconds=5)),
                           until=2)
    assert sorted(summary(events)) == [("ADDED", "a"), ("ADDED", "b")]


async def test_bookmarks_advance_and_timeout_ends_the_stream(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    sim.store.create("configmaps", {"metadata": {"name": "cm", "namespace": "ns"}})
    rv = str(sim.store.resource_version)
    lw = await pods_lw(sim_client, "ns")
    stream = await lw.watch(WatchOptions(resource_version=rv, timeout_seconds=1))
    events = await collect(stream)
    assert events, "expected bookmarks"
    assert {e.type for e in events} == {BOOKMARK}
    assert {e.object["metadata"]["resourceVersion"] for e in events} == {rv}
    assert stream.broken is None  # a clean end at timeoutSeconds


async def test_watch_list_initial_events_end_bookmark(sim: Simulator, sim_client: ApiClient) -> None:
    for n in ("a", "b", "c"):
        sim.store.create("pods", make_pod(n, "ns"))
    rv = str(sim.store.resource_version)
    lw = await pods_lw(sim_client)
    stream = await lw.watch(WatchOptions(send_initial_events=True, resource_version_match="NotOlderThan",
                                         allow_watch_bookmarks=True, timeout_seconds=5))
    events = await collect(stream, until=4)
    assert sorted(summary(events[:3])) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    end = events[3]
    assert end.type is BOOKMARK
    assert end.object["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    assert end.object["metadata"]["resourceVersion"] == rv


async def test_watch_from_a_compacted_rv_gets_error_410(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    old = str(sim.store.resource_version)
    sim.store.create("pods", make_pod("b", "ns"))
    sim.compact()
    lw = await pods_lw(sim_client)
    events = await collect(await lw.watch(WatchOptions(resource_version=old, timeout_seconds=5)))
    assert [e.type for e in events] == [ERROR]
    status = events[0].object
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")


async def test_expire_watches_sends_error_into_open_stream(sim: Simulator, sim_client: ApiClient) -> None:
    lw = await pods_lw(sim_client)
    stream = await lw.watch(WatchOptions(resource_version=str(sim.store.resource_version),
                                         allow_watch_bookmarks=False, timeout_seconds=5))
    sim.store.create("pods", make_pod("a", "ns"))
    events = aiter(stream)
    first = await anext(events)
    assert (first.type, first.object["metadata"]["name"]) == (ADDED, "a")
    assert sim.expire_watches() == 1
    rest = [e async for e in events]
    assert [(e.type, e.object.get("code")) for e in rest] == [(ERROR, 410)]


@pytest.mark.parametrize("code", [429, 503])
async def test_list_and_watch_retry_after_then_succeed(sim: Simulator, code: int) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    clock = InstantClock()
    async with ApiClient(server=sim.url, clock=clock) as client:
        lw = await pods_lw(client)
        sim.set_faults(error_code=code, error_count=3, error_retry_after=2, error_target="list")
        sent = client.requests_sent
        assert names((await lw.list(ListOptions())).items) == ["ns/a"]
        assert client.requests_sent - sent == 4
        assert clock.sleeps == [2.0, 2.0, 2.0]
        sim.set_faults(error_code=code, error_count=2, error_retry_after=1, error_target="watch")
        stream = await lw.watch(WatchOptions(allow_watch_bookmarks=False, timeout_seconds=5))
        assert summary(await collect(stream, until=1)) == [("ADDED", "a")]
        assert clock.sleeps == [2.0, 2.0, 2.0, 1.0, 1.0]
        assert client.retries == 5
    assert sim.faults.injected == 5


async def test_cut_line_ends_the_stream_without_garbage(sim: Simulator, sim_client: ApiClient) -> None:
    lw = await pods_lw(sim_client)
    sim.set_faults(watch_cut_after=2)
    stream = await lw.watch(WatchOptions(resource_version=str(sim.store.resource_version),
                                         allow_watch_bookmarks=False, timeout_seconds=5))
    for n in ("a", "b", "c"):
        sim.store.create("pods", make_pod(n, "ns"))
    events = await collect(stream)
    assert summary(events) == [("ADDED", "a"), ("ADDED", "b")]
    assert stream.truncated_lines == 1
    assert stream.garbage_lines == 0


async def test_close_after_n_events_ends_cleanly(sim: Simulator, sim_client: ApiClient) -> None:
    for n in ("a", "b", "c", "d"):
        sim.store.create("pods", make_pod(n, "ns"))
    lw = await pods_lw(sim_client)
    sim.set_faults(watch_close_after=3)
    stream = await lw.watch(
        WatchOptions(resource_version="0", allow_watch_bookmarks=False, timeout_seconds=5)
    )
    events = await collect(stream)
    assert len(events) == 3
    assert stream.broken is None
    assert stream.truncated_lines == 0


async def test_token_auth_via_the_simulators_kubeconfig(tmp_path: Any) -> None:
    async with Simulator(token="sim-secret-token") as sim:
        sim.store.create("pods", make_pod("a", "ns"))
        kc = sim.write_kubeconfig(tmp_path / "kubeconfig")
        async with ApiClient.from_kubeconfig(str(kc)) as client:
            lw = await pods_lw(client)
            assert names((await lw.list(ListOptions())).items) == ["ns/a"]
        async with ApiClient(server=sim.url) as anonymous:
            with pytest.raises(UnauthorizedError) as info:
                await Discovery(client=anonymous).resolve("pods")
            assert info.value.code == 401
            assert "sim-secret-token" not in str(info.value)


async def test_server_without_watch_list_rejects_it_on_open() -> None:
    async with Simulator(watch_list=False) as sim, ApiClient(server=sim.url) as client:
        lw = await pods_lw(client)
        with pytest.raises(BadRequestError) as info:
            await lw.watch(WatchOptions(send_initial_events=True, resource_version_match="NotOlderThan"))
        assert info.value.code == 422
        assert str(info.value).startswith("watch pods in all namespaces: ")
        # A plain watch on the same server works: the reflector's fallback.
        stream = await lw.watch(WatchOptions(timeout_seconds=1, allow_watch_bookmarks=False))
        assert await collect(stream) == []


async def test_stream_lines_yields_raw_lines(sim: Simulator, sim_client: ApiClient) -> None:
    sim.store.create("pods", make_pod("a", "ns"))
    lines = []
    gen = sim_client.stream_lines("/api/v1/pods", {"watch": True, "timeoutSeconds": 1})
    async with contextlib.aclosing(gen):
        async for raw in gen:
            lines.append(raw)
            break
    assert len(lines) == 1
    assert lines[0].startswith(b'{"type":"ADDED","object":{')
