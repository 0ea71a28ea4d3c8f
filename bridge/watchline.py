"""A watch line, or a List item, into a :class:`~bridge.rawobject_type.RawObject` in one msgspec pass.

This is the common case of every watch event (:func:`bridge.kube.watchdecode.raw_object_decoder`)
and of every List item (:func:`decode_object_bytes`, from :func:`bridge.kube.listdecode.list_page`,
which also writes in the resource's ``apiVersion`` and ``kind`` the items lack):
a line as API servers write it, ``{"type":"ADDED","object":{…}}``. The event type is read from the
line's fixed prefix (a slice and a table look-up), the object's bytes are the rest of the line but
its closing brace, and one msgspec pass over those bytes reads the metadata facts (name, namespace,
uid, resourceVersion, and the span of ``managedFields``) while proving that they are exactly one
JSON object. When the object has managedFields, their newest entry (:attr:`RawObject.change`) is
read by a second, small pass over those bytes alone (msgspec cannot give both a value's span and
its decoded entries, and the cut needs the span), and the member is cut out of the bytes where the
informer drops them.

:func:`decode_watch_line` declines (returns None) whatever it cannot prove it decodes exactly as the
plain path does (:func:`bridge.rawobject_decode.decode_watch_object`, then the long way in
:mod:`bridge.kube.watchdecode`), which the caller then takes: ``ERROR`` events (their Status is
decoded whole), unknown types, another layout of the line (whitespace around the object or the
members, other member order, duplicate ``type`` / ``object`` members, escaped keys in the line's
prefix), an object whose top level or metadata identity is not typed as Kubernetes writes it (a
non-string name or apiVersion, no metadata mapping; managedFields that are not a list of entries
are taken, with no newest entry, as the plain path takes them), and, where managedFields
are cut, any layout in which the cut is not provably the metadata's own member as the plain path
would cut it (:func:`_cut_managed_fields`: the value's bytes occurring twice in the object, its key
written other than ``"managedFields":`` right before it or not the first of that name, members after
it in the metadata that are not flat scalars or name it again, the metadata key written other than
``"metadata":{`` or after a nested member). The caller checks the bounds (depth, size) and UTF-8
first: nothing beyond them reaches this module.

Invariants: a RawObject returned here equals, slot for slot (but for the caches of what it decodes
later), the one the plain path builds for the same line or item (held by ``tests/test_watchline.py``
and ``tests/api/test_list_one_pass.py`` over generated lines and List bodies), its bytes are one
JSON object (the pass proves it), and every slot of the type is filled (both builds end in
:func:`~bridge.rawobject_type.assemble`, which does not call ``__init__``).

What it costs (the thread CPU time of 2,000 simulator Pod lines, both paths in one run): with
managedFields kept, about 15 % less than the plain path (7.5 against 8.8 µs); with them cut (the
service's compact cache) about the same (10.8 µs), since proving the cut exact takes a count over
the object's bytes, which costs what the plain path's second pass over the metadata does. Python
calls of the decode: four per event instead of seven (``bench.bench_calls``).
"""

from __future__ import annotations

import msgspec
import orjson

from bridge.contracts import WatchEventType
from bridge.managed_fields import MF_KEY, decode_entries, newest_change
from bridge.rawobject_type import DECODE_ERRORS, Ident, RawObject, assemble

__all__ = ["NO_FILL", "TypeFill", "decode_object_bytes", "decode_watch_line", "type_fill"]


class _Object(msgspec.Struct):
    """An object's top level: its metadata facts (managedFields as their span). ``apiVersion`` and
    ``kind`` are read so that an object the plain path does not take as laid out (a non-string one)
    is declined here too, and so that a List item lacking them gets them written in."""

    metadata: Ident
    apiVersion: str | None = None
    kind: str | None = None


_decode_object = msgspec.json.Decoder(_Object).decode

_HEADS: dict[bytes, tuple[bytes, int, WatchEventType]] = {}
"""The line's prefix of each object event type, keyed by the five bytes after ``{"type":"``."""
for _type in (WatchEventType.ADDED, WatchEventType.MODIFIED, WatchEventType.DELETED, WatchEventType.BOOKMARK):
    _prefix = b'{"type":"' + _type.value.encode() + b'","object":'
    _HEADS[_prefix[9:14]] = (_prefix, len(_prefix), _type)

_MF_QUOTED = MF_KEY[:-1]
"""``"managedFields"``: any key of that name written literally, whatever follows it."""
_META_KEY = b'"metadata":'
_NEEDLE = 128
"""How many of the managedFields value's first bytes are counted in the object
(:func:`_cut_managed_fields`): the count over a 4.6 KB simulator Pod takes 1.0 µs at 128 bytes, 1.5
at 32, 3.6 for the whole value (840 bytes), whose search then needs its preprocessing."""
_OPENERS = (b"{", b",")

