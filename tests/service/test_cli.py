"""The command line as users run it: separate processes, real signals, real exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from bridge.storage.checkpoint import decode_checkpoint
from bridge.testing.files import written_lines
from bridge.testing.processes import ServiceProcess, SimulatorProcess, wait_until

EXE = [sys.executable, "-m", "bridge.service.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    kubeconfig = tmp_path / "sim.kubeconfig"
    proc = subprocess.Popen(
        [*EXE, "sim", "--port", "0", "--kubeconfig", str(kubeconfig), "--churn-rate", "50",
         "--churn-objects", "20", "--seed", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    url = ""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not url:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
    assert url, "the simulator did not start"
    try:
        yield url, kubeconfig
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_help_and_version() -> None:
    r = run_cli("--help")
    assert r.returncode == 0
    for sub in ("run", "sim", "demo", "check-config", "snapshot"):
        assert sub in r.stdout
    assert run_cli("--version").stdout.startswith("kube-event-bridge ")
    assert run_cli("run", "--help").returncode == 0
    assert run_cli("nonsense").returncode == 2


def test_check_config_masks_secrets_and_validates_sink_options(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "resources: [{resource: pods}]\n"
        "sinks:\n"
        "  - {name: hook, kind: webhook, url: 'https://hooks.example.com/x', hmac_secret: s3cr3t-value,\n"
        "     auth: {bearer_token: tok-123}}\n"
        "  - {name: out, kind: file, path: /tmp/x.jsonl}\n"
    )
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "s3cr3t-value" not in r.stdout
    assert "tok-123" not in r.stdout
    assert "hmac_secret: '***'" in r.stdout
    assert "configuration is valid" in r.stdout

    cfg.write_text("resources: [{resource: pods}]\nsinks: [{name: k, kind: kafak}]\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert "kafak" in r.stderr
    assert "kafka" in r.stderr  # the known kinds are listed

    cfg.write_text("resources: [{resource: pods}]\nsinks: [{name: h, kind: webhook, url: 'not a url'}]\n")
    r = run_cli("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert "sinks.0" in r.stderr


def test_run_with_invalid_config_exits_2_with_the_field_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: pods, namspace: x}]\nsinks: [{name: s, kind: stdout}]\n")
    r = run_cli("run", "--config", str(cfg))
    assert r.returncode == 2
    assert "resources.0.namspace: unknown field" in r.stderr


SHUTDOWN_DEADLINE = 60
OVERRUNS = ("did not drain", "did not flush", "was not written in time")
"""What the shutdown logs when a step of it runs out of the deadline (bridge/delivery/pipeline.py)."""


async def test_sigterm_drains_and_writes_the_final_checkpoint(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    async with SimulatorProcess(log=tmp_path / "sim.log", args=(
            "--churn-rate", "50", "--churn-objects", "20", "--seed", "3")) as sim:
        cfg = tmp_path / "bridge.yaml"
        cfg.write_text(
            f"kubernetes: {{kubeconfig: '{sim.kubeconfig}', in_cluster: 'false'}}\n"
            "resources: [{resource: pods}]\n"
            f"sinks: [{{name: out, kind: file, path: '{events}'}}]\n"
            # A long interval: only the shutdown can have written the checkpoint.
            f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 3600, "
            f"spill_directory: '{tmp_path / 'spill'}'}}\n"
            "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
            "logging: {level: info, format: json}\n"
            # A deadline that dwarfs a loaded machine's scheduling delays: the drain of a file sink
            # takes well under a second. Whether it ran out is read from the log (OVERRUNS), not
            # from a stopwatch.
            f"shutdown_deadline: {SHUTDOWN_DEADLINE}\n"
        )
        bridge = ServiceProcess(config=cfg, log=tmp_path / "bridge.log")
        async with bridge:
            await bridge.wait_listening()

            def delivered_enough() -> bool:
                return len(written_lines(events)) >= 60

            await wait_until(delivered_enough, timeout=60, what="60 events delivered", alive=bridge)
            code = await bridge.stop(timeout=SHUTDOWN_DEADLINE + 20)
        log = bridge.output()
    assert code == 0, log
    records = [orjson.loads(line) for line in log.splitlines()]  # every log line is JSON
    messages = [r.get("message", "") for r in records]
    (drain,) = [r for r in records if r.get("message", "").startswith("shutting down")]
    assert drain["deadline"] == SHUTDOWN_DEADLINE
    # Drained: no step of the shutdown ran out of the deadline (nor waited it out).
    assert not any(o in m for m in messages for o in OVERRUNS), messages
    (cp_file,) = list((tmp_path / "cp").glob("*.ckpt"))  # (next to it: the known-object journal)
    cp = decode_checkpoint(cp_file.read_bytes())
    delivered = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    # The checkpoint covers exactly what was delivered: its RV is the last delivered change's RV
    # or later (a bookmark), and its index matches replaying the delivered events.
    last_rv = max(int(e["resourceversion"]) for e in delivered)
    assert int(cp.resource_version) >= last_rv
    alive: dict[str, str] = {}
    for e in delivered:
        if e["type"].endswith("deleted"):
            alive.pop(e["subject"], None)
        else:
            alive[e["subject"]] = e["resourceversion"]
    assert {k: rv for k, (_uid, rv) in cp.objects.items()} == alive


def test_demo_runs_and_replays_exactly(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    r = run_cli("demo", "--duration", "3", "--quiet", "--output", str(out), timeout=90)
    assert r.returncode == 0, r.stderr
    assert "reproduces the simulator's" in r.stderr
    assert "events delivered" in r.stderr
    assert len(out.read_bytes().splitlines()) > 30


def test_check_config_does_not_import_the_run_path(tmp_path: Path) -> None:
    """Validating a configuration builds the sinks and the models only: the OpenTelemetry SDK, the
    pipeline and the service are the run path's (each check-config process would pay for importing
    them; tests and CI start many)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: pods}]\n"
                   "sinks: [{name: s, kind: stdout}, {name: w, kind: webhook, url: 'http://127.0.0.1:9/x'}]\n")
    probe = ("import sys\n"
             "from bridge.service.cli import main\n"
             f"code = main(['check-config', '--config', {str(cfg)!r}])\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry'}),\n"
             "      sorted(m for m in sys.modules if m in ('bridge.service.service',\n"
             "       'bridge.delivery.pipeline', 'bridge.service.telemetry')), code, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "# configuration is valid" in r.stdout
    assert r.stderr.splitlines()[-1] == "[] [] 0", r.stderr
