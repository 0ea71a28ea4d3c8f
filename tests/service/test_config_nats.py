"""``checkpoint.nats``: the NATS KV store's credentials and TLS files, checked at load and read into
``nats.connect``'s arguments (by the same function as the NATS sinks', with the store's messages)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.errors import ConfigurationError
from bridge.service.config_nats import NatsConnectionConfig


def test_files_are_read_into_the_connect_arguments(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("s3cret\n")
    (tmp_path / "seed").write_text("SUAseed\n")
    assert NatsConnectionConfig(user="keb", password_file=str(tmp_path / "password")).connect_kwargs() == {
        "user": "keb", "password": "s3cret"}
    assert NatsConnectionConfig(nkey_seed_file=str(tmp_path / "seed")).connect_kwargs() == {
        "nkeys_seed": str(tmp_path / "seed")}  # nats-py reads the seed itself; checked readable here


def test_an_unreadable_file_names_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(ConfigurationError, match=rf"^checkpoint\.nats\.token_file: cannot read {missing}: "):
        NatsConnectionConfig(token_file=str(missing)).connect_kwargs()


def test_tls_files_that_do_not_load_name_the_section(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(ConfigurationError, match=r"^checkpoint\.nats: TLS files: "):
        NatsConnectionConfig(tls_ca_file=str(tmp_path / "ca.pem")).connect_kwargs()


def test_a_loadable_ca_gives_a_tls_context_and_the_hostname(tmp_path: Path) -> None:
    ca = ssl.get_default_verify_paths().cafile
    if ca is None or not Path(ca).is_file():
        pytest.skip("no system CA bundle to load")
    kwargs = NatsConnectionConfig(tls_ca_file=ca, tls_hostname="nats.example").connect_kwargs()
    assert isinstance(kwargs.pop("tls"), ssl.SSLContext)
    assert kwargs == {"tls_hostname": "nats.example"}


@pytest.mark.parametrize(("options", "message"), [
    ({"token_file": "/t", "creds_file": "/c"},
     "choose one authentication method, not token_file and creds_file"),
    ({"user": "keb"}, "user and password_file go together"),
    ({"tls_cert_file": "/cert"}, "tls_cert_file and tls_key_file go together"),
])
def test_inconsistent_authentication_is_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NatsConnectionConfig(**options)
