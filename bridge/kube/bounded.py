"""Objects beyond the decoders' bounds: quarantined, never dropped, never fatal.

Watch lines and List items beyond :data:`~bridge.jsonbounds.MAX_DEPTH` or
:data:`~bridge.jsonbounds.MAX_OBJECT_BYTES` are not decoded. What can be read of such an object
without decoding it (a bounded, non-recursive scan of its first :data:`IDENTITY_SCAN_BYTES`:
``apiVersion``, ``kind``, ``metadata.name``, ``namespace``, ``uid`` and ``resourceVersion``, which API
servers write first) becomes a :class:`~bridge.rawobject.RawObject` whose ``raw`` is that identity
alone and whose ``malformed`` says why (:data:`DEPTH`, :data:`SIZE`); ``quarantined`` keeps the bytes
as they came, on that instance only, for the sinks' dead letters. A List too deep for msgspec to
split is split here without recursion, and each item judged on its own.

So the resource keeps syncing and watching: the object is keyed and cached (its identity: a later
valid update or a delete of it is handled as for any object, and a relist that meets it again finds
it unchanged), its resourceVersion moves the reflector's resume point and the checkpoints past it,
and sinks send an event carrying the ``malformed`` attribute in its place (docs/event-format.md).

The decoders (:mod:`bridge.kube.watchdecode`, :mod:`bridge.kube.listdecode`) call in here only for
a text beyond the bounds (:func:`bridge.jsonbounds.exceeds_depth`, a length): what is then found
within them (a line whose object fits though the line around it does not) goes back to the usual
decode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec
import orjson

from bridge.contracts import WatchEvent, WatchEventType
from bridge.errors import DecodeError
from bridge.jsonbounds import MAX_DEPTH, MAX_OBJECT_BYTES, elements, exceeds_depth, members
from bridge.rawobject import RawObject

__all__ = [
    "DEPTH",
    "ENCODING",
    "IDENTITY_SCAN_BYTES",
    "SIZE",
    "SYNTAX",
    "UNREADABLE",
    "deep_list",
    "describe",
    "malformed_object",
    "out_of_bounds",
    "out_of_bounds_event",
    "quarantined",
    "quarantined_item",
    "report_malformed",
    "salvage_line",
    "utf8_error",
]

_log = logging.getLogger("bridge.kube.listwatch")  # where the decoders log

DEPTH = "depth"
"""Nested deeper than :data:`~bridge.jsonbounds.MAX_DEPTH`."""
SIZE = "size"
"""Larger than :data:`~bridge.jsonbounds.MAX_OBJECT_BYTES`."""
ENCODING = "encoding"
"""Not UTF-8 (JSON must be): the object's identity reads, its content does not."""
SYNTAX = "syntax"
"""Not JSON past its identity (a watch line that came twice the same way: the server's bytes)."""
UNREADABLE = "unreadable"
"""A watch line that names no object (skipped; the resource relists: :func:`salvage_line`)."""

IDENTITY_SCAN_BYTES = 64 * 1024
"""How far into a malformed object its identity is looked for (API servers write ``apiVersion``,
``kind`` and ``metadata`` first)."""

_MAX_FIELD = 1024
"""An identity string longer than this is not read (names have at most 253 characters)."""

_IDENTITY_KEYS = (b"name", b"namespace", b"uid", b"resourceVersion")

_quarantined = 0


def quarantined() -> int:
    """How many objects this process quarantined so far: a caller that compares it before and after
    a decode knows whether to look for malformed objects among what came out (once per batch, not a
    check per object)."""
    return _quarantined


def out_of_bounds(data: bytes, *, depth: int = MAX_DEPTH) -> str:
    """Why the object ``data`` must be quarantined (:data:`SIZE`, :data:`DEPTH`), ``""`` when it is
    within the bounds. ``depth``: the bound for the text as given (an object inside a watch line sits
    one level down)."""
    if len(data) > MAX_OBJECT_BYTES:
        return SIZE
    if exceeds_depth(data, depth):
        return DEPTH
    return ""


def _string(data: bytes, start: int, end: int) -> str:
    if end - start > _MAX_FIELD + 2 or data[start:start + 1] != b'"':
        return ""
    try:
        value = msgspec.json.decode(data[start:end], type=str)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return ""
    return value


def _identity(data: bytes) -> tuple[str, str, dict[str, str]]:
    """``(apiVersion, kind, metadata)`` of an object, as far as a shallow scan of its first
    :data:`IDENTITY_SCAN_BYTES` reads them (``""`` / absent for the rest)."""
    api_version = kind = ""
    meta: dict[str, str] = {}
    end = min(len(data), IDENTITY_SCAN_BYTES)
    for key, s, e in members(data, 0, end):
        if key == b"apiVersion":
            api_version = _string(data, s, e)
        elif key == b"kind":
            kind = _string(data, s, e)
        elif key == b"metadata" and not meta:
            for mkey, ms, me in members(data, s, e):
                if mkey in _IDENTITY_KEYS:
                    value = _string(data, ms, me)
                    if value:
                        meta[mkey.decode()] = value
        if api_version and kind and meta:
            break
    return api_version, kind, meta


