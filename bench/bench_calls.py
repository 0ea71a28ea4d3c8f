"""Python function calls per event of the throughput scenario's bridge run, under cProfile.

The count of calls does not depend on the machine's load (unlike CPU seconds on a shared machine),
so it is the figure to compare before and after a change of the event path. Only the bridge's part
is profiled: the simulator runs in its own process and the burst's setup is outside the profile;
the profile covers ``bridge_pipeline`` from ``start()`` to the sink's last acknowledgement, start-up
included (a few thousand calls, under one per event at the default size).

``python -m bench.bench_calls [--pods 2000] [--rounds 5] [--sink file] [--top 40]`` prints the calls
per event, the calls per event by module, and the functions called most often (with their callers
when ``--callers NAME`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.bench_e2e import _bridge_burst
from bench.common import SimProcess, brokers, burst_setup


async def _profiled(pods: int, rounds: int, sink: str) -> tuple[cProfile.Profile, int]:
    with brokers([sink]) as urls, tempfile.TemporaryDirectory(prefix="keb-calls-") as tmp_name:
        async with SimProcess() as sim:
            setup = await burst_setup(sim, pods=pods, rounds=rounds)
            prof = cProfile.Profile()
            prof.enable()
            try:
                await _bridge_burst(sim, setup, sink, urls,
                                    Path(tmp_name), 240.0)
            finally:
                prof.disable()
    return prof, setup.events


def _module(filename: str) -> str:
    marker = "/work/"
    if "site-packages/" in filename:
        return "site-packages/" + filename.split("site-packages/", 1)[1].split("/", 1)[0]
    for root in ("bridge/", "sinks/", "bench/"):
        idx = filename.rfind("/" + root)
        if idx >= 0:
            return filename[idx + 1:]
    if filename.startswith("~") or filename == "<built-in>":
        return "builtins"
    if "/lib/python" in filename:
        return "stdlib/" + filename.rsplit("/", 1)[-1]
    return filename.replace(marker, "")


def report(prof: cProfile.Profile, events: int, *, top: int, callers: list[str]) -> dict[str, Any]:
    stats = pstats.Stats(prof)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[1] for v in raw.values())
    by_module: dict[str, int] = defaultdict(int)
    for (filename, _line, _name), v in raw.items():
        by_module[_module(filename)] += v[1]
    print(f"events: {events}; Python-level calls: {total}; per event: {total / events:.1f}")
    print("\n== calls per event by module ==")
    for mod, n in sorted(by_module.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{n / events:8.2f}  {mod}")
    print("\n== functions by calls per event ==")
    rows = sorted(raw.items(), key=lambda kv: -kv[1][1])[:top]
    for (filename, line, name), v in rows:
        print(f"{v[1] / events:8.2f}  {_module(filename)}:{line}({name})")
    for want in callers:
        for (filename, line, name), v in raw.items():
            if want != name and not f"{name}".endswith(want):
                continue
            print(f"\n== callers of {_module(filename)}:{line}({name}): {v[1] / events:.2f} per event ==")
            for (cf, cl, cn), cv in sorted(v[4].items(), key=lambda kv: -kv[1][1]):
                print(f"{cv[1] / events:8.2f}  {_module(cf)}:{cl}({cn})")
    return {"events": events, "calls": total, "calls_per_event": round(total / events, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sink", default="file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--callers", action="append", default=[])
    parser.add_argument("--dump", type=Path, help="also write the raw profile here (pstats format)")
    args = parser.parse_args()
    prof, events = asyncio.run(_profiled(args.pods, args.rounds, args.sink))
    if args.dump is not None:
        prof.dump_stats(args.dump)
    report(prof, events, top=args.top, callers=args.callers)


if __name__ == "__main__":
    main()
