"""The queue between the reflector and the informer: deltas per key, in key order.

This is the bridge's version of client-go's ``delta_fifo.go``. The reflector turns the API server's
list and watch into ``add``/``update``/``delete``/``replace`` calls; the informer ``pop``s one key at a
time and applies all of that key's pending deltas, oldest first, to its cache and its listeners.

Rules (see ``CLIENT-GO-SEMANTICS.md``, "DeltaFIFO"):

- A key appears at most once in the queue. New deltas append to its entry; the key keeps its place.
- Two trailing ``Deleted`` deltas collapse into one, keeping the one that is not a tombstone.
- ``delete`` of a key that is neither queued nor known (``known_objects``, the informer's cache) is
  dropped: the deletion was already reported by a relist.
- ``replace`` queues every listed item as ``Replaced`` and a ``Deleted(DeletedFinalStateUnknown)`` for
  every queued or known key the list no longer contains.
- The first ``replace`` (or any ``add``/``update``/``delete`` before it) marks the queue populated;
  ``has_synced`` is true once the items queued by that first ``replace`` have all been popped, and
  ``pop`` tells the consumer whether an item belongs to that initial list.
- The bridge's streamed relist (``replace_begin``, ``replace_page`` per list page, ``replace_end``) has
  the outcome of one ``replace`` with every page's items, while the consumer pops the first pages as
  the next ones arrive; items popped before ``replace_end`` of the first relist belong to the initial
  list, and the queue is populated (``has_synced`` can become true) only at ``replace_end``.
- ``resync`` queues ``Sync`` (with the cached object) for known keys that have no queued deltas.
- The transform runs once per object, when it is queued; never on tombstones or ``Sync`` deltas
  (those objects were transformed when they were first queued).

The bridge's extension, **progress markers**: :meth:`DeltaFIFO.update_resource_version` queues a
:class:`ResourceVersionMarker` meaning "every delta queued before this marker is reflected in this
resourceVersion". The informer forwards markers to its checkpoint bookkeeping, which can then resume a
watch from the newest resourceVersion whose preceding changes every consumer has acknowledged.
Consecutive markers coalesce, so an idle watch full of bookmarks does not grow the queue.

asyncio, single loop: every mutating method is synchronous (atomic with respect to other coroutines).
``pop`` awaits the consumer's ``process`` without holding the queue: the reflector keeps queueing
meanwhile. The key being processed is tracked so that ``delete``, ``replace`` and ``resync`` judge it
by the state the cache will have once processing finishes, exactly as client-go (which holds its lock
across ``process``) would.

Growth: the queue holds at most one entry per object key plus one trailing marker between keys, so
it is bounded by the number of objects in scope (plus markers), which the cache holds anyway. Overload
is absorbed by the bounded listener buffers downstream, whose backpressure slows ``pop``.
"""

from __future__ import annotations

import asyncio
import builtins
import enum
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from bridge.contracts import (
    DeletedFinalStateUnknown,
    Indexer,
    KeyFunc,
    KubeObject,
    ObjectKey,
    TransformFunc,
)
from bridge.informer.store import meta_namespace_key_func
from bridge.rawobject import RawObject

__all__ = [
    "Delta",
    "DeltaFIFO",
    "DeltaType",
    "Deltas",
    "FIFOClosedError",
    "PopProcessFunc",
    "ResourceVersionMarker",
]


class DeltaType(enum.StrEnum):
    ADDED = "Added"
    UPDATED = "Updated"
    DELETED = "Deleted"
    REPLACED = "Replaced"
    """Queued by ``replace`` (a relist), for every listed item."""
    SYNC = "Sync"
    """Queued by ``resync``: the cached object, for a periodic resync notification."""


@dataclass(frozen=True, slots=True)
class Delta:
    """One change to one object. ``object`` is a tombstone only for ``Deleted`` deltas."""

    type: DeltaType
    object: KubeObject | DeletedFinalStateUnknown


Deltas = list[Delta]
"""The pending deltas of one key, oldest first."""


@dataclass(frozen=True, slots=True)
class ResourceVersionMarker:
    """Progress marker: every delta queued before it is reflected in ``resource_version``."""

    resource_version: str
    relist_end: bool = False
    """Queued by a completed relist (``replace`` / ``replace_end``): every delta the relist queued
    is before it. A following marker coalescing with it keeps the flag."""