def malformed_object(data: bytes, reason: str, *, api_version: str = "", kind: str = "") -> RawObject:
    """The quarantined stand-in of the object ``data`` (see the module docstring); ``api_version`` /
    ``kind`` fill in what it lacks (a List's items carry neither). Never raises for any bytes."""
    found_version, found_kind, meta = _identity(data)
    ident = {"apiVersion": found_version or api_version, "kind": found_kind or kind, "metadata": meta}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    obj = RawObject(orjson.dumps(ident), meta,
                    identity=(name, namespace, meta.get("uid", ""), meta.get("resourceVersion", ""), False))
    obj.malformed = reason
    obj.quarantined = data
    global _quarantined
    _quarantined += 1
    return obj


_REASONS = {DEPTH: f"nested deeper than {MAX_DEPTH} levels", SIZE: f"larger than {MAX_OBJECT_BYTES} bytes",
            ENCODING: "not UTF-8", SYNTAX: "not JSON"}


def describe(obj: RawObject) -> str:
    """What a log line says of a quarantined object: its identity, why, and its size."""
    ident = f"{obj.key or '(no name)'} uid={obj.uid or '?'} resourceVersion={obj.resource_version or '?'}"
    return f"{ident}: {_REASONS.get(obj.malformed, obj.malformed)} ({len(obj.quarantined)} bytes)"


_TYPES: dict[bytes, WatchEventType] = {
    f'"{t.value}"'.encode(): t for t in WatchEventType if t is not WatchEventType.ERROR
}


def quarantined_item(data: bytes, *, api_version: str = "", kind: str = "") -> RawObject | None:
    """The quarantined stand-in of an object beyond the bounds; None when it is within them."""
    reason = out_of_bounds(data)
    if not reason:
        return None
    return malformed_object(data, reason, api_version=api_version, kind=kind)


def _event_members(line: bytes) -> tuple[WatchEventType | None, tuple[int, int] | None]:
    """The event type of a watch line and the span of its ``object`` member (None for a missing one,
    or an ``object`` that is not a JSON object), read by the shallow scan of :func:`members`."""
    type_ = span = None
    for key, s, e in members(line):
        if key == b"type":
            type_ = _TYPES.get(line[s:e])
        elif key == b"object":
            span = (s, e)
        if type_ is not None and span is not None:
            break
    if span is not None and line[span[0]:span[0] + 1] != b"{":
        span = None
    return type_, span


def out_of_bounds_event(line: bytes) -> WatchEvent | None:
    """The event of a watch line whose object is beyond the bounds, with the object quarantined;
    None when the line is within them (the caller decodes it as usual). A line beyond them that is
    not an object's event (an ``ERROR``, no ``type`` or ``object`` member) raises
    :class:`~bridge.errors.DecodeError`: the stream ends there, as at any undecodable line."""
    if not out_of_bounds(line, depth=MAX_DEPTH + 1):
        return None
    type_, span = _event_members(line)
    if type_ is None or span is None:
        raise DecodeError("a watch line beyond the decoders' bounds that is not an object's event")
    raw = line[span[0]:span[1]]
    reason = out_of_bounds(raw)
    if not reason:  # the object fits, the line around it did not: judge the line as usual
        return None
    return WatchEvent(type=type_, object=malformed_object(raw, reason))


def utf8_error(data: bytes) -> str:
    """Why ``data`` is not UTF-8 (``""`` when it is): the check a decoder that keeps bytes as they came
    needs, since msgspec does not look into the content it skips."""
    if data.isascii():
        return ""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"byte {e.start}: {e.reason}"
    return ""


def salvage_line(line: bytes) -> WatchEvent | None:
    """The event of a watch line no decoder takes (not UTF-8, not JSON) but whose object can still be
    identified: an object event (``ADDED``, ``MODIFIED``, ``DELETED``) whose object's ``metadata`` names
    it and its resourceVersion, read by the shallow scan of :func:`malformed_object`. The object is
    quarantined as :data:`ENCODING` (the line is JSON once its bytes are read leniently) or
    :data:`SYNTAX`; None when nothing identifies it (the caller skips the line and relists)."""
    type_, span = _event_members(line)
    if type_ is None or span is None:
        return None
    raw = line[span[0]:span[1]]
    _, _, meta = _identity(raw)
    if not meta.get("name") or not meta.get("resourceVersion"):
        return None
    reason = SYNTAX
    if utf8_error(line):
        try:
            msgspec.json.decode(line.decode("utf-8", "replace").encode())
            reason = ENCODING
        except (msgspec.DecodeError, RecursionError):
            pass
    return WatchEvent(type=type_, object=malformed_object(raw, reason))


def deep_list(body: bytes) -> tuple[bytes, list[bytes]]:
    """``(metadata, items)`` of a List body, as undecoded bytes, split without recursion: for a List
    whose items nest too deep for the decoder to split it (each item is then judged on its own)."""
    meta = b""
    items: list[bytes] = []
    for key, s, e in members(body):
        if key == b"metadata":
            meta = body[s:e]
        elif key == b"items" and body[s:s + 1] == b"[":
            items = [body[a:b] for a, b in elements(body, s, e)]
    return meta, items


def report_malformed(objects: Sequence[object], context: str, count: Callable[[str], None]) -> int:
    """Counts (``count(reason)``) and logs the quarantined objects among ``objects``; returns how
    many there were."""
    found = 0
    for obj in objects:
        if type(obj) is RawObject and obj.malformed:
            found += 1
            count(obj.malformed)
            _log.warning("%s: quarantined an object the decoders do not take: %s; its identity goes on "
                         "(marked malformed), its bytes to the sinks' dead letters", context, describe(obj))
    return found
