"""Workers (``workers: N``, docs/sharding.md): the real ``kube-event-bridge run`` with 1 and 2 worker
processes on the throughput burst, and the per-stage costs the projection for more cores rests on.

Pods exist and the bridge (a file sink per worker) has listed and delivered them; then every Pod
is updated ``rounds`` times in a burst made by the simulator while the bridge runs. Measured end to
end, through the supervisor and its merged ``/metrics``, for the burst alone (start-up and list
excluded):

* throughput: the burst's changes over the time from its first update until the pod's
  ``keb_sink_events_total{outcome="delivered"}`` counts them all (bounded by the simulator's pace
  of making them, which shares the machine);
* CPU seconds of every worker process (``/proc/<pid>/stat``) and of the supervisor over the burst;

and per stage, in this process:

* **skip**: the sharded decoder on a watch line of another shard's Pod (the identity pass, the uid
  hash, a bookmark): µs per line; what every worker pays for each change it does not own;
* **fan-out**: bytes of the watch stream per change (every worker reads the whole stream);
* **merge**: the supervisor's metrics merge, per scrape (not per event).

``python -m bench.bench_workers [--quick]``; also ``python -m bench.run --only workers``; results in
``bench/results/workers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench.common import BENCH_NAMESPACE, SimProcess, machine_info, write_result

FULL = {"pods": 2000, "rounds": 10}
QUICK = {"pods": 300, "rounds": 5}
TIMEOUT = 300.0
_ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(url: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": url}}],
        "users": [{"name": "sim", "user": {}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}]}))
    return path


async def _delivered(http: aiohttp.ClientSession, port: int) -> tuple[int, list[int]]:
    """Delivered events of the whole pod (its merged /metrics), and the workers' PIDs."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        text = await r.text()
    total = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "keb_sink_events_total" and s.labels.get("outcome") == "delivered":
                total += int(s.value)
    async with http.get(f"http://127.0.0.1:{port}/readyz", timeout=aiohttp.ClientTimeout(total=10)) as r:
        body = await r.json()
    pids = [int(w["pid"]) for w in body.get("workers", []) if w.get("pid")]
    return total, pids


async def _wait_delivered(http: aiohttp.ClientSession, port: int, count: int,
                          proc: asyncio.subprocess.Process, log: Path, t0: float) -> list[int]:
    """Waits until the pod's merged /metrics counts ``count`` delivered events; the workers' PIDs."""
    delivered = 0
    while True:
        if time.perf_counter() - t0 > TIMEOUT or proc.returncode is not None:
            tail = await asyncio.to_thread(log.read_text)
            raise RuntimeError(f"{delivered}/{count} delivered; {tail[-2000:]}")
        try:
            delivered, pids = await _delivered(http, port)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, ValueError):
            delivered, pids = 0, []
        if delivered >= count and (pids or proc.pid):
            return pids
        await asyncio.sleep(0.1)  # each poll renders every worker's metrics: not too often


