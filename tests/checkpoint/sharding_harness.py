"""Sharded bridges as they run in production, resharded under churn, checked against the ground truth.

The world, all real processes on loopback: the API-server simulator (``python -m bridge.sim``) with
ConfigMaps churned over HTTP, a Kafka broker (Tansu), and N ``kube-event-bridge run --config FILE``
processes, shard 0 … N-1 of N, sharing one file checkpoint directory. Each shard writes to the same
Kafka topic (keys and partitions as without sharding) and to a file of its own, which tells which
shard delivered what.

A run goes through a list of shard totals (``3 → 4 → 2``): every shard of one total is started,
runs under churn for a while, then all are stopped (SIGTERM: drain, final checkpoint) and the next
total starts, the churn never pausing. At the end the churn stops, the last generation catches up
(every shard's checkpoint reaches the last change) and is stopped.

The checker (:func:`check`): the ground truth is the churn's record of every change, as the server
answered each request (what a plain watch of the namespace shows). The union of what the shards
delivered to Kafka must be exactly those changes (nothing missing, nothing invented), each uid's
changes in the server's order; within one total no uid is delivered by two shards, and each is
delivered by the shard its uid hashes to; ``kube-event-bridge verify`` reading the topic must be
green; the checkpoints of the earlier totals must be gone. Re-sent events (a change delivered more
than once) are counted and bounded by the in-flight windows of the shards stopped at each reshard.

``python -m tests.checkpoint.sharding_harness --totals 3,4,2 --phase 20`` (``scripts/sharding-soak``)
runs longer variants; tests/checkpoint/test_sharding_processes.py runs a short one in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bridge.delivery.sharding import shard_id
from bridge.kube.apiclient import ApiClient
from bridge.kube.sharding import shard_of
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from bridge.testing.processes import ProcessFailed, ServiceProcess, wait_until
from tests.brokers import TansuBroker, running_tansu, unique_name
from tests.checkpoint.crash_harness import (
    CHANGE_TYPES,
    ROOT,
    Churn,
    decode,
    file_events,
    live_objects,
    replay,
    sim_process,
)

NS = "sharded"
BASE_ID = informer_id("configmaps", NS, "", "")
MAX_IN_FLIGHT = 32
BUFFER = 64


@dataclass
class Shard:
    """What one shard (or worker) of a total delivered to its own file sink; ``process`` is the
    ``kube-event-bridge run`` that ran it (None for a worker: its supervisor's process ran it)."""

    ordinal: int
    total: int
    events: Path
    process: ServiceProcess | None = None


def service_process(work: Path, config: dict[str, Any], tag: str) -> ServiceProcess:
    """``kube-event-bridge run`` with ``config`` (written to ``config-<tag>.yaml``), on ports it
    picks (the configuration's ``server.port`` is overridden with 0)."""
    path = work / f"config-{tag}.yaml"
    path.write_text(yaml.safe_dump(config))
    return ServiceProcess(config=path, log=work / f"bridge-{tag}.log", cwd=ROOT)


def shard_config(*, work: Path, kubeconfig: Path, kafka: str, topic: str, ordinal: int,
                 total: int) -> dict[str, Any]:
    tag = f"{total}-{ordinal}"
    return {
        "cluster": "sharded",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "configmaps", "namespace": NS}],
        "sinks": [
            {"name": "kafka", "kind": "kafka", "brokers": kafka, "destination": topic, "linger_ms": 1,
             "max_in_flight": MAX_IN_FLIGHT, "buffer": {"capacity": BUFFER},
             "retry": {"initial": 0.05, "max": 0.5}},
            {"name": "file", "kind": "file", "path": str(work / f"events-{tag}.jsonl")},
        ],
        "checkpoint": {"store": "file", "directory": str(work / "checkpoints"), "interval": 0.2,
                       "spill_directory": str(work / f"spill-{tag}")},
        "sharding": {"shards": total, "ordinal": ordinal},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "logging": {"level": "info", "format": "text"},
        "shutdown_deadline": 20,
    }


