"""Resharding without loss: a shard takes over, from every checkpoint in the store, the objects it now
owns. The rules (authoritative checkpoint per residue, the oldest resume point, floors, per-sink
progress moving with the objects, the clean-up rule) are stated in docs/sharding.md, "Resharding
without loss"; this module implements them.

Shard ``o`` of ``t`` of an informer has the checkpoint id ``<base>.shard-<o>-of-<t>`` (the base id,
:func:`~bridge.storage.checkpoint.informer_id`, when ``t`` is 1); the checkpoints of one total form a
*generation*. Object hashes are compared modulo the least common multiple of every total involved, so
that a residue falls in one shard of every generation. The take-over is a pure function over
:class:`~bridge.storage.checkpoint.Checkpoint` values (:func:`plan_handover`), so that whatever a
checkpoint holds is filtered and merged the same way; :func:`take_over` reads the store for it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bridge.delivery.journal import JournalEntry, KnownObjectJournal
from bridge.kube.sharding import ShardFilter, shard_residue
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointStore,
    JournalStore,
    ListableCheckpointStore,
    SinkProgress,
)

__all__ = [
    "MAX_MODULUS",
    "Handover",
    "filter_checkpoint",
    "merge_checkpoints",
    "parse_shard_id",
    "plan_handover",
    "shard_id",
    "stale_ready",
    "take_over",
]

log = logging.getLogger(__name__)

MAX_MODULUS = 1 << 16
"""The largest least common multiple of totals a take-over reasons over (beyond it: a full list)."""

_SHARD_SUFFIX = re.compile(r"\.shard-(\d+)-of-(\d+)$")


def shard_id(base: str, ordinal: int, total: int) -> str:
    """The checkpoint id of shard ``ordinal`` of ``total`` of the informer ``base``."""
    return base if total <= 1 else f"{base}.shard-{ordinal}-of-{total}"


def parse_shard_id(base: str, ident: str) -> tuple[int, int] | None:
    """(ordinal, total) of a checkpoint id of ``base`` (the base itself is shard 0 of 1); None for
    an id of another informer."""
    if ident == base:
        return 0, 1
    if not ident.startswith(base):
        return None
    m = _SHARD_SUFFIX.fullmatch(ident[len(base):])
    if m is None:
        return None
    ordinal, total = int(m.group(1)), int(m.group(2))
    return (ordinal, total) if 0 <= ordinal < total and total > 1 else None


def filter_checkpoint(cp: Checkpoint, keep: Callable[[str], bool], *, informer_id: str | None = None
                      ) -> Checkpoint:
    """``cp`` with only the objects (and delivered-ahead entries) whose uid ``keep`` accepts, in the
    base and in every sink's section. An ahead entry without uid (a delete recorded by key alone) is
    kept: it only tells that changes of that key up to its resourceVersion were delivered, which is
    true wherever it is kept. A sink's "gone" entry (a key the base knows and the sink saw deleted)
    follows the base's object of that key."""
    objects = {k: v for k, v in cp.objects.items() if keep(v[0])}
    ahead = {k: v for k, v in cp.ahead.items() if not v[0] or keep(v[0])}
    sinks = None
    if cp.sinks is not None:
        sinks = {name: _filter_progress(p, keep, cp) for name, p in cp.sinks.items()}
    # replace(): any other field a checkpoint holds is carried.
    return dataclasses.replace(cp, informer_id=informer_id or cp.informer_id, objects=objects,
                               ahead=ahead, sinks=sinks)


def _filter_progress(p: SinkProgress, keep: Callable[[str], bool], cp: Checkpoint) -> SinkProgress:
    objects: dict[str, tuple[str, str] | None] = {}
    for k, v in p.objects.items():
        # A "gone" entry (None) has the uid of what the base knows of the key: its delivered-ahead
        # change, else its index entry.
        uid = (v or cp.ahead.get(k) or cp.objects.get(k) or ("",))[0]
        if uid and keep(uid):
            objects[k] = v
    ahead = {k: a for k, a in p.ahead.items() if not a[0] or keep(a[0])}
    owes = {k: o for k, o in p.owes.items() if k in ahead}
    return SinkProgress(resource_version=p.resource_version, objects=objects, ahead=ahead, owes=owes)


