"""Sharding by object: burst throughput with 1 and 2 shards, and what each shard costs.

The scenario is the throughput burst (bench/bench_e2e.py): Pods exist, a bridge resumed right
before a burst of updates of every Pod, which waits in the watch history. Here ``total`` bridges run
at once, each in its own process (as replicas would), shard ``o`` of ``total`` by object
(docs/sharding.md): each watches the whole burst, keeps the Pods whose uid hashes to it and delivers
their changes to its own sink (the file sink by default, Kafka with ``--sink kafka``). Measured:

* throughput: every shard's events over the time until the last shard has them all acknowledged;
* per shard: its events, CPU seconds of its process (``process_time``, start-up included), peak RSS,
  and the watch events it recognised as another shard's and skipped at the decode step; and the
  bytes of the watch stream, which every shard reads whole (the API server's fan-out cost: N
  shards, N streams of every change);

plus the simulator's own pace (a bare client counting the watch lines), which bounds the rest: on
this 2-core machine the simulator, the shards and the broker share the cores. A third run measures
the skip directly: one process whose floors lie above the whole burst reads it and skips every
change (``skip_us_skipping_all``: its CPU per skipped change, start-up included), beside the
estimate from the two runs (``skip_us_from_two_shards``: two shards' CPU beyond one's, per change
skipped).

``python -m bench.bench_sharding [--quick] [--sink file|kafka]``; also ``python -m bench.run --only
sharding``; results in ``bench/results/sharding.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    BENCH_NAMESPACE,
    AckProbe,
    BrokerUrls,
    SimProcess,
    brokers,
    burst_setup,
    count_watch_events,
    machine_info,
    make_sink,
    watched_pods,
    write_result,
)

FULL = {"pods": 2000, "rounds": 10}
QUICK = {"pods": 300, "rounds": 5}
TIMEOUT = 300.0
_ROOT = Path(__file__).resolve().parent.parent


async def _watch_bytes(url: str, from_rv: int, count: int) -> int:
    """Bytes of the watch stream of the burst (what each shard reads from the API server)."""
    import aiohttp

    seen = size = 0
    params = {"watch": "1", "resourceVersion": str(from_rv), "timeoutSeconds": "120"}
    async with aiohttp.ClientSession() as session, session.get(
            f"{url}/api/v1/namespaces/{BENCH_NAMESPACE}/pods", params=params,
            timeout=aiohttp.ClientTimeout(total=120)) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            seen += chunk.count(b"\n")
            size += len(chunk)
            if seen >= count:
                break
    return size


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One shard: resumes right before the burst and delivers its share of it."""
    from bridge.clock import RealClock
    from bridge.delivery.pipeline import BridgePipeline, WatchedResource, http_informer_builder
    from bridge.delivery.sharding import filter_checkpoint
    from bridge.kube.apiclient import ApiClient
    from bridge.kube.sharding import ShardFilter
    from bridge.storage.checkpoint import Checkpoint
    from bridge.testing.stores import BareCheckpointStore

    shard = ShardFilter(ordinal=spec["ordinal"], total=spec["total"])
    skip_all = bool(spec.get("skip_all"))
    if skip_all:
        # Floors above the whole burst: the shard owns every object and skips every change, as a
        # shard skips another's (the identity pass, the bookmark through the reflector).
        shard.set_floors(1, {0: 1 << 62})
    base = watched_pods(BENCH_NAMESPACE)
    watched = WatchedResource(key=base.key, api=base.api, ref=base.ref, shard=shard)
    full = Checkpoint(informer_id=watched.informer_id, resource_version=spec["rv"],
                      objects={k: (u, rv) for k, u, rv in spec["index"]}, written_at=time.time())
    mine = filter_checkpoint(full, shard.owns)
    expected = 0 if skip_all else len(mine.objects) * spec["rounds"]
    to_skip = len(mine.objects) * spec["rounds"] if skip_all else 0
    probe = AckProbe(make_sink(spec["sink"], urls=BrokerUrls(kafka=spec["kafka"]), tmp_dir=Path(spec["tmp"]),
                               tag=f"{spec['total']}-{spec['ordinal']}"))
    client = ApiClient(server=spec["url"])
    clock = RealClock()
    store = BareCheckpointStore(mine)
    pipeline = BridgePipeline(resources=[watched], sinks=[probe], checkpoint_store=store,
                              build_informer=http_informer_builder(client=client, clock=clock,
                                                                   compact_cache=True),
                              checkpoint_interval=3600.0, clock=clock,
                              # A sink that falls behind spills (never degrades: every change counts).
                              spill_directory=Path(spec["tmp"]) / f"spill-{shard.total}-{shard.ordinal}")
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        await pipeline.start()
        done = await probe.wait_acked(expected, TIMEOUT)
        while done and shard.skipped < to_skip:
            if time.perf_counter() - t0 > TIMEOUT:
                done = False
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        await pipeline.shutdown(deadline=15.0)
        await client.close()
    if not done:
        raise TimeoutError(f"shard {shard.ordinal}/{shard.total}: {probe.acked}/{expected} acknowledged, "
                           f"{shard.skipped}/{to_skip} skipped")
    return {"ordinal": shard.ordinal, "events": expected, "seconds": round(seconds, 3),
            "events_per_s": round(expected / seconds) if seconds else 0, "cpu_seconds": round(cpu, 3),
            "cpu_us_per_own_event": round(cpu / max(1, expected) * 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "skipped": shard.skipped,
            "cpu_us_per_skipped": round(cpu / shard.skipped * 1e6, 1) if skip_all and shard.skipped else None}


async def _shards(total: int, common: dict[str, Any], *, skip_all: bool = False) -> dict[str, Any]:
    procs = []
    for o in range(total):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.bench_sharding", "--child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=_ROOT,
            limit=64 * 1024 * 1024)
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps({**common, "ordinal": o, "total": total, "skip_all": skip_all}))
        proc.stdin.close()
        procs.append(proc)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    wall = time.perf_counter() - t0
    shards = []
    for (out, _), p in zip(outs, procs, strict=True):
        if p.returncode != 0 or not out.strip():
            raise RuntimeError(f"a shard failed (exit {p.returncode}): {out[-2000:]!r}")
        shards.append(orjson.loads(out.strip().splitlines()[-1]))
    events = sum(s["events"] for s in shards) or sum(s["skipped"] for s in shards)
    slowest = max(s["seconds"] for s in shards)
    return {"shards": shards, "events": events, "seconds": slowest, "wall_seconds": round(wall, 3),
            "events_per_s": round(events / slowest) if slowest else 0}


