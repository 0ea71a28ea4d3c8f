"""The service's configuration: one YAML file, overridden by environment variables.

Loaded with pydantic-settings and validated completely at start, so that a mistake is reported once,
clearly, before anything connects anywhere. Sources, highest priority first:

1. environment variables prefixed ``KEB_``, nested with ``__`` (``KEB_CHECKPOINT__STORE=configmap``,
   ``KEB_LOGGING__LEVEL=debug``); a value that is a list or mapping (``KEB_RESOURCES``) is JSON;
2. the YAML file given with ``--config`` (or ``KEB_CONFIG_FILE``);
3. the defaults below.

Secrets never need to be written in the file: every sink option ending in ``_file`` (``token_file``,
``password_file``, ``hmac_secret_file``) reads a mounted Secret, and ``${file:/path}`` inside any
string is replaced by the file's content at load time.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
import weakref
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bridge.errors import ConfigurationError
from bridge.kube.labels import (
    SelectorError,
    check_field_selector_fields,
    parse_field_selector,
    parse_label_selector,
    supported_field_labels,
)
from bridge.service.config_masking import MASK, Origins, mask_config
from bridge.service.config_nats import NatsConnectionConfig, nats_insecure_settings
from bridge.service.config_yaml import safe_load_bounded
from bridge.service.events.config import EventsConfig
from bridge.service.resource_names import canonical_resource
from sinks.addresses import check_nats_url
from sinks.transport_security import refusal

__all__ = [
    "MASK",
    "BridgeConfig",
    "CacheConfig",
    "CheckpointConfig",
    "KubernetesConfig",
    "LeaderElectionConfig",
    "LoggingConfig",
    "ResourceConfig",
    "ServerConfig",
    "ShardingConfig",
    "SinkConfig",
    "TelemetryConfig",
    "check_secret_files",
    "format_validation_error",
    "load_config",
    "masked_dump",
]

ENV_PREFIX = "KEB_"
_FILE_REF = re.compile(r"\$\{file:([^}]+)\}")
_CLUSTER = re.compile(r"[A-Za-z0-9._~-]+")
SINK_NAME_PATTERN = r"^[a-z0-9]([a-z0-9_.-]*[a-z0-9])?$"
_SINK_NAME = re.compile(SINK_NAME_PATTERN)
RESOURCE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(/[a-z0-9]+)?$"
"""What kubectl accepts as a resource: ``pods``, ``po``, ``Pod``, ``deployments.apps/v1``."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesConfig(_Model):
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


class ResourceConfig(_Model):
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


