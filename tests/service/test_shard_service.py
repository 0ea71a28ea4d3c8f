"""A sharded `kube-event-bridge run` process against the simulator over real HTTP: automatic sharding
from its pod name and StatefulSet, every /metrics sample labelled with its shard, and exit 2 naming
the field when automatic sharding cannot work."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from pathlib import Path

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from tests.service.test_service import get
from tests.service.test_sharding_auto import statefulset

EXE = [sys.executable, "-m", "bridge.service.cli"]
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, kubeconfig: Path, port: int) -> Path:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods, namespace: default}]\n"
        f"sinks: [{{name: out, kind: file, path: '{tmp_path / 'events.jsonl'}'}}]\n"
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 1}}\n"
        "sharding: {shards: auto, ordinal: auto}\n"
        f"server: {{host: 127.0.0.1, port: {port}, admin_port: 0}}\n"
        "shutdown_deadline: 10\n")
    return cfg


async def start(cfg: Path, pod: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "POD_NAME": pod, "POD_NAMESPACE": "ops", "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(*EXE, "run", "--config", str(cfg), env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)


async def test_a_shard_process_labels_its_metrics(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops")) as sim:
        for i in range(6):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        sim.store.create("statefulsets.apps", statefulset("keb", 3))
        port = free_port()
        proc = await start(write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc"), port), "keb-1")
        text = ""
        try:
            for _ in range(300):
                try:
                    status, text = await get(f"http://127.0.0.1:{port}/metrics")
                    if status == 200 and "keb_total_shards" in text:
                        break
                except OSError:
                    pass
                await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples
    assert all('shard="1"' in s and 'total_shards="3"' in s for s in samples), samples
    assert any(re.match(r'keb_total_shards\{.*\} 3(\.0)?$', s) for s in samples)


async def test_a_pod_past_the_statefulset_exits_2_naming_the_ordinal(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops")) as sim:
        sim.store.create("statefulsets.apps", statefulset("keb", 2))
        proc = await start(write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc"), free_port()),
                           "keb-2")
        _, stderr = await proc.communicate()
    assert proc.returncode == 2
    assert "sharding.ordinal: this pod's ordinal 2 is not below" in stderr.decode()
    assert "Traceback" not in stderr.decode()


async def test_rbac_refusal_exits_2_with_the_rule(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops"), forbidden=[("apps", "statefulsets")]) as sim:
        proc = await start(write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc"), free_port()),
                           "keb-0")
        _, stderr = await proc.communicate()
    assert proc.returncode == 2
    assert 'resourceNames: ["keb"], verbs: ["get"]' in stderr.decode()
