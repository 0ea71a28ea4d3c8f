"""Automatic sharding: this replica's ordinal and the number of shards, from its StatefulSet.

kube-state-metrics' automatic sharding runs the replicas as a StatefulSet and reads both numbers
from the cluster instead of the command line: the ordinal from the pod's name (a StatefulSet names
its pods ``<statefulset>-<ordinal>``) and the total from the StatefulSet's ``spec.replicas``. A
scale of the StatefulSet then reshards by itself: every pod is restarted by the rollout of the new
replica count, reads the new total and takes the share that is now its own.

:func:`resolve` does the same for the ``sharding`` section of the configuration, where ``shards``
and ``ordinal`` are each an integer or ``"auto"``:

* ``ordinal: auto`` takes the ``-<n>`` suffix of the pod name (``POD_NAME``, set by the chart from
  the downward API; else the hostname, which a StatefulSet pod's is).
* ``shards: auto`` GETs ``apps/v1`` ``statefulsets/<name>`` in the pod's namespace and reads
  ``spec.replicas`` (1 when absent, as the API server defaults it). ``<name>`` is
  ``sharding.statefulset``, else the pod name without its ``-<n>`` suffix; the namespace is
  ``sharding.namespace``, else ``POD_NAMESPACE``, else the service account's namespace file.

Whatever cannot work is a :class:`ShardingConfigError` (a
:class:`~bridge.errors.ConfigurationError`: the command exits 2) naming the field to fix: a pod name
without an ordinal, a StatefulSet that is missing or that RBAC does not let the bridge read (the
message spells out the missing rule), an ordinal not below the total. Other API failures (the
server unreachable, a 5xx) are raised as they are: they are not the configuration's fault, and the
pod is restarted.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from bridge.errors import ConfigurationError, ForbiddenError, NotFoundError
from bridge.kube.apiclient import ApiClient

__all__ = [
    "AUTO",
    "SERVICEACCOUNT_NAMESPACE_FILE",
    "ShardingConfigError",
    "ShardingSettings",
    "pod_ordinal",
    "resolve",
]

AUTO = "auto"
"""The value of ``sharding.shards`` / ``sharding.ordinal`` that asks for automatic sharding."""

SERVICEACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""The pod's namespace as the kubelet mounts it with the service account token."""

_ORDINAL_SUFFIX = re.compile(r"^(?P<set>.+)-(?P<ordinal>0|[1-9][0-9]*)$")


class ShardingSettings(Protocol):
    """The ``sharding`` section of the configuration, as far as :func:`resolve` reads it."""

    @property
    def shards(self) -> int | str:
        """The number of shards (>= 1), or ``"auto"``: the StatefulSet's ``spec.replicas``."""

    @property
    def ordinal(self) -> int | str:
        """This replica's shard (0 to shards - 1), or ``"auto"``: the pod name's ``-<n>`` suffix."""

    @property
    def statefulset(self) -> str | None:
        """The StatefulSet read for ``shards: auto``; empty: the pod name without ``-<n>``."""

    @property
    def namespace(self) -> str | None:
        """The StatefulSet's namespace; empty: the pod's own."""


class ShardingConfigError(ConfigurationError):
    """The sharding settings cannot be resolved here; the message names the field and the fix."""


def pod_ordinal(pod_name: str) -> tuple[str, int] | None:
    """``("keb", 2)`` for a StatefulSet pod named ``keb-2``; None when the name has no ordinal."""
    m = _ORDINAL_SUFFIX.match(pod_name)
    if m is None:
        return None
    return m.group("set"), int(m.group("ordinal"))


def _is_auto(value: int | str) -> bool:
    return isinstance(value, str) and value == AUTO


