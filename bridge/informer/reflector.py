"""The Reflector: keeps a store in step with the API server through list + watch.

A port of client-go's ``tools/cache/reflector.go`` (and the ``tools/pager`` it lists with) to asyncio.
One :class:`Reflector` serves one resource in one scope: it lists the current state into its store
with :meth:`ReflectorStore.replace`, then watches from the list's resourceVersion and turns every
watch event into ``add`` / ``update`` / ``delete``; when the watch ends, fails or the resourceVersion
expires, it re-watches or relists following client-go 1.36's rules (docs/client-go-semantics.md):

* list RV ``"0"`` before the first sync, the last synced RV afterwards, ``""`` once that RV is known
  to be unavailable (an Expired / too-large list error, which also relists at once, without backoff);
* paginated lists (later pages send only ``continue``); a continuation page that expired is retried
  once as a full unpaginated list at the original RV. A configured ``page_size`` is used by every
  list and relist, whatever its RV (client-go's ``WatchListPageSize``; 0 = never paginate). Left
  unset, lists at ``"0"`` or ``""`` use pages of 500 and a relist at a specific RV is unpaginated, so
  the API server can serve it from its watch cache (with a limit it would be an exact read from
  etcd, often 410 after compaction), unless the first list at ``"0"`` came back paginated (no watch
  cache: paging is what it wants);
* watch with ``allow_watch_bookmarks`` and a random timeout in ``[min_watch_timeout, 2·min)``, where
  ``min_watch_timeout`` is five minutes or more (client-go's ``MinWatchTimeout`` can only raise that
  floor; a smaller value is refused, naming it); each
  event (bookmarks included) advances the last synced RV and, when the store has it, calls
  ``store.update_resource_version(rv)``;
* a watch that ends cleanly after at least 1 s or one event is re-opened at once from the last RV
  (a connection broken mid-stream counts as a clean end, as in client-go's stream watcher); one
  that ends in under 1 s with no event, or an ``ERROR`` event, ends the cycle: backoff, relist at
  the last RV; connection refused or 429 when opening a watch, or a 429 ``ERROR`` event → backoff
  (at least the server's Retry-After), then the same watch again;
* the watch-error handler sees only cycles that failed (list error, watch that could not be
  opened, store error); ``ERROR`` events and closes are routine and only logged, as in client-go;
* a resync timer calling ``store.resync()`` every ``resync_period`` when ``should_resync()`` agrees;
  a resync that raises is logged and ends the cycle without error (backoff, relist), as in client-go;
* WatchList (``use_watch_list``): the initial state streamed as ADDED events up to the
  ``k8s.io/initial-events-end`` bookmark, then the same stream continues as a normal watch (a stream
  is iterated once: the watch loop takes over the WatchList's iterator); an expired or too-large
  resourceVersion, on opening or as an ERROR event, retries the WatchList from ``""`` (as client-go's
  ``watchList``): at once, or after the backoff when it was from ``""`` already (client-go asks again
  at once); a server that rejects it makes the reflector fall back to list + watch, and remember;
* a watch that ends at a line it could not decode (an ERROR event caused by ``ClientWatchDecoding``)
  is watched again from the last RV applied, after backoff and without a relist, so the change on
  that line comes again; a well-formed event whose object has no ``metadata.name`` is the only thing
  skipped (logged with its RV, which still counts).

Bridge extension: ``initial_resource_version`` (a checkpoint) makes the first cycle skip the list and
watch from that RV directly; if it has expired (410), the reflector relists at once with RV ``""``.

Bridge extension: a store that offers :class:`StreamedReplaceStore` (the RealFIFO) receives a list
page by page as it arrives rather than in one ``replace`` at the end, with the same outcome, so that
consumers of a first list get the first pages while the next ones are fetched. Where client-go
discards the pages of a list that fails, those already streamed may have reached consumers; the next
list then asks for a state not older than theirs (their RV, or a consistent read), never for RV
``"0"``, which another API server's older watch cache could answer with older objects.

Every wait and every time measurement goes through the injected :class:`~bridge.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from bridge.clock import Clock
from bridge.contracts import (
    BatchedWatchStream,
    KubeObject,
    ListerWatcher,
    ListOptions,
    WatchEvent,
    WatchEventType,
    WatchOptions,
    WatchStream,
)
from bridge.errors import (
    ApiError,
    ApiStatusError,
    ApiUnavailableError,
    ResourceExpiredError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
)
from bridge.informer.backoff import Backoff
from bridge.rawobject import RawObject, object_identity, object_key

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "INITIAL_EVENTS_END_ANNOTATION",
    "MIN_WATCH_TIMEOUT",
    "Reflector",
    "ReflectorStore",
    "ResourceVersionUpdater",
    "StreamedReplaceStore",
    "WatchErrorHandler",
    "default_watch_error_handler",
]

log = logging.getLogger(__name__)

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
"""Annotation (value ``"true"``) on the bookmark that ends a WatchList's initial state."""

