"""The checkpoint writer: every informer's acknowledged state, saved when it moved.

Every ``checkpoint_interval`` seconds (and once more at shutdown) each informer whose shared state,
or a faster sink's own progress, moved since its last save is written to the store. With a
:class:`GroupCommit`, the checkpoint also follows the acknowledgements: an informer whose sinks
acknowledged ``events`` changes since its last save, or acknowledged anything ``delay`` seconds ago
or more, is written at once (checked every ``delay / 4`` seconds, at most 50 ms). That bounds what a
SIGKILL makes the next start send again, per sink: what it had in flight, plus the acknowledgements
not yet saved (at most ``events``, fewer when ``delay`` comes first; see docs/delivery-contract.md).
A write is: the base (the
slowest sink's resume point and the objects as of it), the delivered-ahead map and each covered
sink's own progress as differences from the base. A store failure is logged and retried at the next
interval. After a write the informer's journal is compacted, and shard 0 removes the checkpoints of
earlier shard totals once every current shard has passed them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.delivery.informer_run import InformerRun
from bridge.delivery.progress import Known
from bridge.delivery.resume_plan import SinkStartKind, parse_rv
from bridge.delivery.sharding import stale_ready
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ListableCheckpointStore,
    SinkProgress,
)

__all__ = ["CheckpointWriter", "GroupCommit", "sink_state"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCommit:
    """When acknowledgements force a checkpoint write (module docs)."""

    events: int = 1000
    """Acknowledgements since the last save that force a write at once."""
    delay: float = 0.2
    """Seconds an acknowledgement may stay unsaved."""

    def __post_init__(self) -> None:
        if self.events < 1:
            raise ValueError(f"group commit events must be at least 1, got {self.events}")
        if self.delay <= 0:
            raise ValueError(f"group commit delay must be positive, got {self.delay}")

    @property
    def tick(self) -> float:
        """How often the acknowledgements are looked at."""
        return min(self.delay / 4, 0.05)


class CheckpointWriter:
    """Writes the checkpoints of a pipeline's informers (module docs)."""

    def __init__(self, *, store: CheckpointStore | None, clock: Clock, runs: Mapping[str, InformerRun],
                 group_commit: GroupCommit | None = None) -> None:
        self._store = store
        # Listing and removal (resharding's clean-up), checked once.
        self._listable = store if isinstance(store, ListableCheckpointStore) else None
        self._clock = clock
        self._runs = runs
        self.group_commit = group_commit
        """When acknowledgements force a write (None: every interval only)."""
        self._lock = asyncio.Lock()  # one write at a time: the interval's and the group commit's
        self._acked_since: dict[str, float] = {}
        """Informer id → when acknowledgements not yet saved were first seen."""
        self.group_writes = 0
        """Writes the group commit forced (for tests and the metrics)."""

    async def run(self, interval: float) -> None:
        """Writes every ``interval`` seconds, until cancelled."""
        while True:
            await self._clock.sleep(interval)
            await self.write()

    async def run_group_commit(self) -> None:
        """Writes the informers whose acknowledgements are due (module docs), until cancelled."""
        commit = self.group_commit
        assert commit is not None
        while True:
            await self._clock.sleep(commit.tick)
            now = self._clock.now()
            due = {ident for ident, inf in self._runs.items() if self._due(ident, inf, commit, now)}
            if due:
                self.group_writes += await self.write(due.__contains__)

    def _due(self, ident: str, inf: InformerRun, commit: GroupCommit, now: float) -> bool:
        unsaved = inf.tracker.acks - max(inf.saved_acks, 0)
        if unsaved <= 0:
            self._acked_since.pop(ident, None)
            return False
        since = self._acked_since.setdefault(ident, now)
        return unsaved >= commit.events or now - since >= commit.delay

    async def write(self, which: Callable[[str], bool] | None = None) -> int:
        """Saves every informer (or those ``which`` selects) whose acknowledged state moved since
        its last save; returns how many were written. Store failures are logged and retried at the
        next interval."""
        if self._store is None:
            return 0
        async with self._lock:
            return await self._write(self._store, which)

    async def _write(self, store: CheckpointStore, which: Callable[[str], bool] | None) -> int:
        written = 0
        for ident, inf in self._runs.items():
            tracker = inf.tracker
            # The shared state, or (while a sink is behind) a faster sink's own progress, moved.
            if which is not None and not which(ident):
                continue
            if tracker.generation == inf.saved_generation and (not tracker.lag
                                                               or tracker.acks == inf.saved_acks):
                inf.saved_acks = tracker.acks  # acknowledgements that moved nothing to save
                if inf.stale and which is None:
                    # Shard 0 saved before another shard passed the earlier total: look again at
                    # each interval, not only at its next save (none comes while its part is quiet).
                    await self._remove_stale(inf)
                continue
            generation, acks = tracker.generation, tracker.acks
            rv, index = tracker.checkpoint_state()
            if not rv:
                continue
            sinks = self._sink_sections(inf, rv)
            cp = Checkpoint(informer_id=ident, resource_version=rv, objects=index,
                            written_at=self._clock.wall(), ahead=tracker.delivered_ahead(), sinks=sinks)
            try:
                await store.save(cp)
            except CheckpointError as exc:
                log.warning("writing the checkpoint failed (%s); retrying at the next interval", exc,
                            extra={"informer": ident, "resource": inf.watched.ref.qualified})
                continue
            if inf.journal is not None:
                inf.journal.compact(cp)
            if inf.stale:
                await self._remove_stale(inf)
            inf.saved_generation = generation
            inf.saved_acks = acks
            self._acked_since.pop(ident, None)
            inf.saved_rv = rv
            inf.last_saved = self._clock.now()
            written += 1
        return written

    async def _remove_stale(self, inf: InformerRun) -> None:
        """Shard 0 removes the checkpoints of earlier shard totals once every shard of the current
        one has passed them (:func:`bridge.delivery.sharding.stale_ready`); the others forget them."""
        shard = inf.watched.shard
        store = self._listable
        if shard is None or store is None or shard.ordinal != 0:
            inf.stale = []
            return
        base = inf.watched.base_informer_id
        try:
            if not await stale_ready(store, base=base, shard=shard, stale=inf.stale):
                return
            for ident in inf.stale:
                await store.remove(ident)
        except CheckpointError as exc:
            log.warning("removing the checkpoints of an earlier shard total failed (%s); retrying at "
                        "the next write", exc, extra={"informer": inf.watched.informer_id})
            return
        log.info("removed the checkpoints of an earlier shard total: %s", ", ".join(inf.stale),
                 extra={"informer": inf.watched.informer_id})
        inf.stale = []

    @staticmethod
    def _sink_sections(inf: InformerRun, base_rv: str) -> dict[str, SinkProgress]:
        """The checkpoint's per-sink section: each sink covered (not bootstrapping) with its own
        progress as differences from the base (:meth:`AckTracker.listener_state`)."""
        base = parse_rv(base_rv) or 0
        sections: dict[str, SinkProgress] = {}
        for name in inf.registrations:
            if name in inf.bootstrapping:
                continue
            rv, diff = sink_state(inf, name)
            objects: dict[str, tuple[str, str] | None] = {}
            ahead: dict[str, tuple[str, str, bool]] = {}
            owes: dict[str, dict[str, str]] = {}
            for key, k in diff.items():
                if k is None:
                    objects[key] = None
                elif k.resource_version <= rv and not k.deleted:
                    objects[key] = (k.uid, str(k.resource_version))
                else:
                    ahead[key] = (k.uid, str(k.resource_version), k.deleted)
            for key, owed in inf.tracker.owed_deletes(name).items():
                k = diff.get(key)
                if k is not None:  # both maps, or owes: see SinkProgress
                    objects.pop(key, None)
                    ahead[key] = (k.uid, str(k.resource_version), k.deleted)
                    if len(owed) == 1:
                        objects[key] = next((uid, str(owed_rv)) for uid, owed_rv in owed.items())
                    else:
                        owes[key] = {uid: str(owed_rv) for uid, owed_rv in owed.items()}
            sections[name] = SinkProgress(resource_version=str(rv) if rv > base else "",
                                          objects=objects, ahead=ahead, owes=owes)
        return sections


def sink_state(inf: InformerRun, name: str) -> tuple[int, dict[str, Known | None]]:
    """One sink's own acknowledged resourceVersion and, per object, where its knowledge differs from
    the base (:meth:`AckTracker.listener_state`, scanned from where its start put it)."""
    start = inf.plan.sinks.get(name)
    floor, own = ((start.resource_version, start.section)
                  if start is not None and start.kind is SinkStartKind.OWN_PROGRESS else (0, {}))
    return inf.tracker.listener_state(name, floor, own)
