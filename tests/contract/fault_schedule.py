"""A randomized fault schedule against the whole bridge, checked by ``kube-event-bridge verify``.

Jepsen-style: a history of operations (every change the churn made, with the resourceVersion the
server gave it), a seeded random schedule of faults, and a checker — the verifier, reading each
destination back with its own client — that decides what was lost. Nothing of the bridge's own
bookkeeping is trusted.

The world, all real processes on loopback:

* the API-server simulator (``python -m bridge.sim``), with ConfigMaps or Pods churned over HTTP
  (:class:`Setup`: the resource, the number of objects, the rate; the combined profile churns 150
  Pods at 200 changes/s);
* a Kafka broker (Tansu), a NATS server with JetStream (file storage), a webhook receiver (an HTTP
  server in this process, writing what it accepted to a JSON-lines file) and a file sink;
* the bridge as it runs in production: ``kube-event-bridge run --config FILE`` in its own process,
  with a file checkpoint store (``checkpoint.interval`` from the setup), and, with dead letters,
  Kafka's to a topic on the same broker, JetStream's to a NATS subject, the webhook's to a file, each
  read back after the schedule.

The faults, drawn from the seed: SIGKILL and restart of the bridge; SIGKILL, compaction of the
server's history while the bridge is down (the resume gets 410), restart; Kafka frozen (SIGSTOP /
SIGCONT); NATS stopped and started again; the webhook answering 5xx or 429 for a while; watch
streams cut mid-line; 410 Expired sent into the open watches; a garbled line in every watch stream.

Then the churn stops, every fault is lifted, the bridge drains (its checkpoint reaches the last
change, which it writes only once every sink acknowledged everything before it), it is stopped with
SIGTERM, and for every sink the verifier must find the sink's state equal to the cluster's (no
missing, phantom or stale object), no per-object order violation, and every change the churn made
delivered unless it falls inside a gap window the sink was told about.

``python -m tests.contract.fault_schedule --seed N --duration S`` (``scripts/fault-schedule``) runs
long schedules; the CI test (tests/contract/test_fault_schedule.py) runs a few short ones.
``KEB_FAULT_SEED`` replays one seed there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bridge.errors import ConflictError, NotFoundError, status_error
from bridge.kube.apiclient import ApiClient
from bridge.service.verify import VerifyReport, event_kind, verify
from bridge.service.verify_sources import (
    ResourceRequest,
    SinkContents,
    list_cluster,
    read_file,
    read_jetstream,
    read_kafka,
)
from bridge.sim.objects import make_pod
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from bridge.testing.processes import ProcessFailed, ServiceProcess
from bridge.testing.receiver import ReceivedRequest, Reply, WebhookReceiver
from bridge.testing.spec import Change, ChangeKind, History, Received, SinkLog, check_sink, scope_of
from tests.brokers import NatsServer, TansuBroker, running_nats, running_tansu

__all__ = ["FAULTS", "PROFILES", "SETUPS", "Infra", "Outcome", "Setup", "churn_workers", "infrastructure",
           "main", "run_seed", "slowest_rate"]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "faults"
FAULTS = ("kill", "kill_compact", "kafka_pause", "nats_restart", "hook_storm", "watch_cut", "expire",
          "garble")
"""Every fault kind the schedule draws from (all of them, always)."""
PROFILES = ("random", "combined")
"""``random``: faults drawn one after another from :data:`FAULTS`; ``combined``: every sink's outage
at once with 410 storms and several SIGKILLs (:func:`_combined_faults`)."""


@dataclass(frozen=True)
class Setup:
    """What a schedule churns and how the bridge is configured for it."""

    resource: str = "configmaps"
    """``configmaps`` or ``pods`` (a Pod as a ReplicaSet creates it, some 4.5 KB)."""
    objects: int = 25
    """How many names the churn creates, updates and deletes."""
    rate: float = 80.0
    """Changes per second the churn aims at."""
    checkpoint_interval: float = 0.2
    """``checkpoint.interval`` (group commit at its defaults)."""
    dead_letters: bool = False
    """Kafka's dead letter to a topic on the same broker, JetStream's to a NATS subject (captured by a
    stream of its own), the webhook's to a file; every one read back after the schedule."""
    buffer_capacity: int | None = None
    """Every sink's ``buffer.capacity`` (None: the default, 1,024): a smaller one makes a frozen
    sink's backlog spill as soon as at 200 changes/s where the churn reaches less (a loaded machine)."""
    spill_limit: int | None = None
    """Every sink's ``buffer.spill_limit`` in bytes (None: the default, 256 MiB): a small one makes a
    frozen sink's listener degrade (the latest state per object inside an overflow window of its own)
    once its spill is full, across the relists and kills of the schedule."""


SETUPS = {"random": Setup(),
          "combined": Setup(resource="pods", objects=150, rate=200.0, checkpoint_interval=2.0,
                            dead_letters=True)}
"""Each profile's default setup: the combined profile is issue 34's incident (150 Pods churned at
200 changes/s, a checkpoint every 2 s, dead letters on every sink)."""


# --------------------------------------------------------------------------------------------------
# the world


@dataclass
class Infra:
    """The long-lived processes: simulator, Kafka, NATS. Shared by the seeds of one run."""

    sim_url: str
    kubeconfig: Path
    tansu: TansuBroker
    nats: NatsServer


