"""A listener's buffer: where a notification its handler has not taken waits, and in which order it
comes out (the overflow machinery of :class:`~bridge.informer.listener.ProcessorListener`).

Each listener owns a **bounded** in-memory buffer, so a slow handler delays only itself, never the
informer or its siblings: handing a notification to a listener never waits (except under the opt-in
``BLOCK`` policy, and the few turns of a listener catching up, :meth:`ListenerBuffer.add`). What does
not fit in memory goes, in order, to the listener's spill on disk
(:class:`~bridge.contracts.NotificationSpill`); what the spill cannot take either **degrades**: the
listener keeps the latest state per object (memory bounded by the number of objects) and delivers
those states later inside a gap window of its own (``GAP`` begin, the states, ``GAP`` end), as a
relist would. Which of these applies is the buffer's mode, an explicit state machine
(:mod:`bridge.informer.buffer_mode`); the policy for a full memory is
:class:`~bridge.contracts.OverflowPolicy`.

What comes out (:meth:`ListenerBuffer._take`), oldest first: the replayed initial adds, memory
(refilled from the spill once empty), then — degraded — the gap window: its begin marker, the latest
states, its end marker.

Invariants:

* A notification superseded by the ``coalesce`` policy is acknowledged when it is merged (its
  successor carries the newer state), a dropped one as discarded.
* A degraded listener's gap window is one delivery
  (:class:`~bridge.informer.latest_states.OverflowWindow`): what it coalesced, and what it hands over
  inside the window, is acknowledged only once the handler acknowledged everything of the window, its
  end marker included — acknowledged at the merge, the checkpoint took the sink past changes it never
  received, and a crash before the window reached it lost them without a marker (issue 34). The
  window's ``to`` is the newest change handed over inside it, so it covers every change it coalesced.
* ``SNAPSHOT`` and ``GAP`` notifications are never dropped nor coalesced (queued past the capacity, in
  order); nothing coalesces across a ``GAP`` marker, nor into a notification handed out.
* Spilled notifications the spill lost (a damaged or unreadable file) open a gap window and ask for a
  snapshot, whose passage closes the window.

Memory is a queue of the notifications themselves; under the ``COALESCE`` policy an index by object
key gives each object's newest one by position, so that coalescing (:func:`~bridge.informer.
latest_states.merge`) swaps it in place and the object keeps its place. The per-notification paths
(:meth:`ListenerBuffer.put_nowait`, which appends without a call of its own, and ``_pop_batch``, which
takes memory whole or by a run of pops unless it has something to look at) are plain methods of the
listener (this class is its base); they log to the listener's logger (``bridge.informer.listener``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Self

from bridge.contracts import (
    OVERFLOW_GAP_PREFIX,
    DeletedFinalStateUnknown,
    DeliveryObserver,
    Gap,
    KubeObject,
    ListenerOptions,
    Notification,
    NotificationKind,
    NotificationSpill,
    ObjectKey,
    OverflowPolicy,
)
from bridge.informer.buffer_mode import BufferEvent, BufferMode, next_mode
from bridge.informer.handler_call import HandlerCall
from bridge.informer.latest_states import (
    MARKERS,
    LatestStates,
    OverflowWindow,
    is_initial_add,
    merge,
)
from bridge.rawobject import object_identity

__all__ = ["CATCH_UP_BYTES", "CATCH_UP_TURNS", "ListenerBuffer"]

CATCH_UP_TURNS = 4
"""Turns of the event loop in a row without a finished handler call after which a listener with a
full buffer is taken to be behind (its overflow spills); see :meth:`ListenerBuffer.add`."""

CATCH_UP_BYTES = 32 << 20
"""The most a listener catching up lets wait upstream of it (the JSON bytes of the changes in its
informer's queue) before its overflow spills; see :meth:`ListenerBuffer.add`."""

log = logging.getLogger("bridge.informer.listener")

_NORMAL = BufferMode.NORMAL
_SPILLING = BufferMode.SPILLING
_DEGRADED = BufferMode.DEGRADED
_DRAINING_GAP = BufferMode.DRAINING_GAP
_CLOSED = BufferMode.CLOSED


class ListenerBuffer:
    """The buffer of one listener and its modes (module docs); the base of
    :class:`~bridge.informer.listener.ProcessorListener`, which adds the worker that drains it."""

    _call: HandlerCall
    """The listener's handler call (set by the listener): what of a batch it still holds counts as
    waiting."""

    _deferred = False
    """The informer's fast path: while True, a push does not wake the worker, the informer hands
    what came over itself at the end of its run (``ProcessorListener.deliver_deferred``)."""

    def __init__(
        self,
        *,
        name: str,
        options: ListenerOptions,
        observer: DeliveryObserver | None,
        may_catch_up: Callable[[Self], bool],
        replay: Sequence[KubeObject],
        request_snapshot: Callable[[Self], None] | None,
    ) -> None:
        if options.buffer_capacity < 1:
            raise ValueError(
                f"listener {name!r}: buffer_capacity must be >= 1, got {options.buffer_capacity}"
            )
        self.name = name
        self.options = options
        self._observer = observer
        # ``Self`` in the callbacks' types: they receive the listener itself (the subclass), which
        # is why the methods calling them annotate ``self: Self``.
        self._may_catch_up = may_catch_up
        self._mode = _NORMAL
        self._buffer: deque[Notification] = deque()
        self._coalescing = options.overflow_policy is OverflowPolicy.COALESCE
        self._pending_by_key: dict[ObjectKey, int] = {}  # COALESCE: key → its newest one's position
        self._popped = 0  # the position of _buffer[0]: taken from the front, less put back in front
        self._replay: deque[KubeObject] = deque(replay)
        self._initial_pending = len(self._replay)
        self._spill: NotificationSpill | None = options.spill
        self._latest = LatestStates()
        self._gap: Gap | None = None
        """The gap window open while ``DRAINING_GAP``."""
        self._request_snapshot = request_snapshot
        self._spill_gap: Gap | None = None
        """The gap window opened where the spill lost notifications; the snapshot it requested closes it."""
        self._window: OverflowWindow | None = None
        """While degraded: the window being filled (and handed over), whose acknowledgements wait."""
        self._in_window: dict[int, tuple[Notification, OverflowWindow]] = {}
        """id of a notification handed over inside a window → it and its window, until acknowledged."""
        self._last_delivered: Notification | None = None
        self._has_items = asyncio.Event()
        self._has_room = asyncio.Event()
        self._idle = asyncio.Event()
        self._woken = False
        """True while ``_has_items`` is set and ``_idle`` clear since a push (nothing to tell)."""
        self._task: asyncio.Task[None] | None = None
        """The worker (the listener's): catching up only makes sense while it runs."""

        self._received = len(self._replay)
        self._acked = 0
        self._dropped = 0
        self._coalesced = 0
        self._high_water = 0
        self._spilled = 0
        self._degraded = 0
        self._gaps = 0
        self._handled = 0
        """Handler calls finished (whatever their outcome) and notifications acknowledged: the
        worker's progress, watched while catching up."""
        if self._replay:
            self._has_items.set()

    # ---------------------------------------------------------------------------------------------
    # state

    @property
    def mode(self) -> BufferMode:
        return self._mode

    @property
    def depth(self) -> int:
        spilled = len(self._spill) if self._spill is not None else 0
        return len(self._buffer) + len(self._replay) + spilled + len(self._latest) + self._call.in_hand

    @property
    def spill(self) -> NotificationSpill | None:
        return self._spill

    @property
    def degraded(self) -> bool:
        """True while changes wait as latest states only (they will arrive inside a gap window)."""
        return self._mode is _DEGRADED or self._mode is _DRAINING_GAP

    @property
    def closed(self) -> bool:
        return self._mode is _CLOSED

    def _to(self, event: BufferEvent) -> None:
        """Moves to the mode ``event`` leads to (:data:`~bridge.informer.buffer_mode.TRANSITIONS`)."""
        self._mode = next_mode(self._mode, event)

    # ---------------------------------------------------------------------------------------------
    # intake

    async def add(self, notification: Notification) -> None:
        """Queues a notification; never waits, except under BLOCK (for room) and while catching up.

        A full memory of a listener with a spill first gets turns of the event loop, one at a time
        (``CATCHING_UP``), while the worker keeps finishing calls or acknowledging its batch (at most
        :data:`CATCH_UP_TURNS` turns in a row without either): a listener draining a burst catches
        up in memory instead of writing to its spill and reading it back; a stuck one costs its
        siblings those few turns once, then spills. ``may_catch_up`` (asked before every turn) lets
        the informer end them: it allows them only while each of its other listeners has work of its
        own and less than :data:`CATCH_UP_BYTES` of changes wait in its queue, so one sink slower
        than the others spills alone. Without a spill, a full memory degrades at once (holding the
        informer first only delayed that: measured, a sustained overload then delivered less).
        Returns without queueing once the listener is closed.
        """
        if self._mode is _CLOSED:
            return
        self._received += 1
        buffer = self._buffer
        capacity = self.options.buffer_capacity
        if self.options.overflow_policy is OverflowPolicy.BLOCK:
            while len(buffer) >= capacity:
                self._has_room.clear()
                await self._has_room.wait()
                if self._mode is _CLOSED:
                    return
            self._push(notification)
            return
        if self._mode is _NORMAL:
            if len(buffer) < capacity:
                self._push(notification)
                return
            if self._spill is not None and self._task is not None:
                await self._catch_up()
                if self._mode is _CLOSED:
                    return
        self.offer(notification)

    async def _catch_up(self: Self) -> None:
        """Gives the worker turns of the loop while it keeps finishing calls (see :meth:`add`)."""
        self._to(BufferEvent.FULL_WAIT)
        buffer = self._buffer
        capacity = self.options.buffer_capacity
        idle_turns = 0
        try:
            while len(buffer) >= capacity and idle_turns < CATCH_UP_TURNS and self._may_catch_up(self):
                handled = self._handled
                await asyncio.sleep(0)
                if self._mode is _CLOSED:
                    return
                idle_turns = 0 if self._handled != handled else idle_turns + 1
        finally:
            if self._mode is BufferMode.CATCHING_UP:
                self._to(BufferEvent.WAIT_OVER)

    def put_nowait(self, n: Notification) -> bool:
        """What :meth:`add` does when ``n`` fits in memory now (``NORMAL`` with room), without a
        coroutine; False when it does not: then ``add`` decides (it may wait)."""
        buffer = self._buffer
        size = len(buffer)
        if self._mode is not _NORMAL or size >= self.options.buffer_capacity:
            return self._mode is _CLOSED  # add returns without queueing
        self._received += 1
        # What _push does, written out: this is the per-notification path (a call less per change).
        buffer.append(n)
        if self._coalescing:
            self._index(n)
        if n.kind is NotificationKind.ADD and n.is_in_initial_list:
            self._initial_pending += 1
        replay = self._replay
        depth = size + 1 + (len(replay) if replay else 0) + self._call.in_hand
        if depth > self._high_water:  # noqa: PLR1730 - not max(): one call less per notification
            self._high_water = depth
        if not self._woken:
            self._woken = True
            self._idle.clear()
            if not self._deferred:  # deferred: the informer hands it over itself, at its run's end
                self._has_items.set()
        return True

    def offer(self, n: Notification) -> None:
        """Queues a notification without ever waiting (every policy but BLOCK; see the module docs),
        where the buffer's mode says."""
        mode = self._mode
        if mode is _NORMAL:
            if len(self._buffer) < self.options.buffer_capacity or n.kind in MARKERS:
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
        elif mode is _SPILLING:
            self._to_spill(n)
        elif mode is _DEGRADED or mode is _DRAINING_GAP:
            self._degrade(n)
        elif mode is not _CLOSED:
            raise RuntimeError(f"listener {self.name}: offered a notification while {mode.value}; "
                               "the processor hands a listener one notification at a time")

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
                if self._mode is not _SPILLING:
                    self._to(BufferEvent.SPILLED)
                self._spilled += 1
                if is_initial_add(n):
                    self._initial_pending += 1
                self._idle.clear()
                self._has_items.set()
                return
        self._degrade(n)

    def _degrade(self, n: Notification) -> None:
        """Keeps ``n`` as the latest state of its object (merged into the pending one if it can)."""
        if self._mode is _NORMAL or self._mode is _SPILLING:
            spill = self._spill
            log.warning("listener %s: %s; keeping the latest state per object, to be delivered inside "
                        "a gap window", self.name,
                        f"the spill is full ({spill.size_bytes} bytes)" if spill is not None
                        else "its buffer is full and it has no spill")
            self._to(BufferEvent.DEGRADED)
        window = self._window
        if window is None:
            window = self._window = OverflowWindow()
        self._degraded += 1
        self._idle.clear()
        self._has_items.set()
        merged = self._latest.add(n)
        if merged is None:
            if is_initial_add(n):
                self._initial_pending += 1
            return
        pending, into = merged
        if is_initial_add(pending) and not is_initial_add(into):
            self._initial_pending -= 1
        self._coalesced += 1
        if pending.seq >= 0:
            window.held.append(pending.seq)  # acknowledged with the window (module docs)

    def _push(self, notification: Notification) -> None:
        """Appends ``notification`` to memory (``NORMAL``; :meth:`put_nowait` does the same inline)."""
        self._buffer.append(notification)
        if self._coalescing:
            self._index(notification)
        if notification.kind is NotificationKind.ADD and notification.is_in_initial_list:
            self._initial_pending += 1
        # self.depth without the property's call: memory only takes notifications while NORMAL
        # (the mode BLOCK never leaves), so nothing waits in the spill or as a latest state.
        replay = self._replay
        depth = len(self._buffer) + (len(replay) if replay else 0) + self._call.in_hand
        if depth > self._high_water:  # noqa: PLR1730 - not max(): one call less per notification
            self._high_water = depth
        if not self._woken:  # the worker was told already (two calls less per notification)
            self._woken = True
            self._idle.clear()
            self._has_items.set()

    def _index(self, n: Notification) -> None:
        """Records ``n``, just appended to memory, in the coalescing index (``COALESCE`` only)."""
        if n.kind is NotificationKind.GAP:
            # Nothing after a gap marker coalesces into a notification before it (or the other way).
            self._pending_by_key.clear()
        elif n.kind is not NotificationKind.SNAPSHOT and n.key:
            self._pending_by_key[n.key] = self._popped + len(self._buffer) - 1

    def _coalesce(self, notification: Notification) -> bool:
        position = self._pending_by_key.get(notification.key) if notification.key else None
        if position is None:
            return False
        at = position - self._popped
        pending = self._buffer[at]
        merged = merge(pending, notification)
        if merged is None:
            return False
        self._buffer[at] = merged
        if is_initial_add(pending) and not is_initial_add(merged):
            self._initial_pending -= 1
        self._coalesced += 1
        self._ack(pending)
        return True

    def _ack(self, n: Notification) -> None:
        """Acknowledges a notification that is not handed to the handler (superseded or dropped)."""
        if n.seq < 0 or self._mode is _CLOSED:
            return
        self._acked += 1
        if self._observer is not None:
            self._observer.acked(self.name, n.seq)

    # ---------------------------------------------------------------------------------------------
    # output: what the worker takes next, oldest first

    def _take(self, limit: int) -> list[Notification]:
        """The next batch, oldest first: replayed initial adds, memory (refilled from the spill),
        then — degraded — the gap window: its begin marker, the latest states, its end marker."""
        mode = self._mode
        if mode is _CLOSED:
            return []
        replay = self._replay
        if replay:
            return [Notification(kind=NotificationKind.ADD, obj=replay.popleft(), is_in_initial_list=True,
                                 seq=-1) for _ in range(min(len(replay), limit))]
        if self._buffer or self._refill():
            return self._pop_batch(limit)
        if mode is _DEGRADED:
            self._gaps += 1
            self._gap = Gap(id=f"{OVERFLOW_GAP_PREFIX}{self.name}:{uuid.uuid4().hex[:12]}",
                            from_resource_version=self._last_resource_version())
            self._to(BufferEvent.GAP_OPENED)
            begin = Notification(kind=NotificationKind.GAP, obj={}, gap=self._gap)
            return self._in_the_window([begin, *self._latest.take(limit - 1)])
        if mode is _DRAINING_GAP:
            return self._in_the_window(self._latest.take(limit) or [self._close_gap()])
        return []

    def _in_the_window(self, batch: list[Notification]) -> list[Notification]:
        """Registers ``batch``, handed over inside the open window, with it (:class:`OverflowWindow`)."""
        window = self._window
        assert window is not None
        for n in batch:
            window.hand(n)
            self._in_window[id(n)] = (n, window)
        if self._mode is _NORMAL:  # the batch is the end marker: the window is complete
            window.closed = True
            self._window = None
        return batch

    def _pop_batch(self, limit: int) -> list[Notification]:
        """Takes what the buffer holds, oldest first, up to ``limit``; each leaves the coalescing
        index (nothing coalesces into a notification handed out)."""
        buffer = self._buffer
        if not self._coalescing and self._spill_gap is None:
            # Nothing to look at per notification: taken whole, or by a run of pops.
            if len(buffer) <= limit:
                batch = list(buffer)
                buffer.clear()
            else:
                popleft = buffer.popleft
                batch = [popleft() for _ in range(limit)]
            self._popped += len(batch)
            self._has_room.set()
            return batch
        pending = self._pending_by_key
        batch = []
        for _ in range(min(len(buffer), limit)):
            n = buffer.popleft()
            position = self._popped
            self._popped = position + 1
            if n.key and pending.get(n.key) == position:
                del pending[n.key]
            batch.append(n)
            if n.kind is NotificationKind.SNAPSHOT and self._spill_gap is not None:
                # The window the spill's loss opened ends right after the snapshot it asked for.
                gap, self._spill_gap = self._spill_gap, None
                end = dataclasses.replace(gap, to_resource_version=n.resource_version, end=True)
                buffer.appendleft(Notification(kind=NotificationKind.GAP, obj={}, gap=end))
                self._popped -= 1
                break
        self._has_room.set()
        return batch

    def _refill(self) -> bool:
        """Moves the oldest spilled notifications into the empty buffer; True if any."""
        spill = self._spill
        if spill is None or not len(spill):
            return False
        damaged = spill.corrupt
        try:
            batch = spill.read(max(1, self.options.buffer_capacity))
            lost = spill.corrupt - damaged
        except OSError as exc:
            lost = len(spill)
            log.error("listener %s: the spill cannot be read (%s); its %d notifications are lost",
                      self.name, exc, lost)
            spill.clear()
            batch = []
        if lost:
            batch.append(self._spill_lost(lost))
        for n in batch:
            self._buffer.append(n)
            if self._coalescing:
                self._index(n)
        if not len(spill) and self._mode is _SPILLING:
            self._to(BufferEvent.SPILL_EMPTIED)
        return bool(batch)

    def _spill_lost(self: Self, lost: int) -> Notification:
        """The spill lost ``lost`` notifications (a damaged or unreadable file): which changes they
        held is unknown, so the listener announces it as the delivery contract announces any change
        not observed (a gap window, from the last change delivered) and asks for a snapshot of the
        cache, after which its sink holds every object exactly again; the snapshot's passage closes
        the window (:meth:`_pop_batch`). Returns the window's begin marker."""
        self._gaps += 1
        gap = self._spill_gap = Gap(id=f"spill:{self.name}:{uuid.uuid4().hex[:12]}",
                                    from_resource_version=self._last_resource_version())
        log.error("listener %s: %d spilled notifications are lost; gap window %s opened, and a snapshot "
                  "requested to make the sink exact again", self.name, lost, gap.id)
        if self._request_snapshot is not None:
            self._request_snapshot(self)
        return Notification(kind=NotificationKind.GAP, obj={}, gap=gap)

    def _close_gap(self) -> Notification:
        """The end marker of the open gap window; the listener is ``NORMAL`` again."""
        gap = self._gap
        assert gap is not None
        self._gap = None
        self._to(BufferEvent.GAP_CLOSED)
        log.info("listener %s: caught up; the gap window %s is closed", self.name, gap.id)
        window = self._window
        # Its newest change, not the last handed over: the latest states go out in the order their
        # objects first degraded, so the last may be older than a change coalesced into another.
        top = str(window.top) if window is not None and window.top >= 0 else self._last_resource_version()
        return Notification(kind=NotificationKind.GAP, obj={}, gap=Gap(
            id=gap.id, from_resource_version=gap.from_resource_version,
            to_resource_version=top, end=True))

    def _last_resource_version(self) -> str:
        """The resourceVersion of the last change delivered ("" if none)."""
        n = self._last_delivered
        if n is None or n.kind in MARKERS:
            return ""
        obj = n.obj.obj if isinstance(n.obj, DeletedFinalStateUnknown) else n.obj
        return object_identity(obj)[1]

    def _window_acked(self, n: Notification, window: OverflowWindow) -> None:
        """A notification of an overflow window is acknowledged: once every one of the window is,
        so is everything it held (module docs)."""
        held = window.acked(n)
        if not held or self._mode is _CLOSED:
            return
        self._acked += len(held)
        observer = self._observer
        if observer is not None:
            for seq in held:
                observer.acked(self.name, seq)
