"""Reflector: the exact list/watch requests and store calls for every rule of client-go's reflector.

Each test drives a :class:`Reflector` against the :class:`FakeControllerSource` with a
:class:`FakeClock` (nothing sleeps on the wall clock) and asserts the sequence of requests the
reflector made (RVs and options) and the sequence of calls on a recording store.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import (
    KubeObject,
    ListOptions,
    ListPage,
    WatchEvent,
    WatchEventType,
    WatchOptions,
    WatchStream,
)
from bridge.errors import (
    ApiUnavailableError,
    BadRequestError,
    ResourceExpiredError,
    ServerError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
)
from bridge.informer.backoff import Backoff
from bridge.informer.delta_fifo import ResourceVersionMarker
from bridge.informer.real_fifo import RealFIFO
from bridge.informer.reflector import INITIAL_EVENTS_END_ANNOTATION, Reflector, ReflectorStore
from bridge.testing import FakeControllerSource, SourceCall

Call = tuple[Any, ...]


def cm(name: str, **data: str) -> KubeObject:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns"}, "data": dict(data)}


def _added(name: str, rv: str) -> WatchEvent:
    obj = cm(name)
    obj["metadata"]["resourceVersion"] = rv
    return WatchEvent(WatchEventType.ADDED, obj)


def _name_rv(obj: KubeObject) -> tuple[str, str]:
    return obj["metadata"]["name"], obj["metadata"]["resourceVersion"]


class RecordingStore:
    """A ReflectorStore that records every call as a compact tuple."""

    def __init__(self, *, with_rv_updates: bool = True) -> None:
        self.calls: list[Call] = []
        if not with_rv_updates:
            self.update_resource_version = None  # type: ignore[assignment]

    def add(self, obj: KubeObject) -> None:
        self.calls.append(("add", *_name_rv(obj)))

    def update(self, obj: KubeObject) -> None:
        self.calls.append(("update", *_name_rv(obj)))

    def delete(self, obj: KubeObject) -> None:
        self.calls.append(("delete", *_name_rv(obj)))

    def replace(self, items: list[KubeObject], resource_version: str) -> None:
        self.calls.append(("replace", [_name_rv(o) for o in items], resource_version))

    def resync(self) -> None:
        self.calls.append(("resync",))

    def update_resource_version(self, resource_version: str) -> None:
        self.calls.append(("rv", resource_version))

    def take(self) -> list[Call]:
        out, self.calls = self.calls, []
        return out


def requests(src: FakeControllerSource) -> list[Call]:
    """The source's calls in a compact form; consumed (the record is emptied)."""
    out: list[Call] = []
    for call in src.calls:
        o = call.options
        if isinstance(o, ListOptions):
            out.append(("list", o.resource_version, o.limit, "continue" if o.continue_token else None))
        else:
            assert isinstance(o, WatchOptions)
            assert o.allow_watch_bookmarks is True
            assert o.timeout_seconds is not None
            assert 300 <= o.timeout_seconds < 600
            if o.send_initial_events:
                assert o.resource_version_match == "NotOlderThan"
                out.append(("watchlist", o.resource_version))
            else:
                assert o.resource_version_match is None
                out.append(("watch", o.resource_version))
    src.calls.clear()
    return out


async def settle() -> None:
    for _ in range(40):
        await asyncio.sleep(0)


class Harness:
    def __init__(self, src: FakeControllerSource | Any, store: RecordingStore, clock: FakeClock,
                 reflector: Reflector) -> None:
        self.src = src
        self.store = store
        self.clock = clock
        self.reflector = reflector
        self.errors: list[BaseException] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.reflector.run(), name="test-reflector-run")
        await settle()

    def pending_delay(self) -> float | None:
        deadline = self.clock.next_deadline()
        return None if deadline is None else round(deadline - self.clock.now(), 6)

    async def advance(self, seconds: float) -> None:
        await self.clock.advance(seconds)
        await settle()


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Harness]]:
    """Builds a harness; every reflector started is stopped (and its task awaited) afterwards."""
    made: list[Harness] = []

    def factory(src: Any = None, *, store: RecordingStore | None = None, **kwargs: Any) -> Harness:
        clock = FakeClock()
        source = src if src is not None else FakeControllerSource()
        rec = store if store is not None else RecordingStore()
        errors: list[BaseException] = []
        kwargs.setdefault("backoff", Backoff(jitter=0.0, clock=clock))
        kwargs.setdefault("rng", random.Random(1))
        reflector = Reflector(
            name="test", lister_watcher=source, store=rec, clock=clock,
            watch_error_handler=lambda _r, exc: errors.append(exc), **kwargs)
        h = Harness(source, rec, clock, reflector)
        h.errors = errors
        made.append(h)
        return h

    yield factory
    for h in made:
        h.reflector.stop()
        if h.task is not None:
            await asyncio.wait_for(asyncio.gather(h.task, return_exceptions=True), 5)


# --------------------------------------------------------------------------------------------------
# list, then watch


async def test_first_cycle_lists_at_rv_0_then_watches_from_the_list_rv(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("a"))
    h.src.add(cm("b"))
    await h.start()
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "2")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.reflector.last_sync_resource_version == "2"
    assert h.reflector.is_last_sync_rv_unavailable is False


async def test_watch_events_map_to_store_calls_and_advance_the_rv(make: Callable[..., Harness]) -> None:
    h = make()
    await h.start()
    assert h.store.take() == [("replace", [], "0")]
    h.src.add(cm("a"))
    h.src.modify(cm("a", k="v"))
    h.src.add(cm("b"))
    h.src.delete(cm("a"))
    h.src.advance_resource_version(3)
    h.src.inject_bookmark()
    await settle()
    assert h.store.take() == [
        ("add", "a", "1"), ("rv", "1"),
        ("update", "a", "2"), ("rv", "2"),
        ("add", "b", "3"), ("rv", "3"),
        ("delete", "a", "4"), ("rv", "4"),
        ("rv", "7"),
    ]
    assert h.reflector.last_sync_resource_version == "7"
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "0")]
    assert h.errors == []


async def test_store_without_update_resource_version_still_tracks_rv(make: Callable[..., Harness]) -> None:
    h = make(store=RecordingStore(with_rv_updates=False))
    await h.start()
    h.src.add(cm("a"))
    h.src.inject_bookmark(resource_version=1)
    await settle()
    assert h.store.take() == [("replace", [], "0"), ("add", "a", "1")]
    assert h.reflector.last_sync_resource_version == "1"