@dataclass
class Generation:
    total: int
    shards: list[Shard]
    """The shards of this total."""
    rv_at_stop: int = 0


@dataclass
class Result:
    totals: list[int]
    changes: int
    delivered: int
    resent: int
    bound: int
    problems: list[str] = field(default_factory=list)
    verify_output: str = ""

    def summary(self) -> str:
        lines = [f"totals {'→'.join(map(str, self.totals))}: {self.changes} changes, {self.delivered} "
                 f"change events delivered, {self.resent} re-sent (bound {self.bound})"]
        lines.extend(f"  PROBLEM {p}" for p in self.problems)
        return "\n".join(lines)


async def _checkpoints_at(store: FileCheckpointStore, total: int, rv: int) -> bool:
    for o in range(total):
        try:
            cp = await store.load(shard_id(BASE_ID, o, total))
        except Exception:
            return False
        if cp is None or int(cp.resource_version) < rv:
            return False
    return True


async def seed_objects(churn: Churn, count: int) -> None:
    """Some objects before the first start, so the first list has something to share."""
    for i in range(count):
        obj = await churn.client.create(churn.path, {"metadata": {"name": f"cm-{i}"}, "data": {"v": "0"}})
        churn.live[f"cm-{i}"] = obj["metadata"]["uid"]
        churn.produced.append(("added", f"{NS}/cm-{i}", obj["metadata"]["uid"],
                               obj["metadata"]["resourceVersion"]))


def left_over(ids: list[str], total: int) -> list[str]:
    """The checkpoint ids of ``ids`` that are not one of ``total``'s shards (a single shard's
    is the informer's own id, without a ``-of-1`` ending: :func:`shard_id` names them)."""
    own = {shard_id(BASE_ID, o, total) for o in range(total)}
    return [i for i in ids if i not in own]


async def catch_up(store: FileCheckpointStore, total: int, rv: int, timeout: float) -> list[str]:
    """Waits until every shard of ``total`` checkpointed ``rv`` (fails after ``timeout``), then up to
    a third of ``timeout`` until the earlier totals' checkpoints are removed; returns those left."""
    await wait_until(lambda: _checkpoints_at(store, total, rv), timeout=timeout,
                     what=f"the {total} last shards to catch up with resourceVersion {rv}")
    left: list[str] = []

    async def removed() -> bool:
        left[:] = left_over(await store.informer_ids(BASE_ID), total)
        return not left

    with contextlib.suppress(ProcessFailed):  # what is left is the check's to report
        await wait_until(removed, timeout=timeout / 3, what="the earlier totals' checkpoints removed")
    return left


async def verify_topic(kubeconfig: Path, kafka: TansuBroker, topic: str) -> tuple[int | None, str]:
    """``kube-event-bridge verify --strict`` of the topic against the cluster: (exit code, output)."""
    verify = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.service.cli", "verify", "--kubeconfig", str(kubeconfig),
        "--resource", f"configmaps@{NS}", "--kafka", kafka.bootstrap, "--topic", topic, "--strict",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await verify.communicate()
    return verify.returncode, out.decode()


async def stop_all(processes: list[ServiceProcess], what: str, timeout: float = 30.0) -> None:
    """SIGTERM to every process at once; each must exit 0 (a drain and a final checkpoint)."""
    codes = await asyncio.gather(*(p.stop(timeout) for p in processes))
    assert codes == [0] * len(processes), f"{what} exited with {codes}"


@dataclass
class World:
    """What the sharding and workers harnesses share: the simulator (its own process) with
    namespace :data:`NS` churned over HTTP, a Kafka topic, and the shared checkpoint directory."""

    kubeconfig: Path
    topic: str
    client: ApiClient
    churn: Churn
    store: FileCheckpointStore
    task: asyncio.Task[None] | None = None

    def start_churn(self) -> None:
        """Starts the churn (once: it never pauses across generations)."""
        if self.task is None:
            self.task = asyncio.create_task(self.churn.run(), name="harness-churn")

    async def finish(self, total: int, timeout: float) -> list[str]:
        """Stops the churn, then :func:`catch_up` of the last ``total``; the checkpoints left over."""
        self.churn.stop()
        task, self.task = self.task, None
        assert task is not None, "the churn never started"
        await task
        return await catch_up(self.store, total, int(self.churn.last_rv), timeout)


