"""Sink isolation (issue #13): what the never-wait design costs, and one sink down under churn.

* **cost** — a burst of N changes (the in-process fake API source, ~1 KB ConfigMaps) through the real
  :class:`~bridge.delivery.pipeline.BridgePipeline` to two file sinks, once with the default
  ``spill`` policy (the listener's never-wait path) and once with ``block`` (the former default's
  path), best of three each: changes/s until both sinks acknowledged the last one. No sink is slow,
  so nothing spills: this is the per-change cost of the design.
* **one_sink_down** — changes at a steady rate; after a warm-up one of three file sinks stops
  accepting (its deliver call waits: a destination that is down) for ``down`` seconds, then comes
  back. Reported: the other sinks' rate before and during the outage, the down sink's peak spill
  bytes and its catch-up time (from its return to an empty backlog).

Run with ``python -m bench.run --only isolation`` (``--quick`` for small sizes).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, write_result
from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.informer.factory import InformerKey
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.kube.discovery import APIResource
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import AckCallback, ChangeEvent, ResourceRef
from sinks.file import FileSink

__all__ = ["run"]

REF = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
WATCHED = WatchedResource(key=InformerKey("configmaps"), ref=REF, api=APIResource(
    group="", version="v1", resource="configmaps", kind="ConfigMap", namespaced=True,
    verbs=("list", "watch")))
BLOB = "y" * 900


def _cm(name: str, v: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "bench"},
            "data": {"v": str(v), "blob": BLOB}}


class _Switch:
    """Wraps a sink; while ``down`` is set its deliver call waits (a destination that is down)."""

    def __init__(self, inner: FileSink) -> None:
        self.inner = inner
        self.up = asyncio.Event()
        self.up.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        await self.up.wait()
        await self.inner.deliver(event, ack)


def _pipeline(source: FakeControllerSource, sinks: list[Any], tmp: Path, compact: bool = True
              ) -> BridgePipeline:
    clock = RealClock()

    def build(watched: WatchedResource, observer: Any) -> SharedIndexInformer:
        # The compact cache (objects kept as JSON bytes) is the service's default.
        return SharedIndexInformer(lister_watcher=source, clock=clock, observer=observer,
                                   name=watched.informer_id, compact_cache=compact)

    return BridgePipeline(resources=[WATCHED], sinks=sinks, checkpoint_store=None, build_informer=build,
                          clock=clock, spill_directory=tmp / "spill", outage_check_interval=0)


def _delivered(p: BridgePipeline, name: str) -> int:
    return int(p.stats().sinks[name].get("delivered", 0))


async def _wait(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(0.002)


async def _burst(policy: str, changes: int, tmp: Path) -> tuple[float, int, float]:
    """(changes/s, notifications the listeners spilled, the process's CPU µs per change)."""
    source = FakeControllerSource()
    for i in range(100):
        source.add(_cm(f"o{i}", 0))
    sinks = [FileSink.from_options(f"f{k}", {"path": str(tmp / f"{policy}-{k}.jsonl"),
                                             "buffer": {"policy": policy}}) for k in range(2)]
    p = _pipeline(source, list(sinks), tmp)
    await p.start()
    try:
        await _wait(lambda: all(_delivered(p, s.name) == 100 for s in sinks), 60)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        for n in range(changes):
            source.modify(_cm(f"o{n % 100}", n + 1))
            if n % 200 == 199:
                await asyncio.sleep(0)
        await _wait(lambda: all(_delivered(p, s.name) == 100 + changes for s in sinks), 300)
        rate = changes / (time.perf_counter() - t0)
        cpu_us = (time.process_time() - cpu0) / changes * 1e6
        return rate, sum(p.sink_backlog(s.name).spilled for s in sinks), cpu_us
    finally:
        await p.shutdown(10)


async def _one_sink_down(rate: float, before: float, down: float, tmp: Path) -> dict[str, Any]:
    source = FakeControllerSource()
    for i in range(100):
        source.add(_cm(f"o{i}", 0))
    files = [FileSink.from_options(n, {"path": str(tmp / f"{n}.jsonl")}) for n in ("down", "a", "b")]
    switch = _Switch(files[0])
    p = _pipeline(source, [switch, files[1], files[2]], tmp)
    await p.start()
    stop = asyncio.Event()
    sent = [0]

    async def churn() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while not stop.is_set():
            source.modify(_cm(f"o{n % 100}", n + 1))
            n += 1
            sent[0] = n
            delay = start + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    driver: asyncio.Task[None] | None = None
    try:
        await _wait(lambda: all(_delivered(p, s) == 100 for s in ("down", "a", "b")), 60)
        driver = asyncio.create_task(churn(), name="bench-churn")
        await asyncio.sleep(1.0)
        c0, t0 = {s: _delivered(p, s) for s in ("a", "b")}, time.monotonic()
        await asyncio.sleep(before)
        c1, t1 = {s: _delivered(p, s) for s in ("a", "b")}, time.monotonic()
        switch.up.clear()
        peak = 0
        end = t1 + down
        while time.monotonic() < end:
            await asyncio.sleep(0.1)
            peak = max(peak, p.sink_backlog("down").spill_bytes)
        c2, t2 = {s: _delivered(p, s) for s in ("a", "b")}, time.monotonic()
        backlog_at_return = p.sink_backlog("down").depth
        stop.set()
        await driver
        total = 100 + sent[0]
        switch.up.set()
        t3 = time.monotonic()
        await _wait(lambda: _delivered(p, "down") >= total, 300)
        catch_up = time.monotonic() - t3
        return {
            "rate": rate, "down_seconds": down,
            "others_rate_before": {s: round((c1[s] - c0[s]) / (t1 - t0), 1) for s in c0},
            "others_rate_during": {s: round((c2[s] - c1[s]) / (t2 - t1), 1) for s in c0},
            "down_backlog_at_return": backlog_at_return,
            "down_spill_peak_bytes": peak,
            "catch_up_seconds": round(catch_up, 2),
            "catch_up_rate": round(backlog_at_return / catch_up, 1) if catch_up > 0 else None,
        }
    finally:
        stop.set()
        switch.up.set()
        if driver is not None:
            await asyncio.gather(driver, return_exceptions=True)
        await p.shutdown(10)


async def _measure(quick: bool) -> dict[str, Any]:
    changes = 3000 if quick else 20000
    with tempfile.TemporaryDirectory(prefix="keb-bench-iso-") as d:
        tmp = Path(d)
        cost: dict[str, Any] = {}
        for policy in ("spill", "block"):
            runs = [await _burst(policy, changes, tmp) for _ in range(1 if quick else 3)]
            cost[policy] = {"changes": changes, "changes_per_second": round(max(r[0] for r in runs), 1),
                            "spilled": max(r[1] for r in runs),
                            # The fake source's own work included; steadier than the rate.
                            "cpu_us_per_change": round(min(r[2] for r in runs), 1)}
        cost["spill_vs_block"] = round(cost["spill"]["changes_per_second"]
                                       / cost["block"]["changes_per_second"], 3)
        cost["cpu_spill_vs_block"] = round(cost["spill"]["cpu_us_per_change"]
                                           / cost["block"]["cpu_us_per_change"], 3)
        down = await _one_sink_down(300.0 if quick else 1000.0, 2.0 if quick else 5.0,
                                    3.0 if quick else 10.0, tmp)
    return {"cost": cost, "one_sink_down": down}


def run(quick: bool = False, *, results_dir: Path | None = None) -> dict[str, Any]:
    """Measures both scenarios; writes ``isolation.json`` and returns the figures."""
    figures = asyncio.run(_measure(quick))
    result = {"scenario": "isolation", "quick": quick, "machine": machine_info(), **figures}
    write_result("isolation", result, results_dir)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=2, default=str))
