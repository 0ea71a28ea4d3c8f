"""An in-memory :class:`~bridge.contracts.ListerWatcher` for tests of the informer machinery.

In the spirit of client-go's ``testing/fake_controller_source.go``: the resourceVersion is the number
of changes made so far, every change is kept (until :meth:`FakeControllerSource.compact`) so that a
watch can replay from any RV and a paginated list can read a consistent snapshot, and the test
controls the failures the reflector must survive — dropped watches, ``ERROR`` 410 events,
bookmarks, compaction, errors on the next list or watch call. Every list and watch call is recorded
with its options so tests can assert the exact sequence of requests a reflector made.

The server rules it follows are those of the API server (see CLIENT-GO-SEMANTICS.md, "Server
contract"), reduced to what the reflector can observe:

* list RV ``""`` / ``"0"``: the current state; ``"N"`` without limit (or ``NotOlderThan``): the current
  state, or ``TooLargeResourceVersionError`` when N is in the future; ``"N"`` with a limit (or
  ``Exact``): the state exactly at N, ``ResourceExpiredError`` when N is older than the compaction.
* continue tokens carry the snapshot RV; one older than the compaction → ``ResourceExpiredError``;
  a continue together with a resourceVersion → ``BadRequestError`` (as the API server refuses it).
* watch from ``""`` / ``"0"``: synthetic ADDED for the current state, then live changes; from ``"N"``:
  the changes after N, then live ones; from a compacted N: one ``ERROR`` event (410 Expired) and the
  stream ends. Bookmarks are sent only to watches that allow them.
* a watch stream is iterated once (a second ``async for`` raises), as the HTTP one.
* WatchList (``send_initial_events``) when :attr:`FakeControllerSource.support_watch_list` is set:
  ADDED for the current state, the ``k8s.io/initial-events-end`` bookmark, then live changes; when it
  is not set the request is rejected with ``BadRequestError``.

Memory is not bounded: this is a test helper.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import enum
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from bridge.contracts import (
    KubeObject,
    ListOptions,
    ListPage,
    WatchEvent,
    WatchEventType,
    WatchOptions,
)
from bridge.errors import (
    BadRequestError,
    ResourceExpiredError,
    TooLargeResourceVersionError,
)

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "FakeControllerSource",
    "FakeWatchStream",
    "SourceCall",
    "expired_status",
    "object_key_of",
]

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
"""Annotation on the bookmark that ends a WatchList's initial state."""