class BatchedSource(FakeControllerSource):
    """Answers the first plain watch with a stream read in ``reads`` (each one read of the stream:
    the events it decoded); everything else is the fake source's."""

    def __init__(self, reads: list[list[WatchEvent]]) -> None:
        super().__init__()
        self.reads = reads

    async def watch(self, options: WatchOptions) -> Any:
        if not self.reads:
            return await super().watch(options)
        self.calls.append(SourceCall("watch", options))
        reads, self.reads = self.reads, []
        return BatchedStream(reads)


class BatchedStream:
    """A watch stream handing out its events a read at a time (``batches()``), then ending."""

    def __init__(self, reads: list[list[WatchEvent]]) -> None:
        self._reads = reads

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        raise AssertionError("the reflector reads a batched stream by its batches")

    async def batches(self) -> AsyncIterator[list[WatchEvent]]:
        for read in self._reads:
            await asyncio.sleep(0)
            yield read

    async def close(self) -> None:
        pass


def _bookmark(rv: str) -> WatchEvent:
    return WatchEvent(WatchEventType.BOOKMARK, {"kind": "ConfigMap", "apiVersion": "v1",
                                                "metadata": {"resourceVersion": rv}})


async def test_the_store_is_told_the_resource_version_once_per_read(make: Callable[..., Harness]) -> None:
    """One progress marker per read of the stream (the events it decoded, a bookmark's included),
    after the read's events; the last synced RV is still the last event's."""
    modified = _added("a", "2")
    src = BatchedSource([
        [_added("a", "1"), WatchEvent(WatchEventType.MODIFIED, modified.object), _added("b", "3")],
        [_bookmark("5")],
        [_added("c", "6"), _bookmark("8")],
    ])
    h = make(src)
    await h.start()
    assert h.store.take() == [
        ("replace", [], "0"),
        ("add", "a", "1"), ("update", "a", "2"), ("add", "b", "3"), ("rv", "3"),
        ("rv", "5"),
        ("add", "c", "6"), ("rv", "8"),
    ]
    assert h.reflector.last_sync_resource_version == "8"


async def test_the_events_of_a_read_before_an_error_event_get_their_marker(
        make: Callable[..., Harness]) -> None:
    error = WatchEvent(WatchEventType.ERROR, {"kind": "Status", "code": 500, "reason": "InternalError",
                                              "message": "boom"})
    src = BatchedSource([[_added("a", "1"), _added("b", "2"), error, _added("c", "3")]])
    h = make(src)
    await h.start()
    assert h.store.take()[:4] == [("replace", [], "0"), ("add", "a", "1"), ("add", "b", "2"), ("rv", "2")]
    assert h.reflector.last_sync_resource_version == "2"


class WaitingStore(RecordingStore):
    """A store whose ``add`` of ``full`` answers a future (its queue is full), released by the test."""

    def __init__(self, full: str) -> None:
        super().__init__()
        self.full = full
        self.room: asyncio.Future[None] | None = None

    def add(self, obj: KubeObject) -> asyncio.Future[None] | None:  # type: ignore[override]
        super().add(obj)
        if obj["metadata"]["name"] != self.full:
            return None
        self.room = asyncio.get_running_loop().create_future()
        return self.room


async def test_before_the_watch_waits_for_room_the_events_applied_get_their_marker(
        make: Callable[..., Harness]) -> None:
    store = WaitingStore(full="b")
    src = BatchedSource([[_added("a", "1"), _added("b", "2"), _added("c", "3")]])
    h = make(src, store=store)
    await h.start()
    assert store.take() == [("replace", [], "0"), ("add", "a", "1"), ("add", "b", "2"), ("rv", "1")]
    assert store.room is not None
    store.room.set_result(None)
    await settle()
    assert store.take() == [("add", "c", "3"), ("rv", "3")]


@pytest.mark.parametrize(("min_watch_timeout", "low"), [
    # reflector_test.go TestWatchTimeout, "no timeout": five minutes to ten.
    pytest.param(None, 300, id="default"),
    pytest.param(300, 300, id="the-floor"),
    # TestWatchTimeout, "30m timeout": a longer minimum raises the floor (reflector.go
    # NewReflectorWithOptions: "if options.MinWatchTimeout > defaultMinWatchTimeout").
    pytest.param(1800, 1800, id="raised"),
])
async def test_the_watch_timeout_is_five_minutes_to_ten_unless_raised(
    make: Callable[..., Harness], min_watch_timeout: int | None, low: int,
) -> None:
    kwargs = {} if min_watch_timeout is None else {"min_watch_timeout": min_watch_timeout}
    h = make(**kwargs)
    h.src.add(cm("a"))
    await h.start()
    timeouts = [w.timeout_seconds for w in h.src.watch_calls()]
    assert len(timeouts) == 1
    assert timeouts[0] is not None
    assert low <= timeouts[0] < 2 * low


@pytest.mark.parametrize("below", [1, 2, 299])
def test_a_minimum_watch_timeout_below_five_minutes_is_rejected_naming_the_option(below: int) -> None:
    """reflector_test.go TestWatchTimeout, "small timeout not honored": client-go silently keeps five
    minutes; the bridge refuses the value, naming it, rather than pretend to honour it."""
    with pytest.raises(ValueError, match=rf"min_watch_timeout .*{below}.* 300"):
        Reflector(name="x", lister_watcher=FakeControllerSource(), store=RecordingStore(),
                  clock=FakeClock(), min_watch_timeout=below)


async def test_watch_timeouts_are_random_in_min_to_twice_min(make: Callable[..., Harness]) -> None:
    h = make(rng=random.Random(5), min_watch_timeout=300)
    await h.start()
    for _ in range(3):
        h.src.add(cm(f"o{h.src.resource_version}"))
        await settle()
        h.src.drop_watches()
        await settle()
    reference = random.Random(5)
    expected = [int(300 * (reference.random() + 1.0)) for _ in range(4)]
    assert [w.timeout_seconds for w in h.src.watch_calls()] == expected
    assert all(300 <= t < 600 for t in expected)


# --------------------------------------------------------------------------------------------------
# pagination


