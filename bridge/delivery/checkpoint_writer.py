"""The checkpoint writer: every informer's acknowledged state, saved when it moved.

Every ``checkpoint_interval`` seconds (and once more at shutdown) each informer whose shared state,
or a faster sink's own progress, moved since its last save is written to the store: the base (the
slowest sink's resume point and the objects as of it), the delivered-ahead map and each covered
sink's own progress as differences from the base. A store failure is logged and retried at the next
interval. After a write the informer's journal is compacted, and shard 0 removes the checkpoints of
earlier shard totals once every current shard has passed them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bridge.clock import Clock
from bridge.delivery.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ListableCheckpointStore,
    SinkProgress,
)
from bridge.delivery.informer_run import InformerRun
from bridge.delivery.resume_plan import SinkStartKind, parse_rv
from bridge.delivery.sharding import stale_ready

__all__ = ["CheckpointWriter"]

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Writes the checkpoints of a pipeline's informers (module docs)."""

    def __init__(self, *, store: CheckpointStore | None, clock: Clock,
                 runs: Mapping[str, InformerRun]) -> None:
        self._store = store
        # Listing and removal (resharding's clean-up), checked once.
        self._listable = store if isinstance(store, ListableCheckpointStore) else None
        self._clock = clock
        self._runs = runs

    async def run(self, interval: float) -> None:
        """Writes every ``interval`` seconds, until cancelled."""
        while True:
            await self._clock.sleep(interval)
            await self.write()

    async def write(self) -> int:
        """Saves every informer whose acknowledged state moved since its last save; returns how
        many were written. Store failures are logged and retried at the next interval."""
        written = 0
        if self._store is None:
            return 0
        for ident, inf in self._runs.items():
            tracker = inf.tracker
            # The shared state, or (while a sink is behind) a faster sink's own progress, moved.
            if tracker.generation == inf.saved_generation and (not tracker.lag
                                                               or tracker.acks == inf.saved_acks):
                continue
            generation, acks = tracker.generation, tracker.acks
            rv, index = tracker.checkpoint_state()
            if not rv:
                continue
            sinks = self._sink_sections(inf, rv)
            cp = Checkpoint(informer_id=ident, resource_version=rv, objects=index,
                            written_at=self._clock.wall(), ahead=tracker.delivered_ahead(), sinks=sinks)
            try:
                await self._store.save(cp)
            except CheckpointError as exc:
                inf.checkpoint_errors += 1
                log.warning("writing the checkpoint failed (%s); retrying at the next interval", exc,
                            extra={"informer": ident, "resource": inf.watched.ref.qualified})
                continue
            if inf.journal is not None:
                inf.journal.compact(cp)
            if inf.stale:
                await self._remove_stale(inf)
            inf.saved_generation = generation
            inf.saved_acks = acks
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
            start = inf.plan.sinks.get(name)
            floor, own = ((start.resource_version, start.section)
                          if start is not None and start.kind is SinkStartKind.OWN_PROGRESS else (0, {}))
            rv, diff = inf.tracker.listener_state(name, floor, own)
            objects: dict[str, tuple[str, str] | None] = {}
            ahead: dict[str, tuple[str, str, bool]] = {}
            for key, k in diff.items():
                if k is None:
                    objects[key] = None
                elif k.resource_version <= rv and not k.deleted:
                    objects[key] = (k.uid, str(k.resource_version))
                else:
                    ahead[key] = (k.uid, str(k.resource_version), k.deleted)
            for key, (uid, owed_rv) in inf.tracker.owed_deletes(name).items():
                k = diff.get(key)
                if k is not None and k.uid != uid:  # both maps: see SinkProgress
                    objects.pop(key, None)
                    ahead[key] = (k.uid, str(k.resource_version), k.deleted)
                    objects[key] = (uid, str(owed_rv))
            sections[name] = SinkProgress(resource_version=str(rv) if rv > base else "",
                                          objects=objects, ahead=ahead)
        return sections
