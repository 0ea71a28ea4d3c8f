"""How the service builds the events profile from the configuration and the resolved resources."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bridge.clock import Clock
from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.resource_version import parse_rv
from bridge.service.config import BridgeConfig
from bridge.service.events.enrichment import Enricher
from bridge.service.events.metrics import EventCounter
from bridge.service.events.profile import EventsProfile
from bridge.service.telemetry import Telemetry
from bridge.storage.checkpoint import CheckpointStore
from sinks.contract import ResourceRef

__all__ = ["events_profile_for", "set_replay_point"]

log = logging.getLogger(__name__)


def events_profile_for(config: BridgeConfig, watched: Sequence[WatchedResource], *, client: ApiClient,
                       clock: Clock, telemetry: Telemetry) -> EventsProfile | None:
    """The profile for the resources configured with ``profile: events`` among ``watched`` (None
    when there are none: no chain then has an events stage)."""
    keys = {InformerKey(resource=r.resource, namespace=r.namespace, label_selector=r.label_selector,
                        field_selector=r.field_selector)
            for r in config.resources if r.profile == "events"}
    refs = frozenset((w.ref.group, w.ref.resource) for w in watched if w.key in keys)
    if not refs:
        return None
    ev = config.events
    enr = ev.enrichment
    enricher = None
    if enr.enabled:
        enricher = Enricher(client=client, discovery=Discovery(client=client), clock=clock, kinds=enr.kinds,
                            annotations=enr.annotations, max_objects=enr.max_objects, max_gone=enr.max_gone,
                            wait=enr.wait, sync_timeout=enr.sync_timeout, max_owner_depth=enr.max_owner_depth,
                            page_size=config.kubernetes.page_size)
    counter = EventCounter(config=ev.metrics, counter=telemetry.kube_events)

    def profiled(ref: ResourceRef) -> bool:
        return (ref.group, ref.resource) in refs

    return EventsProfile(profiled=profiled, enricher=enricher, counter=counter)


async def set_replay_point(profile: EventsProfile, store: CheckpointStore | None,
                           watched: Sequence[WatchedResource]) -> None:
    """Points the enrichment's replay of deletions at the oldest checkpoint of the profiled Event
    informers: what a restarted bridge sends again starts there (see
    :meth:`~bridge.service.events.enrichment.Enricher._replay`)."""
    enricher = profile.enricher
    if enricher is None or store is None:
        return
    points: list[int] = []
    for w in watched:
        if not profile.profiles(w.ref):
            continue
        try:
            checkpoint = await store.load(w.informer_id)
        except Exception as e:  # the pipeline reports the store's failures; enrichment just goes without
            log.warning("events enrichment: no replay point from the checkpoint of %s: %s", w.informer_id, e)
            continue
        rv = parse_rv(checkpoint.resource_version) if checkpoint is not None else None
        if rv is not None:
            points.append(rv)
    if points:
        enricher.replay_since = str(min(points))
