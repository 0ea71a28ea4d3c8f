"""What a listener keeps per object: merging, the latest states.

A listener's memory is a queue of notifications (:mod:`bridge.informer.listener_buffer`); under the
``COALESCE`` policy :func:`merge` swaps a pending notification for the one equivalent to it and its
successor, in place, so the object keeps its position. When the listener degrades
(:class:`~bridge.informer.buffer_mode.BufferMode`), its backlog becomes :class:`LatestStates`: the
latest state of each object, bounded by the number of objects however long the outage, delivered
later inside the listener's own gap window, which is one delivery for the acknowledgements
(:class:`OverflowWindow`).
"""

from __future__ import annotations

from collections import deque

from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind, ObjectKey
from bridge.rawobject import object_identity

__all__ = ["MARKERS", "LatestStates", "OverflowWindow", "is_initial_add", "merge"]

MARKERS = frozenset({NotificationKind.SNAPSHOT, NotificationKind.GAP})
"""Notifications that are never dropped nor coalesced."""


def is_initial_add(n: Notification) -> bool:
    return n.kind is NotificationKind.ADD and n.is_in_initial_list


def merge(pending: Notification, new: Notification) -> Notification | None:
    """The single notification equivalent to ``pending`` followed by ``new`` (same key), or None.

    add+update → add(new), update+update → update(first old, last new), add/update+delete → delete.
    Anything else (a delete followed by a re-creation, …) cannot be merged without losing a step.
    A merge of an initial-list add stays an initial-list add unless it becomes a delete.
    """
    if new.kind is NotificationKind.UPDATE:
        if pending.kind is NotificationKind.ADD:
            return Notification(
                kind=NotificationKind.ADD,
                obj=new.obj,
                is_in_initial_list=pending.is_in_initial_list,
                seq=new.seq,
                key=new.key,
                time=new.time,
            )
        if pending.kind is NotificationKind.UPDATE:
            return Notification(
                kind=NotificationKind.UPDATE,
                obj=new.obj,
                old=pending.old,
                is_resync=pending.is_resync and new.is_resync,
                seq=new.seq,
                key=new.key,
                time=new.time,
            )
        return None
    mergeable = (NotificationKind.ADD, NotificationKind.UPDATE)
    if new.kind is NotificationKind.DELETE and pending.kind in mergeable:
        return new
    return None


class LatestStates:
    """A degraded listener's backlog: markers as they are, other changes as the latest state per key.

    Oldest first. Changes between two markers share one map (key → the steps that cannot merge, e.g.
    a delete then a re-creation); nothing merges across a marker, nor into what :meth:`take` has
    handed out: a map is taken whole, so changes arriving after that start a new one.
    """

    __slots__ = ("_count", "_entries", "_taken")

    def __init__(self) -> None:
        self._entries: deque[Notification | dict[ObjectKey, list[Notification]]] = deque()
        self._taken: deque[Notification] = deque()
        """The map being handed out, flattened, not yet in a batch."""
        self._count = 0

    def __len__(self) -> int:
        """Notifications kept (markers and states), handed out or not, not yet taken in a batch."""
        return self._count

    def add(self, n: Notification) -> tuple[Notification, Notification] | None:
        """Keeps ``n``; when it merges into its object's pending state, returns (the superseded
        pending one, the merged one), else None."""
        entries = self._entries
        if n.kind in MARKERS:
            entries.append(n)
            self._count += 1
            return None
        last = entries[-1] if entries else None
        if not isinstance(last, dict):
            last = {}
            entries.append(last)
        steps = last.setdefault(n.key or ObjectKey(f"\0{id(n)}"), [])
        if steps:
            pending = steps[-1]
            merged = merge(pending, n)
            if merged is not None:
                steps[-1] = merged
                return pending, merged
        steps.append(n)
        self._count += 1
        return None

    def take(self, limit: int) -> list[Notification]:
        """Up to ``limit`` notifications, oldest first, in the order they are to be delivered."""
        out: list[Notification] = []
        taken = self._taken
        while len(out) < limit:
            if taken:
                out.append(taken.popleft())
                continue
            if not self._entries:
                break
            entry = self._entries.popleft()
            if isinstance(entry, Notification):
                taken.append(entry)
            else:
                for steps in entry.values():
                    taken.extend(steps)
        self._count -= len(out)
        return out

    def clear(self) -> None:
        self._entries.clear()
        self._taken.clear()
        self._count = 0


class OverflowWindow:
    """A degraded listener's gap window as one delivery: the seqs whose acknowledgements wait for
    it (the notifications it coalesced, those handed over inside it), how many of the window's
    notifications are still unacknowledged, and the newest resourceVersion handed over inside it
    (its ``to``: every change it coalesced is older than the state that replaced it).

    A coalesced change is acknowledged only with the whole window: acknowledged at the merge, a
    checkpoint written before the window reached a frozen sink took that sink past changes it
    never received, and a crash lost them without a marker (docs/delivery-contract.md, 7a)."""

    __slots__ = ("closed", "held", "out", "top")

    def __init__(self) -> None:
        self.held: list[int] = []
        self.out = 0
        self.closed = False
        """Its end marker was handed over: once ``out`` is 0, everything of it is acknowledged."""
        self.top = -1

    def hand(self, n: Notification) -> None:
        """``n`` is handed over inside the window."""
        self.out += 1
        if n.kind not in MARKERS:
            self.top = max(self.top, _change_rv(n))

    def acked(self, n: Notification) -> list[int]:
        """``n``, handed over inside the window, is acknowledged: the seqs to acknowledge now
        (everything the window held, once every one of its notifications is acknowledged)."""
        if n.seq >= 0:
            self.held.append(n.seq)
        self.out -= 1
        if self.out or not self.closed:
            return []
        held, self.held = self.held, []
        return held


def _change_rv(n: Notification) -> int:
    """A change's resourceVersion as an integer (-1: not one)."""
    obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
    try:
        return int(object_identity(obj)[1])
    except ValueError:
        return -1
