"""The command line as users run it: separate processes, real signals, real exit codes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from bridge.storage.checkpoint import decode_checkpoint

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


def test_sigterm_drains_and_writes_the_final_checkpoint(tmp_path: Path,
                                                        sim_process: tuple[str, Path]) -> None:
    _, kubeconfig = sim_process
    events = tmp_path / "events.jsonl"
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods}]\n"
        f"sinks: [{{name: out, kind: file, path: '{events}'}}]\n"
        # A long interval: only the shutdown can have written the checkpoint.
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 3600, "
        f"spill_directory: '{tmp_path / 'spill'}'}}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
        "logging: {level: info, format: json}\n"
        # A deadline that dwarfs a loaded machine's scheduling delays: the drain of a file sink
        # takes well under a second, so exiting only at (or after) the deadline is a defect.
        f"shutdown_deadline: {SHUTDOWN_DEADLINE}\n"
    )
    proc = subprocess.Popen([*EXE, "run", "--config", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if events.exists() and len(events.read_bytes().splitlines()) >= 60:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the bridge delivered too few events")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=SHUTDOWN_DEADLINE + 20)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate()
    assert code == 0, stderr
    assert took < SHUTDOWN_DEADLINE, took  # drained: did not wait out (or overrun) the deadline
    records = [orjson.loads(line) for line in stderr.splitlines()]  # every log line is JSON
    messages = [r.get("message", "") for r in records]
    (drain,) = [r for r in records if r.get("message", "").startswith("shutting down")]
    assert drain["deadline"] == SHUTDOWN_DEADLINE
    assert not any("did not drain" in m or "did not flush" in m for m in messages), messages
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
