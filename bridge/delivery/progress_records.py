"""The records of acknowledgement tracking (:mod:`bridge.delivery.progress`): what the acked
index holds per object, what one sink knows of one, what one in-flight notification does to the
index when it is applied, and the ledger's row of one read (the notifications before one progress
marker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from bridge.contracts import (
    DeletedFinalStateUnknown,
    KubeObject,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.rawobject import object_identity
from bridge.rawobject import object_key as raw_object_key
from bridge.resource_version import ResourceVersion, parse_rv

__all__ = ["HOLDS_NOTHING", "AheadEntry", "Effect", "InFlight", "IndexEntry", "Known", "Read", "Scan",
           "effect_of", "entry_of", "object_key"]

IndexEntry = tuple[str, str]
"""``(uid, resourceVersion)`` of one object in the acked index."""

AheadEntry = tuple[str, str, bool]
"""``(uid, resourceVersion, deleted)``: the newest acknowledged change of an object that is newer
than the resume point (checkpointed so a resume does not notify it again)."""


class Known(NamedTuple):
    """What one sink last acknowledged of one object."""

    uid: str
    resource_version: int
    """Its resourceVersion; for a delete, the delete's (-1: unknown, a relist found it gone)."""
    deleted: bool


HOLDS_NOTHING: Final = Known("", -1, True)
"""A sink holds nothing under the key, whatever the cache has there (an object only other sinks
saw, or one the journal names that this sink's own progress says it never received)."""


def object_key(obj: KubeObject | DeletedFinalStateUnknown) -> ObjectKey:
    """``namespace/name`` or ``name`` (client-go's ``MetaNamespaceKeyFunc``); a tombstone's key."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    return ObjectKey(raw_object_key(obj))


def entry_of(obj: KubeObject | DeletedFinalStateUnknown) -> IndexEntry:
    if isinstance(obj, DeletedFinalStateUnknown):
        obj = obj.obj
    return object_identity(obj)


Effect = tuple[str, "IndexEntry | None", "int | None"] | None
"""What applying one notification does to the index: (key, entry or None for a delete, its
resourceVersion as int, -1 for a relist's tombstone, None when not an integer); None = nothing."""


@dataclass(slots=True)
class Read:
    """The ledger's row of one read: the notifications dispatched since the previous progress
    marker (the changes of one read of the watch stream, a relist, a snapshot …), and the marker
    that follows them. **Invariant**: ``owed`` is the number of them some listener still owes; the
    read passes (its marker becomes the resume point) once it is 0, it is closed, and every earlier
    read has passed."""

    owed: int = 0
    end: int = -1
    """The seq of its marker (the first seq after its notifications); -1 while it is open (the
    notifications being dispatched now, no marker yet)."""
    rv: str = ""
    """Its marker's resourceVersion."""
    rv_int: ResourceVersion | None = None
    """The same as an integer (None when it is not one)."""


@dataclass(slots=True)
class InFlight:
    effect: Effect
    """Never the objects: a sink down for long keeps a large window, a few dozen bytes per change."""
    waiting: set[str]
    time: float
    """When it was dispatched (the tracker's ``now``), for the age of what a sink still owes."""
    read: Read
    """The read it belongs to (whose countdown it is part of while someone owes it)."""
    deleted: IndexEntry = ("", "")
    """For a delete, the object it deletes (a tombstone's: its last state)."""


@dataclass(slots=True)
class Scan:
    """Where one sink's own progress stands (:meth:`~bridge.delivery.progress.AckTracker.listener_state`)."""

    cursor: int
    """The first seq not scanned yet."""
    changes: dict[str, Known]
    """Per object, what the sink acknowledged where it may differ from the base."""
    rv: int
    """Its own resume resourceVersion so far."""


def effect_of(n: Notification) -> Effect:
    """The effect of a notification other than an add or update of an object
    (:meth:`~bridge.delivery.progress.AckTracker.dispatched` computes those): a snapshot (the cache
    restated), a relist's frame and an add or update of a tombstone change nothing."""
    if n.kind is not NotificationKind.DELETE:
        return None
    if isinstance(n.obj, UnconfirmedGone):
        # A journal-only object gone: the index (what every sink acknowledged) never had it — an
        # add of it would have settled it — and the key may live on under another uid.
        return None
    # A delete seen only through a relist happened at an unknown RV no newer than the list's: any
    # later resume point covers it.
    rv = -1 if isinstance(n.obj, DeletedFinalStateUnknown) else parse_rv(entry_of(n.obj)[1])
    return (n.key or object_key(n.obj), None, rv)
