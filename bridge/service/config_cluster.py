"""The configuration of what the bridge watches and how its replicas share it: the API server
(``kubernetes:``), the watched resources (``resources:``), sharding (``sharding:``) and leader election
(``leader_election:``). Part of :class:`~bridge.service.config.BridgeConfig`."""

from __future__ import annotations

import os
import re
import socket
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from bridge.kube.labels import (
    SelectorError,
    check_field_selector_fields,
    parse_field_selector,
    parse_label_selector,
    supported_field_labels,
)
from bridge.service.config_section import Section

__all__ = [
    "NODE_NAME_ENV",
    "RESOURCE_PATTERN",
    "KubernetesConfig",
    "LeaderElectionConfig",
    "ResourceConfig",
    "ShardingConfig",
]

RESOURCE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(/[a-z0-9]+)?$"
"""What kubectl accepts as a resource: ``pods``, ``po``, ``Pod``, ``deployments.apps/v1``."""



class KubernetesConfig(Section):
    """How to reach the API server."""

    kubeconfig: str | None = None
    """Path to a kubeconfig; None = in-cluster service account when available, else ~/.kube/config."""
    context: str | None = None
    in_cluster: Literal["auto", "true", "false"] = "auto"
    page_size: int = Field(default=500, ge=1, le=100_000)
    """Items per list page. Set explicitly, every list and relist is paginated at it (client-go's
    ``WatchListPageSize``); left unset, lists of the latest state use 500 and a relist at a known
    resourceVersion is unpaginated, so that the API server's watch cache can answer it."""
    watch_list: bool = False
    """Use WatchList streaming (sendInitialEvents) when the server supports it."""
    qps: float = 50.0
    """Client-side rate limit of the API client, requests a second over time (client-go's ``QPS``);
    a negative value turns it off. Lists, relists, discovery and the bridge's GETs are metered; the
    opening of a watch is not (as in client-go). See docs/configuration.md."""
    burst: int = 100
    """Requests the rate limit lets through at once (client-go's ``Burst``)."""
    stall_after: float = Field(default=300.0, ge=0)
    """Seconds an informer's watch may deliver nothing (no event, no bookmark) before the server is
    asked, with a ``limit=1`` list, whether the resource moved meanwhile; if it did, the watch is
    reported stalled (a WARNING, ``/readyz``, ``keb_informer_stalled``) until it delivers again. Keep
    it above the server's bookmark period (about a minute). 0 = off."""

    @field_validator("qps")
    @classmethod
    def _qps_not_zero(cls, v: float) -> float:
        if v == 0:
            raise ValueError("0 would never send a request: give a positive rate (requests a second), "
                             "or a negative one (-1) to turn the client-side rate limit off")
        return v

    @model_validator(mode="after")
    def _burst_with_qps(self) -> KubernetesConfig:
        if self.qps > 0 and self.burst < 1:
            raise ValueError(f"burst: must be at least 1 while qps is positive (got {self.burst})")
        return self

    @property
    def configured_page_size(self) -> int | None:
        """``page_size`` if the configuration sets it (the informers then page every relist at it),
        else None (the informers' default: see ``page_size``)."""
        return self.page_size if "page_size" in self.model_fields_set else None


class ResourceConfig(Section):
    """One watched resource: ``pods``, ``deployments.apps``, ``widgets.example.com/v1``."""

    resource: str = Field(min_length=1, pattern=RESOURCE_PATTERN)
    namespace: str = ""
    """"" = every namespace (or a cluster-scoped resource)."""
    label_selector: str = ""
    field_selector: str = ""
    namespace_selector: str = ""
    """A label selector on namespaces: the resource is watched once, cluster-wide, and only the
    objects of namespaces whose labels match are kept; a namespace that starts or stops matching
    makes its objects enter or leave (docs/configuration.md, "Namespace selector")."""
    sharding: Literal["object", "resource"] | None = None
    """How this resource is split across shards (``sharding.strategy`` when unset): ``object``
    (every shard watches it and keeps the objects whose uid hashes to it) or ``resource`` (one shard
    watches it whole). See docs/sharding.md."""
    profile: Literal["events"] | None = None
    """``events``: Kubernetes Events treated as such (docs/events.md): routing attributes,
    enrichment, coalescing, the Events counter. Only for core ``events`` or ``events.events.k8s.io``."""

    @field_validator("profile")
    @classmethod
    def _profile_fits(cls, v: str | None, info: ValidationInfo) -> str | None:
        name = str(info.data.get("resource") or "")
        plural = name.split("/", 1)[0].split(".", 1)[0].lower()
        if v == "events" and plural not in ("events", "event", "ev"):
            raise ValueError(f"profile 'events' applies to Kubernetes Events (events, "
                             f"events.events.k8s.io), not to {name!r}")
        return v

    @field_validator("label_selector")
    @classmethod
    def _label_selector_parses(cls, v: str) -> str:
        try:
            parse_label_selector(v)
        except SelectorError as e:
            raise ValueError(str(e)) from e
        return v

    @field_validator("namespace_selector")
    @classmethod
    def _namespace_selector_parses(cls, v: str, info: ValidationInfo) -> str:
        try:
            parse_label_selector(v)
        except SelectorError as e:
            raise ValueError(str(e)) from e
        if v and info.data.get("namespace"):
            raise ValueError(f"with namespace {info.data['namespace']!r} the resource is watched in "
                             "one namespace; a namespace_selector picks namespaces of a cluster-wide "
                             "watch: give one or the other")
        return v

    @field_validator("field_selector")
    @classmethod
    def _field_selector_parses(cls, v: str, info: ValidationInfo) -> str:
        """The grammar, and for a built-in resource the fields the API server supports, with the
        message the server would answer the list with."""
        try:
            selector = parse_field_selector(v)
            group, resource = _builtin_group_resource(str(info.data.get("resource") or ""))
            if resource:
                check_field_selector_fields(selector, group=group, resource=resource)
        except SelectorError as e:
            raise ValueError(str(e)) from e
        return v