async def test_paginated_list_sends_only_continue_after_the_first_page(make: Callable[..., Harness]) -> None:
    h = make(page_size=2)
    for name in "abcde":
        h.src.add(cm(name))
    await h.start()
    assert requests(h.src) == [
        ("list", "0", 2, None), ("list", "", 2, "continue"), ("list", "", 2, "continue"), ("watch", "5")]
    assert h.store.take() == [
        ("replace", [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")], "5")]


async def test_page_size_0_lists_unpaginated(make: Callable[..., Harness]) -> None:
    h = make(page_size=0)
    h.src.add(cm("a"))
    await h.start()
    assert requests(h.src) == [("list", "0", None, None), ("watch", "1")]


async def test_relists_keep_paging_when_the_first_list_came_back_paginated(
    make: Callable[..., Harness],
) -> None:
    h = make()
    for i in range(501):
        h.src.add(cm(f"o{i:03d}"))
    await h.start()
    assert requests(h.src) == [("list", "0", 500, None), ("list", "", 500, "continue"), ("watch", "501")]
    h.src.drop_watches()  # very short watch: backoff, relist at "501" — still paginated
    await settle()
    await h.advance(0.8)
    assert requests(h.src) == [("list", "501", 500, None), ("list", "", 500, "continue"), ("watch", "501")]


async def test_only_a_paginated_list_at_rv_0_switches_relists_to_paging(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("first"))
    await h.start()
    for i in range(500):
        h.src.add(cm(f"o{i:03d}"))
    await settle()
    requests(h.src)
    # Relist at "501" expires, the consistent retry fails: the next cycle lists at "" (paginated).
    h.src.fail_next_list(ResourceExpiredError("expired", code=410))
    h.src.fail_next_list(ApiUnavailableError("connection refused"))
    h.src.inject_error(500)
    await settle()
    await h.advance(0.8)
    await h.advance(1.6)
    assert requests(h.src) == [
        ("list", "501", None, None), ("list", "", None, None),
        ("list", "", 500, None), ("list", "", 500, "continue"), ("watch", "501")]
    # That paginated list was at "", not "0": relists at a specific RV stay unpaginated.
    h.src.drop_watches()
    await settle()
    await h.advance(3.2)
    assert requests(h.src) == [("list", "501", None, None), ("watch", "501")]


@pytest.mark.parametrize(("page_size", "first", "relist"), [
    # reflector_test.go TestReflectorNotPaginatingNotConsistentReads: without a page size, a relist
    # at a specific RV is unpaginated (reflector.go list(): "pager.PageSize = 0"), so the watch cache
    # answers it; the first list at "0" uses the pager's default of 500.
    pytest.param(None, [("list", "0", 500, None), ("watch", "3")],
                 [("list", "3", None, None), ("watch", "3")], id="unset"),
    # reflector_test.go TestReflectorWatchListPageSize (relist at RV "10" in pages of 4); reflector.go
    # list(): "case r.WatchListPageSize != 0: pager.PageSize = r.WatchListPageSize" comes first, so a
    # configured size is used at a specific RV too, even though the first list was one page.
    pytest.param(5, [("list", "0", 5, None), ("watch", "3")], [("list", "3", 5, None), ("watch", "3")],
                 id="set-first-list-one-page"),
    pytest.param(2, [("list", "0", 2, None), ("list", "", 2, "continue"), ("watch", "3")],
                 [("list", "3", 2, None), ("list", "", 2, "continue"), ("watch", "3")], id="set-paginated"),
    # bridge: 0 never paginates.
    pytest.param(0, [("list", "0", None, None), ("watch", "3")], [("list", "3", None, None), ("watch", "3")],
                 id="zero"),
])
async def test_a_configured_page_size_is_used_by_every_list_and_relist(
    make: Callable[..., Harness], page_size: int | None, first: list[Call], relist: list[Call],
) -> None:
    h = make() if page_size is None else make(page_size=page_size)
    for name in "abc":
        h.src.add(cm(name))
    await h.start()
    assert requests(h.src) == first
    h.src.drop_watches()  # very short watch: backoff, relist at "3"
    await settle()
    await h.advance(0.8)
    assert requests(h.src) == relist
    assert h.store.take()[-1] == ("replace", [("a", "1"), ("b", "2"), ("c", "3")], "3")


class CompactAfterFirstPage(FakeControllerSource):
    """Compacts (after one more change) right after serving a first page, once per arming."""

    armed = True

    async def list(self, options: ListOptions) -> ListPage:
        page = await super().list(options)
        if self.armed and options.continue_token is None and page.continue_token:
            self.armed = False
            self.add(cm(f"late{self.resource_version}"))
            self.compact()
        return page


async def test_expired_continue_page_retries_once_as_a_full_list_at_the_original_rv(
    make: Callable[..., Harness],
) -> None:
    src = CompactAfterFirstPage()
    for name in "abc":
        src.add(cm(name))
    h = make(src, page_size=2)
    await h.start()
    # Page 1 at "0", page 2 expired, then exactly one unpaginated list at "0" — no third try.
    assert requests(h.src) == [
        ("list", "0", 2, None), ("list", "", 2, "continue"), ("list", "0", None, None), ("watch", "4")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2"), ("c", "3"), ("late3", "4")], "4")]
    assert h.reflector.is_last_sync_rv_unavailable is False
    assert h.errors == []

    # On a relist the fallback uses the relist RV (the last synced one).
    src.armed = True
    await h.advance(2)
    src.add(cm("d"))
    await settle()
    src.inject_error(500)
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [
        ("list", "5", 2, None), ("list", "", 2, "continue"), ("list", "5", None, None), ("watch", "6")]


class FailSecondPage(FakeControllerSource):
    fail_with: Exception | None = None

    async def list(self, options: ListOptions) -> ListPage:
        if options.continue_token and self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            self.calls.append(SourceCall("list", options))
            raise exc
        return await super().list(options)


async def test_other_error_on_a_continue_page_discards_the_partial_list(make: Callable[..., Harness]) -> None:
    src = FailSecondPage()
    for name in "abc":
        src.add(cm(name))
    err = ServerError("etcd timeout", code=500)
    src.fail_with = err
    h = make(src, page_size=2)
    await h.start()
    assert requests(h.src) == [("list", "0", 2, None), ("list", "", 2, "continue")]
    assert h.store.take() == []
    assert h.errors == [err]
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [
        ("list", "0", 2, None), ("list", "", 2, "continue"), ("watch", "3")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2"), ("c", "3")], "3")]


class StreamingRecordingStore(RecordingStore):
    """A store that takes a relist page by page (as the RealFIFO does)."""

    def replace_begin(self) -> None:
        self.calls.append(("begin",))

    def replace_page(self, items: list[KubeObject]) -> None:
        self.calls.append(("page", [_name_rv(o) for o in items]))

    def replace_abort(self) -> None:
        self.calls.append(("abort",))

    def replace_end(self, resource_version: str) -> None:
        self.calls.append(("end", resource_version))


async def test_a_store_that_takes_pages_gets_each_page_as_it_arrives(make: Callable[..., Harness]) -> None:
    src = FakeControllerSource()
    for name in "abc":
        src.add(cm(name))
    h = make(src, store=StreamingRecordingStore(), page_size=2)
    await h.start()
    assert requests(h.src) == [("list", "0", 2, None), ("list", "", 2, "continue"), ("watch", "3")]
    assert h.store.take() == [
        ("begin",), ("page", [("a", "1"), ("b", "2")]), ("page", [("c", "3")]), ("end", "3")]


async def test_a_streamed_list_restarts_for_the_full_list_after_an_expired_continuation(
    make: Callable[..., Harness],
) -> None:
    src = CompactAfterFirstPage()
    for name in "abc":
        src.add(cm(name))
    h = make(src, store=StreamingRecordingStore(), page_size=2)
    await h.start()
    # The full list is not older than the page already forwarded (RV 3; client-go: the original "0").
    assert requests(h.src) == [
        ("list", "0", 2, None), ("list", "", 2, "continue"), ("list", "3", None, None), ("watch", "4")]
    # What the first attempt listed no longer counts: the full list restarts the relist.
    assert h.store.take() == [
        ("begin",), ("page", [("a", "1"), ("b", "2")]),
        ("begin",), ("page", [("a", "1"), ("b", "2"), ("c", "3"), ("late3", "4")]), ("end", "4")]


async def test_a_failed_streamed_list_is_aborted_and_listed_again_whole(make: Callable[..., Harness]) -> None:
    src = FailSecondPage()
    for name in "abc":
        src.add(cm(name))
    src.fail_with = ServerError("etcd timeout", code=500)
    h = make(src, store=StreamingRecordingStore(), page_size=2)
    await h.start()
    assert h.store.take() == [("begin",), ("page", [("a", "1"), ("b", "2")]), ("abort",)]
    assert requests(h.src) == [("list", "0", 2, None), ("list", "", 2, "continue")]
    await h.advance(0.8)
    # The forwarded page came from RV 3: the retry asks for a list not older than that (client-go,
    # which forwarded nothing, retries at "0", which another API server's older cache may serve),
    # in pages of the configured size.
    assert requests(h.src) == [("list", "3", 2, None), ("list", "", 2, "continue"), ("watch", "3")]
    assert h.store.take() == [("begin",), ("page", [("a", "1"), ("b", "2")]), ("page", [("c", "3")]),
                              ("end", "3")]


# --------------------------------------------------------------------------------------------------
# list errors


@pytest.mark.parametrize(
    "exc",
    [
        ResourceExpiredError("too old resource version", code=410, reason="Expired"),
        TooLargeResourceVersionError("Too large resource version: 9, current: 3", code=504),
    ],
    ids=["expired", "too-large"],
)
async def test_unavailable_list_rv_relists_at_once_with_a_consistent_read(
    make: Callable[..., Harness], exc: Exception,
) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    h.src.add(cm("b"))
    await settle()
    h.store.take()
    requests(h.src)
    h.src.fail_next_list(exc)
    h.src.inject_error(500)  # end the cycle: backoff, then relist at the last RV
    await settle()
    await h.advance(0.8)
    # The relist at "2" fails → marked unavailable → relisted with "" without any backoff (the page
    # size chosen for the relist at "2", unpaginated, is kept for the retry, as client-go's pager).
    assert requests(h.src) == [("list", "2", None, None), ("list", "", None, None), ("watch", "2")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.reflector.is_last_sync_rv_unavailable is False
    assert h.errors == []
    assert h.pending_delay() is None


async def test_first_list_expired_relists_with_empty_rv(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.fail_next_list(ResourceExpiredError("expired", code=410))
    await h.start()
    assert requests(h.src) == [("list", "0", 500, None), ("list", "", 500, None), ("watch", "0")]


async def test_unavailable_rv_is_remembered_when_the_consistent_relist_fails(
    make: Callable[..., Harness],
) -> None:
    h = make()
    h.src.fail_next_list(ResourceExpiredError("expired", code=410))
    down = ApiUnavailableError("connection refused")
    h.src.fail_next_list(down)
    await h.start()
    assert requests(h.src) == [("list", "0", 500, None), ("list", "", 500, None)]
    assert h.reflector.is_last_sync_rv_unavailable is True
    assert h.errors == [down]
    await h.advance(0.8)
    assert requests(h.src) == [("list", "", 500, None), ("watch", "0")]
    assert h.reflector.is_last_sync_rv_unavailable is False


async def test_other_list_errors_back_off_with_growing_delays_and_call_the_handler(
    make: Callable[..., Harness],
) -> None:
    h = make()
    errs = [ServerError("boom 1", code=500), ApiUnavailableError("refused"), ServerError("boom 3", code=503)]
    for e in errs:
        h.src.fail_next_list(e)
    await h.start()
    delays = []
    for _ in errs:
        delay = h.pending_delay()
        assert delay is not None
        delays.append(delay)
        await h.advance(delay)
    assert delays == [0.8, 1.6, 3.2]
    assert h.errors == errs
    assert requests(h.src) == [("list", "0", 500, None)] * 4 + [("watch", "0")]


async def test_list_429_waits_at_least_retry_after(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.fail_next_list(TooManyRequestsError("slow down", code=429, retry_after=7.0))
    await h.start()
    assert h.pending_delay() == 7.0
    await h.advance(6.9)
    assert requests(h.src) == [("list", "0", 500, None)]
    await h.advance(0.1)
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "0")]


# --------------------------------------------------------------------------------------------------
# watch endings


async def test_410_error_event_backs_off_then_relists_at_the_last_rv(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    h.src.add(cm("b"))
    await settle()
    requests(h.src)
    h.store.take()
    h.src.inject_error(410)
    await settle()
    assert h.pending_delay() == 0.8
    assert requests(h.src) == []
    await h.advance(0.8)
    # client-go keeps the last RV for this relist (not ""): a list "not older than" it is valid,
    # unpaginated so that the watch cache can serve it.
    assert requests(h.src) == [("list", "2", None, None), ("watch", "2")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.errors == []


@pytest.mark.parametrize("page_size", [None, 1])
async def test_410_after_compaction_relists_at_last_rv_then_with_empty_rv(
    make: Callable[..., Harness], page_size: int | None,
) -> None:
    h = make(page_size=page_size)
    h.src.add(cm("a"))
    h.src.add(cm("b"))
    await h.start()
    h.src.add(cm("c"))
    await settle()
    requests(h.src)
    h.src.inject_error(410)
    await settle()
    h.src.add(cm("d"))  # unseen: the watch is down
    h.src.compact()
    await h.advance(0.8)
    if page_size is None:
        # Unpaginated "not older than 3": served despite the compaction.
        assert requests(h.src) == [("list", "3", None, None), ("watch", "4")]
    else:
        # A configured page size pages every relist; a paginated list at "3" is an exact read:
        # compacted → 410 → "" at once.
        assert requests(h.src) == [("list", "3", 1, None), ("list", "", 1, None)] + [
            ("list", "", 1, "continue")] * 3 + [("watch", "4")]
    assert h.store.take()[-1] == ("replace", [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")], "4")


async def test_other_error_event_relists_after_backoff(make: Callable[..., Harness]) -> None:
    h = make()
    await h.start()
    requests(h.src)
    h.src.inject_error(500)
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "0")]
    assert h.errors == []


async def test_429_error_event_backs_off_and_rewatches_the_same_rv(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    requests(h.src)
    h.src.inject_error(429, reason="TooManyRequests")
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("watch", "1")]


@pytest.mark.parametrize(
    ("after", "changes"),
    [(2.0, 1), (1.0, 0), (0.0, 1), (5.0, 0)],
    ids=["2s-with-events", "1s-no-events", "instant-with-event", "5s-no-events"],
)
async def test_clean_close_after_1s_or_an_event_rewatches_at_once(
    make: Callable[..., Harness], after: float, changes: int,
) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    await h.advance(after)
    for i in range(changes):
        h.src.add(cm(f"x{i}"))
    await settle()
    h.src.drop_watches()
    await settle()
    rv = str(h.src.resource_version)
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "1"), ("watch", rv)]
    assert h.pending_delay() is None
    assert [c for c in h.store.take() if c[0] == "replace"] == [("replace", [("a", "1")], "1")]


async def test_very_short_watch_backs_off_and_relists(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    await h.advance(0.5)
    h.src.drop_watches()
    await settle()
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "1")]
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("list", "1", None, None), ("watch", "1")]
    assert h.errors == []
    # A second short watch: the backoff grows.
    h.src.drop_watches()
    await settle()
    assert h.pending_delay() == 1.6


async def test_backoff_resets_after_two_minutes_of_healthy_watching(make: Callable[..., Harness]) -> None:
    h = make()
    await h.start()
    h.src.drop_watches()
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    h.src.drop_watches()
    await settle()
    assert h.pending_delay() == 1.6
    await h.advance(1.6)
    await h.advance(200.0)  # a healthy watch: > 2 min without backoff
    h.src.inject_error(410)
    await settle()
    assert h.pending_delay() == 0.8


@pytest.mark.parametrize(
    ("exc", "delay"),
    [
        (ApiUnavailableError("connection refused"), 0.8),
        (TooManyRequestsError("slow down", code=429, retry_after=3.0), 3.0),
        (TooManyRequestsError("slow down", code=429), 0.8),
    ],
    ids=["refused", "429-retry-after", "429"],
)
async def test_watch_open_refused_or_429_backs_off_and_rewatches_the_same_rv(
    make: Callable[..., Harness], exc: Exception, delay: float,
) -> None:
    h = make()
    h.src.add(cm("a"))
    h.src.fail_next_watch(exc)
    await h.start()
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "1")]
    assert h.pending_delay() == delay
    await h.advance(delay - 0.01)
    assert requests(h.src) == []
    await h.advance(0.01)
    assert requests(h.src) == [("watch", "1")]
    assert h.errors == []
    assert h.store.take() == [("replace", [("a", "1")], "1")]


async def test_other_watch_open_error_calls_the_handler_then_relists(make: Callable[..., Harness]) -> None:
    h = make()
    forbidden = BadRequestError("bad selector", code=400)
    h.src.fail_next_watch(forbidden)
    await h.start()
    assert h.errors == [forbidden]
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "0"), ("list", "0", 500, None),
                               ("watch", "0")]


