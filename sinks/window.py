"""The bounded in-flight window of a sink: admission, and the back-pressure it applies.

A sink holds at most ``max_in_flight`` messages accepted and not yet settled. ``deliver`` waits while
the window is full (:meth:`InFlightWindow.wait_for_space`), which is the back-pressure the bridge's
per-sink buffer applies its overflow policy to. A full window lets its waiter go again once a
sixteenth of it has settled (at least one message), so a backlog is admitted in steps rather than
with one wake-up per settled message.

Invariants: the count is ``SinkStats.in_flight`` (one counter, the sink's gauge); ``idle`` is set
exactly while nothing is in flight; the space event is set only when a caller waits for it, so a
settled message costs no wake-up otherwise; once the sink closes, every waiter is let go and raises.
"""

from __future__ import annotations

import asyncio

from sinks.contract import SinkError
from sinks.stats import SinkStats

__all__ = ["InFlightWindow"]


class InFlightWindow:
    """The window of one sink of ``limit`` messages, counted in ``stats.in_flight``."""

    __slots__ = ("_closed", "_name", "_space", "_stats", "idle", "limit", "low", "waiters")

    def __init__(self, *, name: str, limit: int, stats: SinkStats) -> None:
        self._name = name
        self._stats = stats
        self.limit = limit
        self.low = limit - max(1, limit // 16)
        """A full window wakes a waiting ``deliver`` once it is down to this: room for a sixteenth
        of the window at once, not one wake-up (and one event admitted) per settled message."""
        self._space = asyncio.Event()
        self.waiters = 0
        """``deliver`` / ``deliver_batch`` calls waiting for room: a settled message sets the space
        event only when one waits."""
        self.idle = asyncio.Event()
        """Set exactly while nothing is in flight."""
        self.idle.set()
        self._closed = False

    async def wait_for_space(self) -> None:
        """Until a message settles (or the sink closes: SinkError)."""
        self._space.clear()
        self.waiters += 1
        try:
            await self._space.wait()
        finally:
            self.waiters -= 1
        if self._closed:
            raise SinkError(f"sink {self._name!r} is closed")

    def enter(self) -> None:
        """One message more in flight."""
        stats = self._stats
        stats.accepted += 1
        stats.in_flight += 1
        if stats.in_flight == 1:  # idle is set exactly while nothing is in flight
            self.idle.clear()

    def leave(self) -> None:
        """One message settled: room for a waiter once the window is down to ``low``."""
        stats = self._stats
        stats.in_flight -= 1
        if self.waiters and stats.in_flight <= self.low:
            self._space.set()
        if stats.in_flight == 0:
            self.idle.set()

    async def drained(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for nothing to be in flight; True once so."""
        if self._stats.in_flight:
            try:
                await asyncio.wait_for(self.idle.wait(), timeout)
            except TimeoutError:
                return False
        return True

    def close(self) -> None:
        """Lets every waiter go (each raises SinkError)."""
        self._closed = True
        self._space.set()
