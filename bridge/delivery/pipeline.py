"""The glue between informers and sinks: events out, acknowledgements back, checkpoints, snapshots.

:class:`SinkListener` is the informer listener of one sink: it turns each
:class:`~bridge.contracts.Notification` into :class:`~sinks.contract.ChangeEvent` values (a snapshot
becomes a begin marker, one ``sync`` event per object and an end marker with the count and the
resourceVersion), hands them to the sink, and acknowledges the notification once the sink has
acknowledged every one of its events. Its listener hands it the notifications ready at once
(:meth:`SinkListener.handle_batch`): their events reach the sink in one ``deliver_batch`` call.

:class:`BridgePipeline` runs the whole flow for a set of watched resources:

* on :meth:`~BridgePipeline.start`, each informer's checkpoint is loaded; a valid one seeds the informer
  with metadata-only stubs of the known objects and resumes the watch from its resourceVersion (no
  relist unless the server answers 410, in which case the relist emits only the differences); a
  corrupt or unreadable one is reported as a WARNING and the informer lists from scratch;
* one listener per (informer, routed sink), with the sink's buffer capacity and overflow policy, and
  one :class:`~bridge.progress.AckTracker` per informer computing the checkpoint low-watermark (the
  base) and, at each write, every sink's own progress (the checkpoint's per-sink section);
* per-sink progress on resume: the watch resumes from the base, the cache is seeded with the union of
  what the sinks know, and each sink's listener filters through its own progress
  (:class:`~bridge.delivery.progress.SinkResume`); a sink the checkpoint does not cover is
  bootstrapped: it receives nothing until a snapshot of whole objects (:meth:`BridgePipeline._hydrate`;
  a failed start-up list is retried with backoff by :meth:`BridgePipeline._hydrate_late`), then the
  live stream;
* a named task writes checkpoints every ``checkpoint_interval`` seconds (only when the state moved);
* per-sink resync periods are served as snapshots (``informer.request_snapshot``) by one timer task
  per (informer, sink); listeners themselves get resync period 0, so the same-RV updates of a 410
  relist (unchanged objects) are never delivered;
* :meth:`~BridgePipeline.shutdown` stops intake, lets the listeners drain and the sinks flush, writes
  the final checkpoint, then closes everything, all within one deadline.

Every task is named, supervised (a task that dies unexpectedly is logged) and cancelled on shutdown.
Time comes from the injected clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from bridge.clock import Clock, RealClock
from bridge.contracts import (
    AckFunc,
    BatchInterrupted,
    DeletedFinalStateUnknown,
    DeliveryObserver,
    Gap,
    KubeObject,
    ListenerOptions,
    Notification,
    NotificationKind,
    OverflowPolicy,
)
from bridge.delivery.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStore,
    JournalStore,
    ListableCheckpointStore,
    SinkProgress,
    informer_id,
)
from bridge.delivery.gauges import InformerGauges, SinkGauges, TelemetrySnapshot
from bridge.delivery.journal import KnownObjectJournal, entries_by_key
from bridge.delivery.progress import AckTracker, IndexEntry, Knowledge, SinkResume, object_key
from bridge.delivery.selector_exit import LEFT_SELECTOR_EXTENSION, SelectorExits
from bridge.delivery.sharding import TakeOver, shard_id, stale_ready, take_over
from bridge.delivery.spill import SegmentSpill
from bridge.informer.backoff import Backoff
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.informer.reflector import Reflector, WatchErrorHandler, default_watch_error_handler
from bridge.informer.shared_informer import HandlerRegistration, SharedIndexInformer
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource
from bridge.kube.listwatch import HttpListerWatcher
from bridge.kube.sharding import ShardFilter
from bridge.rawobject import last_change, object_identity
from bridge.rawobject import object_key as raw_object_key
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    GapInfo,
    ResourceRef,
    Sink,
    SnapshotInfo,
)

__all__ = [
    "BridgePipeline",
    "InformerBuilder",
    "PipelineStats",
    "SinkBacklog",
    "SinkListener",
    "SinkListenerStats",
    "WatchedResource",
    "http_informer_builder",
    "stub_objects",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# One sink's listener


_DATED: Final = frozenset({EventType.ADDED, EventType.UPDATED, EventType.SYNC})
_parsed_times: dict[str, float] = {}


def change_time(type_: EventType, obj: KubeObject | None, observed: float) -> float:
    """The event ``time``, the same in every sink and on every redelivery where the API server
    recorded it: for added / updated / sync events the ``time`` of the object's newest
    managedFields entry (when its last write was recorded, whole seconds); otherwise (a delete, an
    object without managedFields, a marker) ``observed``, when the informer first distributed the
    change (one value for all sinks)."""
    if type_ in _DATED and obj is not None:
        change = last_change(obj)
        if change is not None:
            when = _parsed_times.get(change.time)
            if when is None:
                try:
                    when = datetime.fromisoformat(change.time).timestamp()
                except ValueError:
                    return observed
                if len(_parsed_times) >= 4096:
                    _parsed_times.clear()
                _parsed_times[change.time] = when
            return when
    return observed


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


_CHANGE_KINDS: Final = frozenset({NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE})


class SinkListener:
    """A :class:`~bridge.contracts.NotificationHandler` feeding one sink with one resource's changes."""

    def __init__(
        self,
        *,
        sink: Sink,
        resource: ResourceRef,
        cluster: str,
        clock: Clock,
        snapshot_prefix: str = "",
        tracker: AckTracker | None = None,
        journal: KnownObjectJournal | None = None,
        resent: Mapping[str, tuple[str, bool]] | None = None,
        held_after: Mapping[str, str] | None = None,
        coalesced: Mapping[str, tuple[str, str, bool]] | None = None,
        exits: SelectorExits | None = None,
        shard: tuple[int, int] | None = None,
        bootstrap: Callable[[], None] | None = None,
        own_progress: SinkResume | None = None,
    ) -> None:
        """``shard`` (ordinal, total), when sharded: snapshot markers say which shard they cover.
        ``tracker`` (the informer's) tells which deletes were inferred rather than observed.
        ``journal``: the informer's known-object journal; an event it has a record for is handed to
        the sink only once the record is durable. ``resent``: uid → (resourceVersion, inferred) of
        the deletes the journal says were sent before a restart (see :func:`delete_is_inferred`);
        ``held_after``: uid → the journal's :attr:`~bridge.delivery.journal.JournalEntry.held_after`
        of those deletes that have one. ``coalesced``: uid → (from, resourceVersion, added) of the
        objects the journal says a relist sent before a restart (see :meth:`_replayed_coalesced`).
        ``exits`` (a selector-scoped informer's) tells which observed deletes were selector exits.
        ``bootstrap``, when given, makes this a sink with no progress of its own: it receives nothing
        until its bootstrap snapshot (see :meth:`bootstrap_ready`), then the live stream; the
        callback runs once the sink acknowledged the whole snapshot. ``own_progress``: the sink's
        own progress when it differs from the checkpoint's base; every notification passes its
        filter (:class:`~bridge.delivery.progress.SinkResume`) until the informer has passed it
        (:meth:`own_progress_passed`)."""
        self.sink = sink
        self.own_progress = own_progress
        self._own_until = -1 if own_progress is not None else None
        self._tracker = tracker
        self._journal = journal
        self._resent = resent or {}
        self._held_after = held_after or {}
        self._coalesced = coalesced or {}
        self._held_coalesced: dict[str, KubeObject | None] = {}
        """uids whose replayed changes a relist had coalesced were held back → the object's state
        before the first of them: the state the relist sent goes out framed as a gap, as an update
        from that state (see :meth:`_replayed_coalesced`)."""
        self._exits = exits
        self._shard = shard
        self.resource = resource
        self.cluster = cluster
        self._clock = clock
        self._snapshot_prefix = snapshot_prefix or resource.qualified
        self._gap: GapInfo | None = None
        """The relist window this sink is inside (between gap.begin and gap.end), if any."""
        self._held: set[str] = set()
        """uids whose replayed changes were held back (see :meth:`_replayed_after_delete`): their
        replayed delete is framed as a gap."""
        self._fate: dict[str, int | None] = {}
        """Under a selector, the uids whose inferred delete was sent before the restart and whose
        history the watch replays: → the resourceVersion the uid has now when it lives on, None when
        it is gone (:meth:`SelectorExits.alive`, asked once per uid for every sink)."""
        self._closed: set[str] = set()
        """Under a selector, uids read as gone whose replayed delete went out: nothing more of
        them is sent (see :meth:`_replayed_after_delete`)."""
        self.stats = SinkListenerStats()
        self._bootstrapped = bootstrap
        self.bootstrapping = bootstrap is not None
        """True until the bootstrap snapshot reaches this listener: every notification before it is
        acknowledged without delivery (the snapshot will contain its effect)."""
        self._snapshot_wanted = False
        self._skipped_gap = ""
        """The id of a gap window whose begin was skipped while bootstrapping: its end is skipped
        too, so the sink never sees an end without its begin."""

    def own_progress_passed(self, seq: int) -> None:
        """The informer's progress reached the sink's own resume point at ``seq``: from that
        notification on, once nothing the sink knows differs from the informer, the filter is
        dropped."""
        if self._own_until is not None and self._own_until < 0:
            self._own_until = seq

    def _filter_own(self, n: Notification) -> list[Notification]:
        own = self.own_progress
        assert own is not None
        if self._own_until is not None and 0 <= self._own_until <= n.seq:
            # Past the sink's own resume point: only the objects it knows differently need a look.
            if not own.known:
                self.own_progress = self._own_until = None  # caught up: the filter costs nothing more
                return [n]
            if n.key and n.key not in own.known:
                return [n]
        inferred = n.kind is NotificationKind.DELETE and delete_is_inferred(n, self._tracker, self._resent)
        return own.admit(n, inferred)

    def bootstrap_ready(self) -> None:
        """The informer's cache now holds whole objects: the next snapshot this listener receives
        is its bootstrap (earlier ones, taken from a cache that may still hold checkpoint stubs,
        are skipped)."""
        self._snapshot_wanted = True

    def _bootstrap_skips(self, n: Notification, ack: AckFunc) -> AckFunc | None:
        """While bootstrapping: None when ``n`` is skipped (acknowledged here), else the ack to
        deliver the bootstrap snapshot with. Skipping is safe because the snapshot comes later and
        holds the cache as of then, which includes the effect of everything skipped."""
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
        self.stats.bootstrap_skipped += 1
        ack()
        return None

    def _event(self, type_: EventType, obj: KubeObject | None, observed: float, **kw: Any) -> ChangeEvent:
        if self._gap is not None and "snapshot" not in kw:
            kw.setdefault("gap", self._gap)
        return ChangeEvent(type=type_, resource=self.resource, cluster=self.cluster, obj=obj,
                           time=change_time(type_, obj, observed or self._clock.wall()), **kw)

    def _gap_event(self, gap: Gap, observed: float) -> ChangeEvent:
        """``gap.begin`` (the sink is inside the window until the end) or ``gap.end``."""
        info = GapInfo(id=gap.id, from_resource_version=gap.from_resource_version,
                       to_resource_version=gap.to_resource_version)
        if gap.end:
            self._gap = None
            return self._event(EventType.GAP_END, None, observed, gap=info)
        self._gap = info
        return self._event(EventType.GAP_BEGIN, None, observed, gap=info)

    def _replayed_after_delete(self, obj: KubeObject) -> bool:
        """Whether ``obj`` is a change the watch replays after a restart that would arrive after the
        delete consumers already hold: the journal's ``resent`` says this uid's delete was sent as
        *inferred* (a relist found the object gone, with its last known state), and the watch,
        resumed from a checkpoint older than that relist, now replays the changes the relist had
        coalesced — those newer than the state the inferred delete carries. No sink ever had them
        one by one (they were inside that relist's gap), and a uid is deleted once; sent, they would
        bring the object back for consumers (for good where the broker drops the replayed real
        delete as a duplicate id). The delete itself goes out again as it was sent.

        The changes up to that state were observed on the watch and sent one by one before the
        relist, but a sink that lagged (down, its backlog lost in the crash) may never have had
        them: they go out again, in order, before the delete (at-least-once; a sink that had them
        gets the same ids again, followed by the same delete). Likewise a delete the watch showed
        (not inferred) is replayed in its place, after the changes before it.

        Under a selector the inferred delete may have been a selector exit of an object that lives
        on. The invariant kept there: **a lagging sink gets every change it lacked up to the delete
        or exit, in order, before it, and nothing that brings a uid back is sent unless a delete
        that a consumer dropping repeated ids keeps can follow it.** So the API server is asked
        once per uid whether it still exists (:meth:`_ask_fate`, before any change newer than the
        inferred delete's state, or a delete, is handled):

        * gone (or the question could not be answered): as without a selector — changes up to
          the inferred delete's state go out again, newer ones are held, the replayed delete is
          framed as a gap; after that delete nothing more of the uid goes out (a return into scope
          after an exit would revive it, and its closing delete has the uid's delete id, which a
          deduplicating broker drops as the inferred delete's);
        * alive: a uid is deleted once, so every delete the watch reported of it was a selector
          exit (the inferred one too): nothing is held, every replayed change goes out in order (now
          observed one by one), and the replayed deletes up to the uid's current resourceVersion
          are marked as exits (change ids, which no broker drops as the uid's delete)."""
        uid, rv = object_identity(obj)
        after = self._hold_after(uid)
        if after is None:
            return False
        if self._exits is not None:
            if uid in self._closed:
                return True
            if self._fate.get(uid) is not None:
                return False
        held = not (rv.isdigit() and after.isdigit()) or int(rv) > int(after)
        if held:
            self._held.add(uid)
        return held

    def _hold_after(self, uid: str) -> str | None:
        """The resourceVersion after which ``uid``'s replayed changes were never sent one by one:
        the state of its inferred delete sent before the restart — also when a replay after an
        earlier restart has sent its delete again since, held back the same changes, and the journal
        says so (:attr:`~bridge.delivery.journal.JournalEntry.held_after`). None: nothing of it is
        held back."""
        before = self._resent.get(uid)
        if before is None:
            return None
        held = self._held_after.get(uid) or ""
        if before[1]:  # the inferred delete's state, or an earlier relist's from when that is older
            older = held.isdigit() and before[0].isdigit() and int(held) < int(before[0])
            return held if older else before[0]
        return held or None

    def _replayed_coalesced(self, n: Notification) -> list[ChangeEvent] | None:
        """What a replayed ``added`` or ``updated`` becomes when a relist sent its object before a
        restart (the journal's :attr:`~bridge.delivery.journal.JournalEntry.coalesced_from`); None
        when that does not apply (the change goes out as usual).

        The invariant kept here, **per-object order across a crash**: a sink never receives a
        change of an object older than a state it may hold, unless it is that same event again.
        A relist sent the object's state ``R`` (inside its gap); the changes after the gap's
        ``from`` and before ``R`` were coalesced, never sent. The checkpoint did not cover ``R``
        when the bridge crashed, so the watch, resumed from it, replays them: sent, they would
        follow ``R`` (and any later change) in every sink that had the relist. So they are held
        back; ``R`` goes out again as the relist sent it (same type, hence the same id), framed as a
        gap from ``from`` to ``R`` when something was held: a sink that lagged across the crash never
        received the relist's markers, and learns there which changes it did not get one by one.
        Changes up to ``from`` were observed and sent one by one before the relist (again, in
        order, for a sink that lacked them); those after ``R`` go out as usual."""
        obj = n.obj
        assert not isinstance(obj, DeletedFinalStateUnknown)
        uid, rv = object_identity(obj)
        sent = self._coalesced.get(uid)
        if sent is None or not rv.isdigit():
            return None
        since, at, added = sent
        if not (since.isdigit() and at.isdigit()) or not int(since) < int(rv) <= int(at):
            return None
        if int(rv) < int(at):
            # The first held change's old state is the one before the window (what a sink that
            # lacked the relist holds): the update that goes out in their place starts from it.
            self._held_coalesced.setdefault(uid, n.old)
            return []
        held = uid in self._held_coalesced
        old = self._held_coalesced.pop(uid, None) if held else n.old
        if added:
            event = self._event(EventType.ADDED, obj, n.time)
        else:
            event = self._event(EventType.UPDATED, obj, n.time, old=old)
        if not held or self._gap is not None:
            return [event]
        return self._framed(event, f"{self._snapshot_prefix}:relisted:{uid}:{since}:{at}", since, n.time)

    async def _ask_fate(self, n: Notification) -> None:
        """Under a selector, asks once whether the uid of a replayed change lives on, when what
        :meth:`_replayed_after_delete` sends depends on it: a change newer than the state its inferred
        delete carried, or a delete."""
        if self._exits is None or n.kind not in _CHANGE_KINDS:
            return
        obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
        uid, rv = object_identity(obj)
        after = self._hold_after(uid)
        if after is None or uid in self._fate:
            return
        if (n.kind is not NotificationKind.DELETE and rv.isdigit() and after.isdigit()
                and int(rv) <= int(after)):
            return  # sent again whatever the answer
        namespace, _, name = raw_object_key(obj).rpartition("/")
        self._fate[uid] = await self._exits.alive(namespace, name, uid)

    def _framed_replayed_delete(self, event: ChangeEvent, uid: str, observed: float) -> list[ChangeEvent]:
        """The replayed delete of a uid whose replayed changes were held back, framed as a gap from
        the state the inferred delete carried to the delete: a sink that lagged across the crash
        never received the relist that coalesced those changes (nor its gap markers), so it learns
        here that they were not delivered one by one. A sink that had them gets an empty-handed
        repetition of a window it already knows."""
        before = self._hold_after(uid) or ""
        return self._framed(event, f"{self._snapshot_prefix}:replayed:{uid}:{before}", before, observed)

    def _framed(self, event: ChangeEvent, gap_id: str, before: str, observed: float) -> list[ChangeEvent]:
        """``event`` between the markers of a gap of its own, from ``before`` to its resourceVersion."""
        info = GapInfo(id=gap_id, from_resource_version=before, to_resource_version=event.resource_version)
        begin = GapInfo(id=info.id, from_resource_version=before)
        at = observed or self._clock.wall()
        return [
            ChangeEvent(type=EventType.GAP_BEGIN, resource=self.resource, cluster=self.cluster, obj=None,
                        time=change_time(EventType.GAP_BEGIN, None, at), gap=begin),
            _with_gap(event, begin),
            ChangeEvent(type=EventType.GAP_END, resource=self.resource, cluster=self.cluster, obj=None,
                        time=change_time(EventType.GAP_END, None, at), gap=info),
        ]

    def events_for(self, n: Notification) -> list[ChangeEvent]:
        """The change events one notification becomes (empty for a no-change resync update)."""
        if n.kind is NotificationKind.ADD:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            if self._resent and self._replayed_after_delete(n.obj):
                return []
            if self._coalesced and (replayed := self._replayed_coalesced(n)) is not None:
                return replayed
            return [self._event(EventType.ADDED, n.obj, n.time)]
        if n.kind is NotificationKind.UPDATE:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            if n.is_resync or (self._resent and self._replayed_after_delete(n.obj)):
                return []
            if self._coalesced and (replayed := self._replayed_coalesced(n)) is not None:
                return replayed
            return [self._event(EventType.UPDATED, n.obj, n.time, old=n.old)]
        if n.kind is NotificationKind.DELETE:
            obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
            uid = object_identity(obj)[0]
            if self._closed and uid in self._closed:
                return []
            inferred = delete_is_inferred(n, self._tracker, self._resent)
            event = self._event(EventType.DELETED, obj, n.time, final_state_unknown=inferred)
            if (self._exits is not None and self._resent and self._fate.get(uid) is None
                    and self._hold_after(uid) is not None):
                self._closed.add(uid)  # read as gone: nothing of it after this delete
            if self._held and self._gap is None and uid in self._held:
                self._held.discard(uid)
                return self._framed_replayed_delete(event, uid, n.time)
            return [event]
        if n.kind is NotificationKind.GAP:
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
            yield self._event(EventType.SNAPSHOT_BEGIN, None, at, snapshot=info)
            for obj in objects:
                yield self._event(EventType.SYNC, obj, at, snapshot=info)
            yield self._event(EventType.SNAPSHOT_END, None, at, snapshot=end)

        return len(objects) + 2, stream()

    async def handle(self, notification: Notification, ack: AckFunc) -> None:
        self.stats.notifications += 1
        if self.bootstrapping:
            snapshot_ack = self._bootstrap_skips(notification, ack)
            if snapshot_ack is None:
                return
            ack = snapshot_ack
        elif self._skipped_gap and notification.kind is NotificationKind.GAP:
            gap = notification.gap
            if gap is not None and gap.end and gap.id == self._skipped_gap:
                self._skipped_gap = ""
                self.stats.bootstrap_skipped += 1
                ack()
                return
        admitted: list[Notification] | None = None
        if self.own_progress is not None and notification.kind is not NotificationKind.SNAPSHOT:
            admitted = self._filter_own(notification)
            if len(admitted) == 1:
                notification, admitted = admitted[0], None
            elif not admitted:
                self.stats.own_progress_skipped += 1
                ack()
                return
        if self._exits is not None and self._resent:
            for n in admitted if admitted is not None else (notification,):
                await self._ask_fate(n)
        journal = self._journal
        if journal is not None and journal.must_wait(notification.seq):
            # A new object or a delete: released only once the journal has it (module docs).
            await journal.wait(notification.seq)
        events: Iterable[ChangeEvent]
        if admitted is not None:  # a delete of the sink's own object, then the change
            listed = [e for a in admitted for e in self.events_for(a)]
            if not listed:
                ack()
                return
            if self._exits is not None:
                await self._mark_exits(listed)
            remaining, events = len(listed), listed
        elif notification.kind is NotificationKind.SNAPSHOT:
            self.stats.snapshots += 1
            remaining, events = self._snapshot_events(notification)
        else:
            listed = self.events_for(notification)
            if not listed:
                self.stats.resync_skipped += 1
                ack()
                return
            if self._exits is not None and notification.kind is NotificationKind.DELETE:
                await self._mark_exits(listed)
            if len(listed) == 1:  # the common case: one event, one ack
                await self._deliver_one(listed[0], ack)
                return
            remaining, events = len(listed), listed
        await self._deliver_all(events, remaining, ack)

    async def _deliver_all(self, events: Iterable[ChangeEvent], remaining: int, ack: AckFunc) -> None:
        """Hands ``events`` (``remaining`` of them) to the sink one by one; ``ack`` once the sink
        acknowledged every one."""
        # Guards against a sink acking one event twice: only the first ack of each event counts.
        done = [False] * remaining

        def event_ack(i: int) -> Callable[[DeliveryOutcome], None]:
            def _ack(outcome: DeliveryOutcome) -> None:
                nonlocal remaining
                if done[i]:
                    return
                done[i] = True
                self.stats.outcomes[outcome.value] += 1
                remaining -= 1
                if remaining == 0:
                    ack()

            return _ack

        for i, event in enumerate(events):
            self.stats.events += 1
            await self.sink.deliver(event, event_ack(i))

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        """Handles each notification with its ack, in order, as :meth:`handle` does one at a time
        (:class:`~bridge.contracts.BatchNotificationHandler`), with one ``deliver_batch`` call to the
        sink for each run of changes that become one event each.

        A change's events come from :meth:`events_for`, as in :meth:`handle` (what it skips, holds
        back or frames after a restart is the same); a change that becomes several events (a framed
        replay) is handed over on its own, in its place. What needs more than that goes through
        :meth:`handle` itself, once the events collected before it are handed over, so the sink sees
        exactly the order of one call per notification: markers and snapshots, a delete that may be
        a selector exit, a change of a selector-scoped informer replaying deletes sent before a
        restart (its uid's fate is asked first), every notification while bootstrapping or while the
        sink's own progress filters (:class:`~bridge.delivery.progress.SinkResume`). A notification
        the known-object journal holds back (``must_wait``) is awaited after handing over what came
        before it, and nothing after it is handed over before it."""
        stats = self.stats
        outcomes = stats.outcomes
        journal = self._journal
        add, update, delete = NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE
        events: list[ChangeEvent] = []
        event_acks: list[AckCallback] = []
        owners: list[AckFunc] = []
        """The notification ack of each collected event (one event per notification here)."""
        done: list[bool] = []
        i = 0
        try:
            for i, n in enumerate(notifications):
                ack = acks[i]
                kind = n.kind
                if (self.bootstrapping or self.own_progress is not None
                        or (self._exits is not None and (self._resent or kind is delete))
                        or (kind is not add and kind is not update and kind is not delete)):
                    if events:
                        await self._hand_over(events, event_acks, owners, i - 1)
                        events, event_acks, owners, done = [], [], [], []
                    await self.handle(n, ack)
                    continue
                if journal is not None and journal.must_wait(n.seq):
                    if events:
                        await self._hand_over(events, event_acks, owners, i - 1)
                        events, event_acks, owners, done = [], [], [], []
                    # A new object or a delete: released only once the journal has it (module docs).
                    await journal.wait(n.seq)
                stats.notifications += 1
                # What handle does for one change, through the same events_for (whatever it holds
                # back or frames after a restart stays exactly as one call per notification has it).
                listed = self.events_for(n)
                if len(listed) != 1:
                    if not listed:
                        stats.resync_skipped += 1
                        ack()
                        continue
                    if events:
                        await self._hand_over(events, event_acks, owners, i - 1)
                        events, event_acks, owners, done = [], [], [], []
                    await self._deliver_all(listed, len(listed), ack)
                    continue
                event = listed[0]
                # Defaults bind this event's values: one closure per event, no frame to make it.
                def event_ack(outcome: DeliveryOutcome, j: int = len(done), ack: AckFunc = ack,
                              flags: list[bool] = done) -> None:
                    if flags[j]:  # a sink acking one event twice: only the first ack counts
                        return
                    flags[j] = True
                    # ``_value_`` is the member's value as a plain attribute (``.value`` is a property).
                    outcomes[outcome._value_] += 1
                    ack()

                done.append(False)
                events.append(event)
                event_acks.append(event_ack)
                owners.append(ack)
            if events:
                await self._hand_over(events, event_acks, owners, len(notifications) - 1)
        except BatchInterrupted:
            raise
        except Exception as exc:
            # Notification i failed (building its event, waiting for the journal, or in handle):
            # what was collected before it is handed over as it would have been, then i is reported.
            if events:
                await self._hand_over(events, event_acks, owners, i - 1)
            raise BatchInterrupted(i) from exc

    async def _hand_over(self, events: list[ChangeEvent], acks: list[AckCallback], owners: list[AckFunc],
                         last: int) -> None:
        """Hands ``events`` to the sink in one call (a loop over ``deliver`` for a sink without
        ``deliver_batch``); ``owners`` are their notifications' acks, ``last`` the batch index of the
        last notification looked at. When the sink raises, which events it took is unknown: every
        owner is acknowledged (as if each had failed on its own: what a closed sink does to one call
        per notification) and the failure is reported at ``last``, after which the batch goes on."""
        sink = self.sink
        self.stats.events += len(events)
        try:
            # Looked up on the type: a wrapper forwarding unknown attributes (a third-party one
            # without ``deliver_batch``) must not have its own ``deliver`` bypassed.
            deliver_batch = getattr(type(sink), "deliver_batch", None)
            if deliver_batch is not None:
                await deliver_batch(sink, events, acks)
            else:
                for event, event_ack in zip(events, acks, strict=True):
                    await sink.deliver(event, event_ack)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for owner in owners:
                owner()
            raise BatchInterrupted(last) from exc

    async def _mark_exits(self, events: list[ChangeEvent]) -> None:
        """Marks the deletes whose object still exists: they left the informer's selector. A delete
        a relist inferred is asked too (the object is not listed: alive, it is out of scope). A
        replayed delete of a uid known to live on (:meth:`_replayed_after_delete`), up to its current
        resourceVersion, is an exit without asking again; one known gone is a delete."""
        for event in events:
            if event.type is not EventType.DELETED or event.obj is None or self._exits is None:
                continue
            uid, rv = event.uid, event.resource_version
            if uid in self._fate:
                alive = self._fate[uid]
                if alive is None:
                    continue
                if rv.isdigit() and int(rv) <= alive:
                    event.extensions[LEFT_SELECTOR_EXTENSION] = "true"
                    continue
            if await self._exits.left(event.namespace, event.name, uid, rv):
                event.extensions[LEFT_SELECTOR_EXTENSION] = "true"

    async def _deliver_one(self, event: ChangeEvent, ack: AckFunc) -> None:
        stats = self.stats
        stats.events += 1
        done = False

        def event_ack(outcome: DeliveryOutcome) -> None:
            nonlocal done
            if done:  # a sink acking one event twice: only the first ack counts
                return
            done = True
            stats.outcomes[outcome._value_] += 1  # the value as a plain attribute, not the property
            ack()

        await self.sink.deliver(event, event_ack)


