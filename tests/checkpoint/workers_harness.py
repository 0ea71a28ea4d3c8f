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

import asyncio
import math
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.testing.processes import ServiceProcess, wait_until
from tests.brokers import TansuBroker, running_tansu
from tests.checkpoint.crash_harness import live_objects
from tests.checkpoint.sharding_harness import (
    BUFFER,
    MAX_IN_FLIGHT,
    NS,
    Generation,
    Result,
    Shard,
    check,
    service_process,
    shard_config,
    soak_parser,
    stop_all,
    verify_topic,
    world,
)

CHECKPOINT_INTERVAL = 0.2


def workers_config(*, work: Path, kubeconfig: Path, kafka: str, topic: str, workers: int,
                   tag: str) -> dict[str, Any]:
    """One replica's configuration with ``workers``; no ``sharding`` section (one replica)."""
    cfg = shard_config(work=work, kubeconfig=kubeconfig, kafka=kafka, topic=topic, ordinal=0, total=1)
    del cfg["sharding"]
    cfg["workers"] = workers
    cfg["sinks"][1]["path"] = str(work / f"events-{tag}.jsonl")
    cfg["checkpoint"]["interval"] = CHECKPOINT_INTERVAL
    cfg["checkpoint"]["spill_directory"] = str(work / f"spill-{tag}")
    return cfg


async def kill_worker(bridge: ServiceProcess, worker: int, timeout: float = 60.0) -> tuple[int, int]:
    """SIGKILLs ``worker`` by the PID ``/readyz`` reports and waits until the supervisor has restarted
    it and the pod is ready again; returns (old PID, new PID)."""
    before = await bridge.readyz()
    assert before is not None, "the supervisor does not answer /readyz"
    old = int(before[1]["workers"][worker]["pid"])
    os.kill(old, signal.SIGKILL)
    new: list[int] = []

    async def restarted() -> bool:
        now = await bridge.readyz()
        if now is None:
            return False
        w = now[1]["workers"][worker]
        if now[1]["ready"] and w["pid"] not in (None, old):
            assert w["restarts"] == 1, now
            new.append(int(w["pid"]))
            return True
        return False

    await wait_until(restarted, timeout=timeout, what=f"worker {worker} to come back", alive=bridge)
    return old, new[0]


async def scrape(bridge: ServiceProcess) -> str:
    answer = await bridge.get("/metrics", timeout=10)
    assert answer is not None, "the supervisor does not answer /metrics"
    assert answer[0] == 200
    return answer[1].decode()


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
    generations: list[Generation] = []
    bridges: list[ServiceProcess] = []
    scrapes: list[str] = []
    killed = (0, 0)
    async with world(work, kafka, prefix="workers", rate=rate, names=names, seed=seed) as w:
        try:
            for n, count in enumerate(counts):
                tag = f"g{n}"
                bridge = service_process(work, workers_config(
                    work=work, kubeconfig=w.kubeconfig, kafka=kafka.bootstrap, topic=w.topic,
                    workers=count, tag=tag), tag)
                bridges.append(bridge)
                generations.append(Generation(total=count, shards=[
                    Shard(ordinal=i, total=count, events=work / f"events-{tag}.worker-{i}.jsonl")
                    for i in range(count)]))
                await bridge.start()
                await bridge.wait_ready(timeout=90.0)
                w.start_churn()
                if n == 0:
                    await asyncio.sleep(phase / 2)  # the workers run under churn
                    killed = await kill_worker(bridge, kill)
                    await asyncio.sleep(phase / 2)
                else:
                    await asyncio.sleep(phase)
                if n < len(counts) - 1:
                    scrapes.append(await scrape(bridge))
                    await stop_all([bridge], f"the bridge with {count} workers", timeout=60)
            left = await w.finish(counts[-1], timeout=90)
            scrapes.append(await scrape(bridges[-1]))
            await stop_all([bridges[-1]], f"the bridge with {counts[-1]} workers", timeout=60)
            final = await live_objects(w.client, NS)
        finally:
            for b in bridges:
                await b.kill()
        verify_code, verify_output = await verify_topic(w.kubeconfig, kafka, w.topic)
    records = await asyncio.to_thread(kafka.read_all, w.topic)
    result = check(generations=generations, records=records, churn=w.churn, final=final,
                   verify_code=verify_code, verify_output=verify_output, left=left, totals=counts)
    bound = MAX_IN_FLIGHT + BUFFER + math.ceil(rate * CHECKPOINT_INTERVAL)
    return WorkersResult(result=result, killed=killed, metrics=scrapes, resend_bound=bound)


def main() -> int:
    p = soak_parser("tests.checkpoint.workers_harness", "--counts", "2,3", "worker counts")
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
