"""The known-object journal's records and their encoding (the journal itself: :mod:`bridge.delivery.journal`).

Each record is the newest durable fact about one uid (:data:`JournalEntry`), or the first list of a
start without a checkpoint (:class:`ListStart`). The text, the same in every backend: a header line
``{"journal": 1, "informer_id": …}``, then one JSON array per line:

* ``["a", key, uid, rv]``: :class:`Exists`;
* ``["r", key, uid, rv, since, added]`` and ``["r", key, uid, rv, since, added, [[since, rv, added], …]]``:
  :class:`Relisted` (the earlier relists' windows of the uid written only when there are any);
* ``["d", key, uid, rv, inferred]``, ``["d", key, uid, rv, inferred, held_after]`` and
  ``["d", key, uid, rv, inferred, held_after, sent_before]``: :class:`Deleted` (the optional fields
  written only when set);
* ``["o", key, uid, rv, sink, since, type]``: :class:`Overflowed` (one sink's, beside the uid's
  newest fact);
* ``["l", rv, acknowledged]``: :class:`ListStart`, before the first checkpoint write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from bridge.resource_version import is_rv

__all__ = [
    "Deleted",
    "Exists",
    "JournalEntry",
    "ListStart",
    "Overflowed",
    "RelistWindow",
    "Relisted",
    "check_header",
    "decode_line",
    "encode_header",
    "encode_record",
    "encode_start",
    "entries_by_key",
]

VERSION = 1


@dataclass(frozen=True, slots=True)
class Exists:
    """Sinks may hold the object (``["a", key, uid, rv]``): its first event went out after the last
    checkpoint write (or the object was known only to the journal)."""

    key: str
    resource_version: str


RelistWindow = tuple[str, str, bool]
"""One relist's window of one uid: (its gap's ``from``, the state it sent, sent as ``added``)."""


@dataclass(frozen=True, slots=True)
class Relisted:
    """A relist sent the object's state inside its gap (``["r", key, uid, rv, since, added(, earlier)]``)."""

    key: str
    resource_version: str
    since: str
    """The gap's ``from``, the last resourceVersion observed one by one. The changes after it and
    before :attr:`resource_version` were coalesced and never sent; a watch a restart resumes from a
    checkpoint older than the relist replays them, and they must not go out after the newer state
    sinks may hold (:meth:`~bridge.delivery.replay.ReplayStage.relisted`). Kept until the checkpoint
    covers that state."""
    added: bool
    """The relist sent it as ``added`` (else ``updated``): re-sent with the same type, the same id."""
    earlier: tuple[RelistWindow, ...] = ()
    """The windows of earlier relists that sent a state of the uid before a checkpoint covered them,
    oldest first, each ending before this one begins: the changes the watch showed one by one between
    two of them were sent one by one, and a replay sends them again (:meth:`windows`)."""

    def windows(self) -> tuple[RelistWindow, ...]:
        """Every relist window of the uid, oldest first, disjoint."""
        return (*self.earlier, (self.since, self.resource_version, self.added))

    def after(self, since: str, rv: str, *, added: bool) -> Relisted:
        """The record once another relist (gap from ``since``) sent the uid's state ``rv``: this
        record's windows that end after ``since`` merge into the new one (its coalesced changes start
        at the oldest of their beginnings), the others stay as they were."""
        windows = list(self.windows())
        start = int(since)
        while windows and int(windows[-1][1]) > start:
            start = min(start, int(windows.pop()[0]))
        return Relisted(self.key, rv, str(start), added=added, earlier=tuple(windows))


@dataclass(frozen=True, slots=True)
class Deleted:
    """Sinks may hold the uid's delete (``["d", key, uid, rv, inferred(, held_after(, sent_before))]``)."""

    key: str
    resource_version: str
    inferred: bool = False
    """A relist inferred it (sent with ``finalstateunknown``)."""
    held_after: str = ""
    """For a delete a restarted bridge sent after an earlier, inferred delete of the same uid: the
    state that inferred delete carried, after which the uid's changes were never sent one by one, so
    a replay after another restart keeps holding them back
    (:meth:`~bridge.delivery.replay.ReplayStage.held_back`); for a delete of an object a relist had
    sent: that relist's ``from``."""
    sent_before: str = ""
    """For a delete a relist inferred: that relist's list resourceVersion (its gap's end), no older
    than the real delete. A checkpoint older than it may no longer hold the object, yet a watch
    resumed from it replays the changes the relist coalesced, which only this record holds back: the
    record is kept until the checkpoint reaches this point (recorded once the relist's end is
    dispatched; until then, kept)."""


JournalEntry = Exists | Relisted | Deleted
"""The newest durable fact about one uid."""


@dataclass(frozen=True, slots=True)
class Overflowed:
    """A state one sink's overflow window handed over (``["o", key, uid, rv, sink, since, type]``):
    that sink may hold it, and the uid's changes after ``since`` (the window's ``gapfrom``) and
    before it never went to that sink one by one. A restart's replay holds those back for that sink
    and sends it the state again as it went, framed by a window of its own
    (:meth:`~bridge.delivery.replay.ReplayStage.overflowed`); a delete as a delete already sent,
    held back from ``since``. Kept until the checkpoint covers the state."""

    key: str
    resource_version: str
    sink: str
    since: str
    type: str
    """``added``, ``updated`` or ``deleted``: as the window sent it (the same type, the same id)."""


