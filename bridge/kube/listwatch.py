"""The :class:`~bridge.contracts.ListerWatcher` over HTTP: list and watch one resource in one scope.

This is the bridge's hot path from the API server: every object arrives through here. Lines of a watch
are decoded straight from bytes into ``dict`` (msgspec, one pass; never the ``kubernetes`` package's
typed models), and the things a long-running watch meets in practice are absorbed here rather than
crashing the informer: a half-written last line when the connection drops (discarded), a connection
reset mid-stream (the stream simply ends, and the reflector re-watches from its last resourceVersion),
and a line that is not a watch event: as client-go's stream watcher does, the stream ends there with
an ``ERROR`` event (a 500 Status whose cause is ``ClientWatchDecoding``), so that the reflector
re-watches from the last resourceVersion it applied and the change that line carried comes again
(counted in :attr:`HttpWatchStream.garbage_lines`). Skipping the line and reading on would lose it.
But a line that ends the next watch the same way is what the server holds (an object stored with
bytes no decoder takes), and re-watching would read it forever: that time the stream goes on past
it. Its object, when the line still names one, is quarantined in its place (``encoding``, ``syntax``:
:mod:`bridge.kube.bounded`); a line that names no object is skipped and counted (``unreadable``), and
the stream ends after its read with an ``ERROR`` event that makes the reflector relist, since the
change it carried is unknown (client-go relists at a decoding error too).

A watch stream is iterated once: a second ``async for`` over it raises rather than silently starting
a second reader over the same connection.

Errors keep the :mod:`bridge.errors` types the reflector's policy needs (410 → ResourceExpiredError,
"too large resource version" → TooLargeResourceVersionError, 429 → TooManyRequestsError …), with
messages naming the resource and scope, and for 403 what to fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import msgspec
import orjson

from bridge.contracts import KubeObject, ListOptions, ListPage, WatchEvent, WatchEventType, WatchOptions
from bridge.errors import ApiStatusError, DecodeError, ForbiddenError, NotFoundError
from bridge.jsonbounds import MAX_DEPTH, MAX_OBJECT_BYTES, exceeds_depth
from bridge.kube.apiclient import ApiClient, LineStream, Params
from bridge.kube.bounded import (
    ENCODING,
    SIZE,
    UNREADABLE,
    deep_list,
    malformed_object,
    out_of_bounds_event,
    quarantined,
    quarantined_item,
    report_malformed,
    salvage_line,
    utf8_error,
)
from bridge.kube.discovery import APIResource, Discovery, UnsupportedResourceError
from bridge.kube.sharding import ShardFilter, skipped_bookmark
from bridge.rawobject import RawObject, RawObjectError, decode_object, decode_watch_object

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
    "decode_list",
    "decode_watch_event",
    "decode_watch_event_orjson",
    "decode_watch_event_raw",
    "lister_watcher_for",
    "raw_object_decoder",
    "skipped_line_status",
    "split_list",
]

_log = logging.getLogger(__name__)


_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What msgspec raises for bytes that are not JSON: invalid UTF-8 in a key surfaces as a
UnicodeDecodeError rather than a DecodeError (found by fuzzing). RecursionError only if a text got
past the depth bound (:mod:`bridge.kube.bounded`), which it must not: caught as a last resort."""

_LINE_DEPTH = MAX_DEPTH + 1
"""A watch line holds its object one level down."""
_LINE_BYTES = MAX_OBJECT_BYTES
"""A longer line may hold an object over the size bound: the object's own length decides."""


class WatchDecodeError(DecodeError):
    """A line of a watch stream that is not a watch event."""


DECODE_ERROR_CAUSE = "ClientWatchDecoding"
"""The cause type of the ``ERROR`` event that ends a watch at an undecodable line (client-go's)."""


