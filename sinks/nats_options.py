"""The NATS sinks' options: the connection (servers, credentials, TLS, reconnects) both sinks share,
and the JetStream stream to publish to (:mod:`sinks.nats` for the sinks)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sinks.addresses import check_nats_url
from sinks.nats_auth import check_nats_authentication
from sinks.options import SinkOptions
from sinks.transport_security import InsecureSetting, all_loopback

__all__ = ["JetStreamSinkOptions", "NatsConnectionOptions", "NatsSinkOptions", "StreamOptions",
           "stream_subjects_for"]

_TEMPLATE_FIELD = re.compile(r"\{[^{}]*\}")
_BAD_TOKEN = re.compile(r"[\s*>]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Model):
    """The JetStream stream to create when it does not exist (``create: true``)."""

    name: str = Field(min_length=1, pattern=r"^[^.*>\s]+$")
    create: bool = False
    subjects: list[str] = Field(default_factory=list)
    """Empty = derived from the destination template (each templated token becomes ``*``)."""
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    duplicate_window: float = Field(default=120.0, gt=0)
    """Seconds during which a re-sent ``Nats-Msg-Id`` is recognised as a duplicate."""
    max_age: float = Field(default=0.0, ge=0)
    """Seconds; 0 = unlimited."""
    max_bytes: int = Field(default=-1, ge=-1)
    max_msg_size: int = Field(default=-1, ge=-1)


class NatsConnectionOptions(SinkOptions):
    """Connection settings shared by both NATS sinks."""

    servers: list[str] = Field(min_length=1)
    """``nats://host:port`` (``tls://`` for TLS)."""

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        for i, url in enumerate(value):
            try:
                check_nats_url(url)
            except ValueError as exc:
                raise ValueError(f"servers[{i}]: {exc}") from None
        return value
    connection_name: str = "kube-event-bridge"
    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    connect_timeout: float = Field(default=5.0, gt=0)
    reconnect_wait: float = Field(default=1.0, gt=0)
    max_reconnect_attempts: int = Field(default=-1, ge=-1)
    """-1 = forever."""
    reconnect_buffer_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    """Bytes nats-py buffers while reconnecting; past it a publish fails (and is retried)."""
    publish_timeout: float = Field(default=5.0, gt=0)
    """Seconds to wait for the server's confirmation (PONG or PubAck) before retrying."""

    def insecure_settings(self) -> list[InsecureSetting]:
        plaintext = [u for u in self.servers
                     if urllib.parse.urlsplit(u if "://" in u else f"nats://{u}").scheme in ("nats", "ws")]
        userinfo = any(urllib.parse.urlsplit(u).username for u in self.servers if "://" in u)
        credentials = [name for name, on in (
            ("user/password_file", self.user is not None), ("token_file", self.token_file is not None),
            ("creds_file", self.creds_file is not None), ("servers", userinfo)) if on]
        tls = self.tls_ca_file is not None or self.tls_cert_file is not None
        if credentials and plaintext and not tls and not all_loopback(plaintext, "nats"):
            return [("servers", f"credentials ({', '.join(credentials)}) sent in plaintext (nats://, "
                                "ws://) to a host other than loopback: use tls:// or tls_ca_file")]
        return []

    @model_validator(mode="after")
    def _auth(self) -> Self:
        check_nats_authentication(self)
        if self.destination is not None:
            # Field values are sanitised into tokens; the literal text must be a subject already.
            shape = _TEMPLATE_FIELD.sub("x", self.destination)
            if any(not t or _BAD_TOKEN.search(t) for t in shape.split(".")):
                raise ValueError(f"destination: {self.destination!r} is not a NATS subject (dot-separated "
                                 "non-empty tokens without spaces, '*' or '>')")
        return self


class NatsSinkOptions(NatsConnectionOptions):
    """Options of the ``nats`` sink (core publish)."""


class JetStreamSinkOptions(NatsConnectionOptions):
    """Options of the ``jetstream`` sink."""

    stream: StreamOptions | None = None
    """The stream to publish to; when set, publishes are checked against it (``Nats-Expected-Stream``)
    and it can be created at start."""


def stream_subjects_for(template: str) -> list[str]:
    """Subjects capturing everything a destination template can render: each token holding a
    template field becomes ``*`` (``k8s.{resource}.{namespace}.{name}`` → ``k8s.*.*.*``)."""
    return [".".join("*" if "{" in token else token for token in template.split("."))]
