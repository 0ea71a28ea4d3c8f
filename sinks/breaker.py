"""The circuit breaker of a sink: its health check of the destination during an outage.

Per-event timers are right for a failure of one message, wrong for an outage of the destination,
where each event's timer grows towards ``retry.max`` and, once the destination is back, the backlog
trickles in for as long as the longest timer. After ``breaker.failures`` consecutive transient
failures (no success between them) the breaker *opens*: every event whose attempt fails, whose retry
timer fires or that reaches the head of its lane *waits* (no attempt, no timer of its own) in the
order it came; one *probe* at a time re-sends the oldest waiting event, the probes backing off from
``retry.initial`` up to ``breaker.probe_interval`` (a server's Retry-After is honoured instead). The
first success (or any answer to the probe but a transient failure: a refusal is that event's
problem) closes the breaker, and everything that waited is dispatched at once in that order: the
backlog goes at the sink's full rate, each object's events still one after the other in their lane.
While open, only probes count attempts (``retry.max_attempts``); ``retry.max_elapsed`` still applies
to every waiting event, checked after each failed probe.

Invariants: at most one probe is under way; a waiting event is in ``waiting`` exactly once and is
not pending; closing the breaker empties ``waiting`` in its order. The breaker sends nothing itself:
``dispatch`` (the sink's) does, and ``give_up`` sends an event past its deadline to the dead letter.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from bridge.clock import Clock
from sinks.contract import SinkTransientError
from sinks.envelope import OutgoingMessage
from sinks.options import BreakerOptions, RetryOptions
from sinks.retry import RetryPolicy
from sinks.stats import SinkStats

__all__ = ["CircuitBreaker"]

log = logging.getLogger("sinks.base")  # the sink's own log: its outages


class CircuitBreaker:
    """The breaker of one sink (see the module's docstring)."""

    def __init__(self, *, sink: str, options: BreakerOptions, retry: RetryOptions, policy: RetryPolicy,
                 clock: Clock, stats: SinkStats, dispatch: Callable[[OutgoingMessage], None],
                 give_up: Callable[[OutgoingMessage, str], None],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None],
                 closed: Callable[[], bool]) -> None:
        self._sink = sink
        self._options = options
        self._retry = retry
        self._policy = policy
        self._clock = clock
        self._stats = stats
        self._dispatch = dispatch
        self._give_up = give_up
        self._spawn = spawn
        self._closed = closed
        self.failures = 0
        """Consecutive transient failures since the last success (the breaker opens at its limit)."""
        self.open = False
        """Open: failed and new attempts wait in ``waiting``, one probe at a time."""
        self.waiting: deque[OutgoingMessage] = deque()
        self.probe: OutgoingMessage | None = None
        self._probes = 0
        self._opened_at = 0.0

    def holds(self, msg: OutgoingMessage) -> bool:
        """Before an attempt: True when the breaker is open and ``msg`` (not the probe) waits."""
        if self.open and msg is not self.probe:
            msg.pending = False
            self.waiting.append(msg)  # waits for the breaker to close (or to be the probe)
            return True
        return False

    def answered(self, msg: OutgoingMessage, transient: bool) -> None:
        """An attempt settled: the probe answered by anything but a transient failure (a refusal is an
        answer: the event alone is bad) sends the waiting events."""
        if msg is self.probe and not transient:
            self.recovered()

    def recovered(self) -> None:
        """A success: the failures in a row end; an open breaker closes."""
        self.failures = 0
        if self.open:
            self._close()

    def takes(self, msg: OutgoingMessage, error: SinkTransientError, last_error: str) -> bool:
        """After a transient failure: True when the breaker keeps ``msg`` (waiting, or as the
        failed probe), False to retry it on its own timer (the breaker is closed and stays so)."""
        options = self._options
        if not options.enabled:
            return False
        self.failures += 1
        if not self.open and self.failures < options.failures:
            return False
        self._stats.retries += 1  # sent again: as a probe, or once the breaker closes
        if msg is self.probe:
            self.waiting.appendleft(msg)  # the oldest waiting event: the next probe again
            self.probe_failed(error.retry_after, last_error)
            return True
        self.waiting.append(msg)
        if self.open:  # an attempt sent before the breaker opened
            return True
        self.open = True
        self._opened_at = self._clock.now()
        self._probes = 0
        log.warning("%d consecutive failures (last: %s): the breaker opens; one probe at a time "
                    "until the destination answers, then the waiting events at full rate",
                    self.failures, error, extra={"sink": self._sink})
        self._schedule_probe(error.retry_after)
        return True

    def probe_failed(self, retry_after: float | None, last_error: str) -> None:
        """The probe failed (or gave up): the next one after a backoff."""
        self.probe = None
        self._probes += 1
        if self._retry.max_elapsed:
            self._expire_waiting(last_error)
        self._schedule_probe(retry_after)

    def _expire_waiting(self, last_error: str) -> None:
        """Waiting events past ``retry.max_elapsed`` go to the dead letter."""
        now = self._clock.now()
        keep: deque[OutgoingMessage] = deque()
        for waiting in self.waiting:
            elapsed = now - waiting.started
            if self._policy.give_up(0, elapsed):
                self._give_up(waiting, f"gave up after {elapsed:.1f}s waiting for the destination: "
                                       f"{last_error}")
            else:
                keep.append(waiting)
        self.waiting = keep

    def _schedule_probe(self, retry_after: float | None) -> None:
        if retry_after is not None:
            delay = min(max(retry_after, 0.0), self._retry.max_retry_after)
        else:
            delay = min(self._options.probe_interval, self._policy.delay(self._probes + 1))
        self._spawn(self._probe_later(delay), "probe")

    async def _probe_later(self, delay: float) -> None:
        await self._clock.sleep(delay)
        if self._closed() or not self.open or self.probe is not None:
            return
        if not self.waiting:  # nothing waits (all gave up): the next event is the probe
            self._close()
            return
        probe = self.waiting.popleft()
        self.probe = probe
        self._dispatch(probe)

    def _close(self) -> None:
        self.open = False
        self.probe = None
        self.failures = 0
        waiting, self.waiting = self.waiting, deque()
        log.info("the destination answers again after %.1fs: the breaker closes; sending the %d "
                 "waiting events", self._clock.now() - self._opened_at, len(waiting),
                 extra={"sink": self._sink})
        for msg in waiting:
            if not self._closed():
                self._dispatch(msg)

    def clear(self) -> None:
        self.waiting.clear()
