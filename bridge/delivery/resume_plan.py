"""The resume plan: what a restart does, decided once, from what the previous runs left behind.

At start :func:`load_start` reads, per informer, the checkpoint (or, after a reshard, the checkpoints
it takes over: :func:`~bridge.delivery.sharding.take_over`), the known-object journal and its
first-list record, and :func:`build_plan` turns them into one immutable :class:`ResumePlan`. A
corrupt or unreadable checkpoint is reported as a WARNING and the informer starts as without one (a
full list; consumers see every object again). Nothing else decides how a restart behaves: one
restart stage applies the plan (:mod:`bridge.delivery.restart`, whose docstring is the decision
table): the tracker starts from its checkpoint, the informer is seeded from it (its cache and where
it starts), what holds for every sink (the changes every sink acknowledged, the objects only the
journal knows, the keys some sink knows otherwise) is decided before any sink sees a change, and
each sink's listener gets its part of the plan (:class:`SinkStart`, the deletes already sent, the
states a relist sent) as its replay stage (:mod:`bridge.delivery.replay`).

The plan's records are typed: :class:`SentDelete` (a delete sinks may hold), :class:`RelistedState`
(a state a relist sent inside its gap), :class:`Known` (what one sink knows of one object).
resourceVersions are compared in one way only (:func:`parse_rv`): as etcd revisions, integers; a
text that is not one compares as unknown.

**Invariants** (each pinned by a test of ``tests/checkpoint/test_resume_plan.py``):

1. *Resume point.* The watch resumes from the checkpoint's resourceVersion; without a checkpoint,
   from the first list of the previous run once every sink acknowledged a resume point (the
   journal's :class:`~bridge.delivery.journal_records.ListStart`), with the journal's objects up to
   it as the checkpoint they would have written — unless the journal holds a delete newer than
   that list (the object's state at the list is lost): then as in invariant 6. Without either, the
   informer lists (a list framed as a gap from resourceVersion 0 when the journal was unreadable).
2. *Nothing any sink may hold is unknown.* Every object of the checkpoint, of any sink's own
   progress and of the journal is in the cache seed or the unconfirmed objects, so a relist reports
   each one that is gone as deleted.
3. *A delete already sent is re-sent as it was.* A journalled delete of an object the checkpoint
   knows replaces the seed's resourceVersion by the delete's, and the delete goes out again with
   the same resourceVersion and ``finalstateunknown`` marking, hence the same id.
4. *Own progress.* A sink whose progress differs from the base gets a :class:`SinkStart` with its
   own resume point and, per object, what it knows where that differs from the cache (objects only
   other sinks know are :data:`HOLDS_NOTHING` for it); the journal's objects its own point does not
   cover are ``maybe`` (their delete is never dropped), unless its progress says it acknowledged
   that object's journalled state or a later object's of the name while owing nothing of it (a
   change past its own point, section 3); so are the uids whose delete its progress says it owes
   while it knows a later object of the name, whose changes it owes are sent (:func:`owes_change`:
   from the first one it did not acknowledge; after a relist's inferred delete, from after the
   state that delete was inferred from, a state it holds).
5. *Bootstrap.* A sink the checkpoint does not cover receives nothing before its bootstrap snapshot.
6. *A first list not yet acknowledged is listed again, exactly.* Without a checkpoint, when the
   journal's first list (:class:`~bridge.delivery.journal.ListStart`) is not acknowledged by every
   sink (or the journal's fact of an object listed there is a later one: a delete since — an
   inferred delete, recorded at the object's last state, may have come after it — or a relist's
   state since, invariant 1), the informer lists at exactly its
   resourceVersion (:attr:`ResumePlan.list_at`: the same states, so the same events, as an
   id-deduplicating consumer needs) and watches from it, so every change since comes one by one;
   the journal's objects become unconfirmed once that list ended (those it did not return —
   created later, or gone — are reported deleted by any later relist).
   Only when the server no longer has that resourceVersion (410) is the list a consistent one,
   framed as a gap from it, against those same unconfirmed objects.
7. *Only what a relist coalesced is held back.* For each relist that sent a state of a uid before a
   checkpoint covered it, the plan keeps that relist's own window, ``(from, state]``
   (:class:`RelistedState`, one window per relist, oldest first): a replayed change inside a window
   and older than its state is held back, the state is re-sent as that relist sent it, and every
   change between two windows — the watch showed it one by one, and a sink that lagged across the
   relists and the crash may lack it — goes out as usual, in order. (Merged into one window from
   the first relist's ``from`` to the last state, the changes observed between two relists were
   held back for good from every sink that lagged: issue 34.) Windows that overlap (a relist whose
   ``from`` lies before the state an earlier one sent, as after a restart) merge into one.
8. *What a sink's overflow window sent is that sink's own relist.* A state a degraded listener
   handed over inside its overflow window, from ``gapfrom``, was recorded (:class:`Overflowed`)
   before it went out: for that sink alone the plan keeps its window ``(gapfrom, state]``, held back
   and re-sent as invariant 7 says, a delete as a delete already sent, held back from ``gapfrom``
   (invariant 3). The window is one delivery, so a crash before its end was acknowledged leaves the
   sink's own progress before it: without the record the replay sent what the window coalesced one
   by one after the newer states the sink may hold (issue 34, judged with degraded sinks in full).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bridge.clock import Clock
from bridge.contracts import KubeObject
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.journal import KnownObjectJournal
from bridge.delivery.journal_records import (
    Deleted,
    Exists,
    JournalEntry,
    ListStart,
    Overflowed,
    Relisted,
    RelistWindow,
    entries_by_key,
)
from bridge.delivery.progress import HOLDS_NOTHING, Known
from bridge.delivery.sharding import Handover, TakeOver, take_over
from bridge.resource_version import ResourceVersion, parse_rv, rv_at_most
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStore,
    JournalStore,
    SinkProgress,
)
from sinks.contract import ResourceRef

__all__ = ["HOLDS_NOTHING", "Known", "RelistedState", "ResourceVersion", "ResumePlan", "SentDelete",
           "SinkStart", "SinkStartKind", "Start", "build_plan", "load_start", "owes_change", "parse_rv",
           "rv_at_most", "stub_objects"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SentDelete:
    """A delete sinks may hold (the journal's record): a restart re-sends it, if at all, as it was."""

    key: str
    resource_version: str
    inferred: bool
    """It went out with ``finalstateunknown`` (a relist inferred it)."""
    held_after: str = ""
    """The state after which the uid's replayed changes were never sent one by one (see
    :meth:`hold_after`)."""

    def hold_after(self) -> str | None:
        """The resourceVersion after which the uid's replayed changes are held back: an inferred
        delete's state (or an earlier relist's ``from`` when older), else the window an earlier
        replay held; None: nothing of it is held back."""
        held = self.held_after
        if self.inferred:
            older = held != self.resource_version and rv_at_most(held, self.resource_version)
            return held if older else self.resource_version
        return held or None


@dataclass(frozen=True, slots=True)
class RelistedState:
    """A state a relist sent inside its gap: the uid's changes after ``since`` and before ``at`` were
    coalesced, never sent one by one."""

    since: str
    at: str
    added: bool
    """Sent as ``added`` (else ``updated``): re-sent with the same type, hence the same id."""
    earlier: tuple[RelistWindow, ...] = ()
    """Earlier relists' windows of the uid (since, at, added), oldest first, each ending before the
    next begins: the changes between two windows were observed one by one (invariant 7)."""

    def window(self, rv: int) -> RelistWindow | None:
        """The relist window ``(since, at]`` holding ``rv``, if any."""
        for w in (*self.earlier, (self.since, self.at, self.added)):
            since, at = parse_rv(w[0]), parse_rv(w[1])
            if since is not None and at is not None and since < rv <= at:
                return w
        return None


class SinkStartKind(enum.Enum):
    AT_BASE = "at-base"
    """Its progress is the checkpoint's base: its listener filters nothing."""
    OWN_PROGRESS = "own-progress"
    """It resumes from its own progress (:class:`~bridge.delivery.replay.SinkResume`)."""
    BOOTSTRAP = "bootstrap"
    """The checkpoint does not cover it: nothing until its bootstrap snapshot."""


@dataclass(frozen=True, slots=True)
class SinkStart:
    """One sink's part of the plan."""

    kind: SinkStartKind
    resource_version: int = 0
    """Its own resume point (OWN_PROGRESS)."""
    section: Mapping[str, Known] = field(default_factory=dict)
    """Its checkpoint section's knowledge where it differs from the base (what its own-progress scan
    starts from, :meth:`~bridge.delivery.progress.AckTracker.follow_listener`)."""
    known: Mapping[str, Known] = field(default_factory=dict)
    """What its filter starts from: :attr:`section` plus what it does not hold of the cache."""
    maybe: frozenset[str] = frozenset()
    """uids it may hold whatever :attr:`known` says (the journal's, past its own point)."""
    owes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """key → what it owes of objects earlier than the one it knows there (:func:`owes_change`)."""
    floor: Callable[[str], int] | None = None
    """After a reshard: per uid, a later point up to which it acknowledged that object."""
    floor_max: int = 0


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """What one informer's restart does (see the module docs and their invariants)."""

    informer_id: str
    checkpoint: Checkpoint | None
    """What the tracker starts from: the checkpoint, or the one the journal's first list implies."""
    frame_from: str = ""
    """Without a checkpoint: the first list is framed as a gap from here ("" = not framed)."""
    list_at: str = ""
    """Without a checkpoint: the first list is at exactly this resourceVersion, then the watch from
    it (invariant 6; "" = a list as on a first start)."""
    seeds: tuple[KubeObject, ...] = ()
    """The cache's stubs (a resumed informer)."""
    unconfirmed: tuple[KubeObject, ...] = ()
    """Objects only the journal knows: a relist that does not return one reports it deleted."""
    delivered: Mapping[str, tuple[int, bool]] = field(default_factory=dict)
    """key → (resourceVersion, deleted): replayed changes up to it are suppressed for every sink."""
    diverging: frozenset[str] = frozenset()
    """Keys some sink knows differently from the cache."""
    last_seen: Mapping[str, str] = field(default_factory=dict)
    """Seeded objects the base does not know (only some sinks do): key → resourceVersion."""
    sent_deletes: Mapping[str, SentDelete] = field(default_factory=dict)
    """uid → the delete sinks may hold."""
    relisted: Mapping[str, RelistedState] = field(default_factory=dict)
    """uid → the state a relist sent."""
    overflowed: Mapping[str, Mapping[str, Overflowed]] = field(default_factory=dict)
    """sink → uid → the state the sink's overflow window handed over (the journal's, invariant 8)."""
    sinks: Mapping[str, SinkStart] = field(default_factory=dict)
    dropped_sinks: tuple[str, ...] = ()
    """Sinks the checkpoint has progress of that are no longer routed this resource."""
    rewrite: bool = False
    """The checkpoint is written at the first interval: its sinks are not the routed ones, or it
    is the one the journal's first list implies (the store has none)."""

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None

    @property
    def bootstrapping(self) -> frozenset[str]:
        return frozenset(n for n, s in self.sinks.items() if s.kind is SinkStartKind.BOOTSTRAP)


def owes_change(owe: Mapping[str, int] | None, known: Known, uid: str, rv: int) -> bool:
    """Whether a sink owes the change at ``rv`` of ``uid``, an object earlier than the one it knows
    under that key (``known``, acknowledged first): ``owe`` is its section's (per earlier object's
    uid — ``known``'s for every earlier object — the resourceVersion from which it owes its changes)."""
    if owe is None or uid == known.uid or rv >= known.resource_version:
        return False
    at = owe.get(uid, owe.get(known.uid))
    return at is not None and at <= rv


def stub_objects(resource: ResourceRef, index: Mapping[str, tuple[str, str]]) -> list[KubeObject]:
    """Metadata-only objects rebuilt from a checkpoint index (what a resumed informer knows)."""
    out: list[KubeObject] = []
    for key, (uid, rv) in index.items():  # key = "namespace/name" or "name"
        namespace, _, name = key.rpartition("/")
        meta: dict[str, Any] = {"name": name, "uid": uid, "resourceVersion": rv}
        if namespace:
            meta["namespace"] = namespace
        out.append({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta})
    return out


def build_plan(*, informer_id: str, ref: ResourceRef, checkpoint: Checkpoint | None,
               journal: Mapping[str, JournalEntry], start: ListStart | None, routed: Sequence[str],
               handover: Handover | None = None, journal_unreadable: bool = False) -> ResumePlan:
    """The plan of one informer (module docs). ``journal``: the journal's facts (uid → newest),
    ``start`` its first-list record, ``routed`` the sinks routed this resource, ``handover`` a
    reshard's take-over (per sink, where it acknowledged more of some objects). A journal that
    could not be read, without a checkpoint, frames the first list from resourceVersion 0 (what
    sinks hold from the previous run is unknown)."""
    frame_from = "0" if journal_unreadable else ""
    list_at = ""
    from_journal = False
    if checkpoint is None and start is not None:
        at = start.resource_version  # the journal keeps a uid's newest fact: a later one hides the listed
        if start.acknowledged and not any(_hides_the_list(e, at) for e in journal.values()):
            checkpoint = Checkpoint(informer_id=informer_id, resource_version=start.resource_version,
                                    objects={e.key: (uid, e.resource_version) for uid, e in journal.items()
                                             if not isinstance(e, Deleted)
                                             and rv_at_most(e.resource_version, start.resource_version)})
            from_journal = True
        else:
            list_at = start.resource_version
    known, sent, relisted, journal_only = _journal_facts(checkpoint, journal)
    stubs = tuple(stub_objects(ref, {key: (uid, rv)})[0] for key, uid, rv in journal_only)
    if checkpoint is None:
        return ResumePlan(informer_id=informer_id, checkpoint=None, frame_from=frame_from, list_at=list_at,
                          unconfirmed=stubs,
                          sent_deletes=sent, relisted=relisted,
                          sinks={name: SinkStart(SinkStartKind.AT_BASE) for name in routed})
    sections = {name: _own_section(checkpoint, s) for name in routed
                if checkpoint.sinks and (s := checkpoint.sinks.get(name)) is not None and not s.at_base}
    extra, diverging = _union(checkpoint, known, sections)
    known.update(extra)
    sinks: dict[str, SinkStart] = {}
    for name in routed:
        if checkpoint.sinks is not None and name not in checkpoint.sinks:
            sinks[name] = SinkStart(SinkStartKind.BOOTSTRAP)
            continue
        floor = handover.sink_floor(name) if handover is not None else None
        section = sections.get(name)
        if section is None and not (extra or floor is not None):
            sinks[name] = SinkStart(SinkStartKind.AT_BASE)
            continue
        rv, differs = section if section is not None else (int(checkpoint.resource_version), {})
        progress = checkpoint.sinks.get(name) if checkpoint.sinks else None
        sinks[name] = _own_start(rv, differs, extra, known, journal_only, floor=floor,
                                 floor_max=max(handover.sink_floors.get(name, {}).values(), default=0)
                                 if handover is not None else 0,
                                 progress=progress)
    delivered = {key: (int(rv), deleted) for key, (_uid, rv, deleted) in checkpoint.ahead.items()
                 if parse_rv(rv) is not None}
    routed_set = set(routed)
    return ResumePlan(
        informer_id=informer_id, checkpoint=checkpoint, seeds=tuple(stub_objects(ref, known)),
        unconfirmed=stubs, delivered=delivered, diverging=frozenset(diverging),
        last_seen={key: rv for key, (_uid, rv) in extra.items()}, sent_deletes=sent, relisted=relisted,
        sinks=sinks,
        dropped_sinks=tuple(sorted(set(checkpoint.sinks or ()) - routed_set)),
        rewrite=from_journal or (checkpoint.sinks is not None and set(checkpoint.sinks) != routed_set),
    )


def _hides_the_list(e: JournalEntry, rv: str) -> bool:
    """Whether the journal's newest fact ``e`` of a uid may stand in place of the state a list at
    resourceVersion ``rv`` returned of it (the journal keeps one fact per uid): a delete that may
    have come after the list — an observed one carries its own resourceVersion, an inferred one its
    object's last state, the delete itself at some point up to the list that inferred it
    (:attr:`Deleted.sent_before`; unknown while that relist had not ended) —, or a later relist's
    state of it. An object's first appearance (:class:`Exists`) hides nothing: one recorded after
    the list was not in it."""
    if isinstance(e, Exists):
        return False
    if not rv_at_most(e.resource_version, rv):
        return True
    return isinstance(e, Deleted) and e.inferred and not (e.sent_before and rv_at_most(e.sent_before, rv))


def _journal_facts(checkpoint: Checkpoint | None, journal: Mapping[str, JournalEntry]) -> tuple[
    dict[str, tuple[str, str]], dict[str, SentDelete], dict[str, RelistedState], list[tuple[str, str, str]]
]:
    """The cache seed (the checkpoint's objects, updated by its delivered-ahead map, a journalled
    delete's resourceVersion in place of the stub's: invariant 3), the deletes and relisted states
    the journal holds, and the objects only it knows (key, uid, resourceVersion)."""
    known: dict[str, tuple[str, str]] = dict(checkpoint.objects) if checkpoint is not None else {}
    if checkpoint is not None:
        for key, (uid, rv, deleted) in checkpoint.ahead.items():
            if not deleted:
                known[key] = (uid, rv)
    sent: dict[str, SentDelete] = {}
    relisted: dict[str, RelistedState] = {}
    journal_only: list[tuple[str, str, str]] = []
    for key, items in entries_by_key(journal).items():
        for uid, entry in items:
            if isinstance(entry, Deleted):
                sent[uid] = SentDelete(key, entry.resource_version, entry.inferred, entry.held_after)
            elif isinstance(entry, Relisted):
                relisted[uid] = RelistedState(entry.since, entry.resource_version, entry.added,
                                              earlier=entry.earlier)
            if known.get(key, ("",))[0] == uid:
                if isinstance(entry, Deleted):
                    known[key] = (uid, entry.resource_version)
            else:
                journal_only.append((key, uid, entry.resource_version))
    return known, sent, relisted, journal_only


def _own_section(checkpoint: Checkpoint, section: SinkProgress) -> tuple[int, dict[str, Known]]:
    """A sink's resume point and its knowledge where it differs from the checkpoint's base (a key
    it knows gone: the base's object there, deleted)."""
    rv = int(section.resource_version or checkpoint.resource_version)
    own: dict[str, Known] = {}
    for key, entry in section.objects.items():
        base = checkpoint.ahead.get(key, (*checkpoint.objects.get(key, ("", "")), False))
        own[key] = Known(base[0], rv, True) if entry is None else Known(entry[0], int(entry[1]), False)
    for key, (uid, ahead_rv, deleted) in section.ahead.items():
        own[key] = Known(uid, int(ahead_rv), deleted)
    return rv, own


def _union(checkpoint: Checkpoint, known: Mapping[str, tuple[str, str]],
           sections: Mapping[str, tuple[int, Mapping[str, Known]]]
           ) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """The objects the cache adds for sinks whose knowledge differs (per object the oldest state a
    sink has), and the keys some sink knows differently. A key the base has deleted counts as
    unknown: a sink holding a later object there needs the relist's tombstone to be of it."""
    gone = {key for key, (_uid, _rv, deleted) in checkpoint.ahead.items() if deleted}
    extra: dict[str, tuple[str, str]] = {}
    diverging: set[str] = set()
    for _, differs in sections.values():
        for key, k in differs.items():
            diverging.add(key)
            if not k.deleted and (key not in known or key in gone) \
                    and (key not in extra or k.resource_version < int(extra[key][1])):
                extra[key] = (k.uid, str(k.resource_version))
    return extra, diverging


def _own_start(rv: int, differs: Mapping[str, Known], extra: Mapping[str, tuple[str, str]],
               known: Mapping[str, tuple[str, str]], journal_only: Sequence[tuple[str, str, str]],
               *, floor: Callable[[str], int] | None, floor_max: int,
               progress: SinkProgress | None = None) -> SinkStart:
    """A sink resuming from its own progress (invariant 4); ``progress``: its section, which names
    the earlier objects of a key whose changes it owes (:class:`~bridge.storage.checkpoint.SinkProgress`)."""
    mine = {**{key: HOLDS_NOTHING for key in extra if key not in differs}, **differs}
    owes: dict[str, Mapping[str, int]] = {
        key: {entry[0]: int(entry[1])} for key in (progress.ahead if progress else {})
        if (entry := progress.objects.get(key) if progress else None) is not None}
    owes.update({key: {uid: int(at) for uid, at in owed.items()} for key, owed in
                 (progress.owes if progress else {}).items()})
    maybe: set[str] = set(progress.owed_deletes()) if progress is not None else set()
    for key, uid, stub_rv in journal_only:
        at = parse_rv(stub_rv)
        own = differs.get(key)
        if at is not None and own is not None and own.resource_version >= at \
                and not owes_change(owes.get(key), own, uid, at):
            continue  # it acknowledged that state of it or a later object's, owing nothing before
        if at is None or at > rv:
            maybe.add(uid)  # delivered after its section was written: it may hold it
        elif key not in known and key not in mine:
            mine[key] = HOLDS_NOTHING
    return SinkStart(SinkStartKind.OWN_PROGRESS, resource_version=rv, section=dict(differs), known=mine,
                     maybe=frozenset(maybe), owes=owes, floor=floor, floor_max=floor_max)


@dataclass(frozen=True, slots=True)
class Start:
    """What one informer starts from."""

    plan: ResumePlan
    journal: KnownObjectJournal | None
    corrupt_checkpoint: bool
    stale: tuple[str, ...]
    """Checkpoint ids of other shard totals (removed once every current shard has passed them)."""


async def load_start(*, store: CheckpointStore | None, watched: WatchedResource, routed: Sequence[str],
                     clock: Clock) -> Start:
    """Reads the checkpoint and the journal of ``watched`` and builds its plan (module docs)."""
    ident = watched.informer_id
    extra = {"informer": ident, "resource": watched.ref.qualified}
    checkpoint: Checkpoint | None = None
    corrupt = False
    handover: TakeOver | None = None
    try:
        if store is not None and watched.shard is not None:
            handover = await take_over(store, base=watched.base_informer_id, shard=watched.shard)
            checkpoint = handover.plan.checkpoint
        elif store is not None:
            checkpoint = await store.load(ident)
    except CheckpointCorruptError as exc:
        corrupt = True
        log.warning("checkpoint is corrupt or unreadable (%s); ignoring it and doing a full resync: "
                    "consumers will see every object again", exc, extra=extra)
    except CheckpointError as exc:
        corrupt = True
        log.warning("checkpoint store failed loading the checkpoint (%s); doing a full resync", exc,
                    extra=extra)
    journal, loaded = await _open_journal(store, ident, checkpoint, handover, clock)
    plan = build_plan(informer_id=ident, ref=watched.ref, checkpoint=checkpoint, journal=loaded,
                      start=journal.start if journal is not None else None, routed=routed,
                      handover=handover.plan if handover is not None else None,
                      journal_unreadable=journal is not None and bool(journal.unreadable))
    if journal is not None and journal.overflowed:
        plan = replace(plan, overflowed=journal.overflowed)
    return Start(plan=plan, journal=journal, corrupt_checkpoint=corrupt,
                 stale=handover.plan.stale if handover is not None else ())


async def _open_journal(store: CheckpointStore | None, ident: str, checkpoint: Checkpoint | None,
                        handover: TakeOver | None, clock: Clock
                        ) -> tuple[KnownObjectJournal | None, dict[str, JournalEntry]]:
    """The informer's journal when the store keeps one, and what it holds (uid → newest fact)."""
    if not isinstance(store, JournalStore):
        return None, {}
    journal = KnownObjectJournal(backend=store.journal_backend(ident), informer_id=ident, clock=clock)
    loaded = await journal.load(checkpoint)
    if handover is not None and (handover.adopted or handover.keep_own_journal is not None):
        loaded = journal.adopt(handover.adopted, handover.keep_own_journal)
    return journal, loaded
