"""One sink's part of the restart stage (:mod:`bridge.delivery.restart`): held back, re-sent or dropped.

The watch resumes from the checkpoint's base (the slowest sink's point), so the informer replays
changes some sinks already have. :class:`ReplayStage` applies the sink's part of the resume plan to
its notifications, in the order of the contract's section 4a: its own progress (:class:`SinkResume`),
the deletes already sent, the states a relist sent, and under a selector the fate of a uid whose
inferred delete was sent. **Invariant, per-object order across a crash**: a sink never receives a
change of an object older than a state it may hold, unless it is that same event again; and nothing
that brings a uid back is sent unless a delete that a consumer dropping repeated ids keeps can follow.
A listener whose sink has nothing to replay gets no stage at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from bridge.contracts import (
    DeletedFinalStateUnknown,
    KubeObject,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.delivery.journal_records import RelistWindow
from bridge.delivery.progress import HOLDS_NOTHING, AckTracker, Known, object_key
from bridge.delivery.resume_plan import (
    RelistedState,
    SentDelete,
    SinkStart,
    SinkStartKind,
    owes_change,
    parse_rv,
    rv_at_most,
)
from bridge.delivery.selector_exit import SelectorExits
from bridge.rawobject import object_identity
from bridge.rawobject import object_key as raw_object_key
from sinks.contract import ChangeEvent, EventType

__all__ = ["Framing", "ReplayStage", "SinkResume", "delete_is_inferred"]

_CHANGE_KINDS = frozenset({NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE})


class Framing(Protocol):
    """What the replay stage needs of its listener to build events."""

    @property
    def in_gap(self) -> bool: ...  # inside a relist's window now

    def event(self, type_: EventType, obj: KubeObject | None, observed: float, **kw: Any) -> ChangeEvent: ...

    def framed(self, event: ChangeEvent, gap_id: str, before: str, observed: float) -> list[ChangeEvent]:
        """``event`` between the markers of a gap of its own, from ``before`` to its resourceVersion."""
        ...

    @property
    def gap_prefix(self) -> str: ...  # of the ids of the gaps the replay frames


def _object(n: Notification) -> KubeObject:
    return n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj


def _uid_rv(n: Notification) -> tuple[str, str]:
    return object_identity(_object(n))


def delete_is_inferred(n: Notification, tracker: AckTracker | None,
                       sent: Mapping[str, SentDelete]) -> bool:
    """Whether a delete notification goes out with ``finalstateunknown``.

    A tombstone (the relist no longer returned the object) and the old object of a re-creation found
    by a relist are inferred, except when the plan says this very delete (same uid, same
    resourceVersion) was sent before a restart: it is then sent again exactly as it was, so it never
    appears as a second, inferred delete of a uid whose delete consumers already have."""
    if sent:
        uid, rv = _uid_rv(n)
        before = sent.get(uid)
        if before is not None and before.resource_version == rv:
            return before.inferred
    if isinstance(n.obj, DeletedFinalStateUnknown):
        return True
    return tracker is not None and tracker.is_unobserved_delete(n.seq)


def _earlier(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is before ``b`` (an unparsable one is not)."""
    x, y = parse_rv(a), parse_rv(b)
    return x is not None and y is not None and x < y