TypeFill = tuple[bytes, bytes, bytes]
"""What is written right after the opening brace of an object that lacks its ``apiVersion`` and
``kind`` (both, the first, the second), as the plain path writes it in (:func:`type_fill`)."""
NO_FILL: TypeFill = (b"", b"", b"")
"""Nothing written in: the objects of watch lines describe themselves."""


def type_fill(api_version: str, kind: str) -> TypeFill:
    """The :data:`TypeFill` of a resource's ``api_version`` and ``kind`` (items of a List carry
    neither on the wire); an empty one is not written in."""
    api = b'"apiVersion":' + orjson.dumps(api_version) + b"," if api_version else b""
    kind_ = b'"kind":' + orjson.dumps(kind) + b"," if kind else b""
    return api + kind_, api, kind_


def decode_watch_line(line: bytes, drop_managed_fields: bool) -> tuple[WatchEventType, RawObject] | None:
    """``(type, object)`` of a watch line as API servers write it, in one pass; None for what the
    plain path must decode (see the module docstring). ``line`` is UTF-8 and within the bounds."""
    # (Slices, subscripts and operators rather than calls: this runs for every watch event.)
    key = line[9:14]
    if key not in _HEADS:
        return None
    prefix, n, kind = _HEADS[key]
    raw = line[n:-1]
    if line[:n] != prefix or line[-1:] != b"}":
        return None
    obj = decode_object_bytes(raw, drop_managed_fields, NO_FILL)
    return None if obj is None else (kind, obj)


def decode_object_bytes(raw: bytes, drop_managed_fields: bool, fill: TypeFill) -> RawObject | None:
    """The RawObject of an object's JSON laid out as API servers write it (a watch line's object, a
    List item), in one pass, with ``fill`` written in where it lacks ``apiVersion`` / ``kind``; None
    for what the plain path (:func:`~bridge.rawobject_decode.decode_object`) must decode. ``raw``
    is UTF-8 and within the bounds."""
    if raw[:1] != b"{" or raw[-1:] != b"}":
        return None
    try:
        top = _decode_object(raw)
    except DECODE_ERRORS:
        return None  # not exactly one object typed as Kubernetes writes it: the plain path says what
    meta = top.metadata
    mf = meta.managedFields
    has_mf = False
    change = None
    if mf:
        has_mf = True
        try:
            change = newest_change(decode_entries(mf))
        except msgspec.DecodeError:
            change = None  # not a list of entries: no attribution, the object itself is kept
        if drop_managed_fields:
            cut = _cut_managed_fields(raw, mf)
            if cut is None:
                return None
            raw = cut
            has_mf = False
    if top.apiVersion is None:
        written = fill[0] if top.kind is None else fill[1]
    else:
        written = fill[2] if top.kind is None else b""
    if written:
        raw = b"{" + written + raw[1:]
    return assemble(raw, meta, has_mf, change)


def _cut_managed_fields(raw: bytes, mf: msgspec.Raw) -> bytes | None:
    """``raw`` without its metadata's managedFields member, whose value's bytes are ``mf``; None
    where the cut is not provably that member, or the plain path would not cut it so.

    The cut is exact where the value's bytes occur once in the object: that occurrence is then the
    decoded metadata's own value (of the last of its managedFields keys, as msgspec reads
    duplicates), so the literal key right before it is that key and the object around it is the
    metadata. Once is counted of the value's first :data:`_NEEDLE` bytes (if they occur once so does
    the value; a count of them is faster than of fewer, or of the whole value). The plain path
    (:func:`~bridge.managed_fields.splice_out_managed_fields`) declines where the metadata holds
    another literal key of that name, at any depth: before this one there is none (it is the first),
    after it the metadata must end in flat members (strings, numbers: API servers write
    managedFields last, the simulator a few scalars after them) without one. Its metadata key is
    checked as the plain path finds it.
    """
    k = raw.find(_MF_QUOTED)
    s = k + 16
    e = s + len(mf)
    if (k < 1 or raw[k:s] != MF_KEY or not raw.startswith(mf, s)
            or raw.count(raw[s:s + _NEEDLE] if e - s > _NEEDLE else raw[s:e]) != 1):
        return None
    end = raw.find(b"}", e)
    tail = raw[e:end]
    if tail and (b"{" in tail or b"[" in tail or b"\\" in tail or _MF_QUOTED in tail
                 or tail.count(b'"') % 2):
        return None
    m = raw.find(_META_KEY)
    if end < 0 or m < 0 or raw[m + 11:m + 12] != b"{" or raw.find(b"{", 1, m) >= 0:
        return None
    before = raw[k - 1:k]
    after = raw[e:e + 1]
    if after == b"," and before in _OPENERS:
        return raw[:k] + raw[e + 1:]
    if after == b"}" and before == b",":
        return raw[:k - 1] + raw[e:]
    if after == b"}" and before == b"{":
        return raw[:k] + raw[e:]
    return None
