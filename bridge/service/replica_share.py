"""This replica's share of the watched resources (docs/sharding.md): by node, or by shard.

``strategy: node`` gives a replica the Pods bound to its node (the ``unscheduled`` replica: those
bound to none, and every other resource), by joining the node's field selector to the resource's
own. Otherwise, once the configuration says the bridge is sharded (:func:`is_sharded`), the
replica's ordinal and total are resolved (:mod:`bridge.service.sharding_auto`; a worker's shard is
nested in its replica's) and :func:`bridge.service.sharding.assign` splits the resources, by object
or whole, as each entry's ``sharding`` (or the section's ``strategy``) says.

Either way the scope is part of each informer's id, so each share has its own checkpoints.
"""

from __future__ import annotations

import dataclasses
import logging

from bridge.delivery.assembly import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.service import sharding_auto
from bridge.service.config import BridgeConfig
from bridge.service.sharding import assign
from bridge.service.workers import WorkerPosition

__all__ = ["by_node", "is_sharded", "node_share", "resolve_shard", "shard_share"]

log = logging.getLogger(__name__)


def by_node(config: BridgeConfig) -> bool:
    """``sharding.strategy: node``: each replica runs its node's Pods (:func:`node_share`)."""
    return config.sharding.strategy == "node"


def is_sharded(config: BridgeConfig, worker: WorkerPosition | None) -> bool:
    """A ``sharding`` section was written (even ``shards: 1``: going back to one replica takes
    the shards' checkpoints over), or a total or ordinal says so; or ``workers`` was written
    (each worker is a shard; ``workers: 1`` written takes the workers' checkpoints over)."""
    return ("sharding" in config.model_fields_set or config.sharding.enabled
            or "workers" in config.model_fields_set or worker is not None)


def node_share(config: BridgeConfig, watched: list[WatchedResource]) -> list[WatchedResource]:
    """``strategy: node`` (docs/sharding.md, "By node"): the Pods bound to this replica's node,
    or, on the ``unscheduled`` replica, the Pods bound to none and every other resource. The
    node's field selector joins the resource's own, so the informer id, and with it the
    checkpoint, is the node's."""
    sh = config.sharding
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


async def resolve_shard(config: BridgeConfig, client: ApiClient,
                        worker: WorkerPosition | None) -> tuple[int, int]:
    """This replica's (ordinal, total), or, under a supervisor, this worker's: worker w of N of
    replica r of R is shard r*N + w of R*N (docs/sharding.md)."""
    ordinal, total = await sharding_auto.resolve(config.sharding, client)
    if worker is not None:
        ordinal, total = worker.shard(ordinal, total)
    return ordinal, total


def shard_share(config: BridgeConfig, watched: list[WatchedResource], *, ordinal: int,
                total: int) -> list[WatchedResource]:
    """Shard ``ordinal`` of ``total``'s share of the watched resources (docs/sharding.md)."""
    strategies = {
        InformerKey(resource=r.resource, namespace=r.namespace, label_selector=r.label_selector,
                    field_selector=r.field_selector, namespace_selector=r.namespace_selector):
            r.sharding or config.sharding.strategy
        for r in config.resources
    }
    mine = assign(watched, ordinal=ordinal, total=total, strategies=strategies)
    log.info("shard %d of %d: running %d of %d resources (%s)", ordinal, total, len(mine), len(watched),
             ", ".join(f"{w.ref.qualified} by {strategies.get(w.key)}" for w in mine) or "none",
             extra={"shard": ordinal, "total_shards": total})
    return mine
