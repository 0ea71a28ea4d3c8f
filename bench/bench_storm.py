"""A webhook's catch-up after a storm of 503/429: real bridge processes, the simulator, a real HTTP server.

The scenario an operator meets when a webhook receiver is redeployed or overloaded: the simulator
(its own process) churns Pods at ``--rate`` changes per second; a ``kube-event-bridge run`` process
watches them and posts each change to a local HTTP server. After ``--warmup`` seconds the server
answers 503 (every third request 429 with ``Retry-After: 1``) for ``--storm`` seconds, then 2xx again.

Reported per bridge source tree (``--source``, repeatable: e.g. an export of main and this tree, run
one after the other in one invocation):

* ``catch_up_s``: from the storm's end to the receipt of the last change made before it (the
  backlog delivered): the figure the breaker is for;
* ``first_after_s``: from the storm's end to the first accepted request;
* ``late_over_5s``: changes received more than 5 s after they were made, counted from the storm's end;
* ``failed_requests``: requests answered 503/429 (each event's own retries, or the probes);
* ``catch_up_rate``: events received per second from the storm's end until the catch-up (the backlog
  and what arrived meanwhile);
* ``bridge_cpu`` / ``bench_cpu``: the CPU share (1.0 = one core) of the bridge process and of this
  process (the receiving server) during the catch-up;
* with ``--raw``, ``raw_rate``: the requests per second a bare aiohttp client (its own process,
  ``--raw-connections`` connections) reaches against the same server, the same body size, right
  after the run: the ceiling the machine allows one event per request at that moment.

A change's time is read from the simulator's resourceVersion: the bench polls it every 0.1 s, and an
event's change time is the first poll that saw its ``resourceversion`` (at most 0.1 s late).

    python -m bench.bench_storm --source /tmp/main-src --source . --storm 20 --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.common import machine_info, write_result

__all__ = ["run_one"]

_LAUNCH = ("import sys, bridge; sys.stderr.write('bridge from ' + bridge.__file__ + '\\n'); "
           "from bridge.service.cli import main; sys.exit(main())")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_RAW_CLIENT = """
import asyncio, sys, time, aiohttp
async def main(url, total, conns, size):
    body = b'{"x":"' + b'a' * max(0, size - 8) + b'"}'
    headers = {'content-type': 'application/cloudevents+json'}
    left = [conns]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as http:
        async def worker():
            while left[0] > 0:
                left[0] -= 1
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
        await asyncio.gather(*(worker() for _ in range(conns)))  # one per connection first: connected
        left[0] = total
        start = time.perf_counter()
        cpu0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(conns)))
        cpu = time.process_time() - cpu0
        print(total / (time.perf_counter() - start), cpu / total)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
"""


async def raw_rate(url: str, *, total: int, connections: int, body_size: int) -> tuple[float, float]:
    """Requests/s of a bare aiohttp client (its own process) posting ``total`` bodies of
    ``body_size`` bytes over ``connections`` connections to ``url``, and its CPU seconds per
    request."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RAW_CLIENT, url, str(total), str(connections), str(body_size),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    rate, cpu = out.decode().split()
    return float(rate), float(cpu)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Receiver:
    def __init__(self) -> None:
        self.storm_from = float("inf")
        self.storm_until = float("inf")
        self.requests = 0
        self.failed = 0
        self.gaps = 0
        self.received: list[tuple[float, int]] = []
        """(received, resourceVersion) per accepted event."""
        self.body_bytes = 0
        self.body_count = 0
        self.peers_storm: set[Any] = set()
        """Client connections (peer addresses) that carried a refused request."""
        self.peers_after: set[Any] = set()
        """Client connections that carried an accepted request after the storm."""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        self.requests += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if self.storm_from <= now < self.storm_until:
            self.peers_storm.add(peer)
            self.failed += 1
            if self.requests % 3 == 0:
                return web.Response(status=429, headers={"Retry-After": "1"})
            return web.Response(status=503)
        if now >= self.storm_until and request.path != "/raw":
            self.peers_after.add(peer)
        self.body_bytes += len(body)
        self.body_count += 1
        doc = orjson.loads(body)
        for ce in doc if isinstance(doc, list) else [doc]:
            if "subject" in ce:
                self.received.append((now, int(ce["resourceversion"])))
            elif str(ce.get("type", "")).endswith("gap.begin"):
                self.gaps += 1
        return web.Response(status=204)


