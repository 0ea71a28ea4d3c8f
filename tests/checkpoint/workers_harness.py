"""A replica running ``workers: N`` as it runs in production, a worker SIGKILLed, N changed, checked
against the ground truth.

The world, all real processes on loopback (the machinery of :mod:`tests.checkpoint.sharding_harness`):
the API-server simulator with ConfigMaps churned over HTTP, a Kafka broker (Tansu), and one
``kube-event-bridge run --config FILE`` with ``workers: N``: a supervisor and its N worker
processes. Every worker writes to the same Kafka topic and to a file of its own (the file sink's
``events.worker-<w>.jsonl``), which tells which worker delivered what.

A run goes through a list of worker counts (``2 → 3``). In the first, once the churn runs, one
worker is SIGKILLed by the PID the supervisor's ``/readyz`` reports; the supervisor restarts it
alone and it resumes from its shard's checkpoint. Each count ends with SIGTERM of the supervisor
(every worker drains and writes its final checkpoint) and the bridge is started again with the next
count (a change of ``workers`` in the configuration), the churn never pausing.

The check is :func:`tests.checkpoint.sharding_harness.check`, each worker being shard ``w`` of
``N``: the union of what the workers delivered equals every change the churn made, each uid's
changes in the server's order, no uid delivered by two workers of one count nor by a worker that does
not own it, ``kube-event-bridge verify`` green, the earlier count's checkpoints removed. Re-sends are
bounded by what the SIGKILLed worker had not acknowledged or not checkpointed: its buffer, its
in-flight window and one checkpoint interval of changes (docs/sharding.md, "Workers").

``python -m tests.checkpoint.workers_harness --counts 2,3 --phase 20`` runs a longer variant.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import FileCheckpointStore
from tests.brokers import TansuBroker, free_port, running_tansu, unique_name
from tests.checkpoint.crash_harness import ROOT, Churn, live_objects, sim_process
from tests.checkpoint.sharding_harness import (
    BASE_ID,
    BUFFER,
    MAX_IN_FLIGHT,
    NS,
    Generation,
    Result,
    ShardProc,
    _checkpoints_at,
    check,
    shard_config,
)

CHECKPOINT_INTERVAL = 0.2


def workers_config(*, work: Path, kubeconfig: Path, kafka: str, topic: str, workers: int, tag: str,
                   port: int) -> dict[str, Any]:
    """One replica's configuration with ``workers``; no ``sharding`` section (one replica)."""
    cfg = shard_config(work=work, kubeconfig=kubeconfig, kafka=kafka, topic=topic, ordinal=0, total=1,
                       port=port)
    del cfg["sharding"]
    cfg["workers"] = workers
    cfg["sinks"][1]["path"] = str(work / f"events-{tag}.jsonl")
    cfg["checkpoint"]["interval"] = CHECKPOINT_INTERVAL
    cfg["checkpoint"]["spill_directory"] = str(work / f"spill-{tag}")
    return cfg