@contextlib.asynccontextmanager
async def world(work: Path, kafka: TansuBroker, *, prefix: str, rate: float, names: int,
                seed: int) -> AsyncIterator[World]:
    """A :class:`World` with ``names // 2`` objects made before the first bridge starts."""
    topic = unique_name(prefix)
    kafka.create_topic(topic, partitions=3)
    async with sim_process(work, namespaces=(NS,)) as (_, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        w = World(kubeconfig=kubeconfig, topic=topic, client=client,
                  churn=Churn(client=client, namespace=NS, rate=rate, names=names, seed=seed),
                  store=FileCheckpointStore(directory=work / "checkpoints"))
        try:
            await seed_objects(w.churn, names // 2)
            yield w
        finally:
            w.churn.stop()
            if w.task is not None:
                await asyncio.gather(w.task, return_exceptions=True)
            await client.close()


async def run(*, work: Path, kafka: TansuBroker, totals: list[int], phase: float, rate: float,
              names: int = 60, seed: int = 19, kill: bool = False) -> Result:
    """``kill``: the shards of each total but the last are stopped with SIGKILL (no drain, no final
    checkpoint) instead of SIGTERM."""
    generations: list[Generation] = []
    async with world(work, kafka, prefix="sharded", rate=rate, names=names, seed=seed) as w:
        try:
            for n, total in enumerate(totals):
                gen = Generation(total=total, shards=[])
                for o in range(total):
                    cfg = shard_config(work=work, kubeconfig=w.kubeconfig, kafka=kafka.bootstrap,
                                       topic=w.topic, ordinal=o, total=total)
                    gen.shards.append(Shard(ordinal=o, total=total, events=work / f"events-{total}-{o}.jsonl",
                                            process=service_process(work, cfg, f"{total}-{o}")))
                generations.append(gen)
                running = [s.process for s in gen.shards if s.process is not None]
                for p in running:
                    await p.start()
                for p in running:
                    await p.wait_ready(timeout=40.0)
                w.start_churn()
                await asyncio.sleep(phase)  # the shards of this total run under churn
                if n < len(totals) - 1 and kill:
                    for p in running:
                        await p.kill()
                elif n < len(totals) - 1:
                    await stop_all(running, f"shards of {total}")
                    gen.rv_at_stop = int(w.churn.last_rv or 0)
            left = await w.finish(totals[-1], timeout=60)
            await stop_all(running, "last shards")
            final = await live_objects(w.client, NS)
        finally:
            for gen in generations:
                for s in gen.shards:
                    if s.process is not None:
                        await s.process.kill()
        verify_code, verify_output = await verify_topic(w.kubeconfig, kafka, w.topic)
    records = await asyncio.to_thread(kafka.read_all, w.topic)
    return check(generations=generations, records=records, churn=w.churn, final=final,
                 verify_code=verify_code, verify_output=verify_output, left=left, totals=totals)


def check(*, generations: list[Generation], records: list[Any], churn: Churn,
          final: dict[str, tuple[str, str]], verify_code: int | None, verify_output: str,
          left: list[str], totals: list[int]) -> Result:
    problems: list[str] = []
    delivered = decode(records)
    changes = [d for d in delivered if d.type in CHANGE_TYPES]
    produced = {(t, s, u, rv) for t, s, u, rv in churn.produced}
    seen = {(d.type, d.subject, d.uid, d.rv) for d in changes}
    if replay(delivered) != final:
        problems.append("replaying the topic does not give the cluster's final state")
    missing = produced - seen
    if missing:
        problems.append(f"{len(missing)} changes never delivered, e.g. {sorted(missing)[:5]}")
    extra = seen - produced
    if extra:
        problems.append(f"{len(extra)} events never made, e.g. {sorted(extra)[:5]}")
    if any(d.final_state_unknown for d in changes):
        problems.append("inferred deletes although no history expired")
    order = {(t, u, rv): i for i, (t, _, u, rv) in enumerate(churn.produced)}
    by_uid: dict[str, list[int]] = collections.defaultdict(list)
    first: set[tuple[str, str, str]] = set()
    for d in sorted(changes, key=lambda d: (d.partition, d.offset)):
        k = (d.type, d.uid, d.rv)
        if k not in first and k in order:
            first.add(k)
            by_uid[d.uid].append(order[k])
    disorder = [u for u, seq in by_uid.items() if seq != sorted(seq)]
    if disorder:
        problems.append(f"per-object order violated for {len(disorder)} uids, e.g. {disorder[:3]}")
    # Within one total, each uid is delivered by one shard only: the one its uid hashes to.
    for gen in generations:
        owners: dict[str, set[int]] = collections.defaultdict(set)
        for s in gen.shards:
            for ce in file_events(s.events):
                uid = ce.get("uid")
                if uid:
                    owners[uid].add(s.ordinal)
        twice = {u: o for u, o in owners.items() if len(o) > 1}
        if twice:
            problems.append(f"total {gen.total}: {len(twice)} uids delivered by two shards, e.g. "
                            f"{list(twice.items())[:3]}")
        wrong = {u: o for u, o in owners.items() if o != {shard_of(u, gen.total)}}
        if wrong and not twice:
            problems.append(f"total {gen.total}: {len(wrong)} uids delivered by a shard that does not "
                            f"own them, e.g. {list(wrong.items())[:3]}")
        if not owners:
            problems.append(f"total {gen.total}: no shard delivered anything")
    if verify_code != 0:
        problems.append(f"kube-event-bridge verify exited {verify_code}:\n{verify_output}")
    if left:
        problems.append(f"checkpoints of earlier totals were not removed: {left}")
    deliveries = collections.Counter((d.type, d.uid, d.rv) for d in changes)
    resent = sum(n - 1 for n in deliveries.values())
    # What a reshard may re-send: per stopped shard, what was unacknowledged when it stopped (its
    # buffer and in-flight window); a graceful stop drains, so usually nothing.
    bound = sum(g.total for g in generations[:-1]) * (MAX_IN_FLIGHT + BUFFER)
    if resent > bound:
        problems.append(f"{resent} events re-sent, more than the in-flight bound {bound}")
    return Result(totals=totals, changes=len(churn.produced), delivered=len(changes), resent=resent,
                  bound=bound, problems=problems, verify_output=verify_output)


def soak_parser(prog: str, option: str, default: str, what: str) -> argparse.ArgumentParser:
    """The command line of a longer run: ``option`` lists the ``what`` (shard totals, worker
    counts) one after the other, then how long each runs under how much churn."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}")
    p.add_argument(option, default=default, help=f"{what} one after the other")
    p.add_argument("--phase", type=float, default=20.0, help="seconds each runs under churn")
    p.add_argument("--rate", type=float, default=100.0, help="changes per second")
    p.add_argument("--names", type=int, default=200, help="distinct object names churned")
    return p


def main() -> int:
    p = soak_parser("tests.checkpoint.sharding_harness", "--totals", "3,4,2", "shard totals")
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--kill", action="store_true", help="SIGKILL the shards at each reshard")
    args = p.parse_args()
    totals = [int(t) for t in args.totals.split(",")]
    with tempfile.TemporaryDirectory(prefix="keb-sharding-") as tmp, running_tansu() as kafka:
        result = asyncio.run(run(work=Path(tmp), kafka=kafka, totals=totals, phase=args.phase,
                                 rate=args.rate, names=args.names, seed=args.seed, kill=args.kill))
    print(result.summary())
    return 0 if not result.problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
