"""The composition root of ``kube-event-bridge run``: configuration in, a running bridge out.

Builds, in order: logging and telemetry; the health/metrics endpoint (first, so probes answer while
the rest starts); the API client (:mod:`bridge.service.connections`); then, for each term (once, or
each time this replica starts leading, :mod:`bridge.service.leadership`), the watched resources as
discovery resolves them (:mod:`bridge.service.watched`) and this replica's share of them
(:mod:`bridge.service.replica_share`), and the term itself (:mod:`bridge.service.term`): the sinks,
each with its delivery chain (:mod:`bridge.service.chains`: metering, the events profile, fencing),
the checkpoint store, the informer factory and the pipeline.
With leader election, the pipeline runs only while this replica holds the Lease.

Shutdown (SIGTERM/SIGINT or a fatal error): stop intake, drain the listeners, flush every sink, write
the final checkpoint, close everything and only then release the Lease, all within
``shutdown_deadline`` (so that the next leader resumes from that checkpoint and re-sends nothing).

Lost leadership is not a shutdown but an abort: the sinks are fenced (the last stage of their chains,
:class:`~bridge.service.fencing.FenceStage`) the instant the renew deadline passes, the pipeline is
stopped without draining, flushing or checkpointing (the checkpoint store refuses writes as well),
and the process exits 1 so that the pod restarts as a standby. What was in flight is re-sent by the
next leader.

What this module keeps is the service's own state across terms: its role, the live pipeline and
chains (readiness and telemetry read them; the counts of an ended term are carried into the
telemetry's totals, so that exported counters never go down), and the initial-sync report.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import signal
from dataclasses import dataclass, field

from bridge.clock import Clock, RealClock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.errors import BridgeError, ConfigurationError
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import LeaderElector
from bridge.service import connections, replica_share
from bridge.service.api_waits import AheadOfServer
from bridge.service.config import BridgeConfig, load_config
from bridge.service.connections import fetch_object, lease_client_options
from bridge.service.health import HealthServer, Readiness
from bridge.service.leadership import LeaderCampaign
from bridge.service.logconfig import configure_logging
from bridge.service.parent_watch import watch_parent
from bridge.service.spill_lock import lock_spill_root, release_spill_root
from bridge.service.telemetry import Telemetry, TelemetrySnapshot
from bridge.service.term import Term
from bridge.service.validation import validate_sinks
from bridge.service.watched import resolve_watched
from bridge.service.workers import (
    WorkerPosition,
    for_worker,
    label_logs,
    resolve_workers,
    run_supervisor,
    worker_position,
)
from sinks.base import BaseSink
from sinks.contract import SinkConfigError

__all__ = ["BridgeService", "configure_gc", "fetch_object", "run_service", "validate_sinks"]

log = logging.getLogger(__name__)

# Their names before the connections had a module of their own (the CLI and tests use them).
_api_client = connections.api_client
_checkpoint_store = connections.checkpoint_store


def _filter_errors_of(chain: DeliveryChain) -> int | None:
    """The filter evaluation errors of the chain's sink (read from the sink itself, whatever the
    chain's stages); None for a sink without a CEL filter."""
    sink = chain.sink
    if not isinstance(sink, BaseSink) or sink.options.filter is None:
        return None  # the CEL filter is a BaseSink option: a sink of its own has none
    return sink.stats.filter_errors


@dataclass
class _State:
    role: str = "single"
    pipeline: BridgePipeline | None = None
    unresolved: dict[str, str] = field(default_factory=dict)
    sinks: list[DeliveryChain] = field(default_factory=list)


