"""How the NATS KV checkpoint store connects: the same TLS and credential options as the NATS sinks
(``checkpoint.nats``), so that no credential has to be written into ``checkpoint.nats_url``."""

from __future__ import annotations

import ssl
import urllib.parse
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator

from bridge.errors import ConfigurationError
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
        methods = [m for m, on in (
            ("user/password_file", self.user is not None or self.password_file is not None),
            ("token_file", self.token_file is not None),
            ("nkey_seed_file", self.nkey_seed_file is not None),
            ("creds_file", self.creds_file is not None)) if on]
        if len(methods) > 1:
            raise ValueError(f"choose one authentication method, not {' and '.join(methods)}")
        if (self.user is None) != (self.password_file is None):
            raise ValueError("user and password_file go together")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` (files read now). Raises ConfigurationError."""
        kwargs: dict[str, Any] = {}
        if self.user is not None and self.password_file is not None:
            kwargs["user"] = self.user
            kwargs["password"] = _read(self.password_file, "password_file")
        if self.token_file is not None:
            kwargs["token"] = _read(self.token_file, "token_file")
        if self.nkey_seed_file is not None:
            _read(self.nkey_seed_file, "nkey_seed_file")
            kwargs["nkeys_seed"] = self.nkey_seed_file
        if self.creds_file is not None:
            _read(self.creds_file, "creds_file")
            kwargs["user_credentials"] = self.creds_file
        if self.tls_ca_file is not None or self.tls_cert_file is not None:
            try:
                ctx = ssl.create_default_context(cafile=self.tls_ca_file)
                if self.tls_cert_file is not None and self.tls_key_file is not None:
                    ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            except (OSError, ssl.SSLError) as e:
                raise ConfigurationError(f"checkpoint.nats: TLS files: {e}") from e
            kwargs["tls"] = ctx
            if self.tls_hostname is not None:
                kwargs["tls_hostname"] = self.tls_hostname
        return kwargs


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
