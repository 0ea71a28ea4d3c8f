"""RawObjects from the API server's bytes: an object's JSON, or a whole watch line, decoded once.

:func:`decode_object` takes an object's JSON (a List item, a watch event's object) and
:func:`decode_watch_object` a watch line laid out as API servers write them; both read only the top
level and the metadata's identity in one msgspec pass and leave the rest as bytes
(:func:`~bridge.rawobject_type.build_from_bytes`). Bytes laid out otherwise (whitespace, duplicate
keys …) take the long way: decoded and re-encoded once, so the result is the same object.

Invariants: what comes out is a :class:`~bridge.rawobject_type.RawObject` whose bytes are valid
UTF-8 JSON with a ``metadata`` mapping, or :class:`~bridge.rawobject_type.RawObjectError` is raised
(:func:`decode_watch_object` returns None instead, for the caller's long way); numbers are kept
exactly as they came (msgspec both ways: orjson would turn an integer beyond 64 bits into a
float). :func:`decode_watch_object` runs once per watch event: it compares slices rather than
calling methods.
"""

from __future__ import annotations

import msgspec

from bridge.managed_fields import dict_without_managed_fields, newest_change
from bridge.rawobject_type import (
    DECODE_ERRORS,
    RawObject,
    RawObjectError,
    build_from_bytes,
    head_decoder,
    object_decoder,
)

__all__ = ["decode_object", "decode_watch_object"]


_EVENT_PREFIXES: dict[bytes, tuple[str, bytes, int]] = {
    p[9:14]: (t, p, len(p)) for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
    for p in (b'{"type":"' + t.encode() + b'","object":',)
}
"""The start of a watch line of each event type, as API servers write it, and its length, by the
five bytes after ``{"type":"`` (which tell the types apart)."""


def decode_object(
    raw: bytes | msgspec.Raw,
    *,
    api_version: str = "",
    kind: str = "",
    drop_managed_fields: bool = False,
) -> RawObject:
    """A :class:`RawObject` from an object's JSON as the API server sent it.

    ``api_version`` / ``kind`` are filled in when the object lacks them (items of a List carry
    neither on the wire); ``drop_managed_fields`` cuts ``metadata.managedFields`` out of the bytes.
    Raises :class:`RawObjectError` for anything but a JSON object with a ``metadata`` mapping.
    """
    data = raw if type(raw) is bytes else bytes(raw)
    if not data.isascii():
        # Kept as they came, the bytes must be JSON, hence UTF-8 (msgspec skips what it does not read).
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RawObjectError(f"not a Kubernetes object: not UTF-8 (byte {e.start})") from e
    try:
        head = head_decoder.decode(data)
    except DECODE_ERRORS as e:
        raise RawObjectError(f"not a Kubernetes object: {e}") from e
    built = build_from_bytes(data, head, drop_managed_fields=drop_managed_fields, api_version=api_version,
                             kind=kind)
    if built is not None:
        return built
    if not len(head.metadata):
        raise RawObjectError("a Kubernetes object needs a metadata mapping")
    # Laid out unlike the API server's compact JSON (whitespace, duplicate keys …): decode and
    # re-encode once, with msgspec both ways: it keeps every number as it was (orjson would turn
    # an integer beyond 64 bits into a float, and refuse to encode it back).
    try:
        obj = object_decoder.decode(data)
    except DECODE_ERRORS as e:
        raise RawObjectError(f"not a Kubernetes object: {e}") from e
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise RawObjectError("a Kubernetes object needs a metadata mapping")
    entries = meta.get("managedFields")
    change = newest_change(entries) if isinstance(entries, list) else None
    if drop_managed_fields:
        obj = dict_without_managed_fields(obj)
        meta = obj["metadata"]
    if api_version and "apiVersion" not in obj:
        obj["apiVersion"] = api_version
    if kind and "kind" not in obj:
        obj["kind"] = kind
    return RawObject(msgspec.json.encode(obj), dict(meta), change=change)


def decode_watch_object(line: bytes, *, drop_managed_fields: bool = False) -> tuple[str, RawObject] | None:
    """``(type, object)`` of a watch event line laid out as API servers write them,
    ``{"type":"…","object":{…}}``, in one pass over the object; None for anything else (another
    layout, an unknown type, an object without metadata, not JSON …), which the caller then decodes
    the long way. (:func:`bridge.watchline.decode_watch_line` is the watch stream's one pass; this
    is its fallback's first step, and reads ``ERROR`` lines too.)"""
    # (Slices and subscripts rather than method calls.)
    body = line if line[-1:] == b"}" else line.rstrip()
    try:
        type_, prefix, n = _EVENT_PREFIXES[body[9:14]]
    except KeyError:
        return None
    if not (body[:n] == prefix and body[-1:] == b"}"):
        return None
    # What lies between the prefix and the final brace is the object only if it is one JSON value:
    # decoding it says so (a member repeated after it, '{…},"object":{…}', is not one).
    raw = body[n:-1]
    try:
        head = head_decoder.decode(raw)
    except DECODE_ERRORS:
        return None
    built = build_from_bytes(raw, head, drop_managed_fields=drop_managed_fields, api_version="",
                             kind="")
    return None if built is None else (type_, built)