_CORE_RESOURCES = frozenset({
    "pods", "nodes", "namespaces", "secrets", "events", "replicationcontrollers", "configmaps", "services",
    "serviceaccounts", "endpoints", "persistentvolumes", "persistentvolumeclaims", "limitranges",
    "resourcequotas", "podtemplates",
})


def _builtin_group_resource(name: str) -> tuple[str, str]:
    """``(group, resource)`` of a resource name as configured (``pods``, ``jobs.batch``,
    ``jobs.batch/v1``), or ``("", "")`` when it is not certainly a built-in resource (a short name,
    a custom resource: discovery and the server decide those)."""
    plural, _, group = name.split("/", 1)[0].partition(".")
    if not group:
        return ("", plural) if plural in _CORE_RESOURCES else ("", "")
    return (group, plural) if supported_field_labels(group, plural) is not None else ("", "")


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
NODE_NAME_ENV = "NODE_NAME"
"""Where the ``node`` strategy reads its node by default: the chart's DaemonSet sets it from the
downward API (``fieldRef: spec.nodeName``)."""


class ShardingConfig(Section):
    """Splitting the watched resources across replicas (docs/sharding.md)."""

    shards: int | Literal["auto"] = 1
    """How many replicas share the work; ``auto``: the StatefulSet's ``spec.replicas``."""
    ordinal: int | Literal["auto"] = 0
    """This replica's shard, 0 … shards-1; ``auto``: the ``-<n>`` suffix of the pod name."""
    strategy: Literal["object", "resource", "node"] = "object"
    """The default of every resource: ``object`` (by uid hash) or ``resource`` (whole resources);
    ``node``: one replica per node watches the Pods bound to its node (a DaemonSet), and one
    designated replica (``unscheduled``) the Pods bound to none and every other resource."""
    statefulset: str = ""
    """For ``auto``: the StatefulSet's name ("" = the pod name without its ``-<n>`` suffix)."""
    namespace: str = ""
    """For ``auto``: the StatefulSet's namespace ("" = the pod's own)."""
    node_name: str = ""
    """``node`` strategy: the node whose Pods this replica watches ("" = ``$NODE_NAME``)."""
    unscheduled: bool = False
    """``node`` strategy: this replica is the designated one, watching the Pods no node is bound to
    (``spec.nodeName=""``) and the resources that are not Pods."""

    @model_validator(mode="before")
    @classmethod
    def _node_from_environment(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("strategy") == "node" and not data.get("node_name") \
                and not data.get("unscheduled"):
            data = {**data, "node_name": os.environ.get(NODE_NAME_ENV, "")}
        return data

    @field_validator("shards")
    @classmethod
    def _shards_positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be at least 1 (or \"auto\"), got {v}")
        return v

    @field_validator("ordinal")
    @classmethod
    def _ordinal_not_negative(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must be 0 or more (or \"auto\"), got {v}")
        return v

    @model_validator(mode="after")
    def _ordinal_below_shards(self) -> ShardingConfig:
        if isinstance(self.shards, int) and isinstance(self.ordinal, int) and self.ordinal >= self.shards:
            raise ValueError(f"ordinal: {self.ordinal} is not a shard of {self.shards} "
                             f"(ordinals run from 0 to {self.shards - 1})")
        return self

    @model_validator(mode="after")
    def _node_strategy(self) -> ShardingConfig:
        if self.strategy != "node":
            if self.node_name or self.unscheduled:
                field = "node_name" if self.node_name else "unscheduled"
                raise ValueError(f"{field}: only for strategy: node (got strategy: {self.strategy})")
            return self
        counted = {"shards", "ordinal", "statefulset", "namespace"} & self.model_fields_set
        if counted:
            raise ValueError(f"{sorted(counted)[0]}: strategy: node has one replica per node and "
                             "counts no shards; remove it")
        if self.unscheduled and self.node_name:
            raise ValueError("node_name: the replica with unscheduled: true watches the Pods bound to "
                             "no node; give it no node_name")
        if not self.unscheduled:
            if not self.node_name:
                raise ValueError(f"node_name: empty and ${NODE_NAME_ENV} is not set: set it from the "
                                 "downward API (fieldRef: spec.nodeName), or give unscheduled: true "
                                 "to the one replica that owns the Pods bound to no node")
            if not _NODE_NAME.fullmatch(self.node_name):
                raise ValueError(f"node_name: {self.node_name!r} is not a node name (lowercase letters, "
                                 "digits, '-' and '.')")
        return self

    @property
    def enabled(self) -> bool:
        """Whether this replica may be one of several shards counted by ordinal (``auto``, or more
        than one shard); the ``node`` strategy counts none."""
        if self.strategy == "node":
            return False
        return self.shards == "auto" or self.ordinal == "auto" or self.shards > 1

    @property
    def node_field_selector(self) -> str:
        """``node`` strategy: the field selector that scopes this replica's Pods."""
        return f"spec.nodeName={'' if self.unscheduled else self.node_name}"


class LeaderElectionConfig(Section):
    enabled: bool = False
    namespace: str = "default"
    name: str = "kube-event-bridge"
    identity: str = Field(default_factory=socket.gethostname)
    lease_duration: float = Field(default=15.0, gt=0)
    renew_deadline: float = Field(default=10.0, gt=0)
    retry_period: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _durations_ordered(self) -> LeaderElectionConfig:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > 1.2 * self.retry_period:
            raise ValueError("renew_deadline must be greater than 1.2 * retry_period")
        return self