def decode_error_status(message: str) -> dict[str, Any]:
    """The Status of the ``ERROR`` event a stream ends with at a line it cannot decode: what
    client-go's stream watcher reports (a 500 InternalError caused by ``ClientWatchDecoding``)."""
    text = f"unable to decode an event from the watch stream: {message}"
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": text, "reason": "InternalError", "code": 500,
        "details": {"causes": [{"type": DECODE_ERROR_CAUSE, "message": text}]},
    }


MAX_LIST_PAGES = 100_000
"""The most pages one paginated list may take (50 million objects at the reflector's 500 a page)."""

SKIPPED_LINE_CAUSE = "WatchLineSkipped"
"""The cause type of the ``ERROR`` event that ends a watch after it skipped a line naming no object."""


def skipped_line_status() -> dict[str, Any]:
    """The Status of the ``ERROR`` event a stream ends with after it skipped a line that came the same
    way twice and names no object: the change it carried is unknown, so the reflector relists (the
    relist is framed by gap markers: how the delivery contract announces changes not observed). Any
    ``ERROR`` but a decoding, expiry or throttling one makes the reflector relist, as client-go's
    does for an internal error it does not retry."""
    text = "skipped a watch line that names no object; relisting"
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": text, "reason": "InternalError", "code": 500,
        "details": {"causes": [{"type": SKIPPED_LINE_CAUSE, "message": text}]},
    }


WatchDecoder = Callable[[bytes], WatchEvent]
"""Turns one line into a :class:`WatchEvent`; raises :class:`WatchDecodeError` for anything else."""

_EVENT_TYPES: dict[str, WatchEventType] = {t.value: t for t in WatchEventType}
_OBJECT_EVENT_TYPES: dict[str, WatchEventType] = {
    k: t for k, t in _EVENT_TYPES.items() if t is not WatchEventType.ERROR
}
"""The types whose object the fast decode returns as it is (an ``ERROR``'s Status is decoded whole)."""


class _Event(msgspec.Struct):
    type: str
    object: dict[str, Any]


class _RawEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


_event_decoder = msgspec.json.Decoder(_Event)
_raw_event_decoder = msgspec.json.Decoder(_RawEvent)
_any_decoder = msgspec.json.Decoder(dict[str, Any])


def _check_utf8(data: bytes) -> None:
    """Bytes kept as they came (RawObjects) must be valid JSON, hence UTF-8: msgspec does not check
    the content it skips. API servers send ASCII almost always, which is checked without a copy."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WatchDecodeError(f"not UTF-8: byte {e.start}: {e.reason}") from e


def _ignore(reason: str) -> None:
    """Counts nothing (a stream opened without a lister-watcher to count for)."""


def _beyond_bounds(line: bytes) -> WatchEvent | None:
    """The event of a line whose object is beyond the bounds (quarantined); None for the others."""
    if len(line) > _LINE_BYTES or exceeds_depth(line, _LINE_DEPTH):
        return out_of_bounds_event(line)
    return None


def _event(type_: str, obj: KubeObject) -> WatchEvent:
    kind = _EVENT_TYPES.get(type_)
    if kind is None:
        raise WatchDecodeError(f"unknown watch event type {type_[:40]!r}")
    return WatchEvent(type=kind, object=obj)


def decode_watch_event(line: bytes) -> WatchEvent:
    """One pass of msgspec into ``{type: str, object: dict}``: the default. On realistic Pods it
    measures level with ``orjson.loads`` of the whole line and ahead of the two-pass ``Raw`` variant
    (bench/bench_decode.py), and it checks the event's shape while decoding."""
    _check_utf8(line)
    beyond = _beyond_bounds(line)
    if beyond is not None:
        return beyond
    try:
        ev = _event_decoder.decode(line)
    except _DECODE_ERRORS as e:
        raise WatchDecodeError(str(e)) from e
    return _event(ev.type, ev.object)


