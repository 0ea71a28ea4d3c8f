"""The webhook sink's options (``kind: webhook``, docs/sinks.md), validated at start, and how its URL
is shown: a URL's path may hold a credential (a Slack-style hook's token), so messages, metrics,
readiness and dead letters show scheme, host and port only unless ``url_path_secret: false``."""

from __future__ import annotations

import urllib.parse
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from sinks.options import SinkOptions, _Model
from sinks.transport_security import InsecureSetting, is_loopback

__all__ = [
    "WebhookAuthOptions",
    "WebhookBatchOptions",
    "WebhookOptions",
    "WebhookTLSOptions",
    "display_url",
]


def display_url(url: str, *, keep_path: bool = False) -> str:
    """``url`` as messages, metrics and status show it: scheme, host and port only (user info, query,
    fragment and path may hold credentials: a Slack-style hook carries its token in the path); the
    path too with ``keep_path`` (``url_path_secret: false``)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port else host
    path = parts.path if keep_path else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))


class WebhookBatchOptions(_Model):
    max_events: int = Field(default=1, ge=1)
    """1 = one event per request."""
    max_bytes: int = Field(default=1_048_576, ge=1)
    linger: float = Field(default=0.005, ge=0)
    """Seconds to wait for more events once one is ready."""
    format: Literal["cloudevents-batch", "array"] = "cloudevents-batch"


class WebhookAuthOptions(_Model):
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    username: str | None = None
    password: str | None = None
    password_file: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        bearer = bool(self.bearer_token or self.bearer_token_file)
        if bearer and self.username:
            raise ValueError("use bearer or basic auth, not both")
        if (self.password or self.password_file) and not self.username:
            raise ValueError("basic auth needs a username")
        return self


class WebhookTLSOptions(_Model):
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if self.key_file and not self.cert_file:
            raise ValueError("key_file needs cert_file")
        return self


class WebhookOptions(SinkOptions):
    url: str
    method: Literal["POST", "PUT"] = "POST"
    timeout: float = Field(default=10.0, gt=0)
    """Seconds for the whole request; a timeout is a transient failure."""
    connections: int = Field(default=64, ge=1)
    """Concurrent requests (and connection pool size)."""
    headers: dict[str, str] = Field(default_factory=dict)
    hmac_secret: str | None = None
    hmac_secret_file: str | None = None
    signature: Literal["standard-webhooks", "hmac-sha256", "both"] = "standard-webhooks"
    """How requests are signed when a secret is set (see the module docstring)."""
    auth: WebhookAuthOptions = Field(default_factory=WebhookAuthOptions)
    tls: WebhookTLSOptions = Field(default_factory=WebhookTLSOptions)
    batch: WebhookBatchOptions = Field(default_factory=WebhookBatchOptions)
    url_path_secret: bool = True
    """Whether the URL's path is a secret (a Slack-style hook's token): logs, metrics, readiness and
    dead letters show scheme, host and port only. ``false`` shows the path as well."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an absolute http:// or https:// URL, got {display_url(value)!r}")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"bad port in URL {display_url(value)!r}") from exc
        return value

    def insecure_settings(self) -> list[InsecureSetting]:
        found: list[InsecureSetting] = []
        if self.tls.insecure_skip_verify:
            found.append(("tls.insecure_skip_verify", "turns TLS verification off"))
        parts = urllib.parse.urlsplit(self.url)
        auth = self.auth
        credentials = [name for name, on in (
            ("auth.bearer_token", bool(auth.bearer_token or auth.bearer_token_file)),
            ("auth.username", bool(auth.username)),
            ("hmac_secret", bool(self.hmac_secret or self.hmac_secret_file)),
            ("url", bool(parts.username or parts.password)),
            ("headers", any(k.lower() == "authorization" for k in self.headers)),
        ) if on]
        if credentials and parts.scheme == "http" and not is_loopback(parts.hostname):
            found.append(("url", f"http:// to {parts.hostname} with credentials ({', '.join(credentials)}) "
                                 "sends them, or what they sign, in plaintext"))
        return found

    @model_validator(mode="after")
    def _batching(self) -> Self:
        if self.batch.max_events > 1 and self.content_mode != "structured":
            raise ValueError("batch: batching needs content_mode 'structured'")
        if self.batch.max_events > 1 and self.compat == "knative":
            raise ValueError("batch: compat 'knative' sends one event per request (a Knative broker or "
                             "sink takes no batches): remove batch or use compat 'native'")
        return self