def merge_checkpoints(informer_id: str, parts: Iterable[Checkpoint]) -> Checkpoint | None:
    """One checkpoint from several (each already filtered to disjoint objects): resumes from the
    oldest resourceVersion; objects and ahead entries united (on a key known to two of them, as an
    object deleted and created again under the same name in two shards, the newer entry wins). Per
    sink likewise: its resume point the oldest of its own points in the parts, its differences
    united (see the module docs)."""
    parts = list(parts)
    if not parts:
        return None
    objects: dict[str, tuple[str, str]] = {}
    ahead: dict[str, tuple[str, str, bool]] = {}
    for cp in parts:
        for k, v in cp.objects.items():
            if k not in objects or int(v[1]) > int(objects[k][1]):
                objects[k] = v
        for k, a in cp.ahead.items():
            if k not in ahead or int(a[1]) > int(ahead[k][1]):
                ahead[k] = a
    rv = min((cp.resource_version for cp in parts), key=int)
    # An ahead entry at or below the merged resume point says nothing more than the index.
    ahead = {k: a for k, a in ahead.items() if int(a[1]) > int(rv) or k not in objects}
    return Checkpoint(informer_id=informer_id, resource_version=rv, objects=objects,
                      written_at=max(cp.written_at for cp in parts), ahead=ahead,
                      sinks=_merge_sinks(parts, int(rv)))


def _merge_sinks(parts: list[Checkpoint], base_rv: int) -> dict[str, SinkProgress] | None:
    """The per-sink sections of a merge (see :func:`merge_checkpoints`); None when every part is a
    format-1 checkpoint (which covers every configured sink, at its base)."""
    sectioned = [cp.sinks for cp in parts if cp.sinks is not None]
    if not sectioned:
        return None
    # A sink is covered only where every part covers it: a part that does not (the sink was being
    # bootstrapped there) has no progress of it, so it is bootstrapped again.
    names = set.intersection(*(set(s) for s in sectioned))
    merged: dict[str, SinkProgress] = {}
    for name in sorted(names):
        # Each part's view of the sink: its own resume point (a format-1 part: at its base).
        views = [(int(p.resource_version or cp.resource_version), p)
                 for cp in parts for p in [(cp.sinks or {}).get(name, SinkProgress())]]
        merged[name] = _merge_progress(views, base_rv)
    return merged


def _merge_progress(views: list[tuple[int, SinkProgress]], base_rv: int) -> SinkProgress:
    """One sink's progress from its progress in each part ((its own resume point there, its
    section)), relative to the merged base at ``base_rv``."""
    rv = min(own_rv for own_rv, _ in views)
    known: dict[str, tuple[str, int, bool]] = {}
    """Per object, the newest thing the sink acknowledged: (uid, resourceVersion, deleted)."""
    gone: set[str] = set()
    """Keys the base knows and the sink saw deleted, at or before its merged resume point."""

    def note(key: str, entry: tuple[str, int, bool]) -> None:
        if key not in known or entry[1] > known[key][1]:
            known[key] = entry
            gone.discard(key)

    for own_rv, p in views:
        for k, v in p.objects.items():
            if v is not None:
                note(k, (v[0], int(v[1]), False))
            elif own_rv > rv:
                # Seen deleted at or before this part's own point, later than the merged one: said
                # explicitly, so that the replay of the object's older changes is skipped.
                note(k, ("", own_rv, True))
            elif k not in known:
                gone.add(k)
        for k, (uid, a_rv, deleted) in p.ahead.items():
            note(k, (uid, int(a_rv), deleted))
    objects: dict[str, tuple[str, str] | None] = dict.fromkeys(sorted(gone))
    ahead: dict[str, tuple[str, str, bool]] = {}
    for k, (uid, k_rv, deleted) in known.items():
        if not deleted and k_rv <= rv:
            objects[k] = (uid, str(k_rv))
        else:
            ahead[k] = (uid, str(k_rv), deleted)
    return SinkProgress(resource_version=str(rv) if rv > base_rv else "", objects=objects, ahead=ahead)


