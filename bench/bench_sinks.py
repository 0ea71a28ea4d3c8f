"""Sink throughput next to the raw client's ceiling, measured in the same run on the same payloads.

For each sink kind (file, kafka, nats, jetstream) this pushes the same realistic Pod update events
through ``BaseSink.deliver`` → acknowledgement (routing, change filter, redaction, CloudEvent
envelope, encoding, per-object lanes, the client, the broker's confirmation), and then pushes the
already-encoded CloudEvent bodies of those events through the bare client as fast as it goes:

- file: ``write`` + ``flush`` per line (the file sink's per-event durability), fsync at the end;
- kafka: a plain confluent-kafka ``produce`` loop with ``poll(0)`` and a final ``flush``, with the
  sink's producer settings (``KafkaSinkOptions().producer_config()``: idempotent, ``acks=all``, lz4,
  linger 1 ms, Nagle off);
- nats: a plain ``publish`` loop and a final ``flush``;
- jetstream: ``js.publish`` with ``Nats-Msg-Id``, up to ``max_in_flight`` (the sink's window) at once.

The ratio sink / raw says what the sink layer costs. Each sink is measured twice on the same
events, on fresh destinations: fed one event per ``deliver`` call (``sink_*`` figures), and fed
``batch`` events per ``deliver_batch`` call (``batch_*`` figures; a sink without ``deliver_batch``,
e.g. an older tree under ``--compare-ref``, gets the same batches as a loop over ``deliver``). The
events' objects are :class:`~bridge.rawobject.RawObject` values without managedFields, as the
service's compact cache hands them to sinks. ``cpu_us_per_event`` is the process's CPU time (all
threads, the client's included) over the timed part divided by the events; ``--profile`` runs the
timed part under cProfile and reports the Python function calls per event (deterministic where the
timings of this shared machine are not) and writes the hottest functions to
``sinks-<kind>-<mode>.profile.txt``. Brokers are started on free loopback ports
(:mod:`tests.brokers`). Run ``python -m bench.bench_sinks [--quick] [--batch N] [--profile]``;
results go to ``bench/results/sinks.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import PODS, RESULTS_DIR, machine_info, pod_templates, vary_pod, write_result
from bridge.rawobject import RawObject
from sinks.base import BaseSink
from sinks.cloudevents import encode_structured, event_id, to_cloudevent
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType
from sinks.redaction import Redactor

__all__ = ["KINDS", "main", "make_events", "run"]

KINDS = ("file", "kafka", "nats", "jetstream")
FULL_COUNTS = {"file": 20_000, "kafka": 20_000, "nats": 20_000, "jetstream": 8_000}
QUICK_COUNTS = {"file": 3_000, "kafka": 3_000, "nats": 3_000, "jetstream": 1_500}
OBJECTS = 1_000
MAX_IN_FLIGHT = 1_000
BATCH = 256
"""Events per ``deliver_batch`` call in the batch measurement (what a busy listener hands over)."""


def make_events(count: int, objects: int = OBJECTS, *, raw: bool = False) -> list[ChangeEvent]:
    """``count`` Pod events over ``objects`` Pods: an add each, then status updates (old and new).
    ``raw``: the objects as RawObjects without managedFields (what the compact cache delivers)."""
    templates = pod_templates(min(objects, 200))
    current: dict[int, dict[str, Any]] = {}
    out: list[ChangeEvent] = []
    now = time.time()
    for n in range(count):
        i = n % objects
        prev = current.get(i)
        if prev is None:
            pod = vary_pod(templates[i % len(templates)], f"pod-{i}", f"ns-{i % 10}")
            uid = str(uuid.UUID(int=i + 1))
            pod["metadata"] = {**pod["metadata"], "uid": uid, "resourceVersion": str(n + 1)}
            out.append(ChangeEvent(type=EventType.ADDED, resource=PODS, cluster="bench", obj=pod, time=now))
        else:
            pod = dict(prev)
            pod["metadata"] = {**prev["metadata"], "resourceVersion": str(n + 1)}
            pod["status"] = {**prev.get("status", {}), "observedRound": n // objects}
            out.append(ChangeEvent(type=EventType.UPDATED, resource=PODS, cluster="bench", obj=pod, old=prev,
                                   time=now))
        current[i] = pod
    if raw:
        converted: dict[int, RawObject] = {}

        def as_raw(obj: Any) -> Any:
            if obj is None:
                return None
            kept = converted.get(id(obj))
            if kept is None:
                meta = obj["metadata"]
                plain = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
                kept = converted[id(obj)] = RawObject.from_dict(plain)
            return kept

        for ev in out:
            ev.obj, ev.old = as_raw(ev.obj), as_raw(ev.old)
    return out


def _bodies(events: Sequence[ChangeEvent]) -> list[tuple[bytes, bytes, str]]:
    """(key, structured CloudEvent body, event id) as the sink sends them (managedFields dropped)."""
    redactor = Redactor()
    out = []
    for ev in events:
        obj = redactor.apply(ev.obj, ev.resource)
        out.append((ev.uid.encode(), encode_structured(to_cloudevent(ev, data=obj)), event_id(ev)))
    return out


async def _through_sink(sink: BaseSink[Any], events: Sequence[ChangeEvent], *, batch: int = 0,
                        profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """Seconds (wall, process CPU) to deliver every event and receive every ack: one ``deliver``
    call per event, or ``batch`` events per ``deliver_batch`` call when ``batch`` is set."""
    await sink.start()
    acked = 0
    failed: list[DeliveryOutcome] = []

    def ack(outcome: DeliveryOutcome) -> None:
        nonlocal acked
        acked += 1
        if outcome is not DeliveryOutcome.DELIVERED:
            failed.append(outcome)

    deliver_batch = getattr(sink, "deliver_batch", None)
    try:
        # Warm up (connections, topic metadata, producer id) with the first event, untimed.
        await sink.deliver(events[0], ack)
        if not await sink.flush(60):
            raise RuntimeError(f"sink {sink.name!r} did not deliver the warm-up event")
        rest = events[1:]
        t0 = time.perf_counter()
        c0 = time.process_time()
        if profile is not None:
            profile.enable()
        if not batch:
            for ev in rest:
                await sink.deliver(ev, ack)
        else:
            acks = [ack] * batch
            for start in range(0, len(rest), batch):
                chunk = rest[start:start + batch]
                if deliver_batch is not None:
                    await deliver_batch(chunk, acks[:len(chunk)])
                else:  # a sink without deliver_batch: the loop the delivery layer falls back to
                    for ev in chunk:
                        await sink.deliver(ev, ack)
        if not await sink.flush(300):
            raise RuntimeError(f"sink {sink.name!r} did not deliver everything: {sink.stats.as_dict()}")
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        await sink.close()
    if acked != len(events) or failed:
        raise RuntimeError(f"sink {sink.name!r}: {acked} acks for {len(events)} events, {len(failed)} failed")
    return seconds, cpu


# ---- raw ceilings ---------------------------------------------------------------------------------


def _raw_file(path: Path, bodies: Sequence[tuple[bytes, bytes, str]]) -> float:
    import os

    with open(path, "ab") as fh:
        t0 = time.perf_counter()
        for _, body, _ in bodies[1:]:
            fh.write(body + b"\n")
            fh.flush()
        os.fsync(fh.fileno())
        return time.perf_counter() - t0


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


def _raw_kafka(bootstrap: str, topic: str, bodies: Sequence[tuple[bytes, bytes, str]]) -> float:
    from confluent_kafka import Producer

    from sinks.kafka import KafkaSinkOptions

    # The sink's own producer settings, so that the baseline moves with its defaults.
    producer = Producer({**KafkaSinkOptions(brokers=bootstrap).producer_config()})
    delivered = 0
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors.append(err)

    headers: list[tuple[str, str | bytes | None]] = [("content-type", b"application/cloudevents+json")]
    key0, body0, _ = bodies[0]
    producer.produce(topic, value=body0, key=key0, headers=headers, on_delivery=report)
    producer.flush(60)  # warm-up, untimed
    t0 = time.perf_counter()
    for n, (key, body, _) in enumerate(bodies[1:]):
        while True:
            try:
                producer.produce(topic, value=body, key=key, headers=headers, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        if n % 500 == 0:
            producer.poll(0)
    producer.flush(300)
    seconds = time.perf_counter() - t0
    if delivered != len(bodies) or errors:
        raise RuntimeError(f"raw kafka: {delivered} delivered of {len(bodies)}, errors {errors[:3]}")
    return seconds


async def _raw_nats(url: str, bodies: Sequence[tuple[bytes, bytes, str]], tag: str) -> float:
    import nats

    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    try:
        headers = {"content-type": "application/cloudevents+json"}
        await nc.publish(f"raw.{tag}.ns.pod-0", bodies[0][1], headers=headers)
        await nc.flush(timeout=60)  # warm-up, untimed
        t0 = time.perf_counter()
        for n, (_, body, _) in enumerate(bodies[1:], start=1):
            await nc.publish(f"raw.{tag}.ns.pod-{n % OBJECTS}", body, headers=headers)
        await nc.flush(timeout=60)
        return time.perf_counter() - t0
    finally:
        await nc.close()


async def _raw_jetstream(url: str, bodies: Sequence[tuple[bytes, bytes, str]], tag: str) -> float:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=30)
        config = StreamConfig(name=f"RAW-{tag}", subjects=[f"raw.{tag}.>"], storage=StorageType.FILE)
        await js.add_stream(config)
        window = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(n: int, body: bytes, eid: str) -> None:
            try:
                await js.publish(f"raw.{tag}.ns.pod-{n % OBJECTS}", body,
                                 headers={"content-type": "application/cloudevents+json", "Nats-Msg-Id": eid})
            finally:
                window.release()

        await window.acquire()
        await one(0, bodies[0][1], bodies[0][2])  # warm-up, untimed
        t0 = time.perf_counter()
        tasks = []
        for n, (_, body, eid) in enumerate(bodies[1:], start=1):
            await window.acquire()
            tasks.append(asyncio.create_task(one(n, body, eid), name="bench-js-publish"))
        await asyncio.gather(*tasks)
        return time.perf_counter() - t0
    finally:
        await nc.close()


# ---- the run --------------------------------------------------------------------------------------


def _sink_factory(kind: str, *, kafka: str, nats_url: str, tmp: Path) -> Callable[[str], BaseSink[Any]]:
    """``make(tag)``: a sink of ``kind`` with the bench's settings on a destination of its own."""
    from sinks.file import FileSink
    from sinks.kafka import KafkaSink
    from sinks.nats import JetStreamSink, NatsSink

    def make(tag: str) -> BaseSink[Any]:
        if kind == "file":
            return FileSink.from_options("file", {"path": str(tmp / f"sink-{tag}.jsonl"),
                                                  "max_in_flight": MAX_IN_FLIGHT})
        if kind == "kafka":
            return KafkaSink.from_options("kafka", {
                "brokers": kafka, "destination": f"bench-{tag}", "auto_create_topics": True,
                "topic_partitions": 6, "topic_replication_factor": 1, "max_in_flight": MAX_IN_FLIGHT,
            })
        if kind == "nats":
            return NatsSink.from_options("nats", {
                "servers": [nats_url], "destination": f"bench.{tag}.{{namespace}}.{{name}}",
                "max_in_flight": MAX_IN_FLIGHT,
            })
        if kind == "jetstream":
            return JetStreamSink.from_options("jetstream", {
                "servers": [nats_url], "destination": f"bench.{tag}.{{namespace}}.{{name}}",
                "stream": {"name": f"BENCH-{tag}", "create": True, "subjects": [f"bench.{tag}.>"]},
                "max_in_flight": MAX_IN_FLIGHT,
            })
        raise ValueError(f"unknown sink kind {kind!r}")

    return make


