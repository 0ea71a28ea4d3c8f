"""What the NATS sinks' use of nats-py's private internals buys: the same sink measured with them
and through nats-py's public API only, alternately in one run.

The sinks write their publishes into nats-py's command buffer themselves (one loop per publisher
pass, no coroutine per message), hand it to the socket at the end of the pass and confirm core
publishes with a PING of their own whose PONG future they queue in nats-py's read loop
(:mod:`sinks.nats`). Without those internals the same sink publishes with ``Client.publish`` (a
coroutine per message), confirms each core pass with ``Client.flush`` and leaves the writing to
nats-py's flusher task — the path a nats-py lacking the internals takes. This measures both paths on
the same events (``deliver_batch`` of ``batch`` events, as the delivery layer feeds a sink), in
alternating order over ``reps`` repetitions, and reports per repetition the ratio public /
internals of events/s and of the process's CPU time per event. On a shared machine the CPU ratio is
the steadier figure; the first repetition also warms the process up.

Run ``python -m bench.bench_nats_internals [--reps N] [--nats N] [--jetstream N]``; results go to
``bench/results/nats-internals.json``. (Not one of ``bench.run``'s scenarios: it answers one design
question, recorded in docs/performance.md.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sinks.nats as nats_sinks
import sinks.nats_base as nats_base
from bench.bench_sinks import BATCH, _sink_factory, _through_sink, make_events
from bench.common import brokers, machine_info, write_result
from sinks.contract import ChangeEvent

__all__ = ["main", "public_api_only", "run"]

KINDS = ("nats", "jetstream")


@contextlib.contextmanager
def public_api_only() -> Iterator[None]:
    """The NATS sinks as they run on a nats-py without the private parts they use."""
    saved = (nats_base._HAS_CLIENT_INTERNALS, nats_base._HAS_PUBLISH_INTERNALS,
             nats_sinks.JetStreamTransport._end_of_pass)
    nats_base._HAS_CLIENT_INTERNALS = False
    nats_base._HAS_PUBLISH_INTERNALS = False
    nats_sinks.JetStreamTransport._end_of_pass = nats_base.NatsTransportBase._end_of_pass  # type: ignore[method-assign]
    try:
        yield
    finally:
        (nats_base._HAS_CLIENT_INTERNALS, nats_base._HAS_PUBLISH_INTERNALS,
         nats_sinks.JetStreamTransport._end_of_pass) = saved  # type: ignore[method-assign]


def _once(kind: str, url: str, tmp: Path, events: Sequence[ChangeEvent], *, public: bool,
          batch: int) -> dict[str, float]:
    make = _sink_factory(kind, kafka="", nats_url=url, tmp=tmp)
    with public_api_only() if public else contextlib.nullcontext():
        seconds, cpu = asyncio.run(_through_sink(make(uuid.uuid4().hex[:8]), events, batch=batch))
    timed = len(events) - 1
    return {"events_per_s": round(timed / seconds, 1), "cpu_us_per_event": round(cpu / timed * 1e6, 2)}


def run(*, reps: int = 6, counts: dict[str, int] | None = None, batch: int = BATCH,
        results_dir: Path | None = None) -> dict[str, Any]:
    """Measures both paths ``reps`` times per sink kind; writes ``nats-internals.json``."""
    counts = counts or {"nats": 5_000, "jetstream": 2_000}
    result: dict[str, Any] = {"scenario": "nats-internals", "machine": machine_info(), "batch": batch,
                              "sinks": {}}
    with brokers(["nats"]) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-natsint-") as tmp:
        for kind in KINDS:
            events = make_events(counts[kind], raw=True)
            rows = []
            for rep in range(reps):
                row: dict[str, Any] = {}
                for public in ((False, True) if rep % 2 == 0 else (True, False)):
                    row["public" if public else "internals"] = _once(
                        kind, urls.nats, Path(tmp), events, public=public, batch=batch)
                row["events_per_s_ratio"] = round(
                    row["public"]["events_per_s"] / row["internals"]["events_per_s"], 3)
                row["cpu_ratio"] = round(
                    row["public"]["cpu_us_per_event"] / row["internals"]["cpu_us_per_event"], 3)
                rows.append(row)
            measured = rows[1:] or rows  # the first repetition warms the process up
            result["sinks"][kind] = {
                "events": counts[kind], "reps": rows,
                "median_events_per_s_ratio": statistics.median(r["events_per_s_ratio"] for r in measured),
                "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in measured),
            }
    write_result("nats-internals", result, results_dir)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--nats", type=int, default=5_000, help="events per core NATS measurement")
    parser.add_argument("--jetstream", type=int, default=2_000, help="events per JetStream measurement")
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args(argv)
    result = run(reps=args.reps, counts={"nats": args.nats, "jetstream": args.jetstream}, batch=args.batch)
    for kind, figures in result["sinks"].items():
        for i, row in enumerate(figures["reps"]):
            inside, public = row["internals"], row["public"]
            print(f"{kind:<9} rep {i}: internals {inside['events_per_s']:>8.0f} ev/s "
                  f"{inside['cpu_us_per_event']:>5.1f} µs/ev | public {public['events_per_s']:>8.0f} ev/s "
                  f"{public['cpu_us_per_event']:>5.1f} µs/ev | public/internals: "
                  f"ev/s {row['events_per_s_ratio']:.3f}, CPU {row['cpu_ratio']:.3f}")
        print(f"{kind:<9} median (without rep 0): ev/s {figures['median_events_per_s_ratio']:.3f}, "
              f"CPU per event {figures['median_cpu_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
