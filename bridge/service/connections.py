"""The service's connections, built from the configuration: the API client (and leader election's
own), the checkpoint store, and the two reads the pipeline asks of the API server beyond its
informers' list and watch (one object, now or at a resourceVersion; a resource's current
resourceVersion).

Each is built once per use and owned by its caller, who closes it: the service its API clients, a
term (:mod:`bridge.service.term`) its checkpoint store. Nothing here holds state of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge.clock import Clock
from bridge.delivery.assembly import WatchedResource
from bridge.errors import NotFoundError
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.service.config import BridgeConfig
from bridge.storage.checkpoint import CheckpointStore, FenceSource, FileCheckpointStore

__all__ = ["api_client", "checkpoint_store", "fetch_object", "lease_client_options", "server_rv"]


def api_client(config: BridgeConfig, clock: Clock, options: ApiClientOptions | None = None) -> ApiClient:
    """The API client the configuration describes (in-cluster, a kubeconfig, or whichever is there),
    with its rate limits; ``options`` for the rest (leader election's, :func:`lease_client_options`)."""
    k = config.kubernetes
    options = dataclasses.replace(options or ApiClientOptions(), qps=k.qps, burst=k.burst)
    if k.in_cluster == "true":
        return ApiClient.in_cluster(clock=clock, options=options)
    if k.in_cluster == "false":
        return ApiClient.from_kubeconfig(k.kubeconfig, k.context, clock=clock, options=options)
    return ApiClient.auto(kubeconfig=k.kubeconfig, context=k.context, clock=clock, options=options)


def lease_client_options(config: BridgeConfig) -> ApiClientOptions:
    """Leader election has its own client, as client-go's components give theirs: every request is
    bounded by the renew deadline, and the User-Agent names the candidate (audit logs, and the
    simulator's per-client lease faults)."""
    le = config.leader_election
    base = ApiClientOptions()
    return ApiClientOptions(request_timeout=le.renew_deadline,
                            connect_timeout=min(base.connect_timeout, le.renew_deadline),
                            user_agent=f"{base.user_agent} leader-election/{le.identity}")


def checkpoint_store(config: BridgeConfig, client: ApiClient,
                     fence: FenceSource | None = None) -> CheckpointStore | None:
    """The configured checkpoint store (None for ``store: none``), its writes fenced by ``fence``
    (the elector's lease token, with leader election)."""
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


async def server_rv(client: ApiClient, watched: WatchedResource) -> str:
    """The server's current resourceVersion for a watched resource: a ``limit=1`` list (metered by
    the client's rate limiter), for the stalled-watch check (:mod:`bridge.delivery.stall`)."""
    listed = await client.get(watched.api.path(watched.key.namespace or None), params={"limit": 1},
                              context=f"checking whether {watched.api.qualified} moved")
    return str(listed.get("metadata", {}).get("resourceVersion", ""))


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
