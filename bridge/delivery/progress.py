"""Acknowledgement tracking: the checkpoint low-watermark of one informer.

Sinks acknowledge out of order, so the bridge may resume from the resourceVersion up to which every
listener acknowledged every notification. :class:`AckTracker` keeps what some listener still owes in
a window, and a **per-read ledger**: one :class:`~bridge.delivery.progress_records.Read` per progress
marker (the informer queues one per read of the watch stream, one per relist), counting down the
notifications of that read some listener still owes. A notification's last acknowledgement is a
countdown; once a read's count is 0 and every earlier read has passed, its marker becomes the resume
point and its changes are applied in ``seq`` order to the *acked index* (key → (uid,
resourceVersion)) — straight into it, the marker first, since the read's changes are at or below it.

The index is kept **exactly as of the resume point**: changes newer than it (a watch resumed from it
replays them) wait per key in an *ahead* list until a marker covers them. That happens only where
the contract needs it: a checkpoint's changes from a previous run, a read acknowledged in part
(a slow sink, out-of-order acknowledgements, a relist's many changes before its one marker) and
changes newer than their read's marker.

**Invariant** (settling): every method that reads the checkpoint state first applies the
acknowledged prefix of the head read (the changes before the first one some listener owes, held
ahead of the resume point), so what it reads is exactly what applying each notification as soon as
it and every earlier one are acknowledged would give; between two reads of the state nothing is
applied per change. :meth:`AckTracker.listener_state` computes one sink's own progress from the
same window (:mod:`bridge.delivery.own_progress`).
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
from bridge.delivery.own_progress import OwnProgress
from bridge.delivery.progress_records import (
    HOLDS_NOTHING,
    AheadEntry,
    Effect,
    IndexEntry,
    InFlight,
    Known,
    Read,
    Scan,
    effect_of,
    entry_of,
    object_key,
)
from bridge.rawobject import RawObject, object_identity
from bridge.resource_version import parse_rv

__all__ = ["HOLDS_NOTHING", "AckTracker", "AheadEntry", "IndexEntry", "Known", "object_key"]

log = logging.getLogger(__name__)

class AckTracker(OwnProgress):
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
        # seq → notification not applied yet: owed by some listener, or acknowledged but its read (or
        # an earlier one) is not; a settle applies the acknowledged prefix.
        self._window: collections.OrderedDict[int, InFlight] = collections.OrderedDict()
        # The ledger: the closed reads whose markers are not passed yet, in seq order, and the open
        # read (the notifications dispatched since the last marker).
        self._reads: collections.deque[Read] = collections.deque()
        self._open = Read()
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
            ident = (obj.uid, obj.resource_version) if type(obj) is RawObject else object_identity(obj)
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
        read = self._open
        reads = self._reads
        if reads and seq < reads[-1].end:
            # Numbered before a marker already given (a caller numbering its own): that read's.
            read = next(r for r in reads if seq < r.end)
        entry = InFlight(effect, set(listeners), self._now() if self._now is not None else 0.0, read)
        if effect is not None and effect[1] is None:
            entry.deleted = entry_of(obj)
        self._window[seq] = entry
        if entry.waiting:
            self._outstanding += 1
            read.owed += 1
        # Nothing to advance either way: its read is open (no marker yet), and it is applied when
        # its read passes, or by a settle.

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
            read = entry.read
            read.owed -= 1
            if self._unobserved:
                self._unobserved.discard(seq)  # answered until every listener acknowledged it
            # The countdown: only a read acknowledged whole, at the ledger's head, moves anything.
            if not read.owed and self._reads and self._reads[0] is read:
                self._advance()

    def progress(self, seq: int, resource_version: str) -> None:
        reads = self._reads
        rv_int = parse_rv(resource_version)
        if reads and reads[-1].end == seq:
            # A later marker for the same point wins (nothing was dispatched since the last one).
            last = reads[-1]
            last.rv, last.rv_int = resource_version, rv_int
            return
        if reads and seq < reads[-1].end:
            # Behind the last marker (markers come in seq order): the same point as that one.
            last = reads[-1]
            last.rv, last.rv_int = resource_version, rv_int
            return
        read = self._open
        read.end, read.rv, read.rv_int = seq, resource_version, rv_int
        self._open = Read()
        if self._last_dispatched_seq >= seq:
            self._split(read)
        reads.append(read)
        if not reads[0].owed:
            self._advance()

    def _split(self, read: Read) -> None:
        """Hands the notifications numbered at or after ``read``'s marker (dispatched before it was
        given) to the open read: a marker covers only what precedes it."""
        window = self._window
        following = self._open
        for seq in reversed(window):
            if seq < read.end:
                break
            entry = window[seq]
            if entry.read is read:
                entry.read = following
                if entry.waiting:
                    read.owed -= 1
                    following.owed += 1

    def listener_removed(self, listener: str) -> None:
        self._scans.pop(listener, None)
        self._max_acked.pop(listener, None)
        self._owes.pop(listener, None)
        for entry in self._window.values():
            if listener in entry.waiting:
                entry.waiting.discard(listener)
                if not entry.waiting:
                    self._outstanding -= 1
                    entry.read.owed -= 1
        if self._unobserved:
            self._unobserved.intersection_update(
                seq for seq, entry in self._window.items() if entry.waiting)
        self._advance()

    def _note_gap(self, seq: int, end: bool) -> None:
        """A relist window's begin or end marker (they are dispatched in order, one window at a time)."""
        gaps = self._gaps
        if not end:
            gaps.append([seq, -1])
        elif gaps and gaps[-1][1] < 0:
            gaps[-1][1] = seq

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
        self._settle()
        return self._resource_version, dict(self._index)

    def delivered_ahead(self) -> dict[str, AheadEntry]:
        """Per object, the newest acknowledged change the resume point does not cover yet: a resumed
        watch replays them, applied to the cache without notifying the sinks again."""
        self._settle()
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
        self._settle()
        return len(self._window)

    @property
    def generation(self) -> int:
        """Increases whenever the checkpoint state changes; lets a writer skip identical saves."""
        self._settle()
        return self._generation

    @property
    def last_applied_seq(self) -> int:
        self._settle()
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
        self._settle()
        return self._known_of(key)

    def _known_of(self, key: str) -> Known | None:
        """:meth:`base_knowledge` as the tracker holds it now (no settle: for the tracker's own
        passes, the state already settled)."""
        pending = self._ahead.get(key)
        if pending:
            rv, entry = pending[-1]
            return Known(entry[0], rv, False) if entry is not None else Known("", rv, True)
        entry = self._index.get(key)
        if entry is None:
            return None
        rv_int = parse_rv(entry[1])
        return Known(entry[0], rv_int if rv_int is not None else 0, False)

    # ---------------------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Passes every read acknowledged whole whose earlier reads have passed, in order: its
        marker first (the resume point moves), then its changes straight into the index. A marker
        whose resourceVersion is not an integer is passed after its read's changes instead, as the
        changes applied one by one would have it (they are then held ahead, see :meth:`_apply`)."""
        reads = self._reads
        changed = False
        while reads and not reads[0].owed:
            read = reads.popleft()
            first = not self._resource_version
            early = read.rv_int is not None
            passed = early and self._pass(read)
            applied = self._apply(read.end)
            if not early:
                passed = self._pass(read)
            if passed and first and self._on_first_resume_point is not None:
                self._on_first_resume_point(self._resource_version)
            changed = changed or passed or applied
        if changed:
            self._generation += 1

    def _settle(self) -> None:
        """Applies the acknowledged prefix of the head read (module docs: before the state is read);
        a look at the window's head when there is none."""
        window = self._window
        if window and not window[next(iter(window))].waiting:
            self._apply(None)
            self._generation += 1

    def _apply(self, end: int | None) -> bool:
        """Applies the window's notifications from its head, in ``seq`` order: those before ``end``
        (a read that passed: all acknowledged), or (None) those up to the first one owed. Each one's
        effect goes to the sinks' scans that follow its object, then to the index, or is held while
        newer than the resume point (or while the key has changes held). True if it applied any."""
        window = self._window
        scans = self._scans
        unobserved = self._unobserved
        gaps = self._gaps
        index = self._index
        ahead = self._ahead
        rv_int = self._rv_int
        exact = not (self._resource_version and rv_int is None)
        last = self._last_applied_seq
        while window:
            seq, entry = window.popitem(last=False)
            if (seq >= end) if end is not None else bool(entry.waiting):
                window[seq] = entry  # not this one: back at the head
                window.move_to_end(seq, last=False)
                break
            if gaps and gaps[0][1] == seq:
                gaps.popleft()  # every sink acknowledged the window's end
            if unobserved:
                unobserved.discard(seq)
            last = seq
            effect = entry.effect
            if effect is None:
                continue
            key, known, rv = effect
            if scans:
                # A sink's incremental scan that has not reached it yet takes it now, in order —
                # if the sink knows the object differently; otherwise it agrees with the base,
                # which takes it now. O(sinks) per change, a comparison and a lookup each.
                for scan in scans.values():
                    if scan.cursor <= seq and key in scan.changes:
                        self._scan_effect(scan, effect)
            # Applied to the index, or held while newer than the resume point.
            if rv is None or not exact or (rv_int is not None and rv <= rv_int and key not in ahead):
                if known is None:
                    index.pop(key, None)
                else:
                    index[key] = known
            else:
                self._hold(key, rv, known)
        if last == self._last_applied_seq:
            return False
        self._last_applied_seq = last
        return True

    def _pass(self, read: Read) -> bool:
        """Makes ``read``'s marker the resume point (every notification before it is acknowledged);
        True if that moved it. The changes held ahead that it now covers go to the index."""
        rv = read.rv
        if not rv or rv == self._resource_version:
            return False
        self._resource_version = rv
        self._rv_int = read.rv_int
        if self._ahead_heap:
            self._fold_ahead()
        return True

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
