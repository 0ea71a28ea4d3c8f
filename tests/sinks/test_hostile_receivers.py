"""Hostile webhook receivers: real HTTP servers answering with huge bodies (600 MB streamed, as
error and as success), slow bodies and endless chunked replies, each the receiver of a sink of one
bridge process (``kube-event-bridge run`` against the simulator), beside a well-behaved receiver.

The bridge stays up, its peak RSS (``VmHWM``) stays under the chart's 512 Mi limit, the good sink
gets every event, what the hostile receivers did shows in the metrics and logs, and the bridge reads
only a bounded prefix of each answer (the receivers count what they could send)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from bridge.testing.processes import ProcessFailed, ServiceProcess, wait_until
from tests.service.test_service import metric

PODS = 20
HUGE = 600 * 2**20
CHUNK = b"x" * 2**20
LIMIT_MIB = 512


@dataclass
class Counts:
    requests: int = 0
    sent: list[int] = field(default_factory=list)
    """Bytes of body written per answer before the bridge closed the connection (or all of it)."""
    events: set[str] = field(default_factory=set)


async def _stream(resp: web.StreamResponse, counts: Counts, total: int, *, pause: float = 0.0,
                  chunk: bytes = CHUNK) -> None:
    sent = 0
    try:
        while sent < total:
            await resp.write(chunk)
            sent += len(chunk)
            if pause:
                await asyncio.sleep(pause)
        await resp.write_eof()
    except (ConnectionError, aiohttp.ClientConnectionResetError):
        pass
    finally:
        counts.sent.append(sent)


class Receivers:
    """One aiohttp server, one path per behaviour."""

    def __init__(self) -> None:
        self.counts: dict[str, Counts] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None

    def _route(self, app: web.Application, name: str,
               answer: Callable[[web.Request, Counts], Awaitable[web.StreamResponse]]) -> None:
        counts = self.counts.setdefault(name, Counts())

        async def handle(request: web.Request) -> web.StreamResponse:
            counts.requests += 1
            counts.events.add(json.loads(await request.read())["id"])
            return await answer(request, counts)

        app.router.add_post(f"/{name}", handle)

    async def start(self) -> None:
        app = web.Application()

        async def good(_: web.Request, __: Counts) -> web.StreamResponse:
            return web.Response(text="ok")

        async def huge(request: web.Request, counts: Counts, status: int) -> web.StreamResponse:
            resp = web.StreamResponse(status=status, headers={"Content-Length": str(HUGE),
                                                              "Retry-After": "0"})
            await resp.prepare(request)
            await _stream(resp, counts, HUGE)
            return resp

        async def endless(request: web.Request, counts: Counts) -> web.StreamResponse:
            resp = web.StreamResponse(status=503, headers={"Retry-After": "0"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await _stream(resp, counts, 2**62, pause=0.001, chunk=CHUNK[:65536])
            return resp

        async def slow(request: web.Request, counts: Counts) -> web.StreamResponse:
            resp = web.StreamResponse(status=500, headers={"Content-Length": "100000"})
            await resp.prepare(request)
            await _stream(resp, counts, 100_000, pause=0.2, chunk=b"s")
            return resp

        self._route(app, "good", good)
        self._route(app, "huge-error", lambda r, c: huge(r, c, 500))
        self._route(app, "huge-ok", lambda r, c: huge(r, c, 200))
        self._route(app, "endless", endless)
        self._route(app, "slow", slow)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_hostile_receivers_neither_grow_the_bridge_nor_stop_the_other_sinks(tmp_path: Path) -> None:
    receivers = Receivers()
    await receivers.start()
    async with Simulator() as sim:
        for i in range(PODS):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        # Time enough to read a 600 MB answer whole (as the bridge once did); the slow one is cut
        # by its timeout.
        sinks = [{"name": name, "kind": "webhook", "url": f"http://127.0.0.1:{receivers.port}/{name}",
                  "timeout": 3 if name == "slow" else 60, "retry": {"initial": 0.05, "max": 0.5},
                  "breaker": {"enabled": False}}
                 for name in ("good", "huge-error", "huge-ok", "endless", "slow")]
        config = tmp_path / "bridge.yaml"
        config.write_text(json.dumps({
            "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
            "resources": [{"resource": "pods"}], "sinks": sinks,
            "checkpoint": {"store": "none", "spill_directory": str(tmp_path / "spill")},
            "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
            "workers": 1, "shutdown_deadline": 5,
        }))
        log = tmp_path / "bridge.log"
        # The service binds port 0 itself and reports where it listens: no port can be taken first.
        bridge = ServiceProcess(config=config, log=log)
        await bridge.start()
        try:
            await bridge.wait_listening(timeout=120)
            counts = receivers.counts

            async def until(predicate: Callable[[], bool], what: str) -> None:
                await wait_until(predicate, timeout=120, what=what, alive=bridge)

            await until(lambda: len(counts["good"].events) == PODS, "the good sink's events")
            await until(lambda: len(counts["huge-ok"].events) == PODS and all(
                len(counts[n].sent) >= 3 for n in ("huge-error", "endless")), "the hostile answers")
            await until(lambda: len(counts["slow"].sent) >= 2, "a slow answer cut by the timeout")
            # The outage is logged by the periodic outage check, up to its interval after the cut.
            await until(lambda: "timed out after 3.0s posting to http://127.0.0.1" in log.read_text(),
                        "the slow answer's timeout in the log")
            peak = peak_rss_mib(bridge.pid)
            assert peak < LIMIT_MIB, f"the bridge peaked at {peak:.0f} MiB"
            answer = await bridge.get("/metrics", timeout=30)
            assert answer is not None
            assert answer[0] == 200, answer
            text = answer[1].decode()
            assert metric(text, "keb_sink_events_total", sink="good", outcome="delivered") == PODS
            assert metric(text, "keb_sink_events_total", sink="huge-ok", outcome="delivered") >= PODS
            for name in ("huge-error", "endless", "slow"):
                assert metric(text, "keb_sink_events_total", sink=name, outcome="delivered") == 0
            assert bridge.running
        finally:
            with contextlib.suppress(ProcessFailed):  # SIGKILL after 20 s
                await bridge.stop(timeout=20)
            await receivers.stop()
    # Each hostile answer was cut after a bounded prefix: what the receiver could write before the
    # bridge closed the connection is the socket buffers' worth, not the body.
    for name in ("huge-error", "huge-ok", "endless"):
        assert max(counts[name].sent) < 64 * 2**20, (name, counts[name].sent)
    lines = log.read_text().splitlines()
    cut = [json.loads(line) for line in lines if "longer than 4096 bytes" in line]
    assert {r["sink"] for r in cut} >= {"huge-error", "endless"}
    timeouts = [line for line in lines if "timed out after 3.0s posting to http://127.0.0.1" in line]
    assert timeouts, "the slow answer's timeout is not in the logs"
