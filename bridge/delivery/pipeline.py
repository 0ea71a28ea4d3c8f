"""The supervisor of the delivery layer: informers → sink listeners → delivery chains → sinks,
started and stopped.

Each part of the lifecycle lives in a module of its own (docs/architecture.md, "Data flow"):
assembly, the start (:mod:`~bridge.delivery.resume_plan` builds one resume plan per informer, the
restart stage of :mod:`~bridge.delivery.restart` applies it), the listeners and one
:class:`~bridge.delivery.progress.AckTracker` per informer, bootstrap, the checkpoint writer
(with ``group_commit``, also as soon as the acknowledgements are due), stalled watches
(:mod:`~bridge.delivery.stall`), heartbeats (:mod:`~bridge.delivery.heartbeat`) and outage
reporting. What remains here: the per-sink resync timers (listeners themselves get resync period 0,
so the same-RV updates of a 410 relist are never delivered), readiness, and
:meth:`~BridgePipeline.shutdown`, which stops intake, lets the listeners drain and the sinks flush,
writes the final checkpoint and closes everything within one deadline. Every task is named,
supervised (one that dies unexpectedly is logged) and cancelled on shutdown; time comes from the
injected clock.

What the pipeline holds of each sink is its :class:`~bridge.delivery.chain.DeliveryChain`: the
listeners and heartbeats deliver to the chain, readiness and the outage reports read it, and the
chain alone reaches the sink. A plain sink handed to it (tests, tools, the public API) gets a
chain of no stages (:func:`~bridge.delivery.chain.as_chain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.clock import Clock, RealClock
from bridge.contracts import DeliveryObserver
from bridge.delivery.assembly import (
    InformerBuilder,
    WatchedResource,
    http_informer_builder,
    listener_options,
    remove_stale_spills,
    routed,
)
from bridge.delivery.chain import DeliveryChain, as_chain
from bridge.delivery.checkpoint_writer import CheckpointWriter, GroupCommit
from bridge.delivery.heartbeat import Heartbeats
from bridge.delivery.informer_run import InformerCounts, InformerObserver, InformerRun
from bridge.delivery.inspection import PipelineInspection
from bridge.delivery.outages import OutageReporter
from bridge.delivery.restart import RestartStage
from bridge.delivery.resume_plan import load_start
from bridge.delivery.selector_exit import SelectorExits
from bridge.delivery.sink_listener import SinkListener
from bridge.delivery.stall import StallCheck, StallDetector
from bridge.informer.factory import SharedInformerFactory
from bridge.informer.shared_informer import HandlerRegistration, SharedIndexInformer
from bridge.storage.checkpoint import CheckpointStore
from sinks.contract import Sink

__all__ = [
    "BridgePipeline",
    "InformerBuilder",
    "SinkListener",
    "WatchedResource",
    "http_informer_builder",
]

log = logging.getLogger(__name__)

class BridgePipeline(PipelineInspection):
    """Informers → sink listeners → sinks, with checkpoints and snapshots (see the module docs)."""

    def __init__(
        self,
        *,
        resources: Sequence[WatchedResource],
        sinks: Sequence[DeliveryChain | Sink],
        checkpoint_store: CheckpointStore | None,
        factory: SharedInformerFactory | None = None,
        build_informer: InformerBuilder | None = None,
        cluster: str = "default",
        checkpoint_interval: float = 5.0,
        snapshot_on_first_start: bool = False,
        clock: Clock | None = None,
        page_size: int | None = None,
        use_watch_list: bool = False,
        on_event: Callable[[str, str], None] | None = None,
        start_sinks: bool = True,
        sync_timeout: float = 120.0,
        fetch_object: Callable[[WatchedResource, str, str, str], Awaitable[Mapping[str, Any]]] | None = None,
        spill_directory: str | os.PathLike[str] | None = None,
        outage_check_interval: float = 1.0,
        outage_summary_interval: float = 30.0,
        group_commit: GroupCommit | None = None, stall_check: StallCheck | None = None,
    ) -> None:
        """``sinks``: their delivery chains (a plain sink gets one of no stages). ``factory`` (the
        service) or ``build_informer`` (tests, tools) makes the informers; with a factory, ``page_size``
        and ``use_watch_list`` are passed to each. ``checkpoint_store`` None disables checkpoints.
        ``checkpoint_interval`` in seconds. ``on_event(resource, kind)``, if given, is called for every
        change an informer processed (it must be cheap). ``start_sinks`` False leaves starting and
        closing the sinks to the caller. ``fetch_object(watched, namespace, name, at)`` reads one object
        unfiltered, now or at a resourceVersion (selector exits, :mod:`bridge.delivery.selector_exit`).
        ``spill_directory``: where sinks' backlogs spill (None: a sink that falls behind degrades).
        Sinks' health is checked every ``outage_check_interval`` seconds (:mod:`bridge.delivery.outages`)."""
        self._sinks: list[DeliveryChain] = [as_chain(s) for s in sinks]
        _check(resources, self._sinks, factory, build_informer, checkpoint_interval)
        self._resources = list(resources)
        self._store = checkpoint_store
        self._factory = factory
        self._build = build_informer
        self._cluster = cluster
        self._checkpoint_interval = checkpoint_interval
        self._snapshot_on_first_start = snapshot_on_first_start
        self._clock: Clock = clock or RealClock()
        self._page_size = page_size
        self._use_watch_list = use_watch_list
        self._on_event = on_event
        self._start_sinks = start_sinks
        self._sync_timeout = sync_timeout
        self._fetch_object = fetch_object
        self._spill_directory = Path(spill_directory) if spill_directory is not None else None
        self._outage_check = outage_check_interval
        self._informers: dict[str, InformerRun] = {}
        runs, clock, store = self._informers, self._clock, checkpoint_store
        self._writer = CheckpointWriter(store=store, clock=clock, runs=runs, group_commit=group_commit)
        self._stalls = StallDetector(check=stall_check, clock=clock, runs=runs) if stall_check else None
        self._outages = OutageReporter(sinks=self._sinks, view=self, summary_interval=outage_summary_interval)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = self._running = False  # start() called; start() returned (informers all built)
        self._stopping = False
        self.failed_tasks: list[str] = []
        """Names of background tasks that died with an exception (logged when it happened)."""

    def _make_informer(self, watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        if self._build is not None:
            return self._build(watched, observer)
        assert self._factory is not None
        if watched.key in self._factory.informers:
            raise ValueError(f"the factory already has an informer for {watched.key}; the pipeline must "
                             "create it to observe its deliveries")
        # Named by its id, so that its logs' ``informer`` field is the metrics' ``informer`` label.
        return self._factory.informer_for(watched.key, observer=observer, page_size=self._page_size,
                                          use_watch_list=self._use_watch_list, name=watched.informer_id)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    async def start(self) -> None:
        """Loads checkpoints, starts sinks and informers and the background tasks. Returns at once
        (use :meth:`wait_for_sync` to wait for the caches)."""
        if self._started:
            raise RuntimeError("pipeline already started")
        self._started = True
        if self._start_sinks:
            for chain in self._sinks:
                await chain.start()
        remove_stale_spills(self._spill_directory, self._sinks)
        for watched in self._resources:
            await self._prepare(watched)
        if self._factory is not None:
            self._factory.start()
        chains = {c.name: c for c in self._sinks}
        for ident, inf in self._informers.items():
            if self._factory is None:
                self._spawn(f"informer:{ident}", inf.informer.run())
            for sink_name, reg in inf.registrations.items():
                chain = chains[sink_name]
                period = chain.delivery.resync_period
                if period > 0:
                    self._spawn(f"snapshot-timer:{ident}:{sink_name}", self._snapshot_timer(inf, reg, period))
                if (beat := chain.delivery.heartbeat_interval) > 0:
                    heartbeats = Heartbeats(inf=inf, sink=chain, cluster=self._cluster, clock=self._clock,
                                            interval=beat)
                    self._spawn(f"heartbeat:{ident}:{sink_name}", heartbeats.run())
            if self._snapshot_on_first_start and not inf.plan.resumed:
                self._spawn(f"first-snapshot:{ident}", self._first_snapshot(inf))
            if inf.bootstrap is not None:
                self._spawn(f"bootstrap:{ident}", inf.bootstrap.run(inf.listeners, inf.registrations))
        for ident, inf in self._informers.items():
            if inf.journal is not None:
                self._spawn(f"journal:{ident}", inf.journal.run())
        self._spawn("checkpoint-writer", self._writer.run(self._checkpoint_interval))
        if self._writer.group_commit is not None and self._store is not None:
            self._spawn("checkpoint-group-commit", self._writer.run_group_commit())
        if self._stalls is not None:
            self._spawn("stalled-watches", self._stalls.run())
        if self._outage_check > 0:
            self._spawn("sink-outages", self._outages.run(self._clock, self._outage_check))
        self._running = True

    async def _prepare(self, watched: WatchedResource) -> None:
        """One informer, from its resume plan (:mod:`bridge.delivery.resume_plan`), with its listeners."""
        ident = watched.informer_id
        chains = [chain for chain in self._sinks if routed(chain, watched)]
        start = await load_start(store=self._store, watched=watched, routed=[c.name for c in chains],
                                 clock=self._clock)
        plan, journal = start.plan, start.journal
        restart = RestartStage(plan, watched=watched, clock=self._clock, journal=journal)
        counts = InformerCounts(resource=watched.ref.qualified, on_event=self._on_event)
        observer = InformerObserver(tracker=restart.tracker, journal=journal, counts=counts,
                                    inferred=restart.delete_is_inferred)
        informer = self._make_informer(watched, observer)
        inf = InformerRun(watched=watched, informer=informer, observer=observer, plan=plan,
                          stale=list(start.stale))
        informer.set_watch_error_handler(inf.watch_failed)
        await restart.seed(inf)
        key, fetch = watched.key, self._fetch_object
        selected = key.label_selector or key.field_selector or key.namespace_selector
        exits = SelectorExits(fetch=functools.partial(fetch, watched)) if fetch and selected else None
        for chain in chains:
            self._attach(inf, restart, chain, exits)
        self._informers[ident] = inf

    def _attach(self, inf: InformerRun, restart: RestartStage, chain: DeliveryChain,
                exits: SelectorExits | None) -> None:
        """One sink's listener, delivering to its chain, with its part of the restart
        (:meth:`RestartStage.for_sink`)."""
        watched = inf.watched
        replay, bootstrap = restart.for_sink(chain.name, exits)
        listener = SinkListener(sink=chain, resource=watched.ref, cluster=self._cluster, clock=self._clock,
                                snapshot_prefix=watched.informer_id, tracker=inf.tracker, journal=inf.journal,
                                exits=exits, shard=(None if watched.shard is None
                                                    else (watched.shard.ordinal, watched.shard.total)),
                                bootstrap=bootstrap, replay=replay)
        restart.attached(chain.name, listener)
        reg = inf.informer.add_event_handler(listener, listener_options(chain, self._spill_directory,
                                                                         watched.informer_id, watched.ref))
        inf.registrations[chain.name] = reg
        inf.listeners[chain.name] = listener

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks[name] = asyncio.create_task(self._guard(name, coro), name=f"pipeline:{name}")

    async def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            if not self._stopping:
                self.failed_tasks.append(name)
                log.exception("pipeline task %s failed", name)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """True once every informer's cache has synced."""
        limit = self._sync_timeout if timeout is None else timeout
        results = await asyncio.gather(
            *(inf.informer.wait_for_cache_sync(limit) for inf in self._informers.values())
        )
        return all(results)

    def ready(self) -> bool:
        """Started (start() returned), not stopping, no reason not to be (:meth:`not_ready_reasons`)."""
        return not self._stopping and not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        """Why it is not ready: "starting" until :meth:`start` has built and started every informer
        (those not built yet have no reasons of their own), an informer that has not synced or cannot
        list or watch, a journal that cannot be written, a stalled watch, an unhealthy sink."""
        reasons = [] if self._running else ["starting"]
        for i, inf in self._informers.items():
            if why := inf.failing_now():
                reasons.append(f"informer {i} cannot list or watch: {why}")
            elif not inf.informer.has_synced():
                reasons.append(f"informer {i} not synced")
            if inf.journal is not None and inf.journal.last_error:
                reasons.append(f"journal of {i} cannot be written (new objects and deletes wait): "
                               f"{inf.journal.last_error}")
            if f"journal:{i}" in self.failed_tasks:
                reasons.append(f"journal writer of {i} failed (new objects and deletes wait)")
        reasons.extend(self.stalled())
        for s in self._sinks:
            if not s.healthy():
                backlog = self.sink_backlog(s.name)
                error = s.last_error
                reasons.append(f"sink {s.name} unhealthy" + (f": {error}" if error else "")
                               + f" ({backlog.depth} changes waiting, {backlog.spill_bytes} bytes spilled)")
        return reasons

    async def shutdown(self, deadline: float = 30.0) -> None:
        """Stops intake, drains the listeners, flushes the sinks, writes the final checkpoints and
        closes everything, within ``deadline`` seconds (event-loop time). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, deadline)

        def left() -> float:
            return max(0.0, end - loop.time())

        # The journal writers stay: the listeners draining may wait for them.
        await self._cancel_tasks(lambda name: not name.startswith(("informer:", "journal:")))
        self._stop_reflectors()
        await _within(left() * 0.5, [reg.listener.wait_drained() for inf in self._informers.values()
                                     for reg in inf.registrations.values()],
                      "shutdown: sink listeners did not drain in time; the unacked rest will be re-sent "
                      "after the restart")
        if self._sinks:
            flushes = await asyncio.gather(*(s.flush(left() * 0.5) for s in self._sinks),
                                           return_exceptions=True)
            for chain, ok in zip(self._sinks, flushes, strict=True):
                if ok is not True:
                    log.warning("shutdown: the sink did not flush everything (%r)", ok,
                                extra={"sink": chain.name})
        await self._writer.write()
        await _within(left() * 0.5, [inf.journal.idle() for inf in self._informers.values()
                                     if inf.journal is not None],
                      "shutdown: a known-object journal was not written in time; the next start reads "
                      "the previous one")
        await self._stop_informers(left)
        await self._close_sinks("shutdown")
        await self._close_store()

    async def abort(self) -> None:
        """Stops everything at once, without draining, flushing or writing a checkpoint: leadership
        was lost, so what is in flight is abandoned (the next leader re-sends it from the last
        checkpoint) and nothing more reaches a sink or the store: a store write under way in a
        thread finishes before this returns (:mod:`bridge.storage.store_io`), so a pipeline
        started next in this process never has its journal or checkpoint replaced by a late write
        of this one. Idempotent; may interrupt a :meth:`shutdown` under way."""
        self._stopping = True
        self._stop_reflectors()
        await self._close_sinks("abort")  # cancels their sends under way
        await self._stop_informers(lambda: 0.0)
        await self._close_store()

    def _stop_reflectors(self) -> None:
        for inf in self._informers.values():
            if inf.informer.reflector is not None:
                inf.informer.reflector.stop()

    async def _stop_informers(self, left: Callable[[], float]) -> None:
        """Shuts the informers and the factory down (``left()``: seconds each may take), then
        cancels every task."""
        await asyncio.gather(*(inf.informer.shutdown(left()) for inf in self._informers.values()),
                             return_exceptions=True)
        if self._factory is not None:
            await self._factory.shutdown(left())
        await self._cancel_tasks(lambda name: True)

    async def _close_sinks(self, when: str) -> None:
        if self._start_sinks:
            for chain in self._sinks:
                try:
                    await chain.close()
                except Exception:
                    log.exception("%s: closing sink %s failed", when, chain.name, extra={"sink": chain.name})

    async def _close_store(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()

    async def _cancel_tasks(self, which: Callable[[str], bool]) -> None:
        tasks = [t for name, t in self._tasks.items() if which(name)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {n: t for n, t in self._tasks.items() if not t.done()}

    # ---------------------------------------------------------------------------------------------
    # checkpoints

    def stalled(self) -> list[str]:
        """One line per informer whose watch stalled (:mod:`bridge.delivery.stall`)."""
        return self._stalls.reasons() if self._stalls is not None else []

    async def write_checkpoints(self) -> int:
        """Saves every informer whose acknowledged state moved since its last save; returns how
        many were written (:class:`~bridge.delivery.checkpoint_writer.CheckpointWriter`)."""
        return await self._writer.write()

    # ---------------------------------------------------------------------------------------------
    # snapshots

    async def _snapshot_timer(self, inf: InformerRun, reg: HandlerRegistration, period: float) -> None:
        while True:
            await self._clock.sleep(period)
            inf.informer.request_snapshot(reg)

    async def _first_snapshot(self, inf: InformerRun) -> None:
        while not inf.informer.has_synced():
            await inf.informer.wait_for_cache_sync(3600.0)
        inf.informer.request_snapshot(None)

    async def snapshot_now(self, resource: str | None = None, sink: str | None = None) -> list[str]:
        """Requests a snapshot of ``resource`` (any name a user may write; None = all) for every
        routed sink, or for ``sink`` alone (the others receive nothing); returns the informer ids.
        Unknown resource or sink, or a sink not routed that resource → LookupError."""
        if sink is not None and sink not in {s.name for s in self._sinks}:
            raise LookupError(f"no sink is called {sink!r}")
        targets = [inf for inf in self._informers.values()
                   if (resource is None or resource in inf.watched.names)
                   and (sink is None or sink in inf.registrations)]
        if not targets:
            if sink is not None:
                raise LookupError(f"sink {sink!r} receives no watched resource called {resource!r}"
                                  if resource else f"sink {sink!r} receives no watched resource")
            raise LookupError(f"no watched resource is called {resource!r}")
        for inf in targets:
            inf.informer.request_snapshot(inf.registrations[sink] if sink is not None else None)
        return [inf.watched.informer_id for inf in targets]


async def _within(seconds: float, waits: list[Awaitable[None]], late: str) -> None:
    """Awaits ``waits`` for at most ``seconds``; logs ``late`` as a warning when they take longer."""
    if not waits:
        return
    try:
        async with asyncio.timeout(seconds):
            await asyncio.gather(*waits)
    except TimeoutError:
        log.warning(late)


def _check(resources: Sequence[WatchedResource], sinks: Sequence[DeliveryChain],
           factory: SharedInformerFactory | None, build_informer: InformerBuilder | None,
           checkpoint_interval: float) -> None:
    """The pipeline's configuration errors, each as a ValueError naming what is wrong."""
    if (factory is None) == (build_informer is None):
        raise ValueError("give exactly one of factory or build_informer")
    if checkpoint_interval <= 0:
        raise ValueError(f"checkpoint_interval must be positive, got {checkpoint_interval}")
    ids = [w.informer_id for w in resources]
    if len(set(ids)) != len(ids):
        raise ValueError("the same resource scope is watched twice")
    names = [s.name for s in sinks]
    if len(set(names)) != len(names):
        raise ValueError(f"sink names must be unique, got {names}")