async def _start_sim(source: Path, rate: float, objects: int,
                     workdir: Path) -> tuple[asyncio.subprocess.Process, Path, str]:
    kubeconfig = workdir / "sim.kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.sim", "--port", "0", "--kubeconfig", str(kubeconfig),
        "--churn-rate", str(rate), "--churn-objects", str(objects), "--seed", "5",
        cwd=str(source), env={**os.environ, "PYTHONPATH": str(source)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            raise RuntimeError("the simulator exited")
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            url = found.group(1)
            break
    # Keep reading its output so that the pipe never fills.
    async def drain() -> None:
        assert proc.stdout is not None
        while await proc.stdout.readline():
            pass
    asyncio.get_running_loop().create_task(drain())
    return proc, kubeconfig, url


class _RvClock:
    """The simulator's resourceVersion over time: (wall time, resourceVersion) every 0.1 s."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, int]] = []

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"{self.url}/api/v1/namespaces/default/configmaps",
                                    params={"limit": "1"}) as resp:
                    rv = int((await resp.json())["metadata"]["resourceVersion"])
                self.samples.append((time.time(), rv))
                await asyncio.sleep(0.1)

    def rv_at(self, when: float) -> int:
        """The resourceVersion the server had reached at ``when``."""
        i = bisect.bisect_right([t for t, _ in self.samples], when)
        return self.samples[max(0, i - 1)][1]

    def time_of(self, rv: int) -> float:
        """When the server first showed ``rv`` (or a later one)."""
        rvs = [r for _, r in self.samples]
        i = bisect.bisect_left(rvs, rv)
        return self.samples[min(i, len(self.samples) - 1)][0]


async def run_one(source: Path, *, rate: float, storm: float, warmup: float, tail: float,
                  objects: int, batch: int = 1, sink_extra: str = "", raw: int = 0,
                  raw_connections: int = 64) -> dict[str, Any]:
    """One bridge (from ``source``) through one storm; the figures of the module docstring."""
    workdir = Path(tempfile.mkdtemp(prefix="keb-storm-"))
    receiver = _Receiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sim, kubeconfig, sim_url = await _start_sim(source, rate, objects, workdir)
    clock = _RvClock(sim_url)
    clock_task = asyncio.get_running_loop().create_task(clock.run())
    cfg = workdir / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods}]\n"
        f"sinks: [{{name: hook, kind: webhook, url: 'http://127.0.0.1:{port}/events',\n"
        f"         batch: {{max_events: {batch}}}{', ' + sink_extra if sink_extra else ''}}}]\n"
        f"checkpoint: {{store: file, directory: '{workdir / 'cp'}', interval: 5}}\n"
        f"server: {{host: 127.0.0.1, port: {_free_port()}, admin_port: 0}}\n"
        "logging: {level: warning, format: json}\n")
    bridge = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _LAUNCH, "run", "--config", str(cfg),
        cwd=str(source), env={**os.environ, "PYTHONPATH": str(source)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert bridge.stderr is not None
    origin = (await bridge.stderr.readline()).decode().strip()
    log_lines: list[str] = []

    async def keep_log() -> None:
        assert bridge.stderr is not None
        while line := await bridge.stderr.readline():
            log_lines.append(line.decode())
    log_task = asyncio.get_running_loop().create_task(keep_log())
    try:
        await asyncio.sleep(warmup)
        receiver.storm_from = time.time()
        receiver.storm_until = receiver.storm_from + storm
        await asyncio.sleep(storm)
        await asyncio.sleep(0.2)
        rv_end = clock.rv_at(receiver.storm_until)
        # CPU of both ends, sampled every 0.25 s from the storm's end (read at the catch-up).
        cpu_samples: list[tuple[float, float, float]] = []

        async def sample_cpu() -> None:
            while True:
                cpu_samples.append((time.time(), _cpu_seconds(bridge.pid), _cpu_seconds(os.getpid())))
                await asyncio.sleep(0.25)
        cpu_task = asyncio.get_running_loop().create_task(sample_cpu())
        # Until every change made before the storm's end is in (or the tail runs out).
        deadline = time.monotonic() + tail
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            backlog_times = [r for r, rv in receiver.received if rv <= rv_end]
            newer = any(rv > rv_end + 10 * rate for _, rv in receiver.received)
            if newer and backlog_times and time.time() - max(backlog_times) > 5:
                # 10 s of newer changes are in and nothing older came for 5 s: caught up.
                break
        cpu_task.cancel()
        raw_per_s = raw_cpu = None
        if raw:
            size = receiver.body_bytes // max(1, receiver.body_count)
            raw_per_s, raw_cpu = await raw_rate(f"http://127.0.0.1:{port}/raw", total=raw,
                                       connections=raw_connections, body_size=size)
    finally:
        clock_task.cancel()
        exited = bridge.returncode
        if exited is None:
            bridge.terminate()
        await bridge.wait()
        log_task.cancel()
        if sim.returncode is None:
            sim.terminate()
        await sim.wait()
        await runner.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    if exited is not None:  # the run measured nothing: say why
        tail_lines = "".join(log_lines[-20:])
        raise RuntimeError(f"the bridge exited with status {exited} during the run:\n{tail_lines}")
    end = receiver.storm_until
    start = receiver.storm_from
    rv_start, rv_end = clock.rv_at(start), clock.rv_at(end)
    backlog = [r for r, rv in receiver.received if rv <= rv_end and r >= start]
    after = [r for r, _ in receiver.received if r >= end]
    before = sorted(r - clock.time_of(rv) for r, rv in receiver.received if start - 3 <= r < start)
    late = [r for r, rv in receiver.received if r >= end and r - clock.time_of(rv) > 5.0]
    caught = max(backlog) if backlog else None
    rate_catch_up = bridge_cpu = bench_cpu = None
    if caught is not None and caught > end:
        rate_catch_up = round(sum(1 for r, _ in receiver.received if end <= r <= caught) / (caught - end), 1)
        during = [s for s in cpu_samples if s[0] <= caught + 0.25]
        if len(during) >= 2:
            span = during[-1][0] - during[0][0]
            bridge_cpu = round((during[-1][1] - during[0][1]) / span, 2)
            bench_cpu = round((during[-1][2] - during[0][2]) / span, 2)
    return {
        "source": str(source),
        "bridge": origin,
        "rate": rate,
        "batch": batch,
        "sink_extra": sink_extra,
        "storm_s": storm,
        "backlog_events": len(backlog),
        "catch_up_s": round(max(backlog) - end, 2) if backlog else None,
        "first_after_s": round(min(after) - end, 2) if after else None,
        "late_over_5s": len(late),
        "changes_during_storm": rv_end - rv_start,
        "storm_changes_received": len({rv for _, rv in receiver.received if rv_start < rv <= rv_end}),
        "gap_markers": receiver.gaps,
        "failed_requests": receiver.failed,
        "lag_before_storm_p50_s": round(before[len(before) // 2], 2) if before else None,
        "rate_before_storm": round(len(before) / 3, 1),
        "rate_after_storm_10s": round(sum(1 for r in after if r < end + 10) / 10, 1),
        "catch_up_rate": rate_catch_up,
        "bridge_cpu": bridge_cpu,
        "bench_cpu": bench_cpu,
        "raw_rate": round(raw_per_s, 1) if raw_per_s is not None else None,
        "raw_ratio": (round(rate_catch_up / raw_per_s, 2) if raw_per_s and rate_catch_up else None),
        "raw_client_cpu_ms_per_request": round(raw_cpu * 1000, 3) if raw_cpu is not None else None,
        "bridge_cpu_ms_per_event": (round(bridge_cpu / rate_catch_up * 1000, 3)
                                    if bridge_cpu and rate_catch_up else None),
        "connections_refused_on": len(receiver.peers_storm),
        "connections_after_storm": len(receiver.peers_after),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "delivered": len(receiver.received),
        "breaker_log": [ln.strip()[:200] for ln in log_lines if "breaker" in ln][:4],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", action="append", required=True, help="a source tree of the bridge")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--storm", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--tail", type=float, default=90.0)
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--batch", type=int, default=1, help="the webhook's batch.max_events (1: one event per "
                                                         "request, the default)")
    p.add_argument("--sink-extra", default="", help="more webhook options, as YAML flow mapping entries "
                                                    "(e.g. 'max_in_flight: 5000')")
    p.add_argument("--raw", type=int, default=0, help="after each run, a bare aiohttp client posts this "
                                                      "many requests to the same server (0: no)")
    p.add_argument("--raw-connections", type=int, default=64)
    args = p.parse_args()
    results = []
    for source in args.source:
        result = asyncio.run(run_one(Path(source).resolve(), rate=args.rate, storm=args.storm,
                                     warmup=args.warmup, tail=args.tail, objects=args.objects,
                                     batch=args.batch, sink_extra=args.sink_extra, raw=args.raw,
                                     raw_connections=args.raw_connections))
        print(orjson.dumps(result).decode(), flush=True)
        results.append(result)
    load = os.getloadavg()
    write_result("storm", {"machine": machine_info(), "load_average": load, "runs": results})
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
