"""``python -m bench.run --compare-ref REF``: the same scenarios on an older commit and on this tree, in
one run, side by side.

REF is checked out into a temporary git worktree (``git worktree add --detach``, removed afterwards).
By default this tree's ``bench/`` replaces REF's there (``--ref-harness here``), so both sides run
literally the same scenario code and only the project's code differs; ``--ref-harness own`` keeps
REF's own harness. Each scenario runs twice, REF first then this tree, each time in a fresh
``python -m bench.run --only NAME`` process of this interpreter (this virtualenv: the same
third-party packages) whose working directory and ``PYTHONPATH`` are that tree, so ``bridge``,
``sinks`` and ``bench`` are imported from there (the harness checks it before running and records
the paths). This tree runs from a snapshot too (``git stash create``: HEAD plus the uncommitted
changes of tracked files, in a second temporary worktree), so editing files while a long comparison
runs changes neither side. Alternating per scenario keeps a change in the machine's load from favouring one
side. The headline figures of each scenario (events/s, CPU µs per event from the process's CPU time,
ratio to the raw client loop, p99, sync times, …) are paired and their ratio (this tree / REF) printed;
everything is written to ``<results>/compare-<ref>.json`` and the table to ``compare-<ref>.txt``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["REPO_ROOT", "check_imports", "compare", "compare_table", "headline", "ref_worktree"]

REPO_ROOT = Path(__file__).resolve().parent.parent

_IMPORT_PROBE = (
    "import json, bridge, sinks, bench.run; "
    "print(json.dumps({m.__name__: m.__file__ for m in (bridge, sinks, bench.run)}))"
)


def _git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def ref_worktree(ref: str, *, harness: str = "here") -> Iterator[tuple[Path, str]]:
    """REF checked out (detached) in a temporary worktree: yields (its directory, the full commit).
    With ``harness="here"`` its ``bench/`` is replaced by this tree's (results left out)."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    parent = Path(tempfile.mkdtemp(prefix="keb-ref-"))
    tree = parent / "tree"
    _git("worktree", "add", "--detach", "--force", str(tree), sha)
    try:
        if harness == "here":
            shutil.rmtree(tree / "bench", ignore_errors=True)
            shutil.copytree(REPO_ROOT / "bench", tree / "bench",
                            ignore=shutil.ignore_patterns("results", "__pycache__"))
            (tree / "bench" / "results").mkdir()
        yield tree, sha
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "prune")


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTHONSTARTUP", None)
    return env