@dataclass(frozen=True, slots=True)
class ListStart:
    """The first list of an informer that started without a checkpoint: its resourceVersion, and
    whether every sink has acknowledged everything up to a resume point (:attr:`resource_version`,
    then the first one the acknowledgements reached). Kept until a checkpoint is written; a crash
    before that resumes from it (the resume plan, :mod:`bridge.delivery.resume_plan`)."""

    resource_version: str
    acknowledged: bool = False


def encode_header(informer_id: str) -> bytes:
    return orjson.dumps({"journal": VERSION, "informer_id": informer_id})


def check_header(line: bytes, informer_id: str) -> None:
    """Raises ValueError unless ``line`` is the header of ``informer_id``'s journal."""
    head = orjson.loads(line)
    if not isinstance(head, dict) or head.get("journal") != VERSION or head.get("informer_id") != informer_id:
        raise ValueError(f"header {line[:200]!r} is not this informer's journal")


def encode_record(uid: str, e: JournalEntry | Overflowed) -> bytes:
    if isinstance(e, Overflowed):
        return orjson.dumps(["o", e.key, uid, e.resource_version, e.sink, e.since, e.type])
    if isinstance(e, Relisted):
        record: list[object] = ["r", e.key, uid, e.resource_version, e.since, e.added]
        if e.earlier:
            record.append([list(w) for w in e.earlier])
        return orjson.dumps(record)
    if isinstance(e, Deleted):
        tail = [e.held_after, e.sent_before] if e.sent_before else [e.held_after] if e.held_after else []
        return orjson.dumps(["d", e.key, uid, e.resource_version, e.inferred, *tail])
    return orjson.dumps(["a", e.key, uid, e.resource_version])


def encode_start(start: ListStart) -> bytes:
    return orjson.dumps(["l", start.resource_version, start.acknowledged])


_OVERFLOW_TYPES = frozenset({"added", "updated", "deleted"})


def decode_line(line: bytes) -> tuple[str, JournalEntry | Overflowed] | ListStart:
    """One record line: (uid, fact), or the first list's record. Raises ValueError, TypeError or
    IndexError for a line that is not a record."""
    rec = orjson.loads(line)
    if line.startswith(b'["l"'):
        if not (len(rec) == 3 and is_rv(rec[1]) and isinstance(rec[2], bool)):
            raise ValueError(f"unknown record {rec!r}")
        return ListStart(rec[1], acknowledged=rec[2])
    op, key, uid, rv = rec[0], rec[1], rec[2], rec[3]
    if not (isinstance(key, str) and key and isinstance(uid, str) and uid):
        raise ValueError("a record without key or uid")
    if not is_rv(rv):
        raise ValueError(f"resourceVersion {rv!r} is not a resourceVersion")
    if op == "a" and len(rec) == 4:
        return uid, Exists(key, rv)
    if op == "r" and len(rec) in (6, 7) and is_rv(rec[4]) and isinstance(rec[5], bool):
        return uid, Relisted(key, rv, rec[4], added=rec[5], earlier=_windows(rec[6]) if len(rec) == 7 else ())
    if (op == "o" and len(rec) == 7 and isinstance(rec[4], str) and rec[4] and is_rv(rec[5])
            and rec[6] in _OVERFLOW_TYPES):
        return uid, Overflowed(key, rv, rec[4], rec[5], rec[6])
    if op == "d" and 5 <= len(rec) <= 7 and isinstance(rec[4], bool):
        held, before = [*rec[5:], "", ""][:2]  # each optional, and held_after "" only before sent_before
        if not (((held == "" and len(rec) != 6) or is_rv(held)) and (len(rec) < 7 or is_rv(before))):
            raise ValueError(f"unknown record {rec!r}")
        return uid, Deleted(key, rv, inferred=rec[4], held_after=held, sent_before=before)
    raise ValueError(f"unknown record {rec!r}")


def _windows(value: object) -> tuple[RelistWindow, ...]:
    """A record's earlier relist windows ([[since, rv, added], …], oldest first)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"earlier relist windows {value!r} are not a list of windows")
    out: list[RelistWindow] = []
    for w in value:
        if not (isinstance(w, list) and len(w) == 3 and is_rv(w[0]) and is_rv(w[1])
                and isinstance(w[2], bool)):
            raise ValueError(f"earlier relist window {w!r} is not one")
        out.append((w[0], w[1], w[2]))
    return tuple(out)


def entries_by_key(entries: Mapping[str, JournalEntry]) -> dict[str, list[tuple[str, JournalEntry]]]:
    """key → [(uid, entry)], oldest resourceVersion first."""
    out: dict[str, list[tuple[str, JournalEntry]]] = {}
    for uid, e in entries.items():
        out.setdefault(e.key, []).append((uid, e))
    for items in out.values():
        items.sort(key=lambda item: int(item[1].resource_version))
    return out