class SinkConfig(BaseModel):
    """A sink: ``name`` and ``kind`` here, every other key is the sink kind's own option."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    kind: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name_is_dns_like(cls, v: str) -> str:
        if not _SINK_NAME.match(v):
            raise ValueError(f"sink name {v!r} must be lowercase letters, digits, '-', '_' or '.', "
                             "starting and ending with a letter or digit (it appears in metric labels)")
        return v

    def options(self) -> dict[str, Any]:
        """The kind-specific options (everything but name and kind)."""
        return dict(self.model_extra or {})


class CacheConfig(_Model):
    compact: bool = True
    """Keep objects as the API server's JSON bytes from the wire to the sinks (about their wire size in
    the cache; only name, namespace, uid and resourceVersion decoded; the rest decoded only when a
    filter, redaction or template reads it) instead of dict trees (several times the size, and more
    CPU per change). See docs/performance.md."""


class CheckpointConfig(_Model):
    store: Literal["file", "configmap", "nats-kv", "none"] = "file"
    directory: str = "./.kube-event-bridge/checkpoints"
    namespace: str = "default"
    """ConfigMap store: where the checkpoint ConfigMaps live."""
    migrate_from_namespace: str = ""
    """ConfigMap store: a namespace that held this store's checkpoints before (same ``name_prefix``;
    the chart's release namespace, when it moved them to a dedicated one). An informer without a
    checkpoint in ``namespace`` takes its checkpoint and journal from there: written here and read
    back, then deleted there. "" = none."""
    name_prefix: str = "kube-event-bridge-checkpoint"
    nats_url: str = "nats://127.0.0.1:4222"
    bucket: str = "kube-event-bridge-checkpoints"
    shards: bool = True
    """ConfigMap store: split a checkpoint larger than one ConfigMap (~900 KB) over shard ConfigMaps.
    Shard names are new on every save, so this needs ``get``/``delete`` on every ConfigMap of the
    namespace; off, the store touches only its own manifests (RBAC names them one by one) and a
    checkpoint too large for one ConfigMap fails to save, with an error saying so."""
    interval: float = Field(default=5.0, gt=0)
    """Seconds between checkpoint writes (and one on shutdown)."""
    commit_events: int = Field(default=1000, ge=0)
    """Group commit: the checkpoint follows the acknowledgements, written at once when the sinks
    acknowledged this many changes since the last write (0 = off: every ``interval`` only). What a
    SIGKILL makes the next start send again, per sink, is bounded by what it had in flight plus
    this (docs/delivery-contract.md)."""
    commit_delay: float | None = Field(default=None, gt=0)
    """Group commit: seconds an acknowledgement may stay unsaved (written then, whichever of
    ``commit_events`` and this comes first). Unset: 0.2, or 1 with the ConfigMap store (each write is
    API requests, within ``kubernetes.qps``)."""

    @property
    def group_commit_delay(self) -> float:
        """``commit_delay``, or its default for the store."""
        if self.commit_delay is not None:
            return self.commit_delay
        return 1.0 if self.store == "configmap" else 0.2
    spill_directory: str = "./.kube-event-bridge/spill"
    """Where each sink's spill (its backlog beyond ``buffer.capacity``) is written, one
    subdirectory per sink and informer; "" = no spill (a sink that falls behind degrades at once).
    Emptied at each start. It belongs to one bridge process, which locks it for its life: another
    one started on it exits with code 2 (bridge/service/spill_lock.py)."""

    nats: NatsConnectionConfig = NatsConnectionConfig()
    """NATS KV store: TLS and credentials of its connection (as the NATS sinks': user and
    password_file, token_file, nkey_seed_file, creds_file, tls_ca_file, tls_cert_file, tls_key_file,
    tls_hostname)."""
    allow_insecure: bool = False
    """NATS KV store: accept sending credentials in plaintext to a host other than loopback (warned
    about at start and by check-config)."""

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, v: str) -> str:
        return check_nats_url(v)

    def insecure_settings(self) -> list[tuple[str, str]]:
        """What weakens the store's transport security (only with ``store: nats-kv``)."""
        return nats_insecure_settings(self.nats_url, self.nats) if self.store == "nats-kv" else []

    @model_validator(mode="after")
    def _secure_unless_allowed(self) -> CheckpointConfig:
        settings = self.insecure_settings()
        if settings and not self.allow_insecure:
            raise ValueError(refusal(settings))
        return self


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
NODE_NAME_ENV = "NODE_NAME"
"""Where the ``node`` strategy reads its node by default: the chart's DaemonSet sets it from the
downward API (``fieldRef: spec.nodeName``)."""


class ShardingConfig(_Model):
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


class LeaderElectionConfig(_Model):
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