def check_imports(tree: Path) -> dict[str, str]:
    """Where ``bridge``, ``sinks`` and ``bench.run`` come from when run in ``tree``; raises if any of
    them is not from there (an installed copy would make the comparison meaningless)."""
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], cwd=tree, env=_env(tree),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot import the project in {tree}: {proc.stderr[-800:]}")
    paths: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    root = tree.resolve()
    wrong = {m: p for m, p in paths.items() if not Path(p).resolve().is_relative_to(root)}
    if wrong:
        raise RuntimeError(f"modules imported from outside {tree}: {wrong}")
    return paths


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Terminates ``proc``'s process group (then kills what is left after 5 s)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_side(tree: Path, scenario: str, out_dir: Path, *, quick: bool, sinks: Sequence[str] | None,
              gc_threshold: str, extra: Sequence[str], timeout: float) -> dict[str, Any]:
    """One scenario in a fresh harness process of ``tree``; its ``all.json`` entry for it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.run", "--only", scenario, "--results-dir", str(out_dir),
           "--no-plots", "--gc-threshold", gc_threshold, *extra]
    if quick:
        cmd.append("--quick")
    if sinks:
        cmd += ["--sinks", ",".join(sinks)]
    t0 = time.perf_counter()
    # Its own process group: a timeout or an interrupted comparison ends the harness together with
    # the brokers and the simulator it started.
    proc = subprocess.Popen(cmd, cwd=tree, env=_env(tree), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise
    seconds = round(time.perf_counter() - t0, 1)
    summary_path = out_dir / "all.json"
    if proc.returncode != 0 or not summary_path.exists():
        return {"status": "failed", "seconds": seconds,
                "error": f"exit {proc.returncode}: {err[-1500:]}"}
    summary = json.loads(summary_path.read_text())
    entry: dict[str, Any] = summary["scenarios"].get(scenario, {"status": "missing"})
    entry["process_seconds"] = seconds
    return entry


# --------------------------------------------------------------------------------------------------
# Headline figures of a scenario, paired between the two sides

Figure = tuple[float, bool]
"""(value, higher is better)."""


def headline(name: str, result: Mapping[str, Any]) -> dict[str, Figure]:
    """The figures of one scenario's result worth comparing, by label."""
    out: dict[str, Figure] = {}
    if name == "throughput":
        for kind, e in result.get("sinks", {}).items():
            if "error" in e:
                continue
            out[f"{kind}: steady events/s"] = (float(e["steady_events_per_s"]), True)
            if "steady_messages_per_s" in e:
                out[f"{kind}: steady messages/s"] = (float(e["steady_messages_per_s"]), True)
            out[f"{kind}: raw client events/s"] = (float(e["ceiling_events_per_s"]), True)
            out[f"{kind}: ratio to raw client"] = (float(e["ratio_to_ceiling"]), True)
            if "cpu_us_per_event" in e:
                out[f"{kind}: CPU µs per event"] = (float(e["cpu_us_per_event"]), False)
    elif name == "latency":
        for kind, per_rate in result.get("sinks", {}).items():
            for rate, e in per_rate.items():
                if "error" in e:
                    continue
                out[f"{kind} @ {rate}/s: p50 ms"] = (float(e["p50_ms"]), False)
                out[f"{kind} @ {rate}/s: p99 ms"] = (float(e["p99_ms"]), False)
    elif name == "initial_sync":
        out[f"{result.get('pods')} Pods: synced s"] = (float(result["synced_seconds"]), False)
        out[f"{result.get('pods')} Pods: delivered s"] = (float(result["delivered_seconds"]), False)
    elif name == "isolation":
        cost = result.get("cost", {})
        for policy in ("spill", "block"):
            if policy in cost:
                out[f"burst changes/s ({policy})"] = (float(cost[policy]["changes_per_second"]), True)
        for policy in ("spill", "block"):
            if "cpu_us_per_change" in cost.get(policy, {}):
                out[f"CPU µs per change ({policy})"] = (float(cost[policy]["cpu_us_per_change"]), False)
            if "spilled" in cost.get(policy, {}):
                out[f"changes spilled ({policy})"] = (float(cost[policy]["spilled"]), False)
        if "spill_vs_block" in cost:
            out["never-wait vs blocking path (rate)"] = (float(cost["spill_vs_block"]), True)
        if "cpu_spill_vs_block" in cost:
            out["never-wait vs blocking path (CPU)"] = (float(cost["cpu_spill_vs_block"]), False)
    elif name == "informer":
        for variant, e in result.get("throughput", {}).items():
            out[f"informer {variant}: deltas/s"] = (float(e["deltas_per_second"]), True)
    elif name == "decode":
        watch = result.get("watch", {})
        if "bridge_events_per_s" in watch:
            out["decode: bridge watch events/s (HTTP)"] = (float(watch["bridge_events_per_s"]), True)
            out["decode: watch ratio to the official client"] = (float(watch["ratio"]), True)
    elif name == "naive":
        out["bridge events/s"] = (float(result["bridge"]["events_per_s"]), True)
        out["ratio to the naive client"] = (float(result["ratio"]), True)
    elif name == "memory":
        for variant, e in result.get("variants", {}).items():
            if "rss_bytes_per_object" in e:
                out[f"{variant}: bytes/object"] = (float(e["rss_bytes_per_object"]), False)
    elif name == "sinks":
        for kind, e in result.get("sinks", {}).items():
            for mode, label in (("sink", "one deliver per event"), ("batch", "deliver_batch")):
                if f"{mode}_events_per_s" not in e:
                    continue
                where = f"{kind} alone, {label}"
                out[f"{where}: events/s"] = (float(e[f"{mode}_events_per_s"]), True)
                if f"{mode}_cpu_us_per_event" in e:
                    out[f"{where}: CPU µs per event"] = (float(e[f"{mode}_cpu_us_per_event"]), False)
                if f"{mode}_calls_per_event" in e:
                    out[f"{where}: calls per event"] = (float(e[f"{mode}_calls_per_event"]), False)
            out[f"{kind}: raw client events/s"] = (float(e["raw_events_per_s"]), True)
    elif name == "telemetry":
        out["telemetry µs per event"] = (float(result["metered_overhead_us_per_event"]), False)
    elif name == "long":
        for key in ("cpu_us_per_event", "events_per_s"):
            if key in result:
                out[key] = (float(result[key]), key != "cpu_us_per_event")
        if "rss_max_bytes" in result:
            out["RSS max bytes"] = (float(result["rss_max_bytes"]), False)
    return out