_DECODE_ERROR_CAUSE = "ClientWatchDecoding"
"""Cause type of the ERROR event a watch stream ends with at a line it cannot decode (client-go's)."""

DEFAULT_PAGE_SIZE = 500
"""Items per page of a list at ``"0"`` or ``""`` when no page size is configured (client-go's pager)."""

MIN_WATCH_TIMEOUT = 300
"""Seconds: the least ``min_watch_timeout`` (client-go's ``defaultMinWatchTimeout``); watches last
a random time in ``[min, 2·min)``."""

_TOO_LARGE_CAUSE = "ResourceVersionTooLarge"
"""Cause reason of the 504 a server answers a resourceVersion newer than it knows with."""

_SHORT_WATCH = 1.0
"""A watch closing sooner than this with no event is treated as a failure (client-go's rule)."""


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


class _PageSink:
    """Where a list's pages go: streamed into a :class:`StreamedReplaceStore` as they arrive, or
    collected for one ``replace``."""

    __slots__ = ("_items", "_open", "_store", "count", "streamed_rv")

    def __init__(self, store: StreamedReplaceStore | None) -> None:
        self._store = store
        self._items: list[KubeObject] = []
        self._open = False
        self.count = 0
        self.streamed_rv = ""
        """The resourceVersion of the pages streamed into the store so far ("" for none)."""

    async def restart(self) -> None:
        """A (re)start of the list: what earlier attempts listed no longer counts as listed."""
        self._items = []
        self.count = 0
        if self._store is not None:
            await _call(self._store.replace_begin())
            self._open = True

    async def add(self, items: list[KubeObject], resource_version: str) -> None:
        self.count += len(items)
        if self._store is not None:
            if items:
                self.streamed_rv = resource_version
            await _call(self._store.replace_page(items))
        else:
            self._items.extend(items)

    async def abort(self) -> None:
        if self._store is not None and self._open:
            self._open = False
            await _call(self._store.replace_abort())

    async def complete(self, store: ReflectorStore, resource_version: str) -> None:
        if self._store is not None:
            self._open = False
            await _call(self._store.replace_end(resource_version))
        else:
            await _call(store.replace(self._items, resource_version))


@runtime_checkable
class ResourceVersionUpdater(Protocol):
    """Optional store capability: told the resourceVersion after every watch event and bookmark."""

    def update_resource_version(self, resource_version: str) -> object: ...


WatchErrorHandler = Callable[["Reflector", BaseException], None]
"""Called when a ListAndWatch cycle ends with an error (list failed, watch could not be opened)."""


def default_watch_error_handler(reflector: Reflector, err: BaseException) -> None:
    """Logs the error: expiry at info level (routine), anything else as a warning."""
    if isinstance(err, ResourceExpiredError):
        log.info("watch closed: %s", err, extra={"informer": reflector.name})
    else:
        log.warning("list/watch failed: %s: %s", type(err).__name__, err, extra={"informer": reflector.name})


class _WatchEnd(enum.Enum):
    """Why a watch stream stopped being read."""

    REWATCH = "rewatch"
    """Clean close after >= 1 s or >= 1 event: open a new watch at the last RV."""
    RELIST = "relist"
    """Very short watch, or an ERROR event: end the cycle (backoff, relist)."""
    EXPIRED = "expired"
    """ERROR event with a 410 Status (or too-large RV): end the cycle (backoff, relist)."""
    BACKOFF_REWATCH = "backoff_rewatch"
    """ERROR event with a 429 Status, or the stream could not decode a line: back off, then watch
    again at the same RV."""