def object_key_of(obj: KubeObject) -> str:
    """``namespace/name`` or ``name``, as the store keys objects."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "")
    return f"{namespace}/{name}" if namespace else name


def _own(obj: KubeObject) -> dict[str, Any]:
    """A deep copy the fake source may change (objects handed in are shared)."""
    return copy.deepcopy(dict(obj))


def expired_status(message: str) -> dict[str, Any]:
    """The ``Status`` object an API server sends for 410 Gone / Expired."""
    return _status(410, "Expired", message)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A failure ``Status`` object as the API server sends it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass(frozen=True, slots=True)
class SourceCall:
    """One request a client made to the fake source, with its exact options."""

    kind: Literal["list", "watch"]
    options: ListOptions | WatchOptions


class _Close(enum.Enum):
    CLOSE = "close"


_CLOSE = _Close.CLOSE


class FakeWatchStream:
    """One open watch on a :class:`FakeControllerSource`. Iterating yields its events until the
    source closes it (:meth:`FakeControllerSource.drop_watches`, an injected error) or the client
    calls :meth:`close`."""

    def __init__(self, *, source: FakeControllerSource, options: WatchOptions) -> None:
        self.options = options
        self._source = source
        # Unbounded on purpose: a test helper, and a fake server must never block the test that
        # makes changes while nobody reads the watch.
        self._queue: asyncio.Queue[WatchEvent | _Close] = asyncio.Queue()
        self._closed = False
        self._ended = False
        self._iterated = False

    @property
    def closed(self) -> bool:
        """True once the client closed the stream or it reached its end."""
        return self._closed or self._ended

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        """The events, once: as the HTTP watch stream, a second iteration raises (so a test cannot
        pass on a client that reads one stream twice)."""
        if self._iterated:
            raise RuntimeError("fake source: a watch stream can be iterated only once")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        while not (self._closed or self._ended):
            item = await self._queue.get()
            if item is _CLOSE:
                self._ended = True
                self._source._forget(self)
                return
            assert isinstance(item, WatchEvent)
            yield item

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._source._forget(self)
        # Wakes a reader blocked in __anext__ so it sees the end.
        self._queue.put_nowait(_CLOSE)

    # -- server side --------------------------------------------------------------------------------

    def _send(self, event: WatchEvent) -> None:
        if not self._closed and not self._ended:
            self._queue.put_nowait(event)

    def _end(self) -> None:
        """The server closes the stream after what is already queued."""
        self._queue.put_nowait(_CLOSE)


class FakeControllerSource:
    """An in-memory API source for one resource; RV = number of changes so far.

    Not thread-safe; use from the event loop that runs the reflector.
    """

    def __init__(self, *, support_watch_list: bool = False, kind: str = "ConfigMap",
                 api_version: str = "v1") -> None:
        self.support_watch_list = support_watch_list
        """When False, a watch with ``send_initial_events`` is rejected with ``BadRequestError``."""
        self.kind = kind
        self.api_version = api_version
        self.calls: list[SourceCall] = []
        """Every list and watch call, in order, with its options (failed ones included)."""
        self._rv = 0
        self._state: dict[str, KubeObject] = {}
        # History of changes after the compaction point, oldest first: (rv, type, object).
        self._history: list[tuple[int, WatchEventType, KubeObject]] = []
        self._compacted_rv = 0
        self._base_state: dict[str, KubeObject] = {}
        """The state at ``_compacted_rv``; history replays on top of it."""
        self._watches: list[FakeWatchStream] = []
        self._list_failures: list[BaseException] = []
        self._watch_failures: list[BaseException] = []

    # -- inspection ---------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The number of changes made so far (the current resourceVersion)."""
        return self._rv

    @property
    def compacted_resource_version(self) -> int:
        """History at or before this RV is forgotten."""
        return self._compacted_rv

    def items(self) -> list[KubeObject]:
        """The current objects (copies), ordered by key."""
        return [copy.deepcopy(self._state[k]) for k in sorted(self._state)]

    @property
    def open_watches(self) -> list[FakeWatchStream]:
        return list(self._watches)

    def list_calls(self) -> list[ListOptions]:
        return [c.options for c in self.calls if isinstance(c.options, ListOptions)]

    def watch_calls(self) -> list[WatchOptions]:
        return [c.options for c in self.calls if isinstance(c.options, WatchOptions)]

    # -- changes ------------------------------------------------------------------------------------

    def add(self, obj: KubeObject) -> KubeObject:
        """Creates ``obj`` (a uid is assigned if it has none). Returns the stored copy."""
        obj = new = _own(obj)
        key = object_key_of(obj)
        if key in self._state:
            raise KeyError(f"fake source: {key} already exists; use modify()")
        self._rv += 1
        meta = new.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{key.replace('/', '-')}-{self._rv}")
        meta["resourceVersion"] = str(self._rv)
        self._record(WatchEventType.ADDED, key, obj)
        return copy.deepcopy(obj)

    def modify(self, obj: KubeObject) -> KubeObject:
        """Replaces an existing object (keeping its uid unless ``obj`` sets one)."""
        obj = new = _own(obj)
        key = object_key_of(obj)
        current = self._state.get(key)
        if current is None:
            raise KeyError(f"fake source: {key} does not exist; use add()")
        self._rv += 1
        meta = new.setdefault("metadata", {})
        meta.setdefault("uid", current["metadata"]["uid"])
        meta["resourceVersion"] = str(self._rv)
        self._record(WatchEventType.MODIFIED, key, obj)
        return copy.deepcopy(obj)

    def delete(self, obj: KubeObject) -> KubeObject:
        """Deletes the object with ``obj``'s key; the DELETED event carries its last state at a new RV."""
        key = object_key_of(obj)
        current = self._state.get(key)
        if current is None:
            raise KeyError(f"fake source: {key} does not exist")
        self._rv += 1
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._record(WatchEventType.DELETED, key, final)
        return copy.deepcopy(final)

    def advance_resource_version(self, count: int = 1) -> int:
        """Moves the RV forward as changes to other resources in the cluster would: no event here,
        but lists and bookmarks report the newer RV. Returns the new RV."""
        if count < 1:
            raise ValueError("count must be >= 1")
        self._rv += count
        return self._rv

    def _record(self, type_: WatchEventType, key: str, obj: KubeObject) -> None:
        if type_ is WatchEventType.DELETED:
            del self._state[key]
        else:
            self._state[key] = obj
        self._history.append((self._rv, type_, obj))
        for w in list(self._watches):
            w._send(WatchEvent(type=type_, object=copy.deepcopy(obj)))

    # -- test controls ------------------------------------------------------------------------------

    def drop_watches(self) -> None:
        """Closes every open watch cleanly (as the server does at a watch timeout)."""
        for w in list(self._watches):
            w._end()
        self._watches.clear()

    def inject_error(self, status_code: int = 410, *, reason: str | None = None,
                     message: str | None = None) -> None:
        """Sends an ``ERROR`` event carrying a Status to every open watch, then closes them."""
        reason = reason or ("Expired" if status_code == 410 else "InternalError")
        message = message or (
            f"too old resource version: {self._compacted_rv} ({self._rv})"
            if status_code == 410 else f"injected error {status_code}"
        )
        status = _status(status_code, reason, message)
        for w in list(self._watches):
            w._send(WatchEvent(type=WatchEventType.ERROR, object=copy.deepcopy(status)))
            w._end()
        self._watches.clear()

    def inject_bookmark(self, resource_version: int | None = None) -> None:
        """Sends a BOOKMARK to every open watch that allows bookmarks, at the current RV or at
        ``resource_version`` (as a server whose RV also counts changes to objects out of this
        watch's scope would)."""
        for w in list(self._watches):
            if w.options.allow_watch_bookmarks:
                bookmark = self._bookmark_object()
                if resource_version is not None:
                    bookmark["metadata"]["resourceVersion"] = str(resource_version)
                w._send(WatchEvent(type=WatchEventType.BOOKMARK, object=bookmark))

    def send_event(self, type_: WatchEventType, obj: KubeObject) -> None:
        """Sends ``obj`` as it is to every open watch, recording nothing: a server repeating an
        object (an ADDED or MODIFIED at a resourceVersion the client has already seen …)."""
        for w in list(self._watches):
            w._send(WatchEvent(type=type_, object=copy.deepcopy(obj)))

    def compact(self) -> None:
        """Forgets the history up to now: older RVs and continue tokens expire (410)."""
        self._base_state = {k: copy.deepcopy(v) for k, v in self._state.items()}
        self._history.clear()
        self._compacted_rv = self._rv

    def fail_next_list(self, exc: BaseException) -> None:
        """The next list call raises ``exc`` (queued: several calls fail in order)."""
        self._list_failures.append(exc)

    def fail_next_watch(self, exc: BaseException) -> None:
        """The next watch call raises ``exc`` (queued: several calls fail in order)."""
        self._watch_failures.append(exc)

    # -- ListerWatcher ------------------------------------------------------------------------------

    async def list(self, options: ListOptions) -> ListPage:
        self.calls.append(SourceCall(kind="list", options=options))
        await asyncio.sleep(0)
        if self._list_failures:
            raise self._list_failures.pop(0)
        if options.continue_token:
            if options.resource_version or options.resource_version_match:
                raise BadRequestError(
                    "specifying resource version is not allowed when using continue", code=400,
                    reason="BadRequest")
            snapshot_rv, offset = _decode_continue(options.continue_token)
            if snapshot_rv < self._compacted_rv:
                raise ResourceExpiredError(
                    "The provided continue parameter is too old to display a consistent list result.",
                    code=410, reason="Expired",
                    status=expired_status("continue token expired"))
        else:
            snapshot_rv = self._list_snapshot_rv(options)
            offset = 0
        state = self._state_at(snapshot_rv)
        keys = sorted(state)
        end = len(keys) if not options.limit else min(len(keys), offset + options.limit)
        items = [copy.deepcopy(state[k]) for k in keys[offset:end]]
        more = end < len(keys)
        return ListPage(
            items=items,
            resource_version=str(snapshot_rv),
            continue_token=_encode_continue(snapshot_rv, end) if more else None,
            remaining_item_count=len(keys) - end if more else None,
        )

    def _list_snapshot_rv(self, options: ListOptions) -> int:
        rv_text = options.resource_version
        if rv_text in ("", "0"):
            return self._rv
        rv = _parse_rv(rv_text)
        if rv > self._rv:
            raise TooLargeResourceVersionError(
                f"Too large resource version: {rv}, current: {self._rv}", code=504, reason="Timeout",
                retry_after=1.0)
        exact = options.resource_version_match == "Exact" or (
            options.resource_version_match is None and bool(options.limit))
        if not exact:
            return self._rv
        if rv < self._compacted_rv:
            raise ResourceExpiredError(
                f"too old resource version: {rv} ({self._compacted_rv})", code=410, reason="Expired",
                status=expired_status(f"too old resource version: {rv} ({self._compacted_rv})"))
        return rv

    def _state_at(self, rv: int) -> dict[str, KubeObject]:
        if rv == self._rv:
            return self._state
        state = dict(self._base_state)
        for change_rv, type_, obj in self._history:
            if change_rv > rv:
                break
            key = object_key_of(obj)
            if type_ is WatchEventType.DELETED:
                state.pop(key, None)
            else:
                state[key] = obj
        return state

    async def watch(self, options: WatchOptions) -> FakeWatchStream:
        self.calls.append(SourceCall(kind="watch", options=options))
        await asyncio.sleep(0)
        if self._watch_failures:
            raise self._watch_failures.pop(0)
        stream = FakeWatchStream(source=self, options=options)
        if options.send_initial_events:
            self._open_watch_list(stream, options)
        else:
            self._open_watch(stream, options)
        return stream

    def _open_watch(self, stream: FakeWatchStream, options: WatchOptions) -> None:
        rv_text = options.resource_version
        if rv_text in ("", "0"):
            for obj in self._sorted_state():
                stream._send(WatchEvent(type=WatchEventType.ADDED, object=obj))
            self._watches.append(stream)
            return
        rv = _parse_rv(rv_text)
        if rv < self._compacted_rv:
            message = f"too old resource version: {rv} ({self._compacted_rv})"
            stream._send(WatchEvent(type=WatchEventType.ERROR, object=expired_status(message)))
            stream._end()
            return
        if rv > self._rv:
            message = f"Too large resource version: {rv}, current: {self._rv}"
            stream._send(WatchEvent(type=WatchEventType.ERROR, object=_status(504, "Timeout", message)))
            stream._end()
            return
        for change_rv, type_, obj in self._history:
            if change_rv > rv:
                stream._send(WatchEvent(type=type_, object=copy.deepcopy(obj)))
        self._watches.append(stream)

    def _open_watch_list(self, stream: FakeWatchStream, options: WatchOptions) -> None:
        if not self.support_watch_list:
            raise BadRequestError(
                "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                code=422, reason="Invalid")
        if options.resource_version_match != "NotOlderThan" or not options.allow_watch_bookmarks:
            raise BadRequestError(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan and allowWatchBookmarks",
                code=422, reason="Invalid")
        if options.resource_version not in ("", "0") and _parse_rv(options.resource_version) > self._rv:
            raise TooLargeResourceVersionError(
                f"Too large resource version: {options.resource_version}, current: {self._rv}",
                code=504, reason="Timeout", retry_after=1.0)
        for obj in self._sorted_state():
            stream._send(WatchEvent(type=WatchEventType.ADDED, object=obj))
        end = self._bookmark_object()
        end["metadata"]["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
        stream._send(WatchEvent(type=WatchEventType.BOOKMARK, object=end))
        self._watches.append(stream)

    def _sorted_state(self) -> Iterable[KubeObject]:
        return (copy.deepcopy(self._state[k]) for k in sorted(self._state))

    def _bookmark_object(self) -> KubeObject:
        return {
            "kind": self.kind,
            "apiVersion": self.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
        }

    def _forget(self, stream: FakeWatchStream) -> None:
        if stream in self._watches:
            self._watches.remove(stream)


def _parse_rv(text: str) -> int:
    try:
        rv = int(text)
    except ValueError as exc:
        raise BadRequestError(f"invalid resource version {text!r}", code=400, reason="BadRequest") from exc
    if rv < 0:
        raise BadRequestError(f"invalid resource version {text!r}", code=400, reason="BadRequest")
    return rv


def _encode_continue(rv: int, offset: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"rv": rv, "start": offset})).decode()


def _decode_continue(token: str) -> tuple[int, int]:
    try:
        data: Any = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), int(data["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequestError(f"invalid continue token {token!r}", code=400, reason="BadRequest") from exc
