"""``check-config --cluster`` as an operator runs it before deploying: a separate process against the
simulator (a separate process too, RBAC denials set on its command line) over real HTTP."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.test_cli import EXE, run_cli


@pytest.fixture
def denying_sim(tmp_path: Path) -> Iterator[Path]:
    """A simulator that refuses ``watch`` on secrets (list allowed) and ``get`` on configmaps."""
    kubeconfig = tmp_path / "sim.kubeconfig"
    proc = subprocess.Popen(
        [*EXE, "sim", "--port", "0", "--kubeconfig", str(kubeconfig),
         "--deny", "watch:secrets", "--deny", "get:configmaps"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    started = False
    while time.monotonic() < deadline and not started:
        started = re.search(r"listening on http://", proc.stdout.readline()) is not None
    assert started, "the simulator did not start"
    try:
        yield kubeconfig
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def _config(tmp_path: Path, kubeconfig: Path, resources: str) -> Path:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
                   f"resources: {resources}\n"
                   f"sinks: [{{name: out, kind: file, path: '{tmp_path / 'events.jsonl'}'}}]\n")
    return cfg


def test_a_served_and_permitted_configuration_passes(tmp_path: Path, denying_sim: Path) -> None:
    cfg = _config(tmp_path, denying_sim, "[{resource: po}, {resource: deploy, namespace: default},"
                                         " {resource: configmaps}]")
    r = run_cli("check-config", "--config", str(cfg), "--cluster")
    assert r.returncode == 0, r.stderr
    assert "configuration is valid" in r.stdout
    assert "the credentials may watch it" in r.stdout


def test_a_misspelt_resource_and_a_missing_rule_exit_2_naming_each(tmp_path: Path, denying_sim: Path) -> None:
    # Without --cluster the file alone is valid: a CRD could be called podz.
    cfg = _config(tmp_path, Path("/nonexistent/kubeconfig"),
                  "[{resource: podz}, {resource: secrets}, {resource: pods},"
                  " {resource: configmaps, label_selector: 'app=web'}]")
    assert run_cli("check-config", "--config", str(cfg)).returncode == 0
    r = run_cli("check-config", "--config", str(cfg), "--cluster", "--kubeconfig", str(denying_sim))
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert "Traceback" not in err
    assert "resources.0 ('podz'): unknown resource 'podz'" in err
    assert "did you mean pods" in err
    assert "resources.1 ('secrets'): the bridge's credentials may not watch" in err
    assert 'verbs: ["list", "watch"]' in err
    # A selector needs get (telling a selector exit from a delete), and get is what is missing.
    assert "resources.3 ('configmaps'): the bridge's credentials may not get" in err
    assert 'verbs: ["list", "watch", "get"]' in err
    assert "resources.2" not in err
    assert "3 problem(s)" in err


def test_an_unreachable_cluster_exits_2(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: x, user: {}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\n")
    cfg = _config(tmp_path, kubeconfig, "[{resource: pods}]")
    r = run_cli("check-config", "--config", str(cfg), "--cluster")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "resources.0 ('pods'): discovery failed" in r.stderr
