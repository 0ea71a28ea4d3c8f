"""The start of a bridge watching 5 resources in each of 1,000 namespaces, with and without the
client-side rate limit, against an API server that answers like priority and fairness.

Why: a bridge scoped by namespace runs one informer per (resource, namespace): 5,000 lists and 5,000
watches at start. Without a client-side limit they go out at once and the API server's priority and
fairness answers what exceeds the flow's seats with 429 and ``Retry-After``, every client retries
after the same second, and the storm repeats; with client-go's old default of 5 requests a second
the same start takes 17 minutes (knative/eventing #8642). This scenario measures both at the API
server's side.

The world: the simulator in a child process (``python -m bridge.sim`` with ``--apf-concurrency``,
its CPU is not the bridge's) holding ``per_namespace`` objects of each resource in every namespace,
and ``kube-event-bridge run`` as a process with one resource entry per (resource, namespace), a file
sink and no checkpoint store. For each mode (``limited``: the default ``kubernetes.qps``/``burst``;
``unlimited``: ``qps: -1``) it reports, from the simulator's counters sampled twice a second until
``/readyz`` answers 200: the time to synced, requests and bytes per second at the API server (mean
and peak), the 429s answered, and from the bridge's ``/metrics`` the seconds its requests waited for
the limit.

    python -m bench.bench_namespaces --namespaces 1000 [--modes limited,unlimited]
    python -m bench.run --only namespaces [--quick]

Writes ``bench/results/namespaces.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.common import RESULTS_DIR, machine_info, write_result
from bridge.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS

__all__ = ["RESOURCES", "Apf", "main", "measure", "run"]

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ("configmaps", "secrets", "services", "deployments.apps", "pods")
CLIENT_GO_DEFAULTS = (5.0, 10)
"""client-go's ``DefaultQPS`` and ``DefaultBurst`` (rest/config.go), the ``client-go-defaults`` mode."""
APF_CONCURRENCY = 10
"""Seats of the bridge's flow in the simulator: a modest share of an API server."""
APF_QUEUE_WAIT = 15.0
"""Seconds a request beyond them waits for a seat before its 429 (kube-apiserver: a quarter of the
request timeout)."""
APF_QUEUE_LENGTH = 300
"""Requests of the flow that may wait; beyond, 429 at once (kube-apiserver's workload-low level
deals a flow 6 queues of 50)."""