class ReplayStage:
    """One sink's replay of a restart (module docs). Built from the sink's part of the plan."""

    def __init__(self, *, own: SinkResume | None = None, sent: Mapping[str, SentDelete] | None = None,
                 relisted: Mapping[str, RelistedState] | None = None, tracker: AckTracker | None = None,
                 exits: SelectorExits | None = None,
                 overflowed: Mapping[str, RelistWindow] | None = None) -> None:
        """``tracker`` tells which deletes were inferred; ``exits``: a selector-scoped informer's;
        ``overflowed``: uid → the window (from, state, added) in which this sink's overflow window
        sent a state of it (plan invariant 8), held back and re-sent as a relist's."""
        self.own = own
        """The sink's own-progress filter (:meth:`SinkResume.of`), until it is no longer needed."""
        self._own_until: int | None = -1 if self.own is not None else None
        self.sent: Mapping[str, SentDelete] = sent or {}
        self._relisted = relisted or {}
        self._overflowed = overflowed or {}
        self._tracker = tracker
        self._exits = exits
        self._held: set[str] = set()
        """uids whose replayed changes were held back: their replayed delete is framed as a gap."""
        self._held_relisted: dict[str, tuple[KubeObject | None, str, str]] = {}
        """uids whose relisted state's coalesced changes were held → the state before the first, the
        start of the window that held it, and its kind (``relisted``, or ``overflowed``: this sink's
        own overflow window's)."""
        self._coalesced_hold = False
        """The last change :meth:`relisted` held back was one a relist coalesced (see
        :meth:`take_coalesced_hold`)."""
        self._resumed = parse_rv(tracker.resource_version) if tracker is not None else None
        """Where the watch resumed: changes of a relist's window up to it are not replayed (an
        earlier run held them back and the checkpoint passed them)."""
        self._fate: dict[str, int | None] = {}
        """Under a selector, uids whose inferred delete was sent and whose history is replayed → the
        resourceVersion the uid has now when it lives on, None when it is gone."""
        self._closed: set[str] = set()
        """Under a selector, uids read as gone whose replayed delete went out: nothing more of them."""

    @property
    def one_by_one(self) -> bool:
        """Whether notifications must go through :meth:`admit` and :meth:`ask_fate` one at a time."""
        return self.own is not None or (self._exits is not None and bool(self.sent))

    # ---- own progress ------------------------------------------------------------------------------

    def own_progress_passed(self, seq: int) -> None:
        """The informer reached the sink's own resume point at ``seq``: from there on, once nothing the
        sink knows differs from the informer, the filter is dropped."""
        if self._own_until is not None and self._own_until < 0:
            self._own_until = seq

    def admit(self, n: Notification) -> list[Notification]:
        """What the sink receives for ``n`` after its own-progress filter ([n] without one)."""
        own = self.own
        if own is None or n.kind is NotificationKind.SNAPSHOT:
            return [n]
        if self._own_until is not None and 0 <= self._own_until <= n.seq:
            if not own.known:
                self.own = self._own_until = None  # caught up: the filter costs nothing more
                return [n]
            if n.key and n.key not in own.known:
                return [n]
        inferred = n.kind is NotificationKind.DELETE and delete_is_inferred(n, self._tracker, self.sent)
        return own.admit(n, inferred)

    # ---- deletes already sent ------------------------------------------------------------------------

    def _hold_after(self, uid: str) -> str | None:
        sent = self.sent.get(uid)
        return None if sent is None else sent.hold_after()

    def held_back(self, obj: KubeObject) -> bool:
        """Whether a replayed add or update of ``obj`` is held back: it is newer than the state after
        which its uid's changes were never sent one by one, before a delete sinks may hold. Under a
        selector, a uid that lives on holds nothing back (its deletes were exits), one read as gone
        whose delete went out sends nothing more."""
        if not self.sent:
            return False
        uid, rv = object_identity(obj)
        after = self._hold_after(uid)
        if after is None:
            return False
        if self._exits is not None:
            if uid in self._closed:
                return True
            if self._fate.get(uid) is not None:
                return False
        held = not rv_at_most(rv, after)
        if held:
            self._held.add(uid)
            self._coalesced_hold = True  # announced by the replayed delete's window
        return held

    def delete(self, n: Notification, framing: Framing) -> list[ChangeEvent]:
        """The events of a delete notification: marked inferred as it was sent, framed as a gap when
        its uid's replayed changes were held back; nothing after a selector-scoped uid closed."""
        obj = _object(n)
        uid = object_identity(obj)[0]
        if self._closed and uid in self._closed:
            return []
        inferred = delete_is_inferred(n, self._tracker, self.sent)
        event = framing.event(EventType.DELETED, obj, n.time, final_state_unknown=inferred)
        if self._exits is not None and self._fate.get(uid) is None and self._hold_after(uid) is not None:
            self._closed.add(uid)  # read as gone: nothing of it after this delete
        # A relisted state whose coalesced changes were held, merged into this delete by the sink's
        # overflow window: the delete goes out in its place, framed from that relist's window's
        # start (_in_place_of_relisted), or from the earlier of it and the replayed delete's.
        coalesced = self._held_relisted.pop(uid, None) if self._held_relisted else None
        replayed = bool(self._held) and uid in self._held
        if framing.in_gap or not (replayed or coalesced):
            return [event]
        self._held.discard(uid)
        before = (self._hold_after(uid) or "") if replayed else ""
        if coalesced is not None and (not replayed or _earlier(coalesced[1], before)):
            _, since, how = coalesced
            gap_id = f"{framing.gap_prefix}:{how}:{uid}:{since}:{object_identity(obj)[1]}"
            return framing.framed(event, gap_id, since, n.time)
        return framing.framed(event, f"{framing.gap_prefix}:replayed:{uid}:{before}", before, n.time)

    async def ask_fate(self, n: Notification) -> None:
        """Under a selector, asks once whether the uid of a replayed change lives on, when what
        :meth:`held_back` decides depends on it: a change newer than its inferred delete's state, or
        a delete."""
        if self._exits is None or not self.sent or n.kind not in _CHANGE_KINDS:
            return
        obj = _object(n)
        uid, rv = object_identity(obj)
        after = self._hold_after(uid)
        if after is None or uid in self._fate:
            return
        if n.kind is not NotificationKind.DELETE and rv_at_most(rv, after):
            return  # sent again whatever the answer
        namespace, _, name = raw_object_key(obj).rpartition("/")
        self._fate[uid] = await self._exits.alive(namespace, name, uid)

    def replayed_exit(self, uid: str, rv: str) -> bool | None:
        """Under a selector, for a delete of a uid whose fate was asked: True when it is an exit (the
        uid lives on at a later resourceVersion), False when it is a delete (the uid is gone); None
        when the question is the usual one (:meth:`SelectorExits.left`)."""
        if uid not in self._fate:
            return None
        alive = self._fate[uid]
        if alive is None:
            return False
        at = parse_rv(rv)
        return True if at is not None and at <= alive else None

    # ---- states a relist sent ------------------------------------------------------------------------

    def relisted(self, n: Notification, framing: Framing) -> list[ChangeEvent] | None:
        """What a replayed add or update becomes when a relist sent its object before a restart; None
        when that does not apply. Per relist that sent a state of the uid (its window, plan
        invariant 7), the changes after the relist's ``from`` and before the state it sent were
        coalesced, never sent: held back (those between two windows were observed: as usual); the
        state goes out again as the relist sent it (same type, same id), framed as a gap when
        something was held — in this run, or in an earlier one whose checkpoint the watch resumed
        from, inside the window — a sink that lagged across the crashes never received that relist's
        markers. A change past the window while what it coalesced is still held goes out in the
        state's place (:meth:`_in_place_of_relisted`)."""
        if not self._relisted and not self._overflowed:
            return None
        obj = n.obj
        assert not isinstance(obj, DeletedFinalStateUnknown)
        uid, rv = object_identity(obj)
        at = parse_rv(rv)
        window, how = self._window(uid, at)
        if window is None or at is None:
            if uid in self._held_relisted:
                return self._in_place_of_relisted(n, framing)
            return None  # not a relist's state, nor a change one coalesced: as usual
        since, until, added = window
        if at < int(until):
            # The first held change's old state is the one before the window (what a sink that
            # lacked the relist holds): the update that goes out in their place starts from it.
            self._held_relisted.setdefault(uid, (n.old, since, how))
            self._coalesced_hold = True
            return []
        resumed = self._resumed
        start = parse_rv(since)
        earlier = resumed is not None and start is not None and start < resumed < at
        held = uid in self._held_relisted or earlier
        old, since, how = self._held_relisted.pop(uid, (n.old, since, how))
        if added:
            event = framing.event(EventType.ADDED, obj, n.time)
        else:
            event = framing.event(EventType.UPDATED, obj, n.time, old=old)
        if not held or framing.in_gap:
            return [event]
        gap_id = f"{framing.gap_prefix}:{how}:{uid}:{since}:{until}"
        return framing.framed(event, gap_id, since, n.time)

    def _window(self, uid: str, at: int | None) -> tuple[RelistWindow | None, str]:
        """The window ``(from, state]`` holding resourceVersion ``at`` of ``uid`` — a relist's, or
        this sink's own overflow window's (plan invariant 8) — and which of the two it is. When both
        hold it, the one whose state is newer: the sink may hold that state, so ``at`` is held back
        unless it is that state."""
        if at is None:
            return None, ""
        sent = self._relisted.get(uid) if self._relisted else None
        window = sent.window(at) if sent is not None else None
        mine = self._overflowed.get(uid) if self._overflowed else None
        if mine is not None:
            since, until = parse_rv(mine[0]), parse_rv(mine[1])
            if since is not None and until is not None and since < at <= until \
                    and (window is None or until > int(window[1])):
                return mine, "overflowed"
        return (window, "relisted") if window is not None else (None, "")

    def _in_place_of_relisted(self, n: Notification, framing: Framing) -> list[ChangeEvent]:
        """A change after a relist's window while the changes it coalesced are held and its state
        never passed: the sink's own overflow window merged that state into this newer one
        (docs/delivery-contract.md, 7a). It goes out in the relisted state's place, framed from the
        window's start as that state would have been: the overflow window starts at the last change
        handed over, after what was held back, and names none of it."""
        obj = _object(n)
        uid, rv = object_identity(obj)
        old, since, how = self._held_relisted.pop(uid)
        if n.kind is NotificationKind.ADD:
            event = framing.event(EventType.ADDED, obj, n.time)
        else:
            event = framing.event(EventType.UPDATED, obj, n.time, old=old)
        if framing.in_gap:
            return [event]
        return framing.framed(event, f"{framing.gap_prefix}:{how}:{uid}:{since}:{rv}", since, n.time)

    def take_coalesced_hold(self) -> bool:
        """Whether the change just held back was one a relist coalesced, announced by what is re-sent
        next of its object (the relisted state, or the replayed delete, framed by their window): its
        acknowledgement waits for that one's; clears the answer."""
        held, self._coalesced_hold = self._coalesced_hold, False
        return held


