"""Watch lines into :class:`~bridge.contracts.WatchEvent`: the decoders a watch stream is given.

A :data:`WatchDecoder` turns one line of a watch answer (``{"type":…,"object":{…}}``) into one event,
and raises :class:`WatchDecodeError` for a line that is not a watch event, which the stream
(:mod:`bridge.kube.watchstream`) then handles; a decoder never skips a line and never returns
anything but an event. The default, :func:`raw_object_decoder`, keeps the object as the API server's
bytes (:class:`~bridge.rawobject.RawObject`: one msgspec pass over a line laid out as API servers
write it); the others decode it into a ``dict`` (the ``cache.compact: false`` path and the
benchmarks' comparisons, :data:`WATCH_EVENT_DECODERS`).

Invariants: a line's bytes are UTF-8 or the line is not an event (bytes kept as they came must be
JSON); an object beyond the bounds (:data:`~bridge.jsonbounds.MAX_DEPTH`,
:data:`~bridge.jsonbounds.MAX_OBJECT_BYTES`) is never decoded but quarantined
(:mod:`bridge.kube.bounded`); an ``ERROR`` event's Status is always a decoded ``dict``. This runs
once per watch event: the fast path makes no call it can avoid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from bridge.contracts import KubeObject, WatchEvent, WatchEventType
from bridge.errors import DecodeError
from bridge.jsonbounds import MAX_DEPTH, MAX_OBJECT_BYTES, NOT_BRACKETS, exceeds_depth
from bridge.kube.bounded import out_of_bounds_event
from bridge.rawobject import RawObject, RawObjectError, decode_object, decode_watch_object
from bridge.watchline import decode_watch_line

__all__ = [
    "DECODE_ERRORS",
    "WATCH_EVENT_DECODERS",
    "WatchDecodeError",
    "WatchDecoder",
    "decode_watch_event",
    "decode_watch_event_objects",
    "decode_watch_event_orjson",
    "decode_watch_event_raw",
    "raw_object_decoder",
]


DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What msgspec raises for bytes that are not JSON: invalid UTF-8 in a key surfaces as a
UnicodeDecodeError rather than a DecodeError (found by fuzzing). RecursionError only if a text got
past the depth bound (:mod:`bridge.kube.bounded`), which it must not: caught as a last resort."""

_LINE_DEPTH = MAX_DEPTH + 1
"""A watch line holds its object one level down."""
_LINE_BYTES = MAX_OBJECT_BYTES
"""A longer line may hold an object over the size bound: the object's own length decides."""


class WatchDecodeError(DecodeError):
    """A line of a watch stream that is not a watch event."""


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


def _dict_event(line: bytes, parts: Callable[[bytes], tuple[str, dict[str, Any]]]) -> WatchEvent:
    """The event of a line, its object a dict: UTF-8 and the bounds checked, then ``parts`` (the
    line's type and object, decoded) with any decode error as a :class:`WatchDecodeError`."""
    _check_utf8(line)
    beyond = _beyond_bounds(line)
    if beyond is not None:
        return beyond
    try:
        type_, obj = parts(line)
    except DECODE_ERRORS as e:
        raise WatchDecodeError(str(e)) from e
    return _event(type_, obj)


def _one_pass_parts(line: bytes) -> tuple[str, dict[str, Any]]:
    ev = _event_decoder.decode(line)
    return ev.type, ev.object


def _two_pass_parts(line: bytes) -> tuple[str, dict[str, Any]]:
    ev = _raw_event_decoder.decode(line)
    return ev.type, _any_decoder.decode(ev.object)


def decode_watch_event(line: bytes) -> WatchEvent:
    """One pass of msgspec into ``{type: str, object: dict}``: the default. On realistic Pods it
    measures level with ``orjson.loads`` of the whole line and ahead of the two-pass ``Raw`` variant
    (bench/bench_decode.py), and it checks the event's shape while decoding."""
    return _dict_event(line, _one_pass_parts)


def decode_watch_event_raw(line: bytes) -> WatchEvent:
    """msgspec with the object left as ``Raw``, then a second pass into a dict."""
    return _dict_event(line, _two_pass_parts)


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


def _plain_object_decoder(drop_managed_fields: bool) -> WatchDecoder:
    """The decode of a line within the bounds that the one pass declines (today's path, and the
    differential test's reference): :func:`~bridge.rawobject.decode_watch_object`, then the line's
    object as a ``Raw`` decoded on its own (:func:`~bridge.rawobject.decode_object`)."""

    def decode(line: bytes) -> WatchEvent:
        fast = decode_watch_object(line, drop_managed_fields=drop_managed_fields)
        if fast is not None and fast[0] in _OBJECT_EVENT_TYPES:
            return WatchEvent(type=_OBJECT_EVENT_TYPES[fast[0]], object=fast[1])
        try:
            ev = _raw_event_decoder.decode(line)
        except DECODE_ERRORS as e:
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
        except DECODE_ERRORS as e:
            raise WatchDecodeError(str(e)) from e

    return decode


_LINE_BRACKETS = 2 * _LINE_DEPTH
"""A line with at most this many brackets cannot nest deeper than the bound (the first step of
:func:`~bridge.jsonbounds.exceeds_depth`, done here without its call)."""


def raw_object_decoder(*, drop_managed_fields: bool = False, bounded: bool = True,
                       one_pass: bool = True) -> WatchDecoder:
    """Watch events whose objects stay JSON bytes (:class:`~bridge.rawobject.RawObject`): a line as
    API servers lay it out is decoded in one msgspec pass that reads the event type and the object's
    metadata without building the rest (:func:`bridge.watchline.decode_watch_line`); what that
    declines takes today's path (other layouts, ``ERROR`` events, whose Status is decoded whole as
    the reflector reads it). ``drop_managed_fields`` cuts ``metadata.managedFields`` out of the bytes
    on the way. An object beyond the bounds is quarantined (:mod:`bridge.kube.bounded`);
    ``bounded=False`` skips that check and ``one_pass=False`` the one pass, for the differential
    tests and the benchmarks of what each costs or gains only."""
    plain = _plain_object_decoder(drop_managed_fields)

    def decode(line: bytes) -> WatchEvent:
        if not line.isascii():  # _check_utf8 without its call for the ASCII line of nearly every event
            _check_utf8(line)
        if bounded and (len(line) > _LINE_BYTES or (len(line.translate(None, NOT_BRACKETS)) > _LINE_BRACKETS
                                                    and exceeds_depth(line, _LINE_DEPTH))):
            quarantined = out_of_bounds_event(line)
            if quarantined is not None:
                return quarantined
        if one_pass:
            fast = decode_watch_line(line, drop_managed_fields)
            if fast is not None:
                return WatchEvent(type=fast[0], object=fast[1])
        return plain(line)

    return decode


decode_watch_event_objects = raw_object_decoder()

WATCH_EVENT_DECODERS: dict[str, WatchDecoder] = {
    "msgspec": decode_watch_event,
    "msgspec-raw": decode_watch_event_raw,
    "orjson": decode_watch_event_orjson,
    "raw-object": decode_watch_event_objects,
    "raw-object-plain": raw_object_decoder(one_pass=False),
}
"""Every decoder a watch stream may be given, by name (the benchmarks compare them in one run;
``raw-object-plain`` is the default without its one pass, the path it falls back to)."""
