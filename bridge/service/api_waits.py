"""Saying so when the bridge waits on an API server that is behind the stored resourceVersion.

A checkpoint written against one cluster state and read back against an API server that has not
reached it (a restored etcd backup, a checkpoint copied from another cluster, a watch cache behind
after a restart) makes every list or watch at that resourceVersion answer 504 "Too large resource
version" with ``Retry-After: 1``. The API client waits such answers out and sends again, as client-go's
REST layer does (the watch cache is usually a moment behind and catches up within a retry or two);
only after ``max_retries`` does the reflector see the error and relist from a consistent read. With
the defaults that is about 40 seconds in which nothing is delivered for the resource, and without
this module, nothing said it.

:class:`AheadOfServer` is the client's :class:`~bridge.kube.apiclient.RetryObserver`: at the first
such answer of a call it logs a WARNING naming the request, the server's message and the time it will
wait before relisting; while the call keeps retrying, readiness reports the same (the bridge is not
ready: it delivers nothing for that resource); when the call ends it says how (the server caught up,
or the relist begins) and the detail goes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.errors import TooLargeResourceVersionError

__all__ = ["AheadOfServer"]

log = logging.getLogger(__name__)

_TOO_LARGE = "too large resource version"


@dataclass(slots=True)
class _Wait:
    message: str
    until: float
    """Clock time the retries will have run out (then the relist starts)."""


class AheadOfServer:
    """Readiness details and warnings for calls waiting on a resourceVersion the server has not
    reached (see the module docstring)."""

    def __init__(self, *, clock: Clock) -> None:
        self._clock = clock
        self._waits: dict[str, _Wait] = {}

    def retrying(self, context: str, code: int, message: str, *, attempt: int, max_retries: int,
                 wait: float, attempt_seconds: float) -> None:
        if _TOO_LARGE not in message.lower():
            return
        # Each retry left waits the Retry-After, then the server holds the request as this one did.
        left = (max_retries - attempt + 1) * (wait + attempt_seconds)
        first = context not in self._waits
        self._waits[context] = _Wait(message=message, until=self._clock.now() + left)
        if first:
            log.warning("%s: the stored resourceVersion is ahead of the API server (HTTP %d: %s); "
                        "nothing is delivered for it while the request is retried (%d more times, "
                        "about %.0f s), then the bridge relists from a consistent read", context, code,
                        message, max_retries - attempt + 1, left,
                        extra={"wait_seconds": round(left, 1)})

    def settled(self, context: str, error: BaseException | None) -> None:
        if self._waits.pop(context, None) is None:
            return
        if isinstance(error, TooLargeResourceVersionError):
            log.warning("%s: the API server is still behind the stored resourceVersion; relisting from "
                        "a consistent read now", context)
        elif error is None:
            log.info("%s: the API server caught up with the stored resourceVersion", context)

    def reasons(self) -> list[str]:
        """One readiness detail per call waiting, with the time left before the relist."""
        now = self._clock.now()
        return [f"stored resourceVersion ahead of the API server: {context} ({w.message}); "
                f"relisting from a consistent read in about {max(0.0, w.until - now):.0f} s"
                for context, w in self._waits.items()]
