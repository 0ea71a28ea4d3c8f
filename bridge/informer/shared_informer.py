"""One informer per watched resource, shared by every consumer: client-go's ``sharedIndexInformer``.

It wires the pieces together — :class:`~bridge.reflector.Reflector` (list + watch) →
:class:`~bridge.real_fifo.RealFIFO` (in order) → *HandleDeltas* → :class:`~bridge.store.IndexedCache` →
:class:`~bridge.processor.SharedProcessor` → one bounded listener per handler — and applies
client-go 1.36's rules (docs/client-go-semantics.md):

* deltas are applied one at a time in the order they arrived, so every listener is told about the
  changes of the resource in the order the API server made them, across objects; a relist's inferred
  deletes come before its items;
* the cache is updated before any handler is told; Sync/Replaced/Added/Updated of a cached object is
  an update, otherwise an add (with the FIFO's ``is_in_initial_list``); Deleted is a delete;
* a Sync or Replaced delta whose old and new resourceVersion are equal is a resync notification,
  delivered only to the listeners whose own resync period is due; an Added or Updated delta goes to
  every listener even at an unchanged resourceVersion (client-go judges by the resourceVersion alone
  and would drop such a change for every listener not due for a resync);
* per-handler resync periods are clamped as client-go does (0 = never, < 1 s → 1 s, before start a
  smaller period lowers the informer's check period, after start it is raised to it; a zero check
  period disables every handler's resync);
* a handler added after start first receives the whole cache as adds with ``is_in_initial_list``
  (untracked, ``seq = -1``) and has its own ``has_synced``;
* ``set_transform`` / ``set_watch_error_handler`` after start raise :class:`InformerStartedError`.

Bridge extensions:

* ``split_uid_changes``: an object deleted and re-created under the same name while the watch was
  down arrives as one update whose uid changed; the informer reports it as a delete of the old object
  followed by an add of the new one, so consumers keyed by uid stay right.
* progress markers from the FIFO are forwarded to the :class:`~bridge.contracts.DeliveryObserver`, so
  the checkpoint knows the resourceVersion each acknowledged prefix of notifications reflects.
* :meth:`SharedIndexInformer.seed` is the one restart hook (:mod:`bridge.informer.seed`): a cache
  at a resourceVersion, how the informer starts from it, and the caller's processing around
  HandleDeltas (client-go's ``Config.Process``); what a restart means for a change is the caller's
  business (the bridge's restart stage, ``bridge.delivery.restart``), never decided here.
* a relist after changes were processed is framed by gap markers (:mod:`bridge.informer.gaps`);
  :meth:`SharedIndexInformer.request_snapshot` hands listeners the whole cache as one ``SNAPSHOT``
  notification, in change order (:mod:`bridge.informer.snapshots`).
* ``compact_cache``: the cache keeps each object as its JSON bytes and decodes on read
  (:class:`~bridge.store.IndexedCache`).

Consistency: the pop loop applies each run of FIFO items under the informer's processing lock, and
snapshot emission takes the same lock, so a snapshot always sits between two processed items. Handlers added
after start are registered synchronously: the replayed cache and the notifications that follow can
neither overlap nor leave a gap.

Timeouts of :meth:`~SharedIndexInformer.shutdown` and :meth:`~SharedIndexInformer.wait_for_cache_sync`
are operational deadlines on the event loop's time, not on the injected clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from bridge.clock import Clock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    DeliveryObserver,
    EventHandler,
    IndexFunc,
    KeyFunc,
    KubeObject,
    ListenerOptions,
    ListerWatcher,
    Notification,
    NotificationHandler,
    NotificationKind,
    TransformFunc,
)
from bridge.informer.delta_fifo import Delta, DeltaType, FIFOClosedError, ResourceVersionMarker
from bridge.informer.gaps import RelistGaps
from bridge.informer.listers import Lister
from bridge.informer.pager import list_all
from bridge.informer.processor import (
    CATCH_UP_BYTES,
    TIME_SLICE,
    ProcessorListener,
    SharedProcessor,
    clamp_resync_period,
    determine_resync_period,
)
from bridge.informer.real_fifo import RealFIFO
from bridge.informer.reflector import DEFAULT_PAGE_SIZE, Reflector, WatchErrorHandler
from bridge.informer.registration import HandlerRegistration, InformerError, InformerStartedError
from bridge.informer.seed import CacheSeed, Distribute, SeedProcess, SeedStart
from bridge.informer.snapshots import SnapshotRequests
from bridge.informer.store import (
    NAMESPACE_INDEX,
    IndexedCache,
    meta_namespace_index_func,
    meta_namespace_key_func,
)
from bridge.informer.transform import drop_managed_fields
from bridge.rawobject import RawObject, object_identity

__all__ = ["CacheSeed", "HandlerRegistration", "InformerError", "InformerStartedError", "SeedProcess",
           "SeedStart", "SharedIndexInformer"]

_RESYNC_DELTAS = frozenset({DeltaType.SYNC, DeltaType.REPLACED})
"""Delta types that are resync notifications when they leave the object's resourceVersion unchanged."""

