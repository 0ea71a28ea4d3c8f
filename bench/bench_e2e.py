"""End-to-end scenarios: throughput against the raw ceilings, steady-rate latency, initial sync.

These measure the bridge as it ships: the simulator (in its own process, see :mod:`bench.common`)
serves the Kubernetes API over HTTP, and the real :class:`~bridge.pipeline.BridgePipeline` lists,
watches, caches, encodes CloudEvents and delivers them to a real sink (Tansu for Kafka, nats-server
for NATS core and JetStream, a local file).

* **throughput** — Pods are created, then updated in a burst that waits in the simulator's watch
  history; the bridge resumes from a checkpoint taken right before the burst, so its watch replays
  the burst as fast as the bridge reads. Events/s = burst events / time from ``start()`` to the
  sink's last acknowledgement; the steady rate (compared with the ceiling) starts at the first
  acknowledgement, so start-up (connections, producer id) counts on neither side. The **raw
  ceiling** is the same CloudEvent bytes pushed by a plain client loop (confluent-kafka ``produce``
  + ``flush``; nats-py ``publish`` + one ``flush``; JetStream ``publish`` with 256 in flight;
  ``write`` + ``flush`` per line for the file) after one warm-up message, measured in the same run
  on the same broker. The simulator's own replay rate (a bare HTTP read of the same watch) is
  reported too: no consumer can go faster than the server sends.
* **latency** — the simulator updates Pods at a steady rate, stamping each update with its emission
  time; latency = sink acknowledgement time - stamp (both ``time.time()`` on one machine). Then
  ``added_events_file_sink``: new Pods created at the first rate, through the file sink, with the
  in-memory, the file and the configmap checkpoint store: the p99 differences are the known-object
  journal's cost for an ``added`` event (it waits for its journal record's group commit: an fsync,
  or one ConfigMap write to the API server).
* **initial_sync** — N Pods exist; time from ``start()`` to the informer's sync, and to the file
  sink's acknowledgement of the N-th ``added`` event (pages of 500).

Run one of them with ``python -m bench.run --only throughput`` (or latency, initial_sync).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_NAMESPACE,
    AckProbe,
    BrokerUrls,
    BurstSetup,
    Payload,
    Sampler,
    SimProcess,
    bridge_pipeline,
    brokers,
    build_payloads,
    burst_setup,
    count_watch_events,
    fetch_watch_objects,
    freeze_after_sync,
    quantile_points,
    rss_bytes,
    service_sink,
    summarize_ms,
    write_result,
)

__all__ = [
    "SINK_KINDS",
    "E2EOptions",
    "run",
    "run_initial_sync",
    "run_latency",
    "run_throughput",
]

SINK_KINDS = ("file", "kafka", "nats", "jetstream")


@dataclass(frozen=True, slots=True)
class E2EOptions:
    """Sizes of the end-to-end scenarios (full run and ``--quick``)."""

    burst_pods: int = 2000
    burst_rounds: int = 5
    latency_pods: int = 500
    latency_rates: tuple[int, ...] = (1000, 5000)
    latency_seconds: float = 2.0
    sync_pods: int = 100_000
    page_size: int = 500
    timeout: float = 240.0

    @classmethod
    def for_mode(cls, quick: bool) -> E2EOptions:
        if quick:
            return cls(burst_pods=300, burst_rounds=4, latency_pods=200, latency_rates=(200, 1000),
                       latency_seconds=1.0, sync_pods=5000, timeout=60.0)
        return cls()


def _chosen(sinks: Sequence[str] | None) -> list[str]:
    kinds = list(sinks) if sinks else list(SINK_KINDS)
    unknown = [k for k in kinds if k not in SINK_KINDS]
    if unknown:
        raise ValueError(f"unknown sink kinds {unknown}; choose from {SINK_KINDS}")
    return kinds


# --------------------------------------------------------------------------------------------------
# Raw ceilings: the same bytes, a plain client loop


def _ceiling_file(payloads: Sequence[Payload], tmp: Path) -> float:
    path = tmp / f"ceiling-{uuid.uuid4().hex[:8]}.jsonl"
    t0 = time.perf_counter()
    with open(path, "ab") as fh:
        for p in payloads:
            fh.write(p.body + b"\n")
            fh.flush()
    return len(payloads) / (time.perf_counter() - t0)


def _ceiling_kafka(payloads: Sequence[Payload], bootstrap: str) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from sinks.kafka import KafkaSinkOptions

    topic = f"ceiling-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    opts = KafkaSinkOptions(brokers=bootstrap)
    for fut in admin.create_topics([NewTopic(topic, num_partitions=opts.topic_partitions)]).values():
        fut.result(30)
    producer = Producer(opts.producer_config())
    delivered = 0
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            errors.append(str(err))
        delivered += 1

    producer.list_topics(topic, timeout=10)
    # Warm-up: the idempotent producer's id and the partition leaders are fetched on first use.
    producer.produce(topic, payloads[0].body, payloads[0].key)
    producer.flush(30)
    t0 = time.perf_counter()
    for p in payloads:
        while True:
            try:
                producer.produce(topic, p.body, p.key, on_delivery=on_delivery,
                                 headers=list(p.headers.items()))
                break
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    producer.flush(120)
    seconds = time.perf_counter() - t0
    if errors or delivered != len(payloads):
        raise RuntimeError(f"kafka ceiling: {delivered}/{len(payloads)} delivered, errors {errors[:3]}")
    return len(payloads) / seconds


async def _ceiling_nats(payloads: Sequence[Payload], url: str) -> float:
    import nats

    nc = await nats.connect(url)
    try:
        subject = f"ceiling.{uuid.uuid4().hex[:8]}"
        await nc.publish(subject, payloads[0].body, headers=payloads[0].headers)
        await nc.flush(timeout=30)
        t0 = time.perf_counter()
        for p in payloads:
            await nc.publish(subject, p.body, headers=p.headers)
        await nc.flush(timeout=60)
        return len(payloads) / (time.perf_counter() - t0)
    finally:
        await nc.close()


async def _ceiling_jetstream(payloads: Sequence[Payload], url: str, window: int = 256) -> float:
    import nats

    nc = await nats.connect(url)
    try:
        tag = uuid.uuid4().hex[:8]
        js = nc.jetstream()
        await js.add_stream(name=f"CEILING-{tag}", subjects=[f"ceiling.{tag}.>"])
        sem = asyncio.Semaphore(window)

        async def one(i: int, p: Payload) -> None:
            async with sem:
                await js.publish(f"ceiling.{tag}.{i % 512}", p.body, headers=p.headers, timeout=30)

        await js.publish(f"ceiling.{tag}.warmup", payloads[0].body, headers=payloads[0].headers, timeout=30)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, p) for i, p in enumerate(payloads)))
        return len(payloads) / (time.perf_counter() - t0)
    finally:
        await nc.close()


async def _ceiling(kind: str, payloads: Sequence[Payload], urls: BrokerUrls, tmp: Path) -> float:
    if kind == "file":
        return _ceiling_file(payloads, tmp)
    if kind == "kafka":
        return await asyncio.to_thread(_ceiling_kafka, payloads, urls.kafka)
    if kind == "nats":
        return await _ceiling_nats(payloads, urls.nats)
    return await _ceiling_jetstream(payloads, urls.nats)


# --------------------------------------------------------------------------------------------------
# Throughput


async def _bridge_burst(sim: SimProcess, setup: BurstSetup, kind: str, urls: BrokerUrls, tmp: Path,
                        timeout: float) -> dict[str, Any]:
    """The bridge replays the burst to a ``kind`` sink. Done when every Pod's last update was
    acknowledged: a sink that falls behind has its buffer keep the latest state per object (the
    shipped policy without a spill directory), so fewer messages than watch events may be sent;
    ``delivered_messages`` counts what the sink acknowledged."""
    probe = AckProbe(service_sink(kind, urls=urls, tmp_dir=tmp))
    probe.final_after = setup.last_round_after
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    async with bridge_pipeline(sim.url, [probe], namespace=BENCH_NAMESPACE,
                               checkpoint=setup.checkpoint) as pipeline:
        sampler = Sampler(probe=probe, pipeline=pipeline)
        sampler.start()
        try:
            done = await probe.wait_final(setup.pods, timeout)
            seconds = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            acked = probe.acked
        finally:
            timeline = await sampler.stop()
    if not done:
        raise TimeoutError(f"{kind}: only {probe.final_acked}/{setup.pods} last updates acknowledged "
                           f"({probe.acked} messages) in {timeout} s")
    first = probe.first_ack_at if probe.first_ack_at is not None else t0
    steady = seconds - (first - t0)
    return {"events": setup.events, "seconds": round(seconds, 3),
            "events_per_s": round(setup.events / seconds),
            "startup_seconds": round(first - t0, 3),
            # CPU of the bridge's process (all its threads, start-up included) per watch event:
            # steadier than the rates on a shared machine, since time the process waits is not counted.
            "cpu_us_per_event": round(cpu / setup.events * 1e6, 1),
            "steady_events_per_s": round((setup.events - 1) / steady) if steady > 0 else 0,
            "delivered_messages": acked,
            "coalesced": max(0, setup.events - acked),
            # Messages the sink sent per second: what compares with the raw client loop.
            "steady_messages_per_s": round((acked - 1) / steady) if steady > 0 else 0,
            "outcomes": dict(probe.outcomes), "timeline": timeline}


async def _throughput(opts: E2EOptions, kinds: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"pods": opts.burst_pods, "sinks": {}}
    with brokers(kinds) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with SimProcess() as sim:
            setup = await burst_setup(sim, pods=opts.burst_pods, rounds=opts.burst_rounds)
            result["events"] = setup.events
            objects = await fetch_watch_objects(sim.url, BENCH_NAMESPACE, setup.rv_before, setup.events)
            # The simulator's own pace: the same watch read by a client that only counts lines (best
            # of two; the read above made the simulator encode each object once, as a real API
            # server's watch cache has).
            replay = [await count_watch_events(sim.url, BENCH_NAMESPACE, setup.rv_before, setup.events)
                      for _ in range(2)]
            result["simulator_replay_events_per_s"] = round(max(replay))
            payloads = build_payloads(objects)
            del objects
            result["payload_bytes_mean"] = round(sum(len(p.body) for p in payloads) / len(payloads))
            for kind in kinds:
                entry: dict[str, Any] = {}
                try:
                    entry["ceiling_events_per_s"] = round(await _ceiling(kind, payloads, urls, tmp))
                    entry.update(await _bridge_burst(sim, setup, kind, urls, tmp, opts.timeout))
                    entry["ratio_to_ceiling"] = round(
                        entry["steady_messages_per_s"] / entry["ceiling_events_per_s"], 3)
                    entry["ratio_to_simulator_replay"] = round(
                        entry["steady_events_per_s"] / result["simulator_replay_events_per_s"], 3)
                except Exception as exc:
                    entry["error"] = f"{type(exc).__name__}: {exc}"
                result["sinks"][kind] = entry
    return result


def run_throughput(quick: bool = False, sinks: Sequence[str] | None = None,
                   results_dir: Path | None = None) -> dict[str, Any]:
    """Burst throughput per sink next to its raw ceiling; writes ``throughput.json``."""
    result = asyncio.run(_throughput(E2EOptions.for_mode(quick), _chosen(sinks)))
    result["quick"] = quick
    write_result("throughput", result, results_dir)
    return result


# --------------------------------------------------------------------------------------------------
# Latency at a steady rate


async def _latency_one(sim: SimProcess, kind: str, rate: int, opts: E2EOptions, urls: BrokerUrls,
                       tmp: Path) -> dict[str, Any]:
    probe = AckProbe(service_sink(kind, urls=urls, tmp_dir=tmp))
    async with bridge_pipeline(sim.url, [probe], namespace=BENCH_NAMESPACE) as pipeline:
        if not await pipeline.wait_for_sync(opts.timeout):
            raise TimeoutError(f"{kind}: the informer did not sync")
        if not await probe.wait_acked(opts.latency_pods, opts.timeout):
            raise TimeoutError(f"{kind}: the initial list was not delivered")
        freeze_after_sync()
        base = probe.acked
        probe.arm()
        sampler = Sampler(probe=probe, pipeline=pipeline)
        sampler.start()
        try:
            sent = await sim.steady(rate, opts.latency_seconds)
            # Done when each Pod's last update arrived (the last ``pods`` versions): a sink that
            # fell behind may have had earlier versions coalesced, never the latest.
            last_rv = int(sent["rv"])
            done = await probe.wait_rvs(last_rv - min(opts.latency_pods, int(sent["events"])) + 1, last_rv,
                                        opts.timeout)
        finally:
            timeline = await sampler.stop()
    if not done:
        raise TimeoutError(f"{kind} at {rate}/s: {probe.acked - base}/{sent['events']} acknowledged")
    latencies = probe.latencies
    return {
        "rate": rate,
        "emitted": sent["events"],
        "emit_seconds": round(float(sent["seconds"]), 3),
        "achieved_rate": round(int(sent["events"]) / max(1e-9, float(sent["seconds"]))),
        "simulator_late_ticks": sent["late_ticks"],
        "acknowledged": probe.acked - base,
        **summarize_ms(latencies),
        "distribution_ms": quantile_points(latencies),
        "max_queue_depth": max((s["queue_depth"] for s in timeline), default=0),
        "timeline": timeline,
    }


async def _added_latency_one(sim: SimProcess, rate: int, opts: E2EOptions, tmp: Path,
                             checkpoint_dir: Path | None,
                             checkpoint_namespace: str | None = None) -> dict[str, Any]:
    """``added`` events (new Pods created at ``rate``) through the file sink: with the file
    checkpoint store each new object's first event waits for its known-object journal record (one
    fsync per batch), with the configmap store for its journal ConfigMap's write (one API write
    per batch); with the in-memory store nothing is written."""
    probe = AckProbe(service_sink("file", urls=BrokerUrls(), tmp_dir=tmp))
    async with bridge_pipeline(sim.url, [probe], namespace=BENCH_NAMESPACE, checkpoint_dir=checkpoint_dir,
                               checkpoint_namespace=checkpoint_namespace) as pipeline:
        if not await pipeline.wait_for_sync(opts.timeout):
            raise TimeoutError("added latency: the informer did not sync")
        if not await probe.wait_acked(opts.latency_pods, opts.timeout):
            raise TimeoutError("added latency: the initial list was not delivered")
        while True:  # the initial list (the Pods created by an earlier run too) is delivered
            settled = probe.acked
            await asyncio.sleep(0.3)
            if probe.acked == settled:
                break
        base = probe.acked
        probe.arm()
        sent = await sim.steady(rate, opts.latency_seconds, create=True)
        done = await probe.wait_acked(base + int(sent["events"]), opts.timeout)
    if not done:
        raise TimeoutError(f"added at {rate}/s: {probe.acked - base}/{sent['events']} acknowledged")
    return {"rate": rate, "emitted": sent["events"], **summarize_ms(probe.latencies)}


async def _added_latency(opts: E2EOptions, tmp: Path) -> dict[str, Any]:
    """p50/p99 of ``added`` events with the in-memory, the file and the configmap checkpoint store
    (the differences are what the known-object journal costs a new object in a file and in a
    ConfigMap of the simulator)."""
    out: dict[str, Any] = {}
    async with SimProcess() as sim:
        await sim.prefill(opts.latency_pods, BENCH_NAMESPACE)
        rate = opts.latency_rates[0]
        out["memory_store"] = await _added_latency_one(sim, rate, opts, tmp, None)
        out["file_store"] = await _added_latency_one(sim, rate, opts, tmp, tmp / "checkpoints")
        out["configmap_store"] = await _added_latency_one(sim, rate, opts, tmp, None, "default")
    return out


async def _latency(opts: E2EOptions, kinds: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"pods": opts.latency_pods, "seconds_per_rate": opts.latency_seconds,
                              "sinks": {}}
    with brokers(kinds) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with SimProcess() as sim:
            await sim.prefill(opts.latency_pods, BENCH_NAMESPACE)
            for kind in kinds:
                per_rate: dict[str, Any] = {}
                for rate in opts.latency_rates:
                    try:
                        per_rate[str(rate)] = await _latency_one(sim, kind, rate, opts, urls, tmp)
                    except Exception as exc:
                        per_rate[str(rate)] = {"rate": rate, "error": f"{type(exc).__name__}: {exc}"}
                result["sinks"][kind] = per_rate
        try:
            result["added_events_file_sink"] = await _added_latency(opts, tmp)
        except Exception as exc:
            result["added_events_file_sink"] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def run_latency(quick: bool = False, sinks: Sequence[str] | None = None,
                results_dir: Path | None = None) -> dict[str, Any]:
    """p50/p99/max from the simulator's change to the sink's ack, per sink and rate; writes
    ``latency.json``."""
    result = asyncio.run(_latency(E2EOptions.for_mode(quick), _chosen(sinks)))
    result["quick"] = quick
    write_result("latency", result, results_dir)
    return result


# --------------------------------------------------------------------------------------------------
# Initial sync


async def _initial_sync(opts: E2EOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keb-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with SimProcess() as sim:
            pre = await sim.prefill(opts.sync_pods, "sync")
            probe = AckProbe(service_sink("file", urls=BrokerUrls(), tmp_dir=tmp))
            rss0 = rss_bytes()
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            async with bridge_pipeline(sim.url, [probe], namespace="sync",
                                       page_size=opts.page_size) as pipeline:
                if not await pipeline.wait_for_sync(opts.timeout):
                    raise TimeoutError("the informer did not sync")
                synced = time.perf_counter() - t0
                done = await probe.wait_acked(opts.sync_pods, opts.timeout)
                delivered = time.perf_counter() - t0
                cpu = time.process_time() - cpu0
                rss1 = rss_bytes()
                cached = len(next(iter(pipeline.informers.values())).get_indexer().list_keys())
            if not done:
                raise TimeoutError(f"only {probe.acked}/{opts.sync_pods} delivered in {opts.timeout} s")
    return {
        "pods": opts.sync_pods,
        "page_size": opts.page_size,
        "simulator_prefill_seconds": round(float(pre["seconds"]), 2),
        "synced_seconds": round(synced, 3),
        "delivered_seconds": round(delivered, 3),
        "list_objects_per_s": round(opts.sync_pods / synced),
        "delivered_per_s": round(opts.sync_pods / delivered),
        # The bridge's process (the simulator runs in its own): what the sync costs whatever else
        # runs on the machine; wall time is this plus the waits for the simulator and for a core.
        "cpu_seconds": round(cpu, 3),
        "cached_objects": cached,
        "rss_delta_bytes": rss1 - rss0,
        "rss_bytes_per_object": round((rss1 - rss0) / max(1, cached)),
        "outcomes": dict(probe.outcomes),
    }


def run_initial_sync(quick: bool = False, results_dir: Path | None = None) -> dict[str, Any]:
    """Time to list N Pods (pages of 500) and deliver them to the file sink; writes ``initial_sync.json``."""
    result = asyncio.run(_initial_sync(E2EOptions.for_mode(quick)))
    result["quick"] = quick
    write_result("initial_sync", result, results_dir)
    return result


def run(quick: bool = False) -> dict[str, Any]:
    """All three end-to-end scenarios."""
    return {
        "throughput": run_throughput(quick),
        "latency": run_latency(quick),
        "initial_sync": run_initial_sync(quick),
    }