async def _readyz(http: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    async with http.get(f"http://127.0.0.1:{port}/readyz", timeout=aiohttp.ClientTimeout(total=5)) as r:
        body: dict[str, Any] = await r.json()
        return body


async def kill_worker(http: aiohttp.ClientSession, bridge: ShardProc, worker: int,
                      timeout: float = 60.0) -> tuple[int, int]:
    """SIGKILLs ``worker`` by the PID ``/readyz`` reports and waits until the supervisor has restarted
    it and the pod is ready again; returns (old PID, new PID)."""
    before = await _readyz(http, bridge.port)
    old = int(before["workers"][worker]["pid"])
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, (f"worker {worker} never came back: "
                                             f"{bridge.log.read_text()[-3000:]}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            now = await _readyz(http, bridge.port)
            w = now["workers"][worker]
            if now["ready"] and w["pid"] not in (None, old):
                assert w["restarts"] == 1, now
                return old, int(w["pid"])
        await asyncio.sleep(0.1)


async def scrape(http: aiohttp.ClientSession, port: int) -> str:
    async with http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        assert r.status == 200
        return await r.text()


@dataclass
class WorkersResult:
    result: Result
    killed: tuple[int, int]
    """(PID killed, PID of the worker restarted in its place)."""
    metrics: list[str]
    """The pod's /metrics as scraped at the end of each count."""
    resend_bound: int


async def run(*, work: Path, kafka: TansuBroker, counts: list[int], phase: float, rate: float,
              names: int = 60, seed: int = 23, kill: int = 1) -> WorkersResult:
    """``kill``: the worker SIGKILLed halfway through the first count."""
    topic = unique_name("workers")
    kafka.create_topic(topic, partitions=3)
    store = FileCheckpointStore(directory=work / "checkpoints")
    generations: list[Generation] = []
    bridges: list[ShardProc] = []
    scrapes: list[str] = []
    killed = (0, 0)
    left: list[str] = []
    async with sim_process(work, namespaces=(NS,)) as (_, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        churn = Churn(client=client, namespace=NS, rate=rate, names=names, seed=seed)
        churn_task: asyncio.Task[None] | None = None
        try:
            for i in range(names // 2):
                obj = await client.create(churn.path, {"metadata": {"name": f"cm-{i}"}, "data": {"v": "0"}})
                churn.live[f"cm-{i}"] = obj["metadata"]["uid"]
                churn.produced.append(("added", f"{NS}/cm-{i}", obj["metadata"]["uid"],
                                       obj["metadata"]["resourceVersion"]))
            async with aiohttp.ClientSession() as http:
                for n, count in enumerate(counts):
                    tag = f"g{n}"
                    port = free_port()
                    cfg = work / f"config-{tag}.yaml"
                    cfg.write_text(yaml.safe_dump(workers_config(
                        work=work, kubeconfig=kubeconfig, kafka=kafka.bootstrap, topic=topic,
                        workers=count, tag=tag, port=port)))
                    bridge = ShardProc(ordinal=0, total=1, config=cfg, log=work / f"bridge-{tag}.log",
                                       events=work / f"events-{tag}.jsonl", port=port)
                    bridges.append(bridge)
                    generations.append(Generation(total=count, shards=[
                        ShardProc(ordinal=w, total=count, config=cfg, log=bridge.log,
                                  events=work / f"events-{tag}.worker-{w}.jsonl", port=port)
                        for w in range(count)]))
                    bridge.start()
                    await bridge.wait_ready(http, timeout=90.0)
                    if churn_task is None:
                        churn_task = asyncio.create_task(churn.run(), name="workers-churn")
                    if n == 0:
                        await asyncio.sleep(phase / 2)
                        killed = await kill_worker(http, bridge, kill)
                        await asyncio.sleep(phase / 2)
                    else:
                        await asyncio.sleep(phase)
                    if n < len(counts) - 1:
                        scrapes.append(await scrape(http, port))
                        code = await bridge.stop(timeout=60)
                        assert code == 0, f"the bridge with {count} workers exited with {code}"
                churn.stop()
                assert churn_task is not None
                await churn_task
                churn_task = None
                last = int(churn.last_rv)
                deadline = time.monotonic() + 90
                while not await _checkpoints_at(store, counts[-1], last):
                    assert time.monotonic() < deadline, "the last workers never caught up"
                    await asyncio.sleep(0.1)
                deadline = time.monotonic() + 30
                while True:
                    left = [i for i in await store.informer_ids(BASE_ID)
                            if not i.endswith(f"-of-{counts[-1]}")]
                    if not left or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
                scrapes.append(await scrape(http, bridges[-1].port))
                code = await bridges[-1].stop(timeout=60)
                assert code == 0, f"the bridge with {counts[-1]} workers exited with {code}"
            final = await live_objects(client, NS)
        finally:
            churn.stop()
            if churn_task is not None:
                await asyncio.gather(churn_task, return_exceptions=True)
            for b in bridges:
                b.kill()
            await client.close()
        verify = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.service.cli", "verify",
            "--kubeconfig", str(kubeconfig), "--resource", f"configmaps@{NS}", "--kafka", kafka.bootstrap,
            "--topic", topic, "--strict", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await verify.communicate()
    records = await asyncio.to_thread(kafka.read_all, topic)
    result = check(generations=generations, records=records, churn=churn, final=final,
                   verify_code=verify.returncode, verify_output=out.decode(), left=left, totals=counts)
    bound = MAX_IN_FLIGHT + BUFFER + math.ceil(rate * CHECKPOINT_INTERVAL)
    return WorkersResult(result=result, killed=killed, metrics=scrapes, resend_bound=bound)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.checkpoint.workers_harness")
    p.add_argument("--counts", default="2,3", help="worker counts one after the other")
    p.add_argument("--phase", type=float, default=20.0, help="seconds each count runs under churn")
    p.add_argument("--rate", type=float, default=100.0, help="changes per second")
    p.add_argument("--names", type=int, default=200, help="distinct object names churned")
    args = p.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="keb-workers-") as tmp, running_tansu() as kafka:
        out = asyncio.run(run(work=Path(tmp), kafka=kafka, counts=counts, phase=args.phase,
                              rate=args.rate, names=args.names))
    print(out.result.summary() + f"\n  worker SIGKILLed: pid {out.killed[0]} → restarted as pid "
          f"{out.killed[1]}; re-sent bound {out.resend_bound}")
    return 0 if not out.result.problems and out.result.resent <= out.resend_bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
