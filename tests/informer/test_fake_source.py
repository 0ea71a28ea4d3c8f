"""FakeControllerSource: RV = number of changes, list/watch semantics of the API server, test controls."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bridge.contracts import ListOptions, WatchEvent, WatchEventType, WatchOptions
from bridge.errors import (
    ApiUnavailableError,
    BadRequestError,
    ResourceExpiredError,
    TooLargeResourceVersionError,
)
from bridge.testing import INITIAL_EVENTS_END_ANNOTATION, FakeControllerSource, FakeWatchStream, SourceCall


def cm(name: str, namespace: str = "default", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": dict(data)}


def summary(events: list[WatchEvent]) -> list[tuple[str, str, str]]:
    return [(e.type.value, e.object["metadata"].get("name", ""), e.object["metadata"]["resourceVersion"])
            for e in events if e.type is not WatchEventType.ERROR]


_READERS: weakref.WeakKeyDictionary[FakeWatchStream, AsyncIterator[WatchEvent]] = (
    weakref.WeakKeyDictionary())


def reader(stream: FakeWatchStream) -> AsyncIterator[WatchEvent]:
    """The one iterator over ``stream`` (a watch stream is iterated once)."""
    if stream not in _READERS:
        _READERS[stream] = aiter(stream)
    return _READERS[stream]


async def drain(stream: FakeWatchStream, n: int) -> list[WatchEvent]:
    """Reads exactly ``n`` events (the fake delivers synchronously, so they are already queued)."""
    it = reader(stream)
    return [await asyncio.wait_for(anext(it), 1.0) for _ in range(n)]


async def read_to_end(stream: FakeWatchStream) -> list[WatchEvent]:
    return [e async for e in reader(stream)]


async def test_a_watch_stream_is_iterated_once() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    stream = await src.watch(WatchOptions(resource_version="0"))
    assert summary(await drain(stream, 1)) == [("ADDED", "a", "1")]
    with pytest.raises(RuntimeError, match="iterated only once"):
        aiter(stream)
    await stream.close()


def test_resource_version_counts_changes_and_uids_are_assigned() -> None:
    src = FakeControllerSource()
    a = src.add(cm("a"))
    assert a["metadata"]["resourceVersion"] == "1"
    assert a["metadata"]["uid"]
    b = src.add(cm("b"))
    b2 = src.add({**cm("c"), "metadata": {"name": "c", "namespace": "default", "uid": "u-c"}})
    assert b2["metadata"]["uid"] == "u-c"
    m = src.modify(cm("a", x="1"))
    assert m["metadata"]["resourceVersion"] == "4"
    assert m["metadata"]["uid"] == a["metadata"]["uid"]
    d = src.delete(cm("b"))
    assert d["metadata"]["resourceVersion"] == "5"
    assert d["metadata"]["uid"] == b["metadata"]["uid"]
    assert src.resource_version == 5
    assert [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in src.items()] == [
        ("a", "4"), ("c", "3")]
    with pytest.raises(KeyError):
        src.add(cm("a"))
    with pytest.raises(KeyError):
        src.modify(cm("zz"))
    with pytest.raises(KeyError):
        src.delete(cm("zz"))


async def test_list_pages_share_one_snapshot_and_continue_tokens_expire_on_compaction() -> None:
    src = FakeControllerSource()
    for name in "edcba":
        src.add(cm(name))
    first = await src.list(ListOptions(resource_version="0", limit=2))
    assert [o["metadata"]["name"] for o in first.items] == ["a", "b"]
    assert first.resource_version == "5"
    assert first.remaining_item_count == 3
    assert first.continue_token
    # Changes after the first page do not show in later pages (snapshot at RV 5).
    src.modify(cm("c", v="2"))
    src.delete(cm("d"))
    second = await src.list(ListOptions(limit=2, continue_token=first.continue_token))
    assert [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in second.items] == [
        ("c", "3"), ("d", "2")]
    assert second.resource_version == "5"
    third = await src.list(ListOptions(limit=2, continue_token=second.continue_token))
    assert [o["metadata"]["name"] for o in third.items] == ["e"]
    assert third.continue_token is None
    assert third.remaining_item_count is None
    src.compact()
    with pytest.raises(ResourceExpiredError) as info:
        await src.list(ListOptions(limit=2, continue_token=second.continue_token))
    assert info.value.code == 410
    with pytest.raises(BadRequestError):
        await src.list(ListOptions(resource_version="5", limit=2, continue_token=first.continue_token))


async def test_list_resource_version_semantics() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    src.add(cm("b"))
    src.modify(cm("a", v="2"))  # rv 3
    for rv in ("", "0", "1"):
        page = await src.list(ListOptions(resource_version=rv))
        assert page.resource_version == "3"
        assert [o["metadata"]["resourceVersion"] for o in page.items] == ["3", "2"]
    # With a limit (or Exact) a non-zero RV reads exactly that snapshot.
    exact = await src.list(ListOptions(resource_version="1", limit=10))
    assert exact.resource_version == "1"
    assert [o["metadata"]["name"] for o in exact.items] == ["a"]
    exact2 = await src.list(ListOptions(resource_version="2", resource_version_match="Exact"))
    assert [o["metadata"]["resourceVersion"] for o in exact2.items] == ["1", "2"]
    with pytest.raises(TooLargeResourceVersionError) as too_large:
        await src.list(ListOptions(resource_version="4"))
    assert too_large.value.retry_after == 1.0
    src.compact()
    with pytest.raises(ResourceExpiredError):
        await src.list(ListOptions(resource_version="2", limit=10))
    # Not-older-than reads are still served after compaction.
    assert (await src.list(ListOptions(resource_version="2"))).resource_version == "3"
    assert (await src.list(ListOptions(resource_version="3", limit=1))).resource_version == "3"


async def test_watch_from_rv_replays_history_then_live_changes() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    src.add(cm("b"))
    src.modify(cm("a", v="1"))
    stream = await src.watch(WatchOptions(resource_version="1"))
    src.delete(cm("b"))
    assert summary(await drain(stream, 3)) == [("ADDED", "b", "2"), ("MODIFIED", "a", "3"),
                                                ("DELETED", "b", "4")]
    assert src.open_watches == [stream]
    await stream.close()
    assert src.open_watches == []
    assert await read_to_end(stream) == []


async def test_watch_from_empty_rv_starts_with_synthetic_adds() -> None:
    src = FakeControllerSource()
    src.add(cm("b"))
    src.add(cm("a"))
    src.modify(cm("b", v="1"))
    for rv in ("", "0"):
        stream = await src.watch(WatchOptions(resource_version=rv))
        assert summary(await drain(stream, 2)) == [("ADDED", "a", "2"), ("ADDED", "b", "3")]
        await stream.close()


async def test_watch_from_compacted_rv_gets_one_410_error_event() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    src.add(cm("b"))
    src.compact()
    stream = await src.watch(WatchOptions(resource_version="1"))
    events = await read_to_end(stream)
    assert len(events) == 1
    assert events[0].type is WatchEventType.ERROR
    assert events[0].object["code"] == 410
    assert events[0].object["reason"] == "Expired"
    assert events[0].object["message"] == "too old resource version: 1 (2)"
    # The compaction point itself is still watchable.
    ok = await src.watch(WatchOptions(resource_version="2"))
    src.add(cm("c"))
    assert summary(await drain(ok, 1)) == [("ADDED", "c", "3")]
    await ok.close()


async def test_drop_inject_error_and_bookmarks() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    w1 = await src.watch(WatchOptions(resource_version="1", allow_watch_bookmarks=True))
    w2 = await src.watch(WatchOptions(resource_version="1", allow_watch_bookmarks=False))
    src.inject_bookmark()
    src.add(cm("b"))
    src.drop_watches()
    assert await read_to_end(w1) == [
        WatchEvent(WatchEventType.BOOKMARK, {"kind": "ConfigMap", "apiVersion": "v1",
                                             "metadata": {"resourceVersion": "1"}}),
        WatchEvent(WatchEventType.ADDED, src.items()[1]),
    ]
    assert summary(await read_to_end(w2)) == [("ADDED", "b", "2")]
    assert src.open_watches == []

    w3 = await src.watch(WatchOptions(resource_version="2"))
    src.inject_error(500)
    events = await read_to_end(w3)
    assert [(e.type, e.object["code"], e.object["reason"]) for e in events] == [
        (WatchEventType.ERROR, 500, "InternalError")]
    w4 = await src.watch(WatchOptions(resource_version="2"))
    src.inject_error()
    (err,) = await read_to_end(w4)
    assert (err.object["code"], err.object["reason"]) == (410, "Expired")


async def test_failures_are_queued_and_calls_recorded() -> None:
    src = FakeControllerSource()
    boom = ApiUnavailableError("connection refused")
    src.fail_next_list(boom)
    src.fail_next_watch(ApiUnavailableError("refused"))
    with pytest.raises(ApiUnavailableError):
        await src.list(ListOptions(resource_version="0", limit=500))
    page = await src.list(ListOptions(resource_version="0", limit=500))
    assert page.items == []
    with pytest.raises(ApiUnavailableError):
        await src.watch(WatchOptions(resource_version="0"))
    w = await src.watch(WatchOptions(resource_version="0", timeout_seconds=300))
    await w.close()
    assert src.calls == [
        SourceCall("list", ListOptions(resource_version="0", limit=500)),
        SourceCall("list", ListOptions(resource_version="0", limit=500)),
        SourceCall("watch", WatchOptions(resource_version="0")),
        SourceCall("watch", WatchOptions(resource_version="0", timeout_seconds=300)),
    ]
    assert len(src.list_calls()) == 2
    assert len(src.watch_calls()) == 2


async def test_watch_list_sends_initial_state_then_end_bookmark_then_live() -> None:
    src = FakeControllerSource(support_watch_list=True)
    src.add(cm("b"))
    src.add(cm("a"))
    opts = WatchOptions(resource_version="", send_initial_events=True, resource_version_match="NotOlderThan")
    stream = await src.watch(opts)
    src.modify(cm("a", v="1"))
    events = await drain(stream, 4)
    assert summary(events) == [("ADDED", "a", "2"), ("ADDED", "b", "1"), ("BOOKMARK", "", "2"),
                               ("MODIFIED", "a", "3")]
    assert events[2].object["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    await stream.close()


async def test_watch_list_rejected_when_unsupported_or_malformed() -> None:
    src = FakeControllerSource(support_watch_list=False)
    with pytest.raises(BadRequestError):
        await src.watch(WatchOptions(send_initial_events=True, resource_version_match="NotOlderThan"))
    src.support_watch_list = True
    with pytest.raises(BadRequestError):
        await src.watch(WatchOptions(send_initial_events=True))
    assert src.open_watches == []


async def test_rv_moved_by_other_resources_shows_in_lists_and_bookmarks() -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    w = await src.watch(WatchOptions(resource_version="1"))
    assert src.advance_resource_version(3) == 4
    src.inject_bookmark()
    src.inject_bookmark(resource_version=2)
    assert summary(await drain(w, 2)) == [("BOOKMARK", "", "4"), ("BOOKMARK", "", "2")]
    await w.close()
    assert (await src.list(ListOptions(resource_version="0"))).resource_version == "4"
    # History replay skips the RVs that had no change here.
    src.add(cm("b"))
    w2 = await src.watch(WatchOptions(resource_version="2"))
    assert summary(await drain(w2, 1)) == [("ADDED", "b", "5")]
    await w2.close()
