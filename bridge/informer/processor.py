"""The fan-out half of a shared informer: client-go's ``sharedProcessor``.

An informer processes each change once and hands the resulting :class:`~bridge.contracts.Notification`
to every listener (one per handler or sink, :class:`~bridge.informer.listener.ProcessorListener`:
a bounded buffer, its mode as a state machine in :mod:`bridge.informer.buffer_mode`, and a worker).
Handing a notification over never waits for a slow handler (except under the opt-in ``BLOCK``
policy), so one slow sink never holds the informer or its siblings.

The processor also does the bookkeeping the checkpoint needs: it numbers every tracked notification
with a strictly increasing ``seq``, tells the :class:`~bridge.contracts.DeliveryObserver` who got it,
relays each listener's acknowledgement, and forwards the informer's resourceVersion progress markers.

Removing a listener (:meth:`SharedProcessor.remove_listener`) returns at once: what it had pending is
discarded, a handler call in progress finishes (client-go's ``removeListener`` closes the listener's
intake and nothing else).

Timeouts given to :meth:`SharedProcessor.shutdown` are operational deadlines measured on the event
loop's own time, not on the injected clock, so a test driving a ``FakeClock`` cannot hang in them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from bridge.clock import Clock
from bridge.contracts import DeliveryObserver, Notification
from bridge.informer.listener import (
    BATCH_LIMIT,
    CATCH_UP_BYTES,
    CATCH_UP_TURNS,
    TIME_SLICE,
    ListenerStats,
    ProcessorListener,
)

__all__ = [
    "BATCH_LIMIT",
    "CATCH_UP_BYTES",
    "CATCH_UP_TURNS",
    "MINIMUM_RESYNC_PERIOD",
    "TIME_SLICE",
    "ListenerStats",
    "ProcessorListener",
    "SharedProcessor",
    "clamp_resync_period",
    "determine_resync_period",
]

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


def clamp_resync_period(period: float, check_period: float, *, started: bool, listener: str,
                        informer: str) -> tuple[float, float]:
    """A handler's requested resync period as client-go clamps it, and the informer's check period
    after it: below :data:`MINIMUM_RESYNC_PERIOD` it is raised to it; below the check period, before
    start it lowers the check period, after start it is raised to it."""
    if period <= 0:
        return period, check_period
    if period < MINIMUM_RESYNC_PERIOD:
        log.warning("resync period %.3fs of %s raised to the minimum %.1fs",
                    period, listener, MINIMUM_RESYNC_PERIOD, extra={"informer": informer})
        period = MINIMUM_RESYNC_PERIOD
    if period < check_period:
        if not started:
            return period, period
        log.warning("resync period %.3fs of %s raised to the informer's check "
                    "period %.3fs (it has started)", period, listener, check_period,
                    extra={"informer": informer})
        period = check_period
    return period, check_period


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
        self._deferrable: list[ProcessorListener] = []
        """The listeners whose handler can tell when it would not wait (the fast path's)."""
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
        """Removes and closes the listener, discarding what it had pending; returns at once and lets
        a handler call in progress finish (its worker then ends; shutdown cancels it if it has not).
        Idempotent."""
        if listener not in self._listeners:
            return
        del self._listeners[listener]
        self._everyone_changed()
        listener.close()
        for task in (listener.task, listener.carried):
            if task is not None:
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)
        if self._observer is not None:
            self._observer.listener_removed(listener.name)

    def _everyone_changed(self) -> None:
        self._everyone = list(self._listeners)
        self._everyone_names = [listener.name for listener in self._everyone]
        self._deferrable = [listener for listener in self._everyone if listener.has_fast_path]

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
                self.release()  # add() may wait: no deferred listener waits with it
                await listener.add(notification)

    def hold(self) -> None:
        """The informer starts a run of its queue: each idle listener whose handler can tell when it
        would not wait gets what the run brings at :meth:`release` (the fast path: in the
        informer's task, no worker woken), instead of a wake-up of its worker per run."""
        for listener in self._deferrable:
            listener.defer()

    def release(self) -> None:
        """The informer's run ended (or :meth:`send` is about to wait): every deferred listener gets
        what it was brought, from the informer's task or its worker
        (:meth:`~bridge.informer.listener.ProcessorListener.deliver_deferred`)."""
        for listener in self._deferrable:
            listener.deliver_deferred()

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
        tasks = [t for listener in self._listeners
                 for t in (listener.task, listener.carried) if t is not None]
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
