"""Restart catch-up: a bridge resuming from its checkpoint next to one started without a checkpoint.

The scenario: Pods exist and a bridge has delivered them (its checkpoint knows every Pod); the bridge
stops; while it is down every Pod is updated ``rounds`` times (10 000 changes by default). Then:

* ``resumed``: the bridge starts from the checkpoint. It watches from the checkpointed
  resourceVersion (no list) and must deliver every one of the changes; we measure the time until the
  last one was acknowledged, how many events it delivered and how many of those were re-sends.
* ``fresh``: the same situation, bridge started without a checkpoint: it lists and delivers every Pod
  as ``added`` (state the consumer already had, under a different event type), and the intermediate
  changes are lost.

The simulator runs in its own process (bench/common.py), the sink is the file sink (the embedded
default). ``python -m bench.bench_restart [--quick]``; results go to ``bench/results/restart.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_NAMESPACE,
    RESULTS_DIR,
    AckProbe,
    BrokerUrls,
    SimProcess,
    bridge_pipeline,
    burst_setup,
    machine_info,
    make_sink,
    write_result,
)
from sinks.contract import AckCallback, ChangeEvent, EventType, Sink

FULL = {"pods": 1000, "rounds": 10}
QUICK = {"pods": 100, "rounds": 5}
TIMEOUT = 300.0


class Recorder:
    """A pass-through sink wrapper that remembers (type, uid, resourceVersion) of every event."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.name = inner.name
        self.delivery = dataclasses.replace(inner.delivery, resync_period=0.0)
        self.seen: Counter[tuple[str, str, str]] = Counter()

    async def start(self) -> None:
        await self.inner.start()

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if event.type in (EventType.ADDED, EventType.UPDATED, EventType.DELETED):
            self.seen[(event.type.value, event.uid, event.resource_version)] += 1
        await self.inner.deliver(event, ack)

    async def flush(self, timeout: float) -> bool:
        return await self.inner.flush(timeout)

    async def close(self) -> None:
        await self.inner.close()

    def healthy(self) -> bool:
        return self.inner.healthy()

    @property
    def last_error(self) -> str:
        return self.inner.last_error

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight


async def _run_one(sim: SimProcess, *, namespace: str, pods: int, rounds: int, resume: bool,
                   tmp: Path) -> dict[str, Any]:
    setup = await burst_setup(sim, pods=pods, rounds=rounds, namespace=namespace)
    recorder = Recorder(make_sink("file", urls=BrokerUrls(), tmp_dir=tmp, tag=namespace))
    probe = AckProbe(recorder)
    expected = setup.events if resume else setup.pods
    t0 = time.perf_counter()
    async with bridge_pipeline(sim.url, [probe], namespace=namespace,
                               checkpoint=setup.checkpoint if resume else None) as pipeline:
        done = await probe.wait_acked(expected, TIMEOUT)
        seconds = time.perf_counter() - t0
        await asyncio.sleep(0.3)  # anything re-sent after the last expected ack shows up here
        relists = sum(pipeline.stats().relists.values())
    events = sum(recorder.seen.values())
    # Changes made while down that reached the consumer as their own state (as an update, or
    # coalesced into the ``added`` of a fresh list).
    updates = {(uid, rv) for _, uid, rv in recorder.seen if int(rv) > setup.rv_before}
    return {
        "changes_made_while_down": setup.events,
        "objects": setup.pods,
        "completed": done,
        "seconds_to_deliver": round(seconds, 3),
        "events_delivered": events,
        "changes_delivered": len(updates),
        "intermediate_changes_lost": setup.events - len(updates),
        "duplicates": events - len(recorder.seen),
        "objects_resent_as_added": sum(1 for k in recorder.seen if k[0] == "added"),
        "relists": relists,
        "events_per_second": round(events / seconds, 1) if seconds > 0 else None,
    }


async def _scenario(quick: bool) -> dict[str, Any]:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="keb-bench-restart-") as tmp:
        async with SimProcess() as sim:
            resumed = await _run_one(sim, namespace=f"{BENCH_NAMESPACE}-resume", resume=True,
                                     tmp=Path(tmp), **size)
            fresh = await _run_one(sim, namespace=f"{BENCH_NAMESPACE}-fresh", resume=False,
                                   tmp=Path(tmp), **size)
    return {
        "scenario": "restart",
        "quick": quick,
        "sink": "file",
        "size": size,
        "resumed": resumed,
        "fresh": fresh,
        "machine": machine_info(),
    }


def run(quick: bool = False, results_dir: Path | None = None) -> dict[str, Any]:
    """Runs the scenario and writes ``restart.json``; returns the result."""
    result = asyncio.run(_scenario(quick))
    write_result("restart", result, results_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_restart", description=__doc__)
    p.add_argument("--quick", action="store_true", help=f"{QUICK['pods']} Pods x {QUICK['rounds']} updates")
    p.add_argument("--results-dir", type=Path, default=None)
    args = p.parse_args(argv)
    result = run(args.quick, args.results_dir)
    r, f = result["resumed"], result["fresh"]
    print(f"resumed: {r['changes_delivered']}/{r['changes_made_while_down']} changes in "
          f"{r['seconds_to_deliver']}s, {r['duplicates']} re-sent, {r['relists']} relists")
    print(f"fresh:   {f['objects_resent_as_added']} objects re-sent as added in {f['seconds_to_deliver']}s, "
          f"{f['intermediate_changes_lost']} intermediate changes lost")
    print(f"results: {(args.results_dir or RESULTS_DIR) / 'restart.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
