"""The reflector's WatchList: the initial state streamed on a watch (client-go's ``watchList``).

:class:`WatchListPhase` opens a watch with ``sendInitialEvents=true`` and
``resourceVersionMatch=NotOlderThan``, gathers the initial objects (ADDED events) into a temporary
map up to the bookmark annotated :data:`INITIAL_EVENTS_END_ANNOTATION`, then hands them to the store
in one ``replace`` at that bookmark's resourceVersion; the same stream then goes on as a normal watch.
The rules (docs/client-go-semantics.md):

* an expired or too-large resourceVersion, on opening or as an ERROR event before the bookmark,
  marks the RV unavailable and retries the WatchList from ``""`` at once, or after the backoff when it
  was from ``""`` already (client-go asks again at once); it says nothing about the server's support
  of WatchList;
* an answer that means the server will not serve a WatchList (:class:`WatchListRejected` with
  ``remember``) makes the reflector fall back to list + watch in the same cycle and from then on; a
  stream that breaks or closes before the bookmark falls back for this cycle only.

Invariant: the stream is iterated once. The WatchList returns its :class:`OpenWatch` positioned after
the bookmark, with the rest of the bookmark's batch in ``pending``, and the watch loop takes over that
iterator; a WatchList that fails closes its stream.
"""

from __future__ import annotations

from bridge.contracts import KubeObject, WatchEventType, WatchOptions
from bridge.errors import ApiError, ApiUnavailableError, ResourceExpiredError, TooLargeResourceVersionError
from bridge.informer.reflector_progress import log
from bridge.informer.reflector_store import await_result
from bridge.informer.reflector_watch import OpenWatch, WatchEnd, WatchPhase, has_name, resource_version_of
from bridge.rawobject import object_key

__all__ = ["INITIAL_EVENTS_END_ANNOTATION", "WatchListPhase", "WatchListRejected"]

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
"""Annotation (value ``"true"``) on the bookmark that ends a WatchList's initial state."""


class WatchListRejected(Exception):
    """The WatchList request did not deliver its initial state; ``remember``: the server will not
    serve one (fall back to list + watch from now on); ``expired``: its resourceVersion expired."""

    def __init__(self, reason: str, *, remember: bool, expired: bool = False) -> None:
        super().__init__(reason)
        self.remember = remember
        self.expired = expired


class WatchListPhase(WatchPhase):
    """The WatchList of a :class:`~bridge.informer.reflector.Reflector` (module docs)."""

    async def _watch_list(self) -> OpenWatch:
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
                raise WatchListRejected(f"{type(exc).__name__}: {exc}", remember=True) from exc
            if stream is None:
                continue
            opened = OpenWatch.of(stream)
            ok = False
            try:
                await self._consume_initial_events(opened)
                ok = True
                return opened
            except WatchListRejected as rejected:
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

    async def _consume_initial_events(self, opened: OpenWatch) -> None:
        try:
            await self._consume_initial_events_from(opened)
        except ApiUnavailableError as exc:
            raise WatchListRejected(f"stream broke before the initial-events-end bookmark: {exc}",
                                     remember=False) from exc
        except ApiError as exc:
            expired = isinstance(exc, ResourceExpiredError | TooLargeResourceVersionError)
            raise WatchListRejected(f"stream failed before the initial-events-end bookmark: {exc}",
                                     remember=True, expired=expired) from exc

    async def _consume_initial_events_from(self, opened: OpenWatch) -> None:
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
                    raise WatchListRejected(
                        f"ERROR event before the initial-events-end bookmark: {obj.get('message', '')}",
                        remember=end is WatchEnd.RELIST, expired=end is WatchEnd.EXPIRED)
                if event.type is WatchEventType.BOOKMARK:
                    annotations = (obj.get("metadata") or {}).get("annotations") or {}
                    if annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true":
                        rv = resource_version_of(obj)
                        await await_result(self._store.replace(list(temp.values()), rv))
                        self._last_sync_rv = rv
                        self._rv_unavailable = False
                        self.list_count += 1
                        log.debug("WatchList delivered %d items at resourceVersion %s",
                                  len(temp), rv, extra={"informer": self.name})
                        opened.pending = batch[i + 1:]
                        return
                    continue
                key = object_key(obj)
                if not has_name(obj):
                    log.error("reflector %s: skipping a %s event whose object has no metadata.name "
                              "(resourceVersion %r)", self.name, event.type.value, resource_version_of(obj))
                elif event.type is WatchEventType.DELETED:
                    temp.pop(key, None)
                else:
                    temp[key] = obj
        raise WatchListRejected("stream closed before the initial-events-end bookmark", remember=False)
