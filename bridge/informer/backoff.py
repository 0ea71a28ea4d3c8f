"""Exponential backoff with jitter, as client-go's reflector uses between ListAndWatch attempts.

client-go builds its reflector backoff with ``wait.NewExponentialBackoffManager(800ms, 30s, 2min,
2.0, 1.0, clock)``: the base delay starts at 0.8 s and doubles on every step up to a cap of 30 s;
every returned delay gets up to 100 % jitter on top (``d → d + rand·d``); and when no backoff was
taken for two minutes the base falls back to its initial value, so one failure after a long healthy
period waits briefly again. :class:`Backoff` reproduces those numbers with an injected
:class:`~bridge.clock.Clock` and :class:`random.Random`, so tests can assert exact delays.

It also honours a server's ``Retry-After``: :meth:`Backoff.wait` takes a minimum delay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bridge.clock import Clock

__all__ = ["Backoff", "BackoffOptions"]


@dataclass(frozen=True, slots=True)
class BackoffOptions:
    """The numbers of one backoff policy; the defaults are client-go's reflector values."""

    initial: float = 0.8
    """Base delay of the first step, seconds."""
    factor: float = 2.0
    """Multiplier applied to the base after every step."""
    jitter: float = 1.0
    """Each delay ``d`` becomes ``d + rng.random() * jitter * d``; 0 disables jitter."""
    cap: float = 30.0
    """Upper bound of the base delay (jitter comes on top, as in client-go)."""
    reset_after: float = 120.0
    """A step taken more than this many seconds after the previous one starts over at ``initial``."""

    def __post_init__(self) -> None:
        if self.initial <= 0:
            raise ValueError(f"backoff initial delay must be > 0, got {self.initial}")
        if self.factor < 1.0:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")
        if self.jitter < 0:
            raise ValueError(f"backoff jitter must be >= 0, got {self.jitter}")
        if self.cap < self.initial:
            raise ValueError(f"backoff cap ({self.cap}) must be >= initial delay ({self.initial})")
        if self.reset_after < 0:
            raise ValueError(f"backoff reset_after must be >= 0, got {self.reset_after}")


_DEFAULTS = BackoffOptions()


class Backoff:
    """client-go's exponential backoff manager (``wait.exponentialBackoffManagerImpl``).

    Not thread-safe; one owner (a reflector) drives it from one task.
    """

    def __init__(
        self,
        *,
        initial: float = _DEFAULTS.initial,
        factor: float = _DEFAULTS.factor,
        jitter: float = _DEFAULTS.jitter,
        cap: float = _DEFAULTS.cap,
        reset_after: float = _DEFAULTS.reset_after,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> None:
        self.options = BackoffOptions(
            initial=initial, factor=factor, jitter=jitter, cap=cap, reset_after=reset_after
        )
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._base = self.options.initial
        self._last_step: float | None = None
        self.last_delay: float | None = None
        """The delay most recently returned by :meth:`next_delay` (or waited by :meth:`wait`)."""

    def next_delay(self) -> float:
        """Returns the next delay and advances the policy (the step counts as "backoff taken now")."""
        opts = self.options
        now = self._clock.now()
        if self._last_step is not None and now - self._last_step > opts.reset_after:
            self._base = opts.initial
        self._last_step = now
        base = self._base
        self._base = min(self._base * opts.factor, opts.cap)
        delay = base
        if opts.jitter > 0:
            delay = base + self._rng.random() * opts.jitter * base
        self.last_delay = delay
        return delay

    async def wait(self, min_delay: float | None = None) -> float:
        """Sleeps the next delay on the clock, or ``min_delay`` if that is longer (a server's
        ``Retry-After``). Returns the time slept."""
        delay = self.next_delay()
        if min_delay is not None and min_delay > delay:
            delay = min_delay
            self.last_delay = delay
        await self._clock.sleep(delay)
        return delay

    def reset(self) -> None:
        """Starts over at the initial delay."""
        self._base = self.options.initial
        self._last_step = None
