"""What a checkpoint write costs in each store, for the group commit's defaults (issue #27).

The group commit writes an informer's checkpoint once its sinks acknowledged ``commit_events``
changes or an acknowledgement is ``commit_delay`` seconds old: under steady churn, about
``1 / commit_delay`` writes per second per informer (5/s with the default 0.2 s). This measures,
per store (file; ConfigMap against the simulator in its own process; NATS KV against a real
nats-server) and per checkpoint size (objects known), the writes per second back to back and the
bridge process's CPU per write; the CPU share at 5 writes/s follows. The API server's or NATS
server's own cost is not included.

``python -m bench.bench_checkpoint_cost [--quick]``; results go to
``bench/results/checkpoint_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.common import SimProcess, machine_info, write_result
from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import Checkpoint, CheckpointStore, FileCheckpointStore
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore
from tests.brokers import running_nats

SIZES = (100, 1000, 10_000)
QUICK_SIZES = (100, 1000)
SECONDS = 3.0
GROUP_RATE = 5.0
"""Writes per second per informer under steady churn with the default ``commit_delay`` (0.2 s)."""


def checkpoint(objects: int, n: int) -> Checkpoint:
    index = {f"ns/cm-{i}": (f"uid-{i:08d}-0000-0000-0000-000000000000", str(1000 + i + n))
             for i in range(objects)}
    return Checkpoint(informer_id="v1.configmaps", resource_version=str(100_000 + n), objects=index,
                      written_at=time.time())


async def measure(store: CheckpointStore, objects: int, seconds: float) -> dict[str, float]:
    await store.save(checkpoint(objects, 0))  # the first write creates what later ones update
    n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += 1
        await store.save(checkpoint(objects, n))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    per_write = cpu / n
    return {"objects": objects, "writes": n, "writes_per_s": round(n / wall, 1),
            "cpu_ms_per_write": round(per_write * 1000, 2),
            "cpu_share_at_5_per_s": round(per_write * GROUP_RATE, 4)}


@contextlib.asynccontextmanager
async def stores() -> AsyncIterator[list[tuple[str, CheckpointStore]]]:
    with tempfile.TemporaryDirectory(prefix="keb-ckpt-cost-") as tmp, running_nats() as nats:
        sim = SimProcess()
        url = await sim.start()
        client = ApiClient(server=url)
        try:
            yield [("file", FileCheckpointStore(directory=tmp)),
                   ("configmap", ConfigMapCheckpointStore(client=client, namespace="default")),
                   ("nats-kv", NatsKvCheckpointStore(nats_url=nats.url))]
        finally:
            await client.close()
            await sim.stop()


async def run(sizes: tuple[int, ...], seconds: float) -> dict[str, Any]:
    rows = []
    async with stores() as all_stores:
        for name, store in all_stores:
            for objects in sizes:
                row = {"store": name, **await measure(store, objects, seconds)}
                print(row, flush=True)
                rows.append(row)
            await store.close()
    return {"machine": machine_info(), "seconds": seconds, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_checkpoint_cost")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    sizes = QUICK_SIZES if args.quick else SIZES
    result = asyncio.run(run(sizes, 1.5 if args.quick else SECONDS))
    print(write_result("checkpoint_cost", result))


if __name__ == "__main__":
    main()