def _as_int(value: int | str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardingConfigError(f"{field}: expected an integer or {AUTO!r}, got {value!r}")
    return value


def _pod_name(environ: Mapping[str, str], hostname: Callable[[], str]) -> str:
    return environ.get("POD_NAME", "").strip() or hostname()


def _namespace(sharding: ShardingSettings, environ: Mapping[str, str], namespace_file: Path) -> str:
    if sharding.namespace:
        return sharding.namespace
    if environ.get("POD_NAMESPACE", "").strip():
        return environ["POD_NAMESPACE"].strip()
    try:
        found = namespace_file.read_text().strip()
    except OSError:
        found = ""
    if not found:
        raise ShardingConfigError(
            "sharding.namespace: shards: auto reads the StatefulSet in the pod's namespace, which is "
            f"unknown here (no POD_NAMESPACE and no {namespace_file}); set sharding.namespace")
    return found


async def _statefulset_replicas(api: ApiClient, namespace: str, name: str) -> int:
    path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/statefulsets/{quote(name, safe='')}"
    where = f"StatefulSet {namespace}/{name}"
    try:
        sts = await api.get(path, context=f"get {where}")
    except NotFoundError as e:
        raise ShardingConfigError(
            f"sharding.shards: auto reads spec.replicas of the {where}, which does not exist; run the "
            "bridge as that StatefulSet's pod, or name it in sharding.statefulset (and "
            "sharding.namespace), or set sharding.shards to a number") from e
    except ForbiddenError as e:
        raise ShardingConfigError(
            f"sharding.shards: auto needs to read the {where}, and RBAC forbids it: grant the bridge's "
            f"service account a Role in namespace {namespace} with the rule "
            f'{{apiGroups: ["apps"], resources: ["statefulsets"], resourceNames: ["{name}"], '
            f'verbs: ["get"]}} (the chart does so in its StatefulSet mode), or set sharding.shards '
            f"to a number ({e})") from e
    spec = sts.get("spec")
    replicas = spec.get("replicas", 1) if isinstance(spec, dict) else 1
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ShardingConfigError(f"sharding.shards: the {where} has spec.replicas {replicas!r}, "
                                  "not a number of shards")
    return replicas


def _ordinal(sharding: ShardingSettings, env: Mapping[str, str],
             hostname: Callable[[], str]) -> tuple[int, str, str | None]:
    """``(ordinal, pod name, StatefulSet name)``: with ``ordinal: auto`` from the pod name (and the
    StatefulSet's name with it), else the configured number (and "", None)."""
    if not _is_auto(sharding.ordinal):
        ordinal = _as_int(sharding.ordinal, "sharding.ordinal")
        if ordinal < 0:
            raise ShardingConfigError(f"sharding.ordinal: must be 0 or more, got {ordinal}")
        return ordinal, "", None
    pod = _pod_name(env, hostname)
    parsed = pod_ordinal(pod)
    if parsed is None:
        raise ShardingConfigError(
            f"sharding.ordinal: auto takes the ordinal from a StatefulSet pod's name "
            f"(<statefulset>-<n>), and the pod name {pod!r} has none (POD_NAME, else the "
            "hostname); run the bridge as a StatefulSet or set sharding.ordinal to a number")
    pod_set, ordinal = parsed
    return ordinal, pod, pod_set


def _statefulset_of_pod(pod: str, pod_set: str | None, env: Mapping[str, str],
                        hostname: Callable[[], str]) -> tuple[str, str]:
    """``(pod name, StatefulSet name)`` for ``shards: auto`` without ``sharding.statefulset``: the
    pod name without its ``-<n>`` suffix (``pod_set`` when the ordinal was read from it already)."""
    if pod_set is not None:
        return pod, pod_set
    pod = pod or _pod_name(env, hostname)
    parsed = pod_ordinal(pod)
    if parsed is None:
        raise ShardingConfigError(
            "sharding.statefulset: shards: auto reads the StatefulSet, whose name comes "
            f"from the pod name without its -<n> suffix, and the pod name {pod!r} has "
            "none; set sharding.statefulset or sharding.shards")
    return pod, parsed[0]


async def resolve(
    sharding: ShardingSettings,
    api: ApiClient,
    *,
    environ: Mapping[str, str] | None = None,
    hostname: Callable[[], str] = socket.gethostname,
    namespace_file: Path = SERVICEACCOUNT_NAMESPACE_FILE,
) -> tuple[int, int]:
    """This replica's ``(ordinal, total)``: fixed numbers as they are, ``"auto"`` ones from the pod
    name and the StatefulSet (see the module docs); the API is asked only for ``shards: auto``.

    ``environ`` (default ``os.environ``), ``hostname`` and ``namespace_file`` are where the pod's
    name and namespace are looked up. Raises :class:`ShardingConfigError` naming the field when the
    result cannot be used; any other API error as it is.
    """
    env = os.environ if environ is None else environ
    ordinal, pod, pod_set = _ordinal(sharding, env, hostname)
    total: int
    if _is_auto(sharding.shards):
        name = sharding.statefulset or ""
        if not name:
            pod, name = _statefulset_of_pod(pod, pod_set, env, hostname)
        namespace = _namespace(sharding, env, namespace_file)
        total = await _statefulset_replicas(api, namespace, name)
        if ordinal >= total:
            raise ShardingConfigError(
                f"sharding.ordinal: this pod's ordinal {ordinal} is not below the "
                f"StatefulSet {namespace}/{name}'s spec.replicas ({total}), the number of shards: the "
                "StatefulSet is being scaled down and this pod is on its way out (or sharding.ordinal "
                "names a shard that does not exist)")
    else:
        total = _as_int(sharding.shards, "sharding.shards")
        if total < 1:
            raise ShardingConfigError(f"sharding.shards: must be 1 or more, got {total}")
        if ordinal >= total:
            field = "sharding.shards" if _is_auto(sharding.ordinal) else "sharding.ordinal"
            raise ShardingConfigError(
                f"{field}: the ordinal {ordinal}"
                f"{f' (from the pod name {pod!r})' if pod else ''} must be below sharding.shards "
                f"({total}); the shards are numbered 0 to {total - 1}")
    return ordinal, total