def _objects(resource: str, name: str) -> dict[str, Any]:
    if resource == "configmaps":
        return {"metadata": {"name": name, "labels": {"app": "web"}}, "data": {"key": "v" * 200}}
    if resource == "secrets":
        return {"metadata": {"name": name}, "type": "Opaque", "data": {"key": "dmFsdWU="}}
    if resource == "services":
        return {"metadata": {"name": name}, "spec": {"ports": [{"port": 80, "targetPort": 8080}],
                                                     "selector": {"app": name}}}
    if resource == "deployments.apps":
        return {"metadata": {"name": name}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}
    return {"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}], "nodeName": "node-1"}}


_SIM_CHILD = """
import asyncio, sys
from bridge.sim import Simulator
from bridge.sim.apf import FlowControl
from bench.bench_namespaces import RESOURCES, _objects

async def main(namespaces, per_namespace, concurrency, queue_wait, queue_length, latency):
    names = [f"ns-{i:04d}" for i in range(namespaces)]
    sim = Simulator(namespaces=["default", *names], bookmark_interval=30.0, faults={"delay": latency},
                    flow_control=FlowControl(concurrency=concurrency, queue_wait=queue_wait,
                                             queue_length=queue_length))
    for ns in names:
        for resource in RESOURCES:
            for j in range(per_namespace):
                sim.store.create(resource, _objects(resource, f"obj-{j}"), namespace=ns)
    url = await sim.start()
    print(url, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await sim.stop()

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                 int(sys.argv[5]), float(sys.argv[6])))
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Apf:
    """The simulator's flow control for the bridge's flow."""

    concurrency: int = APF_CONCURRENCY
    queue_wait: float = APF_QUEUE_WAIT
    queue_length: int = APF_QUEUE_LENGTH
    latency: float = 0.0
    """Seconds the simulator takes over each request besides its own work (its fault delay)."""


@contextlib.contextmanager
def _sim(namespaces: int, per_namespace: int, apf: Apf) -> Any:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIM_CHILD, str(namespaces), str(per_namespace), str(apf.concurrency),
         str(apf.queue_wait), str(apf.queue_length), str(apf.latency)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the simulator did not start")
        yield url
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _config(work: Path, url: str, namespaces: int, port: int, limit: tuple[float, int] | None,
            ) -> dict[str, Any]:
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": url}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "users": [{"name": "sim", "user": {}}]}))
    kubernetes: dict[str, Any] = {"kubeconfig": str(kubeconfig), "in_cluster": "false"}
    if limit is None:
        kubernetes["qps"] = -1
    else:
        kubernetes["qps"], kubernetes["burst"] = limit
    return {
        "cluster": "bench",
        "kubernetes": kubernetes,
        "resources": [{"resource": r, "namespace": f"ns-{i:04d}"} for i in range(namespaces)
                      for r in RESOURCES],
        "sinks": [{"name": "file", "kind": "file", "path": str(work / "events.jsonl")}],
        "checkpoint": {"store": "none", "spill_directory": ""},
        "server": {"host": "127.0.0.1", "port": port, "admin_port": 0},
        "logging": {"level": "warning", "format": "text"},
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def _sample(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/_sim/state") as r:
        state: dict[str, Any] = await r.json()
    return state


async def _run_mode(work: Path, url: str, namespaces: int, limit: tuple[float, int] | None,
                    timeout: float) -> dict[str, Any]:
    port = _free_port()
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump(_config(work, url, namespaces, port, limit)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEB_")}
    log = (work / "bridge.log").open("wb")
    async with aiohttp.ClientSession() as http:
        before = await _sample(http, url)
        started = time.monotonic()
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited on
            [sys.executable, "-m", "bridge.service.cli", "run", "--config", str(cfg)],
            cwd=ROOT, stdout=log, stderr=log, env=env)
        samples: list[tuple[float, int, int, int]] = []
        synced: float | None = None
        metrics = ""
        try:
            while time.monotonic() - started < timeout:
                await asyncio.sleep(0.5)
                if proc.poll() is not None:
                    raise RuntimeError(f"the bridge exited: {(work / 'bridge.log').read_text()[-2000:]}")
                state = await _sample(http, url)
                samples.append((time.monotonic() - started, state["requests_received"], state["bytes_sent"],
                                state["flow_control"]["rejected"]))
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"http://127.0.0.1:{port}/readyz",
                                        timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            synced = time.monotonic() - started
                            async with http.get(f"http://127.0.0.1:{port}/metrics") as m:
                                metrics = await m.text()
                            break
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    after = samples[-1] if samples else (0.0, before["requests_received"], before["bytes_sent"],
                                         before["flow_control"]["rejected"])
    requests = after[1] - before["requests_received"]
    sent = after[2] - before["bytes_sent"]
    rejected = after[3] - before["flow_control"]["rejected"]
    elapsed = synced if synced is not None else time.monotonic() - started
    rates = [((b[1] - a[1]) / (b[0] - a[0]), (b[2] - a[2]) / (b[0] - a[0]), b[3] - a[3])
             for a, b in itertools.pairwise(samples) if b[0] > a[0]]
    return {
        "synced": synced is not None,
        "time_to_synced_s": round(elapsed, 2),
        "requests": requests,
        "requests_per_s_mean": round(requests / elapsed, 1) if elapsed else 0.0,
        "requests_per_s_peak": round(max((r[0] for r in rates), default=0.0), 1),
        "bytes": sent,
        "bytes_per_s_mean": round(sent / elapsed) if elapsed else 0,
        "bytes_per_s_peak": round(max((r[1] for r in rates), default=0.0)),
        "rejected_429": rejected,
        "rejected_429_peak_per_half_s": max((r[2] for r in rates), default=0),
        "throttled_s": round(_metric(metrics, "keb_api_client_throttled_seconds_total"), 1),
        "throttled_requests": int(_metric(metrics, "keb_api_client_throttled_requests_total")),
    }


def measure(*, namespaces: int, per_namespace: int = 2, modes: tuple[str, ...] = ("limited", "unlimited"),
            timeout: float = 1800.0, apf: Apf | None = None,
            limit: tuple[float, int] = (DEFAULT_QPS, DEFAULT_BURST)) -> dict[str, Any]:
    """Runs each mode against a fresh simulator; returns the figures by mode. ``limit``: the
    ``limited`` mode's (qps, burst)."""
    apf = apf or Apf()
    out: dict[str, Any] = {"namespaces": namespaces, "resources": list(RESOURCES),
                           "informers": namespaces * len(RESOURCES), "per_namespace": per_namespace,
                           "apf_concurrency": apf.concurrency, "apf_queue_wait_s": apf.queue_wait,
                           "apf_queue_length": apf.queue_length, "latency_s": apf.latency,
                           "qps": limit[0], "burst": limit[1],
                           "modes": {}}
    limits: dict[str, tuple[float, int] | None] = {"limited": limit, "unlimited": None,
                                                   "client-go-defaults": CLIENT_GO_DEFAULTS}
    for mode in modes:
        if mode not in limits:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(limits)}")
        with tempfile.TemporaryDirectory(prefix=f"keb-bench-ns-{mode}-") as tmp, \
                _sim(namespaces, per_namespace, apf) as url:
            out["modes"][mode] = asyncio.run(_run_mode(Path(tmp), url, namespaces, limits[mode], timeout))
    return out


