"""The namespace-filtered watch stream (:mod:`bridge.informer.namespaces`) as its consumer leaves it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from bridge.contracts import WatchEvent, WatchStream
from bridge.informer.namespaces import NamespaceScope, _FilteredStream


class _Scope:
    """What the stream reads of a scope: one that never changes."""

    generation = 0

    async def wait_changed(self, generation: int) -> None:
        await asyncio.Event().wait()

    def matches(self, namespace: str) -> bool:
        return True


class _Inner:
    """A watch stream that sends nothing until released, then ends."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        await self.release.wait()
        return
        yield  # an async generator

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def close(self) -> None:
        self.release.set()


async def test_a_consumer_cancelled_while_the_stream_waits_leaves_no_task_behind() -> None:
    """The stream waits for the inner stream's next event in a task of its own; a consumer cancelled
    meanwhile (the informer stopping, a watch restarted) must take that task down with it: left
    running, it ended with the inner stream's StopAsyncIteration that nobody retrieved (logged as
    "Task exception was never retrieved" by every namespace_selector test)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        inner = _Inner()
        stream = _FilteredStream(inner=cast(WatchStream, inner), scope=cast(NamespaceScope, _Scope()),
                                 generation=0)
        batches = cast(AsyncGenerator[list[WatchEvent], None], stream.batches())

        async def consume() -> list[WatchEvent]:
            return await anext(batches)

        consumer = asyncio.create_task(consume(), name="consumer")
        for _ in range(5):
            await asyncio.sleep(0)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        inner.release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        await batches.aclose()
        gc.collect()
        for _ in range(3):
            await asyncio.sleep(0)
        assert [c.get("message") for c in reported] == []
        assert [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    finally:
        loop.set_exception_handler(previous)
