"""The simulator's API Priority and Fairness: how kube-apiserver answers a client that asks too much.

A real API server gives each flow (a user, in a priority level) a share of its concurrency; a request
beyond it waits in a queue for a while and is then rejected with ``429 Too Many Requests`` and
``Retry-After``. Nothing in the simulator limited anything, so a client-side rate limit could not be
tested against what it exists for. :class:`FlowControl` is the smallest model that behaves alike:

* a *flow* is the client's identity: its bearer token when it sends one, else its User-Agent (two
  bridges with different tokens are two flows, as two service accounts are);
* each flow may have ``concurrency`` requests executing at once; a request beyond that waits up to
  ``queue_wait`` seconds for a seat, in order, then is answered 429 with ``Retry-After:
  retry_after`` and the message kube-apiserver sends; when ``queue_length`` requests of the flow
  already wait, it is answered 429 at once (a flow's queues are full: in kube-apiserver's default
  ``workload-low`` level a flow is dealt 6 queues of 50);
* long-running requests (watches) are not counted once they stream: kube-apiserver's APF holds a
  watch's seat only while its initial events are computed, which the simulator serves at once.

Rejections and the most seats a flow ever held are counted for tests and the harness
(:meth:`FlowControl.describe`, also in ``GET /_sim/state``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.sim.status import SimStatusError

__all__ = ["FlowControl", "flow_of"]

TOO_MANY_REQUESTS = "Too many requests, please try again later."


def flow_of(headers: Mapping[str, str]) -> str:
    """The flow a request belongs to: a digest of its bearer token, else its User-Agent."""
    auth = headers.get("Authorization", "")
    if auth:
        return "token:" + hashlib.sha256(auth.encode()).hexdigest()[:12]
    return "agent:" + headers.get("User-Agent", "").split(" ", 1)[0][:128]


@dataclass
class _Flow:
    executing: int = 0
    queue: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)
    peak: int = 0
    rejected: int = 0
    admitted: int = 0


class FlowControl:
    """Per-flow concurrency with a short queue (see the module docs)."""

    def __init__(self, *, concurrency: int, queue_wait: float = 0.0, retry_after: int = 1,
                 queue_length: int | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if queue_wait < 0 or retry_after < 0:
            raise ValueError("queue_wait and retry_after must not be negative")
        if queue_length is not None and queue_length < 0:
            raise ValueError(f"queue_length must not be negative, got {queue_length}")
        self.concurrency = concurrency
        self.queue_length = queue_length
        self.queue_wait = queue_wait
        self.retry_after = retry_after
        self._flows: dict[str, _Flow] = collections.defaultdict(_Flow)

    @contextlib.asynccontextmanager
    async def seat(self, flow: str) -> AsyncIterator[None]:
        """Holds one of ``flow``'s seats while the body runs; raises the 429 when none frees in
        time."""
        f = self._flows[flow]
        if f.executing >= self.concurrency:
            await self._wait_in_queue(f)
        else:
            f.executing += 1
        f.admitted += 1
        f.peak = max(f.peak, f.executing)
        try:
            yield
        finally:
            self._release(f)

    async def _wait_in_queue(self, f: _Flow) -> None:
        queued = sum(not w.done() for w in f.queue)
        if self.queue_wait <= 0 or (self.queue_length is not None and queued >= self.queue_length):
            self._reject(f)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        f.queue.append(waiter)
        try:
            async with asyncio.timeout(self.queue_wait):
                await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():
                waiter.cancel()
                self._reject(f)
            # The seat was handed over just as the wait ended: keep it.
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(f)  # handed a seat it will not use
            else:
                waiter.cancel()
            raise

    def _reject(self, f: _Flow) -> None:
        f.rejected += 1
        raise SimStatusError(TOO_MANY_REQUESTS, code=429, reason="TooManyRequests",
                             retry_after=self.retry_after)

    def _release(self, f: _Flow) -> None:
        # The seat goes to the first live waiter, or back to the flow.
        while f.queue:
            waiter = f.queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        f.executing -= 1

    @property
    def rejected(self) -> int:
        """429s answered, every flow."""
        return sum(f.rejected for f in self._flows.values())

    def describe(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency, "queue_wait": self.queue_wait,
            "queue_length": self.queue_length,
            "retry_after": self.retry_after, "rejected": self.rejected,
            "flows": {name: {"executing": f.executing, "peak": f.peak, "admitted": f.admitted,
                             "rejected": f.rejected, "queued": sum(not w.done() for w in f.queue)}
                      for name, f in self._flows.items()},
        }
