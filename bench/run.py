"""The one-command benchmark harness: ``python -m bench.run [--quick] [--only NAME[,NAME]] [--profile]``.

It runs every scenario in turn on this machine, prints one table in which each figure stands next to
the baseline measured in the same run (raw ceilings, the naive official-client pipeline, raw JSON
size), checks the targets of the performance issue, and writes ``bench/results/all.json`` plus one
JSON file per scenario, so that runs can be compared. ``--compare-ref REF`` runs the chosen
scenarios on git commit REF too (a temporary worktree, see :mod:`bench.compare`) and prints both
figures and their ratio. ``--profile`` runs each scenario under cProfile
and writes its hottest functions to ``<results>/<name>.profile.txt`` (the simulator and the memory
children run in other processes and are not in the profile).

Scenarios written by other parts of the project (``bench_informer``, ``bench_decode``,
``bench_sinks``, ``bench_restart``, ``bench_telemetry``, ``bench_isolation``, ``bench_cel``) are called
through their ``run(quick)``; one that is missing or fails is reported as such and the harness carries on.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import importlib
import io
import logging
import pstats
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, machine_info, write_result

__all__ = ["SCENARIOS", "Scenario", "evaluate_targets", "main", "run_all", "table"]

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"


def configure_gc(mode: str) -> None:
    """Sets the garbage collector of the bridge's process as the run asks: ``service`` does what the
    service does at start (``bridge.service.configure_gc``), ``python`` keeps the interpreter's
    defaults, ``G0,G1,G2`` sets those thresholds (a what-if)."""
    if mode == "python":
        return
    if mode == "service":
        try:
            from bridge.service.service import configure_gc as service_gc
        except ImportError:  # an older tree: nothing to mirror
            return
        service_gc()
        return
    gc.set_threshold(*(int(v) for v in mode.split(",")))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A benchmark scenario: ``module.function``; ``own`` ones take ``results_dir`` (and ``sinks``
    when ``takes_sinks``), the others only ``quick``."""

    name: str
    module: str
    function: str = "run"
    own: bool = True
    takes_sinks: bool = False
    brokers: bool = False
    default: bool = True
    """Part of a run without ``--only`` (the long scenario is not: it runs only when named)."""


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("throughput", "bench.bench_e2e", "run_throughput", takes_sinks=True, brokers=True),
    Scenario("naive", "bench.bench_naive"),
    Scenario("latency", "bench.bench_e2e", "run_latency", takes_sinks=True, brokers=True),
    Scenario("initial_sync", "bench.bench_e2e", "run_initial_sync"),
    Scenario("memory", "bench.bench_memory"),
    Scenario("informer", "bench.bench_informer", own=False),
    Scenario("decode", "bench.bench_decode", own=False),
    Scenario("sinks", "bench.bench_sinks", own=False, brokers=True),
    Scenario("restart", "bench.bench_restart", own=False),
    Scenario("telemetry", "bench.bench_telemetry", own=False),
    Scenario("isolation", "bench.bench_isolation", own=False),
    Scenario("cel", "bench.bench_cel", own=False),
    Scenario("long", "bench.bench_long", brokers=True, default=False),
    Scenario("sharding", "bench.bench_sharding"),
    Scenario("namespaces", "bench.bench_namespaces", default=False),
    Scenario("events", "bench.bench_events", default=False),
    Scenario("workers", "bench.bench_workers"),
)}


def _resolve(scenario: Scenario) -> Callable[..., Any]:
    module = importlib.import_module(scenario.module)
    fn = getattr(module, scenario.function)
    if not callable(fn):
        raise TypeError(f"{scenario.module}.{scenario.function} is not callable")
    return fn  # type: ignore[no-any-return]