def decode_watch_event_raw(line: bytes) -> WatchEvent:
    """msgspec with the object left as ``Raw``, then a second pass into a dict."""
    _check_utf8(line)
    beyond = _beyond_bounds(line)
    if beyond is not None:
        return beyond
    try:
        ev = _raw_event_decoder.decode(line)
        obj = _any_decoder.decode(ev.object)
    except _DECODE_ERRORS as e:
        raise WatchDecodeError(str(e)) from e
    return _event(ev.type, obj)


def decode_watch_event_orjson(line: bytes) -> WatchEvent:
    """``orjson.loads`` of the whole line, then a shape check."""
    beyond = _beyond_bounds(line)
    if beyond is not None:
        return beyond
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise WatchDecodeError(str(e)) from e
    if not isinstance(data, dict):
        raise WatchDecodeError("a watch event must be a JSON object")
    type_, obj = data.get("type"), data.get("object")
    if not isinstance(type_, str) or not isinstance(obj, dict):
        raise WatchDecodeError("a watch event needs a string 'type' and an object 'object'")
    return _event(type_, obj)


def raw_object_decoder(*, drop_managed_fields: bool = False, bounded: bool = True) -> WatchDecoder:
    """Watch events whose objects stay JSON bytes (:class:`~bridge.rawobject.RawObject`): one msgspec
    pass over a line as API servers lay it out reads the event type and the object's metadata
    without building the rest (other layouts take two passes), and ``drop_managed_fields`` cuts
    ``metadata.managedFields`` out of the bytes on the way. ``ERROR`` events (a Status) are decoded
    whole, as the reflector reads them. An object beyond the bounds is quarantined
    (:mod:`bridge.kube.bounded`); ``bounded=False`` skips that check, for the differential test and
    the benchmark of what it costs only."""

    def decode(line: bytes) -> WatchEvent:
        if not line.isascii():  # _check_utf8 without its call for the ASCII line of nearly every event
            _check_utf8(line)
        if bounded and (len(line) > _LINE_BYTES or exceeds_depth(line, _LINE_DEPTH)):
            quarantined = out_of_bounds_event(line)
            if quarantined is not None:
                return quarantined
        fast = decode_watch_object(line, drop_managed_fields=drop_managed_fields)
        if fast is not None and fast[0] in _OBJECT_EVENT_TYPES:
            return WatchEvent(type=_OBJECT_EVENT_TYPES[fast[0]], object=fast[1])
        try:
            ev = _raw_event_decoder.decode(line)
        except _DECODE_ERRORS as e:
            raise WatchDecodeError(str(e)) from e
        kind = _EVENT_TYPES.get(ev.type)
        if kind is None:
            raise WatchDecodeError(f"unknown watch event type {ev.type[:40]!r}")
        try:
            if kind is WatchEventType.ERROR:
                return WatchEvent(type=kind, object=_any_decoder.decode(ev.object))
            obj = decode_object(ev.object, drop_managed_fields=drop_managed_fields)
            return WatchEvent(type=kind, object=obj)
        except RawObjectError as e:
            raw = bytes(ev.object)
            if not raw.lstrip().startswith(b"{"):
                raise WatchDecodeError(f"a watch event's object must be a JSON object: {e}") from e
            # A well-formed event whose object has no metadata mapping: as with the dict decoders
            # (an object without a name), the reflector logs and skips it.
            return WatchEvent(type=kind, object=RawObject(raw, {}))
        except _DECODE_ERRORS as e:
            raise WatchDecodeError(str(e)) from e

    return decode


decode_watch_event_objects = raw_object_decoder()

WATCH_EVENT_DECODERS: dict[str, WatchDecoder] = {
    "msgspec": decode_watch_event,
    "msgspec-raw": decode_watch_event_raw,
    "orjson": decode_watch_event_orjson,
    "raw-object": decode_watch_event_objects,
}


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")
    remainingItemCount: int | None = None


class _RawList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] | None = None


_item_decoder = msgspec.json.Decoder(dict[str, Any])
_raw_list_decoder = msgspec.json.Decoder(_RawList)
_list_meta_decoder = msgspec.json.Decoder(_ListMeta)


