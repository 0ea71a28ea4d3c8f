"""When to retry a transient failure, how long to wait, and when to give up.

Exponential backoff with jitter: attempt ``n`` (1-based) waits ``min(max, initial * factor**(n-1))``
scaled by a random factor in ``[1 - jitter, 1 + jitter]``, so a fleet of sinks hitting the same
broken destination does not retry in lockstep. A server's ``Retry-After`` replaces the computed delay
(capped by ``max_retry_after``). Giving up is optional: after ``max_attempts`` attempts or
``max_elapsed`` seconds the event goes to the dead letter; by default transient failures are retried
forever, which holds the checkpoint back rather than losing the event.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sinks.options import RetryOptions

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    options: RetryOptions
    rng: Callable[[], float] = random.random

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        opts = self.options
        if retry_after is not None:
            return min(max(retry_after, 0.0), opts.max_retry_after)
        base = min(opts.max, opts.initial * opts.factor ** (attempt - 1))
        return max(0.0, base * (1.0 + opts.jitter * (2.0 * self.rng() - 1.0)))

    def give_up(self, attempts: int, elapsed: float) -> bool:
        """True once the configured attempt or time budget is spent."""
        opts = self.options
        return bool(
            (opts.max_attempts and attempts >= opts.max_attempts)
            or (opts.max_elapsed and elapsed >= opts.max_elapsed)
        )