def run(*, quick: bool = False, results_dir: Path = RESULTS_DIR) -> dict[str, Any]:
    """The harness's entry (``python -m bench.run --only namespaces``): 1,000 namespaces, or 40 with
    ``quick``."""
    result = measure(namespaces=40 if quick else 1000)
    result["machine"] = machine_info()
    write_result("namespaces", result, results_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespaces", type=int, default=1000)
    p.add_argument("--per-namespace", type=int, default=2, help="objects of each resource per namespace")
    p.add_argument("--modes", default="limited,unlimited",
                   help="limited (kubernetes.qps/burst defaults), unlimited (qps: -1), "
                        "client-go-defaults (5/10)")
    p.add_argument("--latency", type=float, default=0.0,
                   help="seconds the simulator takes over each request besides its own work")
    p.add_argument("--queue-length", type=int, default=APF_QUEUE_LENGTH,
                   help="requests of the bridge's flow that may wait for a seat; beyond, 429 at once")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    result = measure(namespaces=args.namespaces, per_namespace=args.per_namespace,
                     modes=tuple(m for m in args.modes.split(",") if m),
                     apf=Apf(latency=args.latency, queue_length=args.queue_length))
    result["machine"] = machine_info()
    write_result("namespaces", result, args.results_dir)
    print(f"{args.namespaces} namespaces x {len(RESOURCES)} resources ({result['informers']} informers), "
          f"APF {APF_CONCURRENCY} seats, {args.queue_length} queued at most for {APF_QUEUE_WAIT:g} s, "
          f"{args.latency * 1000:g} ms per request")
    print(f"{'mode':<18} {'synced s':>9} {'req':>7} {'req/s':>7} {'peak':>7} {'MB/s':>6} {'429s':>7} "
          f"{'throttled s':>12}")
    for mode, r in result["modes"].items():
        print(f"{mode:<18} {r['time_to_synced_s']:>9.1f} {r['requests']:>7} {r['requests_per_s_mean']:>7.1f} "
              f"{r['requests_per_s_peak']:>7.1f} {r['bytes_per_s_mean'] / 1e6:>6.2f} {r['rejected_429']:>7} "
              f"{r['throttled_s']:>12.1f}")
    print(json.dumps(result["modes"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
