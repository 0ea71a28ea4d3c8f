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

The event loop is a :class:`VirtualTimeLoop`: the informer and the listeners work through a backlog
in time slices of the loop's clock (``TIME_SLICE``, yielding once per slice), so on asyncio's own
loop *where* they yield depends on how fast the machine runs — a schedule found under load did not
replay on a quiet machine (issue 33's unexplained ``lost``). Here the loop's clock advances by a
fixed ``tick`` per reading and jumps over idle waits, so the yields fall at the same points on every
run; the schedule picks the tick (0: an infinitely fast machine, never yielding mid-backlog; a tick
of a slice or more: a loaded one, yielding after every item).
"""

from __future__ import annotations

import asyncio
import os
import random
import selectors
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.clock import FakeClock
from bridge.contracts import DeliveryObserver, Notification, NotificationKind, OverflowPolicy
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.resource_version import parse_rv
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
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType
from tests.checkpoint.helpers import WATCHED, RecordingSink, cm, fake_builder


class _JumpingSelector(selectors.DefaultSelector):
    """A selector whose waits take no real time: a wait for the next timer moves the loop's
    clock to it instead (a wait with no timer at all, a deadlock, still blocks)."""

    loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0 and self.loop is not None:
            self.loop.jump(timeout)
            timeout = 0
        return super().select(timeout)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock (``time()``) is virtual: every reading advances it by ``tick``
    seconds, and idle waits jump it forward (module docs). Nothing in a run depends on the wall
    clock or the machine's load, so a schedule replays exactly."""

    def __init__(self, tick: float = 0.0) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self.tick = tick
        self._virtual = 0.0

    def time(self) -> float:
        self._virtual += self.tick
        return self._virtual

    def jump(self, seconds: float) -> None:
        self._virtual += seconds


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


@dataclass(frozen=True, slots=True)
class SinkShape:
    """How a sink takes what it is handed: ``window`` events in flight at most (None: any number;
    beyond it ``deliver`` waits for an acknowledgement, as a frozen broker's client does once its
    window is full), ``buffer`` notifications in its listener's memory, and ``spill_limit`` bytes of
    the listener's spill on disk (a real :class:`~bridge.delivery.spill.SegmentSpill`; 0: none).
    What fits in none of them is kept as the latest state per object, delivered later inside a gap
    window of the listener's own (docs/delivery-contract.md, section 7a)."""

    window: int | None = None
    buffer: int = 1024
    spill_limit: int = 0
    lands: bool = False
    """True: an event reaches the destination only once it is acknowledged (a frozen broker takes
    nothing in: what was in flight at a crash never arrives), acknowledged in the order handed over;
    False: it is there once handed over, acknowledged in any order."""


class RelistNotes:
    """The informer's delivery observer, passed through, noting the window (from, to] of every
    relist the informer distributes: what the relist coalesced, whether or not a sink was ever
    handed its markers (a sink whose listener had degraded or spilled them before a crash never is;
    noted only from the sinks' hands, such a relist was unknown to the model, and a restart's
    re-framing of its states was judged as announcing changes it never coalesced)."""

    def __init__(self, inner: DeliveryObserver, relists: list[tuple[int, int]]) -> None:
        self._inner = inner
        self._relists = relists

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        gap = notification.gap
        if notification.kind is NotificationKind.GAP and gap is not None and gap.end:
            lo, hi = parse_rv(gap.from_resource_version), parse_rv(gap.to_resource_version)
            if lo is not None and hi is not None and (lo, hi) not in self._relists:
                self._relists.append((lo, hi))
        self._inner.dispatched(notification, listeners)

    def acked(self, listener: str, seq: int) -> None:
        self._inner.acked(listener, seq)

    def progress(self, seq: int, resource_version: str) -> None:
        self._inner.progress(seq, resource_version)

    def listener_removed(self, listener: str) -> None:
        self._inner.listener_removed(listener)


class LoggedSink(RecordingSink):
    """A sink that keeps every event it is handed in its :class:`SinkLog` (which outlives crashes,
    as a destination does) and acknowledges only when told (or at once while ``keen``); with a
    ``window`` (:class:`SinkShape`) it takes no more than that many unacknowledged events."""

    def __init__(self, name: str, log: SinkLog, shape: SinkShape = SinkShape(),
                 relists: list[tuple[int, int]] | None = None) -> None:
        super().__init__(name, auto_ack=False, buffer_capacity=shape.buffer)
        self.relists = relists if relists is not None else []
        """The relist windows (from, to] the bridge handed a sink (what the relists coalesced)."""
        self.overflow_policy = "spill"  # never holds the informer back
        self.shape = shape
        self.log = log
        self.pending: list[tuple[int, AckCallback]] = []
        self._in_flight: dict[int, Received] = {}
        self._next = 0
        self.keen = False
        self._room = asyncio.Event()
        self._room.set()

    @property
    def delivery(self) -> DeliveryOptions:
        return DeliveryOptions(routing=self.routing_resources, buffer_capacity=self.buffer_capacity,
                               overflow_policy=OverflowPolicy(self.overflow_policy),
                               spill_limit=self.shape.spill_limit, resync_period=self.resync_period)

    @property
    def blocked(self) -> bool:
        """True while ``deliver`` waits for room in the window."""
        return not self._room.is_set()

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        seen = received(event)
        if seen is None:
            ack(DeliveryOutcome.DELIVERED)
            return
        relist = (seen.gap_from, seen.gap_to)
        if (seen.kind == "gap.end" and not seen.scope_uid and not seen.gap_id.startswith("overflow:")
                and relist not in self.relists):
            self.relists.append(relist)  # handed over, landed or not
        window = self.shape.window
        while window is not None and not self.keen and len(self.pending) >= window:
            self._room.clear()
            await self._room.wait()
        if self.shape.lands:
            index = -1 - self._next  # in flight: it lands when acknowledged
            self._next += 1
            self._in_flight[index] = seen
        else:
            self.log.entries.append(seen)
            index = sum(1 for e in self.log.entries if isinstance(e, Received)) - 1
        if self.keen:
            self._ack(index, ack)
        else:
            self.pending.append((index, ack))

    def unblock(self) -> None:
        self._room.set()

    def _ack(self, index: int, ack: AckCallback,
             outcome: DeliveryOutcome = DeliveryOutcome.DELIVERED) -> None:
        if index < 0:
            self.log.entries.append(self._in_flight.pop(index))
            index = sum(1 for e in self.log.entries if isinstance(e, Received)) - 1
        self.log.entries.append(Acked(index, dead_lettered=outcome is DeliveryOutcome.DEAD_LETTERED))
        ack(outcome)
        self._room.set()

    def ack_some(self, rng: random.Random, share: float,
                 outcome: DeliveryOutcome = DeliveryOutcome.DELIVERED) -> None:
        """Acknowledges about ``share`` of what is pending, in a random order (``DEAD_LETTERED``: the
        sink set them aside in its dead-letter destination, which is read back with it)."""
        if not self.shape.lands:
            rng.shuffle(self.pending)
        cut = round(len(self.pending) * share)
        done, self.pending = self.pending[:cut], self.pending[cut:]
        for index, ack in done:
            self._ack(index, ack, outcome)

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

    def __init__(self, sinks: tuple[str, ...], shapes: Mapping[str, SinkShape] | None = None) -> None:
        self.shapes = dict(shapes or {})
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # spills fsync: memory is faster
        self.spill_directory = tempfile.mkdtemp(prefix="keb-spec-spill-", dir=shm)
        self.source = FakeControllerSource()
        self.clock = FakeClock()
        self.store = MemoryCheckpointStore()
        self.history = History(relists=[])
        self.logs = {name: SinkLog(name) for name in sinks}
        self.sinks: dict[str, LoggedSink] = {}
        self.pipeline: BridgePipeline | None = None
        self.uids: dict[str, str] = {}
        self.started = False
        self.degraded: set[str] = set()
        """The sinks whose listener degraded at some point (kept latest states only)."""

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
        self.sinks = {name: LoggedSink(name, log, self.shapes.get(name, SinkShape()),
                                       self.history.relists)
                      for name, log in self.logs.items()}
        self.pipeline = BridgePipeline(
            resources=[WATCHED], sinks=list(self.sinks.values()),
            checkpoint_store=self.store, spill_directory=self.spill_directory,
            build_informer=self._build_informer, clock=self.clock, cluster="spec",
            checkpoint_interval=3600, outage_check_interval=0)
        await self.pipeline.start()
        await self.settle()

    def _build_informer(self, watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        """The informer as the pipeline builds it, its observer wrapped to note every relist window."""
        relists = self.history.relists
        assert relists is not None  # the driver's history always knows its relists
        return fake_builder(self.source, self.clock)(watched, RelistNotes(observer, relists))

    def note_degraded(self) -> None:
        if self.pipeline is not None:
            self.degraded |= {name for name in self.sinks if self.pipeline.sink_backlog(name).degraded}

    async def crash(self) -> None:
        """Aborts the bridge: nothing drained, unacknowledged events never acknowledged."""
        assert self.pipeline is not None
        self.note_degraded()
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
        to each such deadline. A listener whose sink's window is full (the sink waits for an
        acknowledgement) keeps its queue: it is quiet once that queue no longer moves."""
        if self.pipeline is None:
            return
        quiet, last = 0, None
        for _ in range(rounds):
            due = self.clock.next_deadline()
            soon = due is not None and due - self.clock.now() <= 60
            if soon:
                await self.clock.step()
            else:
                await self.clock.advance(0.01)
            depths = self.pipeline.queue_depths()
            now = (sum(len(log.entries) for log in self.logs.values()), tuple(sorted(depths.items())))
            held = all(self.sinks[name].blocked for name, depth in depths.items() if depth)
            if now == last and held and not soon:
                quiet += 1
                if quiet >= 6:
                    self.note_degraded()
                    return
            else:
                quiet = 0
            last = now

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
            sink.unblock()
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
            self.note_degraded()
            await self.pipeline.abort()
            self.pipeline = None
        shutil.rmtree(self.spill_directory, ignore_errors=True)
