"""The bridge against the naive way: the official client's typed watch forwarded to the same sink.

What a first attempt at this service usually looks like: ``kubernetes.watch.Watch().stream()`` over
``CoreV1Api.list_namespaced_pod`` in a thread (the official client is synchronous), each typed
``V1Pod`` turned back into a dict with ``sanitize_for_serialization`` and handed to the sink on the
event loop, one event at a time. Both sides consume the same burst (the simulator's watch history
replayed from the same resourceVersion, see :mod:`bench.common`) into the same kind of sink (the file
sink, so no broker is needed), and the figure is the ratio of their rates.

The bridge side is the full pipeline (informer cache, processor, CloudEvents, acks); the naive side
has no cache and no acknowledgement tracking, so the comparison flatters the naive way.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_NAMESPACE,
    PODS,
    AckProbe,
    BrokerUrls,
    SimProcess,
    bridge_pipeline,
    burst_setup,
    make_sink,
    service_sink,
    write_result,
)
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, Sink

__all__ = ["run"]

_TYPES = {"ADDED": EventType.ADDED, "MODIFIED": EventType.UPDATED, "DELETED": EventType.DELETED}


def _naive_watch(url: str, namespace: str, from_rv: int, count: int, sink: Sink,
                 loop: asyncio.AbstractEventLoop, stop: threading.Event, timeout: float) -> int:
    """The naive consumer (runs in a thread): typed watch, then one blocking hand-off per event."""
    import kubernetes as kubernetes_typed

    # Typed as Any: the package's own annotations leave most of these calls untyped.
    kubernetes: Any = kubernetes_typed
    config = kubernetes.client.Configuration()
    config.host = url
    api_client = kubernetes.client.ApiClient(config)
    v1 = kubernetes.client.CoreV1Api(api_client)
    watch = kubernetes.watch.Watch()
    seen = 0

    def ack(_outcome: DeliveryOutcome) -> None:
        return None

    try:
        # The server ends the watch after ``timeout`` seconds, so the thread cannot outlive the run.
        for event in watch.stream(v1.list_namespaced_pod, namespace, resource_version=str(from_rv),
                                  timeout_seconds=max(1, int(timeout))):
            obj = api_client.sanitize_for_serialization(event["object"])
            change = ChangeEvent(type=_TYPES.get(event["type"], EventType.UPDATED), resource=PODS,
                                 cluster="default", obj=obj, time=time.time())
            asyncio.run_coroutine_threadsafe(sink.deliver(change, ack), loop).result()
            seen += 1
            if seen >= count or stop.is_set():
                break
    finally:
        watch.stop()
        api_client.close()
    return seen


async def _naive(sim: SimProcess, rv: int, events: int, tmp: Path, timeout: float) -> dict[str, Any]:
    probe = AckProbe(make_sink("file", urls=BrokerUrls(), tmp_dir=tmp))
    await probe.start()
    stop = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        t0 = time.perf_counter()
        worker = asyncio.ensure_future(asyncio.to_thread(
            _naive_watch, sim.url, BENCH_NAMESPACE, rv, events, probe, loop, stop, timeout))
        try:
            done = await probe.wait_acked(events, timeout)
            seconds = time.perf_counter() - t0
        finally:
            stop.set()
            seen = await worker
    finally:
        await probe.close()
    if not done:
        raise TimeoutError(f"naive: only {probe.acked}/{events} acknowledged in {timeout} s (read {seen})")
    return {"events": events, "seconds": round(seconds, 3), "events_per_s": round(events / seconds)}


async def _bridge(sim: SimProcess, checkpoint: Any, events: int, tmp: Path, timeout: float) -> dict[str, Any]:
    probe = AckProbe(service_sink("file", urls=BrokerUrls(), tmp_dir=tmp))
    t0 = time.perf_counter()
    async with bridge_pipeline(sim.url, [probe], namespace=BENCH_NAMESPACE, checkpoint=checkpoint):
        done = await probe.wait_acked(events, timeout)
        seconds = time.perf_counter() - t0
    if not done:
        raise TimeoutError(f"bridge: only {probe.acked}/{events} acknowledged in {timeout} s")
    return {"events": events, "seconds": round(seconds, 3), "events_per_s": round(events / seconds)}


async def _run(quick: bool) -> dict[str, Any]:
    pods, rounds, timeout = (300, 4, 60.0) if quick else (1000, 3, 240.0)
    with tempfile.TemporaryDirectory(prefix="keb-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with SimProcess() as sim:
            setup = await burst_setup(sim, pods=pods, rounds=rounds)
            naive = await _naive(sim, setup.rv_before, setup.events, tmp, timeout)
            bridge = await _bridge(sim, setup.checkpoint, setup.events, tmp, timeout)
    return {
        "pods": pods,
        "events": setup.events,
        "sink": "file",
        "naive": naive,
        "bridge": bridge,
        "ratio": round(bridge["events_per_s"] / naive["events_per_s"], 2),
    }


def run(quick: bool = False, results_dir: Path | None = None) -> dict[str, Any]:
    """Bridge vs official-client typed watch on the same burst and sink; writes ``naive.json``."""
    result = asyncio.run(_run(quick))
    result["quick"] = quick
    write_result("naive", result, results_dir)
    return result
