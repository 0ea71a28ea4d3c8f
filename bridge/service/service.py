"""The composition root of ``kube-event-bridge run``: configuration in, a running bridge out.

Builds, in order: logging and telemetry; the health/metrics endpoint (first, so probes answer while
the rest starts); the API client and discovery; the sinks, each with its delivery chain
(:mod:`bridge.service.chains`: metering, the events profile, fencing); the checkpoint store; the
informer factory and the pipeline.
With leader election, the pipeline runs only while this replica holds the Lease.

Shutdown (SIGTERM/SIGINT or a fatal error): stop intake, drain the listeners, flush every sink, write
the final checkpoint, close everything and only then release the Lease, all within
``shutdown_deadline`` (so that the next leader resumes from that checkpoint and re-sends nothing).

Lost leadership is not a shutdown but an abort: the sinks are fenced (the last stage of their chains,
:class:`~bridge.service.fencing.FenceStage`) the instant the renew deadline passes, the pipeline is
stopped without draining, flushing or checkpointing (the checkpoint store refuses writes as well),
and the process exits 1 so that the pod restarts as a standby. What was in flight is re-sent by the
next leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.clock import Clock, RealClock
from bridge.contracts import ListerWatcher
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.checkpoint_writer import GroupCommit
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.delivery.stall import StallCheck
from bridge.errors import ApiError, BridgeError, ConfigurationError, NotFoundError
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.informer.namespaces import NamespaceFilteredListerWatcher, NamespaceLabels, NamespaceScope
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.kube.discovery import APIResource, Discovery
from bridge.kube.leaderelection import FenceToken, LeaderElector
from bridge.kube.listwatch import HttpListerWatcher
from bridge.service import sharding_auto
from bridge.service.api_waits import AheadOfServer
from bridge.service.chains import delivery_chains
from bridge.service.config import BridgeConfig, load_config
from bridge.service.events.wiring import events_profile_for, set_replay_point
from bridge.service.health import HealthServer, Readiness
from bridge.service.logconfig import configure_logging
from bridge.service.parent_watch import watch_parent
from bridge.service.sharding import assign
from bridge.service.spill_lock import lock_spill_root, release_spill_root
from bridge.service.telemetry import Telemetry, TelemetrySnapshot
from bridge.service.validation import validate_sinks
from bridge.service.workers import (
    WorkerPosition,
    for_worker,
    label_logs,
    resolve_workers,
    run_supervisor,
    worker_position,
)
from bridge.storage.checkpoint import CheckpointStore, FileCheckpointStore
from sinks.base import BaseSink
from sinks.contract import ResourceRef, SinkConfigError

__all__ = ["BridgeService", "configure_gc", "run_service", "validate_sinks"]

log = logging.getLogger(__name__)


def _filter_errors_of(chain: DeliveryChain) -> int | None:
    """The filter evaluation errors of the chain's sink (read from the sink itself, whatever the
    chain's stages); None for a sink without a CEL filter."""
    sink = chain.sink
    if not isinstance(sink, BaseSink) or sink.options.filter is None:
        return None  # the CEL filter is a BaseSink option: a sink of its own has none
    return sink.stats.filter_errors


FenceSource = Callable[[], FenceToken | None]

RELEASE_TIMEOUT = 2.0
"""At most this long (never more than the renew deadline) is kept, out of ``shutdown_deadline``, for
releasing the Lease after the final checkpoint."""


def _checkpoint_store(config: BridgeConfig, client: ApiClient,
                      fence: FenceSource | None = None) -> CheckpointStore | None:
    cp = config.checkpoint
    if cp.store == "none":
        return None
    if cp.store == "file":
        return FileCheckpointStore(directory=cp.directory, fence=fence)
    if cp.store == "configmap":
        from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore

        return ConfigMapCheckpointStore(client=client, namespace=cp.namespace, name_prefix=cp.name_prefix,
                                        fence=fence, allow_shards=cp.shards,
                                        migrate_from=cp.migrate_from_namespace)
    from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore

    return NatsKvCheckpointStore(nats_url=cp.nats_url, bucket=cp.bucket, fence=fence,
                                 connect_options=cp.nats.connect_kwargs())


