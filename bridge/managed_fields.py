"""``metadata.managedFields``: who last wrote an object (:class:`Change`), and cutting them out.

The API server records in ``managedFields`` every writer of an object with the time of its last
write; they are often a fifth of the object's JSON and nothing downstream needs them but the newest
entry, which says who made the change an event carries and when. So that entry is read first
(:func:`newest_change`) and kept beside the object, then the member is cut: out of a decoded
object (:func:`dict_without_managed_fields`, a shallow copy) or out of the object's bytes as the API
server wrote them (:func:`splice_out_managed_fields`).

Invariants: nothing here mutates its input; the byte-level cut is exact or declines (None: the
caller decodes and re-encodes), never approximate; a :class:`Change` is shared by every object one
writer wrote in one second (the table of recent ones is bounded). This module imports nothing of the
project: :mod:`bridge.rawobject` builds on it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, overload

import msgspec

__all__ = [
    "MF_KEY",
    "Change",
    "ManagedFieldsEntry",
    "cut_member",
    "decode_entries",
    "dict_without_managed_fields",
    "newest_change",
    "splice_out_managed_fields",
]


class ManagedFieldsEntry(msgspec.Struct):
    """What attribution needs of one ``metadata.managedFields`` entry (``fieldsV1`` is skipped)."""

    manager: str | None = ""
    operation: str | None = ""
    subresource: str | None = ""
    time: str | None = ""


class Change(NamedTuple):
    """The newest ``metadata.managedFields`` entry: who last wrote the object, and when.

    ``time`` is the RFC 3339 timestamp the API server recorded (whole seconds, e.g.
    ``2024-05-01T12:00:00Z``); ``subresource`` is ``""`` for the main resource."""

    manager: str
    operation: str
    subresource: str
    time: str


decode_entries = msgspec.json.Decoder(list[ManagedFieldsEntry]).decode
"""The entries of a ``managedFields`` value's bytes (raises ``msgspec.DecodeError`` for anything else)."""


def newest_change(entries: Iterable[Any]) -> Change | None:
    """The entry with the greatest ``time`` (the last one listed among equals); None without any
    timed entry. RFC 3339 UTC timestamps of one precision compare as strings."""
    best: tuple[Any, Any, Any, str] | None = None
    typed = False
    for e in entries:
        if type(e) is ManagedFieldsEntry:
            manager, operation, subresource, when = e.manager, e.operation, e.subresource, e.time
        elif isinstance(e, Mapping):
            manager, operation = e.get("manager"), e.get("operation")
            subresource, when = e.get("subresource"), e.get("time")
        else:
            continue
        if type(when) is not str and not isinstance(when, str):
            continue
        if when and (best is None or when >= best[3]):
            best = (manager, operation, subresource, when)
            typed = type(e) is ManagedFieldsEntry
    if best is None:
        return None
    # One Change per distinct (writer, second), shared by the objects it wrote then (a look-up per
    # object instead of three interns and a tuple; a busy writer writes many objects a second).
    # Only for decoded entries, whose values are str or None (a plain mapping's could be anything).
    change = _changes.get(best) if typed else None
    if change is None:
        manager, operation, subresource, when = best
        change = Change(_intern(str(manager or "")), _intern(str(operation or "")),
                        _intern(str(subresource or "")), when)
        if typed:
            if len(_changes) >= _MAX_CHANGES:
                _changes.clear()
            _changes[best] = change
    return change


_changes: dict[tuple[Any, Any, Any, str], Change] = {}
"""The Change of each (manager, operation, subresource, time) decoded lately."""
_MAX_CHANGES = 4096


_intern = sys.intern

MF_KEY = b'"managedFields":'
"""The member as the API server writes it (compact JSON: no space after the colon)."""
_MF_KEY_LEN = len(MF_KEY)
_META_KEY = b'"metadata":'
_META_KEY_LEN = len(_META_KEY)


@overload
def dict_without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]: ...


@overload
def dict_without_managed_fields(obj: Mapping[str, Any]) -> Mapping[str, Any]: ...


def dict_without_managed_fields(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A decoded object without ``metadata.managedFields``: ``obj`` itself when it has none, else a
    shallow copy with a copied ``metadata`` (the input is never mutated)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    out = dict(obj)
    out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


def cut_member(obj_raw: bytes, key: bytes, value: bytes) -> bytes | None:
    """``obj_raw`` (a compact JSON object) without the member ``key`` whose value is ``value``."""
    start = 0
    key_len = _MF_KEY_LEN if key is MF_KEY else len(key)
    value_len = len(value)
    while True:
        i = obj_raw.find(key, start)
        if i < 0:
            return None
        j = i + key_len
        end = j + value_len
        if (obj_raw[j:end] == value and obj_raw[i - 1 : i] in (b"{", b",")
                and obj_raw[end : end + 1] in (b",", b"}")):
            if obj_raw[end : end + 1] == b",":
                return obj_raw[:i] + obj_raw[end + 1 :]
            if obj_raw[i - 1 : i] == b",":
                return obj_raw[: i - 1] + obj_raw[end:]
            return obj_raw[:i] + obj_raw[end:]
        start = i + 1


def splice_out_managed_fields(raw: bytes, meta_raw: bytes, managed_fields: bytes) -> list[bytes] | None:
    """The parts that, joined, are ``raw`` without its metadata's ``managedFields`` member: ``raw`` is
    a compact JSON object whose top-level ``metadata`` value's bytes are ``meta_raw``, holding that
    member with the value ``managed_fields``. None when the bytes are not laid out so that the cut is
    exact (the caller then decodes and re-encodes). This runs once per watch event that carries
    managedFields: the search for the metadata is written out here rather than called."""
    cut = cut_member(meta_raw, MF_KEY, managed_fields)
    # Another managedFields member left (a duplicate key, or one nested deeper): not exact.
    if cut is None or MF_KEY in cut:
        return None
    # Where the top-level metadata value starts in raw.
    start = 0
    while True:
        i = raw.find(_META_KEY, start)
        if i < 0:
            return None
        at = i + _META_KEY_LEN
        while raw[at : at + 1] in (b" ", b"\n", b"\t", b"\r"):
            at += 1
        if raw.startswith(meta_raw, at):
            break
        start = i + 1
    # Only objects (no nesting) before it: it is the top-level metadata. Otherwise the same
    # bytes could also sit nested in an earlier member: then they must occur once only.
    if raw.find(b"{", 1, at) >= 0 and raw.find(meta_raw, at + 1) >= 0:
        return None
    return [raw[:at], cut, raw[at + len(meta_raw) :]]
