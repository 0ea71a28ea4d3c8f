"""Heartbeat events: a sink's periodic sign of life for each resource it receives.

Silence on a stream is ambiguous: a quiet resource and a stopped bridge look the same to a consumer.
A sink configured with ``heartbeat: {interval: …}`` receives, for each resource routed to it, one
``heartbeat`` event every interval (no object; docs/event-format.md): the resource's current
resourceVersion (what the informer last synced, bookmarks included) and the resourceVersion this
sink acknowledged (its own progress, :meth:`~bridge.delivery.progress.AckTracker.listener_state`).
A consumer that sees heartbeats knows the bridge runs and how far behind the sink is; one that sees
none for a few intervals knows it does not.

A heartbeat goes to the sink directly (not through the listener's buffer): the sink sends it after
everything handed to it before (an event without an object is a barrier in
:class:`~sinks.base.BaseSink`). It is sent only once the informer synced, and the next one waits
until the sink acknowledged the previous one, so a sink that is down does not pile them up. It is
never part of the checkpoint's progress: its acknowledgement moves nothing.
"""

from __future__ import annotations

import logging

from bridge.clock import Clock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.checkpoint_writer import sink_state
from bridge.delivery.informer_run import InformerRun
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType

__all__ = ["HEARTBEAT_ACKED", "HEARTBEAT_RV", "Heartbeats"]

log = logging.getLogger(__name__)

HEARTBEAT_RV = "resourceversion"
"""The extension attribute carrying the resource's current resourceVersion."""
HEARTBEAT_ACKED = "ackedresourceversion"
"""The extension attribute carrying the resourceVersion the sink acknowledged."""


class Heartbeats:
    """One sink's heartbeats for one informer's resource (module docs)."""

    def __init__(self, *, inf: InformerRun, sink: DeliveryChain, cluster: str, clock: Clock,
                 interval: float) -> None:
        self._inf = inf
        self._sink = sink
        self._cluster = cluster
        self._clock = clock
        self._interval = interval
        self._waiting = False

    async def run(self) -> None:
        """Sends one heartbeat every ``interval`` seconds, until cancelled."""
        while True:
            await self._clock.sleep(self._interval)
            await self.beat()

    async def beat(self) -> None:
        """Hands one heartbeat, as of now, to the sink, unless the informer has not synced or the
        previous one is not acknowledged yet."""
        inf = self._inf
        if self._waiting or not inf.informer.has_synced():
            return
        self._waiting = True
        reflector = inf.informer.reflector
        current = reflector.last_sync_resource_version if reflector is not None else ""
        name = self._sink.name
        acked = "" if name in inf.bootstrapping else str(sink_state(inf, name)[0] or "")
        event = ChangeEvent(type=EventType.HEARTBEAT, resource=inf.watched.ref, cluster=self._cluster,
                            obj=None, time=self._clock.wall(),
                            extensions={HEARTBEAT_RV: current, HEARTBEAT_ACKED: acked})
        await self._sink.deliver(event, self._acked)

    def _acked(self, outcome: DeliveryOutcome) -> None:
        self._waiting = False
        if outcome is not DeliveryOutcome.DELIVERED:
            log.debug("heartbeat %s", outcome.value, extra={"sink": self._sink.name,
                                                            "informer": self._inf.watched.informer_id})