def split_list(body: bytes) -> tuple[_ListMeta, list[msgspec.Raw | bytes]]:
    """A List answer's metadata and its items, still undecoded (one fast pass; a List nested too
    deep for that is split without recursion, :func:`bridge.kube.bounded.deep_list`). Each item's
    UTF-8 is checked on its own (:func:`_list_page`): one item that is not UTF-8 does not fail the
    List."""
    try:
        raw_list = _raw_list_decoder.decode(body)
    except RecursionError:
        meta_raw, items = deep_list(body)
        try:
            meta = _list_meta_decoder.decode(meta_raw) if meta_raw else _ListMeta()
        except _DECODE_ERRORS as e:
            raise WatchDecodeError(f"not a List: {e}") from e
        return meta, list(items)
    except _DECODE_ERRORS as e:
        raise WatchDecodeError(f"not a List: {e}") from e
    return raw_list.metadata, list(raw_list.items or [])


def _list_page(
    meta: _ListMeta,
    raws: list[msgspec.Raw | bytes],
    *,
    api_version: str,
    kind: str,
    raw_objects: bool,
    drop_managed_fields: bool,
) -> ListPage:
    items: list[KubeObject] = []
    append = items.append
    drop = drop_managed_fields
    try:
        for raw in raws:
            # Beyond the bounds (nearly never: one translate pass says so): quarantined.
            data = raw if type(raw) is bytes else bytes(raw)
            if not data.isascii() and utf8_error(data):
                append(malformed_object(data, ENCODING, api_version=api_version, kind=kind))
                continue
            if len(data) > MAX_OBJECT_BYTES or exceeds_depth(data):
                quarantined = quarantined_item(data, api_version=api_version, kind=kind)
                if quarantined is not None:
                    append(quarantined)
                    continue
            if raw_objects:
                append(decode_object(data, api_version=api_version, kind=kind, drop_managed_fields=drop))
                continue
            item = _item_decoder.decode(data)
            if api_version or kind:
                if "apiVersion" not in item:
                    item["apiVersion"] = api_version
                if "kind" not in item:
                    item["kind"] = kind
            append(item)
    except (*_DECODE_ERRORS, RawObjectError) as e:
        raise WatchDecodeError(f"not a List: {e}") from e
    return ListPage(
        items=items,
        resource_version=meta.resourceVersion,
        continue_token=meta.continue_ or None,
        remaining_item_count=meta.remainingItemCount,
    )


def decode_list(
    body: bytes,
    *,
    api_version: str = "",
    kind: str = "",
    raw_objects: bool = False,
    drop_managed_fields: bool = False,
) -> ListPage:
    """A List answer into a :class:`ListPage`. Items of a List carry no apiVersion/kind on the wire;
    they are filled in from the resource so that every object the bridge forwards is self-describing.

    ``raw_objects``: items become :class:`~bridge.rawobject.RawObject` (their bytes, metadata decoded),
    with ``metadata.managedFields`` cut out when ``drop_managed_fields``; otherwise dicts."""
    meta, raws = split_list(body)
    return _list_page(meta, raws, api_version=api_version, kind=kind, raw_objects=raw_objects,
                      drop_managed_fields=drop_managed_fields)


def _consume_outcome(task: asyncio.Task[bytes]) -> None:
    """Marks a prefetch's failure as seen (it is raised again to whoever awaits the task)."""
    if not task.cancelled():
        task.exception()