@dataclass(frozen=True, slots=True)
class Handover:
    """What :func:`plan_handover` decided for one shard."""

    checkpoint: Checkpoint | None
    """Where to resume (None: nothing to resume from, list from scratch)."""
    sources: tuple[str, ...] = ()
    """The ids of the checkpoints objects were taken from (authoritative for some residue)."""
    stale: tuple[str, ...] = ()
    """Ids of other generations than the current one (to be removed once :func:`stale_ready`)."""
    modulus: int = 1
    floors: Mapping[int, int] = field(default_factory=dict)
    """Residue (modulo ``modulus``) → resourceVersion up to which its changes were delivered."""
    owner: Mapping[int, str] = field(default_factory=dict)
    """Residue → the id of the authoritative checkpoint."""
    incomplete: bool = False
    """Some owned residue was covered by no checkpoint while others were: listing from scratch."""
    sink_floors: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    """Sink → residue → resourceVersion up to which that sink acknowledged the residue's changes,
    where it is beyond :attr:`floors` (a sink ahead of the slowest one in some checkpoint)."""

    def sink_floor(self, sink: str) -> Callable[[str], int] | None:
        """The sink's floor of an object (by uid), or None when it has none beyond :attr:`floors`."""
        table = self.sink_floors.get(sink)
        if not table:
            return None
        modulus = self.modulus

        def floor(uid: str) -> int:
            return table.get(shard_residue(uid, modulus), 0) if uid else 0

        return floor

    def takes(self, source: str) -> Callable[[str], bool]:
        """Whether an object (by uid) of ``source`` is this shard's, from ``source``."""
        modulus, owner = self.modulus, self.owner

        def keep(uid: str) -> bool:
            return bool(uid) and owner.get(shard_residue(uid, modulus)) == source

        return keep


def plan_handover(*, base: str, shard: ShardFilter, stored: Mapping[str, Checkpoint]) -> Handover:
    """Decides what shard ``shard`` of informer ``base`` resumes from, given every checkpoint of
    ``base`` in the store (id → checkpoint). See the module docs."""
    own = shard_id(base, shard.ordinal, shard.total)
    generations: dict[int, dict[int, str]] = {}  # total → ordinal → checkpoint id
    for ident in stored:
        if (parsed := parse_shard_id(base, ident)) is not None:
            generations.setdefault(parsed[1], {})[parsed[0]] = ident
    stale = tuple(sorted(i for t, ids in generations.items() if t != shard.total for i in ids.values()))
    if set(generations) <= {shard.total}:
        mine = stored.get(own)
        return Handover(checkpoint=mine, sources=(own,) if mine is not None else (), modulus=shard.total)
    totals = sorted(set(generations) | {shard.total})
    modulus = math.lcm(*totals)
    if modulus > MAX_MODULUS:
        log.warning("checkpoints of %s from shard totals %s cannot be taken over (too many residues); "
                    "listing from scratch", base, totals)
        return Handover(checkpoint=None, stale=stale, incomplete=True)
    # Newest generation first: by the newest written_at of its checkpoints.
    order = sorted(generations, key=lambda t: max(stored[i].written_at for i in generations[t].values()),
                   reverse=True)
    # Residue → the checkpoints covering it, newest generation first (the first is authoritative).
    covering = {r: [generations[t][r % t] for t in order if r % t in generations[t]]
                for r in range(shard.ordinal, modulus, shard.total)}
    if not all(covering.values()):
        incomplete = any(covering.values())
        if incomplete:
            log.warning("the checkpoints of %s do not cover every object this shard now owns (a shard "
                        "of an earlier total never wrote one); listing from scratch: consumers see those "
                        "objects again", base)
        return Handover(checkpoint=None, stale=stale, incomplete=incomplete)
    owner = {r: ids[0] for r, ids in covering.items()}
    floors = {r: max(int(stored[i].resource_version) for i in ids) for r, ids in covering.items()}
    plan = Handover(checkpoint=None, stale=stale, modulus=modulus, floors=floors, owner=owner)
    sources = tuple(sorted(set(owner.values())))
    merged = merge_checkpoints(own, [filter_checkpoint(stored[s], plan.takes(s), informer_id=own)
                                     for s in sources])
    return dataclasses.replace(plan, checkpoint=merged, sources=sources,
                               sink_floors=_sink_floors(merged, covering, stored, floors))


def _sink_floors(merged: Checkpoint | None, covering: Mapping[int, list[str]],
                 stored: Mapping[str, Checkpoint], floors: Mapping[int, int]) -> dict[str, dict[int, int]]:
    """Per sink and residue, as the floors: what the sink acknowledged in any checkpoint covering
    the residue (and covering the sink: a format-1 checkpoint covers every sink, at its base), where
    that is later than the residue's floor."""
    sink_floors: dict[str, dict[int, int]] = {}
    for name in (merged.sinks or {}) if merged is not None else ():
        table: dict[int, int] = {}
        for r, ids in covering.items():
            best = max((v for i in ids if (v := _sink_rv(stored[i], name)) is not None), default=0)
            if best > floors[r]:
                table[r] = best
        if table:
            sink_floors[name] = table
    return sink_floors


