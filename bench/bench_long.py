"""The long scenario (not CI): a steady 10,000 events/s for 10 minutes through the Kafka sink.

Does the bridge keep up with a busy cluster for long, or does it fall behind its watch? The simulator
(its own process) updates Pods at ``rate`` per second for ``seconds``, stamping each update with its
emission time; the bridge (list + watch, informer, Kafka sink as the service runs it) delivers them
to a Tansu broker. Every ``sample`` seconds the harness records the bridge process's RSS, the
acknowledgements, its sink buffer's depth, the 410 / relist counters of the reflector, and the lag of
the events acknowledged in that window (acknowledgement time - emission stamp: p50 / p99 / max).

The bridge *fell behind* when its watch expired (a 410: the simulator's history, ``history`` events,
no longer held where it was), when it had to relist, or when its lag kept growing (the last third of
the run's p99 lag above both 1 s and twice the first third's). The verdict, the samples and a plot
(RSS, lag and rate over time: ``long.png`` in the results directory) are written out.

``python -m bench.run --only long [--long-rate 10000] [--long-seconds 600]``; ``--quick`` shortens
it to 1,000 events/s for 20 s. The simulator may not reach the rate on a small machine: the
rate it achieved is reported next to the one asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_NAMESPACE,
    AckProbe,
    SimProcess,
    bridge_pipeline,
    brokers,
    freeze_after_sync,
    rss_bytes,
    service_sink,
    summarize_ms,
    write_result,
)

__all__ = ["fell_behind", "plot", "run"]


def fell_behind(samples: list[dict[str, Any]], *, expired: int, relists: int) -> tuple[bool, str]:
    """The verdict (see the module docstring) and why."""
    if expired:
        return True, f"{expired} watch expiries (410)"
    if relists > 1:
        return True, f"{relists - 1} relists after the first list"
    lags = [s["lag_p99_ms"] for s in samples if s.get("count")]
    if len(lags) >= 6:
        third = len(lags) // 3
        first = sum(lags[:third]) / third
        last = sum(lags[-third:]) / third
        if last > 1000 and last > 2 * first:
            return True, f"lag grew from {first:.0f} ms to {last:.0f} ms (p99, first vs last third)"
    return False, "kept up: no 410, no relist, no growing lag"


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """RSS, p99 lag and acknowledged events/s over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(t, [s["rss_bytes"] / 2**20 for s in samples])
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].plot(t, [s["lag_p99_ms"] for s in samples], label="p99")
    axes[1].plot(t, [s["lag_max_ms"] for s in samples], label="max", alpha=0.6)
    axes[1].set_ylabel("lag (ms)")
    axes[1].legend()
    axes[2].plot(t, [s["acked_per_s"] for s in samples], label="acknowledged/s")
    axes[2].plot(t, [s["queue_depth"] for s in samples], label="sink buffer depth")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


async def _long(rate: float, seconds: float, pods: int, sample: float, history: int,
                out_dir: Path) -> dict[str, Any]:
    with brokers(["kafka"]) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-long-") as tmp_name:
        async with SimProcess(history_size=history, watcher_buffer=history) as sim:
            await sim.prefill(pods, BENCH_NAMESPACE)
            probe = AckProbe(service_sink("kafka", urls=urls, tmp_dir=Path(tmp_name)))
            async with bridge_pipeline(sim.url, [probe], namespace=BENCH_NAMESPACE) as pipeline:
                if not await pipeline.wait_for_sync(120) or not await probe.wait_acked(pods, 120):
                    raise TimeoutError("long: the initial list was not delivered")
                freeze_after_sync()
                informer = next(iter(pipeline.informers.values()))
                reflector = informer.reflector
                lists0 = reflector.list_count if reflector is not None else 0
                base = probe.acked
                probe.arm()
                samples: list[dict[str, Any]] = []
                t0 = time.perf_counter()
                cpu0 = time.process_time()

                async def sampling() -> None:
                    last_acked, last_t = probe.acked, time.perf_counter()
                    while True:
                        await asyncio.sleep(sample)
                        now = time.perf_counter()
                        window, probe.latencies = probe.latencies, []
                        stats = summarize_ms(window)
                        acked = probe.acked
                        samples.append({
                            "t": round(now - t0, 2), "rss_bytes": rss_bytes(), "acked": acked - base,
                            "acked_per_s": round((acked - last_acked) / (now - last_t)),
                            "queue_depth": sum(pipeline.queue_depths().values()),
                            "expired": reflector.expired_count if reflector is not None else 0,
                            "count": stats["count"], "lag_p50_ms": stats["p50_ms"],
                            "lag_p99_ms": stats["p99_ms"], "lag_max_ms": stats["max_ms"],
                        })
                        last_acked, last_t = acked, now

                task = asyncio.create_task(sampling(), name="bench:long:sampler")
                try:
                    sent = await sim.steady(rate, seconds)
                    emitted = int(sent["events"])
                    # Drain: until every emitted change was acknowledged (or coalesced: then
                    # until the acknowledgements stop for 2 s), at most 120 s.
                    settled_at, last = time.perf_counter(), probe.acked
                    while probe.acked - base < emitted and time.perf_counter() - settled_at < 2.0:
                        await asyncio.sleep(0.2)
                        if probe.acked != last:
                            settled_at, last = time.perf_counter(), probe.acked
                        if time.perf_counter() - t0 > seconds + 120:
                            break
                    cpu = time.process_time() - cpu0
                    wall = time.perf_counter() - t0
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                expired = reflector.expired_count if reflector is not None else 0
                relists = (reflector.list_count if reflector is not None else 0) - lists0 + 1
                acked = probe.acked - base
    behind, why = fell_behind(samples, expired=expired, relists=relists)
    result: dict[str, Any] = {
        "rate": rate, "seconds": seconds, "pods": pods, "history_events": history,
        "emitted": emitted, "achieved_rate": round(emitted / max(1e-9, float(sent["seconds"]))),
        "simulator_late_ticks": sent["late_ticks"],
        "acknowledged": acked, "coalesced": max(0, emitted - acked),
        "events_per_s": round(acked / wall), "cpu_us_per_event": round(cpu / max(1, acked) * 1e6, 1),
        "expired_410": expired, "lists": relists,
        "fell_behind": behind, "verdict": why,
        "rss_max_bytes": max((s["rss_bytes"] for s in samples), default=0),
        "rss_first_bytes": samples[0]["rss_bytes"] if samples else 0,
        "lag_p99_ms_max": max((s["lag_p99_ms"] for s in samples), default=0.0),
        "samples": samples,
    }
    png = plot(samples, out_dir / "long.png",
               f"Kafka sink, {rate:,.0f} events/s asked ({result['achieved_rate']:,}/s achieved) "
               f"for {seconds:.0f} s: {why}")
    if png is not None:
        result["plot"] = str(png)
    return result


def run(quick: bool = False, results_dir: Path | None = None, *, rate: float | None = None,
        seconds: float | None = None, pods: int = 2000, sample: float = 1.0,
        history: int = 200_000) -> dict[str, Any]:
    """The long scenario; writes ``long.json`` and ``long.png``."""
    from bench.common import RESULTS_DIR

    out_dir = results_dir or RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    rate = rate if rate is not None else (1000.0 if quick else 10_000.0)
    seconds = seconds if seconds is not None else (20.0 if quick else 600.0)
    result = asyncio.run(_long(rate, seconds, 200 if quick else pods, sample, history, out_dir))
    result["quick"] = quick
    write_result("long", result, out_dir)
    return result
