"""Python function calls per event of the throughput scenario's bridge run, under cProfile.

The count of calls does not depend on the machine's load (unlike CPU seconds on a shared machine),
so it is the figure to compare before and after a change of the event path. Only the bridge's part
is profiled: the simulator runs in its own process and the burst's setup is outside the profile;
the profile covers ``bridge_pipeline`` from ``start()`` to the sink's last acknowledgement, start-up
included (a few thousand calls, under one per event at the default size).

``python -m bench.bench_calls [--pods 2000] [--rounds 5] [--sink file] [--top 40]`` prints the calls
per event, the calls per event by module, and the functions called most often (with their callers
when ``--callers NAME`` is given); then the Python function calls per event (C functions, the
entries cProfile files under ``~``, left out) and both figures in the steady state: start-up
subtracted, as the difference from a second run of the same setup with ``--base-rounds`` rounds
(default 1; 0 skips it), per event of the difference.
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
from bench.common import BrokerUrls, SimProcess, brokers, burst_setup


async def _profiled_run(pods: int, rounds: int, sink: str, urls: BrokerUrls,
                        tmp: Path) -> tuple[cProfile.Profile, int]:
    """One burst on a fresh simulator, profiled from the bridge's start to its last acknowledgement."""
    async with SimProcess() as sim:
        setup = await burst_setup(sim, pods=pods, rounds=rounds)
        prof = cProfile.Profile()
        prof.enable()
        try:
            await _bridge_burst(sim, setup, sink, urls, tmp, 240.0)
        finally:
            prof.disable()
    return prof, setup.events


async def _profiled_pair(pods: int, rounds: int, base_rounds: int, sink: str
                         ) -> tuple[tuple[cProfile.Profile, int], tuple[cProfile.Profile, int] | None]:
    """The burst profiled, and (``base_rounds`` > 0) the same setup with ``base_rounds`` rounds."""
    with brokers([sink]) as urls, tempfile.TemporaryDirectory(prefix="keb-calls-") as tmp_name:
        full = await _profiled_run(pods, rounds, sink, urls, Path(tmp_name) / "full")
        base = (await _profiled_run(pods, base_rounds, sink, urls, Path(tmp_name) / "base")
                if 0 < base_rounds < rounds else None)
    return full, base


def counts(prof: cProfile.Profile) -> tuple[int, int]:
    """(every call, Python function calls): cProfile files the C functions (builtins, methods of
    C types) under ``~``; a call of one of them is not a Python call."""
    raw: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[1] for v in raw.values())
    python = sum(v[1] for (filename, _line, _name), v in raw.items() if not _is_c(filename))
    return total, python


def _is_c(filename: str) -> bool:
    return filename.startswith("~") or filename == "<built-in>"


def steady(full: tuple[int, int, int], base: tuple[int, int, int]) -> tuple[float, float]:
    """(calls, Python function calls) per event of the difference of two runs of one setup, each
    ``(events, calls, python calls)``: what start-up costs is in both and cancels out."""
    events = full[0] - base[0]
    if events <= 0:
        raise ValueError("the base run must have fewer events than the full one")
    return (full[1] - base[1]) / events, (full[2] - base[2]) / events


def _module(filename: str) -> str:
    marker = "/work/"
    if "site-packages/" in filename:
        return "site-packages/" + filename.split("site-packages/", 1)[1].split("/", 1)[0]
    for root in ("bridge/", "sinks/", "bench/"):
        idx = filename.rfind("/" + root)
        if idx >= 0:
            return filename[idx + 1:]
    if _is_c(filename):
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
    _total, python = counts(prof)
    print(f"\nPython function calls per event (C functions excluded): {python / events:.1f}")
    return {"events": events, "calls": total, "calls_per_event": round(total / events, 1),
            "python_calls": python, "python_calls_per_event": round(python / events, 1)}


def report_steady(full: dict[str, Any], base_prof: cProfile.Profile, base_events: int) -> dict[str, Any]:
    """Prints and returns the steady-state figures: ``full`` (what :func:`report` returned) less the
    base run of the same setup, per event of the difference."""
    base_calls, base_python = counts(base_prof)
    calls, python = steady((full["events"], full["calls"], full["python_calls"]),
                           (base_events, base_calls, base_python))
    print(f"steady state (start-up subtracted: less a run of {base_events} events of the same setup): "
          f"calls per event {calls:.1f}, Python function calls per event {python:.1f}")
    return {"steady_calls_per_event": round(calls, 1), "steady_python_calls_per_event": round(python, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sink", default="file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--callers", action="append", default=[])
    parser.add_argument("--base-rounds", type=int, default=1,
                        help="rounds of the run subtracted for the steady state (0: no steady state)")
    parser.add_argument("--dump", type=Path, help="also write the raw profile here (pstats format)")
    args = parser.parse_args()
    (prof, events), base = asyncio.run(_profiled_pair(args.pods, args.rounds, args.base_rounds, args.sink))
    if args.dump is not None:
        prof.dump_stats(args.dump)
    full = report(prof, events, top=args.top, callers=args.callers)
    if base is not None:
        report_steady(full, *base)


if __name__ == "__main__":
    main()