async def _server_rv(client: ApiClient, watched: WatchedResource) -> str:
    """The server's current resourceVersion for a watched resource: a ``limit=1`` list (metered by
    the client's rate limiter), for the stalled-watch check (:mod:`bridge.delivery.stall`)."""
    listed = await client.get(watched.api.path(watched.key.namespace or None), params={"limit": 1},
                              context=f"checking whether {watched.api.qualified} moved")
    return str(listed.get("metadata", {}).get("resourceVersion", ""))


def _api_client(config: BridgeConfig, clock: Clock, options: ApiClientOptions | None = None) -> ApiClient:
    k = config.kubernetes
    options = dataclasses.replace(options or ApiClientOptions(), qps=k.qps, burst=k.burst)
    if k.in_cluster == "true":
        return ApiClient.in_cluster(clock=clock, options=options)
    if k.in_cluster == "false":
        return ApiClient.from_kubeconfig(k.kubeconfig, k.context, clock=clock, options=options)
    return ApiClient.auto(kubeconfig=k.kubeconfig, context=k.context, clock=clock, options=options)


def _lease_client_options(config: BridgeConfig) -> ApiClientOptions:
    """Leader election has its own client, as client-go's components give theirs: every request is
    bounded by the renew deadline, and the User-Agent names the candidate (audit logs, and the
    simulator's per-client lease faults)."""
    le = config.leader_election
    base = ApiClientOptions()
    return ApiClientOptions(request_timeout=le.renew_deadline,
                            connect_timeout=min(base.connect_timeout, le.renew_deadline),
                            user_agent=f"{base.user_agent} leader-election/{le.identity}")


async def fetch_object(client: ApiClient, w: WatchedResource, namespace: str, name: str,
                       at: str = "") -> dict[str, Any]:
    """The object as the API server has it now (``at`` empty), or had it at exactly resourceVersion
    ``at`` (a list of that name with ``resourceVersionMatch=Exact``, a read of that one key); raises
    :class:`~bridge.errors.NotFoundError` when it does not (did not) exist. What a selector exit is
    asked (:class:`~bridge.delivery.selector_exit.SelectorExits`)."""
    context = f"reading {w.api.qualified} {namespace}/{name}" + (f" at {at}" if at else "")
    if not at:
        return await client.get(w.api.object_path(name, namespace or None), context=context)
    listed = await client.get(w.api.path(namespace or None), context=context, params={
        "fieldSelector": f"metadata.name={name}", "resourceVersion": at, "resourceVersionMatch": "Exact"})
    items = [i for i in listed.get("items") or () if isinstance(i, dict)]
    if not items:
        raise NotFoundError(f"{w.api.qualified} {namespace}/{name} did not exist at {at}", code=404)
    return items[0]


@dataclass
class _State:
    role: str = "single"
    pipeline: BridgePipeline | None = None
    unresolved: dict[str, str] = field(default_factory=dict)
    sinks: list[DeliveryChain] = field(default_factory=list)