@pytest.mark.parametrize(
    ("script", "rewatch"),
    [
        ([_added("b", "2"), ApiUnavailableError("connection reset by peer")], True),
        ([ApiUnavailableError("connection reset by peer")], False),
    ],
    ids=["after-an-event", "before-any-event"],
)
async def test_connection_broken_mid_stream_counts_as_a_close(
    make: Callable[..., Harness], script: list[WatchEvent | Exception], rewatch: bool,
) -> None:
    src = ScriptedSource()
    src.add(cm("a"))
    src.add(cm("b"))  # rv 2: the list returns both; the scripted watch from "2" replays b anyway
    src.watch_scripts = [script]
    h = make(src)
    await h.start()
    assert h.errors == []
    if rewatch:
        assert requests(h.src) == [("list", "0", 500, None), ("watch", "2"), ("watch", "2")]
        assert h.pending_delay() is None
    else:
        assert requests(h.src) == [("list", "0", 500, None), ("watch", "2")]
        assert h.pending_delay() == 0.8
    assert [s.closed for s in src.streams] == [True]


@pytest.mark.parametrize(
    ("exc", "expected_list_rv"),
    [
        (ServerError("unable to decode an event from the watch stream", code=500), "1"),
        (ResourceExpiredError("too old resource version", code=410), "1"),
    ],
    ids=["undecodable", "expired"],
)
async def test_stream_errors_end_the_cycle_without_calling_the_handler(
    make: Callable[..., Harness], exc: Exception, expected_list_rv: str,
) -> None:
    src = ScriptedSource()
    src.add(cm("a"))
    src.watch_scripts = [[exc]]
    h = make(src)
    await h.start()
    assert h.errors == []
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [
        ("list", "0", 500, None), ("watch", "1"), ("list", expected_list_rv, None, None), ("watch", "1")]