@contextlib.contextmanager
def infrastructure(workdir: Path) -> Iterator[Infra]:
    """Starts the simulator, Tansu and nats-server; stops them (by PID) on exit."""
    kubeconfig = workdir / "sim.kubeconfig"
    sim = subprocess.Popen(
        [sys.executable, "-m", "bridge.sim", "--port", "0", "--kubeconfig", str(kubeconfig),
         "--history-size", "1000000", "--bookmark-interval", "0.5"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert sim.stdout is not None
        url = ""
        deadline = time.monotonic() + 30
        while not url:
            line = sim.stdout.readline().decode()
            if not line or time.monotonic() > deadline:
                raise RuntimeError("the simulator did not start")
            if "simulator listening on" in line:
                url = line.strip().rsplit(" ", 1)[-1]
        with running_tansu() as tansu, running_nats("-l", str(workdir / "nats.log")) as nats:
            yield Infra(sim_url=url, kubeconfig=kubeconfig, tansu=tansu, nats=nats)
    finally:
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait(5)


class Hook:
    """A webhook receiver (the kit's, on a port the system picks): appends every accepted event to a
    JSON-lines file, in arrival order; ``status`` other than 200 makes it refuse everything (a 5xx
    or 429 storm); with ``throttle`` a 503 storm answers that share of requests 429 with
    ``Retry-After: 1`` instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.status = 200
        self.throttle = 0.0
        self.refused = 0
        self._receiver = WebhookReceiver(respond=self._respond)
        self._rng = random.Random(0)

    @property
    def port(self) -> int:
        return self._receiver.port

    async def _respond(self, request: ReceivedRequest) -> Reply:
        if self.status != 200:
            self.refused += 1
            if self.throttle and self._rng.random() < self.throttle:
                return Reply(429, retry_after=1)
            return Reply(self.status, retry_after=0)
        data = orjson.loads(request.body)
        with self.path.open("ab") as fh:
            for ce in data if isinstance(data, list) else [data]:
                fh.write(orjson.dumps(ce) + b"\n")
        return Reply(200)

    async def start(self) -> None:
        await self._receiver.start()

    async def stop(self) -> None:
        await self._receiver.close()


class ChurnWriter:
    """The churn's writes to the simulator over HTTP: aiohttp with orjson and nothing else (no
    client-side rate limit, retries or bounds checks; a failed write ends the schedule). The
    :class:`~bridge.kube.apiclient.ApiClient` is for a bridge: its bookkeeping per request cost the
    schedule's process about as much CPU as the simulator's patch handling, on a machine where the
    churn competes for two cores with the bridge, three brokers and the simulator."""

    def __init__(self, url: str, *, connections: int) -> None:
        self._url = url.rstrip("/")
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                              headers={"User-Agent": "fault-schedule-churn"})

    async def _send(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else None
        async with self._session.request(method, self._url + path, data=data, headers=headers) as resp:
            raw = await resp.read()
            code = resp.status
        answer = _loads(raw)
        if code >= 300:
            raise status_error(code, answer if isinstance(answer, dict) else None, context=f"{method} {path}")
        if not isinstance(answer, dict):
            raise RuntimeError(f"{method} {path}: the simulator answered {code} with {raw[:200]!r}")
        return answer

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._send("POST", path, body)

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._send("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str) -> dict[str, Any]:
        return await self._send("DELETE", path)

    async def close(self) -> None:
        await self._session.close()


@dataclass
class Churn:
    """Creates, updates and deletes ConfigMaps or Pods over HTTP; records every change (the history)."""

    client: ChurnWriter
    namespace: str
    rng: random.Random
    names: int = 25
    rate: float = 80.0
    resource: str = "configmaps"
    workers: int = 1
    produced: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(type, namespace/name, uid, resourceVersion), in the order the server made them."""
    answered: list[float] = field(default_factory=list)
    """When each change's answer came (the loop's clock), in the order of the answers."""
    live: set[str] = field(default_factory=set)
    started: float = 0.0
    ended: float = 0.0
    """The loop's clock when the churn began and when its last request was answered."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        m = obj["metadata"]
        self.produced.append((kind, f"{self.namespace}/{m['name']}", m["uid"], m["resourceVersion"]))
        self.answered.append(asyncio.get_running_loop().time())

    def _new(self, name: str, done: int) -> dict[str, Any]:
        if self.resource == "pods":
            pod = dict(make_pod(name, self.namespace, rng=self.rng))
            pod["metadata"] = {**pod["metadata"], "annotations": {"v": str(done)}}
            return pod
        return {"metadata": {"name": name}, "data": {"v": str(done)}}

    def _change(self, done: int) -> dict[str, Any]:
        if self.resource == "pods":
            return {"metadata": {"annotations": {"v": str(done)}}}
        return {"data": {"v": str(done)}}

    async def run(self) -> None:
        """``workers`` concurrent request loops over disjoint names, together at ``rate`` (one loop
        alone cannot keep 200 changes/s on a loaded machine); ``produced`` is kept in the server's
        order (by resourceVersion)."""
        self.started = asyncio.get_running_loop().time()
        try:
            await asyncio.gather(*(self._worker(i) for i in range(self.workers)))
        finally:
            self.ended = asyncio.get_running_loop().time()
            self.produced.sort(key=lambda c: int(c[3]))

    def slowest_window(self, width: int = 5) -> float:
        """:func:`slowest_rate` of this churn's answers."""
        return slowest_rate(self.answered, self.started, self.ended, width)

    async def _worker(self, which: int) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/{self.resource}"
        prefix = "pod" if self.resource == "pods" else "cm"
        mine = [n for n in range(self.names) if n % self.workers == which]
        rate = self.rate / self.workers
        loop = asyncio.get_running_loop()
        start, done = loop.time(), 0
        while not self._stop.is_set() and mine:
            name = f"{prefix}-{self.rng.choice(mine)}"
            with contextlib.suppress(ConflictError, NotFoundError):
                if name not in self.live:
                    obj = await self.client.create(path, self._new(name, done))
                    self.live.add(name)
                    self._record("added", obj)
                elif self.rng.random() < 0.25:
                    obj = await self.client.delete(f"{path}/{name}")
                    self.live.discard(name)
                    self._record("deleted", obj)
                else:
                    obj = await self.client.patch(f"{path}/{name}", self._change(done))
                    self._record("updated", obj)
            done += 1
            ahead = done / rate - (loop.time() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)

    def stop(self) -> None:
        self._stop.set()


def slowest_rate(answered: list[float], started: float, ended: float, width: int = 5) -> float:
    """The lowest rate of ``answered`` (times) over ``width`` consecutive whole seconds from
    ``started`` to ``ended`` (the whole span's rate when it is shorter): a churn that stalls for a
    while and catches up in a burst has a fair average and a low slowest window."""
    span = ended - started
    seconds = int(span)
    if seconds < width:
        return len(answered) / span if span > 0 else 0.0
    per_second = [0] * seconds
    for t in answered:
        if 0 <= (i := int(t - started)) < seconds:
            per_second[i] += 1
    return min(sum(per_second[i:i + width]) for i in range(seconds - width + 1)) / width


CHURN_WORKER_RATE = 10.0
"""Changes per second one churn loop is asked for: a loop waits for each answer before its next
request, so it keeps its share while the simulator answers within 1 / this (100 ms), which a loaded
2-core machine running the bridge, three brokers and the simulator does not always do in 20 ms."""


def churn_workers(setup: Setup) -> int:
    """How many concurrent request loops churn ``setup``'s rate (each over names of its own)."""
    return max(1, min(setup.objects, math.ceil(setup.rate / CHURN_WORKER_RATE)))


# --------------------------------------------------------------------------------------------------
# one seed


@dataclass
class Outcome:
    seed: int
    faults: list[str]
    changes: int
    reports: dict[str, VerifyReport]
    problems: list[str]
    restarts: int
    lost: dict[str, int] = field(default_factory=dict)
    """Per sink: changes never delivered outside any gap window it was told of."""
    dead_lettered: dict[str, int] = field(default_factory=dict)
    """Per sink: records its dead-letter destination holds (read back)."""
    asked_rate: float = 0.0
    """Changes per second the churn aimed at."""
    applied: int = 0
    """Changes the simulator applied while the churn ran (its resourceVersion's advance: nothing
    else writes to it during a schedule)."""
    churn_seconds: float = 0.0
    slowest_rate: float = 0.0
    """The churn's lowest rate over 5 consecutive seconds (:meth:`Churn.slowest_window`)."""
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average when the churn began and when it stopped."""
    pushed: float = 0.0
    """Seconds the combined profile's steps pushed its timeline back (bridge restarts slower than
    the gaps after them)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def achieved_rate(self) -> float:
        """Changes per second the simulator applied."""
        return self.applied / self.churn_seconds if self.churn_seconds > 0 else 0.0

    def rate_shortfall(self, tolerance: float) -> str | None:
        """What to say when the simulator applied less than ``1 - tolerance`` of the asked rate
        (the schedule then did not test the load it was asked for), or None."""
        if self.achieved_rate >= self.asked_rate * (1 - tolerance):
            return None
        return (f"RATE SHORT seed {self.seed}: the simulator applied {self.achieved_rate:.1f} changes/s, "
                f"{self.achieved_rate / self.asked_rate:.0%} of the asked {self.asked_rate:g}/s "
                f"(tolerance {tolerance:.0%})")

    def summary(self) -> str:
        lines = [f"seed {self.seed}: {self.changes} changes, {self.restarts} bridge starts, faults: "
                 + " ".join(self.faults),
                 f"  churn: asked {self.asked_rate:g}/s; the simulator applied {self.applied} changes in "
                 f"{self.churn_seconds:.1f} s = {self.achieved_rate:.1f}/s (slowest 5 s: "
                 f"{self.slowest_rate:.1f}/s); load average {self.load[0]:.1f} -> {self.load[1]:.1f} "
                 f"on {os.cpu_count()} CPUs" + (f"; timeline pushed back {self.pushed:.1f} s by its steps"
                                                if self.pushed else "")]
        for name, r in self.reports.items():
            (res,) = r.resources
            lines.append(f"  {name:9} events={res.events} objects={res.sink_objects}/{res.cluster_objects} "
                         f"missing={res.counts['missing']} phantom={res.counts['phantom']} "
                         f"stale={res.counts['stale']} altered={res.counts['altered']} "
                         f"order={res.counts['order_violations']} "
                         f"dup_ids={res.duplicate_ids} gaps={len(res.gap_markers)} "
                         f"lost_changes={self.lost.get(name, 0)} "
                         f"dead_letters={self.dead_lettered.get(name, 0)}")
        lines.extend(f"  PROBLEM {p}" for p in self.problems)
        return "\n".join(lines)