class ServerConfig(_Model):
    """The HTTP endpoint for /healthz, /readyz, /metrics, and the admin listener for /snapshot."""

    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    admin_host: str = "127.0.0.1"
    """The admin listener (mutating endpoints): loopback, reached with ``kubectl port-forward``."""
    admin_port: int = Field(default=8081, ge=0, le=65535)
    admin_token_file: str | None = None
    """A file holding a bearer token every admin request must carry (e.g. a mounted Secret);
    required when ``admin_host`` is not a loopback address."""
    address_file: str | None = None
    """Where the bound addresses of both listeners are written as JSON once they listen (``pid``,
    ``host``, ``port``, ``admin_host``, ``admin_port``): with ``port: 0`` / ``admin_port: 0`` the
    kernel picks the ports, and this file (or the ``endpoint listening`` log lines) says which."""

    @model_validator(mode="after")
    def _admin_protected(self) -> ServerConfig:
        loopback = self.admin_host in ("127.0.0.1", "::1", "localhost") or self.admin_host.startswith("127.")
        if not loopback and not self.admin_token_file:
            raise ValueError(f"admin_host {self.admin_host!r} is reachable from other pods: set "
                             "admin_token_file (a bearer token), or keep the default 127.0.0.1")
        if self.admin_token_file is not None:
            try:
                token = Path(self.admin_token_file).read_text().strip()
            except OSError as e:
                raise ValueError(
                    f"admin_token_file: cannot read {self.admin_token_file}: {e.strerror}") from e
            if not token:
                raise ValueError(f"admin_token_file: {self.admin_token_file} is empty")
        if self.port and self.port == self.admin_port and self.host == self.admin_host:
            raise ValueError("admin_port must differ from port")
        return self


class TelemetryConfig(_Model):
    otlp_endpoint: str | None = None
    """OTLP/HTTP endpoint for traces (needs the ``otlp`` extra); None = no trace export."""
    trace_sample_ratio: float = Field(default=0.01, ge=0.0, le=1.0)
    service_name: str = "kube-event-bridge"

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, v: str | None) -> str | None:
        if v is not None:
            parts = urllib.parse.urlsplit(v)
            try:
                _ = parts.port
            except ValueError:
                parts = parts._replace(netloc="")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{v!r} is not an http:// or https:// URL")
        return v


class LoggingConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class SnapshotConfig(_Model):
    on_first_start: bool = False
    """Emit a snapshot (begin, sync per object, end) when no checkpoint exists yet."""


def _no_default(schema: dict[str, Any]) -> None:
    """A field whose default is worked out at run time shows none in the JSON schema."""
    schema.pop("default", None)


