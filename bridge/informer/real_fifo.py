"""The queue between the reflector and the informer: every delta in the order it arrived.

This is the bridge's version of client-go's in-order queue (``the_real_fifo.go``, the queue of every
informer since the ``InOrderInformers`` gate went GA in 1.36; the legacy per-key ``DeltaFIFO`` is
gone). The reflector turns the API server's list and watch into ``add``/``update``/``delete``/
``replace`` calls; the informer ``pop``s one delta at a time and applies it to its cache and its
listeners. Rules (docs/client-go-semantics.md, "The queue"):

- Every delta is its own entry, in arrival order, across keys: nothing is merged or reordered, so the
  informer applies the changes of one resource in the order the API server made them.
- ``replace`` (a relist) queues the deletes it infers first — ``Deleted(DeletedFinalStateUnknown)``
  for every key that is queued (newest queued object) or known (the informer's cache) but no longer
  listed, except a key whose newest queued delta is a delete already — then every listed item as
  ``Replaced``, in list order, then a progress marker for the list's resourceVersion.
- ``delete`` of a key that will be absent once everything queued is applied (neither queued nor
  known, or its newest queued delta is a delete) is dropped. (client-go queues it; the bridge never
  tells a consumer twice, nor about an object it never had.)
- ``resync`` queues ``Sync`` (with the cached object) for known keys that have no queued deltas.
- The first ``replace`` (or any ``add``/``update``/``delete`` before it) marks the queue populated;
  ``has_synced`` is true once the deltas queued up to that first ``replace`` have all been popped,
  and ``pop`` tells the consumer whether a delta belongs to that initial list.
- The transform runs once per object, when it is queued; never on tombstones or ``Sync`` deltas.

Bridge extensions:

- A relist streamed page by page (``replace_begin``, ``replace_page`` per list page,
  ``replace_end``) has the outcome of one ``replace`` with every page's items. When the consumer
  knows no object and nothing is queued (a first list), no delete can be inferred, so each page is
  poppable at once (the first pages reach consumers while the next ones are fetched). Otherwise the
  pages are held back until ``replace_end`` has queued the deletes, which come first.
- Progress markers: :meth:`RealFIFO.update_resource_version` queues a :class:`ResourceVersionMarker`
  meaning "every delta queued before this marker is reflected in this resourceVersion" (client-go
  1.36 queues ``Bookmark`` deltas likewise); the reflector queues one per read of the watch, after
  the deltas of that read. Consecutive markers coalesce.
- Backpressure: client-go's queue grows without bound when its consumer falls behind (and the
  per-key ``DeltaFIFO`` before it merged a key's changes into one entry). Here, once more than
  ``max_queued_bytes`` of objects are queued, ``add``/``update``/``delete`` (and the pages of a
  streamed first list) return a future that the reflector awaits: the watch is read again once the
  queue is down to half. A slow consumer thus holds the watch back (the API server may end it, and
  a watch from a resourceVersion it no longer has ends in a relist), and never a change is merged.

asyncio, single loop: every mutating method is synchronous (atomic with respect to other coroutines).
``pop`` awaits the consumer's ``process`` without holding the queue: the reflector keeps queueing
meanwhile. The delta being processed is tracked so that ``delete``, ``replace`` and ``resync`` judge
its key by the state the cache will have once processing finishes, exactly as client-go (which holds
its lock across ``process``) would.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections import deque
from collections.abc import Callable, Iterable

from bridge.contracts import (
    DeletedFinalStateUnknown,
    Indexer,
    KeyFunc,
    KubeObject,
    ObjectKey,
    TransformFunc,
)
from bridge.informer.delta_fifo import (
    Delta,
    Deltas,
    DeltaType,
    FIFOClosedError,
    PopProcessFunc,
    ResourceVersionMarker,
)
from bridge.informer.store import meta_namespace_key_func
from bridge.informer.transform import drop_managed_fields
from bridge.rawobject import RawObject

_monotonic = time.monotonic
_DEFAULT_LOOP_TIME = asyncio.BaseEventLoop.time
"""asyncio's own loop reads ``time.monotonic()`` as its clock (another loop may have its own)."""

__all__ = ["DEFAULT_MAX_QUEUED_BYTES", "RealFIFO"]

