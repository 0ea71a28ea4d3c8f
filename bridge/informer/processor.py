"""The fan-out half of a shared informer: client-go's ``sharedProcessor`` and ``processorListener``.

An informer processes each change once and hands the resulting :class:`~bridge.contracts.Notification`
to every listener (one per handler or sink). Each listener owns a **bounded** in-memory buffer and a
worker task that drains it in order, so a slow handler delays only itself, never the informer or its
siblings: handing a notification to a listener never waits (except under the opt-in ``BLOCK``
policy). What does not fit in memory goes, in order, to the listener's spill on disk
(:class:`~bridge.contracts.NotificationSpill`); what the spill cannot take either **degrades**: the
listener keeps the latest state per object (memory bounded by the number of objects) and delivers
those states later between a gap marker of its own (``GAP`` begin, the states, ``GAP`` end), as a
relist would. See :class:`~bridge.contracts.OverflowPolicy`.

The processor also does the bookkeeping the checkpoint needs: it numbers every tracked notification
with a strictly increasing ``seq``, tells the :class:`~bridge.contracts.DeliveryObserver` who got it,
relays each listener's acknowledgement, and forwards the informer's resourceVersion progress markers.

Acknowledgement rules (what the observer sees):

* a plain :class:`~bridge.contracts.EventHandler` acknowledges when its method returns;
* a :class:`~bridge.contracts.NotificationHandler` acknowledges by calling the ``ack`` it is given;
  one with ``handle_batch`` (:class:`~bridge.contracts.BatchNotificationHandler`) is handed
  everything ready in the buffer at once (at most :data:`BATCH_LIMIT`, sized to a time slice), each
  notification with its own ``ack``; coalescing, spill, gap windows and acknowledgements are exactly
  as with one notification per call;
* a handler that **raises** is logged and counted, and the notification is acknowledged anyway: a
  broken handler must not stall every checkpoint forever (it is reported through ``handler_errors``);
  a batch interrupted at one notification (:class:`~bridge.contracts.BatchInterrupted`) acknowledges
  that one and carries on with the rest; a batch failing otherwise acknowledges every notification of
  it not yet acknowledged;
* a notification superseded by coalescing is acknowledged when it is merged (its successor carries
  the newer state, so nothing final is lost); a dropped one is acknowledged as discarded;
* ``SNAPSHOT`` and ``GAP`` notifications are never dropped nor coalesced (under ``BLOCK`` they wait
  for room; otherwise they are queued past the capacity, in order); nothing coalesces across a
  ``GAP`` marker.

Timeouts given to :meth:`SharedProcessor.shutdown` are operational deadlines measured on the event
loop's own time, not on the injected clock, so a test driving a ``FakeClock`` cannot hang in them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.contracts import (
    AckFunc,
    BatchInterrupted,
    DeletedFinalStateUnknown,
    DeliveryObserver,
    EventHandler,
    Gap,
    KubeObject,
    ListenerOptions,
    Notification,
    NotificationHandler,
    NotificationKind,
    NotificationSpill,
    ObjectKey,
    OverflowPolicy,
)
from bridge.rawobject import object_identity

__all__ = [
    "BATCH_LIMIT",
    "CATCH_UP_BYTES",
    "CATCH_UP_TURNS",
    "MINIMUM_RESYNC_PERIOD",
    "TIME_SLICE",
    "ListenerStats",
    "ProcessorListener",
    "SharedProcessor",
    "determine_resync_period",
]


TIME_SLICE = 0.002
"""Seconds a loop that works through a backlog (a listener's buffer, the informer's queue) may keep
the event loop before it yields once: bounds the latency it adds to every other task."""

BATCH_LIMIT = 256
"""The most notifications a listener hands a batch handler in one call. Within it the batch is sized
so that one call takes about a :data:`TIME_SLICE` (measured on the previous batches), so the other
tasks get their turn as often as with one notification per call."""

_BATCH_FLOOR = 16
"""The smallest batch the sizing goes down to: a call that waited for its sink's room says little
about what one notification costs."""

CATCH_UP_TURNS = 4
"""Turns of the event loop in a row without a finished handler call after which a listener with a
full buffer is taken to be behind (its overflow spills); see :meth:`ProcessorListener.add`."""

CATCH_UP_BYTES = 32 << 20
"""The most a listener catching up lets wait upstream of it (the JSON bytes of the changes in its
informer's queue) before its overflow spills; see :meth:`ProcessorListener.add`."""

log = logging.getLogger(__name__)

MINIMUM_RESYNC_PERIOD = 1.0
"""Seconds; a per-listener resync period below this is raised to it (client-go's minimum)."""


def determine_resync_period(desired: float, check_period: float) -> float:
    """The resync period a listener really gets, given the informer's resync check period.

    client-go's ``determineResyncPeriod``: 0 stays 0 (never); a zero check period disables every
    listener's resync (the informer never checks); a period below the check period is raised to it.
    """
    if desired <= 0:
        return 0.0
    if check_period <= 0:
        return 0.0
    return max(desired, check_period)


@dataclass(frozen=True, slots=True)
class ListenerStats:
    """A point-in-time copy of a listener's counters."""

    name: str
    received: int
    """Notifications handed to the listener (replayed initial adds included)."""
    delivered: int
    """Handler calls that returned without raising."""
    acked: int
    """Tracked notifications acknowledged (delivered, failed, superseded or dropped)."""
    dropped: int
    coalesced: int
    handler_errors: int
    high_water: int
    """Largest buffer depth seen."""
    depth: int
    """Notifications waiting now (buffer, remaining replay, spill and degraded states, and those of a
    batch in the handler's call after its first)."""
    spilled: int = 0
    """Notifications written to the spill."""
    spill_depth: int = 0
    spill_bytes: int = 0
    degraded: int = 0
    """Notifications kept only as the latest state of their object (spill full or absent)."""
    gaps: int = 0
    """Gap windows this listener opened because it degraded."""


class _Slot:
    """A buffer cell; coalescing swaps the notification in place so the key keeps its position."""

    __slots__ = ("notification",)

    def __init__(self, notification: Notification) -> None:
        self.notification = notification


def _merge(pending: Notification, new: Notification) -> Notification | None:
    """The single notification equivalent to ``pending`` followed by ``new`` (same key), or None.

    add+update → add(new), update+update → update(first old, last new), add/update+delete → delete.
    Anything else (a delete followed by a re-creation, …) cannot be merged without losing a step.
    """
    if new.kind is NotificationKind.UPDATE:
        if pending.kind is NotificationKind.ADD:
            return Notification(
                kind=NotificationKind.ADD,
                obj=new.obj,
                is_in_initial_list=pending.is_in_initial_list,
                seq=new.seq,
                key=new.key,
                time=new.time,
            )
        if pending.kind is NotificationKind.UPDATE:
            return Notification(
                kind=NotificationKind.UPDATE,
                obj=new.obj,
                old=pending.old,
                is_resync=pending.is_resync and new.is_resync,
                seq=new.seq,
                key=new.key,
                time=new.time,
            )
        return None
    mergeable = (NotificationKind.ADD, NotificationKind.UPDATE)
    if new.kind is NotificationKind.DELETE and pending.kind in mergeable:
        return new
    return None


_BatchHandle = Callable[[Sequence[Notification], Sequence[AckFunc]], Awaitable[None]]

_MARKERS = frozenset({NotificationKind.SNAPSHOT, NotificationKind.GAP})
"""Notifications that are never dropped nor coalesced."""


def _is_initial_add(n: Notification) -> bool:
    return n.kind is NotificationKind.ADD and n.is_in_initial_list


class ProcessorListener:
    """One handler's bounded buffer and the worker task that feeds it (client-go's processorListener).

    Created by the informer (``SharedIndexInformer.add_event_handler``); :meth:`add` is awaited by the
    processor, the worker is started by :meth:`start`.
    """

    def __init__(
        self,
        *,
        handler: EventHandler | NotificationHandler,
        options: ListenerOptions,
        clock: Clock,
        name: str,
        resync_period: float = 0.0,
        observer: DeliveryObserver | None = None,
        upstream_synced: Callable[[], bool] = lambda: True,
        may_catch_up: Callable[[ProcessorListener], bool] = lambda _listener: True,
        replay: Sequence[KubeObject] = (),
    ) -> None:
        if options.buffer_capacity < 1:
            raise ValueError(
                f"listener {name!r}: buffer_capacity must be >= 1, got {options.buffer_capacity}"
            )
        self.name = name
        self.options = options
        self._handler = handler
        # Decided once: a runtime-checkable Protocol isinstance check is far too slow per call.
        self._notification_handler: NotificationHandler | None = None
        self._event_handler: EventHandler | None = None
        if isinstance(handler, NotificationHandler):
            self._notification_handler = handler
        else:
            self._event_handler = handler
        # Looked up on the type: a wrapper forwarding unknown attributes to what it wraps must not
        # have its own ``handle`` bypassed.
        self._batch_handler: _BatchHandle | None = None
        if self._notification_handler is not None and callable(getattr(type(handler), "handle_batch", None)):
            self._batch_handler = handler.handle_batch  # type: ignore[union-attr]
        self._batch_limit = _BATCH_FLOOR
        self._clock = clock
        self._observer = observer
        self._upstream_synced = upstream_synced
        self._may_catch_up = may_catch_up
        self.requested_resync_period = options.resync_period
        self.resync_period = resync_period
        self.next_resync = 0.0
        self.determine_next_resync(clock.now())

        self._buffer: deque[_Slot] = deque()
        self._pending_by_key: dict[ObjectKey, _Slot] = {}
        self._replay: deque[KubeObject] = deque(replay)
        self._initial_pending = len(self._replay)
        self._spill: NotificationSpill | None = options.spill
        self._spilled = 0
        # Degraded backlog, oldest first: markers as they are, other changes as the latest state per
        # key (a list per key holds the steps that cannot merge, e.g. a delete then a re-creation).
        self._overflow: deque[Notification | dict[ObjectKey, list[Notification]]] = deque()
        self._overflow_count = 0
        self._degraded = 0
        self._gaps = 0
        self._in_gap: Gap | None = None
        self._last_delivered: Notification | None = None
        self._has_items = asyncio.Event()
        self._has_room = asyncio.Event()
        self._idle = asyncio.Event()
        self._busy = False
        self._in_hand = 0
        """Notifications of the batch in the handler's call, its first excepted: they count as
        waiting until the call returns (as the ones after a single call's do in the buffer)."""
        self._closed = False
        self._task: asyncio.Task[None] | None = None

        self._received = len(self._replay)
        self._delivered = 0
        self._acked = 0
        self._dropped = 0
        self._coalesced = 0
        self._handler_errors = 0
        self._high_water = 0
        self._handled = 0
        """Handler calls finished (whatever their outcome) and notifications of a batch acknowledged:
        the worker's progress."""
        if self._replay:
            self._has_items.set()

    # ---------------------------------------------------------------------------------------------
    # resync (client-go: shouldResync / determineNextResync / setResyncPeriod)

    def should_resync(self, now: float) -> bool:
        """True when this listener's resync is due (never when its period is 0)."""
        if self.resync_period == 0:
            return False
        return now >= self.next_resync

    def determine_next_resync(self, now: float) -> None:
        self.next_resync = now + self.resync_period

    def set_resync_period(self, period: float) -> None:
        self.resync_period = period

    # ---------------------------------------------------------------------------------------------
    # state

    @property
    def depth(self) -> int:
        spilled = len(self._spill) if self._spill is not None else 0
        return len(self._buffer) + len(self._replay) + spilled + self._overflow_count + self._in_hand

    @property
    def spill(self) -> NotificationSpill | None:
        return self._spill

    @property
    def degraded(self) -> bool:
        """True while changes wait as latest states only (they will arrive inside a gap window)."""
        return bool(self._overflow) or self._in_gap is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def has_synced(self) -> bool:
        """True once the informer has synced and this listener handled every initial-list add."""
        return self._initial_pending == 0 and self._upstream_synced()

    def stats(self) -> ListenerStats:
        return ListenerStats(
            name=self.name,
            received=self._received,
            delivered=self._delivered,
            acked=self._acked,
            dropped=self._dropped,
            coalesced=self._coalesced,
            handler_errors=self._handler_errors,
            high_water=self._high_water,
            depth=self.depth,
            spilled=self._spilled,
            spill_depth=len(self._spill) if self._spill is not None else 0,
            spill_bytes=self._spill.size_bytes if self._spill is not None else 0,
            degraded=self._degraded,
            gaps=self._gaps,
        )

    # ---------------------------------------------------------------------------------------------
    # intake

    async def add(self, notification: Notification) -> None:
        """Queues a notification, applying the overflow policy when the buffer is full.

        Never waits, except under BLOCK (which waits for room). Returns without queueing once the
        listener is closed.

        Under the other policies a full buffer of a listener with a spill first gets turns of the
        event loop, one at a time, as long as the worker keeps finishing handler calls or
        acknowledging the notifications of its batch (at most :data:`CATCH_UP_TURNS` turns in a row
        without either): a listener that is draining — a burst,
        a sink a little slower than the watch for a moment — catches up in memory instead of
        writing the overflow to its spill and reading it back; one whose handler is stuck or slow
        (a sink that is down) costs its siblings those few turns once, then the overflow spills and
        what follows goes after it without any turn. ``may_catch_up`` (asked before every turn)
        lets the owner end them: the informer allows them only while each of its other listeners
        has work of its own (holding the informer then costs none of them anything: a burst that
        outruns every sink) and while less than :data:`CATCH_UP_BYTES` of changes wait in its
        queue; one sink slower than the others spills, and its siblings keep their pace. A
        listener without a spill degrades at once, as before (holding the informer first only
        delayed that: measured, a sustained overload then delivered less).
        """
        if self._closed:
            return
        self._received += 1
        policy = self.options.overflow_policy
        buffer = self._buffer
        capacity = self.options.buffer_capacity
        if policy is OverflowPolicy.BLOCK:
            while len(buffer) >= capacity:
                self._has_room.clear()
                await self._has_room.wait()
                if self._closed:
                    return
            self._push(notification)
            return
        spill = self._spill
        if len(buffer) < capacity and not self._overflow and (spill is None or not len(spill)):
            self._push(notification)  # what offer() does when there is room
            return
        if len(buffer) >= capacity and spill is not None and not self._overflow and self._task is not None:
            idle_turns = 0
            # One turn of the loop at a time, while the worker keeps finishing handler calls; a
            # few turns without any and the overflow goes to the spill as it would have at once.
            while (len(buffer) >= capacity and idle_turns < CATCH_UP_TURNS
                   and not len(spill) and self._may_catch_up(self)):
                handled = self._handled
                await asyncio.sleep(0)
                if self._closed:
                    return
                idle_turns = 0 if self._handled != handled else idle_turns + 1
        self.offer(notification)

    def put_nowait(self, n: Notification) -> bool:
        """What :meth:`add` does when ``n`` fits in the buffer now (nothing spilled or degraded
        before it), without a coroutine; False when it does not: then ``add`` decides (it may
        wait)."""
        if self._closed:
            return True  # add returns without queueing
        if len(self._buffer) < self.options.buffer_capacity and not self._overflow:
            spill = self._spill
            if spill is None or not len(spill):
                self._received += 1
                self._push(n)
                return True
        return False

    def offer(self, n: Notification) -> None:
        """Queues a notification without ever waiting (every policy but BLOCK; see the module docs)."""
        if self._closed:
            return
        if self._overflow:  # degraded: everything waits behind the states already kept
            self._degrade(n)
            return
        spill = self._spill
        if spill is not None and len(spill):  # spilling: the rest follows it, in order
            self._to_spill(n)
            return
        if len(self._buffer) < self.options.buffer_capacity or n.kind in _MARKERS:
            self._push(n)
            return
        policy = self.options.overflow_policy
        if policy is OverflowPolicy.DROP:
            self._dropped += 1
            self._ack(n)
            return
        if policy is OverflowPolicy.COALESCE and self._coalesce(n):
            return
        self._to_spill(n)

    def _to_spill(self, n: Notification) -> None:
        spill = self._spill
        if spill is not None:
            try:
                written = spill.append(n)
            except OSError as exc:
                log.error("listener %s: the spill cannot be written (%s); keeping the latest state "
                          "per object instead", self.name, exc)
                written = False
            if written:
                self._spilled += 1
                if _is_initial_add(n):
                    self._initial_pending += 1
                self._idle.clear()
                self._has_items.set()
                return
        self._degrade(n)

    def _degrade(self, n: Notification) -> None:
        """Keeps ``n`` as the latest state of its object (merged into the pending one if it can)."""
        if not self._overflow and self._in_gap is None:
            spill = self._spill
            log.warning("listener %s: %s; keeping the latest state per object, to be delivered inside "
                        "a gap window", self.name,
                        f"the spill is full ({spill.size_bytes} bytes)" if spill is not None
                        else "its buffer is full and it has no spill")
        self._degraded += 1
        self._idle.clear()
        self._has_items.set()
        if n.kind in _MARKERS:
            self._overflow.append(n)
            self._overflow_count += 1
            return
        last = self._overflow[-1] if self._overflow else None
        if not isinstance(last, dict):
            last = {}
            self._overflow.append(last)
        key = n.key or ObjectKey(f"\0{id(n)}")
        steps = last.setdefault(key, [])
        if steps:
            pending = steps[-1]
            merged = _merge(pending, n)
            if merged is not None:
                steps[-1] = merged
                if _is_initial_add(pending) and not _is_initial_add(merged):
                    self._initial_pending -= 1
                self._coalesced += 1
                self._ack(pending)
                return
        steps.append(n)
        self._overflow_count += 1
        if _is_initial_add(n):
            self._initial_pending += 1

    def _push(self, notification: Notification) -> None:
        slot = _Slot(notification)
        self._buffer.append(slot)
        if notification.kind is NotificationKind.GAP:
            # Nothing after a gap marker coalesces into a notification before it (or the other way).
            self._pending_by_key.clear()
        elif notification.kind is not NotificationKind.SNAPSHOT and notification.key:
            self._pending_by_key[notification.key] = slot
        if notification.kind is NotificationKind.ADD and notification.is_in_initial_list:
            self._initial_pending += 1
        spill = self._spill
        depth = (len(self._buffer) + len(self._replay) + (len(spill) if spill is not None else 0)
                 + self._overflow_count + self._in_hand)  # self.depth, without the property's call
        self._high_water = max(self._high_water, depth)
        self._idle.clear()
        self._has_items.set()

    def _coalesce(self, notification: Notification) -> bool:
        slot = self._pending_by_key.get(notification.key) if notification.key else None
        if slot is None:
            return False
        pending = slot.notification
        merged = _merge(pending, notification)
        if merged is None:
            return False
        slot.notification = merged
        if _is_initial_add(pending) and not _is_initial_add(merged):
            self._initial_pending -= 1
        self._coalesced += 1
        self._ack(pending)
        return True

    # ---------------------------------------------------------------------------------------------
    # worker

    def start(self, task_prefix: str = "listener") -> None:
        """Starts the worker task (idempotent)."""
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name=f"{task_prefix}:{self.name}")

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def _run(self) -> None:
        try:
            await self._drain_forever()
        except asyncio.CancelledError:
            raise
        except Exception:
            # Handler errors are caught per call; this is a bug in the listener itself. Closing
            # releases a producer waiting for room instead of stalling the whole informer.
            log.exception("worker failed; closing the listener", extra={"listener": self.name})
            self.close()

    async def _drain_forever(self) -> None:
        loop = asyncio.get_running_loop()
        slice_end = loop.time() + TIME_SLICE
        batched = self._batch_handler is not None
        while True:
            if loop.time() >= slice_end:
                # A long buffer is delivered without ever waiting: let the other tasks in (the
                # watch reader, the sinks' senders and acks) so that none waits for the whole drain.
                await asyncio.sleep(0)
                slice_end = loop.time() + TIME_SLICE
            if self._replay:
                if batched and len(self._replay) > 1:
                    replay = self._replay
                    await self._run_batch(loop, [
                        Notification(kind=NotificationKind.ADD, obj=replay.popleft(), is_in_initial_list=True,
                                     seq=-1)
                        for _ in range(min(len(replay), self._batch_limit))])
                    continue
                obj = self._replay.popleft()
                await self._deliver(
                    Notification(kind=NotificationKind.ADD, obj=obj, is_in_initial_list=True, seq=-1)
                )
                continue
            if not self._buffer:
                if self._refill():
                    continue
                if self._overflow:
                    await self._drain_overflow()
                    continue
                if self._in_gap is not None:
                    await self._close_gap()
                    continue
                self._has_items.clear()
                self._idle.set()
                await self._has_items.wait()
                continue
            if batched and len(self._buffer) > 1:
                await self._run_batch(loop, self._pop_batch())
                continue
            slot = self._buffer.popleft()
            n = slot.notification
            if n.key and self._pending_by_key.get(n.key) is slot:
                del self._pending_by_key[n.key]
            self._has_room.set()
            await self._deliver(n)

    def _pop_batch(self) -> list[Notification]:
        """Takes what the buffer holds, oldest first, up to the batch size; each leaves the
        coalescing index as a single pop does (nothing coalesces into a notification handed out)."""
        buffer = self._buffer
        pending = self._pending_by_key
        batch: list[Notification] = []
        for _ in range(min(len(buffer), self._batch_limit)):
            slot = buffer.popleft()
            n = slot.notification
            if n.key and pending.get(n.key) is slot:
                del pending[n.key]
            batch.append(n)
        self._has_room.set()
        return batch

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[Notification]) -> None:
        """Delivers ``batch`` and sizes the next one to take about a time slice."""
        started = loop.time()
        await self._deliver_batch(batch)
        elapsed = loop.time() - started
        fits = int(len(batch) * TIME_SLICE / elapsed) if elapsed > 0 else BATCH_LIMIT
        self._batch_limit = min(BATCH_LIMIT, max(_BATCH_FLOOR, fits))

    def _refill(self) -> bool:
        """Moves the oldest spilled notifications into the empty buffer; True if any."""
        spill = self._spill
        if spill is None or not len(spill):
            return False
        try:
            batch = spill.read(max(1, self.options.buffer_capacity))
        except OSError as exc:
            log.error("listener %s: the spill cannot be read (%s); its %d notifications are lost",
                      self.name, exc, len(spill))
            spill.clear()
            return False
        for n in batch:
            slot = _Slot(n)
            self._buffer.append(slot)
            if n.kind is NotificationKind.GAP:
                self._pending_by_key.clear()
            elif n.kind is not NotificationKind.SNAPSHOT and n.key:
                self._pending_by_key[n.key] = slot
        return bool(batch)

    async def _drain_overflow(self) -> None:
        """Delivers the oldest degraded entry, opening this listener's gap window first."""
        if self._in_gap is None:
            self._gaps += 1
            self._in_gap = Gap(id=f"overflow:{self.name}:{uuid.uuid4().hex[:12]}",
                               from_resource_version=self._last_resource_version())
            await self._deliver(Notification(kind=NotificationKind.GAP, obj={}, gap=self._in_gap))
        entry = self._overflow.popleft()
        if isinstance(entry, Notification):
            self._overflow_count -= 1
            await self._deliver(entry)
            return
        for steps in entry.values():
            for n in steps:
                self._overflow_count -= 1
                await self._deliver(n)

    async def _close_gap(self) -> None:
        gap = self._in_gap
        assert gap is not None
        self._in_gap = None
        await self._deliver(Notification(kind=NotificationKind.GAP, obj={}, gap=Gap(
            id=gap.id, from_resource_version=gap.from_resource_version,
            to_resource_version=self._last_resource_version(), end=True)))
        log.info("listener %s: caught up; the gap window %s is closed", self.name, gap.id)

    def _last_resource_version(self) -> str:
        """The resourceVersion of the last change delivered ("" if none)."""
        n = self._last_delivered
        if n is None or n.kind in _MARKERS:
            return ""
        obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
        return object_identity(obj)[1]

    async def _deliver(self, n: Notification) -> None:
        if n.kind is not NotificationKind.GAP:
            self._last_delivered = n
        self._busy = True
        done = False
        observer = self._observer

        def ack() -> None:
            nonlocal done
            if done:
                return
            done = True
            # What _ack does, inlined: one call less per notification.
            if n.seq < 0 or self._closed:
                return
            self._acked += 1
            if observer is not None:
                observer.acked(self.name, n.seq)

        try:
            if self._notification_handler is not None:
                await self._notification_handler.handle(n, ack)
            else:
                await self._call_event_handler(n)
                ack()
            self._delivered += 1
        except asyncio.CancelledError:
            raise
        except Exception:
            self._handler_errors += 1
            log.exception("handler failed on %s of %r (seq %d); carrying on",
                          n.kind.value, n.key, n.seq, extra={"listener": self.name})
            ack()
        finally:
            self._busy = False
            self._handled += 1
            if _is_initial_add(n):
                self._initial_pending -= 1

    async def _deliver_batch(self, batch: list[Notification]) -> None:
        """Hands ``batch`` to the batch handler, each notification with an ack of its own (called
        once at most, as :meth:`_deliver`'s); the bookkeeping is :meth:`_deliver`'s, per notification."""
        handle_batch = self._batch_handler
        assert handle_batch is not None
        for n in reversed(batch):
            if n.kind is not NotificationKind.GAP:
                self._last_delivered = n
                break
        self._busy = True
        observer = self._observer
        name = self.name
        done = [False] * len(batch)
        acks: list[AckFunc] = []
        for i, n in enumerate(batch):
            # Defaults bind this notification's values; one closure per notification, no frame.
            def ack(i: int = i, seq: int = n.seq) -> None:
                if done[i]:
                    return
                done[i] = True
                # Progress for the catch-up in add(): a batch may span several turns of the loop.
                self._handled += 1
                if seq < 0 or self._closed:
                    return
                self._acked += 1
                if observer is not None:
                    observer.acked(name, seq)

            acks.append(ack)
        start = 0
        delivered = 0
        try:
            while start < len(batch):
                self._in_hand = len(batch) - start - 1
                try:
                    await handle_batch(batch[start:] if start else batch, acks[start:] if start else acks)
                    delivered += len(batch) - start
                    break
                except asyncio.CancelledError:
                    raise
                except BatchInterrupted as exc:
                    failed = start + exc.index
                    if not start <= failed < len(batch):
                        raise RuntimeError(f"handle_batch reported index {exc.index} of a batch of "
                                           f"{len(batch) - start}") from exc
                    delivered += exc.index
                    self._handler_errors += 1
                    n = batch[failed]
                    log.error("handler failed on %s of %r (seq %d); carrying on", n.kind.value, n.key,
                              n.seq, exc_info=exc.__cause__ or exc, extra={"listener": self.name})
                    acks[failed]()
                    start = failed + 1
        except asyncio.CancelledError:
            raise
        except Exception:
            self._handler_errors += 1
            log.exception("handler failed on a batch of %d notifications (seq %d to %d); carrying on",
                          len(batch) - start, batch[start].seq, batch[-1].seq,
                          extra={"listener": self.name})
            for left in acks[start:]:
                left()
        finally:
            self._busy = False
            self._in_hand = 0
            self._delivered += delivered
            self._handled += len(batch)
            initial = 0
            for n in batch:
                if n.kind is NotificationKind.ADD and n.is_in_initial_list:
                    initial += 1
            self._initial_pending -= initial

    async def _call_event_handler(self, n: Notification) -> None:
        handler = self._event_handler
        assert handler is not None
        if n.kind is NotificationKind.ADD:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            await handler.on_add(n.obj, n.is_in_initial_list)
        elif n.kind is NotificationKind.UPDATE:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            await handler.on_update(n.old if n.old is not None else n.obj, n.obj)
        elif n.kind is NotificationKind.DELETE:
            await handler.on_delete(n.obj)
        elif n.kind is NotificationKind.GAP:
            return  # no counterpart in client-go's handler interface
        else:
            # A snapshot reaches a plain handler as one resync update per object; one object's
            # failure does not hide the others.
            failures = 0
            for obj in n.snapshot or ():
                try:
                    await handler.on_update(obj, obj)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    failures += 1
                    self._handler_errors += 1
                    log.exception("handler failed on snapshot object (seq %d)",
                                  n.seq, extra={"listener": self.name})
            if failures:
                log.warning("%d snapshot objects failed (seq %d)", failures, n.seq,
                            extra={"listener": self.name})

    def _ack(self, n: Notification) -> None:
        if n.seq < 0 or self._closed:
            return
        self._acked += 1
        if self._observer is not None:
            self._observer.acked(self.name, n.seq)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    async def wait_drained(self) -> None:
        """Returns once the buffer and the replay are empty and no handler call is running."""
        while self.depth or self._busy or (self._task is not None and not self._idle.is_set()):
            if self._task is None or self._task.done():
                return
            await self._idle.wait()

    def close(self) -> None:
        """Stops intake, discards what is pending and cancels the worker (idempotent, sync)."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        self._pending_by_key.clear()
        self._overflow.clear()
        self._overflow_count = 0
        if self._spill is not None:
            try:
                self._spill.clear()
            except OSError:
                log.exception("listener %s: removing its spill failed", self.name)
        self._replay.clear()
        self._has_room.set()
        self._has_items.set()
        self._idle.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()


class SharedProcessor:
    """Distributes each notification to its listeners, numbering and reporting it (sharedProcessor).

    All methods run on the event loop; ``distribute`` is awaited by one producer at a time (the
    informer serialises its pop loop and its snapshot emission).
    """

    def __init__(self, *, clock: Clock, observer: DeliveryObserver | None = None, name: str = "") -> None:
        self._clock = clock
        self._observer = observer
        self.name = name
        self._listeners: dict[ProcessorListener, bool] = {}
        """listener → is it among the listeners due for the resync in progress."""
        self._everyone: list[ProcessorListener] = []
        self._everyone_names: list[str] = []
        """Every listener and its name, replaced (never changed in place) when one comes or goes:
        a change goes to all of them, and a list handed out stays as it was."""
        self._retired: set[asyncio.Task[None]] = set()
        self._next_seq = 0
        self._started = False
        self._accepting = True
        self._stopped = asyncio.Event()

    @property
    def listeners(self) -> list[ProcessorListener]:
        return list(self._listeners)

    @property
    def observer(self) -> DeliveryObserver | None:
        return self._observer

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def started(self) -> bool:
        return self._started

    def unique_name(self, wanted: str) -> str:
        """``wanted``, or ``wanted#2``, ``wanted#3``… when a live listener already uses it."""
        taken = {listener.name for listener in self._listeners}
        if wanted not in taken:
            return wanted
        i = 2
        while f"{wanted}#{i}" in taken:
            i += 1
        return f"{wanted}#{i}"

    def add_listener(self, listener: ProcessorListener) -> None:
        if listener in self._listeners:
            return
        self._listeners[listener] = False
        self._everyone_changed()
        if self._started:
            listener.start(self._task_prefix)

    def remove_listener(self, listener: ProcessorListener) -> None:
        """Removes and closes the listener, discarding what it had pending. Idempotent."""
        if listener not in self._listeners:
            return
        del self._listeners[listener]
        self._everyone_changed()
        listener.close()
        if listener.task is not None:
            self._retired.add(listener.task)
            listener.task.add_done_callback(self._retired.discard)
        if self._observer is not None:
            self._observer.listener_removed(listener.name)

    def _everyone_changed(self) -> None:
        self._everyone = list(self._listeners)
        self._everyone_names = [listener.name for listener in self._everyone]

    # ---------------------------------------------------------------------------------------------
    # distribution

    async def distribute(self, notification: Notification, sync: bool) -> None:
        """Numbers the notification and hands it to every listener (only the due ones for a resync).

        A resync notification that no listener is due for is not numbered nor reported.
        """
        # Who receives it is decided before the first await, so a listener added while this call
        # waits for a full buffer does not get a change its replayed cache already contains.
        if sync:
            targets = [listener for listener, syncing in self._listeners.items() if syncing]
            if not targets:
                return
        else:
            targets = self._everyone
        await self.send(notification, targets)

    async def send(self, notification: Notification, targets: Sequence[ProcessorListener]) -> None:
        """Numbers the notification and hands it to exactly ``targets`` (used for snapshots)."""
        if not self._accepting:
            return
        notification.seq = self._next_seq
        self._next_seq += 1
        if not notification.time:
            notification.time = self._clock.wall()
        if self._observer is not None:
            names = (self._everyone_names if targets is self._everyone
                     else [listener.name for listener in targets])
            self._observer.dispatched(notification, names)
        for listener in targets:
            if not listener.put_nowait(notification):  # the common case: no coroutine per listener
                await listener.add(notification)

    def others_have_work(self, listener: ProcessorListener) -> bool:
        """True when every listener but ``listener`` has notifications waiting (none of them would
        be kept idle by the informer waiting a loop turn for ``listener``)."""
        return all(other is listener or other.depth for other in self._listeners)

    def progress(self, resource_version: str) -> None:
        """Reports that every notification numbered so far reflects changes up to this RV."""
        if self._observer is not None:
            self._observer.progress(self._next_seq, resource_version)

    # ---------------------------------------------------------------------------------------------
    # resync

    def should_resync(self) -> bool:
        """Marks the listeners whose resync is due (they receive the coming resync notifications)
        and schedules their next one; True if any is due."""
        now = self._clock.now()
        needed = False
        for listener in self._listeners:
            due = listener.should_resync(now)
            self._listeners[listener] = due
            if due:
                needed = True
                listener.determine_next_resync(now)
        return needed

    def resync_check_period_changed(self, check_period: float) -> None:
        for listener in self._listeners:
            period = determine_resync_period(listener.requested_resync_period, check_period)
            listener.set_resync_period(period)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    @property
    def _task_prefix(self) -> str:
        return f"listener:{self.name}" if self.name else "listener"

    def start(self) -> None:
        """Starts every listener's worker; listeners added later start at once. Idempotent."""
        self._started = True
        for listener in self._listeners:
            listener.start(self._task_prefix)

    async def run(self) -> None:
        """Starts the listeners and waits until :meth:`shutdown` (or cancellation) ends them."""
        self.start()
        try:
            await self._stopped.wait()
        finally:
            if not self._stopped.is_set():
                await self._cancel_all()

    async def shutdown(self, timeout: float) -> None:
        """Stops intake, lets the listeners drain for up to ``timeout`` seconds, then cancels them.

        Idempotent; returns at once when the processor has already stopped."""
        self._accepting = False
        if self._stopped.is_set():
            return
        drains = [listener.wait_drained() for listener in self._listeners]
        if drains:
            try:
                async with asyncio.timeout(max(0.0, timeout)):
                    await asyncio.gather(*drains)
            except TimeoutError:
                log.warning("listeners did not drain within %.1fs; cancelling",
                            timeout, extra={"informer": self.name})
        await self._cancel_all()

    async def _cancel_all(self) -> None:
        tasks = [t for t in (listener.task for listener in self._listeners) if t is not None]
        tasks.extend(self._retired)
        for listener in self._listeners:
            listener.close()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._retired.clear()
        self._accepting = False
        self._stopped.set()
