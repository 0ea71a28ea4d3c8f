"""A sharded `kube-event-bridge run` process against the simulator over real HTTP: automatic sharding
from its pod name and StatefulSet, every /metrics sample labelled with its shard, and exit 2 naming
the field when automatic sharding cannot work."""

from __future__ import annotations

import re
from pathlib import Path

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing.processes import ServiceProcess, wait_until
from tests.service.test_sharding_auto import statefulset


def write_config(tmp_path: Path, kubeconfig: Path) -> Path:
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods, namespace: default}]\n"
        f"sinks: [{{name: out, kind: file, path: '{tmp_path / 'events.jsonl'}'}}]\n"
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 1}}\n"
        "sharding: {shards: auto, ordinal: auto}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
        "shutdown_deadline: 10\n")
    return cfg


def service(tmp_path: Path, cfg: Path, pod: str) -> ServiceProcess:
    return ServiceProcess(config=cfg, log=tmp_path / "bridge.log",
                          env={"POD_NAME": pod, "POD_NAMESPACE": "ops"})


async def test_a_shard_process_labels_its_metrics(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops")) as sim:
        for i in range(6):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        sim.store.create("statefulsets.apps", statefulset("keb", 3))
        proc = service(tmp_path, write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc")), "keb-1")
        text = ""
        async with proc:
            await proc.wait_listening()

            async def labelled() -> bool:
                nonlocal text
                answer = await proc.get("/metrics")
                text = answer[1].decode() if answer is not None and answer[0] == 200 else ""
                return "keb_total_shards" in text

            await wait_until(labelled, timeout=30, what="keb_total_shards in /metrics", alive=proc)
            code = await proc.stop()
        assert code == 0, proc.output()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples
    assert all('shard="1"' in s and 'total_shards="3"' in s for s in samples), samples
    assert any(re.match(r'keb_total_shards\{.*\} 3(\.0)?$', s) for s in samples)


async def test_a_pod_past_the_statefulset_exits_2_naming_the_ordinal(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops")) as sim:
        sim.store.create("statefulsets.apps", statefulset("keb", 2))
        proc = service(tmp_path, write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc")), "keb-2")
        async with proc:
            assert await proc.wait(60) == 2
    assert "sharding.ordinal: this pod's ordinal 2 is not below" in proc.output()
    assert "Traceback" not in proc.output()


async def test_rbac_refusal_exits_2_with_the_rule(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops"), forbidden=[("apps", "statefulsets")]) as sim:
        proc = service(tmp_path, write_config(tmp_path, sim.write_kubeconfig(tmp_path / "kc")), "keb-0")
        async with proc:
            assert await proc.wait(60) == 2
    assert 'resourceNames: ["keb"], verbs: ["get"]' in proc.output()