def _calls(profile: cProfile.Profile, path: Path | None) -> int:
    """Python function calls recorded by ``profile`` (and its hottest functions written to ``path``)."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    if path is not None:
        stats.sort_stats("tottime").print_stats(40)
        path.write_text(out.getvalue())
    return int(stats.total_calls)  # type: ignore[attr-defined]


async def _measure(kind: str, count: int, *, kafka: str, nats_url: str, tmp: Path, batch: int = BATCH,
                   profile: bool = False, profile_dir: Path | None = None) -> dict[str, Any]:
    events = make_events(count, raw=True)
    bodies = _bodies(events)
    tag = uuid.uuid4().hex[:8]
    make = _sink_factory(kind, kafka=kafka, nats_url=nats_url, tmp=tmp)
    raw: Callable[[], Awaitable[float]]
    if kind == "file":
        async def raw() -> float:
            return await asyncio.to_thread(_raw_file, tmp / f"raw-{tag}.jsonl", bodies)
    elif kind == "kafka":
        raw_topic = f"raw-{tag}"

        async def raw() -> float:
            await asyncio.to_thread(_create_topic, kafka, raw_topic, 6)
            return await asyncio.to_thread(_raw_kafka, kafka, raw_topic, bodies)
    elif kind == "nats":
        async def raw() -> float:
            return await _raw_nats(nats_url, bodies, tag)
    elif kind == "jetstream":
        async def raw() -> float:
            return await _raw_jetstream(nats_url, bodies, tag)
    else:
        raise ValueError(f"unknown sink kind {kind!r}")
    raw_seconds = await raw()
    timed = count - 1  # the first event warms up, untimed
    raw_eps = timed / raw_seconds
    row: dict[str, Any] = {
        "events": count,
        "objects": min(count, OBJECTS),
        "payload_bytes_avg": round(sum(len(b) for _, b, _ in bodies) / len(bodies)),
        "raw_seconds": round(raw_seconds, 3),
        "raw_events_per_s": round(raw_eps, 1),
        "batch": batch,
        "batch_api": hasattr(make(f"{tag}-probe"), "deliver_batch"),
    }
    for mode, size in (("sink", 0), ("batch", batch)):
        prof = cProfile.Profile() if profile else None
        seconds, cpu = await _through_sink(make(f"{tag}-{mode}"), events, batch=size, profile=prof)
        eps = timed / seconds
        row[f"{mode}_seconds"] = round(seconds, 3)
        row[f"{mode}_events_per_s"] = round(eps, 1)
        row[f"{mode}_cpu_us_per_event"] = round(cpu / timed * 1e6, 1)
        row[f"{mode}_ratio"] = round(eps / raw_eps, 3)
        if prof is not None:
            path = (profile_dir / f"sinks-{kind}-{mode}.profile.txt") if profile_dir is not None else None
            row[f"{mode}_calls_per_event"] = round(_calls(prof, path) / timed, 1)
    row["ratio"] = row["sink_ratio"]
    return row


def run(
    quick: bool = False,
    *,
    events: int | None = None,
    kinds: Sequence[str] = KINDS,
    results_dir: Path | None = None,
    batch: int = BATCH,
    profile: bool = False,
) -> dict[str, Any]:
    """Measures every sink in ``kinds``; ``events`` overrides the per-kind counts (smoke tests).
    Writes ``sinks.json`` to ``results_dir`` (default ``bench/results``) and returns the figures."""
    from bench.common import brokers

    counts = QUICK_COUNTS if quick else FULL_COUNTS
    result: dict[str, Any] = {"scenario": "sinks", "quick": quick, "machine": machine_info(), "sinks": {}}
    profile_dir = results_dir if results_dir is not None else RESULTS_DIR
    with brokers(kinds) as urls, tempfile.TemporaryDirectory(prefix="keb-bench-sinks-") as tmp:
        for kind in kinds:
            count = events if events is not None else counts[kind]
            result["sinks"][kind] = asyncio.run(
                _measure(kind, count, kafka=urls.kafka, nats_url=urls.nats, tmp=Path(tmp), batch=batch,
                         profile=profile, profile_dir=profile_dir)
            )
    write_result("sinks", result, results_dir)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated subset of " + ",".join(KINDS))
    parser.add_argument("--events", type=int, default=None, help="events per sink (overrides the counts)")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help=f"events per deliver_batch (default {BATCH})")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the timed part: calls per event, hottest functions to the results")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    result = run(args.quick, kinds=kinds, events=args.events, batch=args.batch, profile=args.profile)
    width = max(len(k) for k in kinds)
    calls = "  calls/ev (one, batch)" if args.profile else ""
    print(f"{'sink':<{width}}  {'events':>7}  {'raw ev/s':>9}  {'one ev/s':>9}  {'batch ev/s':>10}  "
          f"{'ratio':>5}  {'batch':>5}  {'CPU µs/ev (one, batch)':>22}{calls}")
    for kind, row in result["sinks"].items():
        extra = ""
        if args.profile:
            extra = f"  {row['sink_calls_per_event']:>10} {row['batch_calls_per_event']:>10}"
        print(f"{kind:<{width}}  {row['events']:>7}  {row['raw_events_per_s']:>9.0f}  "
              f"{row['sink_events_per_s']:>9.0f}  {row['batch_events_per_s']:>10.0f}  "
              f"{row['sink_ratio']:>5.2f}  {row['batch_ratio']:>5.2f}  "
              f"{row['sink_cpu_us_per_event']:>10} {row['batch_cpu_us_per_event']:>11}{extra}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
