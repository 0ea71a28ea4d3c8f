"""One term of the service: what it builds each time it starts leading (once, without leader
election), runs, and tears down when the term ends.

A :class:`Term` is built in two steps: its delivery chains first (:mod:`bridge.service.chains`:
meter, the Events profile, the fence with leader election), which the service exposes at once, then
(:meth:`Term.assemble`) the namespace watch of the resources with a ``namespace_selector``, the
informer factory, the checkpoint store (fenced by the elector's lease token) and the pipeline.
:meth:`Term.run` starts them and ends in one of two ways:

* the stop event (a signal, the supervisor gone): a graceful shutdown within the shutdown deadline
  (less the time kept for releasing the Lease): stop intake, drain, flush, final checkpoint;
* cancelled (leadership ended): an abort, without draining, flushing or checkpointing; the next
  leader re-sends what was in flight.

Either way everything the term built is closed before :meth:`Term.run` returns or raises; the
pipeline's counts are the service's to carry over (it retires them after the term).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from bridge.clock import Clock
from bridge.contracts import ListerWatcher
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.checkpoint_writer import GroupCommit
from bridge.delivery.pipeline import BridgePipeline
from bridge.delivery.stall import StallCheck
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.informer.namespaces import NamespaceFilteredListerWatcher, NamespaceLabels, NamespaceScope
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.leaderelection import LeaderElector
from bridge.kube.listwatch import HttpListerWatcher
from bridge.service.chains import delivery_chains
from bridge.service.config import BridgeConfig
from bridge.service.connections import checkpoint_store, fetch_object, server_rv
from bridge.service.events.profile import EventsProfile
from bridge.service.events.wiring import events_profile_for, set_replay_point
from bridge.service.health import HealthServer
from bridge.service.telemetry import Telemetry
from bridge.service.validation import validate_sinks
from bridge.storage.checkpoint import CheckpointStore

__all__ = ["Term"]

log = logging.getLogger(__name__)

Beside = Callable[[BridgePipeline], Coroutine[Any, Any, None]]
"""Work that runs beside a started pipeline until the term's stop (the initial-sync report)."""


