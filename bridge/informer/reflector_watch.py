"""The reflector's watch phase: client-go's ``Reflector.watch`` / ``watchHandler``.

:class:`WatchPhase` watches from the last synced resourceVersion, applies every event to the store and
decides, when a watch stops being read, how the cycle goes on (:class:`WatchEnd`). The rules
(docs/client-go-semantics.md):

* watch with ``allow_watch_bookmarks`` and a random timeout in ``[min_watch_timeout, 2·min)``;
* ADDED → ``add``, MODIFIED → ``update``, DELETED → ``delete``, BOOKMARK → nothing but its
  resourceVersion; after each event (bookmarks included) the last synced RV is the event's, and a
  store that has it is told once per read of the stream (``update_resource_version`` with the last
  RV of the events that read decoded: one progress marker per read, not per event); a well-formed
  event whose object has no ``metadata.name`` is skipped, logged, and its RV still counts;
* a watch that ends cleanly after at least 1 s or one event (a connection broken mid-stream
  included) is re-opened at once from the last RV; one that ends in under 1 s with no event, or an
  ``ERROR`` event, ends the cycle (backoff, relist); an expired or too-large RV (410), on opening or
  as an ``ERROR`` event, ends it too, or, while resuming from a checkpoint before any event, says
  the checkpoint expired; connection refused or 429 on opening, a 429 ``ERROR`` event or a line the
  stream could not decode (``ClientWatchDecoding``) → backoff (at least the server's Retry-After),
  then the same watch again.

Invariants: a watch stream is iterated exactly once, through its :class:`OpenWatch`; events are
applied in order, each exactly as one event alone would be; the store is told a resourceVersion only
once every event up to it is applied (a read's marker follows its events, and the events applied
before the watch waits for room, or before an ``ERROR`` event, get theirs first), and a store answer
that is awaitable is awaited before the next event (backpressure). The per-event loop
(:meth:`WatchPhase._apply_batch`) makes no call it can avoid: a plain store is never awaited.
"""

from __future__ import annotations

import enum
import inspect
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from bridge.contracts import (
    BatchedWatchStream,
    KubeObject,
    WatchEvent,
    WatchEventType,
    WatchOptions,
    WatchStream,
)
from bridge.errors import (
    ApiError,
    ApiUnavailableError,
    ResourceExpiredError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
)
from bridge.informer.reflector_progress import ReflectorProgress, log
from bridge.rawobject import RawObject, object_identity

__all__ = [
    "MIN_WATCH_TIMEOUT",
    "OpenWatch",
    "WatchEnd",
    "WatchPhase",
    "has_name",
    "resource_version_of",
]

MIN_WATCH_TIMEOUT = 300
"""Seconds: the least ``min_watch_timeout`` (client-go's ``defaultMinWatchTimeout``); watches last
a random time in ``[min, 2·min)``."""

_DECODE_ERROR_CAUSE = "ClientWatchDecoding"
"""Cause type of the ERROR event a watch stream ends with at a line it cannot decode (client-go's)."""

_TOO_LARGE_CAUSE = "ResourceVersionTooLarge"
"""Cause reason of the 504 a server answers a resourceVersion newer than it knows with."""

_SHORT_WATCH = 1.0
"""A watch closing sooner than this with no event is treated as a failure (client-go's rule)."""


class WatchEnd(enum.Enum):
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
class OpenWatch:
    """An open watch and the one iterator over its events, a batch at a time. A watch stream is
    iterated exactly once (a second ``__aiter__`` or ``batches()`` raises): whoever continues
    reading it (the watch loop after a WatchList's initial state) must take over this iterator,
    never start a new one, and apply ``pending`` first (the rest of the batch that held the
    initial-events-end bookmark)."""

    stream: WatchStream
    batches: AsyncIterator[list[WatchEvent]]
    pending: list[WatchEvent] = field(default_factory=list)

    @classmethod
    def of(cls, stream: WatchStream) -> OpenWatch:
        if isinstance(stream, BatchedWatchStream):
            return cls(stream, stream.batches())
        return cls(stream, _one_at_a_time(stream.__aiter__()))


async def _one_at_a_time(events: AsyncIterator[WatchEvent]) -> AsyncIterator[list[WatchEvent]]:
    """A stream without batches, as batches of one event."""
    async for event in events:
        yield [event]


