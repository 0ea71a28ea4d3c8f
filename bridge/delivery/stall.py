"""Stalled watches: an informer's watch that stays open but delivers nothing while its resource changes.

A watch can look healthy (connected, no error) and yet deliver nothing: a proxy or a load balancer
holding the stream, an API server wedged on it. The reflector cannot tell: it only sees silence, and a
quiet resource is silent too. So this module asks the server. Every ``after / 4`` seconds (at most 5)
the :class:`StallDetector` looks at each synced informer's activity: changes dispatched, progress
markers (lists, watch events, bookmarks) and the reflector's last synced resourceVersion. When none
of it moved for ``after`` seconds, it reads the server's current resourceVersion for that resource
with a ``limit=1`` list (one cheap request, through the API client and so through its rate limiter);
if that is ahead of what the informer last synced, the watch is **stalled**: a WARNING, a not-ready
reason on ``/readyz`` (:meth:`StallDetector.reasons`) and the ``keb_informer_stalled`` gauge, until
the informer's activity moves again (INFO then).

A resource whose watch gets bookmarks never looks silent for long; one without them may, while other
resources of the cluster move the server's resourceVersion (it is the whole store's): ``after`` must
exceed the server's bookmark period (kube-apiserver: about a minute).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.informer_run import InformerRun
from bridge.delivery.resume_plan import parse_rv

__all__ = ["StallCheck", "StallDetector"]

log = logging.getLogger(__name__)

ServerResourceVersion = Callable[[WatchedResource], Awaitable[str]]
"""Reads the server's current resourceVersion for a watched resource (a ``limit=1`` list)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StallCheck:
    """When a silent watch is checked against the server (module docs)."""

    after: float
    """Seconds without any activity before the server is asked."""
    server_resource_version: ServerResourceVersion

    def __post_init__(self) -> None:
        if self.after <= 0:
            raise ValueError(f"the stalled-watch time must be positive, got {self.after}")


@dataclass(slots=True)
class _Seen:
    activity: tuple[int, int, str]
    since: float
    stalled: str = ""
    """Why the watch is stalled ("" = it is not)."""


class StallDetector:
    """Reports the informers whose watch stalled (module docs)."""

    def __init__(self, *, check: StallCheck, clock: Clock, runs: Mapping[str, InformerRun]) -> None:
        self._check = check
        self._clock = clock
        self._runs = runs
        self._seen: dict[str, _Seen] = {}

    async def run(self) -> None:
        """Checks every ``period`` seconds, until cancelled."""
        while True:
            await self._clock.sleep(min(self._check.after / 4, 5.0))
            for ident, inf in self._runs.items():
                await self._check_one(ident, inf)

    def stalled(self, ident: str) -> str:
        """Why the informer's watch is stalled ("" when it is not)."""
        seen = self._seen.get(ident)
        return seen.stalled if seen is not None else ""

    def reasons(self) -> list[str]:
        """The not-ready reasons: one per stalled informer."""
        return [f"informer {ident} stalled: {seen.stalled}" for ident, seen in self._seen.items()
                if seen.stalled]

    async def _check_one(self, ident: str, inf: InformerRun) -> None:
        now = self._clock.now()
        activity = _activity(inf)
        seen = self._seen.get(ident)
        if seen is None or seen.activity != activity:
            if seen is not None and seen.stalled:
                log.info("the watch of %s delivers again", inf.watched.ref.qualified,
                         extra={"informer": ident, "resource": inf.watched.ref.qualified})
            self._seen[ident] = _Seen(activity=activity, since=now)
            return
        if (seen.stalled or now - seen.since < self._check.after or not inf.informer.has_synced()
                or inf.failing_now()):
            return
        try:
            server = await self._check.server_resource_version(inf.watched)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the list itself failing is reported by the API client's caller
            log.debug("reading the server's resourceVersion failed: %s", exc, extra={"informer": ident})
            return
        local = activity[2]
        if (parse_rv(server) or 0) <= (parse_rv(local) or 0) or _activity(inf) != activity:
            return
        seen.stalled = (f"its watch delivered nothing for {now - seen.since:.0f}s while the server's "
                        f"resourceVersion moved from {local} to {server}")
        log.warning("the watch of %s is stalled: %s", inf.watched.ref.qualified, seen.stalled,
                    extra={"informer": ident, "resource": inf.watched.ref.qualified})


def _activity(inf: InformerRun) -> tuple[int, int, str]:
    """What moves while the informer's watch delivers: progress markers, changes dispatched, the
    resourceVersion last synced (bookmarks included)."""
    counts = inf.counts
    reflector = inf.informer.reflector
    return (counts.progress, sum(counts.received.values()),
            reflector.last_sync_resource_version if reflector is not None else "")
