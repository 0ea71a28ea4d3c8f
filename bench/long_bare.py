"""The long scenario's simulator with a bare reader in the bridge's place: can it serve the rate?

The long scenario (``bench/bench_long.py``) judges the bridge by its 410s and its lag; both also
happen when the simulator itself does not serve its watch at the rate it generates. This runs the
same simulator (its own process, the same history of 200,000 events, 2,000 Pods, the same steady
generator) with a line-counting HTTP watch reader instead of the bridge (no decode, no sink) and
prints what the reader received, second by second:

    python -m bench.long_bare --rate 12000 --seconds 60

A reader that gets far fewer lines than were generated, in bursts with long gaps, says the
simulator is the limit on this machine, not the bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp
import orjson

from bench.common import BENCH_NAMESPACE, SimProcess


async def _run(rate: float, seconds: float, pods: int, history: int, sample: float) -> dict[str, Any]:
    async with SimProcess(history_size=history, watcher_buffer=history) as sim:
        rv = int((await sim.prefill(pods, BENCH_NAMESPACE))["rv"])
        seen = {"events": 0, "errors": 0}
        samples: list[tuple[float, int, int]] = []

        async def reader() -> None:
            params = {"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "3600"}
            async with aiohttp.ClientSession() as session, session.get(
                    f"{sim.url}/api/v1/namespaces/{BENCH_NAMESPACE}/pods", params=params,
                    timeout=aiohttp.ClientTimeout(total=None)) as resp:
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        if b'"ERROR"' in line[:40]:
                            seen["errors"] += 1
                            return
                        seen["events"] += 1

        async def sampler() -> None:
            t0, last = time.perf_counter(), 0
            while True:
                await asyncio.sleep(sample)
                n = seen["events"]
                samples.append((round(time.perf_counter() - t0, 1), n, n - last))
                last = n

        read_task = asyncio.create_task(reader(), name="bench:long-bare:reader")
        sample_task = asyncio.create_task(sampler(), name="bench:long-bare:sampler")
        try:
            sent = await sim.steady(rate, seconds)
            emitted = int(sent["events"])
            # Drain: until the reader has every line, stops getting any for 10 s, or ends.
            idle_since, last = time.perf_counter(), seen["events"]
            while (seen["events"] < emitted and not read_task.done()
                   and time.perf_counter() - idle_since < 10):
                await asyncio.sleep(0.5)
                if seen["events"] != last:
                    idle_since, last = time.perf_counter(), seen["events"]
        finally:
            for task in (read_task, sample_task):
                task.cancel()
            await asyncio.gather(read_task, sample_task, return_exceptions=True)
    return {"rate": rate, "seconds": seconds, "emitted": emitted,
            "achieved_rate": round(emitted / max(1e-9, float(sent["seconds"]))),
            "late_ticks": sent.get("late_ticks"), "read": seen["events"], "watch_errors": seen["errors"],
            "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=12_000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--pods", type=int, default=2_000)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--sample", type=float, default=1.0)
    args = parser.parse_args(argv)
    result = asyncio.run(_run(args.rate, args.seconds, args.pods, args.history, args.sample))
    samples = result.pop("samples")
    print(orjson.dumps(result).decode())
    print("t s, lines read so far, lines in the last sample")
    for t, total, delta in samples:
        print(f"{t:7.1f} {total:9,} {delta:7,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
