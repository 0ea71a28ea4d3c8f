"""Reading what the previous runs left: one informer's checkpoint (or, sharded, the checkpoints it
takes over), its known-object journal, and the resume plan built from them.

A corrupt or unreadable checkpoint is reported as a WARNING and the informer starts as without one
(a full list; consumers see every object again). The journal is opened when the store keeps one; a
take-over adopts the other shards' records of the objects it takes and drops those it no longer owns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.journal import JournalEntry, KnownObjectJournal
from bridge.delivery.resume_plan import Floors, ResumePlan, build_plan
from bridge.delivery.sharding import TakeOver, take_over
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStore,
    JournalStore,
)

__all__ = ["Start", "load_start"]

log = logging.getLogger(__name__)


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
    floors = None
    if handover is not None:
        table = handover.plan
        floors = Floors(of=table.sink_floor,
                        highest=lambda name: max(table.sink_floors.get(name, {}).values(), default=0))
    plan = build_plan(informer_id=ident, ref=watched.ref, checkpoint=checkpoint, journal=loaded,
                      start=journal.start if journal is not None else None, routed=routed, floors=floors,
                      journal_unreadable=journal is not None and bool(journal.unreadable))
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