class Term:
    """One term's chains and pipeline, and their run (module docs)."""

    def __init__(self, *, config: BridgeConfig, client: ApiClient, watched: list[WatchedResource],
                 telemetry: Telemetry, clock: Clock, elector: LeaderElector | None = None) -> None:
        """Builds the delivery chains (the sinks themselves start with the pipeline)."""
        self._config = config
        self._client = client
        self._watched = watched
        self._clock = clock
        self._elector = elector
        self.events_profile: EventsProfile | None = events_profile_for(
            config, watched, client=client, clock=clock, telemetry=telemetry)
        self.chains: list[DeliveryChain] = delivery_chains(
            validate_sinks(config), telemetry=telemetry, clock=clock,
            events=(self.events_profile, config.events) if self.events_profile is not None else None,
            is_leader=elector.is_leader if elector is not None else None)
        self._namespace_labels: NamespaceLabels | None = None
        self._store: CheckpointStore | None = None
        self.pipeline: BridgePipeline | None = None

    async def assemble(self) -> BridgePipeline:
        """The term's pipeline over its chains, with its informer factory and checkpoint store."""
        cfg, client, watched = self._config, self._client, self._watched
        fence = self._elector.fence_token if self._elector is not None else None
        self._namespace_labels = await _namespace_labels(client, watched, self._clock)
        factory = SharedInformerFactory(
            lister_watcher_factory=_lister_watchers(cfg, client, watched, self._namespace_labels),
            clock=self._clock, compact_cache=cfg.cache.compact)
        self._store = store = checkpoint_store(cfg, client, fence)
        if self.events_profile is not None:
            await set_replay_point(self.events_profile, store, watched)
        self.pipeline = BridgePipeline(
            fetch_object=functools.partial(fetch_object, client),
            factory=factory, resources=watched, sinks=self.chains, checkpoint_store=store,
            cluster=cfg.cluster, checkpoint_interval=cfg.checkpoint.interval,
            stall_check=(StallCheck(after=cfg.kubernetes.stall_after,
                                    server_resource_version=functools.partial(server_rv, client))
                         if cfg.kubernetes.stall_after else None),
            group_commit=(GroupCommit(events=cfg.checkpoint.commit_events,
                                      delay=cfg.checkpoint.group_commit_delay)
                          if cfg.checkpoint.commit_events else None),
            snapshot_on_first_start=cfg.snapshot.on_first_start, clock=self._clock,
            page_size=cfg.kubernetes.configured_page_size,
            use_watch_list=cfg.kubernetes.watch_list,
            spill_directory=cfg.checkpoint.spill_directory or None,
        )
        return self.pipeline

    @property
    def shutdown_deadline(self) -> float:
        """The configured deadline, less what is kept for releasing the Lease afterwards."""
        deadline = self._config.shutdown_deadline
        if self._elector is not None:
            deadline = max(0.5, deadline - self._elector.release_timeout)
        return deadline

    async def run(self, stop_event: asyncio.Event, health: HealthServer, beside: Beside) -> None:
        """Runs the assembled pipeline until ``stop_event`` (then a graceful shutdown) or until
        cancelled (then an abort); closes what the term built either way (module docs)."""
        pipeline = self.pipeline
        if pipeline is None:
            raise RuntimeError("Term.run before Term.assemble")
        health.set_snapshot_handler(pipeline.snapshot_now)
        progress: asyncio.Task[None] | None = None
        finished = False
        try:
            if self._namespace_labels is not None:
                await self._namespace_labels.start()
            await pipeline.start()
            progress = asyncio.create_task(beside(pipeline), name="initial-sync-progress")
            await stop_event.wait()
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
            health.set_snapshot_handler(None)
            # Still leading: drain, flush and write the final checkpoint; the Lease is released only
            # after this returns. Losing leadership meanwhile cancels this task (then an abort).
            deadline = self.shutdown_deadline
            log.info("shutting down: stopping intake, draining, writing the final checkpoint",
                     extra={"deadline": deadline})
            await pipeline.shutdown(deadline)
            finished = True
        finally:
            if progress is not None:
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
            health.set_snapshot_handler(None)
            await self._close(pipeline, aborted=not finished)

    async def _close(self, pipeline: BridgePipeline, *, aborted: bool) -> None:
        """Aborts the pipeline unless it shut down, then closes the store, the namespace watch and
        the Events profile. The term is over either way: a failure to abort, or to close the store
        or the profile, is not raised."""
        if aborted:
            if self._elector is not None:
                log.warning("leadership ended: abandoning the work in flight without a checkpoint; "
                            "the next leader re-sends it")
            with contextlib.suppress(Exception):
                await pipeline.abort()
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()
        if self._namespace_labels is not None:
            await self._namespace_labels.stop()
        if self.events_profile is not None:
            with contextlib.suppress(Exception):
                await self.events_profile.close()


def _lister_watchers(config: BridgeConfig, client: ApiClient, watched: list[WatchedResource],
                     namespace_labels: NamespaceLabels | None) -> Callable[[InformerKey], ListerWatcher]:
    """The factory's ListerWatchers: one HTTP list/watch per scope, filtered by the namespace watch
    for a scope with a ``namespace_selector`` (one :class:`NamespaceScope` per selector)."""
    by_key = {w.key: w for w in watched}
    scopes: dict[str, NamespaceScope] = {}

    def lister_watcher(key: InformerKey) -> ListerWatcher:
        w = by_key[key]
        # A compact cache keeps objects as bytes from the wire on (see bridge.rawobject).
        lw = HttpListerWatcher(client=client, resource=w.api, namespace=key.namespace,
                               label_selector=key.label_selector, field_selector=key.field_selector,
                               raw_objects=config.cache.compact, drop_managed_fields=config.cache.compact,
                               shard=w.shard)
        if not key.namespace_selector or namespace_labels is None:
            return lw
        scope = scopes.get(key.namespace_selector)
        if scope is None:
            scope = scopes[key.namespace_selector] = NamespaceScope(
                selector=key.namespace_selector, labels=namespace_labels)
        return NamespaceFilteredListerWatcher(inner=lw, scope=scope)

    return lister_watcher


async def _namespace_labels(client: ApiClient, watched: list[WatchedResource],
                            clock: Clock) -> NamespaceLabels | None:
    """The one Namespace watch of the resources with a ``namespace_selector`` (not started: the
    pipeline's start waits for its sync, so that their first list is filtered by the real set of
    namespaces); None when no resource has one."""
    if not any(w.key.namespace_selector for w in watched):
        return None
    api = await Discovery(client=client).resolve("namespaces")
    return NamespaceLabels(
        lister_watcher=HttpListerWatcher(client=client, resource=api, drop_managed_fields=True),
        clock=clock)
