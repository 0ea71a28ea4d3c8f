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
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bridge.errors import ConfigurationError
from bridge.kube.labels import SelectorError, parse_field_selector, parse_label_selector

__all__ = [
    "BridgeConfig",
    "CacheConfig",
    "CheckpointConfig",
    "KubernetesConfig",
    "LeaderElectionConfig",
    "LoggingConfig",
    "ResourceConfig",
    "ServerConfig",
    "SinkConfig",
    "TelemetryConfig",
    "format_validation_error",
    "load_config",
    "masked_dump",
]

ENV_PREFIX = "KEB_"
_FILE_REF = re.compile(r"\$\{file:([^}]+)\}")
_CLUSTER = re.compile(r"[A-Za-z0-9._~-]+")
_SINK_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]*[a-z0-9])?$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesConfig(_Model):
    """How to reach the API server."""

    kubeconfig: str | None = None
    """Path to a kubeconfig; None = in-cluster service account when available, else ~/.kube/config."""
    context: str | None = None
    in_cluster: Literal["auto", "true", "false"] = "auto"
    page_size: int = Field(default=500, ge=1, le=100_000)
    watch_list: bool = False
    """Use WatchList streaming (sendInitialEvents) when the server supports it."""


class ResourceConfig(_Model):
    """One watched resource: ``pods``, ``deployments.apps``, ``widgets.example.com/v1``."""

    resource: str = Field(min_length=1)
    namespace: str = ""
    """"" = every namespace (or a cluster-scoped resource)."""
    label_selector: str = ""
    field_selector: str = ""

    @field_validator("label_selector")
    @classmethod
    def _label_selector_parses(cls, v: str) -> str:
        try:
            parse_label_selector(v)
        except SelectorError as e:
            raise ValueError(str(e)) from e
        return v

    @field_validator("field_selector")
    @classmethod
    def _field_selector_parses(cls, v: str) -> str:
        try:
            parse_field_selector(v)
        except SelectorError as e:
            raise ValueError(str(e)) from e
        return v


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
    name_prefix: str = "kube-event-bridge-checkpoint"
    nats_url: str = "nats://127.0.0.1:4222"
    bucket: str = "kube-event-bridge-checkpoints"
    interval: float = Field(default=5.0, gt=0)
    """Seconds between checkpoint writes (and one on shutdown)."""
    spill_directory: str = "./.kube-event-bridge/spill"
    """Where each sink's spill (its backlog beyond ``buffer.capacity``) is written, one
    subdirectory per sink and informer; "" = no spill (a sink that falls behind degrades at once).
    Emptied at each start."""


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


class LoggingConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class SnapshotConfig(_Model):
    on_first_start: bool = False
    """Emit a snapshot (begin, sync per object, end) when no checkpoint exists yet."""


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
    cache: CacheConfig = CacheConfig()
    snapshot: SnapshotConfig = SnapshotConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    server: ServerConfig = ServerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    logging: LoggingConfig = LoggingConfig()
    shutdown_deadline: float = Field(default=25.0, gt=0)
    """Seconds SIGTERM may take: flush sinks and write the final checkpoint. Keep it below the pod's
    terminationGracePeriodSeconds."""

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
        seen: set[tuple[str, str, str, str]] = set()
        for r in v:
            key = (r.resource, r.namespace, r.label_selector, r.field_selector)
            if key in seen:
                raise ValueError(f"resource {r.resource!r} (namespace {r.namespace!r}) is listed twice")
            seen.add(key)
        return v

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


def _resolve_file_refs(value: Any, where: str) -> Any:
    """Replaces ``${file:/path}`` in strings, recursively, by the (stripped) file content."""
    if isinstance(value, str):

        def read(m: re.Match[str]) -> str:
            path = Path(m.group(1))
            try:
                return path.read_text().strip()
            except OSError as e:
                raise ConfigurationError(f"{where}: cannot read {path}: {e.strerror}") from e

        return _FILE_REF.sub(read, value)
    if isinstance(value, dict):
        return {k: _resolve_file_refs(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_file_refs(v, f"{where}.{i}") for i, v in enumerate(value)]
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
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigurationError(f"cannot read config file {path}: {e.strerror}") from e
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigurationError(f"config file {path} is not valid YAML: {e}") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigurationError(f"config file {path} must hold a mapping at the top level, "
                                     f"not {type(loaded).__name__}")
        data = loaded
    if overrides:
        data = {**data, **overrides}
    data = _resolve_file_refs(data, "")
    try:
        return BridgeConfig(**data)
    except ValidationError as e:
        raise ConfigurationError(format_validation_error(e, source)) from e


_SECRET_NAME = re.compile(
    r"(password|passwd|secret|token|credential|creds|nkey|seed|private|authorization|api_?key|"
    r"sasl\.oauthbearer\.config|ssl\.key\.pem)",
    re.IGNORECASE,
)
MASK = "***"


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if key and _SECRET_NAME.search(key) and not key.endswith("_file") and value not in (None, ""):
        return MASK
    if isinstance(value, str) and "://" in value and "@" in value:
        # user:password@host in URLs
        return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1" + MASK + "@", value)
    return value


def masked_dump(config: BridgeConfig) -> dict[str, Any]:
    """The effective configuration as plain data with every secret value replaced by ``***``."""
    raw = config.model_dump(mode="json")
    raw["sinks"] = [{"name": s.name, "kind": s.kind, **s.options()} for s in config.sinks]
    masked: dict[str, Any] = _mask(raw)
    return masked
