"""The :class:`~bridge.contracts.ListerWatcher` over HTTP: list and watch one resource in one scope.

This is the bridge's hot path from the API server: every object arrives through here. The parts,
one module each:

* the requests (this module, :class:`HttpListerWatcher`): the selectors, the paginated list (the
  next page asked for while this one decodes, a list that never ends abandoned), the watch with
  bookmarks, ``timeoutSeconds`` and WatchList's ``sendInitialEvents``, the ``Accept`` headers of a
  metadata-only informer;
* a List answer's decoding: :mod:`bridge.kube.listdecode`;
* a watch stream's reading, with what it does at a line that is not a watch event and what it
  quarantines: :mod:`bridge.kube.watchstream`;
* a watch line's decoding into an event (straight from bytes, msgspec, one pass; never the
  ``kubernetes`` package's typed models): :mod:`bridge.kube.watchdecode`.

Their names are importable from here too, where the rest of the bridge looks for them.

Errors keep the :mod:`bridge.errors` types the reflector's policy needs (410 → ResourceExpiredError,
"too large resource version" → TooLargeResourceVersionError, 429 → TooManyRequestsError …), with
messages naming the resource and scope, and for 403 what to fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from bridge.contracts import ListOptions, ListPage, WatchOptions
from bridge.errors import ApiStatusError, ForbiddenError, NotFoundError
from bridge.kube.apiclient import ApiClient, Params
from bridge.kube.bounded import quarantined, report_malformed
from bridge.kube.discovery import APIResource, Discovery, UnsupportedResourceError
from bridge.kube.listdecode import ListMeta, decode_list, list_page, split_list
from bridge.kube.sharding import ShardFilter
from bridge.kube.watchdecode import (
    WATCH_EVENT_DECODERS,
    WatchDecodeError,
    WatchDecoder,
    decode_watch_event,
    decode_watch_event_objects,
    decode_watch_event_orjson,
    decode_watch_event_raw,
    raw_object_decoder,
)
from bridge.kube.watchstream import (
    DECODE_ERROR_CAUSE,
    SKIPPED_LINE_CAUSE,
    HttpWatchStream,
    decode_error_status,
    skipped_line_status,
)

__all__ = [
    "DECODE_ERROR_CAUSE",
    "MAX_LIST_PAGES",
    "METADATA_ACCEPT",
    "SKIPPED_LINE_CAUSE",
    "WATCH_EVENT_DECODERS",
    "HttpListerWatcher",
    "HttpWatchStream",
    "WatchDecodeError",
    "WatchDecoder",
    "decode_error_status",
    "decode_list",
    "decode_watch_event",
    "decode_watch_event_objects",
    "decode_watch_event_orjson",
    "decode_watch_event_raw",
    "lister_watcher_for",
    "raw_object_decoder",
    "skipped_line_status",
    "split_list",
]

_log = logging.getLogger(__name__)


MAX_LIST_PAGES = 100_000
"""The most pages one paginated list may take (50 million objects at the reflector's 500 a page)."""


def _consume_outcome(task: asyncio.Task[bytes]) -> None:
    """Marks a prefetch's failure as seen (it is raised again to whoever awaits the task)."""
    if not task.cancelled():
        task.exception()


METADATA_ACCEPT: tuple[str, str] = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
)
"""The ``Accept`` headers of a metadata-only list and watch (client-go's metadata informer): the
API server answers ``PartialObjectMetadataList`` / ``PartialObjectMetadata`` objects, each only
``metadata`` (a plain answer when it cannot, which the caller reads the same way)."""


