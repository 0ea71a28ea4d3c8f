"""The credentials and TLS files of a NATS connection, checked and made into what ``nats.connect``
takes: once for the NATS sinks (``sinks.nats_connection``) and the NATS KV checkpoint store
(``bridge/service/config_nats.py``), which accept the same options. It imports no NATS client, so
that loading the configuration does not."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["NatsAuthentication", "check_nats_authentication", "nats_connect_kwargs"]


class NatsAuthentication(Protocol):
    """The credentials and TLS settings of a NATS connection, as the sinks' options and the
    checkpoint store's ``checkpoint.nats`` both hold them (at most one authentication method)."""

    @property
    def user(self) -> str | None: ...
    @property
    def password_file(self) -> str | None: ...
    @property
    def token_file(self) -> str | None: ...
    @property
    def nkey_seed_file(self) -> str | None: ...
    @property
    def creds_file(self) -> str | None: ...
    @property
    def tls_ca_file(self) -> str | None: ...
    @property
    def tls_cert_file(self) -> str | None: ...
    @property
    def tls_key_file(self) -> str | None: ...
    @property
    def tls_hostname(self) -> str | None: ...


def check_nats_authentication(auth: NatsAuthentication) -> None:
    """Raises ValueError (for a pydantic validator) when ``auth`` gives two authentication methods,
    a user without its password file (or the reverse), or a certificate without its key."""
    methods = [m for m, on in (
        ("user/password_file", auth.user is not None or auth.password_file is not None),
        ("token_file", auth.token_file is not None),
        ("nkey_seed_file", auth.nkey_seed_file is not None),
        ("creds_file", auth.creds_file is not None)) if on]
    if len(methods) > 1:
        raise ValueError(f"choose one authentication method, not {' and '.join(methods)}")
    if (auth.user is None) != (auth.password_file is None):
        raise ValueError("user and password_file go together")
    if (auth.tls_cert_file is None) != (auth.tls_key_file is None):
        raise ValueError("tls_cert_file and tls_key_file go together")


def nats_connect_kwargs(auth: NatsAuthentication, *, read: Callable[[str, str], str], where: str,
                        error: type[Exception]) -> dict[str, Any]:
    """The authentication and TLS keyword arguments of ``nats.connect`` for ``auth``: every file is
    read now (``read(path, option)``: its stripped content, or the caller's error naming the option),
    so that a missing Secret fails at start; TLS files that do not load raise ``error`` naming
    ``where``. NKEY seeds and credentials files are passed by path, for nats-py to read."""
    kwargs: dict[str, Any] = {}
    if auth.user is not None and auth.password_file is not None:
        kwargs["user"] = auth.user
        kwargs["password"] = read(auth.password_file, "password_file")
    if auth.token_file is not None:
        kwargs["token"] = read(auth.token_file, "token_file")
    if auth.nkey_seed_file is not None:
        read(auth.nkey_seed_file, "nkey_seed_file")
        kwargs["nkeys_seed"] = auth.nkey_seed_file
    if auth.creds_file is not None:
        read(auth.creds_file, "creds_file")
        kwargs["user_credentials"] = auth.creds_file
    if auth.tls_ca_file is not None or auth.tls_cert_file is not None:
        try:
            ctx = ssl.create_default_context(cafile=auth.tls_ca_file)
            if auth.tls_cert_file is not None and auth.tls_key_file is not None:
                ctx.load_cert_chain(auth.tls_cert_file, auth.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise error(f"{where}: TLS files: {exc}") from exc
        kwargs["tls"] = ctx
        if auth.tls_hostname is not None:
            kwargs["tls_hostname"] = auth.tls_hostname
    return kwargs