async def test_bookmarks_advance_the_rv_used_by_the_next_watch(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.add(cm("a"))
    await h.start()
    h.src.advance_resource_version(9)
    h.src.inject_bookmark()
    await settle()
    assert h.reflector.last_sync_resource_version == "10"
    assert h.store.take() == [("replace", [("a", "1")], "1"), ("rv", "10")]
    h.src.drop_watches()
    await settle()
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "1"), ("watch", "10")]


# --------------------------------------------------------------------------------------------------
# resync


async def test_resync_timer_calls_store_resync_when_should_resync_agrees(
    make: Callable[..., Harness],
) -> None:
    due = [True]
    h = make(resync_period=10.0, should_resync=lambda: due[0])
    await h.start()
    h.store.take()
    await h.advance(9.9)
    assert h.store.take() == []
    await h.advance(0.1)
    assert h.store.take() == [("resync",)]
    due[0] = False
    await h.advance(10.0)
    assert h.store.take() == []
    due[0] = True
    # The timer survives a re-watch within the same cycle.
    await h.advance(2.0)
    h.src.add(cm("a"))
    await settle()
    h.src.drop_watches()
    await settle()
    await h.advance(8.0)
    assert h.store.take() == [("add", "a", "1"), ("rv", "1"), ("resync",)]


