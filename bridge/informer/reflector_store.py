"""What a reflector writes into: the store contract (client-go's ``Store`` as the reflector uses it)
and the optional capabilities a store may offer.

Invariants: a store method may be plain or ``async``; the reflector awaits whatever it returns when
that is awaitable (a queue with backpressure blocks the watch so), and never checks a plain ``None``
(the hot path: one comparison per call). The optional capabilities are checked once, when the
reflector is built or a list starts, never per event.
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

from bridge.contracts import KubeObject

__all__ = ["ReflectorStore", "ResourceVersionUpdater", "StreamedReplaceStore", "await_result"]


class ReflectorStore(Protocol):
    """What the reflector writes into (a RealFIFO, usually).

    Methods may be plain or ``async``: the reflector awaits whatever they return when it is
    awaitable, so a queue with backpressure can block the watch.
    """

    def add(self, obj: KubeObject) -> object:
        """An ADDED watch event."""

    def update(self, obj: KubeObject) -> object:
        """A MODIFIED watch event."""

    def delete(self, obj: KubeObject) -> object:
        """A DELETED watch event; ``obj`` is the object's last state."""

    def replace(self, items: list[KubeObject], resource_version: str) -> object:
        """The complete state as of ``resource_version`` (after a list or a WatchList)."""

    def resync(self) -> object:
        """The resync timer fired and ``should_resync`` agreed."""


@runtime_checkable
class StreamedReplaceStore(Protocol):
    """Optional store capability: a relist page by page (``RealFIFO.replace_begin`` …); the same
    outcome as one ``replace`` with every page's items."""

    def replace_begin(self) -> object: ...

    def replace_page(self, items: list[KubeObject]) -> object: ...

    def replace_abort(self) -> object: ...

    def replace_end(self, resource_version: str) -> object: ...


@runtime_checkable
class ResourceVersionUpdater(Protocol):
    """Optional store capability: told the resourceVersion after each read of the watch stream (its
    last event's, bookmarks included), once the read's events are applied."""

    def update_resource_version(self, resource_version: str) -> object: ...


async def await_result(result: object) -> None:
    """Awaits what a store method returned, when it is awaitable."""
    # Sync stores return None: skip the (comparatively slow) awaitable check on the hot path.
    if result is not None and inspect.isawaitable(result):
        await result
