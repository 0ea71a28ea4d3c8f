"""The reflector's list phase: client-go's ``Reflector.list`` and the ``tools/pager`` it lists with.

:class:`ListPhase` lists the current state into the store and sets the resourceVersion the watch
starts from. The rules (docs/client-go-semantics.md):

* the list RV is ``"0"`` before the first sync, the last synced RV afterwards, ``""`` once that RV
  is known to be unavailable; an Expired / too-large answer marks it so and lists again at once, with
  RV ``""`` and without backoff (with ``exact``: after ``on_exact_list_expired``);
* pages of the chosen limit, later pages sending only ``continue``; a continuation page that
  expired is retried once as a full unpaginated list at the original RV; any other error discards
  what was listed; a server that answers a continue token twice fails the list (it would never end);
* the page size is chosen once from the first RV and kept for the retry: a configured one for every
  list (0 = never paginate), else :data:`DEFAULT_PAGE_SIZE` at ``"0"`` or ``""`` (and for every
  relist once the first list at ``"0"`` came back paginated) and none for a relist at a specific RV,
  which the API server can then serve from its watch cache.

Invariant: a store that offers :class:`~bridge.informer.reflector_store.StreamedReplaceStore` gets
each page as it arrives (:class:`PageSink`), with the outcome of one ``replace``; once pages of a
list that then failed may have reached consumers, no later list asks for an older state than theirs
(their RV, or a consistent read), never for RV ``"0"``.
"""

from __future__ import annotations

from collections.abc import Callable

from bridge.contracts import KubeObject, ListOptions
from bridge.errors import ApiStatusError, ResourceExpiredError, TooLargeResourceVersionError
from bridge.informer.reflector_progress import ReflectorProgress, log
from bridge.informer.reflector_store import ReflectorStore, StreamedReplaceStore, await_result

__all__ = ["DEFAULT_PAGE_SIZE", "ListPhase", "PageSink"]

DEFAULT_PAGE_SIZE = 500
"""Items per page of a list at ``"0"`` or ``""`` when no page size is configured (client-go's pager)."""


class PageSink:
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
            await await_result(self._store.replace_begin())
            self._open = True

    async def add(self, items: list[KubeObject], resource_version: str) -> None:
        self.count += len(items)
        if self._store is not None:
            if items:
                self.streamed_rv = resource_version
            await await_result(self._store.replace_page(items))
        else:
            self._items.extend(items)

    async def abort(self) -> None:
        if self._store is not None and self._open:
            self._open = False
            await await_result(self._store.replace_abort())

    async def complete(self, store: ReflectorStore, resource_version: str) -> None:
        if self._store is not None:
            self._open = False
            await await_result(self._store.replace_end(resource_version))
        else:
            await await_result(store.replace(self._items, resource_version))


class ListPhase(ReflectorProgress):
    """The list phase of a :class:`~bridge.informer.reflector.Reflector` (module docs)."""

    _page_size: int | None
    """Configured page size (client-go's ``WatchListPageSize``; 0 = never paginate), or None."""
    _paginated_result: bool
    """The first list at RV "0" was paginated: keep paging relists (client-go's paginatedResult)."""
    _on_exact_expired: Callable[[str], None] | None

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
        pages = PageSink(store if isinstance(store, StreamedReplaceStore) else None)
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

    async def _paged_list(self, rv: str, limit: int | None, pages: PageSink, *,
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