PopProcessFunc = Callable[[Deltas | ResourceVersionMarker, bool], Awaitable[None]]
"""``process(item, is_in_initial_list)``: applies one key's deltas (or a marker) to the consumer."""


class FIFOClosedError(Exception):
    """``pop`` on a queue that is closed and empty: the consumer should stop."""


_Entry = ObjectKey | ResourceVersionMarker


class DeltaFIFO:
    """A queue of per-key deltas feeding one informer (client-go's ``DeltaFIFO``).

    ``known_objects`` is the informer's cache: it lets ``delete``, ``replace`` and ``resync`` know which
    objects the consumer already has. ``transform`` is applied to every object as it is queued.
    """

    def __init__(
        self,
        *,
        key_func: KeyFunc = meta_namespace_key_func,
        known_objects: Indexer | None = None,
        transform: TransformFunc | None = None,
    ) -> None:
        self._key_func = key_func
        self._known = known_objects
        self._transform = transform
        self._items: dict[ObjectKey, Deltas] = {}
        """Pending deltas per queued key; always non-empty lists."""
        self._queue: deque[_Entry] = deque()
        """Keys (each at most once, all in ``_items``) and markers, in pop order."""
        self._markers = 0
        self._queued = 0
        """Deltas in ``_items`` (all keys together)."""
        self._queued_bytes = 0
        """Their objects' JSON bytes (an estimate for objects not kept as bytes)."""
        self._in_flight: dict[ObjectKey, Deltas] = {}
        """Deltas popped and handed to ``process`` that has not returned yet."""
        self._populated = False
        self._initial_population_count = 0
        self._listing: set[ObjectKey] | None = None
        """Keys listed so far by a streamed relist in progress."""
        self._closed = False
        self._changed = asyncio.Event()
        """Set whenever the queue gains an entry or closes; ``pop`` waits on it."""

    # ------------------------------------------------------------------ producers (the reflector)

    def add(self, obj: KubeObject) -> None:
        """Queues ``Added``."""
        self._populated = True
        self._queue_action(DeltaType.ADDED, obj)

    def update(self, obj: KubeObject) -> None:
        """Queues ``Updated``."""
        self._populated = True
        self._queue_action(DeltaType.UPDATED, obj)

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        """Queues ``Deleted``, unless the key is neither queued nor known (already reported)."""
        self._populated = True
        key = self._key_func(obj)
        if key not in self._items and self._consumer_state(key) is None:
            return
        self._queue_action(DeltaType.DELETED, obj)

    def replace(self, items: Iterable[KubeObject], resource_version: str) -> None:
        """Applies a relist: every item as ``Replaced``; keys gone from the list as deleted.

        A queued key missing from ``items`` gets ``Deleted(DeletedFinalStateUnknown(key, newest queued
        object))``; a known key missing from ``items`` with nothing queued gets
        ``Deleted(DeletedFinalStateUnknown(key, cached object))``. Then a progress marker for
        ``resource_version`` is queued. The first replace fixes the initial population.
        """
        self.replace_begin()
        self.replace_page(items)
        self.replace_end(resource_version)

    # A relist streamed page by page: the same outcome as ``replace`` with every page's items, but
    # the consumer pops (and forwards) the first pages while the next ones are fetched, and the
    # queue never holds the whole list at once.

    def replace_begin(self) -> None:
        """Starts a streamed relist (a new one replaces an unfinished one: see ``replace_abort``)."""
        self._listing = set()

    def replace_page(self, items: Iterable[KubeObject]) -> None:
        """Queues one page of the relist as ``Replaced``. Until ``replace_end`` the queue is not
        populated by it: every item popped meanwhile of a first relist belongs to the initial list."""
        listed = self._listing
        if listed is None:
            raise RuntimeError("replace_page() outside replace_begin()/replace_end()")
        for obj in items:
            key = self._key_func(obj)
            listed.add(key)
            self._queue_action(DeltaType.REPLACED, obj, key=key)

    def replace_abort(self) -> None:
        """Drops an unfinished streamed relist. What it queued stays queued (each item was the
        object's state at the list's resourceVersion); only the deletions a complete list would have
        found are not inferred, and the next complete relist infers them."""
        self._listing = None

    def replace_end(self, resource_version: str) -> None:
        """Completes a streamed relist: deletions of the keys no page listed, the initial population
        (first relist), and the progress marker for ``resource_version``."""
        listed = self._listing
        if listed is None:
            raise RuntimeError("replace_end() without replace_begin()")
        self._listing = None

        for key in builtins.list(self._items):
            if key in listed:
                continue
            newest = _unwrap(self._items[key][-1].object)
            self._queue_action(DeltaType.DELETED, DeletedFinalStateUnknown(key, newest), key=key)

        for key in self._consumer_keys():
            if key in listed or key in self._items:
                continue
            cached = self._consumer_state(key)
            if cached is None:
                continue
            self._queue_action(DeltaType.DELETED, DeletedFinalStateUnknown(key, cached), key=key)

        if not self._populated:
            self._populated = True
            self._initial_population_count = len(self._items)
        self.update_resource_version(resource_version, relist_end=True)

    def resync(self) -> None:
        """Queues ``Sync(cached object)`` for every known key that has no queued deltas."""
        for key in self._consumer_keys():
            if key in self._items:
                continue
            cached = self._consumer_state(key)
            if cached is None:
                continue
            self._queue_action(DeltaType.SYNC, cached, key=key)

    def update_resource_version(self, resource_version: str, *, relist_end: bool = False) -> None:
        """Queues a progress marker; if the tail is already a marker, only its version moves."""
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, ResourceVersionMarker):
            self._queue[-1] = ResourceVersionMarker(resource_version, relist_end or tail.relist_end)
            return
        marker = ResourceVersionMarker(resource_version, relist_end)
        self._queue.append(marker)
        self._markers += 1
        self._changed.set()

    def mark_populated(self) -> None:
        """Declares the queue populated with an empty initial list (resuming from a checkpoint).

        No effect once the queue is populated.
        """
        if not self._populated:
            self._populated = True
            self._initial_population_count = 0

    def close(self) -> None:
        """Closes the queue: ``pop`` drains what is queued, then raises :class:`FIFOClosedError`."""
        self._closed = True
        self._changed.set()

    # ------------------------------------------------------------------ consumer (the informer)

    async def pop(self, process: PopProcessFunc) -> None:
        """Waits for the head entry, removes it and awaits ``process(item, is_in_initial_list)``.

        ``item`` is the head key's deltas, oldest first, or a :class:`ResourceVersionMarker` (always
        with ``is_in_initial_list=False``). An exception from ``process`` propagates; the key's deltas
        are not requeued. Raises :class:`FIFOClosedError` when the queue is closed and empty.

        Cancelled while waiting, nothing is lost; cancelled inside ``process``, the key's remaining
        deltas are dropped like on an exception (the informer only cancels on shutdown).
        Meant for a single consumer loop; concurrent pops work but process keys concurrently.
        """
        await self.pop_ready(process, limit=1)

    async def pop_ready(
        self,
        process: PopProcessFunc,
        *,
        until: float | None = None,
        limit: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """:meth:`pop` for every entry ready now, one after the other in one call; returns how many.

        Waits only for the first entry (as :meth:`pop`), never for more: it returns when the queue
        is empty, after ``limit`` entries, once the loop's clock reaches ``until`` or once
        ``stop()`` is true (each checked after an entry). Each entry is removed only when its turn
        comes, so what the producer queues meanwhile (while ``process`` awaits) joins the same run,
        and ``delete``, ``replace`` and ``resync`` judge every key exactly as between single pops.
        An exception from ``process`` propagates after its entry was removed; the entries after it
        stay queued.
        """
        while not self._queue:
            if self._closed:
                raise FIFOClosedError("the DeltaFIFO is closed")
            self._changed.clear()
            await self._changed.wait()

        clock = asyncio.get_running_loop().time if until is not None else None
        queue = self._queue
        items = self._items
        in_flight = self._in_flight
        done = 0
        while queue:
            entry = queue.popleft()
            done += 1
            if isinstance(entry, ResourceVersionMarker):
                self._markers -= 1
                await process(entry, False)
            else:
                is_in_initial_list = not self.has_synced()
                if self._initial_population_count > 0:
                    self._initial_population_count -= 1
                deltas = items.pop(entry)
                self._queued -= len(deltas)
                self._queued_bytes -= sum(_size(d.object) for d in deltas)
                in_flight[entry] = deltas
                try:
                    await process(deltas, is_in_initial_list)
                finally:
                    in_flight.pop(entry, None)
            if limit is not None and done >= limit:
                break
            if until is not None and clock is not None and clock() >= until:
                break
            if stop is not None and stop():
                break
        return done

    # ------------------------------------------------------------------ inspection

    def has_synced(self) -> bool:
        """True once populated and every item of the initial list has been popped."""
        return self._populated and self._initial_population_count == 0

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def pending_markers(self) -> int:
        """Progress markers currently queued (at most one between two keys)."""
        return self._markers

    def list_keys(self) -> builtins.list[ObjectKey]:
        """Queued keys, in pop order."""
        return [e for e in self._queue if not isinstance(e, ResourceVersionMarker)]

    def entries(self) -> builtins.list[ObjectKey | ResourceVersionMarker]:
        """Queued keys and markers, in pop order (for tests and debugging)."""
        return builtins.list(self._queue)

    def get_by_key(self, key: ObjectKey) -> Deltas | None:
        """A copy of the key's queued deltas, or None if the key is not queued."""
        deltas = self._items.get(key)
        return builtins.list(deltas) if deltas is not None else None

    def __len__(self) -> int:
        """The number of queued keys (markers not counted)."""
        return len(self._items)

    @property
    def queued_deltas(self) -> int:
        """Deltas queued, all keys together: the backlog between the watch and the informer."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """The JSON size of the queued deltas' objects (see :func:`_size`)."""
        return self._queued_bytes

    # ------------------------------------------------------------------ internals

    def _queue_action(
        self,
        delta_type: DeltaType,
        obj: KubeObject | DeletedFinalStateUnknown,
        *,
        key: ObjectKey | None = None,
    ) -> None:
        if key is None:
            key = self._key_func(obj)
        if (
            self._transform is not None
            and delta_type is not DeltaType.SYNC
            and not isinstance(obj, DeletedFinalStateUnknown)
        ):
            obj = self._transform(obj)
        delta = Delta(delta_type, obj)
        deltas = self._items.get(key)
        self._queued += 1
        self._queued_bytes += _size(obj)
        if deltas is None:
            self._items[key] = [delta]
            self._queue.append(key)
            self._changed.set()
            return
        deltas.append(delta)
        removed = _dedup_trailing_deletes(deltas)
        if removed is not None:
            self._queued -= 1
            self._queued_bytes -= _size(removed.object)

    def _consumer_keys(self) -> builtins.list[ObjectKey]:
        """Keys the consumer has, or is about to have once in-flight processing finishes."""
        if self._known is None:
            return []
        keys = self._known.list_keys()
        extra = [k for k in self._in_flight if self._known.get_by_key(k) is None]
        return keys + extra if extra else keys

    def _consumer_state(self, key: ObjectKey) -> KubeObject | None:
        """The object the consumer holds for ``key`` once in-flight processing finishes, or None.

        For a key being processed this is the newest popped delta's object (None if it is a delete):
        the cache may not have caught up yet, and judging by it would report a deletion twice or
        resync a stale object. Without ``known_objects`` nothing is known.
        """
        if self._known is None:
            return None
        in_flight = self._in_flight.get(key)
        if in_flight is not None:
            newest = in_flight[-1]
            if newest.type is DeltaType.DELETED:
                return None
            return _unwrap(newest.object)
        return self._known.get_by_key(key)


def _unwrap(obj: KubeObject | DeletedFinalStateUnknown) -> KubeObject:
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


_ESTIMATED_SIZE = 1024
"""Bytes counted for an object not kept as JSON bytes (a decoded dict, a tombstone)."""


def _size(obj: KubeObject | DeletedFinalStateUnknown) -> int:
    """An object's JSON size when it is a RawObject (its bytes), else an estimate."""
    return len(obj.raw) if type(obj) is RawObject else _ESTIMATED_SIZE


def _dedup_trailing_deletes(deltas: Deltas) -> Delta | None:
    """Collapses two trailing ``Deleted`` deltas, keeping the one that is not a tombstone; returns
    the one removed (None when nothing was collapsed)."""
    if len(deltas) < 2:
        return None
    newer, older = deltas[-1], deltas[-2]
    if newer.type is not DeltaType.DELETED or older.type is not DeltaType.DELETED:
        return None
    keep, removed = (newer, older) if isinstance(older.object, DeletedFinalStateUnknown) else (older, newer)
    deltas[-2:] = [keep]
    return removed
