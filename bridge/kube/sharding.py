"""Which shard owns an object, and keeping the others' objects out at the cheapest place: decoding.

With sharding *by object* (docs/sharding.md) every shard watches the whole resource and keeps the
objects whose uid hashes to its ordinal, as kube-state-metrics does::

    shard_of(uid, total) = int.from_bytes(blake2b(uid, digest_size=8), "big") % total

A stable hash (the same in every process, every Python, every restart): never Python's ``hash()``.

:class:`ShardFilter` is what a :class:`~bridge.kube.listwatch.HttpListerWatcher` is given: a watch
line of an object it does not own is recognised from its identity alone (one msgspec pass reading
``type``, ``metadata.uid`` and ``metadata.resourceVersion``, skipping the rest unbuilt) and becomes a
bookmark at its resourceVersion, so the reflector's resume point still moves while nothing of the
object is cached, tracked, journalled or delivered; a run of such lines in one read of the stream
becomes one bookmark, at the last one's resourceVersion (what the queue makes of consecutive
progress markers anyway); a list item not owned is dropped before it is decoded. Deletes follow the
same rule (a delete carries the object's uid).

*Floors* serve resharding (:mod:`bridge.delivery.sharding`): after a handover a shard resumes the
watch from the oldest resume point of the checkpoints it took objects from, and a watch event of an
object whose previous owner had already acknowledged it (its resourceVersion at or below that owner's
checkpoint) is skipped like a foreign one. Floors apply to watch events only: a list is the state at
one resourceVersion, every owned item of it counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

import msgspec

from bridge.contracts import WatchEvent, WatchEventType

__all__ = ["ShardFilter", "shard_of", "shard_residue", "sharded_decoder", "skipped_bookmark"]


def _digest(uid: str) -> int:
    return int.from_bytes(blake2b(uid.encode(), digest_size=8).digest(), "big")


def shard_of(uid: str, total: int) -> int:
    """The shard (0 … total-1) that owns the object with this uid."""
    if total <= 1:
        return 0
    return _digest(uid) % total


def shard_residue(uid: str, modulus: int) -> int:
    """The uid's hash modulo ``modulus``. For every ``total`` dividing ``modulus``,
    ``shard_residue(uid, modulus) % total == shard_of(uid, total)``: resharding reasons over residues
    modulo the least common multiple of the totals involved."""
    return _digest(uid) % modulus


class _Meta(msgspec.Struct):
    uid: str | None = ""
    resourceVersion: str | None = ""


class _Obj(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _IdentEvent(msgspec.Struct):
    type: str = ""
    object: _Obj = msgspec.field(default_factory=_Obj)


_ident_event = msgspec.json.Decoder(_IdentEvent)
_STR = rb'"[^"\\\x00-\x1f]*"'
_API_LAYOUT = re.compile(
    rb'\{"type":"(?:ADDED|MODIFIED|DELETED)","object":\{(?:' + _STR + b":" + _STR + rb',)*"metadata":\{(?:'
    + _STR + b":" + _STR + rb',)*"uid":"([^"\\\x00-\x1f]*)","resourceVersion":"([^"\\\x00-\x1f]*)"[,}]'
)
"""The start of a watch line of an object as API servers lay it out: every member before
``metadata.uid`` and ``metadata.resourceVersion`` a plain string (no escapes, no nesting), so that
what matches is the event's type and the object's own metadata, nothing nested; ADDED, MODIFIED
and DELETED only."""
_API_LAYOUT_WINDOW = 384
"""Where the uid is looked for first: a line whose uid lies further takes the msgspec pass."""
_ident_obj = msgspec.json.Decoder(_Obj)
_PASS_THROUGH = frozenset({"BOOKMARK", "ERROR"})


class ShardFilter:
    """Ownership of one shard by object: ``ordinal`` of ``total``, with optional floors."""

    __slots__ = ("_floor_modulus", "_floors", "ordinal", "skipped", "total")

    def __init__(self, *, ordinal: int, total: int) -> None:
        if total < 1 or not 0 <= ordinal < total:
            raise ValueError(f"shard {ordinal} of {total} does not exist")
        self.ordinal = ordinal
        self.total = total
        self._floor_modulus = 0
        self._floors: Sequence[int] = ()
        self.skipped = 0
        """Watch events and list items of objects this shard does not own (or already had)."""

    def __repr__(self) -> str:
        return f"ShardFilter(shard {self.ordinal} of {self.total})"

    @property
    def suffix(self) -> str:
        """What this shard adds to an informer id: ``shard-2-of-3``."""
        return f"shard-{self.ordinal}-of-{self.total}"

    @property
    def filtering(self) -> bool:
        """Whether anything is to be filtered: more than one shard, or floors after a take-over (a
        shard of 1 without floors keeps everything, and the decode step skips the identity pass)."""
        return self.total > 1 or bool(self._floor_modulus)

    def owns(self, uid: str) -> bool:
        """Whether this shard owns the object (an object without uid belongs to shard 0)."""
        if not uid:
            return self.ordinal == 0
        return shard_of(uid, self.total) == self.ordinal

    def set_floors(self, modulus: int, floors: Mapping[int, int]) -> None:
        """After a handover: a watch event of an owned object whose uid has residue ``r`` modulo
        ``modulus`` and whose resourceVersion is at most ``floors[r]`` was already delivered by the
        shard that owned it before; it is skipped. ``modulus`` must be a multiple of ``total``."""
        if modulus % self.total:
            raise ValueError(f"floor modulus {modulus} is not a multiple of {self.total}")
        table = [0] * modulus
        for r, rv in floors.items():
            table[r] = rv
        self._floor_modulus = modulus if any(table) else 0
        self._floors = table

    def keeps_event(self, uid: str, resource_version: str) -> bool:
        """Whether a watch event of this object is this shard's to apply."""
        if not uid:
            return self.ordinal == 0
        digest = _digest(uid)
        if digest % self.total != self.ordinal:
            return False
        return not (self._floor_modulus and self._below_floor(digest, resource_version))

    def skip_line(self, line: bytes) -> str | None:
        """The resourceVersion of a watch line of an object this shard does not keep (``""`` when
        it has none), counted in :attr:`skipped`; None for a line to decode: an object it keeps, a
        bookmark, an error, a line the identity pass cannot read (the full decoder reports it), or
        any line when nothing is filtered.

        A line laid out as an API server writes it (Go's field order: the event's type, the
        object's kind and apiVersion, then metadata's name, generateName, namespace, uid and
        resourceVersion, all plain strings), its uid within the first :data:`_API_LAYOUT_WINDOW`
        bytes, is read from its first bytes by :data:`_API_LAYOUT`;
        any other line by one msgspec pass over all of it (type, uid and resourceVersion, the rest
        skipped unbuilt). The first way does not read the rest of the line: a line of another
        shard's object is skipped whatever follows its resourceVersion (the change is not this
        shard's, and its resourceVersion is the one the stream reached)."""
        if self.total == 1 and not self._floor_modulus:
            return None
        # In that layout the uid comes within the first few hundred bytes (names of usual lengths),
        # after three braces (the line's, the object's, its metadata's): a line laid out otherwise
        # is told by one or two bounded searches, before the pattern's slower failure.
        at = line.find(b'"uid":"', 0, _API_LAYOUT_WINDOW)
        m = _API_LAYOUT.match(line) if at > 0 and line.count(b"{", 0, at) == 3 else None
        if m is not None:
            try:
                uid, rv = m[1].decode(), m[2].decode()
            except UnicodeDecodeError:
                return None
        else:
            try:
                head = _ident_event.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                return None
            if head.type in _PASS_THROUGH:
                return None
            meta = head.object.metadata
            uid, rv = meta.uid or "", meta.resourceVersion or ""
        # keeps_event inline (one call less per line of another shard).
        if uid:
            digest = int.from_bytes(blake2b(uid.encode(), digest_size=8).digest(), "big")
            if digest % self.total == self.ordinal and not (
                    self._floor_modulus and self._below_floor(digest, rv)):
                return None
        elif self.ordinal == 0:
            return None
        self.skipped += 1
        return rv

    def _below_floor(self, digest: int, resource_version: str) -> bool:
        floor = self._floors[digest % self._floor_modulus]
        return (bool(floor) and resource_version.isascii() and resource_version.isdigit()
                and int(resource_version) <= floor)

    def keeps_item(self, raw: bytes | msgspec.Raw) -> bool:
        """Whether a list item (its undecoded bytes) is this shard's: only its uid is read."""
        if self.total == 1:
            return True
        try:
            uid = _ident_obj.decode(raw).metadata.uid or ""
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return True  # let the full decoder report what is wrong with it
        if self.owns(uid):
            return True
        self.skipped += 1
        return False


def skipped_bookmark(resource_version: str) -> WatchEvent:
    """The bookmark a skipped line (or a run of them) becomes: the reflector's resume point moves to
    its resourceVersion, nothing else happens."""
    obj: dict[str, Any] = {"metadata": {"resourceVersion": resource_version}}
    return WatchEvent(type=WatchEventType.BOOKMARK, object=obj)


Decoder = Callable[[bytes], WatchEvent]


def sharded_decoder(decode: Decoder, shard: ShardFilter) -> Decoder:
    """Wraps a watch-line decoder: a line of an object ``shard`` does not keep becomes a bookmark at
    its resourceVersion, decoded no further; bookmarks, errors and owned objects go to ``decode``.
    A line the identity pass cannot read goes to ``decode`` too, which reports it. (A watch stream
    of :class:`~bridge.kube.listwatch.HttpListerWatcher` does the same a batch at a time, with one
    bookmark per run of skipped lines: :meth:`ShardFilter.skip_line`.)"""

    def decode_line(line: bytes) -> WatchEvent:
        rv = shard.skip_line(line)
        return decode(line) if rv is None else skipped_bookmark(rv)

    return decode_line
