"""One handler's buffer and the worker that feeds it: client-go's ``processorListener``.

Each listener owns a **bounded** buffer (:class:`~bridge.informer.listener_buffer.ListenerBuffer`, its
base class: memory, then spill, then latest states inside a gap window of its own, the buffer's mode an
explicit state machine) and a worker task that drains it in order, so a slow handler delays only
itself, never the informer or its siblings.

The worker has one delivery path: it takes a batch of what is ready (replayed initial adds, memory,
the spill read back, the latest states and their gap markers) and hands it over in one call. A batch
handler gets up to :data:`BATCH_LIMIT` at once; every other handler gets batches of one. A batch of
one reaches even a batch handler through ``handle``. How a batch becomes the handler's call and its
acknowledgements: :mod:`bridge.informer.handler_call`; each acknowledgement counts once, and one of a
notification handed over inside an overflow window waits for the whole window (module docs of
:mod:`~bridge.informer.listener_buffer`).

Closing a listener (its handler removed) stops intake and discards what is pending at once; a handler
call in progress is not interrupted, as client-go's ``RemoveEventHandler`` lets it finish, and its
acknowledgements no longer count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.contracts import (
    DeliveryObserver,
    EventHandler,
    KubeObject,
    ListenerOptions,
    Notification,
    NotificationHandler,
    NotificationKind,
)
from bridge.informer.buffer_mode import BufferEvent, BufferMode
from bridge.informer.eager import run_eagerly
from bridge.informer.handler_call import HandlerCall
from bridge.informer.listener_buffer import CATCH_UP_BYTES, CATCH_UP_TURNS, ListenerBuffer

__all__ = [
    "BATCH_LIMIT",
    "CATCH_UP_BYTES",
    "CATCH_UP_TURNS",
    "TIME_SLICE",
    "ListenerStats",
    "ProcessorListener",
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

log = logging.getLogger(__name__)

_CLOSED = BufferMode.CLOSED
_NORMAL = BufferMode.NORMAL


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


class ProcessorListener(ListenerBuffer):
    """One handler's bounded buffer and the worker task that feeds it (client-go's processorListener).

    Created by the informer (``SharedIndexInformer.add_event_handler``); :meth:`add` is awaited by the
    processor (one producer at a time), the worker is started by :meth:`start`.
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
        request_snapshot: Callable[[ProcessorListener], None] | None = None,
    ) -> None:
        """``request_snapshot``: asks the informer for a ``SNAPSHOT`` for this listener (when its
        spill lost notifications it had taken: see :meth:`_spill_lost`)."""
        super().__init__(name=name, options=options, observer=observer, may_catch_up=may_catch_up,
                         replay=replay, request_snapshot=request_snapshot)
        self._call = HandlerCall(handler=handler, acked=self._acked_at, name=name)
        self.snapshots_pending = 0
        """``SNAPSHOT`` notifications handed to this listener and not yet through its handler (the
        informer coalesces a request for a listener with one pending)."""
        self._batch_limit = _BATCH_FLOOR if self._call.takes_batches else 1  # others: batches of one
        self._clock = clock
        self._loop_time: Callable[[], float] = time.monotonic  # the loop's clock, once started
        self._carried: asyncio.Task[None] | None = None
        """A call of the informer's fast path that waited, carrying on in a task of its own."""
        self._upstream_synced = upstream_synced
        self.requested_resync_period = options.resync_period
        self.resync_period = resync_period
        self.next_resync = 0.0
        self.determine_next_resync(clock.now())

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

    def has_synced(self) -> bool:
        """True once the informer has synced and this listener handled every initial-list add."""
        return self._initial_pending == 0 and self._upstream_synced()

    def stats(self) -> ListenerStats:
        return ListenerStats(
            name=self.name,
            received=self._received,
            delivered=self._call.delivered,
            acked=self._acked,
            dropped=self._dropped,
            coalesced=self._coalesced,
            handler_errors=self._call.errors,
            high_water=self._high_water,
            depth=self.depth,
            spilled=self._spilled,
            spill_depth=len(self._spill) if self._spill is not None else 0,
            spill_bytes=self._spill.size_bytes if self._spill is not None else 0,
            degraded=self._degraded,
            gaps=self._gaps,
        )

    # ---------------------------------------------------------------------------------------------
    # worker: take what is ready, hand it over

    def start(self, task_prefix: str = "listener") -> None:
        """Starts the worker task (idempotent)."""
        if self._task is None and self._mode is not _CLOSED:
            self._loop_time = asyncio.get_running_loop().time
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
        while True:
            if loop.time() >= slice_end:
                # A long backlog is delivered without ever waiting: let the other tasks in (the
                # watch reader, the sinks' senders and acks) so that none waits for the whole drain.
                await asyncio.sleep(0)
                slice_end = loop.time() + TIME_SLICE
            if self._carried is not None:  # a call of the fast path that waited: it ends first
                await asyncio.wait((self._carried,))
            batch = self._take(self._batch_limit)
            if batch:
                await self._deliver(batch)
                continue
            if self._mode is _CLOSED:
                return
            self._has_items.clear()
            self._idle.set()
            self._woken = False
            await self._has_items.wait()

    async def _deliver(self, batch: list[Notification]) -> None:
        """Hands ``batch`` to the handler, with the listener's bookkeeping around the call: the
        worker's path and the informer's fast path (:meth:`deliver_deferred`) alike."""
        loop_time = self._loop_time
        started = loop_time()
        for n in reversed(batch):
            if n.kind is not NotificationKind.GAP:
                self._last_delivered = n
                break
        try:
            await self._call.deliver(batch)
        finally:
            self._handled += len(batch)
            for n in batch:
                if n.kind is NotificationKind.ADD and n.is_in_initial_list:
                    self._initial_pending -= 1
                elif n.kind is NotificationKind.SNAPSHOT and self.snapshots_pending:
                    self.snapshots_pending -= 1
        if len(batch) > 1:  # a batch handler's: size the next batch to about a time slice
            elapsed = loop_time() - started
            fits = int(len(batch) * TIME_SLICE / elapsed) if elapsed > 0 else BATCH_LIMIT
            self._batch_limit = min(BATCH_LIMIT, max(_BATCH_FLOOR, fits))

    # ---------------------------------------------------------------------------------------------
    # the informer's fast path: an idle listener's batch handed over in the informer's task

    def defer(self) -> None:
        """The informer starts a run of its queue. When this listener is idle (its worker parked,
        nothing waiting, no call under way) and its handler can tell when it would not wait, what
        the run brings it waits for :meth:`deliver_deferred` instead of waking the worker."""
        if (not self._woken and self._mode is _NORMAL and self._carried is None and self._task is not None
                and not self._call.busy and self._idle.is_set()):
            self._deferred = True

    def deliver_deferred(self) -> None:
        """The informer's run ended (or is about to wait): what it brought this deferred listener
        is handed to the handler right here when the handler says it would not wait (one batch, as
        the worker would take it), else the worker is woken and takes it, as without the fast path.
        A call that waits all the same carries on in a task of its own, and the worker lets it end
        before it takes anything (:mod:`bridge.informer.eager`): order is kept, the informer not held."""
        if not self._deferred:
            return
        self._deferred = False
        if not self._woken or self._has_items.is_set():
            return  # nothing came, or the worker was woken all the same: it takes what came
        buffer, ready, slice_end = self._buffer, self._call.ready_for, self._loop_time() + TIME_SLICE
        while (buffer and ready is not None and self._mode is _NORMAL and self._spill_gap is None
               and not self._replay and self._carried is None and self._loop_time() < slice_end):
            limit = self._batch_limit
            if not ready(buffer if len(buffer) <= limit else list(buffer)[:limit]):
                break
            try:
                self._carried = run_eagerly(self._deliver(self._pop_batch(limit)), f"{self.name}:carried")
            except Exception:
                log.exception("handing a batch over failed; closing the listener",
                              extra={"listener": self.name})
                self.close()
                return
            if self._carried is not None:
                self._carried.add_done_callback(self._carried_done)
        if not buffer and self._carried is None and self._mode is _NORMAL:
            self._woken = False  # as the worker left it: parked, nothing waiting
            self._idle.set()
            return
        self._has_items.set()

    def _carried_done(self, task: asyncio.Task[None]) -> None:
        if self._carried is task:
            self._carried = None
        if not task.cancelled() and task.exception() is not None:
            log.error("a handed-over batch failed", exc_info=task.exception(), extra={"listener": self.name})

    @property
    def has_fast_path(self) -> bool:
        """True when the handler can tell when it would not wait (:meth:`defer` may defer)."""
        return self._call.ready_for is not None

    @property
    def carried(self) -> asyncio.Task[None] | None:
        """The call of the fast path that waited and carries on in a task of its own, if any."""
        return self._carried

    def _acked_at(self, batch: Sequence[Notification], called: bytearray, i: int) -> None:
        """What the ack of ``batch[i]``, handed out, does on its first call (later calls: nothing).
        The per-notification path: the first-call check is written here, not wrapped around it
        (:data:`~bridge.informer.ack.BatchAckFunc`)."""
        if called[i]:
            return
        called[i] = 1
        n = batch[i]
        self._handled += 1  # progress for the catch-up in add(): a batch may span several turns
        if self._in_window and (entry := self._in_window.pop(id(n), None)) is not None:
            self._window_acked(n, entry[1])
            return
        seq = n.seq
        if seq < 0 or self._mode is _CLOSED:
            return
        self._acked += 1
        observer = self._observer
        if observer is not None:
            observer.acked(self.name, seq)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    async def wait_drained(self) -> None:
        """Returns once nothing waits and no handler call is running (at once once closed)."""
        while self.depth or self._call.busy or (self._task is not None and not self._idle.is_set()):
            if self._task is None or self._task.done() or self._mode is _CLOSED:
                return
            await self._idle.wait()

    def close(self) -> None:
        """Stops intake and discards what is pending (idempotent, sync). A handler call in progress
        is not interrupted: the worker ends once it returns (client-go's ``RemoveEventHandler``);
        the acknowledgements of a closed listener no longer count."""
        if self._mode is _CLOSED:
            return
        self._to(BufferEvent.CLOSED)
        self._deferred = False
        self._buffer.clear()
        self._pending_by_key.clear()
        self._latest.clear()
        self._gap = None
        self._window = None
        self._in_window.clear()
        if self._spill is not None:
            try:
                self._spill.clear()
            except OSError:
                log.exception("listener %s: removing its spill failed", self.name)
        self._replay.clear()
        self._has_room.set()
        self._has_items.set()
        self._idle.set()
        self._woken = False
