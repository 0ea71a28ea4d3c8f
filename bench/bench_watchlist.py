"""Initial sync through WatchList against list + watch: time to synced and the client's peak memory.

The simulator runs in a child process (its memory is not the client's), holding ``--pods`` realistic
Pods (~4.5 KB of JSON each). For each mode the client — a Reflector over the HTTP lister-watcher with
RawObjects and the managedFields cut, as the service runs it, into an indexed cache — starts cold and
is timed until its first sync; a second run with tracemalloc measures the peak of what the client
allocated meanwhile (the list mode holds whole pages of JSON; WatchList one line at a time).

    python -m bench.bench_watchlist --pods 5000 --repeat 3

Prints a table and writes ``bench/results/watchlist.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import random
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bridge.clock import RealClock
from bridge.informer.reflector import Reflector
from bridge.informer.store import IndexedCache
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.sim import Simulator
from bridge.sim.objects import make_pod

_RESULTS = Path(__file__).parent / "results" / "watchlist.json"


def _serve(pods: int, urls: Any, stop: Any) -> None:
    async def main() -> None:
        sim = Simulator(bookmark_interval=1.0)
        rng = random.Random(1)
        for i in range(pods):
            sim.store.create("pods", make_pod(f"web-{i:06d}", f"ns{i % 10}", rng=rng))
        await sim.start()
        urls.put(sim.url)
        await asyncio.to_thread(stop.wait)
        await sim.stop()

    asyncio.run(main())


async def _sync_once(url: str, *, watch_list: bool, page_size: int, traced: bool) -> tuple[float, int]:
    async with ApiClient(server=url) as client:
        resource = await Discovery(client=client).resolve("pods")
        lw = HttpListerWatcher(client=client, resource=resource, raw_objects=True, drop_managed_fields=True)
        cache = IndexedCache()
        gc.collect()
        if traced:
            tracemalloc.start()
        started = time.perf_counter()
        reflector = Reflector(name="pods", lister_watcher=lw, store=cache, clock=RealClock(),
                              use_watch_list=watch_list, page_size=page_size)
        task = asyncio.create_task(reflector.run(), name="bench-watchlist-reflector")
        while reflector.list_count == 0:  # noqa: ASYNC110 - a counter, no event to wait on
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - started
        peak = 0
        if traced:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        reflector.stop()
        await task
        assert len(cache.list()) > 0
        return elapsed, peak


async def _measure(url: str, repeat: int, page_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, watch_list in (("list+watch", False), ("watchlist", True)):
        times = [(await _sync_once(url, watch_list=watch_list, page_size=page_size, traced=False))[0]
                 for _ in range(repeat)]
        _, peak = await _sync_once(url, watch_list=watch_list, page_size=page_size, traced=True)
        out[mode] = {"sync_s_median": statistics.median(times), "sync_s": times, "peak_bytes": peak}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(args.pods, urls, stop), name="bench-watchlist-sim")
    proc.start()
    try:
        url = urls.get(timeout=600)
        result = asyncio.run(_measure(url, args.repeat, args.page_size))
    finally:
        stop.set()
        proc.join(30)
    result["pods"] = args.pods
    print(f"{'mode':<12} {'sync (median s)':>16} {'client peak (MB)':>17}")
    for mode in ("list+watch", "watchlist"):
        r = result[mode]
        print(f"{mode:<12} {r['sync_s_median']:>16.2f} {r['peak_bytes'] / 1e6:>17.1f}")
    _RESULTS.parent.mkdir(parents=True, exist_ok=True)
    _RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
