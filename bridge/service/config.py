"""The service's configuration: one YAML file, overridden by environment variables.

Loaded with pydantic-settings and validated completely at start, so that a mistake is reported once,
clearly, before anything connects anywhere. Sources, highest priority first:

1. environment variables prefixed ``KEB_``, nested with ``__`` (``KEB_CHECKPOINT__STORE=configmap``,
   ``KEB_LOGGING__LEVEL=debug``); a value that is a list or mapping (``KEB_RESOURCES``) is JSON;
2. the YAML file given with ``--config`` (or ``KEB_CONFIG_FILE``);
3. the defaults (here, and in the sections' models: ``config_cluster.py`` for what is watched and
   by which replica, ``config_runtime.py`` for checkpoints, endpoints, traces and logs).

Secrets never need to be written in the file: every sink option ending in ``_file`` (``token_file``,
``password_file``, ``hmac_secret_file``) reads a mounted Secret, and ``${file:/path}`` inside any
string is replaced by the file's content at load time.
"""

from __future__ import annotations

import os
import re
import weakref
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
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
from bridge.service.config_cluster import (
    KubernetesConfig,
    LeaderElectionConfig,
    ResourceConfig,
    ShardingConfig,
)
from bridge.service.config_masking import MASK, Origins, mask_config
from bridge.service.config_runtime import (
    CacheConfig,
    CheckpointConfig,
    LoggingConfig,
    ServerConfig,
    SnapshotConfig,
    TelemetryConfig,
)
from bridge.service.config_yaml import safe_load_bounded
from bridge.service.events.config import EventsConfig
from bridge.service.resource_names import canonical_resource

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