def _sink_rv(cp: Checkpoint, sink: str) -> int | None:
    """The sink's own resume point in ``cp`` (its base when at the base or format 1); None when
    ``cp`` does not cover the sink."""
    if cp.sinks is None:
        return int(cp.resource_version)
    progress = cp.sinks.get(sink)
    if progress is None:
        return None
    return int(progress.resource_version or cp.resource_version)


async def _journal_entries(store: CheckpointStore, ident: str, checkpoint: Checkpoint
                           ) -> dict[str, JournalEntry]:
    if not isinstance(store, JournalStore):
        return {}
    # Another shard's journal: read without fencing, as its checkpoint is peeked (its writer's token
    # is of another shard's Lease).
    journal = KnownObjectJournal(backend=store.journal_backend(ident, fenced=False), informer_id=ident)
    return await journal.load(checkpoint)


@dataclass(slots=True)
class TakeOver:
    """What :func:`take_over` read from the store for one shard."""

    plan: Handover
    adopted: dict[str, JournalEntry] = field(default_factory=dict)
    """Journal records of other checkpoints' objects this shard now owns (uid → record)."""
    keep_own_journal: Callable[[str], bool] | None = None
    """Which records of the shard's own journal still hold (None: all of them)."""


async def take_over(store: CheckpointStore, *, base: str, shard: ShardFilter) -> TakeOver:
    """Reads every checkpoint of ``base`` from ``store``, plans the take-over, sets ``shard``'s floors
    and reads the journals of the other checkpoints taken from. Raises the store's errors
    (:class:`~bridge.storage.checkpoint.CheckpointCorruptError` for an unreadable checkpoint)."""
    own = shard_id(base, shard.ordinal, shard.total)
    listable = store if isinstance(store, ListableCheckpointStore) else None
    ids = ([i for i in await listable.informer_ids(base) if parse_shard_id(base, i) is not None]
           if listable is not None else [own])
    if own not in ids:
        ids.append(own)
    stored: dict[str, Checkpoint] = {}
    for ident in ids:
        # Its own checkpoint is claimed (fencing); another shard's is only read.
        cp = await (listable.peek(ident) if listable is not None and ident != own else store.load(ident))
        if cp is not None:
            stored[ident] = cp
    plan = plan_handover(base=base, shard=shard, stored=stored)
    out = TakeOver(plan=plan)
    if not plan.owner:
        return out
    shard.set_floors(plan.modulus, plan.floors)
    out.keep_own_journal = plan.takes(own)
    for source in plan.sources:
        if source == own:
            continue
        keep = plan.takes(source)
        for uid, entry in (await _journal_entries(store, source, stored[source])).items():
            if keep(uid):
                before = out.adopted.get(uid)
                if before is None or int(entry.resource_version) > int(before.resource_version):
                    out.adopted[uid] = entry
    log.info("shard %d of %d of %s takes over from %s (resuming at resourceVersion %s, %d known "
             "objects, %d journal records)", shard.ordinal, shard.total, base, ", ".join(plan.sources),
             plan.checkpoint.resource_version if plan.checkpoint else "-",
             len(plan.checkpoint.objects) if plan.checkpoint else 0, len(out.adopted))
    return out


async def stale_ready(store: ListableCheckpointStore, *, base: str, shard: ShardFilter,
                      stale: Iterable[str]) -> bool:
    """Whether the checkpoints ``stale`` (other generations) may be removed now: every shard of the
    current generation has a checkpoint at or beyond every resourceVersion they recorded
    (checkpoints, delivered-ahead entries, journal records). See the module docs."""
    high = 0
    for ident in stale:
        cp = await store.peek(ident)
        if cp is None:
            continue
        entries = await _journal_entries(store, ident, cp)
        sinks = (cp.sinks or {}).values()
        high = max([high, int(cp.resource_version), *(int(a[1]) for a in cp.ahead.values()),
                    *(int(e.resource_version) for e in entries.values()),
                    *(int(p.resource_version) for p in sinks if p.resource_version),
                    *(int(a[1]) for p in sinks for a in p.ahead.values())])
    for o in range(shard.total):
        cp = await store.peek(shard_id(base, o, shard.total))
        if cp is None or int(cp.resource_version) < high:
            return False
    return True
