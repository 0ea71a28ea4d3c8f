"""Processes and bookkeeping for the crash tests: a simulator process, bridge processes, churn, and
the replay of what reached Kafka.

The processes are :mod:`bridge.testing.processes`'s (ports the child binds itself, SIGKILL / SIGTERM,
restart, waits on a log line or readiness); the sharding and workers harnesses run the service itself
(:class:`bridge.testing.processes.ServiceProcess`) over the same simulator and churn."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bridge.errors import ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.testing.files import written_events
from bridge.testing.processes import ChildProcess, SimulatorProcess
from tests.brokers import KafkaRecord

ROOT = Path(__file__).resolve().parents[2]
CE_PREFIX = "io.kube-event-bridge."
CHANGE_TYPES = ("added", "updated", "deleted")


def file_events(path: Path) -> list[dict[str, Any]]:
    """The CloudEvents a ``file`` sink wrote to ``path``, in order (none while it does not exist)."""
    return written_events(path)


def event_kind(event: dict[str, Any]) -> str:
    """An event's type without the bridge's prefix: ``added``, ``snapshot.begin``, ``gap.end`` …"""
    return str(event["type"]).removeprefix(CE_PREFIX)


@contextlib.asynccontextmanager
async def sim_process(tmp: Path, *, history_size: int = 1_000_000,
                      namespaces: tuple[str, ...] = ()) -> AsyncIterator[tuple[str, Path]]:
    """``python -m bridge.sim`` on a port it picks, with ``namespaces`` created; yields (url, kubeconfig)."""
    sim = SimulatorProcess(log=tmp / "sim.log", kubeconfig=tmp / "sim.kubeconfig", cwd=ROOT, args=(
        "--history-size", str(history_size), "--bookmark-interval", "1",
        "--namespaces", ",".join(("default", *namespaces))))
    async with sim:
        yield sim.url, sim.kubeconfig


START_GUARD = 600.0
"""How long :meth:`BridgeProcess.wait_synced` waits at most: only a guard against a hang, beyond the
test's own timeout (pytest-timeout), never a bound a slow start can reach. A start is an interpreter,
the bridge's imports and a list of the resource: on a loaded 2-core machine (load 20) a restart
wrote nothing in 30 s, the bound this had, and failed tests that were waiting for nothing but time."""


class BridgeProcess(ChildProcess):
    """One ``tests.checkpoint.bridge_proc`` process (the service's pipeline, no listener): prints
    ``synced`` once every cache synced, ``stopped`` after a graceful shutdown."""

    def __init__(self, args: list[str], log: Path) -> None:
        super().__init__(argv=(sys.executable, "-m", "tests.checkpoint.bridge_proc", *args), log=log,
                         cwd=ROOT)

    async def wait_synced(self, timeout: float = START_GUARD) -> None:
        """Waits for the current process to print ``synced`` (at once if it already did); fails at
        once when it exits first."""
        await self.wait_log("synced", timeout=timeout, whole_line=True)


@dataclass
class Churn:
    """Creates, updates and deletes ConfigMaps over HTTP, recording every change it caused."""

    client: ApiClient
    namespace: str
    names: int = 30
    rate: float = 150.0
    seed: int = 7
    produced: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(type, subject, uid, resourceVersion) of every change, in the order the server made them."""
    live: dict[str, str] = field(default_factory=dict)
    """name → uid of the objects that exist."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    def _record(self, type_: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        subject = f"{self.namespace}/{meta['name']}"
        self.produced.append((type_, subject, meta["uid"], meta["resourceVersion"]))

    async def step(self, rng: random.Random) -> None:
        name = f"cm-{rng.randrange(self.names)}"
        if name not in self.live:
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                    "data": {"v": str(rng.random())}}
            obj = await self.client.create(self.path, body)
            self.live[name] = obj["metadata"]["uid"]
            self._record("added", obj)
        elif rng.random() < 0.2:
            obj = await self.client.delete(f"{self.path}/{name}")
            del self.live[name]
            self._record("deleted", obj)
        else:
            obj = await self.client.patch(f"{self.path}/{name}", {"data": {"v": str(rng.random())}})
            self._record("updated", obj)

    async def run(self) -> None:
        rng = random.Random(self.seed)
        loop = asyncio.get_running_loop()
        start, done = loop.time(), 0
        while not self._stop.is_set():
            with contextlib.suppress(ConflictError, NotFoundError):
                await self.step(rng)
            done += 1
            ahead = done / self.rate - (loop.time() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)

    def stop(self) -> None:
        self._stop.set()

    @property
    def last_rv(self) -> str:
        return self.produced[-1][3] if self.produced else ""


@dataclass(frozen=True, slots=True)
class Delivered:
    type: str
    subject: str
    uid: str
    rv: str
    final_state_unknown: bool
    partition: int
    offset: int


def decode(records: list[KafkaRecord]) -> list[Delivered]:
    out: list[Delivered] = []
    for r in records:
        assert r.value is not None
        ce = orjson.loads(r.value)
        out.append(Delivered(
            type=str(ce["type"]).removeprefix(CE_PREFIX), subject=str(ce.get("subject", "")),
            uid=str(ce.get("uid", "")), rv=str(ce.get("resourceversion", "")),
            final_state_unknown=ce.get("finalstateunknown") == "true",
            partition=r.partition, offset=r.offset,
        ))
    return out


def replay(events: list[Delivered]) -> dict[str, tuple[str, str]]:
    """A consumer's view: per uid (= Kafka key, one partition, in order) the last event wins.
    Returns the live objects: uid → (subject, resourceVersion)."""
    state: dict[str, tuple[str, str] | None] = {}
    for e in sorted(events, key=lambda e: (e.partition, e.offset)):
        if e.type not in CHANGE_TYPES:
            continue
        state[e.uid] = None if e.type == "deleted" else (e.subject, e.rv)
    return {uid: s for uid, s in state.items() if s is not None}


async def live_objects(client: ApiClient, namespace: str) -> dict[str, tuple[str, str]]:
    listed = await client.get(f"/api/v1/namespaces/{namespace}/configmaps")
    return {i["metadata"]["uid"]: (f"{namespace}/{i['metadata']['name']}", i["metadata"]["resourceVersion"])
            for i in listed["items"]}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