@dataclass(slots=True)
class _OpenWatch:
    """An open watch and the one iterator over its events, a batch at a time. A watch stream is
    iterated exactly once (a second ``__aiter__`` or ``batches()`` raises): whoever continues
    reading it (the watch loop after a WatchList's initial state) must take over this iterator,
    never start a new one, and apply ``pending`` first (the rest of the batch that held the
    initial-events-end bookmark)."""

    stream: WatchStream
    batches: AsyncIterator[list[WatchEvent]]
    pending: list[WatchEvent] = field(default_factory=list)

    @classmethod
    def of(cls, stream: WatchStream) -> _OpenWatch:
        if isinstance(stream, BatchedWatchStream):
            return cls(stream, stream.batches())
        return cls(stream, _one_at_a_time(stream.__aiter__()))


async def _one_at_a_time(events: AsyncIterator[WatchEvent]) -> AsyncIterator[list[WatchEvent]]:
    """A stream without batches, as batches of one event."""
    async for event in events:
        yield [event]


class _WatchListRejected(Exception):
    """Internal: the WatchList request did not deliver its initial state."""

    def __init__(self, reason: str, *, remember: bool, expired: bool = False) -> None:
        super().__init__(reason)
        self.remember = remember
        self.expired = expired


async def _call(result: object) -> None:
    # Sync stores return None: skip the (comparatively slow) awaitable check on the hot path.
    if result is not None and inspect.isawaitable(result):
        await result


