"""A fake event handler that records every call, for tests of the informer and its consumers.

Calls are kept as small tuples that read well in exact-sequence assertions::

    ("add", "ns/a", "3", True)           # key, resourceVersion, is_in_initial_list
    ("update", "ns/a", "3", "5")         # key, old resourceVersion, new resourceVersion
    ("delete", "ns/a", "5", False)       # key, resourceVersion, was it a DeletedFinalStateUnknown

Waiting for calls is driven by the event loop (futures resolved by the handler itself), never by
sleeping on the wall clock. :meth:`RecordingHandler.apply_to` replays the calls onto a plain dict, the
way a consumer would maintain its own copy, and refuses updates/deletes of objects it was never told
about.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bridge.contracts import DeletedFinalStateUnknown, KeyFunc, KubeObject
from bridge.informer.store import meta_namespace_key_func

__all__ = ["Call", "RecordingHandler", "UnknownObjectError", "apply_calls", "resource_version_of"]

Call = tuple[Any, ...]
"""("add", key, rv, is_initial) | ("update", key, old_rv, new_rv) | ("delete", key, rv, tombstone)."""


class UnknownObjectError(AssertionError):
    """A handler was told about an update or delete of an object it was never told exists."""


def resource_version_of(obj: KubeObject | DeletedFinalStateUnknown) -> str:
    if isinstance(obj, DeletedFinalStateUnknown):
        obj = obj.obj
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def apply_calls(calls: list[Call], state: dict[str, str]) -> dict[str, str]:
    """Applies recorded calls in order to ``state`` (key → resourceVersion) and returns it.

    Raises :class:`UnknownObjectError` for an update or delete of a key not present, and for an add
    of a key already present (a consumer would then have missed a delete).
    """
    for call in calls:
        kind, key = call[0], call[1]
        if kind == "add":
            if key in state:
                raise UnknownObjectError(f"add of {key!r} which is already present: {call}")
            state[key] = call[2]
        elif kind == "update":
            if key not in state:
                raise UnknownObjectError(f"update of {key!r} which was never added: {call}")
            state[key] = call[3]
        elif kind == "delete":
            if key not in state:
                raise UnknownObjectError(f"delete of {key!r} which was never added: {call}")
            del state[key]
        else:
            raise ValueError(f"unknown call {call!r}")
    return state


class RecordingHandler:
    """An :class:`~bridge.contracts.EventHandler` that records its calls.

    ``gate``, when given, is awaited at the start of every call (a test holds the handler by leaving
    it unset). ``fail_on`` makes the handler raise ``RuntimeError`` for calls it returns True for
    (the call is still recorded first).
    """

    def __init__(
        self,
        *,
        key_func: KeyFunc = meta_namespace_key_func,
        gate: asyncio.Event | None = None,
        fail_on: Callable[[Call], bool] | None = None,
    ) -> None:
        self.calls: list[Call] = []
        self.objects: list[tuple[str, Any, Any]] = []
        """(kind, old-or-None, obj) for each call, the objects themselves."""
        self._key_func = key_func
        self.gate = gate
        self._fail_on = fail_on
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    # ------------------------------------------------------------------ EventHandler

    async def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
        await self._record(
            ("add", self._key_func(obj), resource_version_of(obj), is_in_initial_list), None, obj
        )

    async def on_update(self, old: KubeObject, new: KubeObject) -> None:
        await self._record(
            ("update", self._key_func(new), resource_version_of(old), resource_version_of(new)), old, new
        )

    async def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        tombstone = isinstance(obj, DeletedFinalStateUnknown)
        await self._record(("delete", self._key_func(obj), resource_version_of(obj), tombstone), None, obj)

    # ------------------------------------------------------------------ helpers

    async def _record(self, call: Call, old: Any, obj: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.calls.append(call)
        self.objects.append((call[0], old, obj))
        n = len(self.calls)
        still: list[tuple[int, asyncio.Future[None]]] = []
        for want, fut in self._waiters:
            if n >= want:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((want, fut))
        self._waiters = still
        if self._fail_on is not None and self._fail_on(call):
            raise RuntimeError(f"recording handler told to fail on {call}")

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[Call]:
        """Returns the calls once at least ``count`` were recorded.

        ``timeout`` (loop time) only turns a test bug into a clear failure; nothing waits for it in
        a passing test.
        """
        if len(self.calls) < count:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((count, fut))
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except TimeoutError:
                raise AssertionError(
                    f"expected {count} handler calls, got {len(self.calls)}: {self.calls}"
                ) from None
        return list(self.calls)

    def apply_to(self, state: dict[str, str]) -> dict[str, str]:
        """Applies every recorded call to ``state`` (see :func:`apply_calls`)."""
        return apply_calls(self.calls, state)

    def clear(self) -> None:
        self.calls.clear()
        self.objects.clear()
