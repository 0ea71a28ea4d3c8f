"""The restart stage: every decision about a change after a restart, from the resume plan, in one place.

At start :func:`~bridge.delivery.resume_plan.load_start` builds one immutable
:class:`~bridge.delivery.resume_plan.ResumePlan` per informer; :class:`RestartStage` applies it. It
seeds the informer (its one restart hook, :class:`~bridge.informer.seed.CacheSeed`: a cache at a
resourceVersion), sees every notification before the sinks' listeners (:class:`InformerRestart`,
the informer's processing around HandleDeltas, for what holds for every sink), and gives each sink's
listener its own part (:class:`~bridge.delivery.replay.ReplayStage`, the first thing the listener
does with a notification, before the sink's delivery chain). The informer holds no restart rule;
once nothing is left to decide, both parts step aside (the informer applies every delta itself, a
sink's listener drops its filter).

**Decision table** (kind of change, plan record: action). "Replayed": the watch resumed from the
checkpoint's base (the slowest sink's point) shows it again; "relist": the resume point expired, a
list reports differences, framed by gap markers. Rows are applied top to bottom; the first part
(every sink) is decided before any sink sees the change, the second per sink.

==================================  ========================  ================================================
change                              plan record               action
==================================  ========================  ================================================
*every sink* (:class:`InformerRestart`), before any sink sees the change

replayed add, update or delete at   ``delivered`` (every      the cache takes it; nobody is notified
or below the key's acknowledged     sink acknowledged it      (``suppressed_replays``)
resourceVersion                     past the checkpoint)

relist tombstone of a key           ``delivered`` (deleted)   nobody is notified, unless the cached state is
acknowledged deleted                                          newer than that delete (a later object of the
                                                              name): that delete goes out

add or update past the              ``delivered`` (deleted)   a plain add (the stale cached state is
acknowledged delete                                           forgotten, not deleted a second time)

relist tombstone of a key           ``delivered``             as usual (the entry is dropped)
acknowledged alive; any other
change past the entry

relist item unchanged (same         ``diverging`` (a sink     an update, not a resync, so that each sink's
resourceVersion)                    knows it otherwise)       filter compares it; until anything of the key
                                                              was notified

relist item or tombstone of the     ``unconfirmed`` (known    each journal-only object of another uid: a
key                                 to the journal only)      delete (``UnconfirmedGone``, final state
                                                              unknown) before the item

list item or watch add of the       ``unconfirmed``           an add, as on a first start (the object is
unconfirmed uid                                               confirmed)

watch update of the unconfirmed     ``unconfirmed``           an update of the stub (it existed before the
uid                                                           watch: the same event as before the crash)

watch change of another uid of the  ``unconfirmed``           that uid's own add or delete, never an update of
key                                                           the stub; the stub stays known to the next
                                                              relist's tombstones

the first list                      ``list_at`` (no           at exactly it, states as on a first start, then
                                    checkpoint, the first     the watch from it; journal-only objects taken in
                                    list unacknowledged)      at its end (those it returned are vouched for);
                                                              expired (410): a consistent list framed from it,
                                                              against all of them

the first list                      ``frame_from``            framed as a gap from it

*per sink* (:class:`~bridge.delivery.replay.ReplayStage`), first thing in the sink's listener

anything                            ``SinkStart`` BOOTSTRAP   nothing until its bootstrap snapshot (the
                                                              listener's gate)

change at or below its own resume   ``SinkStart``             skipped (acknowledged, not sent)
point, or what it acknowledged of   OWN_PROGRESS (``known``)
the object

delete of a uid it never knew, or   OWN_PROGRESS              dropped, unless the uid is ``maybe`` (the
knows gone                                                    journal's): always sent

add of an object it knows; update   OWN_PROGRESS              an update; an add
of one it never knew

relist tombstone while it knows     OWN_PROGRESS              also a delete of the object it knows
another uid

change of an earlier object it      OWN_PROGRESS              sent as it is
``owes``

replayed delete of a uid whose      ``SentDelete``            re-sent as it was: its resourceVersion and
delete went out                                               ``finalstateunknown`` mark, hence its id

replayed add or update newer than   ``SentDelete``            held back (acknowledged once the delete re-sent
that delete's hold point                                      is); the delete framed by gap
                                                              ``<informer>:replayed:<uid>:<from>``

replayed change inside a relist's   ``RelistedState``         held back (acknowledged once that state is)
window, older than the state it
sent

the state the relist sent           ``RelistedState``         re-sent with the same type (same id), framed
                                                              ``<informer>:relisted:<uid>:<since>:<at>`` when
                                                              something was held (now, or by an earlier run
                                                              whose checkpoint lies inside the window)

change between two windows, or      ``RelistedState``         as usual, in order
after the last

replayed change inside the window   ``Overflowed`` (this      as for a relist's state, the window framed
of a state the sink's overflow      sink's: its degraded      ``<informer>:overflowed:<uid>:<from>:<at>``; a
window sent, or that state          listener sent it)         delete as a ``SentDelete`` held back from
                                                              ``<from>``

under a selector: replayed change   ``SentDelete`` and the    asked once whether the uid lives on: then
of a uid whose inferred delete      selector                  nothing is held (its deletes were exits); gone:
went out                                                      nothing after its replayed delete

anything else                       none                      as usual
==================================  ========================  ================================================

**What happens to a delete replayed after a crash?** When every sink acknowledged it before the
crash (the checkpoint's delivered-ahead entry covers it) the cache drops the object and nobody is
notified. Otherwise each sink decides on its own: a sink that acknowledged it beyond its own resume
point skips it, a sink that certainly never held the uid drops it (a uid it *may* hold always gets
its delete), every other sink gets it — and when the journal says it went out before the crash
(``SentDelete``), exactly as it went out then (same resourceVersion, same ``finalstateunknown``
mark: the same id), framed as a gap when the uid's later replayed changes were held back.

The rules behind each row, and the tests that pin them: docs/delivery-contract.md, section 4a, and
the invariants of :mod:`bridge.delivery.resume_plan`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from bridge.clock import Clock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    KeyFunc,
    KubeObject,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.bootstrap import Bootstrap
from bridge.delivery.informer_run import InformerRun
from bridge.delivery.journal import KnownObjectJournal
from bridge.delivery.journal_records import Overflowed, RelistWindow
from bridge.delivery.progress import AckTracker
from bridge.delivery.replay import ReplayStage, SinkResume, delete_is_inferred
from bridge.delivery.resume_plan import ResumePlan, SentDelete, SinkStart, SinkStartKind
from bridge.delivery.selector_exit import SelectorExits
from bridge.delivery.sink_listener import SinkListener
from bridge.informer.delta_fifo import Delta, DeltaType
from bridge.informer.seed import ApplyDelta, CacheSeed, Distribute, SeedStart
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.informer.store import IndexedCache
from bridge.rawobject import object_identity
from bridge.resource_version import parse_rv, rv_at_most

__all__ = ["InformerRestart", "RestartStage"]

log = logging.getLogger(__name__)


async def _unnotified(_n: Notification, _sync: bool) -> None:
    """Where the notifications of a change nobody is told about go."""


class InformerRestart:
    """The rows of the decision table that hold for every sink (module docs): the informer's
    processing around HandleDeltas (:class:`~bridge.informer.seed.SeedProcess`) while any is left."""

    def __init__(self, *, delivered: Mapping[str, tuple[int, bool]] | None = None,
                 diverging: Iterable[str] = (), unconfirmed: Sequence[KubeObject] = ()) -> None:
        """``delivered``: key → (resourceVersion, deleted), the changes every sink acknowledged past
        the checkpoint; ``diverging``: keys some sink knows otherwise than the cache;
        ``unconfirmed``: objects (stubs) sinks may have received that the seed does not vouch for."""
        self._suppress: dict[str, tuple[int, bool]] = dict(delivered or {})
        self._diverging: set[str] = set(diverging)
        """Keys whose next same-resourceVersion relist item is notified anyway."""
        self._unconfirmed: dict[str, list[KubeObject]] = {}
        """key → objects sinks may have received that the informer resumed without."""
        self._given = list(unconfirmed)
        self._holding = False
        """An exact first list runs: the unconfirmed objects are taken in once it ended."""
        self._cache: IndexedCache | None = None
        self._key: KeyFunc | None = None
        self._distribute: Distribute = _unnotified
        self.suppressed_replays = 0
        """Changes replayed after a resume that every sink had acknowledged (notified to nobody)."""

    def seed(self, informer: SharedIndexInformer, *, objects: Sequence[KubeObject] = (),
             resource_version: str = "", start: SeedStart | None = None) -> None:
        """Seeds ``informer`` (its cache, where it starts) and puts this part in front of its
        handlers while it has anything to decide."""
        how = start or (SeedStart.WATCH if resource_version else SeedStart.LIST)
        if (self._suppress or self._diverging) and how is not SeedStart.WATCH:
            raise ValueError(f"informer {informer.name!r}: acknowledged changes need a resumed watch")
        active = bool(self._suppress or self._diverging or self._given)
        informer.seed(CacheSeed(objects=objects, resource_version=resource_version, start=how,
                                process=self if active else None))
        self._cache, self._key = informer.get_indexer(), informer.key_func
        given, self._given = self._given, []
        if how is SeedStart.LIST_EXACT:
            self._holding, self._given = True, given
        else:
            self._take_unconfirmed(given, listed=False)

    @property
    def idle(self) -> bool:
        return not (self._suppress or self._diverging or self._unconfirmed or self._holding)

    # ---- SeedProcess -------------------------------------------------------------------------------

    async def process(self, delta: Delta, is_in_initial_list: bool, apply: ApplyDelta,
                      distribute: Distribute) -> bool:
        emit = distribute
        if self._diverging:
            self._distribute, emit = distribute, self._emit
        unconfirmed = self._unconfirmed
        if unconfirmed and (key := self._key_of(delta.object)) in unconfirmed:
            for gone in self._settle_unconfirmed(delta, key):
                await distribute(gone, False)
            await self._apply(delta, is_in_initial_list, apply, emit)
            stubs = unconfirmed.get(key)
            cache = self._cache
            assert cache is not None
            if stubs and cache.get_by_key(key) is None:
                cache.add(stubs[-1])  # known again to the next relist's tombstones
        else:
            await self._apply(delta, is_in_initial_list, apply, emit)
        return not self.idle

    def first_list(self, listed: bool) -> None:
        """The exact first list ended (``listed``: the objects it returned under their uid are
        vouched for) or expired (all of them are taken in before the list that replaces it)."""
        if self._holding:
            self._holding = False
            given, self._given = self._given, []
            self._take_unconfirmed(given, listed=listed)

    def _key_of(self, obj: object) -> ObjectKey:
        assert self._key is not None
        return self._key(obj)

    async def _apply(self, delta: Delta, is_in_initial_list: bool, apply: ApplyDelta,
                     emit: Distribute) -> None:
        if self._suppress and self._suppressed(delta, self._key_of(delta.object)):
            await apply(delta, is_in_initial_list, _unnotified)  # the cache takes it
            self.suppressed_replays += 1
            return
        await apply(delta, is_in_initial_list, emit)

    async def _emit(self, n: Notification, sync: bool) -> None:
        """A notification of a diverging key: notified whatever the resync says, once."""
        diverging = self._diverging
        if diverging and n.key in diverging and n.kind is not NotificationKind.ADD:
            diverging.discard(n.key)  # notified now, one way or another
            if n.is_resync:
                n.is_resync = sync = False
        await self._distribute(n, sync)

    # ---- unconfirmed objects -----------------------------------------------------------------------

    def _take_unconfirmed(self, objects: Iterable[KubeObject], *, listed: bool) -> None:
        """Makes ``objects`` the unconfirmed ones; ``listed``: after the exact first list, whose
        objects (the same uid under the key) it vouches for. Where the cache has nothing under the
        key, the newest takes the key's place, so that a relist's tombstones cover it."""
        cache = self._cache
        assert cache is not None
        for obj in objects:
            key = self._key_of(obj)
            cached = cache.get_by_key(key)
            if listed and cached is not None and object_identity(cached)[0] == object_identity(obj)[0]:
                continue
            stubs = self._unconfirmed.setdefault(key, [])
            if cached is None or object_identity(cached)[0] in {object_identity(s)[0] for s in stubs}:
                cache.add(obj)
            stubs.append(obj)

    def _settle_unconfirmed(self, delta: Delta, key: ObjectKey) -> list[Notification]:
        """Before a delta of a key with unconfirmed objects: the unconfirmed object the delta is
        about is forgotten, so the delta reports it afresh (a watch's update: as the update of it);
        a relist's delta (a list item, or a tombstone) also reports every other one deleted.
        Returns those deletes, to be distributed before the delta."""
        cache = self._cache
        assert cache is not None
        stubs = self._unconfirmed[key]
        obj = delta.object
        relist = delta.type is DeltaType.REPLACED or isinstance(obj, DeletedFinalStateUnknown)
        uid = object_identity(obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj)[0]
        cached = cache.get_by_key(key)
        cached_uid = object_identity(cached)[0] if cached is not None else ""
        gone: list[Notification] = []
        keep: list[KubeObject] = []
        for stub in stubs:
            stub_uid = object_identity(stub)[0]
            is_slot = stub_uid == cached_uid
            if stub_uid == uid and not isinstance(obj, DeletedFinalStateUnknown):
                if is_slot and delta.type is not DeltaType.UPDATED:
                    cache.delete_key(key)  # reported afresh: an add
                continue  # a watch's update: an update of the stub (it existed before the watch)
            if not relist:
                keep.append(stub)
                if is_slot:
                    cache.delete_key(key)  # another object's change: not an update of it
                continue
            if is_slot:
                if isinstance(obj, DeletedFinalStateUnknown):
                    continue  # the relist's own tombstone for the key reports it
                cache.delete_key(key)
            gone.append(Notification(kind=NotificationKind.DELETE, obj=UnconfirmedGone(key, stub), key=key))
        if keep:
            self._unconfirmed[key] = keep
        else:
            del self._unconfirmed[key]
        return gone

    # ---- changes every sink acknowledged -----------------------------------------------------------

    def _suppressed(self, delta: Delta, key: ObjectKey) -> bool:
        """True when ``delta`` only repeats a change every sink acknowledged before the restart;
        the key's entry is dropped once the changes move past it."""
        mark = self._suppress.get(key)
        if mark is None:
            return False
        delivered_rv, deleted = mark
        obj = delta.object
        if isinstance(obj, DeletedFinalStateUnknown):
            del self._suppress[key]
            if not deleted:
                return False  # a relist found it gone: consumers must see the delete now
            # The acknowledged delete vouches only for what the key held up to it. A cached state
            # newer than it (an object the journal or some sink's own progress knows, created after
            # that delete) is a later incarnation whose delete no consumer has seen.
            cached = parse_rv(object_identity(obj.obj)[1])
            return not (cached is not None and cached > delivered_rv)
        try:
            rv = int(object_identity(obj)[1])
        except ValueError:
            del self._suppress[key]
            return False
        if rv <= delivered_rv:
            return True
        del self._suppress[key]
        if deleted and delta.type is not DeltaType.DELETED:
            # Re-created after a delete consumers already saw: forget the stale cached state so this
            # is reported as a plain add, not a second delete of the old object.
            assert self._cache is not None
            self._cache.delete_key(key)
        return False


class RestartStage:
    """One informer's restart, from its plan: the acknowledgement tracker it starts from, the
    informer's seed with the part that holds for every sink (:class:`InformerRestart`), and each
    sink's (:meth:`for_sink`)."""

    def __init__(self, plan: ResumePlan, *, watched: WatchedResource, clock: Clock,
                 journal: KnownObjectJournal | None) -> None:
        self.plan = plan
        self._clock = clock
        cp = plan.checkpoint
        self.tracker = AckTracker(
            name=watched.informer_id, resource_version=cp.resource_version if cp else "",
            index=cp.objects if cp else None, ahead=cp.ahead if cp else None, now=clock.now,
            on_first_resume_point=journal.acknowledged if journal is not None else None)
        """The informer's acknowledgement tracker, started from the plan's checkpoint."""
        self.tracker.seed_last_seen(plan.last_seen)
        self.informer_part: InformerRestart | None = None
        """Built when the informer is seeded (:meth:`seed`)."""
        self._inf: InformerRun | None = None
        self._extra = {"informer": watched.informer_id, "resource": watched.ref.qualified}

    def delete_is_inferred(self, n: Notification) -> bool:
        """Whether a delete goes out marked ``finalstateunknown``: as it went out before the restart
        when the plan says it was sent (:func:`~bridge.delivery.replay.delete_is_inferred`)."""
        return delete_is_inferred(n, self.tracker, self.plan.sent_deletes)

    async def seed(self, inf: InformerRun) -> None:
        """Seeds the informer from the plan (its cache and resume point, or how its first list
        goes), after the bootstrap, if any sink needs one, replaced stubs by whole objects."""
        self._inf, plan, clock = inf, self.plan, self._clock
        seeds, unconfirmed = list(plan.seeds), list(plan.unconfirmed)
        if plan.bootstrapping:
            inf.bootstrap = Bootstrap(informer=inf.informer, thresholds=inf.observer.thresholds,
                                      watched=inf.watched, sinks=plan.bootstrapping, clock=clock,
                                      covered=inf.save_soon)
            seeds, unconfirmed = await inf.bootstrap.hydrate(seeds, unconfirmed)
        if plan.dropped_sinks:
            log.info("the checkpoint has progress of sinks no longer configured for this resource "
                     "(%s); it is dropped at the next checkpoint write", ", ".join(plan.dropped_sinks),
                     extra=self._extra)
        cp = plan.checkpoint
        part = self.informer_part = InformerRestart(delivered=plan.delivered, diverging=plan.diverging,
                                                    unconfirmed=unconfirmed)
        if cp is not None:
            part.seed(inf.informer, objects=seeds, resource_version=cp.resource_version,
                      start=SeedStart.WATCH)
        elif plan.list_at:
            part.seed(inf.informer, resource_version=plan.list_at, start=SeedStart.LIST_EXACT)
        else:
            part.seed(inf.informer, resource_version=plan.frame_from, start=SeedStart.LIST)
        if cp is not None:
            inf.saved_rv = cp.resource_version
            inf.saved_generation = -1 if plan.rewrite else inf.tracker.generation
            log.info("resuming from %s at resourceVersion %s (%d known objects)",
                     "the journal's first list" if cp.sinks is None and plan.rewrite else "checkpoint",
                     cp.resource_version, len(cp.objects), extra=self._extra)
        self._report_journal(inf, unconfirmed)

    def _report_journal(self, inf: InformerRun, unconfirmed: Sequence[KubeObject]) -> None:
        cp = self.plan.checkpoint
        if (journal := inf.journal) is not None and journal.unreadable:
            # The objects it recorded (delivered after the last checkpoint write) are unknown, so a
            # delete of one while the bridge was down may reach no sink. Resumed from a checkpoint,
            # the watch replays every change since it (those deletes included); if that history
            # expired, the relist is framed by gap markers from the checkpoint's resourceVersion
            # anyway. Without a checkpoint, the first list is framed by gap markers from
            # resourceVersion 0 so that consumers learn it too.
            then = (f"; resuming from the checkpoint: if the server's history since resourceVersion "
                    f"{cp.resource_version} expired, the relist (framed by gap markers) cannot report "
                    "deletes of objects delivered after that checkpoint write" if cp is not None else
                    " and there is no checkpoint: a full list framed by gap markers from resourceVersion "
                    "0 (objects delivered before and deleted while the bridge was down get no delete)")
            log.warning("known-object journal %s cannot be read (%s)%s", journal.backend.name,
                        journal.unreadable, then, extra=self._extra)
        if unconfirmed:
            log.info("%d objects delivered after the last checkpoint write are known from the journal",
                     len(unconfirmed), extra=self._extra)

    def for_sink(self, name: str, exits: SelectorExits | None
                 ) -> tuple[ReplayStage | None, Callable[[], None] | None]:
        """One sink's part: its replay stage (None: nothing to replay) and, for a sink the
        checkpoint does not cover, the callback its bootstrap gate runs once it has its snapshot."""
        inf, plan = self._inf, self.plan
        assert inf is not None, "seed() first"
        start = plan.sinks[name]
        bootstrap = (functools.partial(inf.bootstrap.done, name)
                     if inf.bootstrap is not None and start.kind is SinkStartKind.BOOTSTRAP else None)
        mine = plan.overflowed.get(name)
        if not (start.kind is SinkStartKind.OWN_PROGRESS or plan.sent_deletes or plan.relisted or mine):
            return None, bootstrap
        ref = inf.watched.ref
        own = SinkResume.of(start, api_version=ref.api_version, kind=ref.kind)
        sent, overflowed = _own_windows(plan.sent_deletes, mine or {})
        replay = ReplayStage(own=own, sent=sent, relisted=plan.relisted, tracker=self.tracker,
                             exits=exits, overflowed=overflowed)
        return replay, bootstrap

    def attached(self, name: str, listener: SinkListener) -> None:
        """A sink resuming from its own progress follows the informer from its own point on."""
        replay = listener.replay
        if replay is None or replay.own is None:
            return
        start: SinkStart = self.plan.sinks[name]
        assert self._inf is not None, "seed() first"
        self._inf.observer.thresholds.add(replay.own.passed_at, listener.own_progress_passed)
        # Its knowledge differs from the base: its own progress follows every change from the
        # first one (see AckTracker.follow_listener).
        self.tracker.follow_listener(name, start.resource_version, start.section)
        log.info("sink %s resumes from its own resourceVersion %d (%d objects where it differs "
                 "from the slowest sink's)", name, start.resource_version, len(start.known),
                 extra={"sink": name, **self._extra})


def _own_windows(sent: Mapping[str, SentDelete], mine: Mapping[str, Overflowed]
                 ) -> tuple[Mapping[str, SentDelete], dict[str, RelistWindow]]:
    """One sink's part of plan invariant 8: the states its overflow window sent, as windows of its
    own (uid → (from, state, added)), and the deletes among them as deletes already sent whose uid's
    replayed changes are held back from the window's ``from`` (the earlier of it and the plan's)."""
    if not mine:
        return sent, {}
    deletes = dict(sent)
    windows: dict[str, RelistWindow] = {}
    for uid, o in mine.items():
        if o.type != "deleted":
            windows[uid] = (o.since, o.resource_version, o.type == "added")
            continue
        before = deletes.get(uid)
        held = o.since
        if before is not None and before.held_after and rv_at_most(before.held_after, held):
            held = before.held_after
        deletes[uid] = SentDelete(o.key, o.resource_version, before.inferred if before is not None else False,
                                  held)
    return deletes, windows

