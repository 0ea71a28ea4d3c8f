"""How the service builds the events profile from the configuration and the resolved resources."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.clock import Clock
from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.service.config import BridgeConfig
from bridge.service.events.enrichment import Enricher
from bridge.service.events.metrics import EventCounter
from bridge.service.events.profile import EventsProfile, EventsSink
from bridge.service.telemetry import Telemetry
from sinks.contract import ResourceRef

__all__ = ["EventsSink", "events_profile_for"]


def events_profile_for(config: BridgeConfig, watched: Sequence[WatchedResource], *, client: ApiClient,
                       clock: Clock, telemetry: Telemetry) -> EventsProfile | None:
    """The profile for the resources configured with ``profile: events`` among ``watched`` (None
    when there are none: sinks are then not wrapped at all)."""
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
