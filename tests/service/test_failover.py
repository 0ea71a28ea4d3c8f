"""Two replicas with leader election and a shared ConfigMap checkpoint, as separate processes: the
leader is SIGKILLed under churn, the standby takes over within the lease duration, and nothing is
lost across the two replicas' outputs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import informer_id
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.testing.processes import ProcessFailed, ServiceProcess, SimulatorProcess

NS = "failover"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    async with SimulatorProcess(log=tmp_path / "sim.log", kubeconfig=tmp_path / "sim.kubeconfig",
                                args=("--namespaces", NS)) as proc:
        yield proc.url, proc.kubeconfig


async def replica(tmp_path: Path, kubeconfig: Path, name: str) -> ServiceProcess:
    """Replica ``name`` started (the kit's process: ports it binds itself), its log in NAME.log."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        f"resources: [{{resource: configmaps, namespace: {NS}}}]\n"
        f"sinks: [{{name: out, kind: file, path: '{tmp_path / (name + '.jsonl')}'}}]\n"
        "checkpoint: {store: configmap, namespace: default, interval: 0.2,\n"
        f"             spill_directory: '{tmp_path / (name + '.spill')}'}}\n"
        "leader_election: {enabled: true, namespace: default, name: keb, lease_duration: 4,\n"
        "                  renew_deadline: 3, retry_period: 0.5}\n"
        "server: {host: 127.0.0.1, port: 0, admin_port: 0}\n"
        "logging: {level: info, format: json}\n"
    )
    proc = ServiceProcess(config=cfg, log=tmp_path / f"{name}.log",
                          env={"KEB_LEADER_ELECTION__IDENTITY": name})
    await proc.start()
    return proc


def events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


async def holder(client: ApiClient) -> str:
    try:
        lease = await client.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/keb")
    except Exception:
        return ""
    return str(lease["spec"].get("holderIdentity") or "")


async def eventually(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


async def test_leader_killed_standby_takes_over_and_nothing_is_lost(
        tmp_path: Path, sim: tuple[str, Path]) -> None:
    url, kubeconfig = sim
    client = ApiClient(server=url)
    path = f"/api/v1/namespaces/{NS}/configmaps"
    made: list[tuple[str, str]] = []  # (name, resourceVersion) of every change

    async def change(i: int) -> None:
        name = f"cm-{i % 7}"
        try:
            obj = await client.create(path, {"metadata": {"name": name}, "data": {"i": str(i)}})
        except Exception:
            obj = await client.patch(f"{path}/{name}", {"data": {"i": str(i)}})
        made.append((name, obj["metadata"]["resourceVersion"]))

    a = await replica(tmp_path, kubeconfig, "a")
    b: ServiceProcess | None = None
    try:
        async def a_leads() -> bool:
            return await holder(client) == "a"

        await eventually(a_leads, 20, "replica a to lead")

        async def a_synced() -> bool:
            # Every change below must be seen one by one (the test counts each resourceVersion): a
            # change made while a still lists would be folded into the list's state.
            log = tmp_path / "a.log"
            return log.exists() and b'"message":"initial sync done"' in log.read_bytes()

        await eventually(a_synced, 20, "replica a to sync")
        b = await replica(tmp_path, kubeconfig, "b")
        for i in range(20):
            await change(i)

        async def a_delivered() -> bool:
            return len(events(tmp_path / "a.jsonl")) >= 20

        await eventually(a_delivered, 20, "replica a to deliver")
        store = ConfigMapCheckpointStore(client=client, namespace="default",
                                         name_prefix="kube-event-bridge-checkpoint")
        ident = informer_id("configmaps", NS, "", "")

        async def a_checkpointed() -> bool:
            # The takeover resumes from the shared checkpoint: wait until a has written one that
            # covers what it delivered (a crash before the first checkpoint means a full relist).
            cp = await store.load(ident)
            return cp is not None and int(cp.resource_version) >= int(made[19][1])

        await eventually(a_checkpointed, 20, "replica a to checkpoint")

        async def b_watches() -> bool:
            # The takeover time is measured from b's last sight of a's renewals: b must be up.
            log = tmp_path / "b.log"
            return log.exists() and b'"message":"observed a new leader","lease":"keb","leader":"a"' in (
                log.read_bytes())

        await eventually(b_watches, 20, "replica b to observe a as the leader")
        assert events(tmp_path / "b.jsonl") == []  # the standby sends nothing
        await a.kill()
        for i in range(20, 40):
            await change(i)

        async def b_leads() -> bool:
            return await holder(client) == "b"

        # The bound on the takeover time (lease duration + a jittered retry period) is the subject
        # of tests/service/test_ha.py; this test is about the shared checkpoint: nothing lost, no
        # history re-sent. Here the takeover only has to happen.
        await eventually(b_leads, 10, "replica b to take over")

        async def b_caught_up() -> bool:
            rvs = {e["resourceversion"] for e in events(tmp_path / "b.jsonl")}
            return all(rv in rvs for _, rv in made[20:])

        await eventually(b_caught_up, 20, "replica b to deliver what happened after the kill")
        for i in range(40, 45):
            await change(i)

        async def all_made() -> bool:
            rvs = {e["resourceversion"] for e in events(tmp_path / "b.jsonl")}
            return all(rv in rvs for _, rv in made[40:])

        await eventually(all_made, 20, "replica b to keep delivering")
    finally:
        for p in (a, b):
            if p is not None and p.running:
                with contextlib.suppress(ProcessFailed):  # (killed after 15 s)
                    await p.stop(15)
        await client.close()
    delivered = events(tmp_path / "a.jsonl") + events(tmp_path / "b.jsonl")
    got = {(str(e["subject"]).split("/")[1], str(e["resourceversion"])) for e in delivered}
    missing = [c for c in made if c not in got]
    assert not missing, f"lost across the failover: {missing}"
    # b resumed from the shared checkpoint: it did not re-send the whole history.
    b_events = events(tmp_path / "b.jsonl")
    assert len(b_events) < len(made)
