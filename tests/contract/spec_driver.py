"""A thin adapter between the stateful specification test and the real delivery layer.

It touches the pipeline through its public entry points only (the :class:`BridgePipeline`
constructor, ``start``, ``wait_for_sync``, ``write_checkpoints``, ``abort``, ``shutdown``,
``queue_depths``, ``tracker``) and the sinks' acknowledgement callbacks, so the delivery layer's
internals can change under it. What it records is what :mod:`bridge.testing.spec` reads: the fake
source's changes as the cluster's history, and per sink every event handed to it, every
acknowledgement, every checkpoint write and every crash.

The cluster is :class:`~bridge.testing.fake_source.FakeControllerSource` (in process, its
resourceVersion the count of changes), time a :class:`~bridge.clock.FakeClock`, the checkpoint
store the kit's :class:`~bridge.testing.stores.MemoryCheckpointStore`: the bridge's own checkpoint
store (checkpoints encoded and decoded as every store does, and a known-object journal kept as the
bytes a file journal holds) over blobs in memory. It writes on the event loop, not in a thread, so
one seed is one schedule: nothing depends on when a thread finishes.
(The file store's threads are covered by tests/checkpoint/test_per_sink_random.py.)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

from bridge.clock import FakeClock
from bridge.delivery.pipeline import BridgePipeline
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.spec import (
    Acked,
    Change,
    ChangeKind,
    Checkpointed,
    Crashed,
    History,
    Received,
    SinkLog,
    scope_of,
)
from bridge.testing.stores import MemoryCheckpointStore
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType
from tests.checkpoint.helpers import WATCHED, RecordingSink, cm, fake_builder

KINDS = {EventType.ADDED: "added", EventType.UPDATED: "updated", EventType.DELETED: "deleted",
         EventType.GAP_BEGIN: "gap.begin", EventType.GAP_END: "gap.end"}


def received(event: ChangeEvent) -> Received | None:
    """The event as the model reads it (None for snapshot markers and sync events)."""
    kind = KINDS.get(event.type)
    if kind is None:
        return None
    gap = event.gap
    gap_id = gap.id if gap is not None else ""
    scope = scope_of(gap_id)
    if event.obj is None:
        assert gap is not None
        return Received(kind, gap_id=gap_id, gap_from=int(gap.from_resource_version or 0),
                        gap_to=int(gap.to_resource_version or 0), scope_uid=scope)
    return Received(kind, key=f"{event.namespace}/{event.name}", uid=event.uid,
                    rv=int(event.resource_version), inferred=event.final_state_unknown, gap_id=gap_id)


class LoggedSink(RecordingSink):
    """A sink that keeps every event it is handed in its :class:`SinkLog` (which outlives crashes,
    as a destination does) and acknowledges only when told (or at once while ``keen``)."""

    def __init__(self, name: str, log: SinkLog) -> None:
        super().__init__(name, auto_ack=False)
        self.overflow_policy = "spill"  # never holds the informer back (memory only: no directory)
        self.log = log
        self.pending: list[tuple[int, AckCallback]] = []
        self.keen = False

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        seen = received(event)
        if seen is None:
            ack(DeliveryOutcome.DELIVERED)
            return
        self.log.entries.append(seen)
        index = sum(1 for e in self.log.entries if isinstance(e, Received)) - 1
        if self.keen:
            self._ack(index, ack)
        else:
            self.pending.append((index, ack))

    def _ack(self, index: int, ack: AckCallback) -> None:
        self.log.entries.append(Acked(index))
        ack(DeliveryOutcome.DELIVERED)

    def ack_some(self, rng: random.Random, share: float) -> None:
        """Acknowledges about ``share`` of what is pending, in a random order."""
        rng.shuffle(self.pending)
        cut = round(len(self.pending) * share)
        done, self.pending = self.pending[:cut], self.pending[cut:]
        for index, ack in done:
            self._ack(index, ack)

    def ack_where(self, which: Callable[[int], bool]) -> None:
        """Acknowledges the pending events whose index in the log ``which`` selects."""
        keep: list[tuple[int, AckCallback]] = []
        for index, ack in sorted(self.pending):
            if which(index):
                self._ack(index, ack)
            else:
                keep.append((index, ack))
        self.pending = keep

    def ack_through(self, rv: int) -> None:
        """Acknowledges what is pending up to the first event past ``rv`` (in the order received)."""
        events = self.log.received()
        keep: list[tuple[int, AckCallback]] = []
        for index, ack in sorted(self.pending):
            if keep or (events[index].is_change and events[index].rv > rv):
                keep.append((index, ack))
            else:
                self._ack(index, ack)
        self.pending = keep

    async def flush(self, timeout: float) -> bool:
        return not self.pending


class Bridge:
    """The cluster, the bridge (restarted after each crash from the same store) and the sinks' logs."""

    def __init__(self, sinks: tuple[str, ...]) -> None:
        self.source = FakeControllerSource()
        self.clock = FakeClock()
        self.store = MemoryCheckpointStore()
        self.history = History()
        self.logs = {name: SinkLog(name) for name in sinks}
        self.sinks: dict[str, LoggedSink] = {}
        self.pipeline: BridgePipeline | None = None
        self.uids: dict[str, str] = {}
        self.started = False

    # -- the cluster ------------------------------------------------------------------------------

    def create(self, name: str) -> None:
        if name in self.uids:
            return
        obj = self.source.add(cm(name, v="0"))
        self._record(ChangeKind.CREATED, obj)

    def update(self, name: str, value: int) -> None:
        if name not in self.uids:
            return
        obj = self.source.modify({**cm(name, v=str(value)), "metadata": {
            "name": name, "namespace": "default", "uid": self.uids[name]}})
        self._record(ChangeKind.UPDATED, obj)

    def delete(self, name: str) -> None:
        if name not in self.uids:
            return
        obj = self.source.delete(cm(name))
        self._record(ChangeKind.DELETED, obj)

    def _record(self, kind: ChangeKind, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        name, uid, rv = meta["name"], meta["uid"], int(meta["resourceVersion"])
        if kind is ChangeKind.DELETED:
            del self.uids[name]
        else:
            self.uids[name] = uid
        if not self.started:
            self.history.origin[f"default/{name}"] = (uid, rv)
            if kind is ChangeKind.DELETED:
                del self.history.origin[f"default/{name}"]
            self.history.origin_rv = rv
            return
        self.history.changes.append(Change(rv, kind, f"default/{name}", uid))

    def compact(self) -> None:
        """Forgets the server's history: a later resume from before now gets 410 and relists."""
        self.source.compact()
        self.history.relist_causes.append(self.source.resource_version)

    def expire_watch(self) -> None:
        """Sends 410 into the open watch (the server's watch cache moved on): the informer relists."""
        self.source.inject_error(410)
        self.history.relist_causes.append(self.source.resource_version)

    # -- the bridge -------------------------------------------------------------------------------

    async def start(self) -> None:
        assert self.pipeline is None
        self.started = True
        self.sinks = {name: LoggedSink(name, log) for name, log in self.logs.items()}
        self.pipeline = BridgePipeline(
            resources=[WATCHED], sinks=list(self.sinks.values()),
            checkpoint_store=self.store,
            build_informer=fake_builder(self.source, self.clock), clock=self.clock, cluster="spec",
            checkpoint_interval=3600, outage_check_interval=0)
        await self.pipeline.start()
        await self.settle()

    async def crash(self) -> None:
        """Aborts the bridge: nothing drained, unacknowledged events never acknowledged."""
        assert self.pipeline is not None
        await self.pipeline.abort()
        self.pipeline = None
        for log in self.logs.values():
            log.entries.append(Crashed())

    async def checkpoint(self) -> None:
        assert self.pipeline is not None
        await self.settle()
        if await self.pipeline.write_checkpoints():
            for log in self.logs.values():
                log.entries.append(Checkpointed())

    async def settle(self, rounds: int = 2000) -> None:
        """Lets the bridge work until nothing moves: no sink is handed anything new, the listeners'
        queues are empty and nothing waits on the clock for less than a minute (a reflector's
        backoff before a relist, a journal retry) for a few rounds in a row. The fake clock jumps
        to each such deadline; the store's writes in their threads are waited for by the quiet
        rounds' count (each yields to the loop), not by sleeping."""
        if self.pipeline is None:
            return
        quiet, last = 0, -1
        for _ in range(rounds):
            due = self.clock.next_deadline()
            soon = due is not None and due - self.clock.now() <= 60
            if soon:
                await self.clock.step()
            else:
                await self.clock.advance(0.01)
            count = sum(len(log.entries) for log in self.logs.values())
            busy = sum(self.pipeline.queue_depths().values())
            if count == last and not busy and not soon:
                quiet += 1
                if quiet >= 6:
                    return
            else:
                quiet = 0
            last = count

    async def nudge(self, turns: int) -> None:
        """Lets the bridge's tasks take ``turns`` turns of the event loop (a change half processed
        when the next step comes, a crash with events in flight)."""
        for _ in range(turns):
            await asyncio.sleep(0)

    async def drain(self, timeout_rounds: int = 200) -> bool:
        """Every sink acknowledges everything from now on; a marker object is created and the
        bridge runs until every sink received it, nothing waits for an acknowledgement and the
        listeners' queues are empty (an object's events are in order: all before the marker were
        handed over). False if it never got there."""
        if self.pipeline is None:
            await self.start()
        assert self.pipeline is not None
        for sink in self.sinks.values():
            sink.keen = True
            sink.ack_some(random.Random(0), 1.0)
        self.create("marker")
        uid = self.uids["marker"]
        for _ in range(timeout_rounds):
            await self.settle()
            for sink in self.sinks.values():
                sink.ack_some(random.Random(0), 1.0)
            marked = all(any(e.uid == uid for e in log.received()) for log in self.logs.values())
            if marked and not any(s.pending for s in self.sinks.values()) \
                    and not sum(self.pipeline.queue_depths().values()):
                await self.settle()
                return True
        return False

    async def close(self) -> None:
        if self.pipeline is not None:
            await self.pipeline.abort()
            self.pipeline = None
