"""The API client's client-side rate limit: a token bucket with client-go's semantics.

Without one, a bridge watching many resources in many namespaces sends every list of its start (and
every relist after an outage) at once, and the API server's priority and fairness answers the excess
with 429s, retried after ``Retry-After``: a storm instead of a queue. client-go meters every request
of a client through one token bucket (``rest.Config.QPS``/``Burst``, ``flowcontrol.
NewTokenBucketRateLimiter``, built on ``golang.org/x/time/rate``); :class:`TokenBucket` is the same
bucket:

* it holds at most ``burst`` tokens, starts full, and refills at ``qps`` tokens a second;
* each request takes one token; when none is left, the request *reserves* the next one (the count
  goes below zero) and waits until it is due, so waiters are served in the order they asked and the
  rate over any long interval is ``qps`` whatever the number of callers;
* a caller with a deadline (:meth:`TokenBucket.acquire` ``deadline``) that the wait would pass does
  not wait and takes nothing (``rate.Limiter.Wait`` with a context deadline); a caller cancelled
  while waiting gives its token back;
* a negative ``qps`` turns the limiter off (client-go builds no limiter for ``QPS < 0``).

What is metered is decided by :class:`~bridge.kube.apiclient.ApiClient`, as client-go's REST layer
decides it: every request, and every retry of a request (a retry after a 429 or 5xx is throttled
again), but not the opening of a watch: a watch is one long-lived request whose events cost nothing
more, and delaying it only delays the stream the informer depends on (client-go's ``Request.Watch``
skips the limiter for that reason). A watch re-opened after a ``Retry-After`` answer is metered.

The time waited is counted (:attr:`TokenBucket.throttled_seconds`, exported as
``keb_api_client_throttled_seconds_total``) and a wait longer than 1 s is logged, as client-go logs
"Waited for … due to client-side throttling, not priority and fairness".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from bridge.clock import Clock, RealClock
from bridge.errors import ApiUnavailableError

__all__ = ["DEFAULT_BURST", "DEFAULT_QPS", "LONG_THROTTLE", "TokenBucket"]

log = logging.getLogger(__name__)

DEFAULT_QPS: Final = 50.0
"""Requests a second the bridge's API client sends at most, over time (client-go's library default is
5; kubelet and kube-scheduler use 50). A watch-heavy service sends few requests once synced (watches
are not metered, see the module docs); what the limit paces is its start and its relists."""
DEFAULT_BURST: Final = 100
"""Requests sent at once before the rate applies (kubelet and kube-scheduler: 100)."""
LONG_THROTTLE: Final = 1.0
"""A wait at least this long is logged at info level (client-go: ``extraLongThrottleLatency``)."""


class TokenBucket:
    """A token bucket of ``burst`` tokens refilled at ``qps`` a second (see the module docs)."""

    def __init__(self, *, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST,
                 clock: Clock | None = None) -> None:
        if qps == 0:
            raise ValueError("qps: 0 would never send a request; give a positive rate, or a "
                             "negative one to turn the limit off")
        if qps > 0 and burst < 1:
            raise ValueError(f"burst: must be at least 1 when qps is set (got {burst})")
        self.qps = qps
        self.burst = burst
        self._clock: Clock = clock or RealClock()
        self._tokens = float(burst)
        self._last = self._clock.now()
        self.throttled_seconds = 0.0
        """Seconds callers spent waiting for a token, in total (cancelled waits included)."""
        self.throttled_requests = 0
        """Requests that had to wait for a token."""
        self.waiting = 0
        """Callers waiting for a token now."""

    @property
    def enabled(self) -> bool:
        return self.qps > 0

    def __repr__(self) -> str:
        if not self.enabled:
            return "TokenBucket(off)"
        return f"TokenBucket(qps={self.qps:g}, burst={self.burst})"

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now

    def tokens(self) -> float:
        """Tokens available now (negative: that many are reserved by waiting callers)."""
        self._refill(self._clock.now())
        return self._tokens

    def try_acquire(self) -> bool:
        """Takes a token if one is available now, without waiting (``TryAccept``)."""
        if not self.enabled:
            return True
        self._refill(self._clock.now())
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    async def acquire(self, *, deadline: float | None = None, context: str = "") -> float:
        """Takes a token, waiting until it is due; returns the seconds waited. ``deadline`` (on the
        bucket's clock): a wait that would end past it is not made, nothing is taken, and
        :class:`~bridge.errors.ApiUnavailableError` is raised."""
        if not self.enabled:
            return 0.0
        now = self._clock.now()
        self._refill(now)
        wait = 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.qps
        if deadline is not None and now + wait > deadline:
            raise ApiUnavailableError(
                f"{context or 'request'}: the client-side rate limit ({self.qps:g} requests/s) would "
                f"delay it {wait:.1f}s, past its deadline")
        self._tokens -= 1.0
        if wait <= 0.0:
            return 0.0
        self.waiting += 1
        self.throttled_requests += 1
        started = now
        try:
            await self._clock.sleep(wait)
        except asyncio.CancelledError:
            # The reservation is given back, so the callers behind are not held for a request
            # that will not be sent.
            self._refill(self._clock.now())
            self._tokens = min(float(self.burst), self._tokens + 1.0)
            raise
        finally:
            self.waiting -= 1
            self.throttled_seconds += max(0.0, self._clock.now() - started)
        if wait >= LONG_THROTTLE:
            log.info("%s: waited %.1fs for the client-side rate limit (%g requests/s, burst %d), not "
                     "for the API server's priority and fairness", context or "request", wait, self.qps,
                     self.burst)
        return wait