class BridgeConfig(BaseSettings):
    """The whole configuration of ``kube-event-bridge run``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    cluster: str = Field(default="default", min_length=1)
    """Names the cluster in every event's CloudEvents ``source`` (``/clusters/{cluster}/...``), so
    it must be a URI path segment as written: letters, digits, ``-``, ``.``, ``_``, ``~``."""
    kubernetes: KubernetesConfig = KubernetesConfig()
    resources: list[ResourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(min_length=1)
    checkpoint: CheckpointConfig = CheckpointConfig()
    sharding: ShardingConfig = ShardingConfig()
    cache: CacheConfig = CacheConfig()
    snapshot: SnapshotConfig = SnapshotConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    server: ServerConfig = ServerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    logging: LoggingConfig = LoggingConfig()
    events: EventsConfig = EventsConfig()
    """How resources with ``profile: events`` are treated (docs/events.md)."""
    workers: (Annotated[int, WithJsonSchema({"type": "integer", "minimum": 1})] | Literal["auto"]
              | SkipJsonSchema[None]) = Field(
        default=None, json_schema_extra=_no_default)
    """Worker processes of this replica, each an object shard of its share (docs/sharding.md,
    "Workers"). Unset: the container's CPU limit rounded down, at least 1, and 1 without a CPU
    limit; ``auto``: the same, but without a limit the CPUs the process may run on. 1 is one process,
    as without workers."""
    shutdown_deadline: float = Field(default=25.0, gt=0)
    """Seconds SIGTERM may take: flush sinks and write the final checkpoint. Keep it below the pod's
    terminationGracePeriodSeconds."""

    @field_validator("workers")
    @classmethod
    def _workers_positive(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, bool) or (isinstance(v, int) and v < 1):
            raise ValueError(f"must be at least 1 (or \"auto\": the CPU limit), got {v}")
        return v

    @model_validator(mode="after")
    def _workers_written_as_a_value(self) -> BridgeConfig:
        # Unset means the CPU limit; written, it says how many (a null would be read as unset yet
        # turn the shard take-over on, as any written value does).
        if self.workers is None and "workers" in self.model_fields_set:
            raise ValueError("workers: must be a number of at least 1 or \"auto\" (leave it out for "
                             "the container's CPU limit)")
        return self

    @field_validator("cluster")
    @classmethod
    def _cluster_in_source(cls, v: str) -> str:
        # RFC 3986 unreserved characters: /clusters/{cluster}/... stays a valid URI-reference with
        # no escaping, and reads the same in every binding.
        if not _CLUSTER.fullmatch(v) or v in (".", ".."):
            raise ValueError(
                f"{v!r} cannot name the cluster in the CloudEvents source /clusters/{{cluster}}/...: "
                "use letters, digits, '-', '.', '_' or '~' (no spaces, slashes, '?', '#', '%' or "
                "non-ASCII letters)")
        return v

    @field_validator("resources")
    @classmethod
    def _resources_unique(cls, v: list[ResourceConfig]) -> list[ResourceConfig]:
        # Aliases of one resource (deploy, Deployment, deployments.apps) in one scope would start
        # two informers for it and send every change twice.
        seen: dict[tuple[str, str, str, str, str], int] = {}
        for i, r in enumerate(v):
            canonical = canonical_resource(r.resource)
            key = (canonical, r.namespace, r.label_selector, r.field_selector, r.namespace_selector)
            first = seen.setdefault(key, i)
            if first != i:
                scope = f"namespace {r.namespace!r}" if r.namespace else "all namespaces"
                raise ValueError(
                    f"resources.{first} ({v[first].resource!r}) and resources.{i} ({r.resource!r}) both "
                    f"name {canonical} in {scope} with the same selectors: every change would be sent "
                    "twice; keep one of them")
        return v

    @model_validator(mode="after")
    def _resources_under_node_strategy(self) -> BridgeConfig:
        if self.sharding.strategy != "node":
            return self
        for i, r in enumerate(self.resources):
            if r.sharding is not None:
                raise ValueError(f"resources.{i}.sharding: strategy: node decides where every resource "
                                 "runs (Pods per node, the rest on the unscheduled: true replica); "
                                 "remove it")
            if canonical_resource(r.resource) == "pods" and "spec.nodeName" in r.field_selector:
                raise ValueError(f"resources.{i}.field_selector: strategy: node sets spec.nodeName "
                                 "itself; remove it from the resource's field_selector")
        return self

    @field_validator("sinks")
    @classmethod
    def _sink_names_unique(cls, v: list[SinkConfig]) -> list[SinkConfig]:
        names = [s.name for s in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"sink names must be unique; repeated: {', '.join(dupes)}")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment over the file (passed as init kwargs by load_config) over defaults.
        return (env_settings, init_settings)


def _resolve_file_refs(value: Any, where: str, origins: Origins | None = None,
                       path: tuple[str | int, ...] = ()) -> Any:
    """Replaces ``${file:/path}`` in strings, recursively, by the (stripped) file content; records
    in ``origins`` where each was (``path``: so that check-config masks it)."""
    if isinstance(value, str):

        def read(m: re.Match[str]) -> str:
            file = Path(m.group(1))
            try:
                content = file.read_text().strip()
            except OSError as e:
                raise ConfigurationError(f"{where}: cannot read {file}: {e.strerror}") from e
            if origins is not None:
                origins.file_value(path, content)
            return content

        return _FILE_REF.sub(read, value)
    if isinstance(value, dict):
        return {k: _resolve_file_refs(v, f"{where}.{k}" if where else str(k), origins, (*path, str(k)))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_file_refs(v, f"{where}.{i}", origins, (*path, i)) for i, v in enumerate(value)]
    return value


def format_validation_error(err: ValidationError, source: str) -> str:
    """One message naming every bad field and what is wrong with it."""
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/configuration.md)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, *, overrides: dict[str, Any] | None = None,
                ) -> BridgeConfig:
    """Reads the YAML file (if any), applies environment variables, validates everything.

    Raises ConfigurationError with a message naming each bad field.
    """
    path = path if path is not None else os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigurationError(f"cannot read config file {path}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise ConfigurationError(
                f"config file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from e
        try:
            loaded = safe_load_bounded(text, str(path))
        except yaml.YAMLError as e:
            raise ConfigurationError(f"config file {path} is not valid YAML: {e}") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigurationError(f"config file {path} must hold a mapping at the top level, "
                                     f"not {type(loaded).__name__}")
        odd = [k for k in loaded if not isinstance(k, str)]
        if odd:
            raise ConfigurationError(f"config file {path}: top-level keys must be names, not {odd[0]!r}")
        data = loaded
    if overrides:
        data = {**data, **overrides}
    origins = Origins()
    origins.environment()
    data = _resolve_file_refs(data, "", origins)
    try:
        config = BridgeConfig(**data)
    except ValidationError as e:
        raise ConfigurationError(format_validation_error(e, source)) from e
    _ORIGINS[id(config)] = origins
    weakref.finalize(config, _ORIGINS.pop, id(config), None)
    return config


_ORIGINS: dict[int, Origins] = {}
"""Where the secrets of each configuration :func:`load_config` loaded came from (for
:func:`masked_dump`), by the configuration's id while it lives. Kept beside the configuration, not
in it, so that configurations still compare by their values alone."""


def _file_options(options: Any, where: str) -> list[tuple[str, str]]:
    """``(field path, file path)`` of every option naming a file to read: keys ending in ``_file``
    and the values of ``secret_files`` (Kafka), at any depth."""
    found: list[tuple[str, str]] = []
    if isinstance(options, dict):
        for key, value in options.items():
            here = f"{where}.{key}"
            if str(key).endswith("_file") and isinstance(value, str) and value:
                found.append((here, value))
            elif key == "secret_files" and isinstance(value, dict):
                found.extend((f"{here}[{prop!r}]", path) for prop, path in value.items()
                             if isinstance(path, str))
            else:
                found.extend(_file_options(value, here))
    elif isinstance(options, list):
        for i, value in enumerate(options):
            found.extend(_file_options(value, f"{where}.{i}"))
    return found


def check_secret_files(config: BridgeConfig) -> None:
    """Every file a sink option names (``hmac_secret_file``, ``token_file``, ``tls.ca_file``,
    ``secret_files`` …) exists and is readable now, rather than failing when the sink starts.
    Raises ConfigurationError naming each field and file."""
    problems: list[str] = []
    for i, sink in enumerate(config.sinks):
        for where, path in _file_options(sink.options(), f"sinks.{i}"):
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                problems.append(f"  {where}: cannot read {path!r} (sink {sink.name!r}): "
                                f"{e.strerror or e} — mount the Secret there or fix the path")
    if problems:
        raise ConfigurationError("invalid configuration:\n" + "\n".join(problems))


def masked_dump(config: BridgeConfig) -> dict[str, Any]:
    """The effective configuration as plain data with every secret value replaced by ``***``
    (bridge/service/config_masking.py: by name, and by origin for what :func:`load_config` read)."""
    raw = config.model_dump(mode="json")
    if raw.get("workers") is None:
        del raw["workers"]  # unset (the CPU limit); a written null is refused
    raw["sinks"] = [{"name": s.name, "kind": s.kind, **s.options()} for s in config.sinks]
    origins = _ORIGINS.get(id(config))
    if origins is None:
        origins = Origins()
        origins.environment()
    return mask_config(raw, origins)