class WatchPhase(ReflectorProgress):
    """The watch phase of a :class:`~bridge.informer.reflector.Reflector` (module docs)."""

    _rng: random.Random
    _min_watch_timeout: int

    def _watch_timeout(self) -> int:
        return int(self._min_watch_timeout * (self._rng.random() + 1.0))

    async def _watch(self, stream: OpenWatch | None, *, resuming: bool) -> WatchEnd:
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
                        return WatchEnd.EXPIRED
                    raise
                if opened is None:
                    continue
                stream = OpenWatch.of(opened)
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
                return WatchEnd.RELIST
            if end is WatchEnd.REWATCH:
                continue
            if end is WatchEnd.BACKOFF_REWATCH:
                await self._backoff.wait(self._last_retry_after)
                continue
            if end is WatchEnd.EXPIRED and not (resuming and events_seen == 0):
                return WatchEnd.RELIST
            return end

    async def _handle_watch(self, stream: OpenWatch, start: float) -> tuple[WatchEnd, int]:
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
            return WatchEnd.EXPIRED, count
        except ApiError as exc:
            # Undecodable stream and the like: client-go turns these into an ERROR event.
            log.warning("watch stream failed: %s; relisting", exc, extra={"informer": self.name})
            return WatchEnd.RELIST, count
        duration = self._clock.now() - start
        if duration < _SHORT_WATCH and count == 0:
            log.warning("very short watch: watch lasted %.3f s with no items received; "
                        "relisting after backoff", duration, extra={"informer": self.name})
            return WatchEnd.RELIST, count
        log.debug("watch closed after %.3f s, %d events", duration, count, extra={"informer": self.name})
        return WatchEnd.REWATCH, count

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

    def _error_event_end(self, event: WatchEvent) -> WatchEnd:
        status = event.object
        code = status.get("code")
        reason = str(status.get("reason") or "")
        message = str(status.get("message") or "")
        if code == 410 or reason in ("Expired", "Gone"):
            self.expired_count += 1
            log.info("watch expired: %s", message, extra={"informer": self.name})
            return WatchEnd.EXPIRED
        if "too large resource version" in message.lower() or _has_cause(status, _TOO_LARGE_CAUSE):
            self.expired_count += 1
            log.info("watch from a too-large resourceVersion: %s", message, extra={"informer": self.name})
            return WatchEnd.EXPIRED
        if _is_decode_error(status):
            # client-go's stream watcher ends the watch at a line it cannot decode; re-watching from
            # the last event applied brings the change that line carried again (skipping the line
            # would lose it). The backoff keeps a server that keeps sending garbage from spinning us.
            self._last_retry_after = None
            log.warning("reflector %s: %s; watching again from resourceVersion %s", self.name, message,
                        self._last_sync_rv)
            return WatchEnd.BACKOFF_REWATCH
        if code == 429:
            details = status.get("details") or {}
            retry = details.get("retryAfterSeconds") if isinstance(details, dict) else None
            self._last_retry_after = float(retry) if retry is not None else None
            log.info("watch throttled (429): %s", message, extra={"informer": self.name})
            return WatchEnd.BACKOFF_REWATCH
        log.warning("watch ERROR event (code %s, reason %s): %s; relisting",
                    code, reason, message, extra={"informer": self.name})
        return WatchEnd.RELIST

    async def _apply_batch(self, events: list[WatchEvent], count: int) -> tuple[WatchEnd | None, int]:
        """Applies a batch of watch events (one read of the stream) to the store in one loop, in
        order, each exactly as one event alone would be, then tells the store the batch's last
        resourceVersion once: one progress marker per read, not per event. Stops at an ``ERROR``
        event (the events before it keep their marker) and returns how the watch ends; ``count``
        goes up by the events applied. A store that answers with an awaitable is awaited there and
        then (backpressure), a plain one never is; before such a wait the events applied so far get
        their marker, so the progress they made is not held back while the queue drains."""
        store = self._store
        updater = self._updater.update_resource_version if self._updater is not None else None
        told = ""  # the last resourceVersion the store was told (nothing to tell when it is current)
        rv = ""
        for event in events:
            kind = event.type
            obj = event.object
            result: object = None
            if kind is WatchEventType.ERROR:
                if updater is not None and rv != told:
                    await _settle(updater(rv))
                return self._error_event_end(event), count
            if type(obj) is RawObject:  # read at the decode: no call per event
                named, event_rv = bool(obj.name), obj.resource_version
            else:
                named, event_rv = has_name(obj), resource_version_of(obj)
            if kind is not WatchEventType.BOOKMARK and not named:
                # A well-formed event whose object cannot be keyed: nothing can be done with it but
                # say so (client-go's store refuses it the same way); its resourceVersion still counts.
                log.error("reflector %s: skipping a %s event whose object has no metadata.name "
                          "(resourceVersion %r)", self.name, kind.value, event_rv)
            elif kind is WatchEventType.ADDED:
                result = store.add(obj)
            elif kind is WatchEventType.MODIFIED:
                result = store.update(obj)
            elif kind is WatchEventType.DELETED:
                result = store.delete(obj)
            elif kind is not WatchEventType.BOOKMARK:
                log.error("unable to understand watch event type %s", kind, extra={"informer": self.name})
            if result is not None and inspect.isawaitable(result):
                if updater is not None and rv != told:
                    # The events before this one get their marker before the watch waits for room.
                    told = rv
                    await _settle(updater(rv))
                await result
            if event_rv:
                # Exact per event: a watch re-opened after an exception here resumes after it.
                rv = self._last_sync_rv = event_rv
            count += 1
        if updater is not None and rv != told:
            await _settle(updater(rv))
        return None, count


async def _settle(result: object) -> None:
    """Awaits what the store's ``update_resource_version`` returned, when it is awaitable."""
    if result is not None and inspect.isawaitable(result):
        await result


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


def has_name(obj: KubeObject) -> bool:
    """Whether the object has a ``metadata.name`` (its key needs one)."""
    if type(obj) is RawObject:
        return bool(obj.name)
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("name"))


def resource_version_of(obj: KubeObject) -> str:
    """The object's ``metadata.resourceVersion`` ("" if none)."""
    if type(obj) is RawObject:
        return obj.resource_version  # read at the decode
    return object_identity(obj)[1]
