"""One sink's listener: notifications in, change events to the sink, acknowledgements back.

:class:`SinkListener` turns each :class:`~bridge.contracts.Notification` into
:class:`~sinks.contract.ChangeEvent` values (a snapshot becomes a begin marker, one ``sync`` event per
object and an end marker with the count and the resourceVersion), hands them to the sink, and
acknowledges the notification once the sink has acknowledged its events (all but the beginning of
a window of its own that frames a change: the change counts with the window's end).

There is one path: :meth:`SinkListener.handle_batch` (a single notification is a batch of one). The
changes ready at once reach the sink in one ``deliver_batch`` call; markers and snapshots, and a
notification that becomes several events, go through ``deliver`` on their own, in order, between
the calls; one the known-object journal holds back waits for its record after handing over what
came before it. The common change (an add or update, once the sink is past its start's gates and
outside a window) is built in the batch's one pass, its ``time`` read once per writer's second;
the events handed over in one call get their acknowledgements at once
(:func:`~bridge.informer.ack.batch_acks`), each a single call when the sink makes it.

Before its events are built, a notification passes the gates of the sink's start: a sink being
bootstrapped receives nothing before its snapshot, and after a restart the sink's replay stage
(:mod:`bridge.delivery.replay`) decides what is held back, re-sent or dropped.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from bridge.clock import Clock
from bridge.contracts import (
    OVERFLOW_GAP_PREFIX,
    AckFunc,
    BatchInterrupted,
    DeletedFinalStateUnknown,
    Gap,
    KubeObject,
    Notification,
    NotificationKind,
)
from bridge.delivery.chain import Receiver, receives_batches
from bridge.delivery.journal import KnownObjectJournal
from bridge.delivery.object_acks import PerObjectAcks
from bridge.delivery.progress import AckTracker
from bridge.delivery.replay import ReplayStage, SinkResume, delete_is_inferred
from bridge.delivery.resume_plan import SentDelete
from bridge.delivery.selector_exit import SelectorExits, mark_exits
from bridge.informer.ack import batch_acks
from bridge.rawobject import RawObject, last_change
from sinks.contract import (
    AckCallback,
    Admits,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    GapInfo,
    ResourceRef,
    SnapshotInfo,
)

__all__ = ["SinkListener", "SinkListenerStats", "ack_once", "change_time"]

_DATED: Final = frozenset({EventType.ADDED, EventType.UPDATED, EventType.SYNC})
_NONE_SENT: Final[Mapping[str, SentDelete]] = MappingProxyType({})
"""No delete sent before a restart (there was none, or the sink has no replay stage)."""
_parsed_times: dict[str, float] = {}


def change_time(type_: EventType, obj: KubeObject | None, observed: float) -> float:
    """The event ``time``, the same in every sink and on every redelivery where the API server
    recorded it: for added / updated / sync events the ``time`` of the object's newest
    managedFields entry (when its last write was recorded, whole seconds); otherwise (a delete, an
    object without managedFields, a marker) ``observed``, when the informer first distributed the
    change (one value for all sinks)."""
    if type_ in _DATED and obj is not None:
        # A RawObject's change was read at the decode (last_change, without the call).
        change = obj.change if type(obj) is RawObject else last_change(obj)
        if change is not None:
            when = _timestamp(change.time)
            return observed if when is None else when
    return observed


def _timestamp(text: str) -> float | None:
    """The seconds of a managedFields ``time`` (None: not an ISO 8601 time), parsed once per value."""
    when = _parsed_times.get(text)
    if when is None:
        try:
            when = datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
        if len(_parsed_times) >= 4096:
            _parsed_times.clear()
        _parsed_times[text] = when
    return when


def ack_once(outcomes: collections.Counter[str], done: Callable[[], None]) -> AckCallback:
    """An event's ack: counts the outcome and calls ``done``, on the first call only (a sink that
    acknowledges one event twice is not counted twice)."""
    acked = False

    def event_ack(outcome: DeliveryOutcome) -> None:
        nonlocal acked
        if acked:
            return
        acked = True
        outcomes[outcome._value_] += 1  # the value as a plain attribute, not the property
        done()

    return event_ack


def _countdown(count: int, ack: AckFunc) -> Callable[[], None]:
    """Calls ``ack`` once it was itself called ``count`` times (every event of a notification)."""
    left = count

    def one() -> None:
        nonlocal left
        left -= 1
        if left == 0:
            ack()

    return one


@dataclass(slots=True)
class SinkListenerStats:
    """Counters of one (informer, sink) listener."""

    notifications: int = 0
    events: int = 0
    resync_skipped: int = 0
    """Same-resourceVersion updates (nothing changed) acknowledged without delivery."""
    snapshots: int = 0
    bootstrap_skipped: int = 0
    """Notifications acknowledged without delivery before the sink's bootstrap snapshot."""
    own_progress_skipped: int = 0
    """Notifications acknowledged without delivery after a restart: the sink had them already."""
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    """Sink acknowledgements by :class:`~sinks.contract.DeliveryOutcome` value."""