class BridgeService:
    """The bridge of one process (module docs): :meth:`run` serves until :attr:`stop_event`; whether
    it is ready is what :meth:`readiness` says (``/readyz``), asked whenever wanted."""

    def __init__(self, *, config: BridgeConfig, clock: Clock | None = None,
                 worker: WorkerPosition | None = None) -> None:
        self.config = config
        self.worker = worker
        """This process's position under a supervisor (``workers`` above 1), else None."""
        self._clock = clock or RealClock()
        self._state = _State(role="standby" if config.leader_election.enabled else "single")
        self.telemetry = Telemetry(
            service_name=config.telemetry.service_name,
            otlp_endpoint=config.telemetry.otlp_endpoint,
            trace_sample_ratio=config.telemetry.trace_sample_ratio,
            snapshot=self._telemetry_snapshot,
            leader=lambda: self._state.role in ("leader", "single"),
        )
        self.telemetry.set_filter_errors_source(self._filter_errors)
        self.health = HealthServer(
            host=config.server.host, port=config.server.port, readiness=self.readiness,
            metrics=self.telemetry.render_prometheus, metrics_render=self.telemetry.prepare_render,
            admin_host=config.server.admin_host,
            admin_port=config.server.admin_port, admin_token_file=config.server.admin_token_file,
            address_file=config.server.address_file,
        )
        self.stop_event = asyncio.Event()
        self.exit_code = 0
        self.elector: LeaderElector | None = None
        self._lease_client: ApiClient | None = None
        self.shard: tuple[int, int] | None = None
        """(ordinal, total) once resolved, when sharding is configured."""
        self.ahead_of_server = AheadOfServer(clock=self._clock)
        """Requests waiting on a resourceVersion the API server has not reached (readiness, logs)."""

    # --- probes and metrics ----------------------------------------------------------------------

    def readiness(self) -> Readiness:
        """Not ready ("stopping") from the stop event on (a signal, the supervisor gone), whatever the
        role: the pod leaves the Service's endpoints while the pipeline drains, flushes and writes its
        final checkpoint, until the endpoint closes. Liveness (``/healthz``) is not affected."""
        st = self._state
        if self.stop_event.is_set():
            return Readiness(False, ("stopping",), st.role)
        if st.role == "standby":
            return Readiness(True, (), "standby")
        reasons = [f"resource {name}: {why}" for name, why in st.unresolved.items()]
        reasons.extend(self.ahead_of_server.reasons())
        if st.pipeline is None:
            reasons.append("starting")
        else:  # "starting" as well until its start() has built every informer
            reasons.extend(st.pipeline.not_ready_reasons())
        return Readiness(not reasons, tuple(reasons), st.role)

    def _telemetry_snapshot(self) -> TelemetrySnapshot:
        # The pipeline's gauges, read at scrape time from the plain counters the per-event path keeps
        # (its listeners' outcomes, its received changes): nothing calls OpenTelemetry per event.
        p = self._state.pipeline
        return p.telemetry_snapshot() if p is not None else TelemetrySnapshot()

    def _filter_errors(self) -> dict[str, int]:
        """Each live sink's filter evaluation errors (sinks with a ``filter``), by name."""
        return {s.name: count for s in self._state.sinks if (count := _filter_errors_of(s)) is not None}

    def _retire(self, pipeline: BridgePipeline, sinks: list[DeliveryChain]) -> None:
        """Carries the counts of a pipeline that has ended into the telemetry's own totals, so that
        the exported counters never go down when leadership is lost and won again."""
        for key, gauges in pipeline.informer_gauges().items():
            labels = {"resource": gauges.resource or key, "informer": gauges.informer or key}
            for type_, count in gauges.received.items():
                self.telemetry.events_received.add(count, {**labels, "type": type_})
        for name, outcomes in pipeline.stats().sinks.items():
            for outcome, count in outcomes.items():
                self.telemetry.sink_events.add(count, {"sink": name, "outcome": outcome})
        for sink in sinks:
            errors = _filter_errors_of(sink)
            if errors:
                self.telemetry.filter_errors.add(errors, {"sink": sink.name})

    # --- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        """Runs until :attr:`stop_event` is set (signals set it); returns the exit code. The spill
        root is locked for the run (a worker shares its supervisor's lock instead), so that a second
        bridge on it, in this process or another, fails with :class:`ConfigurationError` before it
        removes anything there."""
        lock = None if self.worker is not None else lock_spill_root(self.config.checkpoint.spill_directory)
        try:
            return await self._run()
        finally:
            release_spill_root(lock)


    async def _run(self) -> int:
        await self.health.start()
        client: ApiClient | None = None
        try:
            client = _api_client(self.config, self._clock)
            self.telemetry.set_rate_limiter(client.rate_limiter)
            client.retry_observer = self.ahead_of_server
            if self.config.leader_election.enabled:
                await self._campaign(client)
            else:
                await self._lead(client)
        except ConfigurationError:
            raise
        except SinkConfigError as e:
            # Found only when the sink starts (credentials refused, a TLS file that does not parse).
            raise ConfigurationError(f"invalid configuration: {e}") from e
        except BridgeError as e:
            log.error("the bridge failed: %s", e)
            self.exit_code = 1
        finally:
            if client is not None:
                await client.close()
            if self._lease_client is not None:
                await self._lease_client.close()
            await self.health.stop()
            self.telemetry.shutdown()
        return self.exit_code

    async def _campaign(self, client: ApiClient) -> None:
        """Active/standby (:mod:`bridge.service.leadership`): leads while holding the Lease of this
        replica (of its shard, resolved before campaigning; of its node)."""
        if self._sharded and not self._by_node:
            await self._resolve_shard(client)
        self._lease_client = _api_client(self.config, self._clock, lease_client_options(self.config))
        campaign = LeaderCampaign(config=self.config, client=self._lease_client, clock=self._clock,
                                  stop_event=self.stop_event, lead=functools.partial(self._lead, client),
                                  shard=self.shard)
        self.elector = campaign.elector
        if await campaign.run() != 0:
            self.exit_code = 1
        if campaign.config_error is not None:
            raise campaign.config_error

    async def _lead(self, client: ApiClient, elector: LeaderElector | None = None) -> None:
        """One term (:mod:`bridge.service.term`): runs the pipeline until the stop event (then a
        graceful shutdown) or, with leader election, until cancelled because leadership ended (then
        an abort). Its chains and pipeline are the service's while it runs."""
        if self.stop_event.is_set():
            return
        st = self._state
        st.role = "leader" if elector is not None else "single"
        watched = await self._share(client, await resolve_watched(self.config, client, st.unresolved))
        term = Term(config=self.config, client=client, watched=watched, telemetry=self.telemetry,
                    clock=self._clock, elector=elector)
        st.sinks = term.chains
        st.pipeline = pipeline = await term.assemble()
        try:
            await term.run(self.stop_event, self.health, self._report_initial_sync)
        finally:
            # No await between these: a scrape sees the counts either live or carried, never both.
            self._retire(pipeline, term.chains)
            st.pipeline = None
            st.sinks = []
            st.role = "standby" if self.config.leader_election.enabled else "single"

    # --- this replica's share --------------------------------------------------------------------

    @property
    def _by_node(self) -> bool:
        return replica_share.by_node(self.config)

    @property
    def _sharded(self) -> bool:
        """Whether this replica runs a shard (:func:`~bridge.service.replica_share.is_sharded`)."""
        return replica_share.is_sharded(self.config, self.worker)

    async def _resolve_shard(self, client: ApiClient) -> tuple[int, int]:
        """This replica's (ordinal, total), resolved once (a standby resolves it before campaigning
        for its shard's Lease); from then on every exposed sample carries the shard's labels."""
        if self.shard is None:
            self.shard = await replica_share.resolve_shard(self.config, client, self.worker)
            self.telemetry.set_shard(*self.shard)
        return self.shard

    async def _share(self, client: ApiClient, watched: list[WatchedResource]) -> list[WatchedResource]:
        """This replica's share of the watched resources (:mod:`bridge.service.replica_share`)."""
        if self._by_node:
            return replica_share.node_share(self.config, watched)
        if self._sharded:
            ordinal, total = await self._resolve_shard(client)
            return replica_share.shard_share(self.config, watched, ordinal=ordinal, total=total)
        return watched

    async def _report_initial_sync(self, pipeline: BridgePipeline, every: float = 5.0,
                                   check: float = 0.05) -> None:
        """Logs each informer's sync and its duration as it happens, progress (objects listed, events
        delivered) every ``every`` seconds meanwhile, and the whole initial sync's duration, measured
        to within ``check`` seconds."""
        started = self._clock.now()

        def figures() -> dict[str, int]:
            st = pipeline.stats()
            return {
                "objects_cached": sum(len(i.get_indexer()) for i in pipeline.informers.values()),
                "events_delivered": sum(c.get("delivered", 0) for c in st.sinks.values()),
            }

        pending = dict(pipeline.informers)
        next_progress = started + every
        while True:
            for ident, informer in list(pending.items()):
                if informer.has_synced():
                    del pending[ident]
                    log.info("informer synced", extra={
                        "informer": ident, "objects_cached": len(informer.get_indexer()),
                        "seconds": round(self._clock.now() - started, 3)})
            if not pending:
                break
            await self._clock.sleep(check)
            if self._clock.now() >= next_progress:
                next_progress += every
                log.info("initial sync in progress", extra={**figures(), "informers_pending": len(pending)})
        log.info("initial sync done", extra={**figures(),
                                             "seconds": round(self._clock.now() - started, 3)})
        if _gc_tuned:
            # What the initial sync built lives as long as the process: move it out of the
            # collected generations so later collections do not scan it again.
            gc.collect()
            gc.freeze()


GC_THRESHOLDS = (50_000, 20, 100)
_gc_tuned = False


def configure_gc() -> None:
    """Raises the cyclic garbage collector's thresholds for a process that holds a large, long-lived
    cache: with the defaults (700, 10, 10) the collector keeps re-scanning the whole heap while new
    objects are decoded (measured: the initial sync of 100k Pods 1.6-2x slower; docs/performance.md).
    Reference counting still frees almost everything at once; only cycles wait longer. After each
    initial sync the cache built so far is frozen out of the collected generations."""
    global _gc_tuned
    gc.set_threshold(*GC_THRESHOLDS)
    _gc_tuned = True


def run_service(path: str | None) -> int:
    """``kube-event-bridge run``: load and validate the configuration, then serve until a signal."""
    config = load_config(path)
    configure_logging(config.logging.level, config.logging.format)
    worker = worker_position()
    if worker is None:
        workers = resolve_workers(config)
        validate_sinks(config)
        if workers > 1:
            # Before anything under the spill root is removed or used; the workers share this lock
            # (one process alone takes it in BridgeService.run).
            lock = lock_spill_root(config.checkpoint.spill_directory)
            return run_supervisor(config, path, workers, pass_fds=() if lock is None else (lock,))
    else:
        label_logs(worker)
        config = for_worker(config, worker)
        validate_sinks(config)
    for name, what in config.checkpoint.insecure_settings():  # the sinks warn as they start
        log.warning("checkpoint.%s: %s (allow_insecure: true)", name, what)
    configure_gc()

    async def main() -> int:
        service = BridgeService(config=config, worker=worker)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop_event.set)
        watcher = watch_parent(service.stop_event) if worker is not None else None
        try:
            return await service.run()
        finally:
            if watcher is not None:
                watcher.cancel()

    return asyncio.run(main())
