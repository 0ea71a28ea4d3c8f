"""Property test: whatever the API source does, the informer converges and its handlers agree.

Random sequences of creates, updates, deletes, re-creations under a new uid, dropped watches, ERROR
410 events and compactions run against a FakeControllerSource (on a FakeClock, so backoffs cost no
wall time). After the sequence the informer must converge, and then:

(a) the cache holds exactly the source's objects (key → resourceVersion);
(b) applying every handler call, in order, to an empty map reproduces the source's state;
(c) no handler is told about an update or delete of an object it was not told exists
    (``apply_calls`` raises on the first such call; ``check_object_identity`` also compares uids).

Two handlers are registered (one before start, one after the first sync) so the late-handler replay
is covered by the same three properties. Each example runs with the dict cache, the compact cache fed
dicts, or the compact cache fed RawObjects (as the service runs).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.clock import FakeClock
from bridge.contracts import (
    KubeObject,
    ListenerOptions,
    ListerWatcher,
    ListOptions,
    ListPage,
    WatchEvent,
    WatchEventType,
    WatchOptions,
    WatchStream,
)
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.rawobject import decode_object
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.recorder import RecordingHandler, apply_calls

KEYS = ["a", "b", "c", "d"]

Op = tuple[str, str]

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["create", "update", "delete", "recreate"]), st.sampled_from(KEYS)),
        st.tuples(st.sampled_from(["drop", "expire", "compact", "settle"]), st.just("")),
    ),
    max_size=14,
)


def cm(name: str, generation: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "ns", "name": name, "managedFields": [{"manager": "test"}]},
        "data": {"generation": str(generation)},
    }


def source_state(source: FakeControllerSource) -> dict[str, str]:
    return {f"ns/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in source.items()}


def apply_op(source: FakeControllerSource, op: Op, counter: list[int]) -> None:
    kind, name = op
    exists = any(o["metadata"]["name"] == name for o in source.items()) if name else False
    counter[0] += 1
    if kind == "create":
        if exists:
            source.modify(cm(name, counter[0]))
        else:
            source.add(cm(name, counter[0]))
    elif kind == "update":
        if exists:
            source.modify(cm(name, counter[0]))
    elif kind == "delete":
        if exists:
            source.delete(cm(name))
    elif kind == "recreate":
        if exists:
            source.delete(cm(name))
        source.add(cm(name, counter[0]))
    elif kind == "drop":
        source.drop_watches()
    elif kind == "expire":
        source.inject_error(410)
    elif kind == "compact":
        source.compact()


def uid_of(obj: Any) -> str:
    obj = getattr(obj, "obj", obj)  # a DeletedFinalStateUnknown carries the last known object
    return str(obj["metadata"]["uid"])


def check_object_identity(handler: RecordingHandler) -> None:
    """(c) at the level of object identity: an update or delete names the uid the handler was told
    about for that key (a re-created object must not arrive as an update of the old one)."""
    known: dict[str, str] = {}
    for call, (_, _, obj) in zip(handler.calls, handler.objects, strict=True):
        kind, key = call[0], call[1]
        if kind == "add":
            known[key] = uid_of(obj)
        else:
            assert known.get(key) == uid_of(obj), (call, known.get(key), uid_of(obj))
            if kind == "delete":
                del known[key]


async def spin(n: int = 30) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _as_raw(obj: KubeObject) -> KubeObject:
    return decode_object(orjson.dumps(obj), drop_managed_fields=True)


class _RawStream:
    def __init__(self, stream: WatchStream) -> None:
        self._stream = stream

    async def _events(self) -> AsyncIterator[WatchEvent]:
        async for event in self._stream:
            if event.type is WatchEventType.ERROR:
                yield event
            else:
                yield WatchEvent(event.type, _as_raw(event.object))

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        # Delegates to the fake stream, which raises on a second iteration.
        return self._events()

    async def close(self) -> None:
        await self._stream.close()


class RawSource:
    """The source as the HTTP lister-watcher hands objects out with the compact cache: RawObjects."""

    def __init__(self, source: FakeControllerSource) -> None:
        self._source = source

    async def list(self, options: ListOptions) -> ListPage:
        page = await self._source.list(options)
        return dataclasses.replace(page, items=[_as_raw(o) for o in page.items])

    async def watch(self, options: WatchOptions) -> WatchStream:
        return _RawStream(await self._source.watch(options))


async def scenario(initial: list[str], ops: list[Op], mode: str = "dict") -> None:
    """``mode``: "dict" (dict cache), "compact" (compact cache fed dicts), "raw" (compact cache fed
    RawObjects, as the service runs)."""
    source = FakeControllerSource()
    clock = FakeClock()
    for name in initial:
        source.add(cm(name))
    lw: ListerWatcher = RawSource(source) if mode == "raw" else source
    informer = SharedIndexInformer(lister_watcher=lw, clock=clock, name="prop", compact_cache=mode != "dict")
    early = RecordingHandler()
    informer.add_event_handler(early, ListenerOptions(name="early"))
    task = asyncio.create_task(informer.run(), name="prop-informer")
    late: RecordingHandler | None = None
    counter = [0]
    try:
        assert await informer.wait_for_cache_sync(5)
        late = RecordingHandler()
        informer.add_event_handler(late, ListenerOptions(name="late"))
        for op in ops:
            if op[0] == "settle":
                await spin()
                await clock.advance(61)
            else:
                apply_op(source, op, counter)
            await spin(3)

        want = source_state(source)

        def cache_state() -> dict[str, str]:
            return {
                str(k): informer.get_indexer().get_by_key(k)["metadata"]["resourceVersion"]  # type: ignore[index]
                for k in informer.get_indexer().list_keys()
            }

        for _ in range(40):
            await spin()
            if (
                cache_state() == want
                and apply_calls(early.calls, {}) == want
                and apply_calls(late.calls, {}) == want
            ):
                break
            await clock.advance(61)
        # (a) the cache converged to the source
        assert cache_state() == want, (ops, cache_state(), want)
        # (b) + (c): replaying each handler's calls reproduces the source, never touching an
        # object the handler was not told about
        assert apply_calls(early.calls, {}) == want, (ops, early.calls)
        assert apply_calls(late.calls, {}) == want, (ops, late.calls)
        check_object_identity(early)
        check_object_identity(late)
        cached = informer.get_indexer().list()
        assert all("managedFields" not in o["metadata"] for o in cached)
    finally:
        await informer.shutdown(2)
        await task


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.lists(st.sampled_from(KEYS), unique=True, max_size=3), ops=ops_strategy,
       mode=st.sampled_from(["dict", "compact", "raw"]))
def test_informer_converges_and_handlers_reproduce_source(initial: list[str], ops: list[Op],
                                                          mode: str) -> None:
    asyncio.run(scenario(initial, ops, mode))
