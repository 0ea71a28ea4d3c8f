"""One sink's own progress, for the checkpoint's per-sink section: computed by the tracker from the
window of notifications it keeps for the base (:mod:`bridge.delivery.progress`).

:class:`OwnProgress` is a plain base class of :class:`~bridge.delivery.progress.AckTracker` (it
declares what of the tracker it reads, as the reflector's phases do): one object, one window, and
a sink's section is read from it without a copy. Per sink it keeps an incremental :class:`Scan` (what
the sink acknowledged where that may differ from the base) and, at each :meth:`listener_state`, what
it acknowledged out of order past its contiguous prefix.

Invariants: a scan takes, in ``seq`` order, every notification the sink does not owe up to the first
one it owes (or the first inside a relist window whose end it owes); a change older than what the
sink knows of its object is not taken (it skipped that replayed change); the tracker settles (applies
the acknowledged prefix) before a section is computed, so a section never depends on when the
acknowledgements were applied.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from bridge.delivery.progress_records import Effect, InFlight, Known, Read, Scan
from bridge.resource_version import ResourceVersion, parse_rv

__all__ = ["OwnProgress"]


class OwnProgress:
    """Each sink's own progress (module docs); never built on its own."""

    _window: collections.OrderedDict[int, InFlight]
    """seq → notification not applied to the base yet."""
    _reads: collections.deque[Read]
    """The closed reads whose markers the base has not passed."""
    _gaps: collections.deque[list[int]]
    """[begin seq, end seq or -1] of the relist windows the base has not applied."""
    _scans: dict[str, Scan]
    """Listener → its incremental own-progress scan."""
    _owes: dict[str, dict[str, dict[str, int]]]
    """Listener → :meth:`owed_deletes` as of its last :meth:`listener_state`."""
    _max_acked: dict[str, int]
    """Listener → the highest seq it acknowledged."""
    _last_applied_seq: int
    _last_dispatched_seq: int
    _rv_int: ResourceVersion | None
    """The base's resume point as an integer."""

    def _settle(self) -> None:
        """The tracker's: applies the acknowledged prefix to the base."""
        raise NotImplementedError

    def _known_of(self, key: str) -> Known | None:
        """The tracker's: what every sink acknowledged of ``key``, as it holds it now."""
        raise NotImplementedError

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

    def follow_listener(self, listener: str, floor: int, own: Mapping[str, Known]) -> None:
        """Starts ``listener``'s own-progress scan (:meth:`listener_state`) now, before the first
        notification is dispatched: for a sink whose knowledge differs from the base (``floor``,
        ``own``: its section). **Invariant**: every change applied meanwhile to an object it knows
        differently is folded into its knowledge in order; a scan started at the first checkpoint
        write would keep its stale state (an object it saw deleted, though it has since received its
        re-creation), and after the next crash its filter would drop the delete of what it holds."""
        if listener not in self._scans:
            self._settle()
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
        self._settle()
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
            base = self._known_of(key)
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
            current = out.get(key) or scan.changes.get(key) or self._known_of(key)
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
        reads = self._reads
        if not reads or (limit is not None and reads[0].end > limit):
            return 0
        for read in reversed(reads):
            if limit is None or read.end <= limit:
                return read.rv_int or 0
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
        current = changes.get(key) or self._known_of(key)
        if effect_rv != -1 and current is not None and effect_rv < current.resource_version:
            return  # older than what the sink has: it skipped this replayed change
        if known is None:
            at = effect_rv if effect_rv != -1 else (current.resource_version if current else -1)
            changes[key] = Known("" if current is None else current.uid, at, True)
        else:
            changes[key] = Known(known[0], effect_rv, False)


def _inside(windows: list[tuple[int, float]], seq: int) -> bool:
    return any(begin <= seq < end for begin, end in windows)
