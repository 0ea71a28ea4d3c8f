"""The configuration of how the bridge runs: its cache (``cache:``), checkpoints
(``checkpoint:``), snapshots (``snapshot:``), HTTP endpoints (``server:``), traces (``telemetry:``)
and logs (``logging:``). Part of :class:`~bridge.service.config.BridgeConfig`."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from bridge.service.config_nats import NatsConnectionConfig, nats_insecure_settings
from bridge.service.config_section import Section
from sinks.addresses import check_nats_url
from sinks.transport_security import refusal

__all__ = [
    "CacheConfig",
    "CheckpointConfig",
    "LoggingConfig",
    "ServerConfig",
    "SnapshotConfig",
    "TelemetryConfig",
]


class CacheConfig(Section):
    compact: bool = True
    """Keep objects as the API server's JSON bytes from the wire to the sinks (about their wire size in
    the cache; only name, namespace, uid and resourceVersion decoded; the rest decoded only when a
    filter, redaction or template reads it) instead of dict trees (several times the size, and more
    CPU per change). See docs/performance.md."""


class CheckpointConfig(Section):
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


class ServerConfig(Section):
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


class TelemetryConfig(Section):
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


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class SnapshotConfig(Section):
    on_first_start: bool = False
    """Emit a snapshot (begin, sync per object, end) when no checkpoint exists yet."""