class SinkResume:
    """One sink's own progress while the informer resumes from the slowest sink's point.

    The cache is seeded with the union of what the sinks know (per object the oldest state a sink
    knows); each sink's notifications pass this filter:

    * a change at or below the sink's own resume point, or at or below what it acknowledged of that
      object, is skipped (acknowledged, not delivered);
    * a delete of a uid the sink never knew, or already knows deleted, is dropped — unless the uid
      is one it *may* hold (:attr:`maybe`, the journal's), which always gets its delete;
    * an add of an object the sink knows becomes an update (dropped at the resourceVersion it has),
      an update of one it never knew becomes an add;
    * a relist's tombstone of an object it knows under another uid goes out as a delete of its own;
    * a change of an earlier object of a key it owes (:attr:`owes`: it acknowledged a later one
      first) passes as it is.

    **Invariant**: for every key in :attr:`known` the sink's knowledge differs from what the informer
    last notified about the key; for every other key they agree. A key leaves :attr:`known` once the
    sink receives (or is found to hold) the informer's state; the filter is dropped once it is empty
    and the informer passed the sink's point.

    **Invariant** on deletes: a delete is dropped only when the sink *certainly* does not hold the
    uid. A delete too many is harmless (a uid is deleted once); one too few leaves a phantom.
    """

    __slots__ = ("_api_version", "_floor", "_kind", "known", "maybe", "owes", "passed_at", "resource_version",
                 "skipped")

    def __init__(self, *, resource_version: int, known: Mapping[str, Known | tuple[str, int, bool]],
                 maybe: Iterable[str] = (), owes: Mapping[str, Mapping[str, int]] | None = None,
                 api_version: str = "", kind: str = "", floor: Callable[[str], int] | None = None,
                 floor_max: int = 0) -> None:
        """``maybe``: uids the sink may hold beyond what ``known`` says. ``api_version`` and ``kind``:
        the delete of an object known only to this sink carries a stub of that kind. ``floor`` (by
        uid): a later point up to which it acknowledged an object (after a reshard; at most
        ``floor_max``)."""
        self._api_version = api_version
        self._kind = kind
        self._floor = floor
        self.resource_version = resource_version
        """Every change up to it was acknowledged by this sink."""
        self.passed_at = max(resource_version, floor_max) if floor is not None else resource_version
        """Once the informer passed it, the filter only needs to look at :attr:`known`."""
        self.known: dict[str, Known] = {key: Known(*k) for key, k in known.items()}
        self.maybe: set[str] = set(maybe)
        self.owes: Mapping[str, Mapping[str, int]] = owes or {}
        """key → what it owes of objects earlier than the one it knows there (``owes_change``)."""
        self.skipped = 0
        """Notifications acknowledged without delivery because the sink had them already."""

    @classmethod
    def of(cls, start: SinkStart, *, api_version: str, kind: str) -> SinkResume | None:
        """The filter of a sink's part of the plan (None unless it resumes from its own progress)."""
        if start.kind is not SinkStartKind.OWN_PROGRESS:
            return None
        return cls(resource_version=start.resource_version, known=start.known, maybe=start.maybe,
                   owes=start.owes, api_version=api_version, kind=kind, floor=start.floor,
                   floor_max=start.floor_max)

    def admit(self, n: Notification, inferred: bool) -> list[Notification]:
        """What the sink receives for ``n`` (empty: skip it); ``inferred``: a delete a relist inferred."""
        kind = n.kind
        if kind is NotificationKind.SNAPSHOT or kind is NotificationKind.GAP:
            return [n]
        key = n.key or object_key(n.obj)
        uid, rv_text = _uid_rv(n)
        rv = parse_rv(rv_text)
        known = self.known
        mine = known.get(key)
        covered = self.resource_version
        if self._floor is not None:
            covered = max(covered, self._floor(uid))
        if self.owes and mine is not None and rv is not None \
                and owes_change(self.owes.get(key), mine, uid, rv):
            return [n]  # a change of an earlier object of the key it owes (it acknowledged a later one)
        if kind is NotificationKind.DELETE:
            return self._admit_delete(n, key, mine, inferred=inferred, uid=uid, rv=rv, covered=covered)
        if rv is not None and rv <= covered:
            if mine is not None and mine == (uid, rv, False):
                del known[key]
            return self._skip()
        if mine is None:
            return [n]
        knows = not mine.deleted and mine.uid == uid
        if (mine.deleted and mine.uid == uid) or (rv is not None and rv <= mine.resource_version
                                                  and (knows or mine.deleted)):
            if knows and rv == mine.resource_version:
                del known[key]
            return self._skip()  # it has this state, or saw the object deleted after it
        if not mine.deleted and rv is not None and rv < mine.resource_version:
            return self._skip()  # older than the other incarnation it has: replayed history
        del known[key]
        out: list[Notification] = []
        if not mine.deleted and mine.uid != uid:
            out.append(self._delete_own(n, key, mine))  # the incarnation it knows is gone
        if knows and kind is NotificationKind.ADD:
            out.append(dataclasses.replace(n, kind=NotificationKind.UPDATE, is_in_initial_list=False))
        elif not knows and kind is NotificationKind.UPDATE:
            out.append(dataclasses.replace(n, kind=NotificationKind.ADD, old=None, is_resync=False))
        else:
            out.append(n)
        return out

    def _admit_delete(self, n: Notification, key: str, mine: Known | None, *, inferred: bool,
                      uid: str, rv: int | None, covered: int) -> list[Notification]:
        """What the sink receives for a delete of ``uid`` (see the class docs and invariants)."""
        known = self.known
        # A relist found the key gone; an UnconfirmedGone only says one journal-only object of the
        # key is gone (the key may live on: the relist's own notification of it follows).
        gone_only = isinstance(n.obj, UnconfirmedGone)
        tombstone = isinstance(n.obj, DeletedFinalStateUnknown) and not gone_only
        maybe = bool(self.maybe) and uid in self.maybe
        if maybe:
            self.maybe.discard(uid)
        if not inferred and rv is not None and rv <= covered:
            if mine is not None:
                self._forget(key, mine, uid, rv)  # gone for both: it acknowledged this very delete
            return self._skip()
        if mine is None:
            return [n]
        holds_it = not mine.deleted and mine.uid == uid
        if holds_it or maybe:
            if holds_it or (mine.deleted and mine.uid in ("", uid)):
                if gone_only:
                    known[key] = HOLDS_NOTHING  # it has nothing there; what the key holds is news
                else:
                    del known[key]
                return [n]
            if mine.deleted:
                return [n]  # it saw another object of the key deleted: that stays known
            if tombstone:
                del known[key]
                return [n, self._delete_own(n, key, mine)]
            return [n]  # its other object stays known: its delete or replacement follows
        if mine.deleted:
            if not gone_only:
                self._forget(key, mine, uid, rv)  # gone for both (or the add of the key's new object follows)
            return self._skip()  # a uid it never knew, or already saw deleted
        if tombstone and inferred:
            del known[key]
            return [self._delete_own(n, key, mine)]
        # A uid it never knew while it holds another: an observed delete of a stale incarnation,
        # the old object of a re-creation (the add follows) or a journal-only object gone.
        return self._skip()

    def _forget(self, key: str, mine: Known, uid: str, rv: int | None) -> None:
        """The sink's knowledge of ``key`` meets the informer's at a delete of ``uid`` (at ``rv``),
        unless that knowledge is of a later object of the key (acknowledged past its own point)."""
        if mine.uid in ("", uid) or rv is None or mine.resource_version <= rv:
            del self.known[key]

    def _skip(self) -> list[Notification]:
        self.skipped += 1
        return []

    def _delete_own(self, n: Notification, key: str, mine: Known) -> Notification:
        """A relist's delete of the object this sink knows (its own uid and resourceVersion)."""
        namespace, _, name = key.rpartition("/")
        meta: dict[str, str] = {"name": name, "uid": mine.uid, "resourceVersion": str(mine.resource_version)}
        if namespace:
            meta["namespace"] = namespace
        stub: KubeObject = {"apiVersion": self._api_version, "kind": self._kind, "metadata": meta}
        return dataclasses.replace(n, kind=NotificationKind.DELETE,
                                   obj=DeletedFinalStateUnknown(ObjectKey(key), stub), old=None)