class Reflector:
    """Lists and watches one resource into a store (client-go's ``Reflector``).

    :meth:`run` is the ListAndWatch loop; :meth:`stop` (or cancelling the task running it) ends it.
    """

    def __init__(
        self,
        *,
        name: str,
        lister_watcher: ListerWatcher,
        store: ReflectorStore,
        clock: Clock,
        resync_period: float = 0.0,
        should_resync: Callable[[], bool] | None = None,
        page_size: int | None = None,
        use_watch_list: bool = False,
        initial_resource_version: str = "",
        exact_list: str = "",
        on_exact_list_expired: Callable[[str], None] | None = None,
        watch_error_handler: WatchErrorHandler | None = None,
        rng: random.Random | None = None,
        min_watch_timeout: int = MIN_WATCH_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> None:
        if resync_period < 0:
            raise ValueError(f"reflector {name}: resync_period must be >= 0, got {resync_period}")
        if page_size is not None and page_size < 0:
            raise ValueError(f"reflector {name}: page_size must be >= 0 (0 = unpaginated), got {page_size}")
        if min_watch_timeout < MIN_WATCH_TIMEOUT:
            raise ValueError(
                f"reflector {name}: min_watch_timeout {min_watch_timeout} s is below the floor of "
                f"{MIN_WATCH_TIMEOUT} s (it can only raise client-go's five-minute minimum)")
        self.name = name
        self._lw = lister_watcher
        self._store = store
        self._updater = store if isinstance(store, ResourceVersionUpdater) else None
        """The store's optional capability, checked once."""
        self._clock = clock
        self._resync_period = resync_period
        self._should_resync = should_resync
        self._page_size = page_size
        self._paginated_result = False
        """The first list at RV "0" was paginated: keep paging relists (client-go's paginatedResult)."""
        self._use_watch_list = use_watch_list
        self._watch_error_handler: WatchErrorHandler = watch_error_handler or default_watch_error_handler
        self._rng = rng if rng is not None else random.Random()
        self._min_watch_timeout = min_watch_timeout
        self._backoff = backoff if backoff is not None else Backoff(clock=clock, rng=self._rng)

        self._last_sync_rv = initial_resource_version
        self._rv_unavailable = False
        self._streamed_rv = ""
        """The resourceVersion of pages an unfinished list already streamed into the store: the next
        list must not be older (its items reached consumers), see ``_list``."""
        self._resume_rv = initial_resource_version
        """Non-empty until the first cycle has started from the checkpoint."""
        self._exact_rv = "" if initial_resource_version else exact_list
        """Non-empty until the first list, at exactly this resourceVersion
        (``resourceVersionMatch=Exact``), succeeded or met an expired resourceVersion; the watch
        then starts from it. ``on_exact_list_expired(rv)`` is called before the consistent list
        that replaces an expired one."""
        self._on_exact_expired = on_exact_list_expired
        self._watch_list_rejected = False
        self._stop_requested = False
        self._task: asyncio.Task[None] | None = None
        self._current_stream: WatchStream | None = None
        self._resync_error: BaseException | None = None
        self._last_retry_after: float | None = None
        """retryAfterSeconds of the last 429 ERROR event."""
        self.list_count = 0
        self.watch_count = 0
        """Watches opened (the first one and every re-watch)."""
        self.expired_count = 0
        """410 Gone / Expired (and too-large resourceVersion) answers, on lists and watches."""
        """Completed lists (or WatchList initial states) so far; for metrics and tests."""

    # -- public state -------------------------------------------------------------------------------

    @property
    def lister_watcher(self) -> ListerWatcher:
        return self._lw

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion the store reflects: the last list's, or the last watch event's."""
        return self._last_sync_rv

    @property
    def is_last_sync_rv_unavailable(self) -> bool:
        """True after a list failed with Expired / too-large RV, until a list succeeds."""
        return self._rv_unavailable

    @property
    def watch_list_rejected(self) -> bool:
        """True once the server rejected a WatchList: later cycles use list + watch."""
        return self._watch_list_rejected

    @property
    def backoff(self) -> Backoff:
        return self._backoff

    # -- lifecycle ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs ListAndWatch cycles, with one backoff delay after each, until :meth:`stop`.

        Returns normally after :meth:`stop`; cancelling the caller cancels the loop and re-raises.
        """
        if self._task is not None:
            raise RuntimeError(f"reflector {self.name}: run() called twice")
        if self._stop_requested:
            return
        task = asyncio.create_task(self._loop(), name=f"reflector-{self.name}")
        self._task = task
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._stop_requested and task.cancelled() and (current is None or current.cancelling() == 0):
                log.info("stopped", extra={"informer": self.name})
                return
            raise

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called: a ``run()`` that returns afterwards ended on purpose."""
        return self._stop_requested

    def stop(self) -> None:
        """Makes :meth:`run` return promptly (closing the open watch). Idempotent."""
        self._stop_requested = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _loop(self) -> None:
        log.info("starting", extra={"informer": self.name})
        while True:
            retry_after: float | None = None
            try:
                await self.list_and_watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, ApiStatusError):
                    retry_after = exc.retry_after
                try:
                    self._watch_error_handler(self, exc)
                except Exception:
                    log.exception("watch error handler raised", extra={"informer": self.name})
            await self._backoff.wait(retry_after)

    # -- one cycle ----------------------------------------------------------------------------------

    async def list_and_watch(self) -> None:
        """One cycle: list (or WatchList, or resume from the checkpoint), then watch until the watch
        ends in a way that requires a relist. Raises when the cycle failed."""
        stream: _OpenWatch | None = None
        resuming = bool(self._resume_rv)
        if resuming:
            log.info("resuming watch from resourceVersion %s", self._resume_rv, extra={"informer": self.name})
            self._resume_rv = ""
        elif self._exact_rv:
            log.info("listing at exactly resourceVersion %s, then watching from it", self._exact_rv,
                     extra={"informer": self.name})
            await self._list(exact=self._exact_rv)
        elif self._use_watch_list and not self._watch_list_rejected:
            try:
                stream = await self._watch_list()
            except _WatchListRejected as rejected:
                log.warning(
                    "WatchList did not deliver the initial state (%s); falling back to "
                    "list + watch%s", rejected, " from now on" if rejected.remember else "",
                    extra={"informer": self.name})
                if rejected.remember:
                    self._watch_list_rejected = True
                await self._list()
        else:
            await self._list()

        end = await self._watch_with_resync(stream, resuming=resuming)
        if end is _WatchEnd.EXPIRED and resuming:
            # The checkpoint's RV is gone: a consistent relist, at once, then watch as usual.
            log.info("checkpoint resourceVersion expired; relisting", extra={"informer": self.name})
            self._rv_unavailable = True
            await self._list()
            await self._watch_with_resync(None, resuming=False)

    # -- list ---------------------------------------------------------------------------------------

    def _relist_resource_version(self) -> str:
        if self._rv_unavailable:
            return ""
        if self._last_sync_rv == "":
            return "0"
        return self._last_sync_rv

    async def _list(self, *, exact: str = "") -> None:
        """A list (a relist), or with ``exact`` the list at exactly that resourceVersion; one whose
        resourceVersion expired is replaced by a consistent list (``exact``: after telling
        ``on_exact_list_expired``)."""
        rv = exact or self._relist_resource_version()
        if self._streamed_rv and rv != "" and not exact:
            # Pages of an unfinished list at this RV were forwarded already: a list from an older
            # watch cache (another API server) would take consumers back in time.
            rv = self._streamed_rv
        # As client-go's pager, the page size is chosen once from the first RV and kept for the retry.
        limit = self._page_limit(rv)
        store = self._store
        # A store that takes a relist page by page (the RealFIFO) gets each page as it arrives, so
        # that the informer can forward the first pages while the next ones are fetched.
        pages = _PageSink(store if isinstance(store, StreamedReplaceStore) else None)
        try:
            try:
                list_rv, paginated = await self._paged_list(rv, limit, pages, exact=bool(exact))
            except (ResourceExpiredError, TooLargeResourceVersionError) as exc:
                self.expired_count += 1
                log.info("list at resourceVersion %r failed (%s); relisting with a "
                         "consistent read", rv, exc, extra={"informer": self.name})
                self._rv_unavailable = True
                if exact:
                    self._exact_rv = ""
                    if self._on_exact_expired is not None:
                        self._on_exact_expired(exact)
                list_rv, paginated = await self._paged_list(self._relist_resource_version(), limit, pages)
        except BaseException:
            if pages.streamed_rv:
                self._streamed_rv = pages.streamed_rv
            await pages.abort()
            raise
        if rv == "0" and paginated:
            self._paginated_result = True
        self._exact_rv = ""
        self._rv_unavailable = False
        self._streamed_rv = ""
        await pages.complete(store, list_rv)
        self._last_sync_rv = list_rv
        self.list_count += 1
        log.debug("listed %d items at resourceVersion %s", pages.count, list_rv,
                  extra={"informer": self.name})

    def _page_limit(self, rv: str) -> int | None:
        if self._page_size is not None:
            # Configured: every list pages at it (client-go's WatchListPageSize); 0 never pages.
            return self._page_size or None
        if self._paginated_result or rv in ("", "0"):
            return DEFAULT_PAGE_SIZE
        # A relist "not older than" RV without a limit can be served from the watch cache; with a
        # limit it would be an exact read from etcd (and a likely 410 after compaction).
        return None

    async def _paged_list(self, rv: str, limit: int | None, pages: _PageSink, *,
                          exact: bool = False) -> tuple[str, bool]:
        """client-go's ListPager: pages of ``limit``; an expired continuation page is retried once as
        a full list at the original RV; any other error discards the partial result. The items go to
        ``pages``; returns the list's RV and whether more than one page was read. ``exact``: at
        exactly ``rv`` (``resourceVersionMatch=Exact``)."""
        match = "Exact" if exact else None
        options = ListOptions(resource_version=rv, limit=limit, resource_version_match=match)
        await pages.restart()
        list_rv: str | None = None
        tokens: set[str] = set()
        while True:
            try:
                page = await self._lw.list(options)
            except ResourceExpiredError:
                if options.continue_token is None:
                    raise
                log.info("list continuation expired; retrying as one full list at "
                         "resourceVersion %r", rv, extra={"informer": self.name})
                # Not older than pages already forwarded (see _list); client-go: the original RV.
                full = await self._lw.list(ListOptions(resource_version=pages.streamed_rv or rv,
                                                       resource_version_match=match))
                await pages.restart()
                await pages.add(full.items, full.resource_version)
                return full.resource_version, True
            await pages.add(page.items, page.resource_version)
            if list_rv is None:
                list_rv = page.resource_version
            if not page.continue_token:
                return list_rv, options.continue_token is not None
            if page.continue_token in tokens:  # a server paging in a circle: the list never ends
                raise ApiStatusError(f"list {self.name}: the server answered a continue token it had "
                                     f"already answered ({len(tokens)} pages in): the list would never end",
                                     code=200)
            tokens.add(page.continue_token)
            options = ListOptions(limit=limit, continue_token=page.continue_token)

    # -- watch --------------------------------------------------------------------------------------

    def _watch_timeout(self) -> int:
        return int(self._min_watch_timeout * (self._rng.random() + 1.0))

    async def _watch_with_resync(self, stream: _OpenWatch | None, *, resuming: bool) -> _WatchEnd:
        """Watches (re-opening the watch as the rules say) with the resync timer running; returns
        when the cycle must end. ``stream``: an already open stream to continue (WatchList)."""
        self._resync_error = None
        resync_task: asyncio.Task[None] | None = None
        if self._resync_period > 0:
            resync_task = asyncio.create_task(self._resync_loop(), name=f"reflector-{self.name}-resync")
        try:
            return await self._watch(stream, resuming=resuming)
        finally:
            if resync_task is not None:
                resync_task.cancel()
                await asyncio.gather(resync_task, return_exceptions=True)

    async def _watch(self, stream: _OpenWatch | None, *, resuming: bool) -> _WatchEnd:
        # While resuming from a checkpoint, a 410 before any event means the checkpoint expired.
        events_seen = 0
        while True:
            start = self._clock.now()
            if stream is None:
                options = WatchOptions(
                    resource_version=self._last_sync_rv,
                    timeout_seconds=self._watch_timeout(),
                    allow_watch_bookmarks=True,
                )
                try:
                    opened = await self._open_watch(options, "watch")
                except (ResourceExpiredError, TooLargeResourceVersionError) as exc:
                    if resuming and events_seen == 0:
                        log.info("watch from %s failed: %s", self._last_sync_rv, exc,
                                 extra={"informer": self.name})
                        return _WatchEnd.EXPIRED
                    raise
                if opened is None:
                    continue
                stream = _OpenWatch.of(opened)
            try:
                end, count = await self._handle_watch(stream, start)
            finally:
                self._current_stream = None
                await stream.stream.close()
                stream = None
            events_seen += count
            if self._resync_error is not None:
                # client-go's watch() logs it ("watch ended with error") and ends the cycle without
                # an error: the next one relists after the backoff.
                log.warning("watch ended: the resync failed (%s); relisting", self._resync_error,
                            extra={"informer": self.name})
                return _WatchEnd.RELIST
            if end is _WatchEnd.REWATCH:
                continue
            if end is _WatchEnd.BACKOFF_REWATCH:
                await self._backoff.wait(self._last_retry_after)
                continue
            if end is _WatchEnd.EXPIRED and not (resuming and events_seen == 0):
                return _WatchEnd.RELIST
            return end

    async def _handle_watch(self, stream: _OpenWatch, start: float) -> tuple[_WatchEnd, int]:
        self._current_stream = stream.stream
        count = 0
        try:
            batch, stream.pending = stream.pending, []
            if batch:
                end, count = await self._apply_batch(batch, count)
                if end is not None:
                    return end, count
            async for batch in stream.batches:
                end, count = await self._apply_batch(batch, count)
                if end is not None:
                    return end, count
        except ApiUnavailableError as exc:
            # A connection that breaks mid-stream (reset, EOF) ends the watch like a clean close,
            # as client-go's stream watcher treats probable-EOF errors.
            log.info("watch stream broke: %s", exc, extra={"informer": self.name})
        except (ResourceExpiredError, TooLargeResourceVersionError) as exc:
            self.expired_count += 1
            log.info("watch expired: %s", exc, extra={"informer": self.name})
            return _WatchEnd.EXPIRED, count
        except ApiError as exc:
            # Undecodable stream and the like: client-go turns these into an ERROR event.
            log.warning("watch stream failed: %s; relisting", exc, extra={"informer": self.name})
            return _WatchEnd.RELIST, count
        duration = self._clock.now() - start
        if duration < _SHORT_WATCH and count == 0:
            log.warning("very short watch: watch lasted %.3f s with no items received; "
                        "relisting after backoff", duration, extra={"informer": self.name})
            return _WatchEnd.RELIST, count
        log.debug("watch closed after %.3f s, %d events", duration, count, extra={"informer": self.name})
        return _WatchEnd.REWATCH, count

    async def _open_watch(self, options: WatchOptions, what: str) -> WatchStream | None:
        """Opens a watch. Connection refused or 429: waits the backoff (at least the Retry-After) and
        returns None, so the caller retries at the same resourceVersion. Expired or too-large
        resourceVersion answers are counted and raised for the caller's policy."""
        try:
            stream = await self._lw.watch(options)
        except (ApiUnavailableError, TooManyRequestsError) as exc:
            retry_after = exc.retry_after if isinstance(exc, TooManyRequestsError) else None
            log.info("%s could not be opened (%s); retrying after backoff",
                     what, exc, extra={"informer": self.name})
            await self._backoff.wait(retry_after)
            return None
        except (ResourceExpiredError, TooLargeResourceVersionError):
            self.expired_count += 1
            raise
        self.watch_count += 1
        return stream

    def _error_event_end(self, event: WatchEvent) -> _WatchEnd:
        status = event.object
        code = status.get("code")
        reason = str(status.get("reason") or "")
        message = str(status.get("message") or "")
        if code == 410 or reason in ("Expired", "Gone"):
            self.expired_count += 1
            log.info("watch expired: %s", message, extra={"informer": self.name})
            return _WatchEnd.EXPIRED
        if "too large resource version" in message.lower() or _has_cause(status, _TOO_LARGE_CAUSE):
            self.expired_count += 1
            log.info("watch from a too-large resourceVersion: %s", message, extra={"informer": self.name})
            return _WatchEnd.EXPIRED
        if _is_decode_error(status):
            # client-go's stream watcher ends the watch at a line it cannot decode; re-watching from
            # the last event applied brings the change that line carried again (skipping the line
            # would lose it). The backoff keeps a server that keeps sending garbage from spinning us.
            self._last_retry_after = None
            log.warning("reflector %s: %s; watching again from resourceVersion %s", self.name, message,
                        self._last_sync_rv)
            return _WatchEnd.BACKOFF_REWATCH
        if code == 429:
            details = status.get("details") or {}
            retry = details.get("retryAfterSeconds") if isinstance(details, dict) else None
            self._last_retry_after = float(retry) if retry is not None else None
            log.info("watch throttled (429): %s", message, extra={"informer": self.name})
            return _WatchEnd.BACKOFF_REWATCH
        log.warning("watch ERROR event (code %s, reason %s): %s; relisting",
                    code, reason, message, extra={"informer": self.name})
        return _WatchEnd.RELIST

    async def _apply_batch(self, events: list[WatchEvent], count: int) -> tuple[_WatchEnd | None, int]:
        """Applies a batch of watch events to the store in one loop, in order, each exactly as one
        event alone would be (its change, then its resourceVersion). Stops at an ``ERROR`` event and
        returns how the watch ends; ``count`` goes up by the events applied. A store that answers
        with an awaitable is awaited there and then (backpressure), a plain one never is."""
        store = self._store
        updater = self._updater.update_resource_version if self._updater is not None else None
        for event in events:
            kind = event.type
            obj = event.object
            result: object = None
            if kind is WatchEventType.ERROR:
                return self._error_event_end(event), count
            if kind is not WatchEventType.BOOKMARK and not _has_name(obj):
                # A well-formed event whose object cannot be keyed: nothing can be done with it but
                # say so (client-go's store refuses it the same way); its resourceVersion still counts.
                log.error("reflector %s: skipping a %s event whose object has no metadata.name "
                          "(resourceVersion %r)", self.name, kind.value, _resource_version(obj))
            elif kind is WatchEventType.ADDED:
                result = store.add(obj)
            elif kind is WatchEventType.MODIFIED:
                result = store.update(obj)
            elif kind is WatchEventType.DELETED:
                result = store.delete(obj)
            elif kind is not WatchEventType.BOOKMARK:
                log.error("unable to understand watch event type %s", kind, extra={"informer": self.name})
            if result is not None and inspect.isawaitable(result):
                await result
            rv = _resource_version(obj)
            if rv:
                self._last_sync_rv = rv
                if updater is not None:
                    result = updater(rv)
                    if result is not None and inspect.isawaitable(result):
                        await result
            count += 1
        return None, count

    # -- WatchList ----------------------------------------------------------------------------------

    async def _watch_list(self) -> _OpenWatch:
        """Opens a WatchList and consumes its initial state into ``store.replace``; returns the open
        stream, positioned after the initial-events-end bookmark.

        As client-go's ``watchList``: a resourceVersion that expired (410) or is newer than the server
        knows (too large), whether the answer to opening the request or an ERROR event in its stream,
        is marked unavailable and the WatchList is retried from ``""`` (a consistent snapshot), at
        once, or after the backoff when it was from ``""`` already; that says nothing about the
        server's support of WatchList, and never makes the cycle fall back to a list."""
        while True:
            rv = "" if self._rv_unavailable else self._last_sync_rv
            options = WatchOptions(
                resource_version=rv,
                timeout_seconds=self._watch_timeout(),
                allow_watch_bookmarks=True,
                send_initial_events=True,
                resource_version_match="NotOlderThan",
            )
            try:
                stream = await self._open_watch(options, "WatchList")
            except (ResourceExpiredError, TooLargeResourceVersionError) as exc:
                await self._watch_list_rv_unavailable(rv, str(exc))
                continue
            except Exception as exc:
                raise _WatchListRejected(f"{type(exc).__name__}: {exc}", remember=True) from exc
            if stream is None:
                continue
            opened = _OpenWatch.of(stream)
            ok = False
            try:
                await self._consume_initial_events(opened)
                ok = True
                return opened
            except _WatchListRejected as rejected:
                if not rejected.expired:
                    raise
                await self._watch_list_rv_unavailable(rv, str(rejected))
            finally:
                if not ok:
                    await stream.close()

    async def _watch_list_rv_unavailable(self, rv: str, reason: str) -> None:
        """A WatchList at ``rv`` met an expired / too-large resourceVersion: it is retried from
        ``""``; if it was from ``""`` already (a server whose watch cache is not yet as fresh as
        etcd answers 504), after the backoff, so a server that keeps answering so is not asked in a
        tight loop (client-go's watchList asks again at once)."""
        if rv == "":
            log.info("reflector %s: WatchList from a consistent snapshot: %s; retrying after backoff",
                     self.name, reason)
            await self._backoff.wait(None)
            return
        log.info("reflector %s: WatchList from resourceVersion %s: %s; retrying from a consistent "
                 "snapshot", self.name, rv, reason)
        self._rv_unavailable = True

    async def _consume_initial_events(self, opened: _OpenWatch) -> None:
        try:
            await self._consume_initial_events_from(opened)
        except ApiUnavailableError as exc:
            raise _WatchListRejected(f"stream broke before the initial-events-end bookmark: {exc}",
                                     remember=False) from exc
        except ApiError as exc:
            expired = isinstance(exc, ResourceExpiredError | TooLargeResourceVersionError)
            raise _WatchListRejected(f"stream failed before the initial-events-end bookmark: {exc}",
                                     remember=True, expired=expired) from exc

    async def _consume_initial_events_from(self, opened: _OpenWatch) -> None:
        temp: dict[str, KubeObject] = {}
        # Returning from inside this loop leaves the stream open: the watch loop takes it over,
        # starting with the rest of the batch the initial-events-end bookmark came in.
        async for batch in opened.batches:
            for i, event in enumerate(batch):
                obj = event.object
                if event.type is WatchEventType.ERROR:
                    end = self._error_event_end(event)
                    # Only an error the server answers a WatchList with means it will not serve them;
                    # a 429, an expired RV or a line the client could not decode says nothing about it.
                    raise _WatchListRejected(
                        f"ERROR event before the initial-events-end bookmark: {obj.get('message', '')}",
                        remember=end is _WatchEnd.RELIST, expired=end is _WatchEnd.EXPIRED)
                if event.type is WatchEventType.BOOKMARK:
                    annotations = (obj.get("metadata") or {}).get("annotations") or {}
                    if annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true":
                        rv = _resource_version(obj)
                        await _call(self._store.replace(list(temp.values()), rv))
                        self._last_sync_rv = rv
                        self._rv_unavailable = False
                        self.list_count += 1
                        log.debug("WatchList delivered %d items at resourceVersion %s",
                                  len(temp), rv, extra={"informer": self.name})
                        opened.pending = batch[i + 1:]
                        return
                    continue
                key = _key(obj)
                if not _has_name(obj):
                    log.error("reflector %s: skipping a %s event whose object has no metadata.name "
                              "(resourceVersion %r)", self.name, event.type.value, _resource_version(obj))
                elif event.type is WatchEventType.DELETED:
                    temp.pop(key, None)
                else:
                    temp[key] = obj
        raise _WatchListRejected("stream closed before the initial-events-end bookmark", remember=False)

    # -- resync -------------------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            await self._clock.sleep(self._resync_period)
            if self._should_resync is None or self._should_resync():
                log.debug("forcing resync", extra={"informer": self.name})
                try:
                    await _call(self._store.resync())
                except Exception as exc:
                    log.error("resync failed: %s", exc, extra={"informer": self.name})
                    self._resync_error = exc
                    stream = self._current_stream
                    if stream is not None:
                        await stream.close()
                    return


def _is_decode_error(status: KubeObject) -> bool:
    """The Status of a watch that ended at a line it could not decode (cause ``ClientWatchDecoding``)."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("type") == _DECODE_ERROR_CAUSE for c in causes)


def _has_cause(status: KubeObject, reason: str) -> bool:
    """Whether the Status lists a cause with this reason (client-go's ``HasStatusCause``)."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return isinstance(causes, list) and any(isinstance(c, dict) and c.get("reason") == reason for c in causes)


def _has_name(obj: KubeObject) -> bool:
    """Whether the object has a ``metadata.name`` (its key needs one)."""
    if type(obj) is RawObject:
        return bool(obj.name)
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("name"))


def _resource_version(obj: KubeObject) -> str:
    if type(obj) is RawObject:
        return obj.resource_version  # read at the decode
    return object_identity(obj)[1]


_key = object_key
