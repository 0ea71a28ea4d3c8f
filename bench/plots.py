"""PNG plots of a benchmark run, for ``docs/performance.md``: where a reader would rather look.

* ``perf-latency.png`` - latency distribution (CDF) per sink and rate, from the latency scenario;
* ``perf-throughput.png`` - acknowledged events/s and sink queue depth over time during each sink's
  throughput burst;
* ``perf-memory.png`` - RSS growth against cached objects for each cache variant, with the raw JSON
  size for reference.

``python -m bench.plots [all.json] [out_dir]`` redraws them from saved results.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["make_plots"]


def _ok(summary: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    entry = summary.get("scenarios", {}).get(name)
    if not entry or entry.get("status") != "ok":
        return None
    result = entry.get("result")
    return result if isinstance(result, Mapping) else None


def _latency(result: Mapping[str, Any], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for kind, per_rate in result.get("sinks", {}).items():
        for rate, e in per_rate.items():
            points = e.get("distribution_ms") or []
            if not points:
                continue
            qs = [i / (len(points) - 1) * 100 for i in range(len(points))]
            ax.plot(points, qs, label=f"{kind} @ {rate}/s (p99 {e['p99_ms']:.1f} ms)")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xlabel("latency, simulator change to sink ack (ms, log scale)")
    ax.set_ylabel("percentile")
    ax.axvline(25, color="grey", linestyle="--", linewidth=0.8)
    ax.set_title("Latency distribution per sink at steady rates")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rate_series(timeline: Sequence[Mapping[str, float]], window: int = 4) -> tuple[list[float], list[float]]:
    """Acknowledgements per second over a sliding window of ``window`` sampling intervals (the raw
    0.1 s differences are too jumpy to read)."""
    ts: list[float] = []
    rates: list[float] = []
    for i in range(1, len(timeline)):
        prev, cur = timeline[max(0, i - window)], timeline[i]
        dt = cur["t"] - prev["t"]
        if dt > 0:
            ts.append(cur["t"])
            rates.append((cur["acked"] - prev["acked"]) / dt)
    return ts, rates


def _throughput(result: Mapping[str, Any], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    sinks = {k: e for k, e in result.get("sinks", {}).items() if e.get("timeline")}
    if not sinks:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for kind, e in sinks.items():
        ts, rates = _rate_series(e["timeline"])
        label = f"{kind} (mean {e['events_per_s']:,}/s, raw {e['ceiling_events_per_s']:,}/s)"
        top.plot(ts, rates, label=label)
        bottom.plot([s["t"] for s in e["timeline"]], [s["queue_depth"] for s in e["timeline"]], label=kind)
    top.set_ylabel("acked events/s")
    top.set_title(f"Burst of {result.get('events', 0):,} updates: throughput and sink queue depth")
    top.legend(fontsize=7)
    top.grid(True, alpha=0.3)
    bottom.set_ylabel("listener queue depth")
    bottom.set_xlabel("seconds since pipeline start")
    bottom.legend(fontsize=7)
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _memory(result: Mapping[str, Any], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    variants = {k: e for k, e in result.get("variants", {}).items() if e.get("curve")}
    if not variants:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    raw = 0
    for name, e in variants.items():
        xs = [c["objects"] for c in e["curve"]]
        ys = [c["rss_delta"] / 2**20 for c in e["curve"]]
        ax.plot(xs, ys, marker=".", label=f"{name} ({e['rss_bytes_per_object']:,} B/Pod)")
        raw = max(raw, int(e.get("raw_json_bytes_per_object", 0)))
    if raw:
        top = max(c["objects"] for e in variants.values() for c in e["curve"])
        ax.plot([0, top], [0, top * raw / 2**20], color="black", linestyle="--",
                label=f"raw JSON ({raw:,} B/Pod)")
    ax.set_xlabel("cached Pods")
    ax.set_ylabel("RSS growth (MiB)")
    ax.set_title("Memory against cached objects")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(summary: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Draws whatever the summary has data for; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, draw, filename in (
        ("latency", _latency, "perf-latency.png"),
        ("throughput", _throughput, "perf-throughput.png"),
        ("memory", _memory, "perf-memory.png"),
    ):
        result = _ok(summary, name)
        if result is not None:
            path = draw(result, out_dir / filename)
            if path is not None:
                written.append(path)
    return written


def _main(argv: Sequence[str]) -> int:
    source = Path(argv[0]) if argv else Path(__file__).resolve().parent / "results" / "all.json"
    out_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "docs"
    for path in make_plots(json.loads(source.read_text()), out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