def _with_gap(event: ChangeEvent, gap: GapInfo) -> ChangeEvent:
    event.gap = gap
    return event


def delete_is_inferred(n: Notification, tracker: AckTracker | None,
                       resent: Mapping[str, tuple[str, bool]]) -> bool:
    """Whether a delete notification goes out with ``finalstateunknown``.

    A tombstone (the relist no longer returned the object) and the old object of a re-creation found
    by a relist are inferred, except when the known-object journal says this very delete (same uid,
    same resourceVersion) was sent before a restart: it is then sent again exactly as it was, so it
    never appears as a second, inferred delete of a uid whose delete consumers already have."""
    obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
    if resent:
        uid, rv = object_identity(obj)
        before = resent.get(uid)
        if before is not None and before[0] == rv:
            return before[1]
    if isinstance(n.obj, DeletedFinalStateUnknown):
        return True
    return tracker is not None and tracker.is_unobserved_delete(n.seq)


# --------------------------------------------------------------------------------------------------
# What is watched and how informers are built


@dataclass(frozen=True, slots=True)
class WatchedResource:
    """One informer scope as the service resolved it.

    ``key`` names the resource and scope (the factory's :class:`~bridge.factory.InformerKey`),
    ``ref`` describes the resource as sinks see it, ``api`` is discovery's
    :class:`~bridge.discovery.APIResource` (what the HTTP ListerWatcher needs)."""

    key: InformerKey
    api: APIResource
    ref: ResourceRef
    shard: ShardFilter | None = None
    """This replica's share of the resource when sharding is configured (docs/sharding.md): shard
    ``o`` of ``t`` by object, or shard 0 of 1 for a resource watched whole by this replica. The
    informer's list/watch keeps only its objects; its checkpoint id says which shard it is, and the
    checkpoint is taken over from the store's other shards (:mod:`bridge.delivery.sharding`)."""

    @property
    def base_informer_id(self) -> str:
        """The id of the scope watched whole (no shard suffix)."""
        k = self.key
        return informer_id(k.resource, k.namespace, k.label_selector, k.field_selector)

    @property
    def informer_id(self) -> str:
        s = self.shard
        base = self.base_informer_id
        return base if s is None else shard_id(base, s.ordinal, s.total)

    @property
    def names(self) -> frozenset[str]:
        """What a user may call it in sink routing and on the snapshot endpoint."""
        r = self.ref
        return frozenset({self.key.resource, r.resource, r.qualified, r.kind, r.kind.lower()})