DEFAULT_MAX_QUEUED_BYTES = 64 << 20
"""Queued objects' JSON bytes beyond which the producer waits (twice what a listener catching up lets
wait upstream of it, :data:`bridge.informer.processor.CATCH_UP_BYTES`)."""


class RealFIFO:
    """An in-order queue of deltas feeding one informer (client-go's ``RealFIFO``).

    ``known_objects`` is the informer's cache: it lets ``delete``, ``replace`` and ``resync`` know which
    objects the consumer already has. ``transform`` is applied to every object as it is queued.
    """

    def __init__(
        self,
        *,
        key_func: KeyFunc = meta_namespace_key_func,
        known_objects: Indexer | None = None,
        transform: TransformFunc | None = None,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        if max_queued_bytes <= 0:
            raise ValueError(f"max_queued_bytes must be > 0, got {max_queued_bytes}")
        self._key_func = key_func
        self._default_key = key_func is meta_namespace_key_func
        self._known = known_objects
        self._transform = transform
        self._max_bytes = max_queued_bytes
        self._queue: deque[Delta | ResourceVersionMarker] = deque()
        """Deltas and markers, in pop order."""
        self._keys: deque[ObjectKey] = deque()
        """The key of every delta in ``_queue``, in the same order (a parallel queue: no tuple per
        delta)."""
        self._newest: dict[ObjectKey, Delta] = {}
        """The newest queued delta of every key that has one (the key's state once the queue is
        applied); the entry goes when that very delta is popped."""
        self._markers = 0
        self._queued = 0
        """Deltas in the queue (plus those a streamed relist holds back)."""
        self._queued_bytes = 0
        """Their objects' JSON bytes (an estimate for objects not kept as bytes)."""
        self._in_flight: dict[ObjectKey, Delta] = {}
        """Deltas popped and handed to ``process`` that has not returned yet."""
        self._populated = False
        self._initial_population_count = 0
        self._listing: set[ObjectKey] | None = None
        """Keys listed so far by a streamed relist in progress."""
        self._held: list[tuple[ObjectKey, Delta]] | None = None
        """The items of a streamed relist kept back until its deletes are known (None: streaming)."""
        self._room: asyncio.Future[None] | None = None
        """What producers wait on while the queue is over ``max_queued_bytes``."""
        self._closed = False
        self._changed = asyncio.Event()
        """Set when the queue gains an entry while the consumer waits for one, or closes; ``pop``
        waits on it."""
        self._waiting = 0
        """How many consumers wait on ``_changed`` (none: no wake-up to give, one call less per
        queued entry)."""

    # ------------------------------------------------------------------ producers (the reflector)

    def add(self, obj: KubeObject) -> asyncio.Future[None] | None:
        """Queues ``Added``. Returns a future to wait on when the queue is full (see the module)."""
        self._populated = True
        # A named RawObject's key was derived once, at the decode (the default key function's).
        key = obj.key if type(obj) is RawObject and obj.name and self._default_key else self._key_func(obj)
        self._queue_action(DeltaType.ADDED, obj, key)  # type: ignore[arg-type]
        return self._room_to_wait() if self._queued_bytes > self._max_bytes else None

    def update(self, obj: KubeObject) -> asyncio.Future[None] | None:
        """Queues ``Updated``. Returns a future to wait on when the queue is full."""
        self._populated = True
        # A named RawObject's key was derived once, at the decode (the default key function's).
        key = obj.key if type(obj) is RawObject and obj.name and self._default_key else self._key_func(obj)
        self._queue_action(DeltaType.UPDATED, obj, key)  # type: ignore[arg-type]
        return self._room_to_wait() if self._queued_bytes > self._max_bytes else None

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> asyncio.Future[None] | None:
        """Queues ``Deleted``, unless the key is absent once the queue is applied (already reported,
        or never known). Returns a future to wait on when the queue is full."""
        self._populated = True
        key = self._key_func(obj)
        if self._state_after_queue(key) is None:
            return None
        self._queue_action(DeltaType.DELETED, obj, key)
        return self._room_to_wait() if self._queued_bytes > self._max_bytes else None

    def replace(self, items: Iterable[KubeObject], resource_version: str) -> None:
        """Applies a relist: deletes for the keys it no longer has, then every item as ``Replaced``,
        then a progress marker for ``resource_version``. The first replace fixes the initial
        population."""
        self.replace_begin()
        self.replace_page(items)
        self.replace_end(resource_version)

    def replace_begin(self) -> None:
        """Starts a streamed relist (a new one replaces an unfinished one, as ``replace_abort``).

        Its pages are poppable at once only if no delete can be inferred (nothing known, nothing
        queued nor in flight); otherwise they wait for ``replace_end``."""
        self.replace_abort()
        self._listing = set()
        may_delete = bool(self._newest) or bool(self._in_flight) or (
            self._known is not None and bool(self._known.list_keys()))
        self._held = [] if may_delete else None

    def replace_page(self, items: Iterable[KubeObject]) -> asyncio.Future[None] | None:
        """Queues (or holds back) one page of the relist as ``Replaced``. Until ``replace_end`` the
        queue is not populated by it: every item popped meanwhile of a first relist belongs to the
        initial list. Returns a future to wait on when the queue is full and the page is poppable."""
        listed = self._listing
        if listed is None:
            raise RuntimeError("replace_page() outside replace_begin()/replace_end()")
        held = self._held
        key_func = self._key_func
        for obj in items:
            key = key_func(obj)
            listed.add(key)
            if held is None:
                self._queue_action(DeltaType.REPLACED, obj, key)
            else:
                delta = self._delta(DeltaType.REPLACED, obj)
                held.append((key, delta))
        if held is None and self._queued_bytes > self._max_bytes:
            return self._room_to_wait()
        return None

    def replace_abort(self) -> None:
        """Drops an unfinished streamed relist. Pages it queued for popping stay queued (each item was
        the object's state at the list's resourceVersion, and may have reached consumers); pages it
        held back are dropped, as client-go drops a list that failed: nobody saw them, and the next
        complete relist lists them again and infers the deletions this one could not."""
        held, self._held = self._held, None
        self._listing = None
        if held:
            self._queued -= len(held)
            self._queued_bytes -= sum(_size(d.object) for _, d in held)

    def replace_end(self, resource_version: str) -> None:
        """Completes a streamed relist: the deletions of the keys no page listed, then the held
        items, the initial population (first relist) and the progress marker for
        ``resource_version``."""
        listed = self._listing
        if listed is None:
            raise RuntimeError("replace_end() without replace_begin()")
        held, self._held = self._held, None
        self._listing = None

        gone: list[tuple[ObjectKey, KubeObject]] = []
        for key, newest in self._newest.items():
            if key not in listed and newest.type is not DeltaType.DELETED:
                gone.append((key, _unwrap(newest.object)))
        for key in self._consumer_keys():
            if key in listed or key in self._newest:
                continue
            cached = self._consumer_state(key)
            if cached is not None:
                gone.append((key, cached))
        for key, last in gone:
            self._queue_action(DeltaType.DELETED, DeletedFinalStateUnknown(key, last), key)
        for key, delta in held or ():
            self._enqueue(key, delta)

        if not self._populated:
            self._populated = True
            self._initial_population_count = self._queued
        self.update_resource_version(resource_version, relist_end=True)

    def resync(self) -> None:
        """Queues ``Sync(cached object)`` for every known key that has no queued deltas."""
        for key in self._consumer_keys():
            if key in self._newest:
                continue
            cached = self._consumer_state(key)
            if cached is None:
                continue
            self._queue_action(DeltaType.SYNC, cached, key)

    def update_resource_version(self, resource_version: str, *, relist_end: bool = False) -> None:
        """Queues a progress marker; if the tail is already a marker, only its version moves."""
        queue = self._queue
        tail = queue[-1] if queue else None
        if type(tail) is ResourceVersionMarker:
            queue[-1] = ResourceVersionMarker(resource_version, relist_end or tail.relist_end)
            return
        queue.append(ResourceVersionMarker(resource_version, relist_end))
        self._markers += 1
        if self._waiting:
            self._changed.set()

    def mark_populated(self) -> None:
        """Declares the queue populated with an empty initial list (resuming from a checkpoint).

        No effect once the queue is populated.
        """
        if not self._populated:
            self._populated = True
            self._initial_population_count = 0

    def close(self) -> None:
        """Closes the queue: ``pop`` drains what is queued, then raises :class:`FIFOClosedError`.
        A producer waiting for room is released."""
        self._closed = True
        self._changed.set()
        self._release_room()

    # ------------------------------------------------------------------ consumer (the informer)

    async def pop(self, process: PopProcessFunc) -> None:
        """Waits for the head entry, removes it and awaits ``process(item, is_in_initial_list)``.

        ``item`` is one :class:`Delta` or a :class:`ResourceVersionMarker` (always with
        ``is_in_initial_list=False``). An exception from ``process`` propagates; the delta is not
        requeued. Raises :class:`FIFOClosedError` when the queue is closed and empty.

        Cancelled while waiting, nothing is lost; cancelled inside ``process``, the delta is dropped
        as on an exception (the informer only cancels on shutdown). Meant for a single consumer loop.
        """
        await self.pop_ready(process, limit=1)

    async def wait_ready(self) -> None:
        """Returns once an entry is queued; raises :class:`FIFOClosedError` when the queue is closed
        and empty. (``pop_ready`` right after it, without an await in between, does not wait.)"""
        while not self._queue:
            if self._closed:
                raise FIFOClosedError("the queue is closed")
            self._changed.clear()
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1

    async def pop_ready(self, process: PopProcessFunc, *, until: float | None = None,
                        limit: int | None = None, stop: Callable[[], bool] | None = None) -> int:
        """:meth:`pop` for every entry ready now, one after the other in one call; returns how many.

        Waits only for the first entry (as :meth:`pop`), never for more: it returns when the queue
        is empty, after ``limit`` entries (checked after each entry), once the loop's clock reaches
        ``until`` or once ``stop()`` is true (both checked after each delta: a progress marker is
        cheap to process, and one follows each read of the watch). Each entry is removed only when its turn
        comes, so what the producer queues meanwhile (while ``process`` awaits) joins the same run,
        and ``delete``, ``replace`` and ``resync`` judge every key exactly as between single pops.
        An exception from ``process`` propagates after its entry was removed; the entries after it
        stay queued.
        """
        if not self._queue:
            await self.wait_ready()

        clock = _loop_clock() if until is not None else None
        queue = self._queue
        keys = self._keys
        newest = self._newest
        in_flight = self._in_flight
        done = 0
        while queue:
            delta = queue.popleft()
            done += 1
            if type(delta) is ResourceVersionMarker:
                self._markers -= 1
                await process(delta, False)
                # A marker is cheap to process: the clock and ``stop`` are looked at after deltas.
                if limit is not None and done >= limit:
                    break
                continue
            assert type(delta) is Delta
            key = keys.popleft()
            if self._initial_population_count > 0:
                self._initial_population_count -= 1
                is_in_initial_list = True
            else:
                is_in_initial_list = not self._populated
            if newest.get(key) is delta:
                del newest[key]
            self._queued -= 1
            obj = delta.object
            self._queued_bytes -= len(obj.raw) if type(obj) is RawObject else _ESTIMATED_SIZE
            if self._room is not None and self._queued_bytes <= self._max_bytes // 2:
                self._release_room()
            in_flight[key] = delta
            try:
                await process(delta, is_in_initial_list)
            finally:
                in_flight.pop(key, None)
            if limit is not None and done >= limit:
                break
            if until is not None and clock is not None and clock() >= until:
                break
            if stop is not None and stop():
                break
        return done

    # ------------------------------------------------------------------ inspection

    def has_synced(self) -> bool:
        """True once populated and every delta of the initial list has been popped."""
        return self._populated and self._initial_population_count == 0

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def pending_markers(self) -> int:
        """Progress markers currently queued (never two in a row)."""
        return self._markers

    def list_keys(self) -> builtins.list[ObjectKey]:
        """The key of every queued delta, in pop order (a key once per delta)."""
        return builtins.list(self._keys)

    def entries(self) -> builtins.list[ObjectKey | ResourceVersionMarker]:
        """Queued deltas' keys and markers, in pop order (for tests and debugging)."""
        keys = iter(self._keys)
        return [e if isinstance(e, ResourceVersionMarker) else next(keys) for e in self._queue]

    def get_by_key(self, key: ObjectKey) -> Deltas | None:
        """The key's queued deltas, oldest first (a new list), or None if none is queued."""
        if key not in self._newest:
            return None
        deltas = [e for e in self._queue if not isinstance(e, ResourceVersionMarker)]
        return [d for d, k in zip(deltas, self._keys, strict=True) if k == key]

    def __len__(self) -> int:
        """The number of poppable deltas (markers and held-back relist items not counted)."""
        return len(self._keys)

    @property
    def queued_deltas(self) -> int:
        """Deltas queued (held-back relist items included): the backlog between watch and informer."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """The JSON size of the queued deltas' objects (see :func:`_size`)."""
        return self._queued_bytes

    # ------------------------------------------------------------------ internals


    def _delta(self, delta_type: DeltaType, obj: KubeObject | DeletedFinalStateUnknown) -> Delta:
        if (
            self._transform is not None
            and delta_type is not DeltaType.SYNC
            and not isinstance(obj, DeletedFinalStateUnknown)
        ):
            obj = self._transform(obj)
        self._queued += 1
        self._queued_bytes += _size(obj)
        return Delta(delta_type, obj)

    def _queue_action(
        self, delta_type: DeltaType, obj: KubeObject | DeletedFinalStateUnknown, key: ObjectKey,
    ) -> None:
        # _delta and _enqueue in one (the path of every watch event).
        if type(obj) is RawObject:
            transform = self._transform
            # The default transform leaves an object without managedFields (cut at the decode) as
            # it is: not called for it (two calls less per event).
            if transform is not None and delta_type is not DeltaType.SYNC and (
                    obj.managed_fields or transform is not drop_managed_fields):
                obj = transform(obj)
            size = len(obj.raw) if type(obj) is RawObject else _ESTIMATED_SIZE
            delta = Delta(delta_type, obj)
            self._queued += 1
            self._queued_bytes += size
        else:
            delta = self._delta(delta_type, obj)
        self._queue.append(delta)
        self._keys.append(key)
        self._newest[key] = delta
        if self._waiting:
            self._changed.set()

    def _enqueue(self, key: ObjectKey, delta: Delta) -> None:
        self._queue.append(delta)
        self._keys.append(key)
        self._newest[key] = delta
        if self._waiting:
            self._changed.set()

    def _room_to_wait(self) -> asyncio.Future[None]:
        """A future done once the queue is down to half; each caller gets its own view of it, so a
        producer cancelled while it waits (a reflector stopped) leaves the others waiting."""
        room = self._room
        if room is None:
            room = self._room = asyncio.get_running_loop().create_future()
        return asyncio.shield(room)

    def _release_room(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    def _state_after_queue(self, key: ObjectKey) -> KubeObject | None:
        """The object the consumer holds for ``key`` once everything queued is applied, or None."""
        newest = self._newest.get(key)
        if newest is None:
            return self._consumer_state(key)
        if newest.type is DeltaType.DELETED:
            return None
        return _unwrap(newest.object)

    def _consumer_keys(self) -> builtins.list[ObjectKey]:
        """Keys the consumer has, or is about to have once in-flight processing finishes."""
        if self._known is None:
            return []
        keys = self._known.list_keys()
        extra = [k for k in self._in_flight if self._known.get_by_key(k) is None]
        return keys + extra if extra else keys

    def _consumer_state(self, key: ObjectKey) -> KubeObject | None:
        """The object the consumer holds for ``key`` once in-flight processing finishes, or None.

        For a key being processed this is the popped delta's object (None if it is a delete): the
        cache may not have caught up yet, and judging by it would report a deletion twice or resync
        a stale object. Without ``known_objects`` nothing is known.
        """
        if self._known is None:
            return None
        in_flight = self._in_flight.get(key)
        if in_flight is not None:
            if in_flight.type is DeltaType.DELETED:
                return None
            return _unwrap(in_flight.object)
        return self._known.get_by_key(key)


def _loop_clock() -> Callable[[], float]:
    """The running loop's clock, read once per ``pop_ready``: the default loop's is
    ``time.monotonic``, then read directly (one call less per delta)."""
    loop = asyncio.get_running_loop()
    return _monotonic if type(loop).time is _DEFAULT_LOOP_TIME else loop.time


def _unwrap(obj: KubeObject | DeletedFinalStateUnknown) -> KubeObject:
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


_ESTIMATED_SIZE = 1024
"""Bytes counted for an object not kept as JSON bytes (a decoded dict, a tombstone)."""


def _size(obj: KubeObject | DeletedFinalStateUnknown) -> int:
    """An object's JSON size when it is a RawObject (its bytes), else an estimate."""
    return len(obj.raw) if type(obj) is RawObject else _ESTIMATED_SIZE