async def test_resync_without_should_resync_always_fires(make: Callable[..., Harness]) -> None:
    h = make(resync_period=5.0)
    await h.start()
    h.store.take()
    await h.advance(5.0)
    await h.advance(5.0)
    assert h.store.take() == [("resync",), ("resync",)]


async def test_no_resync_timer_when_period_is_zero(make: Callable[..., Harness]) -> None:
    h = make()
    await h.start()
    assert h.pending_delay() is None
    await h.advance(3600)
    assert h.store.take() == [("replace", [], "0")]


async def test_resync_timer_stops_with_the_cycle(make: Callable[..., Harness]) -> None:
    h = make(resync_period=1.0)
    await h.start()
    h.src.drop_watches()  # very short watch: the cycle ends, backoff 0.8 s
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)  # relist; the timer restarts from now
    h.store.take()
    await h.advance(0.9)
    assert h.store.take() == []
    await h.advance(0.1)
    assert h.store.take() == [("resync",)]


# --------------------------------------------------------------------------------------------------
# WatchList


async def test_watch_list_replaces_at_the_end_bookmark_and_continues_on_the_stream(
    make: Callable[..., Harness],
) -> None:
    src = FakeControllerSource(support_watch_list=True)
    src.add(cm("b"))
    src.add(cm("a"))
    h = make(src, use_watch_list=True)
    await h.start()
    assert requests(h.src) == [("watchlist", "")]
    assert h.store.take() == [("replace", [("a", "2"), ("b", "1")], "2")]
    assert h.reflector.last_sync_resource_version == "2"
    src.modify(cm("a", v="1"))
    await settle()
    assert h.store.take() == [("update", "a", "3"), ("rv", "3")]
    # A clean close re-watches normally; a later cycle uses WatchList again from the last RV.
    src.drop_watches()
    await settle()
    assert requests(h.src) == [("watch", "3")]
    src.drop_watches()  # very short: backoff, new cycle
    await settle()
    await h.advance(0.8)
    assert requests(h.src) == [("watchlist", "3")]
    assert h.store.take() == [("replace", [("a", "3"), ("b", "1")], "3")]
    assert h.reflector.watch_list_rejected is False


async def test_watch_list_rejected_falls_back_to_list_and_remembers(make: Callable[..., Harness]) -> None:
    src = FakeControllerSource(support_watch_list=False)
    src.add(cm("a"))
    h = make(src, use_watch_list=True)
    await h.start()
    assert requests(h.src) == [("watchlist", ""), ("list", "0", 500, None), ("watch", "1")]
    assert h.store.take() == [("replace", [("a", "1")], "1")]
    assert h.reflector.watch_list_rejected is True
    assert h.errors == []
    src.drop_watches()
    await settle()
    await h.advance(0.8)
    assert requests(h.src) == [("list", "1", None, None), ("watch", "1")]


