"""Automatic sharding: this replica's ordinal from its pod name, the total from its StatefulSet.

A minimal resolution (kube-state-metrics' automatic sharding): the ordinal is the ``-<n>`` suffix of
the pod name (``POD_NAME``, else ``HOSTNAME``), the total the StatefulSet's ``spec.replicas`` read
through the API (``get`` on ``apps/v1`` statefulsets). Values given as integers are used as they are.
"""

from __future__ import annotations

import os
import re

from bridge.errors import ApiError, ConfigurationError
from bridge.kube.apiclient import ApiClient
from bridge.service.config import ShardingConfig

__all__ = ["resolve"]

_ORDINAL = re.compile(r"^(?P<set>.+)-(?P<n>\d+)$")
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _pod_name() -> str:
    return os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or ""


def _pod_namespace() -> str:
    ns = os.environ.get("POD_NAMESPACE", "")
    if ns:
        return ns
    try:
        with open(_SA_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        return ""


async def resolve(config: ShardingConfig, client: ApiClient) -> tuple[int, int]:
    """(ordinal, total) of this replica; raises :class:`ConfigurationError` naming the field."""
    ordinal, total = config.ordinal, config.shards
    name = _pod_name()
    m = _ORDINAL.match(name)
    if ordinal == "auto":
        if m is None:
            raise ConfigurationError(f"invalid configuration: sharding.ordinal: \"auto\" needs a pod name "
                                     f"ending in -<n> (POD_NAME or HOSTNAME), got {name!r}")
        ordinal = int(m.group("n"))
    if total == "auto":
        statefulset = config.statefulset or (m.group("set") if m is not None else "")
        namespace = config.namespace or _pod_namespace()
        if not statefulset or not namespace:
            raise ConfigurationError("invalid configuration: sharding.shards: \"auto\" needs the "
                                     "StatefulSet's name and namespace (sharding.statefulset, "
                                     "sharding.namespace, or a pod name ending in -<n> and its namespace)")
        try:
            sts = await client.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{statefulset}",
                                   context=f"reading StatefulSet {namespace}/{statefulset}")
        except ApiError as e:
            raise ConfigurationError(f"invalid configuration: sharding.shards: \"auto\": {e}") from e
        replicas = (sts.get("spec") or {}).get("replicas", 1)
        total = int(replicas) if isinstance(replicas, int) and replicas > 0 else 1
    if not 0 <= ordinal < total:
        raise ConfigurationError(f"invalid configuration: sharding.ordinal: {ordinal} is not a shard of "
                                 f"{total} (ordinals run from 0 to {total - 1})")
    return ordinal, total