class BridgeService:
    def __init__(self, *, config: BridgeConfig, clock: Clock | None = None,
                 on_ready: Callable[[], None] | None = None, worker: WorkerPosition | None = None) -> None:
        self.config = config
        self.worker = worker
        """This process's position under a supervisor (``workers`` above 1), else None."""
        self._clock = clock or RealClock()
        self._on_ready = on_ready
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
        self._config_error: ConfigurationError | None = None
        """A configuration error found while leading (with leader election): ends the service."""
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
            le = self.config.leader_election
            if le.enabled:
                if self._sharded and not self._by_node:
                    await self._resolve_shard(client)
                await self._campaign(client)
                if self._config_error is not None:
                    raise self._config_error
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
        """Active/standby: leads while holding the Lease. SIGTERM of a leader lets its work finish
        the graceful shutdown (final checkpoint included) before the Lease is released; a standby
        just stops campaigning."""
        le = self.config.leader_election
        self._lease_client = _api_client(self.config, self._clock, _lease_client_options(self.config))
        release_timeout = min(le.renew_deadline, RELEASE_TIMEOUT)
        # With sharding, each shard has its own Lease (one leader and its standbys per shard); by
        # node, each node's replica and the unscheduled owner have theirs.
        lease = le.name if self.shard is None else f"{le.name}-shard-{self.shard[0]}"
        if self._by_node:
            sh = self.config.sharding
            lease = f"{le.name}-unscheduled" if sh.unscheduled else f"{le.name}-node-{sh.node_name}"
        elector = LeaderElector(
            client=self._lease_client, namespace=le.namespace, name=lease, identity=le.identity,
            on_started_leading=lambda: self._lead_or_stop(client, elector),
            lease_duration=le.lease_duration, renew_deadline=le.renew_deadline,
            retry_period=le.retry_period, release_timeout=release_timeout, clock=self._clock,
        )
        self.elector = elector
        elector_task = asyncio.create_task(elector.run(), name="leader-election")
        stop_task = asyncio.create_task(self.stop_event.wait(), name="service-stop")
        try:
            await asyncio.wait({elector_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if self.stop_event.is_set() and not elector.is_leader():
                elector.stop()  # a standby (or a candidate still acquiring) stops at once
            # A leader's work sees the stop event itself: drain, final checkpoint, return; the
            # elector then releases the Lease.
            await elector_task
        finally:
            stop_task.cancel()
            elector.stop()
            await asyncio.gather(elector_task, stop_task, return_exceptions=True)
        if elector.lost:
            log.error("leadership lost; exiting so that the pod restarts as a standby")
            self.exit_code = 1
        elif not self.stop_event.is_set():
            log.error("leader work ended unexpectedly; exiting")
            self.exit_code = 1

    async def _lead_or_stop(self, client: ApiClient, elector: LeaderElector) -> None:
        """:meth:`_lead` for the leader elector, which only logs what its work raises: a configuration
        error found while leading (aliases found by discovery, a sink refusing its options) stops
        the service and is raised by :meth:`run`, as without leader election."""
        try:
            await self._lead(client, elector)
        except ConfigurationError as e:
            self._config_error = e
            self.stop_event.set()
        except SinkConfigError as e:
            self._config_error = ConfigurationError(f"invalid configuration: {e}")
            self.stop_event.set()

    async def _resolve(self, client: ApiClient) -> list[WatchedResource]:
        discovery = Discovery(client=client)
        watched: list[WatchedResource] = []
        # The configuration rejects aliases of one built-in resource; a custom resource's aliases
        # (widget, wdg, widgets.example.com) are known only once discovery has answered.
        seen: dict[tuple[str, str, str, str, str], int] = {}
        for i, r in enumerate(self.config.resources):
            try:
                api: APIResource = await discovery.resolve(r.resource)
            except ConfigurationError as e:
                # One bad resource must not stop the others: report it, keep it unready.
                log.error("cannot watch the resource: %s", e, extra={"resource": r.resource})
                self._state.unresolved[r.resource] = str(e)
                continue
            except ApiError as e:
                log.error("discovery failed: %s", e, extra={"resource": r.resource})
                self._state.unresolved[r.resource] = str(e)
                continue
            if r.namespace_selector and not api.namespaced:
                raise ConfigurationError(
                    f"invalid configuration: resources.{i}.namespace_selector: {api.qualified} is "
                    "cluster-scoped: its objects belong to no namespace")
            first = seen.setdefault((api.qualified, r.namespace, r.label_selector, r.field_selector,
                                     r.namespace_selector), i)
            if first != i:
                raise ConfigurationError(
                    f"invalid configuration: resources.{first} ({self.config.resources[first].resource!r}) "
                    f"and resources.{i} ({r.resource!r}) both name {api.qualified} in the same scope: "
                    "every change would be sent twice; keep one of them")
            key = InformerKey(resource=r.resource, namespace=r.namespace,
                              label_selector=r.label_selector, field_selector=r.field_selector,
                              namespace_selector=r.namespace_selector)
            ref = ResourceRef(group=api.group, version=api.version, resource=api.resource,
                              kind=api.kind, namespaced=api.namespaced)
            watched.append(WatchedResource(key=key, api=api, ref=ref))
        return watched

    @property
    def _sharded(self) -> bool:
        """A ``sharding`` section was written (even ``shards: 1``: going back to one replica takes
        the shards' checkpoints over), or a total or ordinal says so; or ``workers`` was written
        (each worker is a shard; ``workers: 1`` written takes the workers' checkpoints over)."""
        return ("sharding" in self.config.model_fields_set or self.config.sharding.enabled
                or "workers" in self.config.model_fields_set or self.worker is not None)

    async def _namespace_labels(self, client: ApiClient,
                                watched: list[WatchedResource]) -> NamespaceLabels | None:
        """The one Namespace watch of the resources with a ``namespace_selector`` (not started: the
        pipeline's start waits for its sync, so that their first list is filtered by the real set of
        namespaces); None when no resource has one."""
        if not any(w.key.namespace_selector for w in watched):
            return None
        api = await Discovery(client=client).resolve("namespaces")
        return NamespaceLabels(
            lister_watcher=HttpListerWatcher(client=client, resource=api, drop_managed_fields=True),
            clock=self._clock)

    @property
    def _by_node(self) -> bool:
        return self.config.sharding.strategy == "node"

    def _node_share(self, watched: list[WatchedResource]) -> list[WatchedResource]:
        """``strategy: node`` (docs/sharding.md, "By node"): the Pods bound to this replica's node,
        or, on the ``unscheduled`` replica, the Pods bound to none and every other resource. The
        node's field selector joins the resource's own, so the informer id, and with it the
        checkpoint, is the node's."""
        sh = self.config.sharding
        node_selector = sh.node_field_selector
        mine: list[WatchedResource] = []
        for w in watched:
            if w.api.group == "" and w.api.resource == "pods":
                selector = ",".join(s for s in (w.key.field_selector, node_selector) if s)
                mine.append(dataclasses.replace(
                    w, key=dataclasses.replace(w.key, field_selector=selector)))
            elif sh.unscheduled:
                mine.append(w)
        who = "the Pods bound to no node" if sh.unscheduled else f"node {sh.node_name}"
        log.info("sharded by node: running %d of %d resources for %s (%s)", len(mine), len(watched), who,
                 ", ".join(f"{w.ref.qualified} {w.key.field_selector}".strip() for w in mine) or "none",
                 extra={"node": sh.node_name or ""})
        return mine

    async def _resolve_shard(self, client: ApiClient) -> tuple[int, int]:
        """This replica's (ordinal, total), resolved once (a standby resolves it before campaigning
        for its shard's Lease); from then on every exposed sample carries the shard's labels."""
        if self.shard is None:
            ordinal, total = await sharding_auto.resolve(self.config.sharding, client)
            if self.worker is not None:
                # Worker w of N of replica r of R is shard r*N + w of R*N (docs/sharding.md).
                ordinal, total = self.worker.shard(ordinal, total)
            self.shard = (ordinal, total)
            self.telemetry.set_shard(ordinal, total)
        return self.shard

    async def _shard(self, client: ApiClient, watched: list[WatchedResource]) -> list[WatchedResource]:
        """This replica's share of the watched resources (docs/sharding.md)."""
        cfg = self.config
        ordinal, total = await self._resolve_shard(client)
        strategies = {
            InformerKey(resource=r.resource, namespace=r.namespace, label_selector=r.label_selector,
                        field_selector=r.field_selector, namespace_selector=r.namespace_selector):
                r.sharding or cfg.sharding.strategy
            for r in cfg.resources
        }
        mine = assign(watched, ordinal=ordinal, total=total, strategies=strategies)
        log.info("shard %d of %d: running %d of %d resources (%s)", ordinal, total, len(mine), len(watched),
                 ", ".join(f"{w.ref.qualified} by {strategies.get(w.key)}" for w in mine) or "none",
                 extra={"shard": ordinal, "total_shards": total})
        return mine

    async def _lead(self, client: ApiClient, elector: LeaderElector | None = None) -> None:
        """Runs the pipeline until the stop event (then a graceful shutdown) or, with leader
        election, until cancelled because leadership ended (then an abort)."""
        if self.stop_event.is_set():
            return
        self._state.role = "leader" if elector is not None else "single"
        cfg = self.config
        watched = await self._resolve(client)
        if self._by_node:
            watched = self._node_share(watched)
        elif self._sharded:
            watched = await self._shard(client, watched)
        events_profile = events_profile_for(cfg, watched, client=client, clock=self._clock,
                                            telemetry=self.telemetry)
        chains = delivery_chains(
            validate_sinks(cfg), telemetry=self.telemetry, clock=self._clock,
            events=(events_profile, cfg.events) if events_profile is not None else None,
            is_leader=elector.is_leader if elector is not None else None)
        self._state.sinks = chains
        fence: FenceSource | None = None
        shutdown_deadline = cfg.shutdown_deadline
        if elector is not None:
            fence = elector.fence_token
            shutdown_deadline = max(0.5, shutdown_deadline - elector.release_timeout)
        by_key = {w.key: w for w in watched}
        namespace_labels = await self._namespace_labels(client, watched)
        scopes: dict[str, NamespaceScope] = {}

        def lister_watcher(key: InformerKey) -> ListerWatcher:
            w = by_key[key]
            # A compact cache keeps objects as bytes from the wire on (see bridge.rawobject).
            lw = HttpListerWatcher(client=client, resource=w.api, namespace=key.namespace,
                                   label_selector=key.label_selector, field_selector=key.field_selector,
                                   raw_objects=cfg.cache.compact, drop_managed_fields=cfg.cache.compact,
                                   shard=w.shard)
            if not key.namespace_selector or namespace_labels is None:
                return lw
            scope = scopes.get(key.namespace_selector)
            if scope is None:
                scope = scopes[key.namespace_selector] = NamespaceScope(
                    selector=key.namespace_selector, labels=namespace_labels)
            return NamespaceFilteredListerWatcher(inner=lw, scope=scope)

        factory = SharedInformerFactory(lister_watcher_factory=lister_watcher, clock=self._clock,
                                        compact_cache=cfg.cache.compact)
        store = _checkpoint_store(cfg, client, fence)
        if events_profile is not None:
            await set_replay_point(events_profile, store, watched)
        pipeline = BridgePipeline(
            fetch_object=functools.partial(fetch_object, client),
            factory=factory, resources=watched, sinks=chains, checkpoint_store=store,
            cluster=cfg.cluster, checkpoint_interval=cfg.checkpoint.interval,
            stall_check=(StallCheck(after=cfg.kubernetes.stall_after,
                                    server_resource_version=functools.partial(_server_rv, client))
                         if cfg.kubernetes.stall_after else None),
            group_commit=(GroupCommit(events=cfg.checkpoint.commit_events,
                                      delay=cfg.checkpoint.group_commit_delay)
                          if cfg.checkpoint.commit_events else None),
            snapshot_on_first_start=cfg.snapshot.on_first_start, clock=self._clock,
            page_size=cfg.kubernetes.configured_page_size,
            use_watch_list=cfg.kubernetes.watch_list,
            spill_directory=cfg.checkpoint.spill_directory or None,
        )
        self._state.pipeline = pipeline
        self.health.set_snapshot_handler(pipeline.snapshot_now)
        progress: asyncio.Task[None] | None = None
        finished = False
        try:
            if namespace_labels is not None:
                await namespace_labels.start()
            await pipeline.start()
            progress = asyncio.create_task(self._report_initial_sync(pipeline), name="initial-sync-progress")
            await self.stop_event.wait()
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
            self.health.set_snapshot_handler(None)
            # Still leading: drain, flush and write the final checkpoint; the Lease is released only
            # after this returns. Losing leadership meanwhile cancels this task (then an abort).
            log.info("shutting down: stopping intake, draining, writing the final checkpoint",
                     extra={"deadline": shutdown_deadline})
            await pipeline.shutdown(shutdown_deadline)
            finished = True
        finally:
            if progress is not None:
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
            self.health.set_snapshot_handler(None)
            if not finished:
                if elector is not None:
                    log.warning("leadership ended: abandoning the work in flight without a checkpoint; "
                                "the next leader re-sends it")
                with contextlib.suppress(Exception):
                    await pipeline.abort()
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            if namespace_labels is not None:
                await namespace_labels.stop()
            if events_profile is not None:
                with contextlib.suppress(Exception):
                    await events_profile.close()
            # No await between these: a scrape sees the counts either live or carried, never both.
            self._retire(pipeline, chains)
            self._state.pipeline = None
            self._state.sinks = []
            self._state.role = "standby" if self.config.leader_election.enabled else "single"

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
