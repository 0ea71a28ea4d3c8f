"""Shared pieces of the benchmark scenarios: the simulator in a child process, sinks, probes, results.

Why a child process for the simulator: the bridge and the API server it watches never share a CPU in
production. Running the simulator on the bridge's event loop would charge the simulator's own work
(patching objects, encoding watch events, sorting list pages) to the bridge, so every scenario starts
it with :class:`SimProcess` (``python -m bench.common sim``) and drives it over a JSON-lines pipe:
``prefill`` creates realistic Pods, ``burst`` applies updates as fast as it can (they wait in the
watch history, so a watch started from the pre-burst resourceVersion replays them at the speed the
consumer reads), ``steady`` applies updates at a fixed rate, stamping each with its emission time in
the annotation :data:`STAMP_ANNOTATION` so that latency can be measured at the sink's acknowledgement.

The bridge side is the real :class:`~bridge.pipeline.BridgePipeline` (HTTP ListerWatcher, informer,
processor, sink listener, sink), built by :func:`bridge_pipeline`. The only addition is
:class:`AckProbe`, a pass-through sink wrapper that counts acknowledgements and records latencies; it
adds one Python call per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline, WatchedResource, http_informer_builder
from bridge.informer.factory import InformerKey
from bridge.informer.transform import drop_managed_fields
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource
from bridge.storage.checkpoint import Checkpoint, CheckpointStore, FileCheckpointStore
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.testing.stores import BareCheckpointStore
from sinks.cloudevents import encode_structured, to_cloudevent
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType, ResourceRef, Sink

__all__ = [
    "BENCH_NAMESPACE",
    "PODS",
    "PODS_API",
    "RESULTS_DIR",
    "STAMP_ANNOTATION",
    "AckProbe",
    "BurstSetup",
    "Payload",
    "Sampler",
    "SimProcess",
    "bridge_pipeline",
    "brokers",
    "build_payloads",
    "burst_setup",
    "count_watch_events",
    "fetch_watch_objects",
    "freeze_after_sync",
    "machine_info",
    "make_sink",
    "pod_templates",
    "quantile_points",
    "rss_bytes",
    "service_sink",
    "summarize_ms",
    "vary_pod",
    "write_result",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
BENCH_NAMESPACE = "bench"
STAMP_ANNOTATION = "bench.keb.io/emitted"
"""Wall-clock seconds (``time.time()``) at which the simulator applied the update."""

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
PODS_API = APIResource(group="", version="v1", resource="pods", kind="Pod", namespaced=True,
                       verbs=("list", "watch"))


# --------------------------------------------------------------------------------------------------
# Results and measurements


def write_result(name: str, data: Mapping[str, Any], results_dir: Path | None = None) -> Path:
    """Writes ``<results_dir>/<name>.json`` (default ``bench/results``) and returns its path."""
    out_dir = results_dir or RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[idx])


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """count, p50, p90, p99, max and mean of durations given in seconds, reported in milliseconds."""
    values = sorted(seconds)
    if not values:
        return {"count": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "mean_ms": 0.0}
    return {
        "count": len(values),
        "p50_ms": round(_quantile(values, 0.50) * 1000, 3),
        "p90_ms": round(_quantile(values, 0.90) * 1000, 3),
        "p99_ms": round(_quantile(values, 0.99) * 1000, 3),
        "max_ms": round(values[-1] * 1000, 3),
        "mean_ms": round(sum(values) / len(values) * 1000, 3),
    }


def quantile_points(seconds: Sequence[float], points: int = 200) -> list[float]:
    """The distribution in ``points`` evenly spaced quantiles (ms), small enough to keep in the JSON
    results and plot later."""
    values = sorted(seconds)
    if not values:
        return []
    return [round(_quantile(values, i / (points - 1)) * 1000, 3) for i in range(points)]


def rss_bytes() -> int:
    """The process's resident set size now (``VmRSS`` from /proc)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


# --------------------------------------------------------------------------------------------------
# Realistic Pods, quickly