async def _scenario(quick: bool, sink: str) -> dict[str, Any]:
    size = QUICK if quick else FULL
    out: dict[str, Any] = {**size, "sink": sink, "runs": {}}
    kinds = [sink] if sink != "file" else []
    with brokers(kinds) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-shard-") as tmp:
        for total in (1, 2, "skip_all"):
            # A fresh simulator per total: each run reads the same burst from the same history.
            async with SimProcess() as sim:
                setup = await burst_setup(sim, pods=size["pods"], rounds=size["rounds"])
                replay = await count_watch_events(sim.url, BENCH_NAMESPACE, setup.rv_before, setup.events)
                common = {"url": sim.url, "rv": str(setup.rv_before), "rounds": size["rounds"],
                          "index": [[k, u, rv] for k, (u, rv) in setup.checkpoint.objects.items()],
                          "sink": sink, "kafka": urls.kafka, "tmp": tmp}
                run = await _shards(1 if total == "skip_all" else int(total), common,
                                    skip_all=total == "skip_all")
                run["simulator_replay_events_per_s"] = round(replay)
                run["watch_stream_bytes_per_shard"] = await _watch_bytes(sim.url, setup.rv_before,
                                                                         setup.events)
                out["runs"][str(total)] = run
    one, two = out["runs"]["1"], out["runs"]["2"]
    out["speedup_2_over_1"] = round(two["events_per_s"] / max(1, one["events_per_s"]), 2)
    # Per skipped change: two shards' CPU beyond one's, over the changes they skipped; and directly,
    # one process skipping the whole burst (start-up included).
    extra = sum(s["cpu_seconds"] for s in two["shards"]) - one["shards"][0]["cpu_seconds"]
    out["skip_us_from_two_shards"] = round(max(0.0, extra) / one["events"] * 1e6, 1)
    out["skip_us_skipping_all"] = out["runs"]["skip_all"]["shards"][0]["cpu_us_per_skipped"]
    out["deliver_us"] = one["shards"][0]["cpu_us_per_own_event"]
    return out


def run(quick: bool = False, results_dir: Path | None = None, sink: str = "file") -> dict[str, Any]:
    result = asyncio.run(_scenario(quick, sink))
    result["quick"] = quick
    result["machine"] = machine_info()
    write_result("sharding", result, results_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_sharding")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sink", default="file", choices=("file", "kafka"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        spec = orjson.loads(sys.stdin.buffer.read())
        os.environ.setdefault("PYTHONHASHSEED", "0")
        print(orjson.dumps(asyncio.run(_child(spec))).decode(), flush=True)
        return 0
    result = run(quick=args.quick, sink=args.sink)
    shown = {k: v for k, v in result.items() if k != "machine"}
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