class HttpWatchStream:
    """An open watch over HTTP (:class:`bridge.contracts.WatchStream`)."""

    def __init__(
        self,
        *,
        lines: LineStream,
        decoder: WatchDecoder,
        context: str,
        on_garbage: Callable[[], None] | None = None,
        shard: ShardFilter | None = None,
        on_malformed: Callable[[str], None] | None = None,
        on_bad_line: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``shard``: lines of objects it does not keep are not decoded; each run of them in one
        read becomes one bookmark at the last one's resourceVersion (:mod:`bridge.kube.sharding`).
        ``on_bad_line``: whether a line that is not a watch event failed the same way on the watch
        before (then it is the server's, and the stream goes on past it); None: never."""
        self._lines = lines
        self._decoder = decoder
        self._shard = shard
        self._context = context
        self._on_garbage = on_garbage
        self._on_malformed = on_malformed
        self._on_bad_line = on_bad_line
        self.malformed = 0
        """Objects quarantined (:mod:`bridge.kube.bounded`)."""
        self.events = 0
        """Events yielded."""
        self.garbage_lines = 0
        """Lines that were not watch events (the stream ends at the first unless it is persistent)."""
        self.truncated_lines = 0
        """An unterminated, undecodable last line when the stream ended (0 or 1)."""
        self._iterated = False
        self._bad_at = 0

    @property
    def broken(self) -> BaseException | None:
        """The transport error that ended the stream, None for a clean end."""
        return self._lines.broken

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        """The events, once (a second iteration raises: see the module docstring)."""
        return self._events(self.batches())

    def batches(self) -> AsyncGenerator[list[WatchEvent], None]:
        """The events a read at a time (:class:`bridge.contracts.BatchedWatchStream`): every line
        one read of the connection made available, decoded in one loop. A batch is never empty and
        never waits for more lines; one that meets a line that is not a watch event ends with the
        ``ERROR`` event, and the stream with it. Once per stream, like ``__aiter__``."""
        if self._iterated:
            raise RuntimeError(f"{self._context}: a watch stream can be iterated only once")
        self._iterated = True
        return self._batches()

    @staticmethod
    async def _events(batches: AsyncGenerator[list[WatchEvent], None]) -> AsyncIterator[WatchEvent]:
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            await batches.aclose()

    def _decode_lines(self, lines: list[bytes], pos: int, events: list[WatchEvent]) -> int:
        """Decodes ``lines[pos:]`` into ``events``; returns where it stopped (the end). A line that is
        not a watch event raises, its index kept in :attr:`_bad_at`."""
        shard = self._shard
        if shard is not None and shard.filtering:
            self._decode_sharded(lines, pos, events, shard)
            return len(lines)
        decode = self._decoder
        append = events.append
        before = len(events)
        try:
            for line in (lines if pos == 0 else lines[pos:]):
                append(decode(line))
        except WatchDecodeError:
            self._bad_at = pos + len(events) - before
            raise
        return len(lines)

    def _end_at_garbage(self, events: list[WatchEvent], bad: bytes, e: WatchDecodeError) -> None:
        """The first time a line fails: the stream ends there with the decoding ``ERROR`` event, and
        the reflector watches again from the last event applied (a line garbled on the way comes
        again as it should)."""
        self.events += len(events)
        _log.warning(
            "%s: a line is not a watch event (%d bytes): %s; ending the watch after %d events",
            self._context, len(bad), e, self.events,
        )
        events.append(WatchEvent(type=WatchEventType.ERROR, object=decode_error_status(str(e))))

    def _skip_persistent(self, bad: bytes, e: WatchDecodeError, events: list[WatchEvent]) -> bool:
        """A line that failed the same way on the watch before (the server's bytes, not the
        connection's): the stream goes on past it. Its object, when the line still names one, is
        quarantined in its place; otherwise the line is counted (``unreadable``) and True says that
        the resource must relist, since the change it carried is unknown."""
        salvaged = salvage_line(bad)
        if salvaged is not None:
            events.append(salvaged)
            return False
        if self._on_malformed is not None:
            self._on_malformed(UNREADABLE)
        self.malformed += 1
        _log.warning(
            "%s: skipped a line that is not a watch event and names no object (%d bytes, the same on "
            "the watch before): %s; a change may be lost, relisting (the relist is framed by gap "
            "markers)", self._context, len(bad), e,
        )
        return True

    def _skip_oversized(self) -> WatchEvent:
        """The stream ended at a line longer than the line reader holds (``max_line_bytes``), which
        nothing reads: what it carried is unknown, and watching again from the same resourceVersion
        would meet it again. Counted (``size``), and the ``ERROR`` event that makes the reflector relist."""
        if self._on_malformed is not None:
            self._on_malformed(SIZE)
        self.malformed += 1
        _log.warning("%s: skipped a watch line longer than the line reader holds (%s); a change may be "
                     "lost, relisting (the relist is framed by gap markers)",
                     self._context, self._lines.broken)
        return WatchEvent(type=WatchEventType.ERROR, object=skipped_line_status())

    def _decode_sharded(self, lines: list[bytes], pos: int, events: list[WatchEvent],
                        shard: ShardFilter) -> None:
        """Decodes ``lines[pos:]`` into ``events`` but those ``shard`` does not keep: each run of them
        becomes one bookmark at its last resourceVersion, before the next event or at the end (a
        batch of lines is never an empty batch of events). A line that is not a watch event raises,
        its index kept in :attr:`_bad_at`."""
        decode = self._decoder
        skip = shard.skip_line
        append = events.append
        pending: str | None = None
        for at in range(pos, len(lines)):
            line = lines[at]
            rv = skip(line)
            if rv is not None:
                if rv or pending is None:
                    pending = rv
                continue
            try:
                event = decode(line)
            except WatchDecodeError:
                if pending:
                    append(skipped_bookmark(pending))
                self._bad_at = at
                raise
            if pending:
                append(skipped_bookmark(pending))
            pending = None
            append(event)
        if pending is not None:
            append(skipped_bookmark(pending))

    async def _batches(self) -> AsyncGenerator[list[WatchEvent], None]:
        async for lines in self._lines.batches():
            events: list[WatchEvent] = []
            seen = quarantined()
            pos, relist = 0, False
            while pos < len(lines):
                try:
                    pos = self._decode_lines(lines, pos, events)
                except WatchDecodeError as e:
                    bad = lines[self._bad_at]
                    self.garbage_lines += 1
                    if self._on_garbage is not None:
                        self._on_garbage()
                    if self._on_bad_line is None or not self._on_bad_line(bad):
                        self._end_at_garbage(events, bad, e)
                        yield events
                        await self._lines.close()
                        return
                    relist = self._skip_persistent(bad, e, events) or relist
                    pos = self._bad_at + 1
            if quarantined() != seen:
                self.malformed += report_malformed([e.object for e in events], self._context,
                                                   self._on_malformed or _ignore)
            self.events += len(events)
            if relist:
                events.append(WatchEvent(type=WatchEventType.ERROR, object=skipped_line_status()))
                yield events
                await self._lines.close()
                return
            if events:
                yield events
        if self._lines.oversized_lines:
            yield [self._skip_oversized()]
            return
        tail = self._lines.tail
        if tail:
            # The last line had no newline: a complete event whose terminator never came is still
            # an event; anything else is a line cut by the connection drop.
            try:
                rv = self._shard.skip_line(tail) if self._shard is not None else None
                event = self._decoder(tail) if rv is None else skipped_bookmark(rv)
            except WatchDecodeError:
                self.truncated_lines += 1
                _log.info("%s: discarded a half-written last line (%d bytes)", self._context, len(tail))
                return
            self.events += 1
            yield [event]

    async def close(self) -> None:
        await self._lines.close()


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
            page = _list_page(meta, items, api_version=self._resource.api_version, kind=self._resource.kind,
                              raw_objects=self._raw_objects, drop_managed_fields=self._drop_managed_fields)
        except WatchDecodeError as e:
            raise ApiStatusError(f"{context}: the server answered something that is not a List: {e}",
                                 code=200) from e
        if quarantined() != seen:
            report_malformed(page.items, context, self._count_malformed)
        return page

    def _bound_pages(self, options: ListOptions, meta: _ListMeta, items: int, context: str) -> None:
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
