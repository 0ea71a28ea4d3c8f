"""Acknowledgement tracking: the checkpoint low-watermark of one informer.

Sinks acknowledge out of order, so the bridge may resume from the resourceVersion up to which every
listener acknowledged every notification. :class:`AckTracker` keeps what some listener still owes in
a window; its fully acknowledged prefix is applied in ``seq`` order to the *acked index* (key →
(uid, resourceVersion)), and a progress marker becomes the resume point once everything before it
is applied. The index is kept **exactly as of the resume point**: changes newer than it (a watch
resumed from it replays them) wait per key in an *ahead* list until a marker covers them.
:meth:`AckTracker.listener_state` computes one sink's own progress from the same window.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence

from bridge.contracts import (
    DeletedFinalStateUnknown,
    Notification,
    NotificationKind,
    UnconfirmedGone,
)
from bridge.delivery.progress_records import (
    HOLDS_NOTHING,
    AheadEntry,
    Effect,
    IndexEntry,
    InFlight,
    Known,
    Scan,
    effect_of,
    entry_of,
    object_key,
)
from bridge.rawobject import object_identity
from bridge.resource_version import parse_rv

__all__ = ["HOLDS_NOTHING", "AckTracker", "AheadEntry", "IndexEntry", "Known", "object_key"]

log = logging.getLogger(__name__)

class AckTracker:
    """A :class:`~bridge.contracts.DeliveryObserver` computing the checkpoint state of one informer.
    ``resource_version``, ``index`` and ``ahead`` seed it from a checkpoint (empty: a fresh start,
    the resume point unknown, ``""``, until the first progress marker is passed)."""

    def __init__(self, *, name: str = "", resource_version: str = "",
                 index: Mapping[str, IndexEntry] | None = None, ahead: Mapping[str, AheadEntry] | None = None,
                 now: Callable[[], float] | None = None,
                 on_first_resume_point: Callable[[str], None] | None = None) -> None:
        """``now``: the clock dispatch times are read from (for :meth:`oldest_unacked`); without it
        ages are unknown. ``on_first_resume_point(rv)`` is called once, when a tracker started
        without a resume point first gets one (every listener acknowledged everything up to it)."""
        self.name = name
        self._on_first_resume_point = on_first_resume_point
        self._now = now
        self._resource_version = resource_version
        self._index: dict[str, IndexEntry] = dict(index or {})
        # key → changes applied but newer than the resume point, in application order:
        # (resourceVersion as int, entry or None for a delete).
        self._ahead: dict[str, collections.deque[tuple[int, IndexEntry | None]]] = {}
        # The same changes ordered by resourceVersion, so that passing a marker folds in exactly the
        # changes it covers (a scan of every key per marker would be quadratic under a backlog).
        self._ahead_heap: list[tuple[int, int, str]] = []
        self._ahead_count = itertools.count()
        for key, (uid, rv, deleted) in (ahead or {}).items():
            rv_int = parse_rv(rv)
            if rv_int is not None:
                self._hold(key, rv_int, None if deleted else (uid, rv))
        self._rv_int = parse_rv(resource_version)
        # seq → notification still owed by some listener, or acked but behind an unacked one.
        self._window: collections.OrderedDict[int, InFlight] = collections.OrderedDict()
        # (seq, rv) markers not yet passed, in seq order.
        self._markers: collections.deque[tuple[int, str]] = collections.deque()
        self._outstanding = 0
        # key → resourceVersion of the last add/update dispatched for it (this run).
        self._last_rv: dict[str, str] = {}
        # seqs of deletes the informer inferred (the object it knew, unchanged, now gone).
        self._unobserved: set[int] = set()
        # [begin seq, end seq or -1 until dispatched] of the relist windows not yet applied, in order:
        # what a sink acknowledged inside one whose end it still owes is not yet its own progress.
        self._gaps: collections.deque[list[int]] = collections.deque()
        self._last_dispatched_seq = -1
        self._last_applied_seq = -1
        self._generation = 0
        self.duplicate_acks = 0
        """Acks for a (listener, seq) that was not owed: counted, otherwise ignored."""
        self._scans: dict[str, Scan] = {}
        """Listener → its incremental own-progress scan (:meth:`listener_state`)."""
        self._owes: dict[str, dict[str, dict[str, int]]] = {}
        """Listener → :meth:`owed_deletes` as of its last :meth:`listener_state`."""
        self._max_acked: dict[str, int] = {}
        """Listener → the highest seq it acknowledged (how far :meth:`listener_state` looks past
        its contiguous prefix for what it acknowledged out of order)."""
        self.acks = 0
        """Acks received: a sink's own progress may move while the shared state (generation)
        waits for a slower sink."""

    # ---------------------------------------------------------------------------------------------
    # DeliveryObserver

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        seq = notification.seq
        if seq < 0:
            return  # replays to a late handler are not tracked
        if seq <= self._last_dispatched_seq:
            log.warning("notification seq %d dispatched out of order (last %d); ignored",
                        seq, self._last_dispatched_seq, extra={"informer": self.name})
            return
        self._last_dispatched_seq = seq
        kind = notification.kind
        obj = notification.obj
        effect: Effect
        if (kind is NotificationKind.ADD or kind is NotificationKind.UPDATE) and not isinstance(
                obj, DeletedFinalStateUnknown):
            # The common change, in one pass, reading the object's identity once.
            key = notification.key or object_key(obj)
            ident = object_identity(obj)
            rv = ident[1]
            self._last_rv[key] = rv
            try:
                rv_int: int | None = int(rv)
            except ValueError:
                rv_int = None
            effect = (key, ident, rv_int)
        else:
            if kind is NotificationKind.GAP and notification.gap is not None:
                self._note_gap(seq, notification.gap.end)
            else:
                self._note_state(notification)
            effect = effect_of(notification)
        entry = InFlight(effect, set(listeners), self._now() if self._now is not None else 0.0)
        if effect is not None and effect[1] is None:
            entry.deleted = entry_of(obj)
        self._window[seq] = entry
        if entry.waiting:
            # Owed by someone: it cannot be applied now, and the markers it could hold back were
            # passed when the window last changed at its head. Nothing to advance.
            self._outstanding += 1
            return
        self._advance()

    def acked(self, listener: str, seq: int) -> None:
        self.acks += 1
        entry = self._window.get(seq)
        if entry is None or listener not in entry.waiting:
            if seq >= 0:
                self.duplicate_acks += 1
            return
        waiting = entry.waiting
        waiting.discard(listener)
        if seq > self._max_acked.get(listener, -1):
            self._max_acked[listener] = seq
        if not waiting:
            self._outstanding -= 1
            # Only the window's head can be applied: behind a notification still owed nothing moves
            # (the head always has someone waiting once a call returns), and no marker either.
            if seq == next(iter(self._window)):
                self._advance()

    def progress(self, seq: int, resource_version: str) -> None:
        if self._markers and self._markers[-1][0] == seq:
            self._markers[-1] = (seq, resource_version)  # a later marker for the same point wins
        else:
            self._markers.append((seq, resource_version))
        window = self._window
        if window and seq > next(iter(window)):
            return  # behind a notification still owed: it passes when that one is applied
        self._advance()

    def listener_removed(self, listener: str) -> None:
        self._scans.pop(listener, None)
        self._max_acked.pop(listener, None)
        self._owes.pop(listener, None)
        for entry in self._window.values():
            if listener in entry.waiting:
                entry.waiting.discard(listener)
                if not entry.waiting:
                    self._outstanding -= 1
        self._advance()

    def _note_gap(self, seq: int, end: bool) -> None:
        """A relist window's begin or end marker (they are dispatched in order, one window at a time)."""
        gaps = self._gaps
        if not end:
            gaps.append([seq, -1])
        elif gaps and gaps[-1][1] < 0:
            gaps[-1][1] = seq

    def _open_windows(self, listener: str) -> list[tuple[int, float]]:
        """The seqs ``[begin, end)`` of the relist windows whose end ``listener`` has not acknowledged
        (docs/delivery-contract.md, section 2: a window is one delivery). What it acknowledged inside
        one is not its own progress yet: after a crash its filter would skip the window's states and
        what the window coalesced before them, and no window naming those changes would close for it."""
        window = self._window
        out: list[tuple[int, float]] = []
        for begin, end in self._gaps:
            if end < 0:
                out.append((begin, float("inf")))
            else:
                entry = window.get(end)
                if entry is not None and listener in entry.waiting:
                    out.append((begin, end))
        return out

    def _note_state(self, n: Notification) -> None:
        """What a delete tells of the key's last state (:meth:`dispatched` notes adds and updates)."""
        if n.kind is not NotificationKind.DELETE:
            return
        key = n.key or object_key(n.obj)
        if isinstance(n.obj, UnconfirmedGone):
            self._unobserved.add(n.seq)  # the key itself may live on: its last state stays
            return
        known = self._last_rv.pop(key, None)
        if isinstance(n.obj, DeletedFinalStateUnknown):
            self._unobserved.add(n.seq)
            return
        if known is None:  # not changed in this run: what every sink acknowledged of it
            base = self.base_knowledge(key)
            known = str(base.resource_version) if base is not None and not base.deleted else ""
        # A delete seen on the watch carries a resourceVersion of its own; one that carries exactly
        # the state last seen was inferred by a relist (the object was re-created under a new uid).
        rv = entry_of(n.obj)[1]
        if rv and rv == known:
            self._unobserved.add(n.seq)

    def oldest_unacked(self, listener: str) -> float | None:
        """The dispatch time of the oldest notification ``listener`` has not acknowledged (None if
        it owes nothing, or the tracker has no clock). Scans the window from its head: for scrapes
        and periodic checks, not for the per-change path."""
        if self._now is None:
            return None
        for entry in self._window.values():
            if listener in entry.waiting:
                return entry.time
        return None

    def is_unobserved_delete(self, seq: int) -> bool:
        """True for a delete the bridge did not see happen (a relist tombstone, or the old object of
        a re-creation found by a relist): its object is the last state known, not the final one.
        Answered until every listener acknowledged the notification."""
        return seq in self._unobserved

    # ---------------------------------------------------------------------------------------------
    # State

    def checkpoint_state(self) -> tuple[str, dict[str, IndexEntry]]:
        """The safe resume resourceVersion ("": none yet) and a copy of the acked index as of it."""
        return self._resource_version, dict(self._index)

    def delivered_ahead(self) -> dict[str, AheadEntry]:
        """Per object, the newest acknowledged change the resume point does not cover yet: a resumed
        watch replays them, applied to the cache without notifying the sinks again."""
        out: dict[str, AheadEntry] = {}
        for key, changes in self._ahead.items():
            rv, entry = changes[-1]
            if rv < 0:
                continue
            out[key] = (entry[0], str(rv), False) if entry is not None else ("", str(rv), True)
        return out

    @property
    def resource_version(self) -> str:
        return self._resource_version

    @property
    def pending(self) -> int:
        """Dispatched notifications still owed an ack by at least one listener."""
        return self._outstanding

    @property
    def lag(self) -> int:
        """Dispatched notifications not yet reflected in the checkpoint state (pending ones plus
        acked ones waiting behind an older pending one)."""
        return len(self._window)

    @property
    def generation(self) -> int:
        """Increases whenever the checkpoint state changes; lets a writer skip identical saves."""
        return self._generation

    @property
    def last_applied_seq(self) -> int:
        return self._last_applied_seq

    def pending_by_listener(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self._window.values():
            for listener in entry.waiting:
                counts[listener] = counts.get(listener, 0) + 1
        return counts

    def seed_last_seen(self, entries: Mapping[str, str]) -> None:
        """Objects the informer's cache was seeded with that the index does not hold (known only
        to some sinks, see the replay stage): key → resourceVersion. A delete of exactly that
        state is then recognised as inferred, as for the index's objects."""
        for key, rv in entries.items():
            self._last_rv.setdefault(key, rv)

    def base_knowledge(self, key: str) -> Known | None:
        """What every sink acknowledged of ``key``: the newest change in the delivered-ahead map,
        else the index entry; None when the key is unknown (never seen, or deleted before the
        resume point)."""
        pending = self._ahead.get(key)
        if pending:
            rv, entry = pending[-1]
            return Known(entry[0], rv, False) if entry is not None else Known("", rv, True)
        entry = self._index.get(key)
        if entry is None:
            return None
        rv_int = parse_rv(entry[1])
        return Known(entry[0], rv_int if rv_int is not None else 0, False)

    def follow_listener(self, listener: str, floor: int, own: Mapping[str, Known]) -> None:
        """Starts ``listener``'s own-progress scan (:meth:`listener_state`) now, before the first
        notification is dispatched: for a sink whose knowledge differs from the base (``floor``,
        ``own``: its section). **Invariant**: every change applied meanwhile to an object it knows
        differently is folded into its knowledge in order; a scan started at the first checkpoint
        write would keep its stale state (an object it saw deleted, though it has since received its
        re-creation), and after the next crash its filter would drop the delete of what it holds."""
        if listener not in self._scans:
            self._scans[listener] = self._new_scan(floor, own)

    def _new_scan(self, floor: int, own: Mapping[str, Known]) -> Scan:
        changes = {key: Known(*k) for key, k in own.items()}
        return Scan(cursor=self._last_applied_seq + 1, changes=changes, rv=floor)

    def listener_state(self, listener: str, floor: int, own: Mapping[str, Known]
                       ) -> tuple[int, dict[str, Known | None]]:
        """One sink's own progress, for the checkpoint's per-sink section: its resume
        resourceVersion and, per object, what it acknowledged where that differs from
        :meth:`base_knowledge` (None: the base knows the object, the sink knows it is gone).

        ``floor`` and ``own``: its section when the informer resumed (read on the first call unless
        :meth:`follow_listener` started the scan). Its progress is that, plus the window's prefix it
        does not owe and the markers that prefix passes, plus what it acknowledged past it
        (:meth:`_acked_beyond`); per object, a change older than what it knows is not applied (it
        skipped its replay). Incremental: each call scans only what was dispatched since the last."""
        scan = self._scans.get(listener)
        if scan is None:
            scan = self._scans[listener] = self._new_scan(floor, own)
        base_rv = self._rv_int if self._rv_int is not None else 0
        scan.rv = max(scan.rv, base_rv)
        open_windows = self._open_windows(listener) if self._gaps else []
        limit = self._scan_prefix(listener, scan, open_windows)
        scan.rv = max(scan.rv, self._marker_rv(limit))
        rv = scan.rv
        out: dict[str, Known | None] = {}
        beyond, owes = (self._acked_beyond(listener, limit, scan, open_windows) if limit is not None
                        else ({}, {}))
        self._owes[listener] = owes
        for key, mine in [*beyond.items(), *((k, m) for k, m in scan.changes.items() if k not in beyond)]:
            base = self.base_knowledge(key)
            if mine.deleted and key not in beyond and (base is None or base.deleted):
                # Gone for both — forgotten once the base's resume point covers the delete (before
                # that, "the base does not know it" may still mean "not yet": an older change of it
                # may be waiting for a slower sink).
                if 0 <= mine.resource_version <= base_rv:
                    del scan.changes[key]
            elif mine.deleted:
                out[key] = None if mine.resource_version <= rv else mine
            elif base != mine:
                out[key] = mine
            elif key not in beyond:
                del scan.changes[key]  # the base caught up with it
        return rv, out

    def _scan_prefix(self, listener: str, scan: Scan, open_windows: list[tuple[int, float]]) -> int | None:
        """Folds into ``scan`` the notifications since its cursor up to the first the sink still
        owes, or the first inside a window whose end it owes (``open_windows``); returns that one's
        seq (None: it owes nothing dispatched)."""
        window = self._window
        seq = max(scan.cursor, self._last_applied_seq + 1)
        last = self._last_dispatched_seq
        limit: int | None = None
        while seq <= last:
            entry = window.get(seq)
            if entry is not None:
                if listener in entry.waiting or (open_windows and _inside(open_windows, seq)):
                    limit = seq
                    break
                self._scan_effect(scan, entry.effect)
            seq += 1
        scan.cursor = seq
        return limit

    def _acked_beyond(self, listener: str, limit: int, scan: Scan, open_windows: list[tuple[int, float]]
                      ) -> tuple[dict[str, Known], dict[str, dict[str, int]]]:
        """Per object, the newest change ``listener`` acknowledged past its contiguous prefix (from
        ``limit``, the first it owes; section 3: after a crash its filter skips a change at or below
        what it acknowledged of that object). Also, per key, what it owes of earlier objects of a
        re-used name while it acknowledged a later one (:meth:`owed_deletes`): per earlier uid, its
        first change owed since the last one acknowledged. A key stays as it was from a change
        without a resourceVersion. Recomputed at each call, up to the highest seq it acknowledged."""
        last = self._max_acked.get(listener, -1)
        out: dict[str, Known] = {}
        owes: dict[str, dict[str, int]] = {}
        if last <= limit:
            return out, owes
        blocked: set[str] = set()
        owed: dict[str, dict[str, int]] = {}  # key → uid → its first change owed since one acknowledged
        window = self._window
        for seq in range(limit, last + 1):
            entry = window.get(seq)
            if entry is None or entry.effect is None:
                continue
            key, known, effect_rv = entry.effect
            if key in blocked:
                continue
            uid = known[0] if known is not None else entry.deleted[0]
            tombstone = effect_rv == -1
            if tombstone:  # a relist's tombstone: a delete at the state it knew
                effect_rv = parse_rv(entry.deleted[1])
            if effect_rv is None or not uid:
                blocked.add(key)
                continue
            mine = owed.setdefault(key, {})
            if listener in entry.waiting or (open_windows and _inside(open_windows, seq)):
                # A tombstone is owed after the state it was inferred from, which the sink holds
                # (acknowledged or covered): owed from that state, the replayed change that made it
                # would pass as owed and reach the sink twice.
                mine.setdefault(uid, effect_rv + 1 if tombstone else effect_rv)
                continue
            mine.pop(uid, None)  # what it owes of this object is older than this change
            current = out.get(key) or scan.changes.get(key) or self.base_knowledge(key)
            if current is not None and effect_rv < current.resource_version:
                continue
            out[key] = Known(uid, effect_rv, known is None)
            if mine:
                owes[key] = dict(mine)
            else:
                owes.pop(key, None)
        return out, {key: owe for key, owe in owes.items() if key in out}

    def owed_deletes(self, listener: str) -> dict[str, dict[str, int]]:
        """As of the last :meth:`listener_state` of ``listener``: key → what it owes of earlier
        objects while its state of the key is a later object's, uid → the resourceVersion from which
        (``resume_plan.owes_change``)."""
        return {key: dict(owe) for key, owe in self._owes.get(listener, {}).items()}

    def _marker_rv(self, limit: int | None) -> int:
        """The newest resourceVersion among the pending markers a listener owing nothing before
        ``limit`` (None: nothing) has passed; 0 if none. Scans from the end: a listener that keeps
        up passes nearly all of them."""
        markers = self._markers
        if not markers or (limit is not None and markers[0][0] > limit):
            return 0
        for seq, marker_rv in reversed(markers):
            if limit is None or seq <= limit:
                return parse_rv(marker_rv) or 0
        return 0

    def _scan_effect(self, scan: Scan, effect: Effect) -> None:
        """Applies one notification's effect to a sink's own knowledge (newest resourceVersion
        wins; a relist's tombstone, -1, always applies)."""
        if effect is None:
            return
        key, known, effect_rv = effect
        if effect_rv is None:
            return
        changes = scan.changes
        current = changes.get(key) or self.base_knowledge(key)
        if effect_rv != -1 and current is not None and effect_rv < current.resource_version:
            return  # older than what the sink has: it skipped this replayed change
        if known is None:
            at = effect_rv if effect_rv != -1 else (current.resource_version if current else -1)
            changes[key] = Known("" if current is None else current.uid, at, True)
        else:
            changes[key] = Known(known[0], effect_rv, False)

    # ---------------------------------------------------------------------------------------------

    def _advance(self) -> None:
        changed = False
        window = self._window
        markers = self._markers
        scans = self._scans
        unobserved = self._unobserved
        while window:
            seq = next(iter(window))
            entry = window[seq]
            if entry.waiting:
                break
            # Markers at or below this seq describe changes already applied.
            if markers and markers[0][0] <= seq:
                changed |= self._pass_markers(seq)
            del window[seq]
            if self._gaps and self._gaps[0][1] == seq:
                self._gaps.popleft()  # every sink acknowledged the window's end
            if unobserved:
                unobserved.discard(seq)
            effect = entry.effect
            if effect is not None:
                if scans:
                    # A sink's incremental scan that has not reached it yet takes it now, in order —
                    # if the sink knows the object differently; otherwise it agrees with the base,
                    # which takes it now. O(sinks) per change, a comparison and a lookup each.
                    key = effect[0]
                    for scan in scans.values():
                        if scan.cursor <= seq and key in scan.changes:
                            self._scan_effect(scan, effect)
                # Applied to the index, or held while newer than the resume point.
                key, known, rv = effect
                rv_int = self._rv_int
                if (rv is None or (self._resource_version and rv_int is None)
                        or (rv_int is not None and rv <= rv_int and key not in self._ahead)):
                    if known is None:
                        self._index.pop(key, None)
                    else:
                        self._index[key] = known
                else:
                    self._hold(key, rv, known)
            self._last_applied_seq = seq
            changed = True
        if markers:
            changed |= self._pass_markers(next(iter(window)) if window else None)
        if changed:
            self._generation += 1

    def _pass_markers(self, limit: int | None) -> bool:
        """Passes the markers whose every preceding notification is applied: all of them when the
        window is empty (``limit`` None), else those with ``seq <= limit``."""
        passed = False
        first = not self._resource_version
        while self._markers and (limit is None or self._markers[0][0] <= limit):
            _, rv = self._markers.popleft()
            if rv and rv != self._resource_version:
                self._resource_version = rv
                self._rv_int = parse_rv(rv)
                self._fold_ahead()
                passed = True
        if passed and first and self._on_first_resume_point is not None:
            self._on_first_resume_point(self._resource_version)
        return passed

    def _fold_ahead(self) -> None:
        """Moves into the index, in resourceVersion order, the applied changes the resume point now
        covers; per key the newest of them wins."""
        limit = self._rv_int
        if limit is None:
            return
        heap = self._ahead_heap
        ahead = self._ahead
        index = self._index
        while heap and heap[0][0] <= limit:
            _, _, key = heapq.heappop(heap)
            changes = ahead[key]
            _, entry = changes.popleft()
            if entry is None:  # a delete removes the key
                index.pop(key, None)
            else:
                index[key] = entry
            if not changes:
                del ahead[key]

    def _hold(self, key: str, rv: int, entry: IndexEntry | None) -> None:
        changes = self._ahead.get(key)
        if changes is None:
            changes = self._ahead[key] = collections.deque()
        elif changes and rv < changes[-1][0]:
            # A relist tombstone (no resourceVersion of its own) follows the key's earlier changes:
            # it is folded with the last of them, never before.
            rv = changes[-1][0]
        changes.append((rv, entry))
        heapq.heappush(self._ahead_heap, (rv, next(self._ahead_count), key))


def _inside(windows: list[tuple[int, float]], seq: int) -> bool:
    return any(begin <= seq < end for begin, end in windows)