log = logging.getLogger(__name__)

class SharedIndexInformer:
    """A shared informer over one resource in one scope (see the module docstring)."""

    def __init__(
        self,
        *,
        lister_watcher: ListerWatcher,
        clock: Clock,
        resync_check_period: float = 0.0,
        indexers: dict[str, IndexFunc] | None = None,
        key_func: KeyFunc = meta_namespace_key_func,
        transform: TransformFunc | None = drop_managed_fields,
        observer: DeliveryObserver | None = None,
        name: str = "",
        page_size: int | None = None,
        use_watch_list: bool = False,
        split_uid_changes: bool = True,
        compact_cache: bool = False,
        watch_error_handler: WatchErrorHandler | None = None,
    ) -> None:
        if resync_check_period < 0:
            raise ValueError(
                f"informer {name!r}: resync_check_period must be >= 0, got {resync_check_period}"
            )
        self.name = name
        self._lister_watcher = lister_watcher
        self._clock = clock
        self._resync_check_period = resync_check_period
        self._key_func = key_func
        self._default_key = key_func is meta_namespace_key_func
        self._indexer = IndexedCache(
            key_func=key_func, indexers={NAMESPACE_INDEX: meta_namespace_index_func, **(indexers or {})},
            compact=compact_cache,
        )
        self._transform = transform
        self._watch_error_handler = watch_error_handler
        self._page_size = page_size
        self._use_watch_list = use_watch_list
        self._split_uid_changes = split_uid_changes
        self._processor = SharedProcessor(clock=clock, observer=observer, name=name)

        self._fifo: RealFIFO | None = None
        self._reflector: Reflector | None = None
        self._started = False
        self._stopping = False
        self._done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pop_task: asyncio.Task[None] | None = None
        self._reflector_task: asyncio.Task[None] | None = None
        self._process: SeedProcess | None = None
        """The seed's processing around HandleDeltas, until it has nothing more to decide."""
        self._lock = asyncio.Lock()
        self._processing_initial = False
        self._processed = asyncio.Event()
        self._resume_rv = ""
        self._list_exact = ""
        """A :attr:`SeedStart.LIST_EXACT` seed's resourceVersion until that list ended (or expired)."""
        self._last_progress_rv = ""
        self._gaps = RelistGaps(name=name, distribute=self._processor.distribute)
        self._snapshots = SnapshotRequests(processor=self._processor, cache=self._indexer, lock=self._lock,
                                           progress=lambda: self._last_progress_rv, name=name)
        self.process_errors = 0
        """FIFO items whose processing raised (a malformed object); logged and skipped."""

    # ---------------------------------------------------------------------------------------------
    # configuration (before start)

    def set_transform(self, transform: TransformFunc | None) -> None:
        if self._started:
            raise InformerStartedError(f"informer {self.name!r}: set_transform after start")
        self._transform = transform

    def set_watch_error_handler(self, handler: WatchErrorHandler) -> None:
        if self._started:
            raise InformerStartedError(f"informer {self.name!r}: set_watch_error_handler after start")
        self._watch_error_handler = handler

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Adds named indices, backfilled from the current cache (allowed at any time)."""
        self._indexer.add_indexers(indexers)

    def seed(self, seed: CacheSeed) -> None:
        """Starts the informer from ``seed`` instead of an empty cache (a restart: see
        :class:`~bridge.informer.seed.CacheSeed`). Call once, before :meth:`run`.

        Handlers registered before start are not told about the seeded objects (they were delivered
        before the restart); a later relist reports only what changed meanwhile."""
        if self._started:
            raise InformerStartedError(f"informer {self.name!r}: seed after start")
        how = seed.how
        if how is not SeedStart.LIST and not seed.resource_version:
            raise ValueError(f"informer {self.name!r}: a {how.value} seed needs a resourceVersion")
        for obj in seed.objects:
            self._indexer.add(obj)
        if how is SeedStart.WATCH:
            self._resume_rv = seed.resource_version
            self._last_progress_rv = seed.resource_version
        elif how is SeedStart.LIST:
            self._last_progress_rv = seed.resource_version
        else:
            self._list_exact = seed.resource_version
        self._process = seed.process

    def _exact_list_expired(self, resource_version: str) -> None:
        """The reflector's list at exactly the seed's resourceVersion met an expired one: the
        consistent list that replaces it is framed as a gap from it (nothing of it is queued yet)."""
        if not self._list_exact:
            return
        self._list_exact = ""
        self._last_progress_rv = resource_version
        if self._process is not None:
            self._process.first_list(False)

    async def list_current(self) -> tuple[list[KubeObject], str]:
        """Lists the informer's scope from the API server now (consistent read, in pages of the
        informer's page size), each object passed through the informer's transform; touches neither
        the cache nor the listeners. Returns the objects and the list's resourceVersion
        (:func:`~bridge.informer.pager.list_all`).

        For a caller that needs whole objects where a resumed cache holds a checkpoint's
        metadata-only stubs (the bridge bootstrapping a sink with a snapshot)."""
        page_size = DEFAULT_PAGE_SIZE if self._page_size is None else self._page_size
        return await list_all(self._lister_watcher, page_size=page_size, transform=self._transform)

    async def fill_in(self, objects: Iterable[KubeObject]) -> str:
        """Puts each of ``objects`` in the cache where the cache holds that very state (the same uid
        at the same resourceVersion): whole objects, typically from :meth:`list_current`, in place
        of a resumed cache's metadata-only stubs. Notifies no handler and changes no other entry;
        taken between two processed FIFO items. Returns the resourceVersion the informer had
        processed up to then (its last progress), so that the caller knows which changes the cache
        already reflects."""
        async with self._lock:
            indexer = self._indexer
            for obj in objects:
                key = self._key_func(obj)
                cached = indexer.get_by_key(key)
                if cached is not None and object_identity(cached) == object_identity(obj):
                    indexer.update(obj)
            return self._last_progress_rv

    # ---------------------------------------------------------------------------------------------
    # handlers

    def add_event_handler(
        self,
        handler: EventHandler | NotificationHandler,
        options: ListenerOptions = ListenerOptions(),  # noqa: B008 - frozen, shared safely
    ) -> HandlerRegistration:
        """Registers a handler with its own bounded listener.

        After start the handler first receives every cached object as an add with
        ``is_in_initial_list=True``; its registration's ``has_synced`` turns true once those (and
        the informer's own initial list) are handled. (On an informer resumed from a checkpoint,
        objects not seen since the resume are still the checkpoint's metadata-only stubs; register
        handlers before start there.)

        Raises :class:`InformerError` once the informer is shutting down.
        """
        if self._stopping:
            raise InformerError(f"informer {self.name!r} is shutting down; cannot add a handler")
        name = self._processor.unique_name(options.name or type(handler).__name__)
        period, check = clamp_resync_period(options.resync_period, self._resync_check_period,
                                            started=self._started, listener=name, informer=self.name)
        if check != self._resync_check_period:
            self._resync_check_period = check
            self._processor.resync_check_period_changed(check)
        options = dataclasses.replace(options, name=name, resync_period=period)
        replay = self._indexer.list() if self._started else []
        listener = ProcessorListener(
            handler=handler,
            options=options,
            clock=self._clock,
            name=name,
            resync_period=determine_resync_period(period, self._resync_check_period),
            observer=self._processor.observer,
            upstream_synced=self.has_synced,
            may_catch_up=self._may_catch_up,
            replay=replay,
            request_snapshot=lambda lost: self.request_snapshot(HandlerRegistration(listener=lost)),
        )
        self._processor.add_listener(listener)
        return HandlerRegistration(listener=listener)

    def remove_event_handler(self, registration: HandlerRegistration) -> None:
        """Removes the handler; what it had pending is discarded. Idempotent."""
        self._processor.remove_listener(registration.listener)

    # ---------------------------------------------------------------------------------------------
    # state

    @property
    def started(self) -> bool:
        return self._started

    @property
    def key_func(self) -> KeyFunc:
        return self._key_func

    @property
    def resync_check_period(self) -> float:
        return self._resync_check_period

    @property
    def processor(self) -> SharedProcessor:
        return self._processor

    @property
    def reflector(self) -> Reflector | None:
        return self._reflector

    def get_indexer(self) -> IndexedCache:
        return self._indexer

    def get_store(self) -> IndexedCache:
        return self._indexer

    def lister(self) -> Lister:
        return Lister(indexer=self._indexer)

    def has_synced(self) -> bool:
        """True once the first list (or the checkpoint) has been fully applied to the cache and
        handed to the listeners."""
        fifo = self._fifo
        return fifo is not None and fifo.has_synced() and not self._processing_initial

    def last_sync_resource_version(self) -> str:
        if self._reflector is not None:
            return self._reflector.last_sync_resource_version
        return self._resume_rv

    async def wait_for_cache_sync(self, timeout: float) -> bool:
        """True once :meth:`has_synced`; False if ``timeout`` seconds (loop time) pass first or the
        informer shuts down before it synced."""
        try:
            async with asyncio.timeout(timeout):
                while not self.has_synced():
                    if self._stopping:
                        return False
                    # Every run of FIFO items (a relist always queues a progress marker) sets it,
                    # and so does shutdown.
                    self._processed.clear()
                    await self._processed.wait()
        except TimeoutError:
            return False
        return True

    # ---------------------------------------------------------------------------------------------
    # snapshots

    def request_snapshot(self, registration: HandlerRegistration | None = None) -> None:
        """Queues a ``SNAPSHOT`` notification (the whole cache and the last progress RV) for the
        registration's listener, or for every listener when None; emitted between two processed
        FIFO items once the informer runs. Requests are coalesced: a listener gets one snapshot for
        every request waiting together, and none for a request arriving while one it has not yet
        handled is pending (that one is as recent: 20 requests make one or two snapshots)."""
        self._snapshots.request(registration.listener if registration is not None else None)

    # ---------------------------------------------------------------------------------------------
    # HandleDeltas

    async def _process_locked(self, item: Delta | ResourceVersionMarker, is_in_initial_list: bool) -> None:
        """Applies one queue entry; the pop loop holds the processing lock around a run of them."""
        if type(item) is ResourceVersionMarker:
            if item.relist_end and self._list_exact:
                self._list_exact = ""
                if self._process is not None:
                    self._process.first_list(True)
            if item.relist_end and self._last_progress_rv:
                await self._gaps.close(self._last_progress_rv, item.resource_version)
            self._last_progress_rv = item.resource_version
            self._processor.progress(item.resource_version)
            return
        assert type(item) is Delta
        if self._gaps.current is None and self._last_progress_rv and (
                item.type is DeltaType.REPLACED or type(item.object) is DeletedFinalStateUnknown):
            # a relist's delta (a listed item, or a deletion it inferred): its gap opens
            await self._gaps.open(self._last_progress_rv)
        self._processing_initial = is_in_initial_list
        try:
            process = self._process
            if process is None:
                await self._apply_delta(item, is_in_initial_list, self._processor.distribute)
            elif not await process.process(item, is_in_initial_list, self._apply_delta,
                                           self._processor.distribute):
                self._process = None
        finally:
            self._processing_initial = False

    async def _apply_delta(self, delta: Delta, is_in_initial_list: bool, distribute: Distribute) -> None:
        """HandleDeltas for one delta (client-go's ``processDeltas``): the cache first, then each
        notification handed to ``distribute``."""
        obj = delta.object
        if delta.type is DeltaType.DELETED:
            self._indexer.delete(obj)
            await distribute(Notification(kind=NotificationKind.DELETE, obj=obj, key=self._key_func(obj)),
                             False)
            return
        assert not isinstance(obj, DeletedFinalStateUnknown)
        raw = type(obj) is RawObject
        # A named RawObject's key was derived once, at the decode (what the default key function
        # returns for it); anything else goes through the key function, which refuses no name.
        key = (obj.key if raw and self._default_key and obj.name  # type: ignore[attr-defined]
               else self._key_func(obj))
        old = self._indexer.swap(key, obj)
        if old is None:
            await distribute(
                Notification(kind=NotificationKind.ADD, obj=obj, is_in_initial_list=is_in_initial_list,
                             key=key),
                False,
            )
            return
        if raw and type(old) is RawObject:
            old_uid, old_rv = old.uid, old.resource_version
            new_uid, new_rv = obj.uid, obj.resource_version  # type: ignore[attr-defined]
        else:
            old_uid, old_rv = object_identity(old)
            new_uid, new_rv = object_identity(obj)
        if self._split_uid_changes and old_uid and new_uid and old_uid != new_uid:
            await distribute(Notification(kind=NotificationKind.DELETE, obj=old, key=key), False)
            await distribute(
                Notification(kind=NotificationKind.ADD, obj=obj, is_in_initial_list=is_in_initial_list,
                             key=key),
                False,
            )
            return
        # Only a Sync (the resync timer) or Replaced (a relist) delta that leaves the object as it
        # was is a resync, for the listeners due for one. An Added or Updated delta is a change the
        # server sent: every listener gets it, even at an unchanged resourceVersion (a server
        # repeating itself, an object first known from a checkpoint), so nothing is dropped.
        is_resync = delta.type in _RESYNC_DELTAS and old_rv == new_rv
        await distribute(
            Notification(kind=NotificationKind.UPDATE, obj=obj, old=old, is_resync=is_resync, key=key),
            is_resync,
        )

    def _may_catch_up(self, listener: ProcessorListener) -> bool:
        """Whether a listener with a full buffer may hold this informer for another loop turn
        (:meth:`ProcessorListener.add`): only while each other listener has work of its own and
        less than ``CATCH_UP_BYTES`` of changes wait in the queue."""
        fifo = self._fifo
        if fifo is not None and fifo.queued_bytes >= CATCH_UP_BYTES:
            return False
        return self._processor.others_have_work(listener)

    async def _pop_loop(self) -> None:
        fifo = self._fifo
        assert fifo is not None
        loop = asyncio.get_running_loop()
        slice_end = loop.time() + TIME_SLICE
        # Asked after each delta of a run: a C callable reading the flag, no Python frame per delta.
        stopping: Callable[[], bool] = functools.partial(getattr, self, "_stopping")
        while not self._stopping:
            if loop.time() >= slice_end:
                await asyncio.sleep(0)  # a backlog is processed in slices (see TIME_SLICE)
                slice_end = loop.time() + TIME_SLICE
            try:
                await fifo.wait_ready()
                # Everything ready now in one call, up to the end of the slice, under the processing
                # lock (a snapshot or a fill-in sits between two runs, so between two items).
                async with self._lock:
                    self._processor.hold()  # the fast path: idle listeners get the run at its end
                    try:
                        await fifo.pop_ready(self._process_locked, until=slice_end, stop=stopping)
                    finally:
                        self._processor.release()
            except FIFOClosedError:
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.process_errors += 1
                log.exception("processing a queued item failed; skipping it", extra={"informer": self.name})
            finally:
                self._processed.set()

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"informer:{self.name}:{what}")
        self._tasks.append(task)
        return task

    async def run(self) -> None:
        """Runs the informer until :meth:`shutdown` (then returns) or cancellation.

        Raises :class:`InformerError` if one of its tasks ends unexpectedly.
        """
        if self._started:
            raise InformerStartedError(f"informer {self.name!r}: run() called twice")
        self._started = True
        if self._stopping:
            self._done.set()
            return
        fifo = RealFIFO(key_func=self._key_func, known_objects=self._indexer, transform=self._transform)
        if self._resume_rv:
            fifo.mark_populated()
        self._fifo = fifo
        self._processed.set()  # a resumed informer is synced already
        self._reflector = Reflector(
            name=self.name or "informer",
            lister_watcher=self._lister_watcher,
            store=fifo,
            clock=self._clock,
            resync_period=self._resync_check_period,
            should_resync=self._processor.should_resync,
            page_size=self._page_size,
            use_watch_list=self._use_watch_list,
            initial_resource_version=self._resume_rv,
            exact_list=self._list_exact,
            on_exact_list_expired=self._exact_list_expired,
            watch_error_handler=self._watch_error_handler,
        )
        self._spawn(self._processor.run(), "processor")
        self._pop_task = self._spawn(self._pop_loop(), "pop")
        self._spawn(self._snapshots.run(), "snapshots")
        self._reflector_task = self._spawn(self._reflector.run(), "reflector")
        try:
            await self._supervise()
        finally:
            if not self._done.is_set():
                # Cancelled, or a task failed: stop everything now.
                self._stopping = True
                await self._cancel_tasks()
                self._done.set()

    async def _supervise(self) -> None:
        waiter = asyncio.create_task(self._done.wait(), name=f"informer:{self.name}:wait")
        pending: set[asyncio.Task[Any]] = {*self._tasks, waiter}
        try:
            while not self._done.is_set():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is waiter or self._stopping:
                        continue
                    if (task is self._reflector_task and self._reflector is not None
                            and self._reflector.stopped and not task.cancelled()
                            and task.exception() is None):
                        # The watch was stopped on purpose (intake stopped before a drain): the
                        # rest of the informer keeps delivering what is queued.
                        continue
                    exc = None if task.cancelled() else task.exception()
                    log.error("task %s ended unexpectedly: %r", task.get_name(), exc,
                              extra={"informer": self.name})
                    raise InformerError(
                        f"informer {self.name!r}: task {task.get_name()} ended unexpectedly"
                    ) from exc
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the watch and the queue, lets the listeners drain for up to ``timeout`` seconds
        (loop time), then cancels what is left and waits for every task. Idempotent."""
        if self._stopping:
            await self._done.wait()
            return
        self._stopping = True
        self._processed.set()  # wakes wait_for_cache_sync
        if not self._started:
            self._done.set()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        if self._reflector is not None:
            self._reflector.stop()
        if self._fifo is not None:
            self._fifo.close()
        pop = self._pop_task
        if pop is not None and not pop.done():
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(pop)
            except TimeoutError:
                log.warning("the pop loop did not finish in time; cancelling", extra={"informer": self.name})
                pop.cancel()
            except Exception:
                pass  # reported by _cancel_tasks
        await self._processor.shutdown(max(0.0, deadline - loop.time()))
        await self._cancel_tasks()
        self._done.set()

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for task, result in zip(self._tasks, results, strict=True):
            if isinstance(result, Exception):
                log.error("task %s failed: %r", task.get_name(), result, extra={"informer": self.name})
        if self._processor.started:
            await self._processor.shutdown(0)