def pair(name: str, ref_entry: Mapping[str, Any], here_entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{figure, ref, here, ratio, better}`` of one scenario (ratio = here / ref)."""
    ref = headline(name, ref_entry.get("result") or {}) if ref_entry.get("status") == "ok" else {}
    here = headline(name, here_entry.get("result") or {}) if here_entry.get("status") == "ok" else {}
    rows = []
    for label in dict.fromkeys([*ref, *here]):
        r, h = ref.get(label), here.get(label)
        ratio = round(h[0] / r[0], 3) if r and h and r[0] else None
        higher = (h or r or (0.0, True))[1]
        better = None if ratio is None else (ratio > 1) == higher
        rows.append({"figure": label, "ref": r[0] if r else None, "here": h[0] if h else None,
                     "ratio": ratio, "higher_is_better": higher, "better": better})
    return rows


def compare_table(report: Mapping[str, Any]) -> str:
    ref_label = f"{report['ref']} ({report['ref_commit'][:9]}, {report.get('ref_harness', 'own')} harness)"
    here_label = f"this tree ({report['here_commit'][:9]}{'+' if report.get('here_dirty') else ''})"
    width = (46, 16, 16, 9)
    lines = [f"compare: {ref_label} vs {here_label}; quick={report['quick']}",
             "  ".join(h.ljust(w) for h, w in zip(("figure", "ref", "here", "here/ref"), width, strict=True)),
             "  ".join("-" * w for w in width)]

    def fmt(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"

    for name, block in report["scenarios"].items():
        lines.append(f"[{name}] ref {block['ref'].get('status')}, here {block['here'].get('status')}")
        for side in ("ref", "here"):
            if block[side].get("status") != "ok":
                lines.append(f"    {side}: {str(block[side].get('error', ''))[-300:]}")
        for row in block["rows"]:
            ratio = "-" if row["ratio"] is None else f"{row['ratio']}x"
            cells = (row["figure"], fmt(row["ref"]), fmt(row["here"]), ratio)
            lines.append("  ".join(c[:w].ljust(w) for c, w in zip(cells, width, strict=True)))
    return "\n".join(lines)


def compare(ref: str, scenarios: Sequence[str], *, quick: bool, results_dir: Path,
            sinks: Sequence[str] | None = None, gc_threshold: str = "service",
            extra: Sequence[str] = (), timeout: float = 3600.0, harness: str = "here",
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs ``scenarios`` on REF and on this tree, alternating; writes and returns the report."""
    say = progress or (lambda _msg: None)
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    here_commit = (_git("stash", "create") if dirty else "") or _git("rev-parse", "HEAD")
    report: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "ref": ref, "ref_harness": harness, "quick": quick,
        "sinks": list(sinks or []), "gc_threshold": gc_threshold,
        "here_commit": _git("rev-parse", "HEAD"), "here_dirty": dirty, "here_snapshot": here_commit,
        "scenarios": {},
    }
    safe_ref = "".join(c if c.isalnum() or c in "-_." else "_" for c in ref)
    with ref_worktree(ref, harness=harness) as (ref_tree, sha), \
            ref_worktree(here_commit, harness="own") as (here_tree, _):
        report["ref_commit"] = sha
        report["imports"] = {"ref": check_imports(ref_tree), "here": check_imports(here_tree)}
        work = results_dir / f"compare-{safe_ref}"
        for name in scenarios:
            block: dict[str, Any] = {}
            for side, tree in (("ref", ref_tree), ("here", here_tree)):
                say(f"running {name} on {side} …")
                try:
                    block[side] = _run_side(tree, name, work / side, quick=quick, sinks=sinks,
                                            gc_threshold=gc_threshold, extra=extra, timeout=timeout)
                except subprocess.TimeoutExpired:
                    block[side] = {"status": "failed", "error": f"timed out after {timeout} s"}
                say(f"  {name} on {side}: {block[side].get('status')}")
            block["rows"] = pair(name, block["ref"], block["here"])
            report["scenarios"][name] = block
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"compare-{safe_ref}.json").write_text(json.dumps(report, indent=1, default=str))
    (results_dir / f"compare-{safe_ref}.txt").write_text(compare_table(report) + "\n")
    return report