class ScriptedSource(FakeControllerSource):
    """Answers WatchList requests with ``watch_list_script``, and the next plain watches with the
    queued ``watch_scripts``; everything else is the fake source's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.watch_list_script: list[WatchEvent | Exception] = []
        self.watch_list_scripts: list[list[WatchEvent | Exception]] = []
        """Scripts for the next WatchList requests, one each, before ``watch_list_script``."""
        self.watch_scripts: list[list[WatchEvent | Exception]] = []
        self.streams: list[ScriptedStream] = []

    async def watch(self, options: WatchOptions) -> Any:
        if options.send_initial_events and self.watch_list_scripts:
            script = self.watch_list_scripts.pop(0)
        elif options.send_initial_events and self.watch_list_script:
            script = list(self.watch_list_script)
        elif self.watch_scripts:
            script = self.watch_scripts.pop(0)
        else:
            return await super().watch(options)
        self.calls.append(SourceCall("watch", options))
        stream = ScriptedStream(script)
        self.streams.append(stream)
        return stream


class ScriptedStream:
    """Yields its events (raising the exceptions among them), then ends; iterated once, as every
    watch stream."""

    def __init__(self, events: list[WatchEvent | Exception]) -> None:
        self._events = events
        self.closed = False
        self._iterated = False

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        if self._iterated:
            raise RuntimeError("a watch stream can be iterated only once")
        self._iterated = True
        return self._run()

    async def _run(self) -> AsyncIterator[WatchEvent]:
        while True:
            await asyncio.sleep(0)
            if self.closed or not self._events:
                return
            item = self._events.pop(0)
            if isinstance(item, Exception):
                raise item
            yield item

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("tail", "remember"),
    [
        ([WatchEvent(WatchEventType.ERROR, {"kind": "Status", "code": 500, "reason": "InternalError",
                                            "message": "boom"})], True),
        ([], False),
        ([ApiUnavailableError("connection reset by peer")], False),
        ([ServerError("undecodable event", code=500)], True),
    ],
    ids=["error-event", "closed-early", "connection-reset", "stream-error"],
)
async def test_watch_list_ending_before_the_end_bookmark_falls_back_in_the_same_cycle(
    make: Callable[..., Harness], tail: list[WatchEvent], remember: bool,
) -> None:
    src = ScriptedSource(support_watch_list=True)
    src.add(cm("a"))
    src.add(cm("b"))
    src.watch_list_script = [_added("a", "1"), _added("b", "2"), *tail]
    h = make(src, use_watch_list=True)
    await h.start()
    assert requests(h.src) == [("watchlist", ""), ("list", "0", 500, None), ("watch", "2")]
    # Nothing from the partial WatchList reached the store.
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.reflector.watch_list_rejected is remember
    assert [s.closed for s in src.streams] == [True]


async def test_watch_list_collects_changes_before_the_end_bookmark(make: Callable[..., Harness]) -> None:
    src = ScriptedSource(support_watch_list=True)
    end = {"kind": "ConfigMap", "metadata": {"resourceVersion": "7",
                                             "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"}}}
    other_bookmark = {"kind": "ConfigMap", "metadata": {"resourceVersion": "5"}}
    deleted = cm("a")
    deleted["metadata"]["resourceVersion"] = "6"
    src.watch_list_script = [
        _added("a", "1"), _added("b", "2"), WatchEvent(WatchEventType.BOOKMARK, other_bookmark),
        WatchEvent(WatchEventType.DELETED, deleted), _added("c", "4"),
        WatchEvent(WatchEventType.BOOKMARK, end), _added("d", "8")]
    h = make(src, use_watch_list=True)
    await h.start()
    assert h.store.take()[:3] == [("replace", [("b", "2"), ("c", "4")], "7"), ("add", "d", "8"), ("rv", "8")]


# --------------------------------------------------------------------------------------------------
# resume from a checkpoint (bridge extension)


async def test_initial_resource_version_watches_without_listing(make: Callable[..., Harness]) -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    src.add(cm("b"))
    src.modify(cm("a", v="1"))
    h = make(src, initial_resource_version="2")
    assert h.reflector.last_sync_resource_version == "2"
    await h.start()
    assert requests(h.src) == [("watch", "2")]
    assert h.store.take() == [("update", "a", "3"), ("rv", "3")]
    # Later cycles list normally, from the last synced RV.
    h.src.drop_watches()
    await settle()
    assert requests(h.src) == [("watch", "3")]


@pytest.mark.parametrize("how", ["error-event", "exception"])
async def test_expired_checkpoint_relists_consistently_at_once(
    make: Callable[..., Harness], how: str,
) -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    src.add(cm("b"))
    src.compact()
    if how == "exception":
        src.fail_next_watch(ResourceExpiredError("too old resource version: 1 (2)", code=410))
    h = make(src, initial_resource_version="1")
    await h.start()
    assert requests(h.src) == [("watch", "1"), ("list", "", 500, None), ("watch", "2")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.errors == []
    assert h.pending_delay() is None


async def test_410_after_resumed_events_is_an_ordinary_410(make: Callable[..., Harness]) -> None:
    src = FakeControllerSource()
    src.add(cm("a"))
    h = make(src, initial_resource_version="1")
    await h.start()
    src.add(cm("b"))
    await settle()
    src.inject_error(410)
    await settle()
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("watch", "1"), ("list", "2", None, None), ("watch", "2")]


# --------------------------------------------------------------------------------------------------
# lifecycle


async def test_stop_returns_promptly_and_closes_the_watch(make: Callable[..., Harness]) -> None:
    h = make()
    await h.start()
    assert len(h.src.open_watches) == 1
    h.reflector.stop()
    assert h.task is not None
    await asyncio.wait_for(h.task, 30)  # the deadline only stops a hang
    assert h.task.result() is None
    assert h.src.open_watches == []


async def test_stop_during_backoff(make: Callable[..., Harness]) -> None:
    h = make()
    h.src.fail_next_list(ServerError("down", code=503))
    await h.start()
    assert h.pending_delay() == 0.8
    h.reflector.stop()
    assert h.task is not None
    await asyncio.wait_for(h.task, 30)  # on the fake clock the backoff never ends
    assert h.pending_delay() is None


async def test_stop_before_run_and_run_twice(make: Callable[..., Harness]) -> None:
    h = make()
    h.reflector.stop()
    await asyncio.wait_for(h.reflector.run(), 1)
    assert h.src.calls == []
    h2 = make()
    await h2.start()
    with pytest.raises(RuntimeError, match="twice"):
        await h2.reflector.run()


async def test_cancelling_run_cancels_the_loop_and_closes_the_watch(make: Callable[..., Harness]) -> None:
    h = make(resync_period=3.0)
    await h.start()
    assert h.task is not None
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task
    assert h.src.open_watches == []
    assert h.pending_delay() is None


async def test_default_error_handler_logs(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    src = FakeControllerSource()
    src.fail_next_list(ServerError("etcd is down", code=503))
    r = Reflector(name="pods", lister_watcher=src, store=RecordingStore(), clock=clock)
    task = asyncio.create_task(r.run(), name="test-reflector-default-handler")
    await settle()
    r.stop()
    await task
    # The informer is a field of the record, not part of its text.
    assert any(getattr(r, "informer", None) == "pods" and "etcd is down" in r.getMessage()
               for r in caplog.records)


class FailingResyncStore(RecordingStore):
    def resync(self) -> None:
        raise RuntimeError("resync broke")


async def test_a_resync_error_is_logged_and_ends_the_cycle_without_an_error(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture,
) -> None:
    """reflector_test.go TestReflectorResync: "error from Resync is not propaged up to here"
    (ListAndWatch returns nil); reflector.go watch() logs it ("watch ended with error") and the next
    cycle relists after the backoff. The watch-error handler is not called."""
    h = make(store=FailingResyncStore(), resync_period=2.0)
    await h.start()
    await h.advance(2.0)
    assert h.errors == []
    assert any("resync broke" in r.getMessage() for r in caplog.records)
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(h.src) == [("list", "0", 500, None), ("watch", "0"), ("list", "0", 500, None),
                               ("watch", "0")]


async def test_drives_a_real_fifo() -> None:
    clock = FakeClock()
    src = FakeControllerSource()
    src.add(cm("a"))
    fifo = RealFIFO()
    store: ReflectorStore = fifo
    r = Reflector(name="cm", lister_watcher=src, store=store, clock=clock)
    task = asyncio.create_task(r.run(), name="test-reflector-fifo")
    await settle()
    src.add(cm("b"))
    await settle()
    r.stop()
    await task
    assert sorted(fifo.list_keys()) == ["ns/a", "ns/b"]


async def test_a_full_fifo_holds_the_watch_back_and_nothing_is_lost() -> None:
    """The reflector awaits what a full RealFIFO hands it: it reads no further event until the
    consumer has worked the queue down, then goes on from where it stopped, in order."""
    clock = FakeClock()
    src = FakeControllerSource()
    fifo = RealFIFO(max_queued_bytes=2 * 1024)  # dict objects count 1 KiB each
    r = Reflector(name="cm", lister_watcher=src, store=fifo, clock=clock)
    task = asyncio.create_task(r.run(), name="test-reflector-full-fifo")
    await settle()
    for i in range(8):
        src.add(cm(f"o{i}"))
    await settle()
    assert fifo.queued_deltas == 3  # the third went past the bound: the watch waits
    popped: list[str] = []

    async def consume(item: object, _initial: bool) -> None:
        if not isinstance(item, ResourceVersionMarker):
            popped.append(item.object["metadata"]["name"])  # type: ignore[attr-defined]

    while len(popped) < 8:
        await fifo.pop_ready(consume)
        await settle()
        assert fifo.queued_deltas <= 3
    assert popped == [f"o{i}" for i in range(8)]
    assert r.last_sync_resource_version == "8"
    r.stop()
    await task


def test_invalid_options_are_rejected() -> None:
    src = FakeControllerSource()
    for kwargs in ({"resync_period": -1.0}, {"page_size": -1}, {"min_watch_timeout": 0}):
        with pytest.raises(ValueError, match="reflector x"):
            Reflector(name="x", lister_watcher=src, store=RecordingStore(), clock=FakeClock(),
                      **kwargs)


# Keeps the WatchStream protocol honest for the scripted stream used above.
_stream_check: Callable[[list[WatchEvent | Exception]], WatchStream] = ScriptedStream


def _status_event(code: int, reason: str, message: str, **extra: Any) -> WatchEvent:
    return WatchEvent(WatchEventType.ERROR, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "code": code, "reason": reason, "message": message, **extra})


@pytest.mark.parametrize("how", ["event-410", "event-too-large", "open-410", "open-too-large"])
async def test_watch_list_at_an_unavailable_rv_retries_watch_list_from_a_consistent_read(
    make: Callable[..., Harness], how: str,
) -> None:
    """client-go's watchList: an expired or too-large RV marks it unavailable and retries the
    WatchList from "" at once; it says nothing about the server's WatchList support."""
    src = ScriptedSource(support_watch_list=True)
    src.add(cm("a"))
    h = make(src, use_watch_list=True)
    await h.start()
    assert requests(src) == [("watchlist", "")]
    assert h.store.take() == [("replace", [("a", "1")], "1")]
    src.drop_watches()  # very short watch: backoff, then a new cycle from RV "1"… which fails
    await settle()
    src.add(cm("b"))
    if how == "event-410":
        src.watch_list_scripts = [[_status_event(410, "Expired", "too old resource version: 1 (2)")]]
    elif how == "event-too-large":
        src.watch_list_scripts = [[_status_event(504, "Timeout",
                                                 "Too large resource version: 1, current: 0")]]
    elif how == "open-410":
        src.fail_next_watch(ResourceExpiredError("too old resource version: 1 (2)", code=410,
                                                 reason="Expired"))
    else:
        src.fail_next_watch(TooLargeResourceVersionError("Too large resource version: 1, current: 0",
                                                         code=504, reason="Timeout"))
    await settle()
    await h.advance(0.8)
    assert requests(src) == [("watchlist", "1"), ("watchlist", "")]
    assert h.store.take()[:1] == [("replace", [("a", "1"), ("b", "2")], "2")]
    assert h.reflector.watch_list_rejected is False
    assert h.reflector.is_last_sync_rv_unavailable is False
    assert h.reflector.expired_count == 1
    assert h.errors == []