@dataclass(slots=True)
class _Collected:
    """Events waiting to be handed to the sink in one call, with their owners (their acks are built
    at the hand-over, all at once)."""

    events: list[ChangeEvent] = field(default_factory=list)
    owners: list[AckFunc] = field(default_factory=list)
    """The notification ack of each event (one event per notification here)."""

    def add(self, event: ChangeEvent, owner: AckFunc) -> None:
        self.events.append(event)
        self.owners.append(owner)


class SinkListener:
    """A :class:`~bridge.contracts.NotificationHandler` feeding one sink with one resource's changes."""

    def __init__(self, *, sink: Receiver, resource: ResourceRef, cluster: str, clock: Clock,
                 snapshot_prefix: str = "", tracker: AckTracker | None = None,
                 journal: KnownObjectJournal | None = None, exits: SelectorExits | None = None,
                 shard: tuple[int, int] | None = None, bootstrap: Callable[[], None] | None = None,
                 replay: ReplayStage | None = None) -> None:
        """``shard`` (ordinal, total), when sharded: snapshot markers say which shard they cover.
        ``tracker`` (the informer's) tells which deletes were inferred rather than observed.
        ``journal``: the informer's known-object journal; an event it has a record for is handed to
        the sink only once the record is durable. ``exits`` (a selector-scoped informer's) tells
        which observed deletes were selector exits. ``bootstrap``, when given, makes this a sink
        with no progress of its own: it receives nothing until its bootstrap snapshot (see
        :meth:`bootstrap_ready`), then the live stream; the callback runs once the sink acknowledged
        the whole snapshot. ``replay``: the sink's part of a restart (:mod:`bridge.delivery.replay`)."""
        self.sink = sink
        self._batch_sink = sink if receives_batches(sink) else None
        self._room = sink.has_room if self._batch_sink is not None and isinstance(sink, Admits) else None
        self.resource = resource
        self.cluster = cluster
        self.replay = replay
        self._tracker = tracker
        self._journal = journal
        self._recorded: int | None = None  # the journal's, before what an overflow window hands over
        self._exits = exits
        self._shard = shard
        self._clock = clock
        self._snapshot_prefix = snapshot_prefix or resource.qualified
        self._gap: GapInfo | None = None
        """The relist window this sink is inside (between gap.begin and gap.end), if any."""
        self.stats = SinkListenerStats()
        self._per_object = PerObjectAcks() if replay is not None else None
        """After a restart: what a replay acknowledges without delivery waits behind the same
        object's events still in flight (:class:`~bridge.delivery.object_acks.PerObjectAcks`)."""
        self._bootstrapped = bootstrap
        self.bootstrapping = bootstrap is not None
        """True until the bootstrap snapshot reaches this listener: every notification before it is
        acknowledged without delivery (the snapshot will contain its effect)."""
        self._snapshot_wanted = False
        self._skipped_gap = ""
        """The id of a gap window whose begin was skipped while bootstrapping: its end is skipped
        too, so the sink never sees an end without its begin."""

    @property
    def own_progress(self) -> SinkResume | None:
        """The sink's own-progress filter while it is needed (None: it follows the informer)."""
        return self.replay.own if self.replay is not None else None

    def own_progress_passed(self, seq: int) -> None:
        if self.replay is not None:
            self.replay.own_progress_passed(seq)

    def bootstrap_ready(self) -> None:
        """The informer's cache now holds whole objects: the next snapshot this listener receives
        is its bootstrap (earlier ones, taken from a cache that may still hold checkpoint stubs,
        are skipped)."""
        self._snapshot_wanted = True

    # ---- Framing (for the replay stage) -----------------------------------------------------------

    @property
    def in_gap(self) -> bool:
        """Inside a relist's window (between its markers). Not inside the listener's own overflow
        window: that one starts at the last change handed over (which the replay stage may have
        held back) and does not cover the changes a relist before the restart coalesced, so a
        re-sent relisted state or replayed delete is framed by its own window there too."""
        return self._gap is not None and not self._gap.id.startswith(OVERFLOW_GAP_PREFIX)

    @property
    def gap_prefix(self) -> str:
        return self._snapshot_prefix

    def event(self, type_: EventType, obj: KubeObject | None, observed: float, **kw: Any) -> ChangeEvent:
        if self._gap is not None and "snapshot" not in kw:
            kw.setdefault("gap", self._gap)
        return ChangeEvent(type=type_, resource=self.resource, cluster=self.cluster, obj=obj,
                           time=change_time(type_, obj, observed or self._clock.wall()), **kw)

    def framed(self, event: ChangeEvent, gap_id: str, before: str, observed: float) -> list[ChangeEvent]:
        """``event`` between the markers of a gap of its own, from ``before`` to its resourceVersion."""
        info = GapInfo(id=gap_id, from_resource_version=before, to_resource_version=event.resource_version)
        begin = GapInfo(id=info.id, from_resource_version=before)
        at = observed or self._clock.wall()
        event.gap = begin
        return [self.event(EventType.GAP_BEGIN, None, at, gap=begin), event,
                self.event(EventType.GAP_END, None, at, gap=info)]

    # ---- events ----------------------------------------------------------------------------------

    def _gap_event(self, gap: Gap, observed: float) -> ChangeEvent:
        """``gap.begin`` (the sink is inside the window until the end) or ``gap.end``."""
        info = GapInfo(id=gap.id, from_resource_version=gap.from_resource_version,
                       to_resource_version=gap.to_resource_version)
        if gap.end:
            self._gap = None
            return self.event(EventType.GAP_END, None, observed, gap=info)
        self._gap = info
        return self.event(EventType.GAP_BEGIN, None, observed, gap=info)

    def events_for(self, n: Notification) -> list[ChangeEvent]:
        """The change events one notification becomes (empty for a no-change resync update, or a
        change the replay stage holds back)."""
        kind, replay = n.kind, self.replay
        if kind is NotificationKind.ADD or kind is NotificationKind.UPDATE:
            obj = n.obj
            assert type(obj) is RawObject or not isinstance(obj, DeletedFinalStateUnknown)
            if n.is_resync:
                return []
            if replay is not None:
                if replay.held_back(obj):
                    return []
                if (replayed := replay.relisted(n, self)) is not None:
                    return replayed
            if self._gap is not None:
                if kind is NotificationKind.ADD:
                    return [self.event(EventType.ADDED, obj, n.time)]
                return [self.event(EventType.UPDATED, obj, n.time, old=n.old)]
            # self.event() without its call, for the common change (no gap to mark it with).
            type_ = EventType.ADDED if kind is NotificationKind.ADD else EventType.UPDATED
            return [ChangeEvent(type=type_, resource=self.resource, cluster=self.cluster, obj=obj,
                                old=n.old if kind is NotificationKind.UPDATE else None,
                                time=change_time(type_, obj, n.time or self._clock.wall()))]
        if kind is NotificationKind.DELETE:
            if replay is not None:
                return replay.delete(n, self)
            obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
            inferred = delete_is_inferred(n, self._tracker, _NONE_SENT)
            return [self.event(EventType.DELETED, obj, n.time, final_state_unknown=inferred)]
        if kind is NotificationKind.GAP:
            assert n.gap is not None
            return [self._gap_event(n.gap, n.time)]
        _, events = self._snapshot_events(n)
        return list(events)

    def _snapshot_events(self, n: Notification) -> tuple[int, Iterator[ChangeEvent]]:
        """The framed snapshot as a count and a lazy stream: a snapshot of a compact cache decodes
        each object only when its event is handed to the sink, never the whole cache at once."""
        objects = n.snapshot or []
        sid = f"{self._snapshot_prefix}:{n.resource_version or '0'}:{uuid.uuid4().hex[:12]}"
        shard, total = self._shard or (None, None)
        info = SnapshotInfo(id=sid, resource_version=n.resource_version, shard=shard, total_shards=total)
        end = SnapshotInfo(id=sid, resource_version=n.resource_version, count=len(objects), shard=shard,
                           total_shards=total)

        def stream() -> Iterator[ChangeEvent]:
            at = n.time
            yield self.event(EventType.SNAPSHOT_BEGIN, None, at, snapshot=info)
            for obj in objects:
                yield self.event(EventType.SYNC, obj, at, snapshot=info)
            yield self.event(EventType.SNAPSHOT_END, None, at, snapshot=end)

        return len(objects) + 2, stream()

    # ---- gates ------------------------------------------------------------------------------------

    def _gate(self, n: Notification, ack: AckFunc) -> AckFunc | None:
        """The bootstrap gate: None when ``n`` is skipped (acknowledged here), else the ack to
        deliver it with. Skipping is safe because the bootstrap snapshot comes later and holds the
        cache as of then, which includes the effect of everything skipped."""
        if self.bootstrapping:
            if n.kind is NotificationKind.SNAPSHOT and self._snapshot_wanted:
                self.bootstrapping = False
                done = self._bootstrapped

                def snapshot_ack() -> None:
                    ack()
                    if done is not None:
                        done()

                return snapshot_ack
            if n.kind is NotificationKind.GAP and n.gap is not None and not n.gap.end:
                self._skipped_gap = n.gap.id
        elif not (n.kind is NotificationKind.GAP and n.gap is not None and n.gap.end
                  and n.gap.id == self._skipped_gap):
            return ack
        else:
            self._skipped_gap = ""
        self.stats.bootstrap_skipped += 1
        ack()
        return None

    async def _admit(self, n: Notification, ack: AckFunc) -> list[Notification]:
        """The notifications ``n`` becomes after the replay stage's own-progress filter, each one's
        selector fate asked when it matters; none when the sink had ``n`` (then acknowledged)."""
        replay = self.replay
        if replay is None:
            return [n]
        admitted = replay.admit(n)
        if not admitted:
            self.stats.own_progress_skipped += 1
            ack()
        elif self._exits is not None:
            for a in admitted:
                await replay.ask_fate(a)
        return admitted

    # ---- the one path -------------------------------------------------------------------------------

    def ready_for(self, notifications: Sequence[Notification]) -> bool:
        """Whether :meth:`handle_batch` of ``notifications`` now would not wait: past the start's
        gates, no replay stage nor selector exits (they may ask the API server), no snapshot, nothing
        the journal holds back, room in the sink's chain for every event (the informer's fast path,
        :class:`~bridge.contracts.ReadyNotificationHandler`)."""
        room, journal = self._room, self._journal
        if (room is None or not notifications or self.replay is not None or self._exits is not None
                or self.bootstrapping or self._skipped_gap
                or (journal is not None and journal.must_wait(notifications[-1].seq))):
            return False
        for n in notifications:
            if n.kind is NotificationKind.SNAPSHOT:
                return False
        return room(len(notifications))

    async def handle(self, notification: Notification, ack: AckFunc) -> None:
        """A batch of one (:meth:`handle_batch`); a failure is raised as itself."""
        try:
            await self.handle_batch((notification,), (ack,))
        except BatchInterrupted as exc:
            raise (exc.__cause__ or exc) from None

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        """Handles each notification with its ack, in order (:class:`~bridge.contracts.
        BatchNotificationHandler`); the events of consecutive single-event notifications reach the
        sink in one ``deliver_batch`` call (module docs): a run of changes in one pass
        (:meth:`_changes`), anything else one at a time. A notification the journal holds back
        (``must_wait``) is awaited after handing over what came before it."""
        stats, journal = self.stats, self._journal
        collected, count = _Collected(), len(notifications)
        i = at = 0
        try:
            while i < count:
                kind = notifications[i].kind
                if (kind is not NotificationKind.GAP and kind is not NotificationKind.SNAPSHOT
                        and self.replay is None and self._exits is None and self._gap is None
                        and not self.bootstrapping and not self._skipped_gap):
                    i = await self._changes(notifications, acks, i, collected)
                    if i == count:
                        break
                at, n, ack = i, notifications[i], acks[i]
                i += 1
                stats.notifications += 1
                if self.bootstrapping or self._skipped_gap:
                    gated = self._gate(n, ack)
                    if gated is None:
                        continue
                    ack = gated
                admitted: Sequence[Notification] | None = None  # None: n alone (no replay stage)
                if self.replay is not None:
                    admitted = await self._admit(n, ack)
                    if not admitted:
                        continue
                if journal is not None and journal.must_wait(n.seq):
                    # A new object or a delete: released only once the journal has it (module docs).
                    await self._hand_over(collected, at - 1)
                    await journal.wait(n.seq)
                if n.kind is NotificationKind.SNAPSHOT:
                    await self._snapshot(n, ack, collected, at)
                    continue
                listed = self.events_for(n) if admitted is None else self._admitted_events(admitted)
                if self._per_object is not None and n.key:
                    if not listed:  # held back by the replay (or a resync that changed nothing)
                        stats.resync_skipped += 1
                        later = self.replay is not None and self.replay.take_coalesced_hold()
                        self._per_object.without_delivery(n.key, ack, announced_later=later)
                        continue
                    ack = self._per_object.handed(n.key, ack)
                if self._gap is not None and journal is not None:
                    self._record_window(journal, listed)
                if len(listed) == 1 and self._exits is None and n.kind is not NotificationKind.GAP:
                    collected.add(listed[0], ack)  # a single change: one coroutine less
                    continue
                await self._route(listed, n, ack, collected, at)
            await self._hand_over(collected, count - 1)
        except BatchInterrupted:
            raise
        except Exception as exc:
            # Notification ``at`` failed (building its events, waiting for the journal): what was
            # collected before it is handed over as it would have been, then ``at`` is reported.
            await self._hand_over(collected, at - 1)
            raise BatchInterrupted(at) from exc

    def _record_window(self, journal: KnownObjectJournal, listed: Sequence[ChangeEvent]) -> None:
        """Inside the listener's own overflow window, what it hands over bare is recorded for this
        sink first (resume plan invariant 8): waited for before it goes out (:meth:`_hand_over`)."""
        gap = self._gap
        if gap is not None and gap.id.startswith(OVERFLOW_GAP_PREFIX):
            ticket = journal.note_window(self.sink.name, listed, gap)
            if ticket is not None:
                self._recorded = ticket

    async def _changes(self, notifications: Sequence[Notification], acks: Sequence[AckFunc], i: int,
                       collected: _Collected) -> int:
        """Collects the run of changes (adds, updates, deletes) from ``i`` on, in one pass, and returns
        where it ends (a marker, a snapshot, the batch's end). The sink is past its start's gates,
        has no replay stage nor selector exits and is outside a window, so each change is what
        :meth:`events_for` makes of it, built here without its calls; a change's ``time`` is read
        once per managedFields time in a row (:func:`change_time`)."""
        stats, journal, tracker = self.stats, self._journal, self._tracker
        resource, cluster, wall = self.resource, self.cluster, self._clock.wall
        dated, dated_at = "", None  # the last managedFields time read, and its seconds
        count = len(notifications)
        try:
            while i < count:
                n = notifications[i]
                kind = n.kind
                if kind is NotificationKind.GAP or kind is NotificationKind.SNAPSHOT:
                    return i
                stats.notifications += 1
                if journal is not None and journal.must_wait(n.seq):
                    await self._hand_over(collected, i - 1)
                    await journal.wait(n.seq)
                obj = n.obj
                if kind is NotificationKind.DELETE:
                    if isinstance(obj, DeletedFinalStateUnknown):
                        obj = obj.obj
                    event = ChangeEvent(type=EventType.DELETED, resource=resource, cluster=cluster, obj=obj,
                                        time=n.time or wall(),
                                        final_state_unknown=delete_is_inferred(n, tracker, _NONE_SENT))
                elif n.is_resync:  # nothing changed
                    stats.resync_skipped += 1
                    acks[i]()
                    i += 1
                    continue
                else:
                    if type(obj) is RawObject:
                        change = obj.change
                    else:
                        assert not isinstance(obj, DeletedFinalStateUnknown)
                        change = last_change(obj)
                    if change is not None and change.time != dated:
                        dated = change.time
                        dated_at = _parsed_times.get(dated)  # parsed before (_timestamp inline)
                        if dated_at is None:
                            dated_at = _timestamp(dated)
                    update = kind is NotificationKind.UPDATE
                    event = ChangeEvent(type=EventType.UPDATED if update else EventType.ADDED,
                                        resource=resource, cluster=cluster, obj=obj,
                                        old=n.old if update else None,
                                        time=dated_at if change is not None and dated_at is not None
                                        else n.time or wall())
                collected.events.append(event)
                collected.owners.append(acks[i])
                i += 1
        except BatchInterrupted:
            raise
        except Exception as exc:
            await self._hand_over(collected, i - 1)
            raise BatchInterrupted(i) from exc
        return i

    async def _snapshot(self, n: Notification, ack: AckFunc, collected: _Collected, at: int) -> None:
        """A snapshot notification (batch index ``at``): after what was collected before it, its framed
        events one by one, ``ack`` once the sink acknowledged them all."""
        await self._hand_over(collected, at - 1)
        self.stats.snapshots += 1
        count, stream = self._snapshot_events(n)
        await self._deliver_all(stream, count, ack)

    def _admitted_events(self, admitted: Sequence[Notification]) -> list[ChangeEvent]:
        """The events of what the replay stage admitted in a notification's place."""
        if len(admitted) == 1:
            return self.events_for(admitted[0])
        return [e for a in admitted for e in self.events_for(a)]

    async def _route(self, listed: list[ChangeEvent], n: Notification, ack: AckFunc,
                     collected: _Collected, i: int) -> None:
        """Where one notification's events go: nothing (acknowledged), the collected call (one
        change), or handed over on their own, in order (a marker, several events)."""
        if not listed:
            self.stats.resync_skipped += 1
            ack()
            return
        if self._exits is not None and any(e.type is EventType.DELETED for e in listed):
            await self._hand_over(collected, i - 1)
            await mark_exits(listed, self._exits,
                             self.replay.replayed_exit if self.replay is not None else None)
        if len(listed) == 1 and n.kind is not NotificationKind.GAP:
            collected.add(listed[0], ack)
            return
        await self._hand_over(collected, i - 1)
        await self._deliver_all(listed, len(listed), ack, framed=n.kind is not NotificationKind.GAP)

    async def _deliver_all(self, events: Iterable[ChangeEvent], count: int, ack: AckFunc, *,
                           framed: bool = False) -> None:
        """Hands ``events`` (``count`` of them) to the sink one by one; ``ack`` once the sink
        acknowledged every one (a change's, ``framed``: but a window's beginning, module docs)."""
        one = _countdown(count, ack)
        outcomes = self.stats.outcomes
        for event in events:
            self.stats.events += 1
            begin = framed and event.type is EventType.GAP_BEGIN
            if begin:
                one()
            await self.sink.deliver(event, ack_once(outcomes, (lambda: None) if begin else one))

    async def _hand_over(self, collected: _Collected, last: int) -> None:
        """Hands the collected events to the sink in one call (a loop over ``deliver`` for a sink
        without ``deliver_batch``); ``last`` is the batch index of the last notification looked at.
        When the sink raises, which events it took is unknown: every owner is acknowledged (as if
        each had failed on its own) and the failure is reported at ``last``."""
        if self._recorded is not None and self._journal is not None:  # what goes out is recorded
            await self._journal.wait_recorded(self._recorded)
            self._recorded = None
        if not collected.events:
            return
        events, owners = collected.events, collected.owners
        collected.events, collected.owners = [], []
        acks = batch_acks(self._event_acked, owners)
        self.stats.events += len(events)
        try:
            if self._batch_sink is not None:
                await self._batch_sink.deliver_batch(events, acks)
            else:
                for event, event_ack in zip(events, acks, strict=True):
                    await self.sink.deliver(event, event_ack)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for owner in owners:
                owner()
            raise BatchInterrupted(last) from exc

    def _event_acked(self, owners: Sequence[AckFunc], called: bytearray, i: int,
                     outcome: DeliveryOutcome) -> None:
        """The sink acknowledged the i-th event of a hand-over: on the first call only, counts the
        outcome and acknowledges its owner (:data:`~bridge.informer.ack.BatchAckFunc`)."""
        if called[i]:
            return
        called[i] = 1
        self.stats.outcomes[outcome._value_] += 1  # the value as a plain attribute, not the property
        owners[i]()