class HttpListerWatcher:
    """Lists and watches ``resource`` in ``namespace`` ("" = all namespaces / cluster-scoped), with
    the selectors passed through to the server."""

    def __init__(
        self,
        *,
        client: ApiClient,
        resource: APIResource,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        decoder: WatchDecoder | None = None,
        raw_objects: bool = False,
        drop_managed_fields: bool = False,
        shard: ShardFilter | None = None,
        accept: tuple[str, str] | None = None,
        max_list_pages: int = MAX_LIST_PAGES,
    ) -> None:
        """``accept``: the ``Accept`` headers of lists and of watches when the caller negotiates
        another representation (:data:`METADATA_ACCEPT`: metadata only).

        ``raw_objects``: objects stay JSON bytes (:class:`~bridge.rawobject.RawObject`), with
        ``metadata.managedFields`` cut out when ``drop_managed_fields``; otherwise they are decoded
        into dicts (by ``decoder`` for watch events, msgspec by default). ``shard``: objects this
        shard does not own are recognised by their uid and go no further than that (list items are
        dropped, watch events become bookmarks; :mod:`bridge.kube.sharding`)."""
        if resource.verbs and not resource.supports("list", "watch"):
            raise UnsupportedResourceError(
                f"resource {resource.qualified} ({resource.api_version}) cannot be watched: it supports "
                f"only {', '.join(resource.verbs) or 'no verbs'}, and the bridge needs list and watch"
            )
        self._client = client
        self._resource = resource
        self._namespace = namespace if resource.namespaced else ""
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._raw_objects = raw_objects
        self._drop_managed_fields = drop_managed_fields
        if decoder is None:
            decoder = (raw_object_decoder(drop_managed_fields=drop_managed_fields) if raw_objects
                       else decode_watch_event)
        self._shard = shard
        self._decoder = decoder
        self._path = resource.path(self._namespace or None)
        scope = f"in namespace {self._namespace}" if self._namespace else (
            "in all namespaces" if resource.namespaced else "(cluster-scoped)"
        )
        self._scope = scope
        self.garbage_lines = 0
        """Garbage lines over every watch this lister-watcher opened."""
        self.malformed: dict[str, int] = {}
        """Objects quarantined in its lists and watches, by reason (``depth``, ``size``):
        ``keb_malformed_objects_total``."""
        self._prefetched: tuple[int | None, str, asyncio.Task[bytes]] | None = None
        self._accept = accept
        self._failed_line: bytes | None = None
        """The digest of the line that ended the last watch undecoded."""
        self.max_list_pages = max_list_pages
        """A paginated list of more pages is abandoned (:meth:`_bound_pages`)."""
        self._paging: list[Any] = [0, 0, None]
        """The paginated list under way: pages and items read, the total its first page announced."""

    @property
    def resource(self) -> APIResource:
        return self._resource

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def path(self) -> str:
        return self._path

    def __repr__(self) -> str:
        return f"HttpListerWatcher({self._resource.qualified}/{self._resource.version} {self._scope})"

    def _selectors(self) -> dict[str, str | int | bool | None]:
        return {
            "labelSelector": self._label_selector or None,
            "fieldSelector": self._field_selector or None,
        }

    def _explain(self, e: ApiStatusError, verb: str) -> ApiStatusError:
        """Names the resource in 403/404 errors, with what to do about it."""
        what = f"{verb} {self._resource.qualified} {self._scope}"
        kwargs: dict[str, Any] = {
            "code": e.code, "reason": e.reason, "retry_after": e.retry_after, "status": e.status,
        }
        server_message = str(e.status.get("message") or "")
        if isinstance(e, ForbiddenError):
            return ForbiddenError(
                f"forbidden: {what} — check the ClusterRole/Role bound to the bridge's service account "
                f"grants list and watch on {self._resource.qualified}"
                + (f" (server: {server_message})" if server_message else ""),
                **kwargs,
            )
        if isinstance(e, NotFoundError):
            return NotFoundError(
                f"not found: {what} ({self._path}) — the resource is not served (CRD removed?) "
                "or the namespace does not exist",
                **kwargs,
            )
        return e

    async def list(self, options: ListOptions) -> ListPage:
        """One page. The next page of a paginated list is requested as soon as this one's answer is
        in (before its items are decoded), so that the server prepares it while the bridge decodes:
        a list of many pages then costs the larger of the two, not their sum."""
        params: dict[str, str | int | bool | None] = self._selectors()
        if options.limit:
            params["limit"] = options.limit
        if options.continue_token:
            # A continuation names its snapshot; the server rejects a resourceVersion alongside it.
            params["continue"] = options.continue_token
        else:
            params["resourceVersion"] = options.resource_version or None
            if options.resource_version:
                params["resourceVersionMatch"] = options.resource_version_match
        context = f"list {self._resource.qualified} {self._scope}"
        pending = self._take_prefetched(options)
        try:
            if pending is not None:
                body = await pending
            else:
                body = await self._client.request_bytes("GET", self._path, params=params, context=context,
                                                        accept=self._accept[0] if self._accept else None)
        except (ForbiddenError, NotFoundError) as e:
            raise self._explain(e, "list") from e
        try:
            meta, items = split_list(body)
        except WatchDecodeError as e:
            raise ApiStatusError(f"{context}: the server answered something that is not a List: {e}",
                                 code=200) from e
        self._bound_pages(options, meta, len(items), context)
        if meta.continue_:
            self._prefetch(options.limit, meta.continue_, context)
        if self._shard is not None:
            items = [raw for raw in items if self._shard.keeps_item(raw)]
        seen = quarantined()
        try:
            page = list_page(meta, items, api_version=self._resource.api_version, kind=self._resource.kind,
                             raw_objects=self._raw_objects, drop_managed_fields=self._drop_managed_fields)
        except WatchDecodeError as e:
            raise ApiStatusError(f"{context}: the server answered something that is not a List: {e}",
                                 code=200) from e
        if quarantined() != seen:
            report_malformed(page.items, context, self._count_malformed)
        return page

    def _bound_pages(self, options: ListOptions, meta: ListMeta, items: int, context: str) -> None:
        """Raises once a paginated list has read more than it can hold (a server whose continue token
        never ends, changing or not): more items than its first page and the ``remainingItemCount`` it
        reported allow (twice over, and a page more), or more than :attr:`max_list_pages` pages. A
        paginated list is one snapshot, so its length is known from its first page; ``remainingItemCount``
        is left out with selectors, where the cap on pages alone bounds it."""
        if options.continue_token is None:
            reported = meta.remainingItemCount
            self._paging = [1, items, None if reported is None else items + max(reported, 0)]
            return
        run = self._paging
        run[0] += 1
        run[1] += items
        pages, read, expected = run
        if expected is not None and read > 2 * expected + (options.limit or 500):
            why = (f"{read} items in {pages} pages where its first page announced {expected}: the "
                   "server keeps answering continue tokens")
        elif pages > self.max_list_pages:
            why = f"more than {self.max_list_pages} pages ({read} items): the server keeps answering " \
                  "continue tokens"
        else:
            return
        self._discard_prefetch()
        _log.warning("%s: a paginated list that does not end: %s; abandoning it (the reflector backs "
                     "off and lists again)", context, why)
        raise ApiStatusError(f"{context}: a paginated list that does not end: {why}", code=200,
                             reason="EndlessList")

    def _prefetch(self, limit: int | None, continue_token: str, context: str) -> None:
        params: dict[str, str | int | bool | None] = self._selectors()
        if limit:
            params["limit"] = limit
        params["continue"] = continue_token
        task = asyncio.get_running_loop().create_task(
            self._client.request_bytes("GET", self._path, params=params, context=context,
                                       accept=self._accept[0] if self._accept else None),
            name=f"list-prefetch:{self._resource.qualified}",
        )
        task.add_done_callback(_consume_outcome)
        self._discard_prefetch()
        self._prefetched = (limit, continue_token, task)

    def _take_prefetched(self, options: ListOptions) -> asyncio.Task[bytes] | None:
        """The prefetched answer for exactly this request, if any; any other prefetch is dropped."""
        held = self._prefetched
        if held is None:
            return None
        self._prefetched = None
        limit, token, task = held
        if options.continue_token == token and options.limit == limit:
            return task
        task.cancel()
        return None

    def _discard_prefetch(self) -> None:
        held, self._prefetched = self._prefetched, None
        if held is not None:
            held[2].cancel()

    async def watch(self, options: WatchOptions) -> HttpWatchStream:
        params: Params = {
            **self._selectors(),
            "watch": True,
            "resourceVersion": options.resource_version or None,
            "resourceVersionMatch": options.resource_version_match,
            "timeoutSeconds": options.timeout_seconds,
            "allowWatchBookmarks": True if options.allow_watch_bookmarks else None,
            "sendInitialEvents": True if options.send_initial_events else None,
        }
        self._discard_prefetch()  # a list that stops early leaves no request behind
        context = f"watch {self._resource.qualified} {self._scope}"
        read_timeout = options.timeout_seconds + 30.0 if options.timeout_seconds else None
        try:
            lines = await self._client.open_stream(
                self._path, params, context=context, read_timeout=read_timeout,
                accept=self._accept[1] if self._accept else None,
            )
        except (ForbiddenError, NotFoundError) as e:
            raise self._explain(e, "watch") from e
        return HttpWatchStream(
            lines=lines, decoder=self._decoder, context=context, on_garbage=self._count_garbage,
            shard=self._shard, on_malformed=self._count_malformed, on_bad_line=self._failed_before,
        )

    def _count_garbage(self) -> None:
        self.garbage_lines += 1

    def _failed_before(self, line: bytes) -> bool:
        """Whether ``line`` is the line that ended this lister-watcher's previous watch (then it is
        what the server holds, not a garbling on the way); remembers it otherwise."""
        digest = hashlib.blake2b(line, digest_size=16).digest()
        if digest == self._failed_line:
            self._failed_line = None
            return True
        self._failed_line = digest
        return False

    def _count_malformed(self, reason: str) -> None:
        self.malformed[reason] = self.malformed.get(reason, 0) + 1


async def lister_watcher_for(
    client: ApiClient,
    discovery: Discovery,
    name: str,
    namespace: str = "",
    *,
    label_selector: str = "",
    field_selector: str = "",
) -> HttpListerWatcher:
    """Resolves ``name`` (``pods``, ``deployments.apps``, ``widgets.example.com/v1`` …) and binds
    it to a scope. Raises UnknownResourceError / UnsupportedResourceError (ConfigurationError)."""
    resource = await discovery.resolve(name)
    return HttpListerWatcher(
        client=client,
        resource=resource,
        namespace=namespace,
        label_selector=label_selector,
        field_selector=field_selector,
    )