async def _run_workers(workers: int, size: dict[str, int], tmp: Path) -> dict[str, Any]:
    """The bridge with ``workers`` lists the Pods (delivered as ``added``), then the burst of updates
    is made while it runs: CPU and time are those of the burst alone, start-up and list excluded."""
    work = tmp / f"workers-{workers}"
    work.mkdir()
    async with SimProcess() as sim:
        await sim.prefill(size["pods"], BENCH_NAMESPACE)
        port = _free_port()
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump({
            "cluster": "bench",
            "kubernetes": {"kubeconfig": str(_kubeconfig(sim.url, work / "kubeconfig")),
                           "in_cluster": "false"},
            "resources": [{"resource": "pods", "namespace": BENCH_NAMESPACE}],
            "sinks": [{"name": "file", "kind": "file", "path": str(work / "events.jsonl")}],
            "checkpoint": {"store": "file", "directory": str(work / "checkpoints"), "interval": 5.0,
                           "spill_directory": str(work / "spill")},
            "server": {"host": "127.0.0.1", "port": port, "admin_port": 0},
            "logging": {"level": "warning", "format": "text"},
            "workers": workers,
        }))
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEB_")}
        log = work / "bridge.log"
        t_start = time.perf_counter()
        with log.open("wb") as fh:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bridge.service.cli", "run", "--config", str(config), cwd=_ROOT,
                stdout=fh, stderr=fh, env=env)
        try:
            async with aiohttp.ClientSession() as http:
                pids = await _wait_delivered(http, port, size["pods"], proc, log, t_start)
                pids = pids if workers > 1 else [proc.pid]
                cpu0 = [_cpu_seconds(p) for p in pids]
                sup0 = _cpu_seconds(proc.pid)
                t0 = time.perf_counter()
                burst = await sim.burst(size["rounds"], BENCH_NAMESPACE)
                events = int(burst["events"])
                await _wait_delivered(http, port, size["pods"] + events, proc, log, t0)
                seconds = time.perf_counter() - t0
                cpu = [_cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
                supervisor_cpu = _cpu_seconds(proc.pid) - sup0 if workers > 1 else 0.0
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(proc.wait(), 60)
    return {"workers": workers, "events": events, "seconds": round(seconds, 3),
            "burst_generation_seconds": round(float(burst["seconds"]), 3),
            "events_per_s": round(events / seconds), "worker_cpu_seconds": [round(c, 3) for c in cpu],
            "supervisor_cpu_seconds": round(supervisor_cpu, 3),
            "cpu_us_per_event": round(sum(cpu) / events * 1e6, 1)}


def _stage_skip(lines: int = 20_000) -> dict[str, Any]:
    """µs per watch line of another shard's Pod through the sharded decoder: as the simulator lays a
    Pod out (its uid after the labels, annotations and managedFields: the msgspec pass over the
    line) and as an API server does (Go's field order: the uid among the first bytes)."""
    from bench.common import pod_templates, vary_pod
    from bridge.kube.sharding import ShardFilter, shard_of, sharded_decoder

    samples, api_layout = [], []
    for i, template in enumerate(pod_templates(256)):
        pod = vary_pod(template, f"pod-{i}", BENCH_NAMESPACE)
        uid = f"00000000-0000-4000-8000-{i:012d}"
        meta = {**pod["metadata"], "uid": uid, "resourceVersion": str(1000 + i)}
        pod["metadata"] = meta
        samples.append((meta["uid"], orjson.dumps({"type": "MODIFIED", "object": pod})))
        first = {k: meta[k] for k in ("name", "generateName", "namespace", "uid", "resourceVersion")
                 if k in meta}
        go = {"kind": pod["kind"], "apiVersion": pod["apiVersion"], "metadata": {**first, **meta},
              **{k: v for k, v in pod.items() if k not in ("kind", "apiVersion", "metadata")}}
        api_layout.append(orjson.dumps({"type": "MODIFIED", "object": go}))
    # Shard 1 of 2 reading shard 0's lines.
    foreign = [i for i, (uid, _) in enumerate(samples) if shard_of(uid, 2) == 0]
    out: dict[str, Any] = {"lines": lines}
    for name, source in (("us_per_line", [samples[i][1] for i in foreign]),
                         ("us_per_line_api_layout", [api_layout[i] for i in foreign])):
        shard = ShardFilter(ordinal=1, total=2)
        decode = sharded_decoder(orjson.loads, shard)  # never reached: all foreign
        batch = (source * (lines // len(source) + 1))[:lines]
        t0 = time.perf_counter()
        for line in batch:
            decode(line)
        out[name] = round((time.perf_counter() - t0) / lines * 1e6, 2)
        assert shard.skipped == lines
    out["line_bytes"] = round(sum(len(samples[i][1]) for i in foreign) / len(foreign))
    return out


def _stage_merge(workers: int = 8) -> dict[str, Any]:
    """The supervisor's metrics merge, per scrape, of ``workers`` expositions of a running bridge's size."""
    from bridge.service.workers import merge_metrics

    families = []
    for f in range(40):
        families.append(f"# HELP keb_m{f} m\n# TYPE keb_m{f} counter\n")
        families.extend(f'keb_m{f}_total{{sink="s{s}",shard="0"}} {s}.0\n' for s in range(5))
    text = "".join(families)
    texts = dict.fromkeys(range(workers), text)
    t0 = time.perf_counter()
    for _ in range(20):
        merge_metrics(texts)
    return {"workers": workers, "samples_per_worker": 200,
            "ms_per_scrape": round((time.perf_counter() - t0) / 20 * 1e3, 2)}


def project(*, deliver_us: float, skip_us: float, bytes_per_change: float) -> list[dict[str, Any]]:
    """Changes/s of one resource a replica of N cores keeps up with, a worker per core: each worker
    delivers 1/N of the changes and skips the rest, so it spends R * (deliver/N + skip * (N-1)/N) µs
    of CPU per second of a stream of R changes/s."""
    rows = []
    for n in (1, 2, 4, 8, 16):
        per_change = deliver_us / n + skip_us * (n - 1) / n
        rate = 1e6 / per_change
        rows.append({"cores": n, "cpu_us_per_change_per_worker": round(per_change, 1),
                     "changes_per_s": round(rate), "speedup": round(rate / (1e6 / deliver_us), 2),
                     "watch_bytes_per_s_out_of_api_server": round(n * rate * bytes_per_change)})
    return rows


async def _scenario(quick: bool) -> dict[str, Any]:
    size = QUICK if quick else FULL
    out: dict[str, Any] = {**size, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="keb-bench-workers-") as tmp:
        for n in (1, 2):
            out["runs"][str(n)] = await _run_workers(n, size, Path(tmp))
    out["stage_skip"] = _stage_skip()
    out["stage_merge"] = _stage_merge()
    one, two = out["runs"]["1"], out["runs"]["2"]
    out["speedup_2_over_1"] = round(two["events_per_s"] / max(1, one["events_per_s"]), 2)
    # Per delivered change: one worker's CPU over the burst.
    deliver_us = one["cpu_us_per_event"]
    # Per skipped change, end to end: what two workers spent beyond one, over the changes each skipped.
    extra = sum(two["worker_cpu_seconds"]) - sum(one["worker_cpu_seconds"])
    skip_e2e = max(0.0, extra / one["events"] * 1e6)
    out["skip_us_end_to_end"] = round(skip_e2e, 1)
    out["projection"] = project(deliver_us=deliver_us, skip_us=skip_e2e,
                                bytes_per_change=out["stage_skip"]["line_bytes"])
    return out


def run(quick: bool = False, results_dir: Path | None = None) -> dict[str, Any]:
    result = asyncio.run(_scenario(quick))
    result["quick"] = quick
    result["machine"] = machine_info()
    write_result("workers", result, results_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_workers")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    result = run(quick=args.quick)
    shown = {k: v for k, v in result.items() if k != "machine"}
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