@pytest.mark.parametrize("error", [
    pytest.param(_status_event(504, "Timeout", "Too large resource version: 0, current: 0",
                               details={"causes": [{"reason": "ResourceVersionTooLarge",
                                                    "message": "Too large resource version"}]}),
                 id="too-large-504"),
    # reflector.go isTooLargeResourceVersionError: "apierrors.HasStatusCause(err,
    # metav1.CauseTypeResourceVersionTooLarge)" whatever the message says.
    pytest.param(_status_event(504, "Timeout", "Timeout: request did not complete",
                               details={"causes": [{"reason": "ResourceVersionTooLarge"}]}),
                 id="too-large-by-its-cause"),
    pytest.param(_status_event(410, "Expired", "too old resource version"), id="expired-410"),
])
async def test_watch_list_unavailable_even_from_a_consistent_read_retries_the_watch_list(
    make: Callable[..., Harness], error: WatchEvent,
) -> None:
    """reflector.go watchList(): an expired or too-large resourceVersion, at any RV, is "retriable
    with side effects" (RV marked unavailable, ``continue``): the WatchList is asked again, never a
    paginated list. The bridge waits the backoff before asking again from "" (client-go asks at once)."""
    src = ScriptedSource(support_watch_list=True)
    src.add(cm("a"))
    src.watch_list_scripts = [[error]]
    h = make(src, use_watch_list=True)
    await h.start()
    assert requests(src) == [("watchlist", "")]
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    assert requests(src) == [("watchlist", "")]
    assert h.store.take() == [("replace", [("a", "1")], "1")]
    assert h.reflector.watch_list_rejected is False
    assert h.reflector.is_last_sync_rv_unavailable is False
    assert h.errors == []


async def test_a_line_the_stream_could_not_decode_rewatches_from_the_last_applied_rv(
    make: Callable[..., Harness],
) -> None:
    """client-go ends a watch at an undecodable line (ERROR 500, cause ClientWatchDecoding) and
    watches again from the last RV it applied: the change on that line comes again."""
    src = ScriptedSource()
    src.add(cm("a"))
    decode_error = _status_event(500, "InternalError", "unable to decode an event from the watch stream: x",
                                 details={"causes": [{"type": "ClientWatchDecoding", "message": "x"}]})
    src.watch_scripts = [[_added("b", "2"), decode_error, _added("d", "4")]]
    src.add(cm("b"))
    src.add(cm("c"))
    h = make(src)
    await h.start()
    assert requests(src)[:2] == [("list", "0", 500, None), ("watch", "3")]
    assert h.store.take() == [("replace", [("a", "1"), ("b", "2"), ("c", "3")], "3"), ("add", "b", "2"),
                              ("rv", "2")]
    assert h.pending_delay() == 0.8
    await h.advance(0.8)
    # No relist: the same watch again, from the last RV applied.
    assert requests(src) == [("watch", "2")]
    assert h.store.take() == [("add", "c", "3"), ("rv", "3")]
    assert h.errors == []


async def test_an_object_without_a_name_is_skipped_and_logged_with_its_rv(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture,
) -> None:
    src = ScriptedSource()
    nameless = {"kind": "ConfigMap", "metadata": {"namespace": "ns", "resourceVersion": "5"}}
    src.watch_scripts = [[_added("a", "4"), WatchEvent(WatchEventType.MODIFIED, nameless), _added("b", "6")]]
    h = make(src)
    await h.start()
    assert h.store.take()[:6] == [("replace", [], "0"), ("add", "a", "4"), ("rv", "4"), ("rv", "5"),
                                  ("add", "b", "6"), ("rv", "6")]
    [message] = [r.getMessage() for r in caplog.records if "no metadata.name" in r.getMessage()]
    assert "MODIFIED" in message
    assert "'5'" in message
