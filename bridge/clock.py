"""Injectable time, so that backoff, resync timers, leases and checkpoints are testable without
sleeping on the wall clock.

``Clock.sleep`` is the only way the bridge waits for time to pass. :class:`FakeClock` advances only
when a test says so, waking the sleepers whose deadline has come, in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "RealClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds, for measuring intervals."""

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps that leave the process."""

    async def sleep(self, seconds: float) -> None:
        """Returns once ``seconds`` have passed on this clock (at once for ``seconds <= 0``)."""


class RealClock:
    # The time module's functions themselves, not methods calling them: the event path reads the
    # clock per event (the processor's wall clock, the tracker's monotonic one), one call each.
    now = staticmethod(time.monotonic)
    """Monotonic seconds, for measuring intervals."""
    wall = staticmethod(time.time)
    """Seconds since the epoch, for timestamps that leave the process."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only through :meth:`advance` / :meth:`step`.

    ``sleep`` registers a future at ``now + seconds``; ``advance`` moves time forward and resolves
    every future whose deadline is reached, yielding to the loop between them so woken tasks run in
    deadline order before time moves on.
    """

    def __init__(self, start: float = 1_000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._counter), fut))
        await fut

    @property
    def pending_sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        live = [d for d, _, f in self._sleepers if not f.done()]
        return min(live) if live else None

    async def advance(self, seconds: float) -> None:
        """Moves time forward by ``seconds``, waking due sleepers in order."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            if fut.done():
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._now = target
        for _ in range(5):
            await asyncio.sleep(0)

    async def step(self) -> bool:
        """Advances exactly to the next deadline; False when nobody sleeps."""
        deadline = self.next_deadline()
        if deadline is None:
            return False
        await self.advance(deadline - self._now)
        return True