def _profile_text(profile: cProfile.Profile, top: int = 40) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    out.write("== by own time ==\n")
    stats.sort_stats("tottime").print_stats(top)
    out.write("\n== by cumulative time ==\n")
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def run_one(scenario: Scenario, *, quick: bool, results_dir: Path, sinks: Sequence[str] | None,
            profile: bool, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs one scenario; never raises (a failure is recorded in the returned entry)."""
    entry: dict[str, Any] = {"module": f"{scenario.module}.{scenario.function}"}
    try:
        fn = _resolve(scenario)
    except (ImportError, AttributeError, TypeError) as exc:
        entry.update(status="not available", error=f"{type(exc).__name__}: {exc}")
        return entry
    kwargs: dict[str, Any] = {"quick": quick}
    if scenario.own:
        kwargs["results_dir"] = results_dir
        if scenario.takes_sinks and sinks:
            kwargs["sinks"] = list(sinks)
        kwargs.update(params or {})
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    try:
        if profiler is not None:
            profiler.enable()
        try:
            result = fn(**kwargs)
        finally:
            if profiler is not None:
                profiler.disable()
    except Exception as exc:
        entry.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc(limit=8))
        result = None
    else:
        entry["status"] = "ok"
    entry["seconds"] = round(time.perf_counter() - t0, 2)
    if profiler is not None:
        path = results_dir / f"{scenario.name}.profile.txt"
        results_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(_profile_text(profiler))
        entry["profile"] = str(path)
    if result is not None:
        entry["result"] = result
        # Other scenarios write bench/results/<name>.json themselves; elsewhere (a --results-dir)
        # the harness keeps a copy next to its own files.
        if not scenario.own and isinstance(result, Mapping) and results_dir.resolve() != RESULTS_DIR:
            write_result(scenario.name, result, results_dir)
    return entry


# --------------------------------------------------------------------------------------------------
# Targets and the table


def _ok(entry: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not entry or entry.get("status") != "ok":
        return None
    result = entry.get("result")
    return result if isinstance(result, Mapping) else None


def evaluate_targets(scenarios: Mapping[str, Mapping[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """The issue's targets against this run's figures. Size-dependent targets are not judged on a
    quick run (its sizes differ)."""
    targets: list[dict[str, Any]] = []

    def add(name: str, target: str, value: Any, met: bool | None, note: str = "") -> None:
        targets.append({"target": name, "goal": target, "value": value,
                        "met": None if met is None else bool(met), "note": note})

    thr = _ok(scenarios.get("throughput"))
    # Issue #28's goals (NATS core has none there: issue #18's).
    goals = {"kafka": ("raw producer", 0.20), "nats": ("raw publish loop", 0.30),
             "jetstream": ("raw publish loop", 0.8)}
    for kind, (ceiling, goal) in goals.items():
        entry = (thr or {}).get("sinks", {}).get(kind, {})
        if "ratio_to_ceiling" in entry:
            add(f"{kind} throughput vs {ceiling}", f">= {goal} x", entry["ratio_to_ceiling"],
                entry["ratio_to_ceiling"] >= goal)
    naive = _ok(scenarios.get("naive"))
    if naive and "ratio" in naive:
        add("bridge vs naive official client", ">= 10 x", naive["ratio"], naive["ratio"] >= 10)
    lat = _ok(scenarios.get("latency"))
    if lat:
        worst: float | None = None
        short: list[str] = []
        for kind, per_rate in lat.get("sinks", {}).items():
            entry = per_rate.get("5000")
            if entry and "p99_ms" in entry:
                worst = max(worst or 0.0, float(entry["p99_ms"]))
                sent = entry.get("achieved_rate")
                if isinstance(sent, (int, float)) and sent < 0.95 * 5000:
                    short.append(f"{kind} {sent:,.0f}/s")
        if worst is not None:
            # A rate the simulator did not reach (a loaded machine) judges nothing.
            add("p99 latency at 5k events/s (worst sink)", "<= 25 ms", worst,
                None if short else worst <= 25,
                f"not judged: the simulator sent at {', '.join(short)}" if short else "")
        elif quick:
            add("p99 latency at 5k events/s", "<= 25 ms", None, None, "quick run: lower rates only")
    mem = _ok(scenarios.get("memory"))
    bridge_mem = (mem or {}).get("variants", {}).get("bridge", {})
    if "ratio_to_raw_json" in bridge_mem:
        ratio = bridge_mem["ratio_to_raw_json"]
        add("bytes per cached Pod vs raw JSON", "<= 0.95 x", ratio, ratio <= 0.95,
            f"{bridge_mem.get('objects')} Pods, RSS delta")
    sync = _ok(scenarios.get("initial_sync"))
    if sync and "delivered_seconds" in sync:
        secs = sync["delivered_seconds"]
        if sync.get("pods") == 100_000:
            add("100k Pods listed and delivered to the file sink", "<= 6 s", secs, secs <= 6,
                f"bridge CPU {sync['cpu_seconds']} s" if "cpu_seconds" in sync else "")
        else:
            add(f"{sync.get('pods')} Pods listed and delivered", "<= 6 s for 100k", secs, None,
                "quick run: fewer Pods")
    long = _ok(scenarios.get("long"))
    if long and "expired_410" in long:
        asked, achieved = float(long["rate"]), float(long.get("achieved_rate", 0))
        name = f"long: {asked:,.0f} events/s for {long['seconds']:,.0f} s without a 410"
        if asked < 12_000 or long["seconds"] < 60:
            add(name, "0 at >= 12,000/s for >= 60 s", long["expired_410"], None, "shorter or slower run")
        elif achieved < 0.95 * asked:
            add(name, "0", long["expired_410"], None,
                f"not judged: the simulator achieved {achieved:,.0f}/s")
        else:
            add(name, "0", long["expired_410"], long["expired_410"] == 0)
    return targets


def _rows(name: str, result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, value, baseline, ratio) rows of one scenario."""
    rows: list[tuple[str, str, str, str]] = []
    if name == "throughput":
        replay = result.get("simulator_replay_events_per_s")
        for kind, e in result.get("sinks", {}).items():
            if "error" in e:
                rows.append((f"{kind}: end-to-end", "error", e["error"][:60], ""))
                continue
            rows.append((f"{kind}: end-to-end events/s (with start-up {e['events_per_s']:,})",
                         f"{e['steady_events_per_s']:,}", "", ""))
            sent = e.get("steady_messages_per_s", e["steady_events_per_s"])
            rows.append((f"{kind}: messages sent/s ({e.get('coalesced', 0):,} coalesced)", f"{sent:,}",
                         f"raw client {e['ceiling_events_per_s']:,}/s", f"{e['ratio_to_ceiling']}x"))
            if "cpu_us_per_event" in e:
                rows.append((f"{kind}: bridge process CPU per event", f"{e['cpu_us_per_event']} µs", "", ""))
        if replay:
            rows.append(("simulator watch replay (bare HTTP read)", f"{replay:,}/s", "", ""))
    elif name == "naive":
        rows.append((f"bridge vs official typed watch ({result.get('sink')} sink)",
                     f"{result['bridge']['events_per_s']:,}/s",
                     f"naive {result['naive']['events_per_s']:,}/s", f"{result['ratio']}x"))
    elif name == "latency":
        for kind, per_rate in result.get("sinks", {}).items():
            for rate, e in per_rate.items():
                if "error" in e:
                    rows.append((f"{kind} @ {rate}/s latency", "error", e["error"][:60], ""))
                    continue
                rows.append((f"{kind} @ {rate}/s p50/p99/max ms",
                             f"{e['p50_ms']:.1f} / {e['p99_ms']:.1f} / {e['max_ms']:.1f}",
                             f"{e['count']} events, sent at {e.get('achieved_rate', rate)}/s", ""))
    elif name == "initial_sync":
        rows.append((f"initial sync of {result['pods']:,} Pods: synced / delivered (file)",
                     f"{result['synced_seconds']} s / {result['delivered_seconds']} s",
                     f"{result['delivered_per_s']:,} Pods/s", ""))
        if "cpu_seconds" in result:
            rows.append(("initial sync: bridge process CPU", f"{result['cpu_seconds']} s",
                         f"{result['cpu_seconds'] / result['pods'] * 1e6:.1f} µs per Pod", ""))
    elif name == "memory":
        for variant, e in result.get("variants", {}).items():
            if "error" in e:
                rows.append((f"memory: {variant}", "error", e["error"][:60], ""))
                continue
            rows.append((f"memory: {variant} bytes/Pod ({e['objects']:,} cached)",
                         f"{e['rss_bytes_per_object']:,}",
                         f"raw JSON {e['raw_json_bytes_per_object']:,}", f"{e['ratio_to_raw_json']}x"))
    elif name == "long":
        rows.append((f"long: {result['rate']:,.0f}/s asked for {result['seconds']:.0f} s, achieved",
                     f"{result['achieved_rate']:,}/s", f"{result['emitted']:,} emitted", ""))
        rows.append(("long: fell behind its watch?", "yes" if result["fell_behind"] else "no",
                     result["verdict"][:30], ""))
        rows.append(("long: RSS first / max MiB",
                     f"{result['rss_first_bytes'] / 2**20:.0f} / {result['rss_max_bytes'] / 2**20:.0f}",
                     f"CPU {result['cpu_us_per_event']} µs/event", ""))
        rows.append(("long: worst p99 lag over 1 s windows", f"{result['lag_p99_ms_max']:.1f} ms", "", ""))
    elif name == "telemetry":
        rows.append(("service telemetry per event (meter stage + counters), µs",
                     f"{result['metered_overhead_us_per_event']:.2f}",
                     f"per-event OTel calls {result['baseline_overhead_us_per_event']:.2f}",
                     f"{result['overhead_ratio']}x"))
    elif name == "cel":
        for example, e in result.get("examples", {}).items():
            rows.append((f"filter '{example}' per event on whole objects, µs (decoded / whole object)",
                         f"{e['filter_us']:.1f}", f"{e['filter_decoded_us']:.1f} / {e['whole_us']:.1f}",
                         "ok" if e["meets_target"] else f"> {result['target_us']:.0f} µs"))
            rows.append((f"fields of '{example}': CloudEvent bytes", f"{e['bytes_projected']:,}",
                         f"whole {e['bytes_whole']:,}", f"-{e['bytes_saved_pct']}%"))
        rows.append(("filter step of a sink without a filter, ns per event",
                     f"{result['no_filter_step_ns']}", "", ""))
    else:
        for path, value in _numeric_leaves(result)[:14]:
            rows.append((path, _fmt(value), "", ""))
    return rows


def _numeric_leaves(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            out.extend(_numeric_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out.append((prefix, float(data)))
    return out


def _fmt(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.3g}"


def table(summary: Mapping[str, Any]) -> str:
    """The printed table: one block per scenario, then the targets."""
    lines: list[str] = []
    width = (62, 24, 30, 8)
    header = ("measure", "value", "baseline (same run)", "ratio")
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, width, strict=True)))
    lines.append("  ".join("-" * w for w in width))
    for name, entry in summary["scenarios"].items():
        lines.append(f"[{name}] {entry.get('status')} ({entry.get('seconds', 0)} s)")
        if entry.get("status") != "ok":
            lines.append(f"    {entry.get('error', '')[:150]}")
            continue
        for row in _rows(name, entry["result"]):
            lines.append("  ".join(c[:w].ljust(w) for c, w in zip(row, width, strict=True)))
    lines.append("")
    lines.append("targets:")
    for t in summary.get("targets", []):
        verdict = "n/a" if t["met"] is None else ("MET" if t["met"] else "MISSED")
        note = f"  ({t['note']})" if t.get("note") else ""
        lines.append(f"  {verdict:6}  {t['target']}: {t['value']} (goal {t['goal']}){note}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Entry point


def run_all(*, quick: bool, only: Sequence[str] | None = None, profile: bool = False,
            results_dir: Path | None = None, sinks: Sequence[str] | None = None,
            plots_dir: Path | None = None, progress: Callable[[str], None] | None = None,
            params: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Runs the chosen scenarios (all but the long one by default), writes ``all.json`` and returns
    its content. ``params``: extra keyword arguments per scenario name."""
    out_dir = results_dir or RESULTS_DIR
    names = list(only) if only else [n for n, s in SCENARIOS.items() if s.default]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}")
    summary: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine_info(),
        "gc_threshold": list(gc.get_threshold()),
        "scenarios": {},
    }
    t0 = time.perf_counter()
    for name in names:
        if progress is not None:
            progress(f"running {name} …")
        entry = run_one(SCENARIOS[name], quick=quick, results_dir=out_dir, sinks=sinks, profile=profile,
                        params=(params or {}).get(name))
        summary["scenarios"][name] = entry
        if progress is not None:
            progress(f"  {name}: {entry['status']} in {entry.get('seconds', 0)} s")
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    summary["machine_after"] = {"load_average_1m": machine_info()["load_average_1m"]}
    summary["targets"] = evaluate_targets(summary["scenarios"], quick)
    if plots_dir is not None:
        try:
            from bench.plots import make_plots

            summary["plots"] = [str(p) for p in make_plots(summary, plots_dir)]
        except Exception as exc:
            summary["plots_error"] = f"{type(exc).__name__}: {exc}"
    write_result("all", summary, out_dir)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    parser.add_argument("--only", default="", help=f"comma-separated scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--profile", action="store_true", help="cProfile each scenario")
    parser.add_argument("--sinks", default="", help="throughput/latency sinks: file,kafka,nats,jetstream")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plots-dir", type=Path, default=None,
                        help="where to write PNG plots (default: docs/ on a full run, none on --quick)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--gc-threshold", default="service",
                        help="the bridge's gc thresholds: 'service' (default: as the service configures "
                             "them), 'python' (the interpreter's defaults) or e.g. 50000,20,100")
    parser.add_argument("--long-rate", type=float, default=None,
                        help="the long scenario's events/s (default 10000; 1000 with --quick)")
    parser.add_argument("--long-seconds", type=float, default=None,
                        help="the long scenario's duration (default 600; 20 with --quick)")
    parser.add_argument("--compare-ref", default="", metavar="REF",
                        help="also run the chosen scenarios on git commit REF (a temporary worktree, "
                             "its own code) and print both figures and their ratio")
    parser.add_argument("--ref-harness", choices=("here", "own"), default="here",
                        help="with --compare-ref: run this tree's scenario code on REF's project code "
                             "(default) or REF's own harness")
    args = parser.parse_args(argv)
    if args.compare_ref:
        return _compare_main(args)
    configure_gc(args.gc_threshold)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()] or None
    plots_dir = None if args.no_plots else (args.plots_dir or (None if args.quick else DOCS_DIR))
    long_params = {k: v for k, v in (("rate", args.long_rate), ("seconds", args.long_seconds))
                   if v is not None}
    summary = run_all(quick=args.quick, only=only, profile=args.profile, results_dir=args.results_dir,
                      sinks=sinks, plots_dir=plots_dir, params={"long": long_params},
                      progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(table(summary))
    print(f"\nresults: {args.results_dir / 'all.json'}  ({summary['seconds']} s)")
    return 0


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The options each side's harness process gets besides the scenario and sizes."""
    extra = ["--profile"] if args.profile else []
    if args.long_rate is not None:
        extra.append(f"--long-rate={args.long_rate}")
    if args.long_seconds is not None:
        extra.append(f"--long-seconds={args.long_seconds}")
    return extra


def _compare_main(args: argparse.Namespace) -> int:
    import signal

    from bench.compare import compare, compare_table

    # A terminated run still removes its temporary worktree (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    only = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in only if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()] or None
    report = compare(args.compare_ref, only, quick=args.quick, results_dir=args.results_dir, sinks=sinks,
                     gc_threshold=args.gc_threshold, harness=args.ref_harness,
                     extra=_passed_on(args),
                     progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(compare_table(report))
    print(f"\nresults: {args.results_dir}/compare-*.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