def pod_templates(count: int = 200, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` distinct realistic Pods (``bridge.sim.objects.make_pod``, ~4.5 KB of JSON each)."""
    from bridge.sim.objects import make_pod

    rng = random.Random(seed)
    return [make_pod(f"tmpl-{i}", rng=rng) for i in range(count)]


def vary_pod(template: Mapping[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """A copy of ``template`` with its own name and namespace (the rest of the tree is shared, which
    is fine for anything that re-encodes it)."""
    pod = dict(template)
    pod["metadata"] = {**template["metadata"], "name": name, "namespace": namespace}
    return pod


# --------------------------------------------------------------------------------------------------
# The simulator in a child process


class SimProcessError(RuntimeError):
    """The simulator child process failed or answered with an error."""


class SimProcess:
    """The API-server simulator running in its own Python process (see the module docstring)."""

    def __init__(self, *, history_size: int = 400_000, watcher_buffer: int = 400_000) -> None:
        self._history_size = history_size
        self._watcher_buffer = watcher_buffer
        self._proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> str:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.common", "sim", str(self._history_size), str(self._watcher_buffer),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            # The simulator logs every watch a client drops at shutdown; none of it is a result.
            stderr=asyncio.subprocess.DEVNULL,
            cwd=_REPO_ROOT,
            limit=64 * 1024 * 1024,
        )
        hello = await self._read()
        self.url = str(hello["url"])
        return self.url

    async def _read(self) -> dict[str, Any]:
        assert self._proc is not None
        assert self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            code = await self._proc.wait()
            raise SimProcessError(f"the simulator process exited (code {code})")
        reply: dict[str, Any] = orjson.loads(line)
        if "error" in reply:
            raise SimProcessError(f"simulator: {reply['error']}")
        return reply

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Sends one command and waits for its answer."""
        if self._proc is None or self._proc.stdin is None:
            raise SimProcessError("the simulator process is not running")
        self._proc.stdin.write(orjson.dumps({"op": op, **args}) + b"\n")
        await self._proc.stdin.drain()
        return await self._read()

    async def prefill(self, count: int, namespace: str = BENCH_NAMESPACE, *,
                      index: bool = False) -> dict[str, Any]:
        """Creates ``count`` Pods ``pod-0`` … in ``namespace``; returns ``rv`` (the store's
        resourceVersion afterwards) and, with ``index``, ``index`` = [[key, uid, rv], …]."""
        return await self.call("prefill", count=count, namespace=namespace, index=index)

    async def burst(self, rounds: int, namespace: str = BENCH_NAMESPACE) -> dict[str, Any]:
        """Updates every Pod of ``namespace`` ``rounds`` times; returns ``events``, ``rv_before``,
        ``rv_after`` and ``seconds``."""
        return await self.call("burst", rounds=rounds, namespace=namespace)

    async def steady(self, rate: float, duration: float, namespace: str = BENCH_NAMESPACE, *,
                     create: bool = False) -> dict[str, Any]:
        """Updates Pods of ``namespace`` (or, with ``create``, creates new ones) at ``rate`` per
        second for ``duration`` seconds, each stamped with its emission time; returns ``events``,
        ``seconds`` and ``late_ticks``."""
        return await self.call("steady", rate=rate, duration=duration, namespace=namespace, create=create)

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.write(b'{"op": "quit"}\n')
                await proc.stdin.drain()
                proc.stdin.close()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def __aenter__(self) -> SimProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _sim_child(history_size: int, watcher_buffer: int) -> None:
    from bridge.sim import Simulator

    # The simulator keeps every object and the whole watch history alive: with the default thresholds
    # Python's cyclic GC would rescan that heap over and over while the benchmark drives it.
    gc.set_threshold(100_000, 50, 1000)
    sim = Simulator(history_size=history_size, watcher_buffer=watcher_buffer, bookmark_interval=3600.0,
                    default_watch_timeout=3600)
    url = await sim.start()
    templates = pod_templates()
    names: dict[str, list[str]] = {}
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    def reply(obj: Mapping[str, Any]) -> None:
        out.write(orjson.dumps(obj) + b"\n")
        out.flush()

    reply({"url": url})
    store = sim.store
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            cmd = orjson.loads(line)
            op = cmd.get("op")
            try:
                if op == "quit":
                    break
                if op == "prefill":
                    ns = str(cmd["namespace"])
                    with contextlib.suppress(Exception):
                        store.create("namespaces", {"metadata": {"name": ns}})
                    created = names.setdefault(ns, [])
                    index: list[list[str]] = []
                    t0 = time.perf_counter()
                    for i in range(len(created), len(created) + int(cmd["count"])):
                        name = f"pod-{i}"
                        obj = store.create("pods", vary_pod(templates[i % len(templates)], name, ns))
                        created.append(name)
                        if cmd.get("index"):
                            meta = obj["metadata"]
                            index.append([f"{ns}/{name}", meta["uid"], meta["resourceVersion"]])
                    gc.collect()
                    gc.freeze()
                    reply({"rv": store.resource_version, "index": index,
                           "seconds": time.perf_counter() - t0})
                elif op == "burst":
                    ns = str(cmd["namespace"])
                    before = store.resource_version
                    t0 = time.perf_counter()
                    seq = 0
                    for _ in range(int(cmd["rounds"])):
                        for name in names.get(ns, []):
                            seq += 1
                            store.patch("pods", name, {"metadata": {"annotations": {
                                "bench.keb.io/seq": str(seq)}}}, namespace=ns)
                    reply({"events": seq, "rv_before": before, "rv_after": store.resource_version,
                           "seconds": time.perf_counter() - t0})
                elif op == "steady":
                    ns = str(cmd["namespace"])
                    pool = names.get(ns, [])
                    rate, duration = float(cmd["rate"]), float(cmd["duration"])
                    create = bool(cmd.get("create"))
                    start = loop.time()
                    emitted = 0
                    late = 0
                    total = int(rate * duration)
                    while emitted < total:
                        due = min(total, int((loop.time() - start) * rate) + 1)
                        if due - emitted > max(2.0, rate * 0.005):
                            late += 1
                        while emitted < due:
                            if create:
                                pod = vary_pod(templates[emitted % len(templates)],
                                               f"new-{uuid.uuid4().hex[:12]}", ns)
                                pod["metadata"]["annotations"] = {
                                    **(pod["metadata"].get("annotations") or {}),
                                    STAMP_ANNOTATION: repr(time.time())}
                                store.create("pods", pod)
                            else:
                                name = pool[emitted % len(pool)]
                                store.patch("pods", name, {"metadata": {"annotations": {
                                    STAMP_ANNOTATION: repr(time.time())}}}, namespace=ns)
                            emitted += 1
                        await asyncio.sleep(0.001)
                    reply({"events": emitted, "seconds": loop.time() - start, "late_ticks": late,
                           "rv": store.resource_version})
                else:
                    reply({"error": f"unknown op {op!r}"})
            except Exception as exc:
                reply({"error": repr(exc)})
    finally:
        await sim.stop()


# --------------------------------------------------------------------------------------------------
# Checkpoints, sinks and the pipeline


_DELIVERED = DeliveryOutcome.DELIVERED
_NEVER = 1 << 62


class AckProbe:
    """A pass-through sink wrapper counting acknowledgements (and, once armed, latencies).

    Latency is ``time.time()`` at the acknowledgement minus the :data:`STAMP_ANNOTATION` of the
    object; only events of the armed period that carry the stamp count."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        # Looked up on the class (not sinks.contract.Admits): the harness also drives older trees.
        room = getattr(type(inner), "has_room", None)
        self._room: Callable[[int], bool] | None = None if room is None else functools.partial(room, inner)
        self.name = inner.name
        self.delivery = inner.delivery
        self.acked = 0
        self.first_ack_at: float | None = None
        """``time.perf_counter()`` of the first acknowledgement (start-up excluded from rates)."""
        self._delivered = 0
        self._other_outcomes: dict[str, int] = {}
        self.latencies: list[float] = []
        self.final_after: int | None = None
        """When set: acknowledgements of events of a resourceVersion above it are counted in
        :attr:`final_acked` (a burst's last round: the bridge may coalesce earlier versions of an
        object when its sink falls behind, never the latest)."""
        self.final_acked = 0
        self.acked_rvs: set[int] = set()
        """resourceVersions of the objects of the events acknowledged since :meth:`arm`."""
        self._armed = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake_at = (_NEVER, _NEVER)
        """The lowest :attr:`acked` and :attr:`final_acked` a waiter waits for: the probe's own cost
        per acknowledgement stays two integer comparisons until one is reached."""

    @property
    def outcomes(self) -> dict[str, int]:
        """How many acknowledgements came with each outcome (by its value)."""
        counts = dict(self._other_outcomes)
        if self._delivered:
            counts[_DELIVERED.value] = self._delivered
        return counts

    def arm(self) -> None:
        """Starts recording latencies (and forgets earlier ones)."""
        self.latencies = []
        self.acked_rvs = set()
        self._armed = True

    async def start(self) -> None:
        await self.inner.start()

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        await self.inner.deliver(event, self._probe(event, ack))

    def has_room(self, count: int) -> bool:
        """The inner sink's answer (:class:`sinks.contract.Admits`): the probe itself never waits."""
        return self._room is not None and self._room(count)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        """Passes the batch through (a loop over ``deliver`` when the inner sink has no
        ``deliver_batch``), each ack wrapped as :meth:`deliver` wraps it."""
        probe = self._probe
        wrapped = [probe(event, ack) for event, ack in zip(events, acks, strict=True)]
        inner_batch = getattr(type(self.inner), "deliver_batch", None)  # not a forwarded attribute
        if inner_batch is not None:
            await inner_batch(self.inner, events, wrapped)
            return
        deliver = self.inner.deliver
        for event, probe_ack in zip(events, wrapped, strict=True):
            await deliver(event, probe_ack)

    def _probe(self, event: ChangeEvent, ack: AckCallback) -> AckCallback:
        """``ack`` wrapped: counts the acknowledgement (and, once armed, the latency) first."""
        stamp: str | None = None
        final = False
        obj = event.obj
        rv_seen = 0
        if (self.final_after is not None or self._armed) and obj is not None:
            rv = getattr(obj, "resource_version", None)
            if rv is None:
                rv = event.metadata.get("resourceVersion")
            rv_seen = int(rv or 0)
            final = self.final_after is not None and rv_seen > self.final_after
        if self._armed and obj is not None:
            annotations = event.metadata.get("annotations")
            if isinstance(annotations, Mapping):
                stamp = annotations.get(STAMP_ANNOTATION)
        others = self._other_outcomes

        def probe_ack(outcome: DeliveryOutcome) -> None:
            if stamp is not None:
                self.latencies.append(time.time() - float(stamp))
            if rv_seen and self._armed:
                self.acked_rvs.add(rv_seen)
            if self.first_ack_at is None:
                self.first_ack_at = time.perf_counter()
            self.acked += 1
            if final:
                self.final_acked += 1
            if outcome is _DELIVERED:  # an identity test: hashing an Enum member is a Python call
                self._delivered += 1
            else:
                others[outcome.value] = others.get(outcome.value, 0) + 1
            ack(outcome)
            wake_acked, wake_final = self._wake_at
            if self.acked >= wake_acked or self.final_acked >= wake_final:
                self._wake()

        return probe_ack

    def _wake(self) -> None:
        keep = []
        for target, fut in self._waiters:
            if (self.acked if target >= 0 else self.final_acked) >= abs(target):
                if not fut.done():
                    fut.set_result(None)
            elif not fut.done():
                keep.append((target, fut))
        self._waiting(keep)

    def _waiting(self, waiters: list[tuple[int, asyncio.Future[None]]]) -> None:
        self._waiters = waiters
        self._wake_at = (min((t for t, _ in waiters if t >= 0), default=_NEVER),
                         min((-t for t, _ in waiters if t < 0), default=_NEVER))

    async def wait_acked(self, count: int, timeout: float) -> bool:
        """True once ``count`` acknowledgements arrived; False after ``timeout`` seconds."""
        if self.acked >= count:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting([*self._waiters, (count, fut)])
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        return True

    async def wait_final(self, count: int, timeout: float) -> bool:
        """True once ``count`` events above :attr:`final_after` were acknowledged; False after
        ``timeout`` seconds."""
        if self.final_acked >= count:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting([*self._waiters, (-count, fut)])
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        return True

    async def wait_rvs(self, first: int, last: int, timeout: float) -> bool:
        """True once events of every resourceVersion in ``first..last`` were acknowledged (since
        :meth:`arm`); False after ``timeout`` seconds. The latest change of each object is always
        delivered, whatever a sink that fell behind coalesced before it."""
        deadline = time.monotonic() + timeout
        wanted = range(first, last + 1)
        while True:
            rvs = self.acked_rvs
            if all(rv in rvs for rv in wanted):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)

    async def flush(self, timeout: float) -> bool:
        return await self.inner.flush(timeout)

    async def close(self) -> None:
        await self.inner.close()

    def healthy(self) -> bool:
        return self.inner.healthy()

    @property
    def last_error(self) -> str:
        return self.inner.last_error

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight


@dataclass(frozen=True, slots=True)
class BrokerUrls:
    kafka: str = ""
    nats: str = ""


@contextlib.contextmanager
def brokers(kinds: Sequence[str]) -> Iterator[BrokerUrls]:
    """Starts a Tansu broker (for ``kafka``) and a nats-server with JetStream (for ``nats`` /
    ``jetstream``) on free loopback ports, as the sink tests do; stops them afterwards."""
    from tests.brokers import running_nats, running_tansu

    with contextlib.ExitStack() as stack:
        kafka = nats = ""
        if "kafka" in kinds:
            kafka = stack.enter_context(running_tansu()).bootstrap
        if "nats" in kinds or "jetstream" in kinds:
            nats = stack.enter_context(running_nats()).url
        yield BrokerUrls(kafka=kafka, nats=nats)


def make_sink(kind: str, *, urls: BrokerUrls, tmp_dir: Path, tag: str = "") -> Sink:
    """A sink of ``kind`` (file, kafka, nats, jetstream) with its defaults, on a fresh destination."""
    from sinks.file import FileSink
    from sinks.kafka import KafkaSink
    from sinks.nats import JetStreamSink, NatsSink

    tag = tag or uuid.uuid4().hex[:8]
    if kind == "file":
        return FileSink.from_options("file", {"path": str(tmp_dir / f"events-{tag}.jsonl")})
    if kind == "kafka":
        return KafkaSink.from_options("kafka", {"brokers": urls.kafka, "auto_create_topics": True,
                                                "destination": f"bench-{tag}"})
    if kind == "nats":
        return NatsSink.from_options("nats", {"servers": [urls.nats],
                                              "destination": f"bench.{tag}.{{namespace}}.{{name}}"})
    if kind == "jetstream":
        return JetStreamSink.from_options("jetstream", {
            "servers": [urls.nats], "destination": f"bench.{tag}.{{namespace}}.{{name}}",
            "stream": {"name": f"BENCH-{tag}", "create": True, "storage": "file",
                       "subjects": [f"bench.{tag}.>"]}})
    raise ValueError(f"unknown sink kind {kind!r}")


_telemetry: Any = None


def service_sink(kind: str, *, urls: BrokerUrls, tmp_dir: Path, tag: str = "") -> Sink:
    """A sink as the service runs it: in a delivery chain with its meter stage
    (:class:`bridge.service.metered.MeterStage`: in-flight gauge, time-sampled latency histogram,
    spans at the default 1% ratio), one Telemetry per process."""
    global _telemetry
    from bridge.delivery.chain import DeliveryChain
    from bridge.service.metered import MeterStage
    from bridge.service.telemetry import Telemetry

    if _telemetry is None:
        _telemetry = Telemetry()
    sink = make_sink(kind, urls=urls, tmp_dir=tmp_dir, tag=tag)
    return DeliveryChain(sink=sink, stages=[MeterStage(sink=sink.name, telemetry=_telemetry)])


def watched_pods(namespace: str) -> WatchedResource:
    return WatchedResource(key=InformerKey("pods", namespace=namespace), ref=PODS, api=PODS_API)


@contextlib.asynccontextmanager
async def bridge_pipeline(url: str, sinks: Sequence[Sink], *, namespace: str,
                          checkpoint: Checkpoint | None = None,
                          page_size: int = 500,
                          compact_cache: bool = True,
                          checkpoint_dir: Path | None = None,
                          checkpoint_namespace: str | None = None,
                          spill_directory: Path | None = None,
                          spill: bool = True) -> AsyncIterator[BridgePipeline]:
    """The real pipeline over HTTP for the Pods of ``namespace``, started; shut down on exit.
    With ``checkpoint`` it resumes from there (watch from its resourceVersion, no list).
    ``compact_cache`` mirrors the service's ``cache.compact`` (on by default). ``checkpoint_dir``:
    the service's default file checkpoint store there (with its known-object journal, written before
    a new object's first event is released), checkpointing every 5 s as the service does by
    default; ``checkpoint_namespace``: the configmap store instead, its ConfigMaps (and journal
    ConfigMap, one API write per group commit) in that namespace of the simulator; otherwise an
    in-memory store that never writes during the run. The sinks spill beyond their buffers as the
    service's do by default: into ``spill_directory``, or a temporary directory removed afterwards;
    ``spill=False``: no spill (a sink that falls behind degrades at once)."""
    client = ApiClient(server=url)
    clock = RealClock()
    store: CheckpointStore
    if checkpoint_namespace is not None:
        store = ConfigMapCheckpointStore(client=client, namespace=checkpoint_namespace)
    elif checkpoint_dir is not None:
        store = FileCheckpointStore(directory=checkpoint_dir)
    else:
        store = BareCheckpointStore(*([checkpoint] if checkpoint is not None else []))
    persistent = checkpoint_dir is not None or checkpoint_namespace is not None
    temp_spill: str | None = None
    if spill and spill_directory is None:
        temp_spill = tempfile.mkdtemp(prefix="keb-bench-spill-")
        spill_directory = Path(temp_spill)
    pipeline = BridgePipeline(
        resources=[watched_pods(namespace)],
        sinks=sinks,
        checkpoint_store=store,
        build_informer=http_informer_builder(client=client, clock=clock, page_size=page_size,
                                             compact_cache=compact_cache),
        checkpoint_interval=5.0 if persistent else 3600.0,
        clock=clock,
        spill_directory=spill_directory if spill else None,
    )
    try:
        await pipeline.start()
        yield pipeline
    finally:
        try:
            await pipeline.shutdown(deadline=15.0)
        finally:
            await client.close()
            if temp_spill is not None:
                shutil.rmtree(temp_spill, ignore_errors=True)


def freeze_after_sync() -> None:
    """What the service does once an informer has synced when it tuned the garbage collector
    (``bridge.service.service``): move the cache built so far out of the collected generations."""
    if gc.get_threshold() != (700, 10, 10):
        gc.collect()
        gc.freeze()


class Sampler:
    """Samples acknowledgements and sink queue depth every ``interval`` seconds while a run goes on
    (for the throughput-over-time plot). A named task, cancelled by :meth:`stop`."""

    def __init__(self, *, probe: AckProbe, pipeline: BridgePipeline, interval: float = 0.1) -> None:
        self._probe = probe
        self._pipeline = pipeline
        self._interval = interval
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._task = asyncio.create_task(self._run(), name=f"bench:sampler:{self._probe.name}")

    async def _run(self) -> None:
        while True:
            depth = sum(self._pipeline.queue_depths().values())
            in_flight = self._probe.inner.in_flight  # declared by every sink (a chain: its meter's count)
            self.samples.append({"t": round(time.perf_counter() - self._t0, 3), "acked": self._probe.acked,
                                 "queue_depth": depth, "in_flight": in_flight})
            await asyncio.sleep(self._interval)

    async def stop(self) -> list[dict[str, float]]:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return self.samples


# --------------------------------------------------------------------------------------------------
# The burst scenario's common setup


@dataclass(frozen=True, slots=True)
class BurstSetup:
    """Pods created, then updated in a burst that waits in the watch history."""

    pods: int
    events: int
    rv_before: int
    checkpoint: Checkpoint
    seconds_to_generate: float
    rv_after: int = 0
    """The store's resourceVersion after the burst: the last round's events are the ``pods``
    highest versions up to it."""

    @property
    def last_round_after(self) -> int:
        """Events of a resourceVersion above this are the burst's last round (one per Pod)."""
        return self.rv_after - self.pods


async def burst_setup(sim: SimProcess, *, pods: int, rounds: int,
                      namespace: str = BENCH_NAMESPACE) -> BurstSetup:
    """Creates ``pods`` Pods, then ``rounds`` updates of each. The checkpoint resumes an informer
    right before the burst, knowing every Pod (as a bridge restarted at that point would)."""
    pre = await sim.prefill(pods, namespace, index=True)
    burst = await sim.burst(rounds, namespace)
    watched = watched_pods(namespace)
    index = {key: (uid, rv) for key, uid, rv in pre["index"]}
    cp = Checkpoint(informer_id=watched.informer_id, resource_version=str(burst["rv_before"]),
                    objects=index, written_at=time.time())
    return BurstSetup(pods=pods, events=int(burst["events"]), rv_before=int(burst["rv_before"]),
                      checkpoint=cp, seconds_to_generate=float(burst["seconds"]),
                      rv_after=int(burst["rv_after"]))


async def fetch_watch_objects(url: str, namespace: str, from_rv: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` objects of the watch stream from ``from_rv``, read with a bare HTTP client."""
    import aiohttp

    objects: list[dict[str, Any]] = []
    params = {"watch": "1", "resourceVersion": str(from_rv), "timeoutSeconds": "120"}
    async with aiohttp.ClientSession() as session, session.get(
        f"{url}/api/v1/namespaces/{namespace}/pods", params=params,
        timeout=aiohttp.ClientTimeout(total=120),
    ) as resp:
        resp.raise_for_status()
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    objects.append(event["object"])
                    if len(objects) >= count:
                        return objects
    return objects


async def count_watch_events(url: str, namespace: str, from_rv: int, count: int) -> float:
    """Events/s of a bare HTTP read of the watch from ``from_rv`` that only counts lines (the
    simulator's own pace: nothing decodes them)."""
    import aiohttp

    seen = 0
    params = {"watch": "1", "resourceVersion": str(from_rv), "timeoutSeconds": "120"}
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        async with session.get(f"{url}/api/v1/namespaces/{namespace}/pods", params=params,
                               timeout=aiohttp.ClientTimeout(total=120)) as resp:
            resp.raise_for_status()
            async for chunk in resp.content.iter_any():
                seen += chunk.count(b"\n")
                if seen >= count:
                    break
        seconds = time.perf_counter() - t0
    if seen < count:
        raise RuntimeError(f"the watch ended after {seen} of {count} events")
    return count / seconds


@dataclass(frozen=True, slots=True)
class Payload:
    key: bytes
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def build_payloads(objects: Sequence[Mapping[str, Any]]) -> list[Payload]:
    """The structured CloudEvents the sinks send for these updates (managedFields dropped, as the
    informer's default transform does): the raw ceilings push exactly these bytes."""
    out: list[Payload] = []
    now = time.time()
    for obj in objects:
        trimmed = drop_managed_fields(dict(obj))
        event = ChangeEvent(type=EventType.UPDATED, resource=PODS, cluster="default", obj=trimmed, time=now)
        body = encode_structured(to_cloudevent(event))
        out.append(Payload(key=str(trimmed["metadata"]["uid"]).encode(), body=body,
                           headers={"content-type": "application/cloudevents+json"}))
    return out


def _main(argv: Sequence[str]) -> int:
    if len(argv) >= 1 and argv[0] == "sim":
        history = int(argv[1]) if len(argv) > 1 else 400_000
        buffer = int(argv[2]) if len(argv) > 2 else 400_000
        asyncio.run(_sim_child(history, buffer))
        return 0
    print(json.dumps({"usage": "python -m bench.common sim [history_size] [watcher_buffer]"}))
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
