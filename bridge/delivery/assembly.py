"""Assembly from configuration: what is watched, how its informer is built, what each sink's
delivery chain is routed and how its listener is buffered.

:class:`WatchedResource` is one informer scope as the service resolved it; an
:data:`InformerBuilder` makes its informer (:func:`http_informer_builder` over the real API);
:func:`routed` says whether a sink receives a resource; :func:`listener_options` gives the
listener of one (sink, informer) its buffer, overflow policy and spill, in one directory per sink
and informer under the pipeline's spill directory (:func:`remove_stale_spills` removes those of
sinks no longer configured). Each reads a sink's configuration from its
:class:`~bridge.delivery.chain.DeliveryChain` (its name and ``delivery`` options, which are the
sink's own), the one thing the pipeline hands it for a sink.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.clock import Clock
from bridge.contracts import DeliveryObserver, KubeObject, ListenerOptions, OverflowPolicy
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.sharding import shard_id
from bridge.delivery.spill import SegmentSpill
from bridge.informer.factory import InformerKey
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource
from bridge.kube.listwatch import HttpListerWatcher
from bridge.kube.sharding import ShardFilter
from bridge.storage.checkpoint import informer_id
from sinks.contract import ResourceRef

__all__ = ["InformerBuilder", "WatchedResource", "http_informer_builder",
           "listener_options", "remove_stale_spills", "routed", "safe_name"]

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class WatchedResource:
    """One informer scope as the service resolved it.

    ``key`` names the resource and scope (the factory's :class:`~bridge.factory.InformerKey`),
    ``ref`` describes the resource as sinks see it, ``api`` is discovery's
    :class:`~bridge.discovery.APIResource` (what the HTTP ListerWatcher needs)."""

    key: InformerKey
    api: APIResource
    ref: ResourceRef
    shard: ShardFilter | None = None
    """This replica's share of the resource when sharding is configured (docs/sharding.md): shard
    ``o`` of ``t`` by object, or shard 0 of 1 for a resource watched whole by this replica. The
    informer's list/watch keeps only its objects; its checkpoint id says which shard it is, and the
    checkpoint is taken over from the store's other shards (:mod:`bridge.delivery.sharding`)."""

    @property
    def base_informer_id(self) -> str:
        """The id of the scope watched whole (no shard suffix)."""
        k = self.key
        return informer_id(k.resource, k.namespace, k.label_selector, k.field_selector,
                           k.namespace_selector)

    @property
    def informer_id(self) -> str:
        s = self.shard
        base = self.base_informer_id
        return base if s is None else shard_id(base, s.ordinal, s.total)

    @property
    def names(self) -> frozenset[str]:
        """What a user may call it in sink routing and on the snapshot endpoint."""
        r = self.ref
        return frozenset({self.key.resource, r.resource, r.qualified, r.kind, r.kind.lower()})


InformerBuilder = Callable[[WatchedResource, DeliveryObserver], SharedIndexInformer]
"""Builds the (not yet started) informer of one scope, reporting deliveries to the observer."""


def http_informer_builder(
    *, client: ApiClient, clock: Clock, page_size: int | None = None, use_watch_list: bool = False,
    compact_cache: bool = False,
) -> InformerBuilder:
    """Informers over the real API (``ApiClient`` + ``HttpListerWatcher``), without a factory."""

    def build(watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        lw = HttpListerWatcher(
            client=client,
            resource=watched.api,
            namespace=watched.key.namespace,
            label_selector=watched.key.label_selector,
            field_selector=watched.key.field_selector,
            # A compact cache keeps objects as bytes: they stay bytes from the wire on (the
            # informer's default transform drops managedFields; here they are cut from the bytes).
            raw_objects=compact_cache,
            drop_managed_fields=compact_cache,
            shard=watched.shard,
        )
        return SharedIndexInformer(
            lister_watcher=lw,
            clock=clock,
            observer=observer,
            name=watched.informer_id,
            page_size=page_size,
            use_watch_list=use_watch_list,
            compact_cache=compact_cache,
        )

    return build


def routed(chain: DeliveryChain, watched: WatchedResource) -> bool:
    """Whether ``chain``'s sink receives ``watched`` (its routing names it, or names nothing)."""
    wanted = chain.delivery.routing
    return not wanted or bool(wanted & watched.names)


def safe_name(name: str) -> str:
    """A directory name for a sink or an informer id (stable, readable, no separators)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"{cleaned[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def listener_options(chain: DeliveryChain, spill_directory: Path | None = None, informer: str = "",
                     resource: ResourceRef | None = None) -> ListenerOptions:
    """The listener of ``chain``'s sink in ``informer`` (of ``resource``): its buffer and overflow
    policy, and its spill (in its own directory, keeping what the sink's ``spill_form`` keeps of each
    object) when it has one."""
    options, name = chain.delivery, chain.name
    policy, limit = options.overflow_policy, options.spill_limit
    spill: SegmentSpill | None = None
    if spill_directory is not None and limit > 0 and policy in (OverflowPolicy.SPILL,
                                                                 OverflowPolicy.COALESCE):
        where = spill_directory / safe_name(name) / safe_name(informer)
        try:
            spill = SegmentSpill(where, limit_bytes=limit, name=f"{name}:{informer}",
                                 prepare=_spill_form(options.spill_form, resource))
        except OSError as exc:
            log.error("sink %s: its spill directory %s cannot be used (%s); without a spill it "
                      "degrades as soon as it falls behind its in-memory buffer", name, where, exc)
    # Resync is served as snapshots by the pipeline; the listener never gets same-RV updates.
    return ListenerOptions(resync_period=0.0, buffer_capacity=options.buffer_capacity,
                           overflow_policy=policy, name=name, spill=spill)


def _spill_form(form: Callable[[Mapping[str, Any], ResourceRef], Mapping[str, Any]] | None,
                resource: ResourceRef | None) -> Callable[[KubeObject], KubeObject] | None:
    if form is None or resource is None:
        return None
    return lambda obj: form(obj, resource)


def remove_stale_spills(root: Path | None, chains: Iterable[DeliveryChain]) -> None:
    """Removes the spill directories under ``root`` of sinks no longer configured (those without
    one of ``chains``)."""
    if root is None or not root.is_dir():
        return
    wanted = {safe_name(c.name) for c in chains}
    for entry in root.iterdir():
        if entry.is_dir() and entry.name not in wanted:
            log.info("removing the spill of a sink no longer configured: %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
