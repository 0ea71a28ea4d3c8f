"""How the NATS KV checkpoint store connects: the same TLS and credential options as the NATS sinks
(``checkpoint.nats``), so that no credential has to be written into ``checkpoint.nats_url``."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator

from bridge.errors import ConfigurationError
from sinks.nats_auth import check_nats_authentication, nats_connect_kwargs
from sinks.transport_security import InsecureSetting, is_loopback

__all__ = ["NatsConnectionConfig", "nats_insecure_settings"]


class NatsConnectionConfig(BaseModel):
    """``checkpoint.nats``: authentication (one of user/password_file, token_file, nkey_seed_file,
    creds_file) and TLS (a CA, a client certificate) of the checkpoint store's connection."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    """A NATS credentials file (JWT and NKEY seed); NKEY and creds need the ``nkeys`` package."""
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None

    @model_validator(mode="after")
    def _one_method(self) -> Self:
        check_nats_authentication(self)
        return self

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` (files read now). Raises ConfigurationError."""
        return nats_connect_kwargs(self, read=_read, where="checkpoint.nats", error=ConfigurationError)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise ConfigurationError(f"checkpoint.nats.{what}: cannot read {path}: {e.strerror}") from e


def nats_insecure_settings(url: str, conn: NatsConnectionConfig) -> list[InsecureSetting]:
    """Credentials the store would send in plaintext (``nats://`` without TLS options) to a host
    other than loopback."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
    credentials = [name for name, on in (
        ("nats.user", conn.user is not None), ("nats.token_file", conn.token_file is not None),
        ("nats.creds_file", conn.creds_file is not None), ("nats_url", bool(parts.username))) if on]
    tls = conn.tls_ca_file is not None or conn.tls_cert_file is not None
    if credentials and parts.scheme in ("nats", "ws") and not tls and not is_loopback(parts.hostname):
        return [("nats_url", f"credentials ({', '.join(credentials)}) sent in plaintext to "
                             f"{parts.hostname}: use tls:// or nats.tls_ca_file")]
    return []