InformerBuilder = Callable[[WatchedResource, DeliveryObserver], SharedIndexInformer]
"""Builds the (not yet started) informer of one scope, reporting deliveries to the observer."""


def http_informer_builder(
    *, client: ApiClient, clock: Clock, page_size: int = 500, use_watch_list: bool = False,
    compact_cache: bool = False,
) -> InformerBuilder:
    """Informers over the real API (``ApiClient`` + ``HttpListerWatcher``), without a factory."""

    def build(watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        lw = HttpListerWatcher(
            client=client,
            resource=watched.api,
            namespace=watched.key.namespace,
            label_selector=watched.key.label_selector,
            field_selector=watched.key.field_selector,
            # A compact cache keeps objects as bytes: they stay bytes from the wire on (the
            # informer's default transform drops managedFields; here they are cut from the bytes).
            raw_objects=compact_cache,
            drop_managed_fields=compact_cache,
            shard=watched.shard,
        )
        return SharedIndexInformer(
            lister_watcher=lw,
            clock=clock,
            observer=observer,
            name=watched.informer_id,
            page_size=page_size,
            use_watch_list=use_watch_list,
            compact_cache=compact_cache,
        )

    return build


def own_knowledge(checkpoint: Checkpoint, section: SinkProgress) -> tuple[int, dict[str, Knowledge]]:
    """A sink's resume point and its knowledge where it differs from the checkpoint's base."""
    rv = int(section.resource_version or checkpoint.resource_version)
    own: dict[str, Knowledge] = {}
    for key, entry in section.objects.items():
        own[key] = ("", rv, True) if entry is None else (entry[0], int(entry[1]), False)
    for key, (uid, ahead_rv, deleted) in section.ahead.items():
        own[key] = (uid, int(ahead_rv), deleted)
    return rv, own


def stub_objects(resource: ResourceRef, index: Mapping[str, IndexEntry]) -> list[KubeObject]:
    """Metadata-only objects rebuilt from a checkpoint index (what a resumed informer knows)."""
    out: list[KubeObject] = []
    for key, (uid, rv) in index.items():  # key = "namespace/name" or "name"
        namespace, _, name = key.rpartition("/")
        meta: dict[str, Any] = {"name": name, "uid": uid, "resourceVersion": rv}
        if namespace:
            meta["namespace"] = namespace
        out.append({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta})
    return out


# --------------------------------------------------------------------------------------------------
# The pipeline


@dataclass(slots=True)
class _Informer:
    watched: WatchedResource
    informer: SharedIndexInformer
    tracker: _CountingTracker
    resumed: bool = False
    resume_rv: str = ""
    corrupt_checkpoint: bool = False
    registrations: dict[str, HandlerRegistration] = field(default_factory=dict)
    listeners: dict[str, SinkListener] = field(default_factory=dict)
    saved_generation: int = -1
    saved_acks: int = -1
    saved_rv: str = ""
    last_saved: float | None = None
    checkpoint_errors: int = 0
    journal: KnownObjectJournal | None = None
    failing: str = ""
    """Why the last list/watch cycle failed, while no progress was made since ("" = none)."""
    failing_progress: int = -1
    """The tracker's progress count when that failure was reported."""
    stale: list[str] = field(default_factory=list)
    """Checkpoint ids of other shard totals, removed once every current shard has passed them."""
    own_progress: dict[str, tuple[int, dict[str, Knowledge]]] = field(default_factory=dict)
    """Sink → its own resume point and knowledge (where it differs from the base) when the
    informer resumed; sinks at the base are absent."""
    bootstrapping: set[str] = field(default_factory=set)
    """Sinks with no progress of their own in the checkpoint, until they acknowledged their
    bootstrap snapshot; the checkpoint does not cover them before that (a crash bootstraps them
    again)."""


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """A point-in-time view for metrics and tests."""

    received: Mapping[str, Mapping[str, int]]
    """informer id → notification kind → count."""
    sinks: Mapping[str, Mapping[str, int]]
    """sink name → outcome (delivered, filtered, dead_lettered, dropped) → count."""
    queue_depth: Mapping[str, int]
    """sink name → notifications waiting in its listeners' buffers."""
    checkpoint_rv: Mapping[str, str]
    checkpoint_age: Mapping[str, float | None]
    checkpoint_lag: Mapping[str, int]
    relists: Mapping[str, int]
    resumed: Mapping[str, bool]


@dataclass(slots=True)
class _Outage:
    since: float | None = None
    """When the sink started failing (None while it is healthy)."""
    last_summary: float = 0.0
    catching_up: float | None = None
    """When it recovered, until its backlog is empty."""
    delivered_at: int = 0


@dataclass(frozen=True, slots=True)
class SinkBacklog:
    """What waits for one sink (:meth:`BridgePipeline.sink_backlog`)."""

    depth: int
    """Notifications waiting: in memory, in the spill and as degraded latest states."""
    spill_bytes: int
    """Bytes its spills occupy on disk now."""
    spilled: int
    """Notifications ever written to its spills."""
    degraded: int
    """Notifications kept only as the latest state of their object (spill full or absent)."""
    gaps: int
    """Gap windows it opened because it degraded."""


def _resource_matches(sink: Sink, watched: WatchedResource) -> bool:
    wanted: frozenset[str] = getattr(sink, "routing_resources", frozenset())
    return not wanted or bool(set(wanted) & watched.names)


DEFAULT_SPILL_LIMIT = 256 << 20
"""Bytes of spill per (sink, informer) when the sink does not say (``buffer.spill_limit``)."""


def _safe_name(name: str) -> str:
    """A directory name for a sink or an informer id (stable, readable, no separators)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"{cleaned[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _listener_options(sink: Sink, spill_directory: Path | None = None, informer: str = "") -> ListenerOptions:
    capacity = int(getattr(sink, "buffer_capacity", 1024))
    policy_raw = getattr(sink, "overflow_policy", OverflowPolicy.SPILL)
    policy = policy_raw if isinstance(policy_raw, OverflowPolicy) else OverflowPolicy(str(policy_raw))
    spill: SegmentSpill | None = None
    limit = int(getattr(sink, "spill_limit", DEFAULT_SPILL_LIMIT))
    if spill_directory is not None and limit > 0 and policy in (OverflowPolicy.SPILL,
                                                                 OverflowPolicy.COALESCE):
        where = spill_directory / _safe_name(sink.name) / _safe_name(informer)
        try:
            spill = SegmentSpill(where, limit_bytes=limit, name=f"{sink.name}:{informer}")
        except OSError as exc:
            log.error("sink %s: its spill directory %s cannot be used (%s); without a spill it "
                      "degrades as soon as it falls behind its in-memory buffer", sink.name, where, exc)
    # Resync is served as snapshots by the pipeline; the listener never gets same-RV updates.
    return ListenerOptions(resync_period=0.0, buffer_capacity=capacity, overflow_policy=policy,
                           name=sink.name, spill=spill)


_EVENT_TYPE = {"add": "added", "update": "updated", "delete": "deleted"}
"""Notification kind → the CloudEvents type of its events (a snapshot's objects are counted apart)."""


class _CountingTracker(AckTracker):
    """An AckTracker that also counts what the informer processed, by kind.

    The count is a plain ``Counter`` update (a fraction of a microsecond); the telemetry reads it at
    scrape time (:meth:`BridgePipeline.events_received`) instead of calling an SDK counter per change.
    """

    def __init__(self, *, resource: str, on_event: Callable[[str, str], None] | None,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.resource = resource
        self.on_event = on_event
        self.received: collections.Counter[str] = collections.Counter()
        self.progress_count = 0
        """Progress markers seen: the informer listed, or its watch moved, this many times."""
        self.journal: KnownObjectJournal | None = None
        self.resent: Mapping[str, tuple[str, bool]] = {}
        self.held_after: Mapping[str, str] = {}
        self.coalesced: Mapping[str, tuple[str, str, bool]] = {}
        """uid → (from, resourceVersion, added) of the objects the journal says a relist sent."""
        self.synced = 0
        """Objects of the snapshots dispatched (each becomes one ``sync`` event per sink)."""
        self.thresholds: list[tuple[int, Callable[[int], None]]] = []
        """(resourceVersion, callback(seq)): called once, with the marker's seq, when progress
        reaches the resourceVersion (a sink's own resume point)."""
        self.bootstrap_at: int | None = None
        """A resourceVersion the informer must reach before its cache holds no checkpoint stubs
        (a sink's bootstrap snapshot waits for it); None = nothing waits; -1 = the start-up list
        failed and is retried (:meth:`BridgePipeline._hydrate_late`)."""
        self.bootstrap_reached = asyncio.Event()

    def progress(self, seq: int, resource_version: str) -> None:
        self.progress_count += 1
        super().progress(seq, resource_version)
        if self.thresholds and resource_version.isdigit():
            reached = int(resource_version)
            for threshold in [t for t in self.thresholds if t[0] <= reached]:
                self.thresholds.remove(threshold)
                threshold[1](seq)
        at = self.bootstrap_at
        if at is not None and at >= 0 and resource_version.isdigit() and int(resource_version) >= at:
            self.bootstrap_at = None
            self.bootstrap_reached.set()

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        if notification.seq >= 0:
            kind = notification.kind._value_  # the value as a plain attribute, not the property
            self.received[kind] += 1
            if notification.snapshot is not None:
                self.synced += len(notification.snapshot)
            if self.on_event is not None:
                try:
                    self.on_event(self.resource, kind)
                except Exception:
                    log.exception("on_event callback failed")
        super().dispatched(notification, listeners)
        if self.journal is not None and listeners:
            inferred = (notification.kind is NotificationKind.DELETE
                        and delete_is_inferred(notification, self, self.resent))
            self.journal.note(notification, inferred=inferred)


class BridgePipeline:
    """Informers → sink listeners → sinks, with checkpoints and snapshots (see the module docs)."""

    def __init__(
        self,
        *,
        resources: Sequence[WatchedResource],
        sinks: Sequence[Sink],
        checkpoint_store: CheckpointStore | None,
        factory: SharedInformerFactory | None = None,
        build_informer: InformerBuilder | None = None,
        cluster: str = "default",
        checkpoint_interval: float = 5.0,
        snapshot_on_first_start: bool = False,
        clock: Clock | None = None,
        page_size: int = 500,
        use_watch_list: bool = False,
        on_event: Callable[[str, str], None] | None = None,
        start_sinks: bool = True,
        sync_timeout: float = 120.0,
        fetch_object: Callable[[WatchedResource, str, str], Awaitable[Mapping[str, Any]]] | None = None,
        spill_directory: str | os.PathLike[str] | None = None,
        outage_check_interval: float = 1.0,
        outage_summary_interval: float = 30.0,
    ) -> None:
        """``fetch_object(watched, namespace, name)``, when given, reads one object unfiltered from the
        API server (raising ``NotFoundError``): selector-scoped informers use it to mark deletes that
        were selector exits (:mod:`bridge.delivery.selector_exit`).
        ``factory`` (the service) or ``build_informer`` (tests, tools) makes the informers; with a
        factory, ``page_size`` and ``use_watch_list`` are passed to each informer it creates.
        ``checkpoint_store`` None disables checkpoints (every start lists everything).
        ``checkpoint_interval`` is in seconds; a checkpoint is written only when the acknowledged
        state moved. ``on_event(resource, kind)``, optional, is called synchronously for every change
        an informer processed, so it must be cheap: the service does not use it (it reads
        :meth:`events_received` at scrape time). ``start_sinks`` False leaves starting and closing the
        sinks to the caller. ``spill_directory``: where each sink's backlog beyond its in-memory
        buffer is spilled (one subdirectory per sink and informer, emptied at start; sinks no longer
        configured have theirs removed); None = no spill (a sink that falls behind degrades).
        Every ``outage_check_interval`` seconds each sink's health is checked: a WARNING when it
        starts failing, a summary every ``outage_summary_interval`` seconds while it stays down, an
        INFO when it recovers and when it has caught up."""
        if (factory is None) == (build_informer is None):
            raise ValueError("give exactly one of factory or build_informer")
        if checkpoint_interval <= 0:
            raise ValueError(f"checkpoint_interval must be positive, got {checkpoint_interval}")
        ids = [w.informer_id for w in resources]
        if len(set(ids)) != len(ids):
            raise ValueError("the same resource scope is watched twice")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        self._resources = list(resources)
        self._sinks = list(sinks)
        self._store = checkpoint_store
        # The store's capabilities, checked once: a journal, and listing/removal (resharding).
        self._journals = checkpoint_store if isinstance(checkpoint_store, JournalStore) else None
        self._listable = checkpoint_store if isinstance(checkpoint_store, ListableCheckpointStore) else None
        self._factory = factory
        self._build = build_informer
        self._cluster = cluster
        self._checkpoint_interval = checkpoint_interval
        self._snapshot_on_first_start = snapshot_on_first_start
        self._clock: Clock = clock or RealClock()
        self._page_size = page_size
        self._use_watch_list = use_watch_list
        self._on_event = on_event
        self._start_sinks = start_sinks
        self._sync_timeout = sync_timeout
        self._fetch_object = fetch_object
        self._spill_directory = Path(spill_directory) if spill_directory is not None else None
        self._outage_check = outage_check_interval
        self._outage_summary = outage_summary_interval
        self._outages: dict[str, _Outage] = {}
        self._informers: dict[str, _Informer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self._stopping = False
        self.failed_tasks: list[str] = []
        """Names of background tasks that died with an exception (logged when it happened)."""

    def _make_informer(self, watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        if self._build is not None:
            return self._build(watched, observer)
        assert self._factory is not None
        if watched.key in self._factory.informers:
            raise ValueError(f"the factory already has an informer for {watched.key}; the pipeline must "
                             "create it to observe its deliveries")
        # Named by its id, so that its logs' ``informer`` field is the metrics' ``informer`` label.
        return self._factory.informer_for(watched.key, observer=observer, page_size=self._page_size,
                                          use_watch_list=self._use_watch_list, name=watched.informer_id)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    async def start(self) -> None:
        """Loads checkpoints, starts sinks and informers and the background tasks. Returns at once
        (use :meth:`wait_for_sync` to wait for the caches)."""
        if self._started:
            raise RuntimeError("pipeline already started")
        self._started = True
        if self._start_sinks:
            for sink in self._sinks:
                await sink.start()
        self._remove_stale_spills()
        for watched in self._resources:
            await self._prepare(watched)
        if self._factory is not None:
            self._factory.start()
        for ident, inf in self._informers.items():
            if self._factory is None:
                self._spawn(f"informer:{ident}", inf.informer.run())
            for sink_name, reg in inf.registrations.items():
                sink = inf.listeners[sink_name].sink
                period = float(getattr(sink, "resync_period", 0.0) or 0.0)
                if period > 0:
                    self._spawn(f"snapshot-timer:{ident}:{sink_name}", self._snapshot_timer(inf, reg, period))
            if self._snapshot_on_first_start and not inf.resumed:
                self._spawn(f"first-snapshot:{ident}", self._first_snapshot(inf))
            if inf.bootstrapping:
                self._spawn(f"bootstrap:{ident}", self._bootstrap(inf))
        for ident, inf in self._informers.items():
            if inf.journal is not None:
                self._spawn(f"journal:{ident}", inf.journal.run())
        self._spawn("checkpoint-writer", self._checkpoint_loop())
        if self._outage_check > 0:
            self._spawn("sink-outages", self._outage_loop())

    async def _prepare(self, watched: WatchedResource) -> None:
        ident = watched.informer_id
        checkpoint: Checkpoint | None = None
        corrupt = False
        handover: TakeOver | None = None
        try:
            if self._store is not None and watched.shard is not None:
                handover = await take_over(self._store, base=watched.base_informer_id, shard=watched.shard)
                checkpoint = handover.plan.checkpoint
            elif self._store is not None:
                checkpoint = await self._store.load(ident)
        except CheckpointCorruptError as exc:
            corrupt = True
            log.warning("checkpoint is corrupt or unreadable (%s); ignoring it and doing a full "
                        "resync: consumers will see every object again", exc,
                        extra={"informer": ident, "resource": watched.ref.qualified})
        except CheckpointError as exc:
            corrupt = True
            log.warning("checkpoint store failed loading the checkpoint (%s); doing a full resync", exc,
                        extra={"informer": ident, "resource": watched.ref.qualified})
        tracker = _CountingTracker(
            name=ident,
            resource=watched.ref.qualified,
            on_event=self._on_event,
            resource_version=checkpoint.resource_version if checkpoint else "",
            index=checkpoint.objects if checkpoint else None,
            ahead=checkpoint.ahead if checkpoint else None,
            now=self._clock.now,
        )
        informer = self._make_informer(watched, tracker)
        exits: SelectorExits | None = None
        fetch = self._fetch_object
        if fetch is not None and (watched.key.label_selector or watched.key.field_selector):
            exits = SelectorExits(fetch=functools.partial(fetch, watched))
        inf = _Informer(watched=watched, informer=informer, tracker=tracker, corrupt_checkpoint=corrupt)
        if handover is not None:
            inf.stale = list(handover.plan.stale)
        informer.set_watch_error_handler(self._watch_error_recorder(inf))
        known, unconfirmed = await self._known_objects(inf, checkpoint, handover)
        routed = [sink for sink in self._sinks if _resource_matches(sink, watched)]
        diverging: set[str] = set()
        union_only: set[str] = set()
        """Objects the cache is seeded with that the base does not know (only some sinks do)."""
        if checkpoint is not None and checkpoint.sinks:
            for sink in routed:
                section = checkpoint.sinks.get(sink.name)
                if section is not None and not section.at_base:
                    inf.own_progress[sink.name] = own_knowledge(checkpoint, section)
            # The cache knows the union of what the sinks know: per object, the oldest state a sink
            # has (so a relist notifies every newer one, and a delete reaches whoever knew it). A key
            # the base has deleted (in its delivered-ahead map) counts as unknown: its index entry is
            # the object that delete removed, and a sink holding a later one there needs the relist's
            # tombstone to be of that later one (the informer suppresses one of the removed object,
            # whose delete every sink has).
            gone = {key for key, (_uid, _rv, deleted) in checkpoint.ahead.items() if deleted}
            extra: dict[str, IndexEntry] = {}
            for _, differs in inf.own_progress.values():
                for key, (uid, rv, deleted) in differs.items():
                    diverging.add(key)
                    if not deleted and (key not in known or key in gone) \
                            and (key not in extra or rv < int(extra[key][1])):
                        extra[key] = (uid, str(rv))
            known.update(extra)
            union_only = set(extra)
            tracker.seed_last_seen({key: rv for key, (_uid, rv) in extra.items()})
        seeds = stub_objects(watched.ref, known)
        if checkpoint is not None and checkpoint.sinks is not None:
            inf.bootstrapping = {sink.name for sink in routed if sink.name not in checkpoint.sinks}
            dropped = sorted(set(checkpoint.sinks) - {sink.name for sink in routed})
            if dropped:
                log.info("the checkpoint has progress of sinks no longer configured for this resource "
                         "(%s); it is dropped at the next checkpoint write", ", ".join(dropped),
                         extra={"informer": ident, "resource": watched.ref.qualified})
        if inf.bootstrapping:
            seeds, unconfirmed = await self._hydrate(inf, seeds, unconfirmed)
        if checkpoint is not None:
            delivered = {key: (int(rv), deleted) for key, (_uid, rv, deleted) in checkpoint.ahead.items()
                         if rv.isdigit()}
            informer.resume_from(seeds, checkpoint.resource_version, delivered, diverging)
            inf.resumed = True
            inf.resume_rv = checkpoint.resource_version
            inf.saved_rv = checkpoint.resource_version
            # A checkpoint whose sinks are not the configured ones is rewritten at the first interval.
            same_sinks = checkpoint.sinks is None or set(checkpoint.sinks) == {s.name for s in routed}
            inf.saved_generation = tracker.generation if same_sinks else -1
            log.info("resuming from checkpoint at resourceVersion %s (%d known objects)",
                     checkpoint.resource_version, len(checkpoint.objects),
                     extra={"informer": ident, "resource": watched.ref.qualified})
        if inf.journal is not None and inf.journal.unreadable:
            self._journal_unreadable(inf, checkpoint)
        if unconfirmed:
            informer.seed_unconfirmed(unconfirmed)
            log.info("%d objects delivered after the last checkpoint write are known from the journal",
                     len(unconfirmed), extra={"informer": ident, "resource": watched.ref.qualified})
        journal_only = [(object_key(stub), *object_identity(stub)) for stub in unconfirmed]
        for sink in routed:
            bootstrap = (functools.partial(self._bootstrapped, inf, sink.name)
                         if sink.name in inf.bootstrapping else None)
            own: SinkResume | None = None
            # After a reshard: where this sink acknowledged more of some objects (those of a
            # checkpoint where its own point was later) than the merged resume points say.
            floor = handover.plan.sink_floor(sink.name) if handover is not None else None
            if checkpoint is not None and (union_only or floor is not None) \
                    and sink.name not in inf.bootstrapping and sink.name not in inf.own_progress:
                # At the base, yet the cache holds objects only other sinks know: this one does not
                # (or it has floors of its own).
                inf.own_progress[sink.name] = (int(checkpoint.resource_version), {})
            if sink.name in inf.own_progress and sink.name not in inf.bootstrapping:
                own_rv, own_known = inf.own_progress[sink.name]
                own_known = {**{key: ("", -1, True) for key in union_only if key not in own_known},
                             **own_known}
                # The journal is the union of what any sink may have received since the base: what
                # this sink's own progress covers, it knows it does not have; what it does not
                # cover, the sink may hold whatever its section says (it was delivered after the
                # write), so the delete of it is never dropped.
                maybe: set[str] = set()
                for key, uid, stub_rv in journal_only:
                    if not (stub_rv.isdigit() and int(stub_rv) <= own_rv):
                        maybe.add(uid)
                    elif key not in known and key not in own_known:
                        own_known[key] = ("", -1, True)
                own = SinkResume(resource_version=own_rv, known=own_known, maybe=maybe,
                                 api_version=watched.ref.api_version, kind=watched.ref.kind,
                                 floor=floor, floor_max=max(
                                     (handover.plan.sink_floors.get(sink.name, {}).values()
                                      if handover is not None else ()), default=0))
                log.info("sink %s resumes from its own resourceVersion %d (%d objects where it differs "
                         "from the slowest sink's)", sink.name, own_rv, len(own_known),
                         extra={"sink": sink.name, "informer": ident, "resource": watched.ref.qualified})
            listener = SinkListener(sink=sink, resource=watched.ref, cluster=self._cluster,
                                    clock=self._clock, snapshot_prefix=ident, tracker=tracker,
                                    journal=inf.journal, resent=tracker.resent,
                                    held_after=tracker.held_after, coalesced=tracker.coalesced,
                                    exits=exits,
                                    shard=(None if watched.shard is None
                                           else (watched.shard.ordinal, watched.shard.total)),
                                    bootstrap=bootstrap, own_progress=own)
            if own is not None:
                tracker.thresholds.append((own.passed_at, listener.own_progress_passed))
            if sink.name in inf.own_progress and sink.name not in inf.bootstrapping:
                # Its knowledge differs from the base: its own progress follows every change from
                # the first one (see AckTracker.follow_listener).
                tracker.follow_listener(sink.name, *inf.own_progress[sink.name])
            reg = informer.add_event_handler(listener, _listener_options(sink, self._spill_directory,
                                                                         ident))
            inf.registrations[sink.name] = reg
            inf.listeners[sink.name] = listener
        self._informers[ident] = inf

    @staticmethod
    def _journal_unreadable(inf: _Informer, checkpoint: Checkpoint | None) -> None:
        """The journal left by the previous run cannot be read: the objects it recorded (delivered
        after the last checkpoint write) are unknown, so a delete of one while the bridge was down
        may reach no sink. Resumed from a checkpoint, the watch replays every change since it
        (those deletes included); if that history expired, the relist is framed by gap markers from
        the checkpoint's resourceVersion anyway. Without a checkpoint, the first list is framed by
        gap markers from resourceVersion 0 so that consumers learn it too."""
        journal = inf.journal
        assert journal is not None
        ident, resource = inf.watched.informer_id, inf.watched.ref.qualified
        if checkpoint is not None:
            log.warning("known-object journal %s cannot be read (%s); resuming from the checkpoint: if "
                        "the server's history since resourceVersion %s expired, the relist (framed by gap "
                        "markers) cannot report deletes of objects delivered after that checkpoint write",
                        journal.backend.name, journal.unreadable, checkpoint.resource_version,
                        extra={"informer": ident, "resource": resource})
            return
        log.warning("known-object journal %s cannot be read (%s) and there is no checkpoint: a full list "
                    "framed by gap markers from resourceVersion 0 (objects delivered before and deleted "
                    "while the bridge was down get no delete)", journal.backend.name, journal.unreadable,
                    extra={"informer": ident, "resource": resource})
        inf.informer.frame_first_list("0")

    async def _hydrate(self, inf: _Informer, seeds: list[KubeObject], unconfirmed: list[KubeObject]
                       ) -> tuple[list[KubeObject], list[KubeObject]]:
        """Replaces the checkpoint's metadata-only stubs by whole objects, for a sink's bootstrap
        snapshot: one list of the scope now; a listed object with the stub's uid and
        resourceVersion is that very state. A stub without its listed twin changed or went after
        the checkpoint, so the resumed watch replays it (or a 410 relist lists it) before reaching
        the list's resourceVersion: the snapshot waits for that point
        (:attr:`_CountingTracker.bootstrap_at`), or is taken at once when no stub is left."""
        watched = inf.watched
        try:
            listed, list_rv = await inf.informer.list_current()
        except Exception as exc:
            # Without whole objects the snapshot waits: _bootstrap lists again (see _hydrate_late).
            log.warning("listing %s for the bootstrap snapshot of %s failed (%s); the snapshot waits "
                        "until a list answers", watched.ref.qualified, ", ".join(sorted(inf.bootstrapping)),
                        exc, extra={"informer": watched.informer_id, "resource": watched.ref.qualified})
            inf.tracker.bootstrap_at = -1
            return seeds, unconfirmed
        current = {object_identity(obj): obj for obj in listed}
        left = 0

        def whole(stubs: list[KubeObject]) -> list[KubeObject]:
            nonlocal left
            out = []
            for stub in stubs:
                obj = current.get(object_identity(stub))
                if obj is None:
                    left += 1
                out.append(stub if obj is None else obj)
            return out

        seeds, unconfirmed = whole(seeds), whole(unconfirmed)
        if left:
            inf.tracker.bootstrap_at = int(list_rv) if list_rv.isdigit() else -1
        else:
            inf.tracker.bootstrap_reached.set()
        log.info("bootstrapping sinks %s with a snapshot of %d objects (%d changed since the checkpoint "
                 "and wait for the watch to replay them)", ", ".join(sorted(inf.bootstrapping)),
                 len(listed), left, extra={"informer": watched.informer_id,
                                           "resource": watched.ref.qualified})
        return seeds, unconfirmed

    async def _bootstrap(self, inf: _Informer) -> None:
        """Sends each bootstrapping sink its snapshot once the cache holds whole objects."""
        tracker = inf.tracker
        if tracker.bootstrap_at == -1:
            await self._hydrate_late(inf)
        await tracker.bootstrap_reached.wait()
        for name in sorted(inf.bootstrapping):
            inf.listeners[name].bootstrap_ready()
            inf.informer.request_snapshot(inf.registrations[name])

    async def _hydrate_late(self, inf: _Informer) -> None:
        """The start-up list of :meth:`_hydrate` failed, so the running cache holds the checkpoint's
        stubs. A healthy resumed watch never relists, so this lists again, with the reflector's
        backoff, until a list answers; its whole objects replace the stubs of the same state
        (:meth:`SharedIndexInformer.fill_in`) and the snapshot waits, as at start, until the
        informer has processed up to the list's resourceVersion. Should the reflector relist on its
        own first (a 410), that relist brings whole objects: the snapshot waits for it instead."""
        informer, tracker, watched = inf.informer, inf.tracker, inf.watched
        extra = {"informer": watched.informer_id, "resource": watched.ref.qualified}
        sinks = ", ".join(sorted(inf.bootstrapping))
        backoff = Backoff(clock=self._clock)
        delay, failed = backoff.next_delay(), 1
        while True:
            await self._clock.sleep(delay)
            reflector = informer.reflector
            if reflector is not None and reflector.list_count > 0:
                rv = reflector.last_sync_resource_version
                tracker.bootstrap_at = int(rv) if rv.isdigit() else 0
                return
            try:
                listed, list_rv = await informer.list_current()
            except Exception as exc:
                failed += 1
                delay = backoff.next_delay()
                log.warning("listing %s for the bootstrap snapshot of %s failed again (%s); retrying "
                            "in %.1fs", watched.ref.qualified, sinks, exc, delay, extra=extra)
                continue
            processed = await informer.fill_in(listed)
            if processed.isdigit() and list_rv.isdigit() and int(processed) >= int(list_rv):
                tracker.bootstrap_reached.set()
            else:
                tracker.bootstrap_at = int(list_rv) if list_rv.isdigit() else 0
            log.info("bootstrapping sinks %s with a snapshot of %d objects (listed after %d failed "
                     "lists)", sinks, len(listed), failed, extra=extra)
            return

    def _bootstrapped(self, inf: _Informer, name: str) -> None:
        """The sink acknowledged its whole bootstrap snapshot: from now on the checkpoint covers it."""
        inf.bootstrapping.discard(name)
        inf.saved_generation = -1  # written at the next interval, even if nothing else moved
        log.info("sink %s bootstrapped: it has the snapshot and follows the live stream", name,
                 extra={"sink": name, "informer": inf.watched.informer_id,
                        "resource": inf.watched.ref.qualified})

    def _remove_stale_spills(self) -> None:
        """Removes the spill directories of sinks no longer configured."""
        root = self._spill_directory
        if root is None or not root.is_dir():
            return
        wanted = {_safe_name(s.name) for s in self._sinks}
        for entry in root.iterdir():
            if entry.is_dir() and entry.name not in wanted:
                log.info("removing the spill of a sink no longer configured: %s", entry)
                shutil.rmtree(entry, ignore_errors=True)

    async def _known_objects(self, inf: _Informer, checkpoint: Checkpoint | None,
                             handover: TakeOver | None = None
                             ) -> tuple[dict[str, IndexEntry], list[KubeObject]]:
        """What the resumed informer knows: the checkpoint's objects (its index, updated by its
        delivered-ahead map) with the journal's deletes applied, and the journal's objects the
        checkpoint does not know (unconfirmed stubs). Opens the informer's journal when the store
        keeps one."""
        known: dict[str, IndexEntry] = dict(checkpoint.objects) if checkpoint is not None else {}
        if checkpoint is not None:
            for key, (uid, rv, deleted) in checkpoint.ahead.items():
                if not deleted:
                    known[key] = (uid, rv)
        if self._journals is None:
            return known, []
        ident = inf.watched.informer_id
        journal = KnownObjectJournal(backend=self._journals.journal_backend(ident), informer_id=ident,
                                     clock=self._clock)
        inf.journal = inf.tracker.journal = journal
        resent: dict[str, tuple[str, bool]] = {}
        held_after: dict[str, str] = {}
        coalesced: dict[str, tuple[str, str, bool]] = {}
        unconfirmed: list[tuple[str, str, str]] = []
        loaded = await journal.load(checkpoint)
        if handover is not None and (handover.adopted or handover.keep_own_journal is not None):
            loaded = journal.adopt(handover.adopted, handover.keep_own_journal)
        for key, items in entries_by_key(loaded).items():
            for uid, entry in items:
                if entry.deleted:
                    resent[uid] = (entry.resource_version, entry.inferred)
                    if entry.held_after:
                        held_after[uid] = entry.held_after
                elif entry.coalesced_from:
                    coalesced[uid] = (entry.coalesced_from, entry.resource_version, entry.coalesced_added)
                if known.get(key, ("",))[0] == uid:
                    if entry.deleted:  # re-sent, if at all, as the delete it was
                        known[key] = (uid, entry.resource_version)
                else:
                    unconfirmed.append((key, uid, entry.resource_version))
        inf.tracker.resent = resent
        inf.tracker.held_after = held_after
        inf.tracker.coalesced = coalesced
        stubs = [stub_objects(inf.watched.ref, {key: (uid, rv)})[0] for key, uid, rv in unconfirmed]
        return known, stubs

    @staticmethod
    def _watch_error_recorder(inf: _Informer) -> WatchErrorHandler:
        """The informer's watch-error handler: logs as the default one does, and keeps the reason for
        readiness until the informer makes progress again (a list, a watch event, a bookmark)."""

        def handler(reflector: Reflector, err: BaseException) -> None:
            default_watch_error_handler(reflector, err)
            inf.failing = f"{type(err).__name__}: {err}"
            inf.failing_progress = inf.tracker.progress_count

        return handler

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(self._guard(name, coro), name=f"pipeline:{name}")
        self._tasks[name] = task

    async def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            if not self._stopping:
                self.failed_tasks.append(name)
                log.exception("pipeline task %s failed", name)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """True once every informer's cache has synced."""
        limit = self._sync_timeout if timeout is None else timeout
        results = await asyncio.gather(
            *(inf.informer.wait_for_cache_sync(limit) for inf in self._informers.values())
        )
        return all(results)

    def ready(self) -> bool:
        """Every informer synced and able to list and watch, and every sink healthy."""
        return (
            self._started
            and not self._stopping
            and all(inf.informer.has_synced() and not self._failing(inf) for inf in self._informers.values())
            and all(s.healthy() for s in self._sinks)
            and not any(inf.journal is not None and inf.journal.last_error
                        for inf in self._informers.values())
            and not any(name.startswith("journal:") for name in self.failed_tasks)
        )

    @staticmethod
    def _failing(inf: _Informer) -> str:
        """Why the informer cannot list or watch: its last list/watch cycle failed and it has made
        no progress since ("" when it is fine)."""
        if inf.failing and inf.tracker.progress_count == inf.failing_progress:
            return inf.failing
        return ""

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        for i, inf in self._informers.items():
            if why := self._failing(inf):
                reasons.append(f"informer {i} cannot list or watch: {why}")
            elif not inf.informer.has_synced():
                reasons.append(f"informer {i} not synced")
            if inf.journal is not None and inf.journal.last_error:
                reasons.append(f"journal of {i} cannot be written (new objects and deletes wait): "
                               f"{inf.journal.last_error}")
            if f"journal:{i}" in self.failed_tasks:
                reasons.append(f"journal writer of {i} failed (new objects and deletes wait)")
        for s in self._sinks:
            if not s.healthy():
                backlog = self.sink_backlog(s.name)
                error = getattr(s, "last_error", "") or ""
                reasons.append(f"sink {s.name} unhealthy" + (f": {error}" if error else "")
                               + f" ({backlog.depth} changes waiting, {backlog.spill_bytes} bytes spilled)")
        return reasons

    async def shutdown(self, deadline: float = 30.0) -> None:
        """Stops intake, drains the listeners, flushes the sinks, writes the final checkpoints and
        closes everything, within ``deadline`` seconds (event-loop time). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, deadline)

        def left() -> float:
            return max(0.0, end - loop.time())

        # The journal writers stay: the listeners draining may wait for them.
        await self._cancel_tasks(lambda name: not name.startswith(("informer:", "journal:")))
        for inf in self._informers.values():
            reflector = inf.informer.reflector
            if reflector is not None:
                reflector.stop()
        drains = [reg.listener.wait_drained() for inf in self._informers.values()
                  for reg in inf.registrations.values()]
        if drains:
            try:
                async with asyncio.timeout(left() * 0.5):
                    await asyncio.gather(*drains)
            except TimeoutError:
                log.warning("shutdown: sink listeners did not drain in time; the unacked rest will be "
                            "re-sent after the restart")
        if self._sinks:
            flushes = await asyncio.gather(*(s.flush(left() * 0.5) for s in self._sinks),
                                           return_exceptions=True)
            for sink, ok in zip(self._sinks, flushes, strict=True):
                if ok is not True:
                    log.warning("shutdown: the sink did not flush everything (%r)", ok,
                                extra={"sink": sink.name})
        await self.write_checkpoints()
        journals = [inf.journal.idle() for inf in self._informers.values() if inf.journal is not None]
        if journals:
            try:
                async with asyncio.timeout(left() * 0.5):
                    await asyncio.gather(*journals)
            except TimeoutError:
                log.warning("shutdown: a known-object journal was not written in time; the next start "
                            "reads the previous one")
        await asyncio.gather(*(inf.informer.shutdown(left()) for inf in self._informers.values()),
                             return_exceptions=True)
        if self._factory is not None:
            await self._factory.shutdown(left())
        await self._cancel_tasks(lambda name: True)
        if self._start_sinks:
            for sink in self._sinks:
                try:
                    await sink.close()
                except Exception:
                    log.exception("shutdown: closing the sink failed", extra={"sink": sink.name})
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()

    async def abort(self) -> None:
        """Stops everything at once, without draining, flushing or writing a checkpoint: leadership
        was lost, so what is in flight is abandoned (the next leader re-sends it from the last
        checkpoint) and nothing more reaches a sink or the store: a store write under way in a
        thread finishes before this returns (:mod:`bridge.delivery.store_io`), so a pipeline
        started next in this process never has its journal or checkpoint replaced by a late write
        of this one. Idempotent; may interrupt a :meth:`shutdown` under way."""
        self._stopping = True
        for inf in self._informers.values():
            if inf.informer.reflector is not None:
                inf.informer.reflector.stop()
        if self._start_sinks:
            for sink in self._sinks:  # cancels their sends under way
                try:
                    await sink.close()
                except Exception:
                    log.exception("abort: closing sink %s failed", sink.name)
        await asyncio.gather(*(inf.informer.shutdown(0.0) for inf in self._informers.values()),
                             return_exceptions=True)
        if self._factory is not None:
            await self._factory.shutdown(0.0)
        await self._cancel_tasks(lambda name: True)
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()

    async def _cancel_tasks(self, which: Callable[[str], bool]) -> None:
        tasks = [t for name, t in self._tasks.items() if which(name)]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {n: t for n, t in self._tasks.items() if not t.done()}

    # ---------------------------------------------------------------------------------------------
    # checkpoints

    async def _checkpoint_loop(self) -> None:
        while True:
            await self._clock.sleep(self._checkpoint_interval)
            await self.write_checkpoints()

    async def write_checkpoints(self) -> int:
        """Saves every informer whose acknowledged state moved since its last save; returns how
        many were written. Store failures are logged and retried at the next interval."""
        written = 0
        if self._store is None:
            return 0
        for ident, inf in self._informers.items():
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

    async def _remove_stale(self, inf: _Informer) -> None:
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
    def _sink_sections(inf: _Informer, base_rv: str) -> dict[str, SinkProgress]:
        """The checkpoint's per-sink section: each sink covered (not bootstrapping) with its own
        progress as differences from the base (:meth:`AckTracker.listener_state`)."""
        base = int(base_rv) if base_rv.isdigit() else 0
        sections: dict[str, SinkProgress] = {}
        for name in inf.registrations:
            if name in inf.bootstrapping:
                continue
            floor, own = inf.own_progress.get(name, (0, {}))
            rv, diff = inf.tracker.listener_state(name, floor, own)
            objects: dict[str, tuple[str, str] | None] = {}
            ahead: dict[str, tuple[str, str, bool]] = {}
            for key, k in diff.items():
                if k is None:
                    objects[key] = None
                elif k[1] <= rv and not k[2]:
                    objects[key] = (k[0], str(k[1]))
                else:
                    ahead[key] = (k[0], str(k[1]), k[2])
            sections[name] = SinkProgress(resource_version=str(rv) if rv > base else "",
                                          objects=objects, ahead=ahead)
        return sections

    # ---------------------------------------------------------------------------------------------
    # snapshots

    async def _snapshot_timer(self, inf: _Informer, reg: HandlerRegistration, period: float) -> None:
        while True:
            await self._clock.sleep(period)
            inf.informer.request_snapshot(reg)

    async def _first_snapshot(self, inf: _Informer) -> None:
        while not inf.informer.has_synced():
            await inf.informer.wait_for_cache_sync(3600.0)
        inf.informer.request_snapshot(None)

    async def snapshot_now(self, resource: str | None = None, sink: str | None = None) -> list[str]:
        """Requests a snapshot of ``resource`` (any name a user may write; None = all) for every
        routed sink, or for ``sink`` alone (the others receive nothing); returns the informer ids.
        Unknown resource or sink, or a sink not routed that resource → LookupError."""
        if sink is not None and sink not in {s.name for s in self._sinks}:
            raise LookupError(f"no sink is called {sink!r}")
        targets = [inf for inf in self._informers.values()
                   if (resource is None or resource in inf.watched.names)
                   and (sink is None or sink in inf.registrations)]
        if not targets:
            if sink is not None:
                raise LookupError(f"sink {sink!r} receives no watched resource called {resource!r}"
                                  if resource else f"sink {sink!r} receives no watched resource")
            raise LookupError(f"no watched resource is called {resource!r}")
        for inf in targets:
            inf.informer.request_snapshot(inf.registrations[sink] if sink is not None else None)
        return [inf.watched.informer_id for inf in targets]

    # ---------------------------------------------------------------------------------------------
    # inspection

    @property
    def informers(self) -> dict[str, SharedIndexInformer]:
        return {i: inf.informer for i, inf in self._informers.items()}

    def tracker(self, ident: str) -> AckTracker:
        return self._informers[ident].tracker

    def listener(self, ident: str, sink_name: str) -> SinkListener:
        return self._informers[ident].listeners[sink_name]

    def resumed(self, ident: str) -> bool:
        return self._informers[ident].resumed

    def stats(self) -> PipelineStats:
        now = self._clock.now()
        sink_outcomes: dict[str, collections.Counter[str]] = {s.name: collections.Counter()
                                                              for s in self._sinks}
        depth: dict[str, int] = {s.name: 0 for s in self._sinks}
        for inf in self._informers.values():
            for name, listener in inf.listeners.items():
                sink_outcomes[name].update(listener.stats.outcomes)
                depth[name] += inf.registrations[name].listener.depth
        return PipelineStats(
            received={i: dict(inf.tracker.received) if isinstance(inf.tracker, _CountingTracker) else {}
                      for i, inf in self._informers.items()},
            sinks={n: dict(c) for n, c in sink_outcomes.items()},
            queue_depth=depth,
            checkpoint_rv={i: inf.saved_rv for i, inf in self._informers.items()},
            checkpoint_age={i: (None if inf.last_saved is None else now - inf.last_saved)
                            for i, inf in self._informers.items()},
            checkpoint_lag={i: inf.tracker.lag for i, inf in self._informers.items()},
            relists={i: (inf.informer.reflector.list_count if inf.informer.reflector else 0)
                     for i, inf in self._informers.items()},
            resumed={i: inf.resumed for i, inf in self._informers.items()},
        )

    def events_received(self) -> dict[str, dict[str, int]]:
        """Resource (``pods``, ``deployments.apps``) → change kind → changes processed so far, summed
        over the informers that watch that resource (several scopes may)."""
        totals: dict[str, collections.Counter[str]] = {}
        for inf in self._informers.values():
            if isinstance(inf.tracker, _CountingTracker):
                totals.setdefault(inf.tracker.resource, collections.Counter()).update(inf.tracker.received)
        return {resource: dict(c) for resource, c in totals.items()}

    def sink_backlog(self, name: str) -> SinkBacklog:
        """What waits for one sink, summed over its informers: in memory, on disk, degraded."""
        totals = [0, 0, 0, 0, 0]
        for inf in self._informers.values():
            reg = inf.registrations.get(name)
            if reg is None:
                continue
            st = reg.listener.stats()
            for i, v in enumerate((st.depth, st.spill_bytes, st.spilled, st.degraded, st.gaps)):
                totals[i] += v
        return SinkBacklog(*totals)

    def sink_lag(self, name: str) -> float:
        """Seconds since the oldest change this sink has not acknowledged was dispatched (0 if none)."""
        oldest = [t for inf in self._informers.values() if name in inf.registrations
                  if (t := inf.tracker.oldest_unacked(name)) is not None]
        return max(0.0, self._clock.now() - min(oldest)) if oldest else 0.0

    def _delivered(self, name: str) -> int:
        return sum(inf.listeners[name].stats.outcomes.get("delivered", 0)
                   for inf in self._informers.values() if name in inf.listeners)

    # ---------------------------------------------------------------------------------------------
    # outages

    async def _outage_loop(self) -> None:
        while True:
            await self._clock.sleep(self._outage_check)
            self.check_sinks()

    def check_sinks(self) -> None:
        """Logs sink outages (module docs of :class:`BridgePipeline`); called periodically."""
        now = self._clock.now()
        for sink in self._sinks:
            name = sink.name
            st = self._outages.setdefault(name, _Outage())
            healthy = sink.healthy()
            error = str(getattr(sink, "last_error", "") or "unknown error")
            if not healthy:
                if st.since is None:
                    st.since = st.last_summary = now
                    st.catching_up = None
                    backlog = self.sink_backlog(name)
                    log.warning("sink %s is failing: %s; its changes wait for it (%d waiting), the "
                                "other sinks are not held back", name, error, backlog.depth,
                                extra={"sink": name, "error": error})
                elif now - st.last_summary >= self._outage_summary:
                    st.last_summary = now
                    backlog = self.sink_backlog(name)
                    lag = self.sink_lag(name)
                    log.warning("sink %s still failing after %.0fs: %d changes waiting, %d bytes "
                                "spilled, oldest unacknowledged %.0fs old; last error: %s", name,
                                now - st.since, backlog.depth, backlog.spill_bytes, lag, error,
                                extra={"sink": name, "backlog": backlog.depth,
                                       "spill_bytes": backlog.spill_bytes, "lag_seconds": lag})
                continue
            if st.since is not None:
                down = now - st.since
                st.since = None
                st.catching_up = now
                st.delivered_at = self._delivered(name)
                backlog = self.sink_backlog(name)
                log.info("sink %s recovered after %.1fs; %d changes to catch up", name, down,
                         backlog.depth, extra={"sink": name, "down_seconds": down,
                                               "backlog": backlog.depth})
            if st.catching_up is not None and self.sink_backlog(name).depth == 0 \
                    and self.sink_lag(name) == 0.0:
                caught = self._delivered(name) - st.delivered_at
                log.info("sink %s caught up: %d events in %.1fs", name, caught, now - st.catching_up,
                         extra={"sink": name, "caught_up": caught})
                st.catching_up = None

    def queue_depths(self) -> dict[str, int]:
        """Sink name → notifications waiting in its listeners' buffers."""
        return dict(self.stats().queue_depth)

    def informer_gauges(self) -> dict[str, InformerGauges]:
        """Informer (its key, as text) → the gauges the telemetry reads."""
        st = self.stats()
        gauges: dict[str, InformerGauges] = {}
        for i, inf in self._informers.items():
            reflector = inf.informer.reflector
            received: dict[str, int] = {}
            if isinstance(inf.tracker, _CountingTracker):
                received = {_EVENT_TYPE[k]: n for k, n in inf.tracker.received.items() if k in _EVENT_TYPE}
                if inf.tracker.synced:
                    received["sync"] = inf.tracker.synced
            gauges[str(inf.watched.key)] = InformerGauges(
                resource=inf.watched.ref.qualified,
                informer=i,
                received=received,
                relists=st.relists[i],
                watch_restarts=max(0, reflector.watch_count - 1) if reflector else 0,
                expired=reflector.expired_count if reflector else 0,
                cached_objects=len(inf.informer.get_indexer()),
                checkpoint_age=st.checkpoint_age[i],
                checkpoint_lag=st.checkpoint_lag[i],
            )
        return gauges

    def telemetry_snapshot(self) -> TelemetrySnapshot:
        """The gauges :class:`bridge.telemetry.Telemetry` reads at each scrape."""
        st = self.stats()
        sinks = {
            s.name: SinkGauges(queue_depth=st.queue_depth[s.name],
                               spill_bytes=self.sink_backlog(s.name).spill_bytes,
                               lag_seconds=self.sink_lag(s.name),
                               in_flight=int(getattr(getattr(s, "stats", None), "in_flight", 0) or 0),
                               up=s.healthy(), outcomes=st.sinks[s.name])
            for s in self._sinks
        }
        informers = self.informer_gauges()
        return TelemetrySnapshot(sinks=sinks, informers=informers, events_received=self.events_received())
