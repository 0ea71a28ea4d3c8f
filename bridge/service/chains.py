"""The assembly of the sinks' delivery chains: which stages each sink's chain has, in which order.

Every sink gets one :class:`~bridge.delivery.chain.DeliveryChain`, built here from the
configuration (docs/architecture.md, "Delivery chain"):

1. ``meter`` (:class:`~bridge.service.metered.MeterStage`), always: the in-flight gauge, sampled
   latencies and spans, so that it times everything after it, a coalescing hold included;
2. ``events`` (:class:`~bridge.service.events.profile.EventsStage`), when a watched resource has
   ``profile: events``: annotation, the Events counter, coalescing;
3. ``fence`` (:class:`~bridge.service.fencing.FenceStage`), with leader election: last, so that
   nothing reaches the sink once leadership ended, whatever a stage before it held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from bridge.clock import Clock
from bridge.delivery.chain import DeliveryChain, DeliveryStage
from bridge.service.events.config import EventsConfig
from bridge.service.events.profile import EventsProfile, EventsStage
from bridge.service.fencing import FenceStage
from bridge.service.metered import MeterStage
from bridge.service.telemetry import Telemetry
from sinks.contract import Sink

__all__ = ["delivery_chains"]

log = logging.getLogger(__name__)


def delivery_chains(sinks: Sequence[Sink], *, telemetry: Telemetry, clock: Clock,
                    events: tuple[EventsProfile, EventsConfig] | None = None,
                    is_leader: Callable[[], bool] | None = None) -> list[DeliveryChain]:
    """One chain per sink, in the order of ``sinks``. ``events``: the events profile and its
    configuration, when a watched resource has ``profile: events``; ``is_leader``: the elector's,
    with leader election."""
    chains = []
    for sink in sinks:
        stages: list[DeliveryStage] = [MeterStage(sink=sink.name, telemetry=telemetry)]
        if events is not None:
            profile, config = events
            stages.append(EventsStage(sink=sink.name, profile=profile, coalesce_window=config.coalesce_window,
                                      max_pending=config.coalesce_max_pending, clock=clock))
        if is_leader is not None:
            stages.append(FenceStage(is_leader=is_leader))
        chain = DeliveryChain(sink=sink, stages=stages)
        log.debug("sink %s: delivery chain %s", sink.name, chain.describe(), extra={"sink": sink.name})
        chains.append(chain)
    return chains
