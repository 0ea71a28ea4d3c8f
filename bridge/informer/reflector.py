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
  event (bookmarks included) advances the last synced RV and, when the store has it, each read of
  the stream ends with one ``store.update_resource_version(rv)`` (its last event's RV);
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

The phases have modules of their own, each a base class of :class:`Reflector` working on its state
(:mod:`~bridge.informer.reflector_progress`): the list and its pager
(:mod:`~bridge.informer.reflector_list`), the watch and the decisions a watch's end leads to
(:mod:`~bridge.informer.reflector_watch`), the WatchList (:mod:`~bridge.informer.reflector_watch_list`);
what it writes into is :mod:`~bridge.informer.reflector_store`. This module is the ListAndWatch loop
itself: which phase a cycle starts with (resume, exact list, WatchList, list), the backoff after each
cycle, the watch-error handler and the resync timer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from bridge.clock import Clock
from bridge.contracts import ListerWatcher
from bridge.errors import ApiStatusError, ResourceExpiredError
from bridge.informer.backoff import Backoff
from bridge.informer.reflector_list import DEFAULT_PAGE_SIZE, ListPhase
from bridge.informer.reflector_store import (
    ReflectorStore,
    ResourceVersionUpdater,
    StreamedReplaceStore,
    await_result,
)
from bridge.informer.reflector_watch import MIN_WATCH_TIMEOUT, OpenWatch, WatchEnd
from bridge.informer.reflector_watch_list import (
    INITIAL_EVENTS_END_ANNOTATION,
    WatchListPhase,
    WatchListRejected,
)

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

WatchErrorHandler = Callable[["Reflector", BaseException], None]
"""Called when a ListAndWatch cycle ends with an error (list failed, watch could not be opened)."""


def default_watch_error_handler(reflector: Reflector, err: BaseException) -> None:
    """Logs the error: expiry at info level (routine), anything else as a warning."""
    if isinstance(err, ResourceExpiredError):
        log.info("watch closed: %s", err, extra={"informer": reflector.name})
    else:
        log.warning("list/watch failed: %s: %s", type(err).__name__, err, extra={"informer": reflector.name})


class Reflector(WatchListPhase, ListPhase):
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
        self._clock = clock
        self._resync_period = resync_period
        self._should_resync = should_resync
        self._page_size = page_size
        self._paginated_result = False
        self._use_watch_list = use_watch_list
        self._watch_error_handler: WatchErrorHandler = watch_error_handler or default_watch_error_handler
        self._rng = rng if rng is not None else random.Random()
        self._min_watch_timeout = min_watch_timeout
        self._backoff = backoff if backoff is not None else Backoff(clock=clock, rng=self._rng)

        # Progress (what each attribute means: ReflectorProgress and the phases' declarations).
        self._last_sync_rv = initial_resource_version
        self._rv_unavailable = False
        self._streamed_rv = ""
        self._resume_rv = initial_resource_version
        self._exact_rv = "" if initial_resource_version else exact_list
        self._on_exact_expired = on_exact_list_expired
        self._watch_list_rejected = False
        """The server rejected a WatchList: later cycles use list + watch."""
        self._stop_requested = False
        self._task: asyncio.Task[None] | None = None
        self._current_stream = None
        self._resync_error = None
        self._last_retry_after = None
        self.list_count = 0
        self.watch_count = 0
        self.expired_count = 0

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
        stream: OpenWatch | None = None
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
            except WatchListRejected as rejected:
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
        if end is WatchEnd.EXPIRED and resuming:
            # The checkpoint's RV is gone: a consistent relist, at once, then watch as usual.
            log.info("checkpoint resourceVersion expired; relisting", extra={"informer": self.name})
            self._rv_unavailable = True
            await self._list()
            await self._watch_with_resync(None, resuming=False)

    # -- watch with the resync timer ---------------------------------------------------------------

    async def _watch_with_resync(self, stream: OpenWatch | None, *, resuming: bool) -> WatchEnd:
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

    # -- resync -------------------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            await self._clock.sleep(self._resync_period)
            if self._should_resync is None or self._should_resync():
                log.debug("forcing resync", extra={"informer": self.name})
                try:
                    await await_result(self._store.resync())
                except Exception as exc:
                    log.error("resync failed: %s", exc, extra={"informer": self.name})
                    self._resync_error = exc
                    stream = self._current_stream
                    if stream is not None:
                        await stream.close()
                    return
