"""The delivery layer alone (issue #18): processor → listener → ``SinkListener`` → sink → acks back.

N changes of 200 objects (``dict`` objects; the first 200 adds, then updates) are distributed by a
:class:`~bridge.informer.processor.SharedProcessor` to one listener whose handler is a
:class:`~bridge.delivery.pipeline.SinkListener` in front of a sink that acknowledges every event at
once, with an :class:`~bridge.delivery.progress.AckTracker` observing (a progress marker every 64
changes, one loop turn each). No informer, no sink work, no I/O: what is left is the bookkeeping of
the hand-offs between the informer and the sink and back, the part this layer adds per change.

Two figures: the bridge process's CPU µs per change (best and median of seven runs; noisy on a shared
machine) and Python function calls per change under cProfile (deterministic: compare trees with it).

Run with ``python -m bench.bench_delivery [changes]``; ``--profile`` prints the hottest functions.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
import time
from collections.abc import Sequence
from typing import Any

from bridge.clock import RealClock
from bridge.contracts import ListenerOptions, Notification, NotificationKind, ObjectKey
from bridge.delivery.pipeline import SinkListener
from bridge.delivery.progress import AckTracker
from bridge.informer.processor import ProcessorListener, SharedProcessor
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, ResourceRef

__all__ = ["run"]

REF = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
_DELIVERED = DeliveryOutcome.DELIVERED


class _AckAtOnce:
    """A sink that acknowledges every event as it is handed over (per event and per batch)."""

    name = "null"

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        ack(_DELIVERED)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        for ack in acks:
            ack(_DELIVERED)


def _obj(i: int, rv: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"o{i}", "uid": f"u{i}", "resourceVersion": str(rv)}}


def _changes(n: int) -> list[Notification]:
    out = []
    for k in range(n):
        i, key = k % 200, ObjectKey(f"ns/o{k % 200}")
        if k < 200:
            out.append(Notification(kind=NotificationKind.ADD, obj=_obj(i, k + 1), key=key))
        else:
            out.append(Notification(kind=NotificationKind.UPDATE, obj=_obj(i, k + 1), old=_obj(i, k - 199),
                                    key=key))
    return out


async def _once(n: int, profiler: cProfile.Profile | None = None) -> float:
    """CPU µs per change of one run."""
    clock = RealClock()
    tracker = AckTracker(name="bench", now=clock.now)
    processor = SharedProcessor(clock=clock, observer=tracker, name="bench")
    handler = SinkListener(sink=_AckAtOnce(), resource=REF, cluster="c", clock=clock,
                           tracker=tracker)
    # A buffer for every change: a loaded machine must not make the listener degrade (and coalesce).
    listener = ProcessorListener(handler=handler, options=ListenerOptions(name="null", buffer_capacity=n),
                                 clock=clock, name="null", observer=tracker)
    processor.add_listener(listener)
    processor.start()
    changes = _changes(n)
    cpu = time.process_time()
    if profiler is not None:
        profiler.enable()
    for k, change in enumerate(changes):
        await processor.distribute(change, sync=False)
        if k % 64 == 63:
            processor.progress(str(k + 1))
            await asyncio.sleep(0)
    await listener.wait_drained()
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - cpu
    if tracker.pending:
        raise AssertionError(f"{tracker.pending} changes never acknowledged")
    await processor.shutdown(1)
    return cpu / n * 1e6


def run(quick: bool = False, changes: int | None = None, show_profile: bool = False) -> dict[str, Any]:
    n = changes or (2_000 if quick else 20_000)
    runs = sorted(asyncio.run(_once(n)) for _ in range(3 if quick else 7))
    profiler = cProfile.Profile()
    asyncio.run(_once(n, profiler))
    stats = pstats.Stats(profiler)
    calls = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
    if show_profile:
        stats.sort_stats("tottime").print_stats(25)
    return {"changes": n, "cpu_us_per_change_best": round(runs[0], 2),
            "cpu_us_per_change_median": round(runs[len(runs) // 2], 2),
            "calls_per_change": round(calls / n, 1)}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    result = run(changes=int(args[0]) if args else None, show_profile="--profile" in sys.argv)
    print(" ".join(f"{k}={v}" for k, v in result.items()))
