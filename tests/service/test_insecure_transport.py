"""Transport security: a setting that turns TLS verification off, or sends credentials in plaintext
to anything but loopback, is refused at configuration (exit 2, naming the field, no traceback)
unless ``allow_insecure: true``, and then warned about by check-config and at start. The NATS KV
checkpoint store connects with the NATS sinks' TLS and credential options (a real nats-server with
TLS and a token)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.clock import RealClock
from bridge.service.cli import main as cli_main
from bridge.service.config import load_config
from bridge.service.service import _api_client, _checkpoint_store
from bridge.sim import Simulator
from bridge.storage.checkpoint import Checkpoint
from sinks.webhook import WebhookSink
from tests import brokers

HOOK = {"name": "s", "kind": "webhook"}
KAFKA = {"name": "s", "kind": "kafka", "brokers": "kafka.example.com:9092"}
NATS = {"name": "s", "kind": "nats", "servers": ["nats://nats.example.com:4222"]}

INSECURE: list[tuple[str, dict[str, Any], str]] = [
    ("skip-verify", {**HOOK, "url": "https://hooks.example.com/in", "tls": {"insecure_skip_verify": True}},
     "tls.insecure_skip_verify"),
    ("bearer", {**HOOK, "url": "http://hooks.example.com/in", "auth": {"bearer_token": "t0ken"}},
     "auth.bearer_token"),
    ("basic", {**HOOK, "url": "http://hooks.example.com/in", "auth": {"username": "u", "password": "p"}},
     "auth.username"),
    ("hmac", {**HOOK, "url": "http://hooks.example.com/in", "hmac_secret": "k3y"}, "hmac_secret"),
    ("userinfo", {**HOOK, "url": "http://u:p@hooks.example.com/in"}, "url"),
    ("kafka-verify", {**KAFKA, "librdkafka": {"security.protocol": "SSL",
                                              "enable.ssl.certificate.verification": "false"}},
     "enable.ssl.certificate.verification"),
    ("kafka-sasl-plaintext", {**KAFKA, "librdkafka": {"security.protocol": "SASL_PLAINTEXT",
                                                      "sasl.mechanism": "PLAIN"}},
     "librdkafka.security.protocol"),
    ("nats-token", {**NATS, "token_file": "/dev/null"}, "servers"),
    ("nats-userinfo", {**NATS, "servers": ["nats://tok@nats.example.com:4222"]}, "servers"),
]


def _write(tmp_path: Path, sink: dict[str, Any], **extra: Any) -> str:
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump({"resources": [{"resource": "pods"}], "sinks": [sink], **extra}))
    return str(path)


@pytest.mark.parametrize(("case", "sink", "field"), INSECURE, ids=[c[0] for c in INSECURE])
def test_refused_naming_the_field_then_accepted_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, sink: dict[str, Any],
        field: str) -> None:
    assert cli_main(["check-config", "-c", _write(tmp_path, sink)]) == 2
    err = capsys.readouterr().err
    assert "sinks.0" in err
    assert field in err
    assert "allow_insecure: true" in err
    assert "Traceback" not in err
    assert cli_main(["check-config", "-c", _write(tmp_path, {**sink, "allow_insecure": True})]) == 0
    out, err = capsys.readouterr()
    assert "# configuration is valid" in out
    (warning,) = [line for line in err.splitlines() if "warning: sinks.0 (s): " in line]
    assert field in warning


@pytest.mark.parametrize("sink", [
    {**HOOK, "url": "http://127.0.0.1:8080/in", "auth": {"bearer_token": "t0ken"}},
    {**HOOK, "url": "http://localhost:8080/in", "hmac_secret": "k3y"},
    {**HOOK, "url": "https://hooks.example.com/in", "auth": {"bearer_token": "t0ken"}},
    {**KAFKA, "brokers": "127.0.0.1:9092", "librdkafka": {"security.protocol": "SASL_PLAINTEXT"}},
    {**NATS, "servers": ["tls://nats.example.com:4222"], "token_file": "/dev/null"},
    {**NATS, "servers": ["nats://[::1]:4222"], "token_file": "/dev/null"},
    {**HOOK, "url": "http://hooks.example.com/in"},
], ids=["loopback-bearer", "localhost-hmac", "https", "kafka-loopback", "nats-tls", "nats-ipv6-loopback",
        "no-credentials"])
def test_loopback_tls_or_no_credentials_pass_without_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sink: dict[str, Any]) -> None:
    assert cli_main(["check-config", "-c", _write(tmp_path, sink)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_checkpoint_store_refuses_a_plaintext_token_unless_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sink = {"name": "out", "kind": "file", "path": str(tmp_path / "e.jsonl")}
    checkpoint: dict[str, Any] = {"store": "nats-kv", "nats_url": "nats://tok@nats.example.com:4222"}
    assert cli_main(["check-config", "-c", _write(tmp_path, sink, checkpoint=checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.nats_url" in err or "checkpoint: nats_url" in err
    assert "tok@" not in err
    checkpoint["allow_insecure"] = True
    assert cli_main(["check-config", "-c", _write(tmp_path, sink, checkpoint=checkpoint)]) == 0
    assert "warning: checkpoint.nats_url" in capsys.readouterr().err


async def test_an_accepted_insecure_setting_is_warned_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sinks")
    sink = WebhookSink.from_options("hook", {"url": "https://127.0.0.1:1/in", "allow_insecure": True,
                                             "tls": {"insecure_skip_verify": True}})
    await sink.start()
    await sink.close()
    (record,) = [r for r in caplog.records if "allow_insecure" in r.getMessage()]
    assert "tls.insecure_skip_verify: turns TLS verification off" in record.getMessage()


async def test_the_nats_kv_store_connects_with_tls_and_a_token_from_a_file(tmp_path: Path) -> None:
    tls = brokers.make_tls_files(tmp_path)
    token = tmp_path / "token"
    token.write_text("kv-s3cret\n")
    args = ("--tls", "--tlscert", tls.server_cert, "--tlskey", tls.server_key, "--auth", "kv-s3cret")
    with brokers.running_nats(*args) as server:
        async with Simulator() as sim:
            kubeconfig = {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"}
        path = _write(tmp_path, {"name": "out", "kind": "file", "path": str(tmp_path / "e.jsonl")},
                      checkpoint={"store": "nats-kv", "nats_url": f"tls://127.0.0.1:{server.port}",
                                  "nats": {"tls_ca_file": tls.ca, "token_file": str(token)}},
                      kubernetes=kubeconfig)
        config = load_config(path)
        store = _checkpoint_store(config, _api_client(config, RealClock()))  # the client goes unused
        assert store is not None
        try:
            await store.save(Checkpoint(informer_id="pods", resource_version="7", written_at=1.0))
            loaded = await store.load("pods")
        finally:
            await store.close()
        assert loaded is not None
        assert loaded.resource_version == "7"
