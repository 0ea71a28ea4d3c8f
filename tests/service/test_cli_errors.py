"""Bad configurations as users meet them, through the command as a separate process: exit code 2,
the field named, never a traceback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge.errors import ConfigurationError
from bridge.service import cli
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from tests.service.test_cli import run_cli, sim_process  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("own_cwd")

BASE = "resources: [{resource: pods}]\n"


def assert_config_error(r: object, *needles: str) -> None:
    code, stderr = r.returncode, r.stderr  # type: ignore[attr-defined]
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)


def test_missing_secret_file_is_a_config_error_for_check_config_and_run(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-secret"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + f"sinks: [{{name: hook, kind: webhook, url: 'https://h.example.com/x', "
                          f"hmac_secret_file: '{missing}'}}]\n")
    for command in ("check-config", "run"):
        r = run_cli(command, "--config", str(cfg))
        assert_config_error(r, "sinks.0.hmac_secret_file", str(missing), "No such file or directory")
    # Found at any depth, and every one of them is reported.
    cfg.write_text(BASE + "sinks:\n"
                   "  - {name: k, kind: kafka, brokers: 'k:9092',\n"
                   f"     secret_files: {{sasl.password: '{missing}'}}}}\n"
                   f"  - {{name: n, kind: nats, servers: ['nats://n:4222'], tls_ca_file: '{tmp_path}'}}\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert_config_error(r, "sinks.0.secret_files['sasl.password']", "sinks.1.tls_ca_file", "Is a directory")

    missing.write_text("s3cret\n")
    cfg.write_text(BASE + f"sinks: [{{name: hook, kind: webhook, url: 'https://h.example.com/x', "
                          f"hmac_secret_file: '{missing}'}}]\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("sink", "needles"), [
    ("{name: n, kind: nats, servers: ['http//nats:4222']}",
     ("sinks.0", "'n' (nats)", "servers", "http//nats:4222")),
    ("{name: j, kind: jetstream, servers: ['nats://ok:4222', 'http://nats:4222']}",
     ("sinks.0", "servers[1]", "http://nats:4222", "nats://")),
    ("{name: k, kind: kafka, brokers: 'kafka:9092,kafka2'}", ("sinks.0", "brokers", "'kafka2' has no port")),
    ("{name: k, kind: kafka}", ("sinks.0", "brokers")),
    ("{name: k, kind: kafak}", ("sinks.0", "kafak", "known kinds")),
    ("{name: h, kind: webhook, url: 'http//hooks:80/x'}", ("sinks.0", "url")),
])
def test_malformed_sink_addresses_are_config_errors(tmp_path: Path, sink: str, needles: tuple[str, ...],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # In-process, the same main() the command runs (the subprocess tests around cover the process).
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + f"sinks: [{sink}]\n")
    code = cli.main(["check-config", "--config", str(cfg)])
    assert_config_error(SimpleNamespace(returncode=code, stderr=capsys.readouterr().err), *needles)


def test_run_with_a_malformed_nats_url_exits_2_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "sinks: [{name: n, kind: nats, servers: ['http//nats:4222']}]\n")
    r = run_cli("run", "--config", str(cfg))  # (a hang fails at run_cli's timeout)
    assert_config_error(r, "sinks.0", "http//nats:4222")
    # At once: refused while loading the configuration, before anything started (no endpoint
    # listening, no connection tried, no retry), so the error is all the process wrote.
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("kube-event-bridge: invalid configuration: "), r.stderr
    cfg.write_text(BASE + "sinks: [{name: s, kind: stdout}]\n"
                   "checkpoint: {store: nats-kv, nats_url: 'nats//127.0.0.1:4222'}\n")
    assert_config_error(run_cli("check-config", "--config", str(cfg)),
                        "checkpoint.nats_url", "nats//127.0.0.1:4222")


def test_aliases_of_one_resource_name_both_entries(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: deploy}, {resource: Deployment}, {resource: deployments.apps}]\n"
                   "sinks: [{name: s, kind: stdout}]\n")
    assert_config_error(run_cli("run", "--config", str(cfg)),
                        "resources.0 ('deploy') and resources.1 ('Deployment')", "deployments.apps")


def test_a_sink_refused_at_start_is_a_config_error(tmp_path: Path,
                                                   sim_process: tuple[str, Path]) -> None:  # noqa: F811
    # The CA file exists (so check-config passes) but is no certificate: found when the sink starts.
    _, kubeconfig = sim_process
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n" + BASE
        + f"sinks: [{{name: hook, kind: webhook, url: 'https://127.0.0.1:9/x', tls: {{ca_file: '{ca}'}}}}]\n"
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}'}}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n")
    assert run_cli("check-config", "--config", str(cfg)).returncode == 0
    assert_config_error(run_cli("run", "--config", str(cfg)), "sink 'hook' (webhook): tls")


def test_an_unexpected_error_is_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def broken(path: str | None) -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(cli, "_check_config", broken)
    assert cli.main(["check-config"]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "unexpected error (RuntimeError): something nobody expected" in err
    assert "Traceback" not in err


def test_sim_help_names_the_command() -> None:
    r = run_cli("sim", "--help")
    assert r.returncode == 0
    assert r.stdout.startswith("usage: kube-event-bridge sim"), r.stdout


@pytest.mark.parametrize("leader_election", [False, True])
async def test_aliases_of_a_custom_resource_are_found_after_discovery(tmp_path: Path,
                                                                      leader_election: bool) -> None:
    # With leader election too: found while leading, it ends the service as a configuration error.
    widgets = {"group": "example.com", "version": "v1", "plural": "widgets", "kind": "Widget",
               "short_names": ["wdg"]}
    async with Simulator(crds=[widgets]) as sim:
        config = BridgeConfig.model_validate({
            "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kc")), "in_cluster": "false"},
            "resources": [{"resource": "wdg"}, {"resource": "widgets.example.com/v1"}],
            "sinks": [{"name": "s", "kind": "stdout"}],
            "checkpoint": {"store": "none"},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "leader_election": {"enabled": leader_election, "retry_period": 0.2, "renew_deadline": 1,
                                "lease_duration": 2},
        })
        expected = (r"resources\.0 \('wdg'\) and resources\.1 \('widgets\.example\.com/v1'\) both name "
                    r"widgets\.example\.com")
        with pytest.raises(ConfigurationError, match=expected):
            await BridgeService(config=config).run()


def test_the_node_strategy_without_a_node_and_a_zero_qps_exit_2_naming_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "sinks: [{name: s, kind: stdout}]\nsharding: {strategy: node}\n")
    for command in ("check-config", "run"):
        r = run_cli(command, "--config", str(cfg), env={"NODE_NAME": ""})
        assert_config_error(r, "sharding: node_name: empty and $NODE_NAME is not set")
    cfg.write_text(BASE + "sinks: [{name: s, kind: stdout}]\nkubernetes: {qps: 0}\n")
    assert_config_error(run_cli("run", "--config", str(cfg)), "kubernetes.qps: 0 would never send a request")
