"""Sharding by node, as the chart's DaemonSet runs it: one ``kube-event-bridge run`` per node plus the
replica that owns the Pods bound to no node, against the simulator under churn (real processes,
file sinks read back).

Pods are created unscheduled and bound to a node later (``pods/binding``, as the scheduler does),
updated and deleted,
some before they are bound. From the sinks alone: the union of what the replicas delivered equals
the cluster (every change the churn made, and the live Pods at the end); each Pod's changes come in
order; each binding is a hand-over between two replicas, marked: the unscheduled owner sends a
``deleted`` with ``leftselector: "true"`` and the node's replica an ``added``, both at the binding's
resourceVersion; no Pod is delivered by a node it was not bound to. Then a node goes away: its
replica stops, its Pods are deleted (as the pod garbage collector does), and a replica started
for that node name (the procedure of docs/sharding.md, "When a node goes away") resumes from the
node's checkpoint and delivers those deletes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bridge.errors import ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import informer_id
from bridge.testing.processes import ProcessFailed, ServiceProcess
from tests.checkpoint.crash_harness import ROOT, sim_process

NS = "nodes"
NODES = ("node-a", "node-b", "node-c")
UNSCHEDULED = "unscheduled"
CE = "io.kube-event-bridge."


@dataclass
class Replica:
    """``kube-event-bridge run`` for one node (``NODE_NAME`` set, as the downward API sets it), or
    the unscheduled owner."""

    name: str
    work: Path
    kubeconfig: Path
    process: ServiceProcess = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.work / f"config-{self.name}.yaml"
        cfg.write_text(yaml.safe_dump(self.config()))
        env = {} if self.name == UNSCHEDULED else {"NODE_NAME": self.name}
        self.process = ServiceProcess(config=cfg, log=self.log, cwd=ROOT, env=env, unset=("NODE_NAME",))

    @property
    def events(self) -> Path:
        return self.work / f"events-{self.name}.jsonl"

    @property
    def log(self) -> Path:
        return self.work / f"log-{self.name}.txt"

    def config(self) -> dict[str, Any]:
        sharding: dict[str, Any] = {"strategy": "node"}
        if self.name == UNSCHEDULED:
            sharding["unscheduled"] = True
        return {
            "cluster": "nodes",
            "kubernetes": {"kubeconfig": str(self.kubeconfig), "in_cluster": "false"},
            "resources": [{"resource": "pods", "namespace": NS}],
            "sinks": [{"name": "file", "kind": "file", "path": str(self.events)}],
            "checkpoint": {"store": "file", "directory": str(self.work / "checkpoints"), "interval": 0.2,
                           "spill_directory": ""},
            "sharding": sharding,
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "logging": {"level": "info", "format": "text"},
            "shutdown_deadline": 20,
        }

    async def start(self) -> None:
        await self.process.start()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        await self.process.wait_ready(timeout)

    async def stop(self) -> int | None:
        """SIGTERM; the exit code (SIGKILL's after 40 s)."""
        with contextlib.suppress(ProcessFailed):
            return await self.process.stop(40)
        return self.process.returncode

    def read(self) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [orjson.loads(line) for line in self.events.read_bytes().splitlines() if line.strip()]


@dataclass
class PodChurn:
    """Creates Pods unscheduled, binds them, updates and deletes them; records every change."""

    client: ApiClient
    names: int = 40
    produced: list[tuple[str, str, str]] = field(default_factory=list)
    """(kind of change, uid, resourceVersion): created, updated, bound, deleted."""
    node_of: dict[str, str] = field(default_factory=dict)
    """uid → node it was bound to."""
    live: dict[str, str] = field(default_factory=dict)
    """name → uid."""

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{NS}/pods"

    def _record(self, change: str, obj: dict[str, Any]) -> None:
        self.produced.append((change, obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]))

    async def step(self, rng: random.Random) -> None:
        name = f"pod-{rng.randrange(self.names)}"
        uid = self.live.get(name)
        if uid is None:
            obj = await self.client.create(self.path, {
                "metadata": {"name": name, "labels": {"v": "0"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
            self.live[name] = obj["metadata"]["uid"]
            self._record("created", obj)
            return
        roll = rng.random()
        if roll < 0.15:
            obj = await self.client.delete(f"{self.path}/{name}")
            del self.live[name]
            self._record("deleted", obj)
        elif roll < 0.5 and uid not in self.node_of:
            node = rng.choice(NODES)
            # As the scheduler binds a Pod: the binding subresource sets spec.nodeName.
            await self.client.create(f"{self.path}/{name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"kind": "Node", "name": node}})
            self.node_of[uid] = node
            self._record("bound", await self.client.get(f"{self.path}/{name}"))
        else:
            obj = await self.client.patch(f"{self.path}/{name}",
                                          {"metadata": {"labels": {"v": str(rng.random())}}})
            self._record("updated", obj)

    async def run(self, seconds: float, rate: float, seed: int) -> None:
        rng = random.Random(seed)
        loop = asyncio.get_running_loop()
        start, done = loop.time(), 0
        while loop.time() - start < seconds:
            with contextlib.suppress(ConflictError, NotFoundError):
                await self.step(rng)
            done += 1
            ahead = done / rate - (loop.time() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)


def _changes(events: list[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    """(type, uid, resourceVersion, leftselector) of the change events of one sink, in its order."""
    return [(str(e["type"]).removeprefix(CE), str(e["uid"]), int(e["resourceversion"]),
             e.get("leftselector") == "true")
            for e in events if str(e["type"]).removeprefix(CE) in ("added", "updated", "deleted")]


async def _caught_up(replicas: list[Replica], last_rv: int, timeout: float = 60.0) -> None:
    """Waits until every change up to ``last_rv`` that concerns a replica is in its file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = {int(e[2]) for r in replicas for e in _changes(r.read())}
        if last_rv in seen:
            await asyncio.sleep(1.0)  # the other replicas' share of the same instant
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"resourceVersion {last_rv} never delivered")


def check(churn: PodChurn, sinks: dict[str, list[dict[str, Any]]],
          live: dict[str, int]) -> tuple[list[str], int]:
    """Problems found, and the number of hand-overs counted from the sinks."""
    problems: list[str] = []
    per_uid: dict[str, list[tuple[int, str, str, bool]]] = collections.defaultdict(list)
    for replica, events in sinks.items():
        by_uid: dict[str, list[int]] = collections.defaultdict(list)
        for type_, uid, rv, left in _changes(events):
            by_uid[uid].append(rv)
            per_uid[uid].append((rv, replica, type_, left))
            bound_to = churn.node_of.get(uid)
            if replica != UNSCHEDULED and bound_to != replica:
                problems.append(f"{uid} delivered by {replica}, bound to {bound_to}")
        for uid, rvs in by_uid.items():
            if rvs != sorted(rvs) or len(set(rvs)) != len(rvs):
                problems.append(f"{replica}: {uid} out of order or repeated: {rvs}")
    handovers = 0
    for change, uid, rv_text in churn.produced:
        rv = int(rv_text)
        got = {(r, t, left) for v, r, t, left in per_uid[uid] if v == rv}
        node = churn.node_of.get(uid, UNSCHEDULED)
        if change == "created":
            want = {(UNSCHEDULED, "added", False)}
        elif change == "bound":
            want = {(UNSCHEDULED, "deleted", True), (node, "added", False)}
            if want <= got:
                handovers += 1
        elif change == "updated":
            bound_rv = next((int(v) for c, u, v in churn.produced if u == uid and c == "bound"), None)
            owner = node if bound_rv is not None and rv > bound_rv else UNSCHEDULED
            want = {(owner, "updated", False)}
        else:
            bound = any(c == "bound" and u == uid for c, u, _ in churn.produced)
            want = {(node if bound else UNSCHEDULED, "deleted", False)}
        if got != want:
            problems.append(f"{change} of {uid} at {rv}: delivered {sorted(got)}, expected {sorted(want)}")
    # The union, replayed per uid in resourceVersion order (an exit before the node's add at the
    # same resourceVersion), is the cluster.
    final: dict[str, int] = {}
    for uid, delivered in per_uid.items():
        state: int | None = None
        for v, _, kind, _left in sorted(delivered, key=lambda e: (e[0], not e[3])):
            state = None if kind == "deleted" else v
        if state is not None:
            final[uid] = state
    if final != live:
        problems.append(f"union of the sinks != the cluster: {len(final)} vs {len(live)} live Pods, "
                        f"differing {sorted(set(final.items()) ^ set(live.items()))[:10]}")
    return problems, handovers


async def _live(client: ApiClient) -> dict[str, int]:
    listed = await client.get(f"/api/v1/namespaces/{NS}/pods")
    return {i["metadata"]["uid"]: int(i["metadata"]["resourceVersion"]) for i in listed["items"]}


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_one_replica_per_node_plus_the_unscheduled_owner_under_churn(tmp_path: Path) -> None:
    async with sim_process(tmp_path, namespaces=(NS,)) as (_, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        replicas = {name: Replica(name=name, work=tmp_path, kubeconfig=kubeconfig)
                    for name in (*NODES, UNSCHEDULED)}
        churn = PodChurn(client=client)
        try:
            for r in replicas.values():
                await r.start()
            for r in replicas.values():
                await r.wait_ready()
            await churn.run(seconds=8.0, rate=40.0, seed=25)
            await _caught_up(list(replicas.values()), int(churn.produced[-1][2]))
            sinks = {name: r.read() for name, r in replicas.items()}
            problems, handovers = check(churn, sinks, await _live(client))
            assert not problems, "\n".join(problems[:30])
            binds = sum(1 for c, _, _ in churn.produced if c == "bound")
            assert binds >= 20
            assert handovers == binds
            # Checkpoints per node: one per replica, each at its own scope.
            checkpoints = {p.name for p in (tmp_path / "checkpoints").glob("pods.nodes.*.ckpt")}
            assert checkpoints == {f"{informer_id('pods', NS, '', f'spec.nodeName={n}')}.ckpt"
                                   for n in (*NODES, "")}

            # A node goes away: its replica with it; the pod garbage collector deletes its Pods.
            gone = replicas["node-c"]
            assert await gone.stop() == 0
            orphans = [(name, uid) for name, uid in churn.live.items()
                       if churn.node_of.get(uid) == "node-c"]
            assert orphans, "the churn bound nothing to node-c"
            for name, _ in orphans:
                obj = await client.delete(f"{churn.path}/{name}")
                del churn.live[name]
                churn._record("deleted", obj)
            await asyncio.sleep(1.0)
            # Nobody watches node-c: its deletes are not delivered yet.
            missing, _ = check(churn, {n: r.read() for n, r in replicas.items()}, await _live(client))
            assert len(missing) >= len(orphans)
            # A replica for node-c, anywhere, resumes from node-c's checkpoint and delivers them.
            await gone.start()
            await gone.wait_ready()
            await _caught_up([gone], int(churn.produced[-1][2]))
            problems, _ = check(churn, {n: r.read() for n, r in replicas.items()}, await _live(client))
            assert not problems, "\n".join(problems[:30])
        finally:
            codes = [await r.stop() for r in replicas.values()]
            await client.close()
        assert codes == [0, 0, 0, 0], [r.log.read_text()[-2000:] for r in replicas.values()]
