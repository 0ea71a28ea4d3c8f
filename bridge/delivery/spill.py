"""A listener's durable overflow: an append-only segment log of notifications on disk.

When a sink falls behind by more than its in-memory budget (its listener's ``buffer_capacity``), the
listener appends the rest of its backlog here and reads it back in order once the sink catches up
(:class:`bridge.informer.listener.ProcessorListener`). A long outage of one sink costs disk, not
memory, and never holds back the informer or the other sinks.

Format, chosen for speed: numbered segment files (``00000000000000000001.seg`` …) of records
``<length u32><crc32 u32><payload>``, payload a msgpack tuple of every field of the
:class:`~bridge.contracts.Notification` (its ``time`` included: a sink stamps a delete or a marker
with it, and must stamp the one it spilled as every other sink does), each object with the
:class:`~bridge.rawobject.Change` read before its managedFields were cut (the event's ``time`` and
attribution; it is not in the object's bytes). Appends go to the newest segment
(a new one once it passes ``segment_bytes``); reads are sequential from the oldest one, which is
deleted as soon as it has been read to its end. Writes are fsynced in groups (every ``sync_bytes``
appended, and on :meth:`SegmentSpill.sync`), not per record.

``limit_bytes`` bounds the bytes on disk: an append that would pass it is refused (``append``
returns False) and the listener degrades in its declared way (latest state per object, framed by a
gap marker). A record whose checksum does not match (a torn write, a file damaged or cut short on
disk) ends the readable part: what follows it is dropped with an ERROR and counted in
:attr:`SegmentSpill.corrupt`, and the listener reading it announces the loss (a gap window) and asks
for a snapshot that makes its sink exact again (:class:`bridge.informer.listener.ProcessorListener`).

``prepare`` (the sink's :attr:`~sinks.contract.DeliveryOptions.spill_form`, bound to the
informer's resource) turns each object into what the spill may keep before it is written: a sink
that redacts never has a Secret's values on disk (sinks/redaction.py, ``Redactor.spill_form``).

A spill is per process run: it is created empty (any files left in its directory by an earlier run
are removed, because the checkpoint, held back by what was not acknowledged, re-sends them). So no
record is ever read by another process or version, and the record form can change between versions
without a reader of the old one.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

from bridge.contracts import (
    DeletedFinalStateUnknown,
    Gap,
    KubeObject,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.rawobject import Change, RawObject

__all__ = ["SegmentSpill", "decode_notification", "encode_notification"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_SUFFIX = ".seg"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
_json = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()
_KINDS = {k.value: k for k in NotificationKind}


Prepare = Callable[[KubeObject], KubeObject]
"""What a spill keeps of an object (its redacted form)."""


def _same(obj: KubeObject) -> KubeObject:
    return obj


def _obj(obj: KubeObject | None, prepare: Prepare = _same) -> Any:
    if obj is None:
        return None
    # The change read before managedFields were cut is not in the bytes: it is kept beside them.
    change = obj.change if type(obj) is RawObject else None
    obj = prepare(obj)
    if type(obj) is RawObject:
        return ("r", obj.raw, change)
    return ("j", _json.encode(obj), change)


def _unobj(value: Any) -> KubeObject:
    tag, data, change = value
    if change is not None:
        # A RawObject's spill form (a redacted copy) comes back as one, with the change it had.
        return RawObject(bytes(data), change=Change(*change))
    if tag == "r":
        return RawObject(bytes(data))
    decoded: dict[str, Any] = _json_decoder.decode(data)
    return decoded


def encode_notification(n: Notification, prepare: Prepare = _same) -> bytes:
    """One notification as bytes (what a spill record holds), each object as ``prepare`` makes it."""
    if isinstance(n.obj, DeletedFinalStateUnknown):
        obj: Any = ("g" if isinstance(n.obj, UnconfirmedGone) else "t", str(n.obj.key),
                    _obj(n.obj.obj, prepare))
    else:
        obj = _obj(n.obj, prepare) if type(n.obj) is RawObject or n.obj else None
    gap = None if n.gap is None else (n.gap.id, n.gap.from_resource_version,
                                      n.gap.to_resource_version, n.gap.end)
    snapshot = None if n.snapshot is None else [_obj(o, prepare) for o in n.snapshot]
    return _encoder.encode((n.kind.value, obj, _obj(n.old, prepare), n.is_in_initial_list, n.is_resync,
                            n.seq, str(n.key), snapshot, n.resource_version, gap, n.time))


def decode_notification(data: bytes) -> Notification:
    """The notification :func:`encode_notification` wrote."""
    kind, obj, old, initial, resync, seq, key, snapshot, rv, gap, time = _decoder.decode(data)
    value: KubeObject | DeletedFinalStateUnknown
    if obj is None:
        value = {}
    elif obj[0] == "t":
        value = DeletedFinalStateUnknown(key=ObjectKey(obj[1]), obj=_unobj(obj[2]))
    elif obj[0] == "g":
        value = UnconfirmedGone(key=ObjectKey(obj[1]), obj=_unobj(obj[2]))
    else:
        value = _unobj(obj)
    return Notification(
        kind=_KINDS[kind], obj=value, old=None if old is None else _unobj(old),
        is_in_initial_list=initial, is_resync=resync, seq=seq, key=ObjectKey(key),
        snapshot=None if snapshot is None else [_unobj(o) for o in snapshot],
        resource_version=rv,
        gap=None if gap is None else Gap(id=gap[0], from_resource_version=gap[1],
                                         to_resource_version=gap[2], end=gap[3]),
        time=time,
    )


class SegmentSpill:
    """A bounded, ordered queue of notifications in segment files under ``directory`` (module docs).

    Implements :class:`bridge.contracts.NotificationSpill`. Single-threaded (the event loop); the file
    operations are small sequential writes and reads, done inline."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        limit_bytes: int,
        segment_bytes: int = 8 << 20,
        sync_bytes: int = 1 << 20,
        name: str = "",
        prepare: Prepare | None = None,
    ) -> None:
        if limit_bytes < 1:
            raise ValueError(f"spill limit_bytes must be >= 1, got {limit_bytes}")
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        # At least four segments fit under the limit, so reading frees room while the sink catches up.
        self.segment_bytes = max(1, min(segment_bytes, limit_bytes // 4))
        self.sync_bytes = sync_bytes
        self.name = name or str(directory)
        self._prepare = prepare or _same
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segments: dict[int, int] = {}
        """Segment number → its bytes, oldest first; the last one is written to."""
        self._next_segment = 1
        self._writer: IO[bytes] | None = None
        self._reader: IO[bytes] | None = None
        self._reading: int = 0
        self._count = 0
        self._bytes = 0
        self._unsynced = 0
        self.appended = 0
        """Records written since creation."""
        self.refused = 0
        """Appends refused because the spill was full."""
        self.corrupt = 0
        """Records lost to a checksum mismatch."""
        self.syncs = 0

    # ---------------------------------------------------------------------------------------------
    # NotificationSpill

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def append(self, notification: Notification) -> bool:
        payload = encode_notification(notification, self._prepare)
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        if self._bytes + len(record) > self.limit_bytes:
            self.refused += 1
            return False
        writer = self._writer
        if writer is None or self._segments[self._next_segment - 1] >= self.segment_bytes:
            writer = self._rotate()
        writer.write(record)
        self._segments[self._next_segment - 1] += len(record)
        self._bytes += len(record)
        self._count += 1
        self.appended += 1
        self._unsynced += len(record)
        if self._unsynced >= self.sync_bytes:
            self.sync()
        return True

    def read(self, limit: int) -> list[Notification]:
        out: list[Notification] = []
        while len(out) < limit and self._count:
            reader = self._open_reader()
            header = reader.read(_HEADER.size)
            if len(header) < _HEADER.size:
                if not self._finish_segment():
                    break
                continue
            length, crc = _HEADER.unpack(header)
            payload = reader.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                self._lose_rest()
                break
            self._count -= 1
            out.append(decode_notification(payload))
        if not self._count and self._segments:
            self._empty()
        return out

    def clear(self) -> None:
        self._empty()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _empty(self) -> None:
        """Everything was read (or is discarded): the segments go, the next append starts anew."""
        self._close_files()
        for number in self._segments:
            self._path(number).unlink(missing_ok=True)
        self._segments.clear()
        self._count = 0
        self._bytes = 0
        self._unsynced = 0

    # ---------------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Makes every record appended so far durable (flush + fsync)."""
        if self._writer is not None and self._unsynced:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self.syncs += 1
        self._unsynced = 0

    def close(self) -> None:
        """Closes the files, keeping them on disk."""
        self.sync()
        self._close_files()

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:020d}{_SUFFIX}"

    def _rotate(self) -> IO[bytes]:
        if self._writer is not None:
            self.sync()
            self._writer.close()
            self._writer = None
        number = self._next_segment
        self._next_segment += 1
        self._segments[number] = 0
        self._writer = open(self._path(number), "ab")  # noqa: SIM115 - kept open across calls
        return self._writer

    def _open_reader(self) -> IO[bytes]:
        number = next(iter(self._segments))
        if self._writer is not None and len(self._segments) == 1:
            self._writer.flush()  # the records read next may still sit in the write buffer
        if self._reader is None or self._reading != number:
            if self._reader is not None:
                self._reader.close()
            self._reader = open(self._path(number), "rb")  # noqa: SIM115 - kept open across calls
            self._reading = number
        return self._reader

    def _finish_segment(self) -> bool:
        """At the end of the oldest segment: deletes it unless it is still written to."""
        if len(self._segments) == 1:
            return False  # the write segment: more may come
        assert self._reader is not None
        self._reader.close()
        self._reader = None
        number = next(iter(self._segments))
        self._path(number).unlink(missing_ok=True)
        self._bytes -= self._segments.pop(number)
        return True

    def _lose_rest(self) -> None:
        log.error("spill %s: a damaged record in %s; the %d records after it are lost",
                  self.name, self._path(next(iter(self._segments))).name, self._count)
        self.corrupt += self._count
        self._empty()

    def _close_files(self) -> None:
        for f in (self._reader, self._writer):
            if f is not None:
                f.close()
        self._reader = None
        self._writer = None