class BridgeProc:
    """``kube-event-bridge run --config FILE`` in its own process, on ports it binds itself
    (:class:`bridge.testing.processes.ServiceProcess`)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.process = ServiceProcess(config=config, log=log, cwd=ROOT)

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        return self.process.proc

    @property
    def starts(self) -> int:
        return self.process.starts

    async def start(self) -> None:
        await self.process.start()

    async def wait_ready(self, timeout: float = 20.0) -> bool:
        """Waits until ``/readyz`` answers 200 (synced or resumed, sinks up); False after ``timeout``
        or when the process exited. A fault schedule that killed the bridge again before it resumed
        would test start-up over and over and little else."""
        try:
            await self.process.wait_ready(timeout)
        except ProcessFailed:
            return False
        return True

    def alive(self) -> bool:
        return self.process.running

    async def kill(self) -> None:
        await self.process.kill()

    async def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (a graceful drain and final checkpoint); SIGKILL past ``timeout``."""
        with contextlib.suppress(ProcessFailed):
            return await self.process.stop(timeout)
        return self.process.returncode


def _dead_letter_subject(tag: str) -> str:
    return f"{tag}dl.events"


def _config(infra: Infra, tag: str, ns: str, work: Path, hook: Hook, setup: Setup) -> dict[str, Any]:
    retry = {"initial": 0.05, "max": 0.5}
    dead: dict[str, dict[str, Any]] = {"kafka": {}, "jetstream": {}, "webhook": {}}
    if setup.dead_letters:
        dead = {"kafka": {"dead_letter": {"kind": "kafka", "target": f"{tag}-dead"}},
                "jetstream": {"dead_letter": {"kind": "nats", "target": _dead_letter_subject(tag)}},
                "webhook": {"dead_letter": {"kind": "file", "target": str(work / "webhook-dead.jsonl")}}}
    buffer = {**({"capacity": setup.buffer_capacity} if setup.buffer_capacity is not None else {}),
              **({"spill_limit": setup.spill_limit} if setup.spill_limit is not None else {})}
    if buffer:
        for extra in dead.values():
            extra["buffer"] = buffer
    return {
        "cluster": CLUSTER,
        "kubernetes": {"kubeconfig": str(infra.kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": setup.resource, "namespace": ns}],
        "sinks": [
            {"name": "kafka", "kind": "kafka", "brokers": infra.tansu.bootstrap, "destination": tag,
             "linger_ms": 1, "retry": retry, **dead["kafka"]},
            {"name": "jetstream", "kind": "jetstream", "servers": [infra.nats.url],
             "destination": f"{tag}.{{namespace}}.{{name}}", "reconnect_wait": 0.2, "publish_timeout": 2,
             "stream": {"name": tag.upper(), "create": True}, "retry": retry, **dead["jetstream"]},
            {"name": "webhook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "timeout": 5, "retry": retry, **dead["webhook"]},
            {"name": "file", "kind": "file", "path": str(work / "events.jsonl")},
        ],
        "checkpoint": {"store": "file", "directory": str(work / "checkpoints"),
                       "interval": setup.checkpoint_interval, "spill_directory": str(work / "spill")},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "logging": {"level": "info", "format": "text"},
        "shutdown_deadline": 20,
    }


async def _dead_letter_stream(url: str, tag: str) -> None:
    """A stream capturing JetStream's dead-letter subject, so what is dead-lettered is kept (and
    published through JetStream, acknowledged by the stream) and can be read back."""
    import nats

    nc = await nats.connect(servers=[url])
    try:
        await nc.jetstream().add_stream(name=f"{tag.upper()}DL", subjects=[_dead_letter_subject(tag)])
    finally:
        await nc.close()


def _changes_of_records(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(uid, resourceVersion) of every event dead-lettered (records of sinks/deadletter.py: the event
    in ``message`` when structured, its attributes in ``headers`` when binary)."""
    out: set[tuple[str, str]] = set()
    for rec in records:
        attrs = {k.lower().replace("-", "_").removeprefix("ce_"): v
                 for k, v in (rec.get("headers") or {}).items()}
        msg = rec.get("message")
        if isinstance(msg, dict):
            attrs.update({k: v for k, v in msg.items() if isinstance(v, str)})
        if attrs.get("uid") and attrs.get("resourceversion"):
            out.add((str(attrs["uid"]), str(attrs["resourceversion"])))
    return out


def _read_kafka_raw(bootstrap: str, topic: str, idle: float = 3.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` as JSON, read until nothing came for ``idle`` seconds."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault-schedule-dead-letters",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: list[dict[str, Any]] = []
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return out
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        last = time.monotonic()
        while time.monotonic() - last < idle:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            last = time.monotonic()
            if isinstance(rec := _loads(msg.value()), dict):
                out.append(rec)
    finally:
        consumer.close()
    return out


async def _read_stream_raw(url: str, stream: str) -> list[dict[str, Any]]:
    """Every message of a JetStream stream as JSON."""
    import nats

    nc = await nats.connect(servers=[url])
    out: list[dict[str, Any]] = []
    try:
        js = nc.jetstream(timeout=30)
        info = await js.stream_info(stream)
        if int(info.state.messages) == 0:
            return out
        last = int(info.state.last_seq)
        sub = await js.subscribe("", stream=stream, ordered_consumer=True)
        while True:
            msg = await sub.next_msg(timeout=30)
            if isinstance(rec := _loads(msg.data), dict):
                out.append(rec)
            if int(msg.metadata.sequence.stream) >= last:
                break
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


async def _read_dead_letters(infra: Infra, tag: str, work: Path) -> dict[str, list[dict[str, Any]]]:
    """Every dead-letter destination, read back with its own client: Kafka's topic, the stream that
    captures JetStream's subject, the webhook's file."""
    path = work / "webhook-dead.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return {"kafka": await asyncio.to_thread(_read_kafka_raw, infra.tansu.bootstrap, f"{tag}-dead"),
            "jetstream": await _read_stream_raw(infra.nats.url, f"{tag.upper()}DL"),
            "webhook": [r for line in lines if isinstance(r := _loads(line), dict)]}


def _loads(raw: bytes | str | None) -> Any:
    try:
        return orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        return None


async def _sim_faults(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with http.post(f"{url}/_sim/faults", json=body) as resp:
        resp.raise_for_status()


async def _sim_rv(http: aiohttp.ClientSession, url: str) -> int:
    """The simulator's resourceVersion now (``GET /_sim/state``)."""
    async with http.get(f"{url}/_sim/state") as resp:
        resp.raise_for_status()
        return int((await resp.json())["resourceVersion"])


async def _post(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(url) as resp:
        resp.raise_for_status()


async def _checkpoint_rv(store: FileCheckpointStore, ident: str) -> int:
    try:
        cp = await store.load(ident)
    except Exception:  # a torn or missing file while the bridge writes: not yet
        return -1
    if cp is None:
        return -1
    try:
        return int(cp.resource_version)
    except ValueError:
        return -1


@dataclass
class _World:
    """What a fault schedule acts on."""

    infra: Infra
    bridge: BridgeProc
    hook: Hook
    http: aiohttp.ClientSession
    rng: random.Random
    faults: list[str]
    say: Callable[[str], None]


async def _random_faults(w: _World, duration: float, kinds: tuple[str, ...]) -> None:
    """Faults drawn one after another from ``kinds`` for ``duration`` seconds."""
    infra, bridge, hook, http, rng, faults = w.infra, w.bridge, w.hook, w.http, w.rng, w.faults
    end = time.monotonic() + duration
    while time.monotonic() < end:
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        kind = rng.choice(kinds)
        faults.append(kind)
        w.say(f"t={duration - (end - time.monotonic()):.1f}s fault {kind}")
        if kind == "kill":
            await bridge.kill()
            await asyncio.sleep(rng.uniform(0.0, 0.8))
            await bridge.start()
            await bridge.wait_ready()  # it resumes before the next fault
            await asyncio.sleep(rng.uniform(0.0, 1.0))
        elif kind == "kill_compact":
            await bridge.kill()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await _post(http, f"{infra.sim_url}/_sim/compact")
            await bridge.start()
            await bridge.wait_ready()
            await asyncio.sleep(rng.uniform(0.0, 1.0))
        elif kind == "kafka_pause":
            await asyncio.to_thread(infra.tansu.pause)
            try:
                await asyncio.sleep(rng.uniform(0.3, 2.0))
            finally:
                await asyncio.to_thread(infra.tansu.resume)
        elif kind == "nats_restart":
            proc = infra.nats.proc
            # SIGTERM: nats-server flushes its file store; SIGKILL after 5 s. In a thread, as every
            # broker step: waiting in the loop stalled the churn and the webhook receiver.
            await asyncio.to_thread(infra.nats.stop)
            if proc is not None and proc.returncode == -signal.SIGKILL:
                # What the server acknowledged in its last moments may be gone: the broker's
                # loss, not the bridge's. Named in the outcome so a JetStream finding is read so.
                faults[-1] = "nats_restart:sigkilled"
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            await asyncio.to_thread(infra.nats.start)
        elif kind == "hook_storm":
            hook.status = rng.choice((500, 503, 429))
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            hook.status = 200
        elif kind == "watch_cut":
            await _sim_faults(http, infra.sim_url, {"watch_cut_after": rng.randrange(0, 30)})
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            await _sim_faults(http, infra.sim_url, {"reset": True})
        elif kind == "expire":
            await _post(http, f"{infra.sim_url}/_sim/expire-watches")
        elif kind == "garble":
            await _sim_faults(http, infra.sim_url, {"watch_garble_after": rng.randrange(0, 20)})
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            await _sim_faults(http, infra.sim_url, {"reset": True})


async def _kill_and_restart(w: _World, label: str, down: float) -> None:
    w.faults.append(label)
    w.say(f"fault {label}")
    await w.bridge.kill()
    await asyncio.sleep(down)
    await w.bridge.start()
    await w.bridge.wait_ready()


COMBINED_TIMELINE: tuple[tuple[float, str], ...] = (
    (3, "kill:before"), (5, "outages:kafka+nats+webhook"), (8, "nats:down"), (12, "webhook:503+429"),
    (15, "expire:0"), (17, "expire:1"), (19, "kill:during"), (21, "expire:2"), (28, "nats:up"),
    (32, "webhook:up"), (35, "kafka:up"), (38, "kill:draining"), (41, "watch_cut"), (47, "watch:whole"),
    (50, "kill:after"), (52, "end"))
"""Issue 34's incident, in seconds from the churn's start (times ``scale``): a SIGKILL; Kafka frozen
(SIGSTOP, connections open, nothing answered); NATS stopped; the webhook answering 503 (30 % 429 with
``Retry-After: 1``); a 410 into the open watches three times, each relist's list answered 0.6 s
late (the changes meanwhile coalesced), a SIGKILL between them; NATS, then the
webhook, then Kafka back; a SIGKILL while the backlogs drain; watch streams cut after 30 lines for
six seconds; a last SIGKILL."""


REFUSE_LISTS = {"error_code": 503, "error_count": 1000000, "error_target": "list", "error_retry_after": 0}
"""The simulator's fault that answers every list 503 (watches go on) until reset."""


async def _combined_step(w: _World, what: str) -> None:
    infra, hook = w.infra, w.hook
    if what.startswith("kill:"):
        await _kill_and_restart(w, what, w.rng.uniform(0.2, 1.0))
        return
    if what != "end":
        w.faults.append(what)
        w.say(f"fault {what}")
    if what.startswith("outages:"):
        await asyncio.to_thread(infra.tansu.pause)
    elif what == "nats:down":
        await asyncio.to_thread(infra.nats.stop)
    elif what == "webhook:503+429":
        hook.status, hook.throttle = 503, 0.3
    elif what.startswith("expire:"):
        # The relist's list answered late, as a big list under load is: the changes made meanwhile
        # are coalesced into the states it sends (the incident's windows were 260-360 changes wide).
        await _sim_faults(w.http, infra.sim_url, REFUSE_LISTS)
        await _post(w.http, f"{infra.sim_url}/_sim/expire-watches")
        await asyncio.sleep(0.6)
        await _sim_faults(w.http, infra.sim_url, {"reset": True})
    elif what == "nats:up":
        await asyncio.to_thread(infra.nats.start)
    elif what == "webhook:up":
        hook.status, hook.throttle = 200, 0.0
    elif what == "kafka:up":
        await asyncio.to_thread(infra.tansu.resume)
    elif what == "watch_cut":
        await _sim_faults(w.http, infra.sim_url, {"watch_cut_after": 30})
    elif what == "watch:whole":
        await _sim_faults(w.http, infra.sim_url, {"reset": True})


async def _combined_faults(w: _World, scale: float) -> float:
    """Every fault at once, as an incident brings them: :data:`COMBINED_TIMELINE` at ``scale``
    (1.0: the incident's 52 s; Kafka frozen 30 s, NATS down 20 s, the webhook refusing 20 s).

    Each gap is counted from the end of the step before: a SIGKILL step lasts until the bridge is
    ready again, which on a loaded machine takes 10-20 s instead of one, and counted from the
    timeline's start the steps after it would all come at once (Kafka frozen, NATS stopped, the
    webhook refusing and three 410s within a second, the relists racing the restart). Returns
    how many seconds the steps pushed the timeline back."""
    start = time.monotonic()
    pushed = 0.0
    try:
        for at, what in COMBINED_TIMELINE:
            due = start + at * scale + pushed
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await _combined_step(w, what)
            pushed = time.monotonic() - start - at * scale  # the next gap counts from here
    finally:
        w.hook.status, w.hook.throttle = 200, 0.0
        if w.infra.nats.proc is None:
            await asyncio.to_thread(w.infra.nats.start)
        await asyncio.to_thread(w.infra.tansu.resume)
        with contextlib.suppress(Exception):
            await _sim_faults(w.http, w.infra.sim_url, {"reset": True})
    return pushed


async def run_seed(infra: Infra, seed: int, duration: float, workdir: Path,
                   say: Callable[[str], None] = lambda _: None, kinds: tuple[str, ...] = FAULTS,
                   profile: str = "random", scale: float = 1.0, setup: Setup | None = None) -> Outcome:
    """One schedule: churn + faults for ``duration`` seconds (profile ``random``) or the combined
    profile at ``scale`` (1.0: Kafka frozen 30 s, NATS down 20 s, the webhook refusing for 20 s),
    drain, verify every sink and read every dead letter back. ``kinds`` narrows the random faults
    drawn (to bisect a failure; the test suite always draws from all); ``setup`` defaults to the
    profile's (:data:`SETUPS`)."""
    setup = setup or SETUPS[profile]
    rng = random.Random(seed)
    tag = f"fs{seed}x{random.Random().randrange(1 << 20):05x}"
    ns = tag
    work = workdir / tag
    work.mkdir(parents=True)
    hook = Hook(work / "webhook.jsonl")
    await hook.start()
    infra.tansu.create_topic(tag, partitions=3)
    if setup.dead_letters:
        infra.tansu.create_topic(f"{tag}-dead", partitions=1)
        await _dead_letter_stream(infra.nats.url, tag)
    cfg = work / "config.yaml"
    cfg.write_text(orjson.dumps(_config(infra, tag, ns, work, hook, setup)).decode())
    bridge = BridgeProc(cfg, work / "bridge.log")
    client = ApiClient.from_kubeconfig(str(infra.kubeconfig))
    store = FileCheckpointStore(directory=work / "checkpoints")
    ident = informer_id(setup.resource, ns, "", "")
    # Not the ApiClient: its rate limit (50 requests a second by default) kept every schedule below
    # 60 changes/s whatever rate it asked for.
    workers = churn_workers(setup)
    writer = ChurnWriter(infra.sim_url, connections=workers)
    churn = Churn(client=writer, namespace=ns, rng=random.Random(rng.random()), names=setup.objects,
                  rate=setup.rate, resource=setup.resource, workers=workers)
    faults: list[str] = []
    problems: list[str] = []
    lost_counts: dict[str, int] = {}
    dead_counts: dict[str, int] = {}
    applied, load, pushed = 0, (0.0, 0.0), 0.0
    churn_task: asyncio.Task[None] | None = None
    http = aiohttp.ClientSession()
    try:
        await client.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        await bridge.start()
        deadline = time.monotonic() + 30
        while await _checkpoint_rv(store, ident) < 0:  # started, synced, checkpointed once
            if not bridge.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the bridge did not come up; see {bridge.log}")
            await asyncio.sleep(0.05)
        rv_before = await _sim_rv(http, infra.sim_url)
        load_before = os.getloadavg()[0]
        churn_task = asyncio.create_task(churn.run(), name=f"fault-churn-{seed}")
        world = _World(infra=infra, bridge=bridge, hook=hook, http=http, rng=rng, faults=faults,
                       say=lambda m: say(f"seed {seed} {m}"))
        if profile == "combined":
            pushed = await _combined_faults(world, scale)
        else:
            await _random_faults(world, duration, kinds)
        churn.stop()
        await churn_task
        churn_task = None
        applied = await _sim_rv(http, infra.sim_url) - rv_before
        load = (load_before, os.getloadavg()[0])
        if applied != len(churn.produced):
            say(f"seed {seed}: the simulator applied {applied} changes, the churn saw "
                f"{len(churn.produced)} answered")
        if not bridge.alive():
            await bridge.start()
        last = int(churn.produced[-1][3]) if churn.produced else 0
        say(f"seed {seed}: churn stopped at rv {last} after {len(churn.produced)} changes; draining")
        deadline = time.monotonic() + 90
        while await _checkpoint_rv(store, ident) < last:
            if time.monotonic() > deadline:
                problems.append(f"drain: the checkpoint never reached rv {last} (at "
                                f"{await _checkpoint_rv(store, ident)}); a sink never acknowledged "
                                f"everything, see {bridge.log}")
                break
            if not bridge.alive():
                code = bridge.proc.returncode if bridge.proc else None
                problems.append(f"drain: the bridge exited with {code}; see {bridge.log}")
                break
            await asyncio.sleep(0.1)
        code = await bridge.stop()
        if code != 0:
            problems.append(f"the bridge's graceful stop exited with {code}")
        reports = await _verify_all(infra, tag, ns, work, churn, problems, setup, lost_counts, dead_counts)
    finally:
        churn.stop()
        if churn_task is not None:
            await asyncio.gather(churn_task, return_exceptions=True)
        with contextlib.suppress(Exception):
            infra.tansu.resume()  # a schedule cut short may have left it frozen
        if infra.nats.proc is None:
            infra.nats.start()
        await bridge.kill()
        with contextlib.suppress(Exception):
            await _sim_faults(http, infra.sim_url, {"reset": True})
        await http.close()
        await hook.stop()
        await client.close()
        await writer.close()
    return Outcome(seed=seed, faults=faults, changes=len(churn.produced), reports=reports,
                   problems=problems, restarts=bridge.starts, lost=lost_counts, dead_lettered=dead_counts,
                   asked_rate=setup.rate, applied=applied, churn_seconds=churn.ended - churn.started,
                   slowest_rate=churn.slowest_window(), load=load, pushed=pushed)


def gap_windows(contents: SinkContents) -> list[tuple[int, int]]:
    """The (from, to] resourceVersion windows the sink's gap markers announce (docs/event-format.md:
    ``gap.begin`` / ``gap.end`` carry ``gapid``, ``gapfrom`` and, once known, ``gapto``)."""
    bounds: dict[str, tuple[int, int]] = {}
    for ev in contents.events:
        if not event_kind(ev.ce).startswith("gap."):
            continue
        with contextlib.suppress(TypeError, ValueError):
            gid = str(ev.ce.get("gapid"))
            lo = int(str(ev.ce.get("gapfrom")))
            hi = int(str(ev.ce.get("gapto") or lo))
            old = bounds.get(gid, (lo, hi))
            bounds[gid] = (min(old[0], lo), max(old[1], hi))
    return list(bounds.values())


async def _verify_all(infra: Infra, tag: str, ns: str, work: Path, churn: Churn,
                      problems: list[str], setup: Setup, lost_counts: dict[str, int],
                      dead_counts: dict[str, int]) -> dict[str, VerifyReport]:
    """The oracle: every sink read back with its own client, checked against a list of the cluster;
    every dead-letter destination read back too (a lost change found there is named as such)."""
    client = ApiClient.from_kubeconfig(str(infra.kubeconfig))
    try:
        cluster = await list_cluster(client, [ResourceRequest(resource=setup.resource, namespace=ns)])
    finally:
        await client.close()
    sinks = {
        "kafka": await asyncio.to_thread(read_kafka, infra.tansu.bootstrap, [tag], timeout=60),
        "jetstream": await read_jetstream(infra.nats.url, tag.upper(), timeout=60),
        "webhook": await asyncio.to_thread(read_file, work / "webhook.jsonl"),
        "file": await asyncio.to_thread(read_file, work / "events.jsonl"),
    }
    dead = await _read_dead_letters(infra, tag, work) if setup.dead_letters else {}
    for name, records in dead.items():
        dead_counts[name] = len(records)
        with (work / f"dead-letters-{name}.jsonl").open("wb") as fh:
            fh.writelines(orjson.dumps(r) + b"\n" for r in records)
    reports: dict[str, VerifyReport] = {}
    # What each sink held, as read back (kept with the work files, for a post-mortem).
    with (work / "produced.jsonl").open("wb") as fh:
        fh.writelines(orjson.dumps(c) + b"\n" for c in churn.produced)
    for name, contents in sinks.items():
        with (work / f"readback-{name}.jsonl").open("wb") as fh:
            fh.writelines(orjson.dumps({"at": e.position, "ce": e.ce}, default=str) + b"\n"
                          for e in contents.events)
        report = verify(sink=contents.description, events=contents.events, cluster=cluster,
                        cluster_name=CLUSTER, undecodable=contents.undecodable, strict=True)
        reports[name] = report
        (r,) = report.resources
        for what in ("missing", "phantom", "stale", "altered", "order_violations"):
            if r.counts[what]:
                examples = {"missing": r.missing, "phantom": r.phantom, "stale": r.stale,
                            "altered": r.altered, "order_violations": r.order_violations}[what]
                problems.append(f"{name}: {r.counts[what]} {what}, e.g. {examples[:3]}")
        # A file may keep the torn line of a crash mid-write (ended on restart, its event written
        # again); anywhere else a record that is not a CloudEvent is a defect.
        if contents.undecodable and name != "file":
            problems.append(f"{name}: {len(contents.undecodable)} records that are not CloudEvents")
        # One gap id names one relist: two windows under one id are one event to a consumer that
        # drops repeated ids (JetStream keeps the first window and drops the other's markers).
        ends: dict[str, set[str]] = {}
        for e in contents.events:
            if event_kind(e.ce) == "gap.end":
                ends.setdefault(str(e.ce.get("gapid")), set()).add(str(e.ce.get("gapto")))
        reused = sorted(g for g, tos in ends.items() if len(tos) > 1)
        if reused:
            problems.append(f"{name}: gap ids naming several windows: {reused[:3]}")
        # Every change the churn made reached the sink, unless a gap marker says it was not observed.
        delivered = {(str(e.ce.get("uid")), str(e.ce.get("resourceversion"))) for e in contents.events
                     if event_kind(e.ce) in ("added", "updated", "deleted")}
        windows = gap_windows(contents)
        lost = [c for c in churn.produced if (c[2], c[3]) not in delivered
                and not any(lo < int(c[3]) <= hi for lo, hi in windows)]
        lost_counts[name] = len(lost)
        (work / f"lost-{name}.json").write_bytes(orjson.dumps({"lost": lost, "windows": sorted(windows)}))
        if lost:
            held = _changes_of_records(dead.get(name, []))
            there = sum((c[2], c[3]) in held for c in lost)
            problems.append(f"{name}: {len(lost)} changes never delivered outside any gap window, "
                            f"{there} of them in its dead letter ({len(dead.get(name, []))} records), "
                            f"e.g. {lost[:3]}")
        problems.extend(consumer_findings(name, contents, churn.produced))
    return reports


_CHANGE_KINDS = {"added": ChangeKind.CREATED, "updated": ChangeKind.UPDATED, "deleted": ChangeKind.DELETED}


def received_of(ce: dict[str, Any]) -> Received | None:
    """A CloudEvent read back, as the contract's specification reads it (None for other types)."""
    kind = event_kind(ce)
    gap_id = str(ce.get("gapid") or "")
    if kind in ("gap.begin", "gap.end"):
        return Received(kind, gap_id=gap_id, gap_from=int(str(ce.get("gapfrom") or 0)),
                        gap_to=int(str(ce.get("gapto") or 0)), scope_uid=scope_of(gap_id))
    if kind not in _CHANGE_KINDS:
        return None
    return Received(kind, key=str(ce.get("subject") or ""), uid=str(ce.get("uid") or ""),
                    rv=int(str(ce.get("resourceversion") or 0)),
                    inferred=ce.get("finalstateunknown") == "true", gap_id=gap_id)


def consumer_findings(name: str, contents: SinkContents,
                      produced: list[tuple[str, str, str, str]]) -> list[str]:
    """The contract's specification (:mod:`bridge.testing.spec`) on what the sink holds: what a
    consumer that drops repeated ids ends with (missing, phantom, stale), per-object order, states
    and deletes the churn never made. (Lost changes are checked above, against the windows the
    sink's own markers announce; a window a SIGKILL cut may lack its end.)"""
    history = History(changes=[Change(int(rv), _CHANGE_KINDS[kind], key, uid)
                               for kind, key, uid, rv in produced])
    events = [r for e in contents.events if (r := received_of(dict(e.ce))) is not None]
    found = [f for f in check_sink(history, SinkLog(name, list(events)))
             if f.kind in ("missing", "phantom", "stale", "order", "invented")]
    if not found:
        return []
    counts: dict[str, int] = {}
    for f in found:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return [f"{name}: a consumer dropping repeated ids: {counts}, e.g. {[str(f) for f in found[:3]]}"]


# --------------------------------------------------------------------------------------------------
# long runs


async def _main(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="keb-faults-"))
    failed: list[int] = []
    slow: list[int] = []
    seeds = [args.seed + i for i in range(args.seeds)]
    kinds = tuple(args.faults.split(",")) if args.faults else FAULTS
    base = SETUPS[args.profile]
    setup = Setup(resource=args.resource or base.resource, objects=args.objects or base.objects,
                  rate=args.rate or base.rate,
                  checkpoint_interval=args.checkpoint_interval or base.checkpoint_interval,
                  dead_letters=base.dead_letters if args.dead_letters is None else args.dead_letters,
                  buffer_capacity=args.buffer_capacity, spill_limit=args.spill_limit)
    print(f"setup: {setup}", flush=True)
    with infrastructure(workdir) as infra:
        for seed in seeds:
            outcome = await run_seed(infra, seed, args.duration, workdir,
                                     say=(lambda m: print(m, flush=True)) if args.verbose else lambda _: None,
                                     kinds=kinds, profile=args.profile, scale=args.scale, setup=setup)
            print(outcome.summary(), flush=True)
            if not outcome.ok:
                failed.append(seed)
                print(f"FAILED seed {seed}: replay with KEB_FAULT_SEED={seed} or --seed {seed} --seeds 1",
                      flush=True)
            if (short := outcome.rate_shortfall(args.rate_tolerance)) is not None:
                slow.append(seed)
                print(short, flush=True)
    if failed:
        print(f"failing seeds: {' '.join(map(str, failed))} (work files kept in {workdir})")
    if slow:
        print(f"seeds below the asked rate: {' '.join(map(str, slow))}: they did not test "
              f"{setup.rate:g} changes/s (the machine's load? see each seed's churn line)")
    if failed or slow:
        return 1
    if args.keep:
        print(f"work files kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(seeds)} passed, 0 failed")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/fault-schedule",
                                description="Run seeded random fault schedules against the bridge and "
                                            "check every sink with the verifier.")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="first seed (default: now)")
    p.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds to run (default 1)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of churn and faults per seed")
    p.add_argument("--faults", help="comma-separated fault kinds to draw from, to bisect a failure "
                                    f"(default: all of {','.join(FAULTS)})")
    p.add_argument("--profile", choices=PROFILES, default="random",
                   help="random: faults drawn one after another (default); combined: every sink's outage "
                        "at once with 410 storms and several SIGKILLs")
    p.add_argument("--scale", type=float, default=1.0,
                   help="combined profile: its timeline times this "
                        "(1.0: 52 s; Kafka frozen 30 s, NATS and webhook 20 s)")
    p.add_argument("--resource", choices=("configmaps", "pods"),
                   help="what the churn changes (default: the profile's; combined: pods, random: configmaps)")
    p.add_argument("--objects", type=int, help="how many names the churn uses (combined: 150, random: 25)")
    p.add_argument("--rate", type=float, help="changes per second (combined: 200, random: 80)")
    p.add_argument("--checkpoint-interval", type=float,
                   help="the bridge's checkpoint.interval in seconds (combined: 2, random: 0.2)")
    p.add_argument("--dead-letters", action=argparse.BooleanOptionalAction, default=None,
                   help="dead letters on every sink (Kafka: a topic on the same broker, JetStream: a NATS "
                        "subject, the webhook: a file), read back after the schedule (combined: on)")
    p.add_argument("--buffer-capacity", type=int,
                   help="every sink's buffer.capacity (default: the bridge's, 1024); smaller spills a "
                        "frozen sink's backlog sooner, as a higher rate would")
    p.add_argument("--spill-limit", type=int,
                   help="every sink's buffer.spill_limit in bytes (default: the bridge's, 256 MiB); a small "
                        "one degrades a frozen sink (overflow windows) instead of spilling all its backlog")
    p.add_argument("--rate-tolerance", type=float, default=0.05,
                   help="a seed whose churn the simulator applied at less than the asked rate by more than "
                        "this share is reported RATE SHORT and the run exits 1 (default 0.05)")
    p.add_argument("--verbose", action="store_true", help="print each fault as it is injected")
    p.add_argument("--keep", action="store_true",
                   help="keep the work files (logs, sink contents, nats-server log) of passing seeds too")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.seeds < 1 or args.scale <= 0:
        p.error("--duration and --scale must be positive and --seeds at least 1")
    if not 0 <= args.rate_tolerance < 1:
        p.error("--rate-tolerance must be at least 0 and below 1")
    if any(v is not None and v <= 0 for v in (args.objects, args.rate, args.checkpoint_interval,
                                              args.buffer_capacity)):
        p.error("--objects, --rate, --checkpoint-interval and --buffer-capacity must be positive")
    if args.spill_limit is not None and args.spill_limit < 0:
        p.error("--spill-limit must not be negative")
    unknown = set(args.faults.split(",")) - set(FAULTS) if args.faults else set()
    if unknown:
        p.error(f"--faults: unknown kind(s) {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())


