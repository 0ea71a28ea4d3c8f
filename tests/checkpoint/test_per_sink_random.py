"""Random histories against per-sink progress: whatever each sink acknowledged, whenever the bridge
crashed, each sink ends with exactly the cluster's objects (no phantom, nothing missing or stale).

In-process against the simulator over HTTP: three sinks that acknowledge at random (in any order,
some barely at all), churn of a few ConfigMaps (creates, updates, deletes, re-creations under new
uids), checkpoint writes at random points, crashes (:meth:`BridgePipeline.abort`: nothing drained),
changes while the bridge is down and compactions of the history (the resume gets 410 and relists).
After every crash, whatever a sink holds must be known to the checkpoint's base or the journal.
A sink's contents are every event it was handed, in order — an event delivered but never
acknowledged counts as landed (the worst case for a lost delete). Seeds are fixed; a short run is
CI's, ``KEB_PER_SINK_SEEDS=N`` runs more (``KEB_PER_SINK_SEED_BASE=B``: seeds B..B+N-1).

``KEB_PER_SINK_STRESS=1`` makes timing races likelier, still seeded: sinks that yield to the event
loop a random number of times before taking an event, acknowledgements also from a task of their
own at random moments, periodic checkpoint writes every few milliseconds (so a crash may come in the
middle of one, or of the journal's compaction after it), now and then a slow write of the checkpoint
file or the journal (its thread still busy when the crash comes), more runs per history and a crash
at a random moment after the churn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from bridge.errors import ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.blob_file import FileBlobStore
from bridge.storage.checkpoint import FileCheckpointStore
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType
from tests.checkpoint.helpers import RecordingSink, until
from tests.checkpoint.test_per_sink_progress import IDENT, PATH, pipeline, sim

__all__ = ["sim"]  # the simulator fixture

SINKS = ("a", "b", "c")
NAMES = tuple(f"r{i}" for i in range(6))
SEEDS = int(os.environ.get("KEB_PER_SINK_SEEDS", "4"))
SEED_BASE = int(os.environ.get("KEB_PER_SINK_SEED_BASE", "0"))
STRESS = os.environ.get("KEB_PER_SINK_STRESS", "") == "1"

Held = dict[str, tuple[str, str]]
"""name → (uid, resourceVersion) a sink holds."""


def fold(held: Held, sink: RecordingSink, story: list[tuple[str, ...]] | None = None) -> None:
    """Applies the change events ``sink`` was handed, in order, to what it holds (and tells them,
    with the gap markers and the end of the run, to ``story``)."""
    for e in sink.events:
        if story is not None:
            story.append((sink.name, e.type.value, e.name, e.uid, e.resource_version,
                          "fsu" if e.final_state_unknown else ""))
        if e.type in (EventType.ADDED, EventType.UPDATED):
            held[e.name] = (e.uid, e.resource_version)
        elif e.type is EventType.DELETED and held.get(e.name, ("",))[0] == e.uid:
            del held[e.name]
    if story is not None:
        story.append((sink.name, "crash"))


async def churn(client: ApiClient, rng: random.Random) -> None:
    name = rng.choice(NAMES)
    roll = rng.random()
    try:
        if roll < 0.4:
            await client.create(PATH, {"metadata": {"name": name}, "data": {"v": "0"}})
        elif roll < 0.75:
            await client.patch(f"{PATH}/{name}", {"data": {"v": str(rng.randrange(1000))}})
        else:
            await client.delete(f"{PATH}/{name}")
    except (ConflictError, NotFoundError):
        pass


def ack_some(sink: RecordingSink, rng: random.Random, keen: float) -> None:
    """Acknowledges a random part of what ``sink`` holds unacknowledged, in any order."""
    if not sink.unacked or rng.random() > keen:
        return
    rng.shuffle(sink.unacked)
    cut = rng.randrange(len(sink.unacked) + 1)
    done, sink.unacked = sink.unacked[:cut], sink.unacked[cut:]
    for _, ack in done:
        ack(DeliveryOutcome.DELIVERED)


class JitterySink(RecordingSink):
    """Yields to the event loop a random number of times before taking each event (stress mode)."""

    def __init__(self, name: str, rng: random.Random) -> None:
        super().__init__(name, auto_ack=False)
        self.rng = rng

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        for _ in range(self.rng.choice((0, 0, 1, 3))):
            await asyncio.sleep(0)
        await super().deliver(event, ack)


async def acker(sinks: list[RecordingSink], rng: random.Random, keen: dict[str, float]) -> None:
    """Acknowledges at random moments, beside the churn loop's own acknowledgements (stress mode)."""
    while True:
        await asyncio.sleep(rng.choice((0, 0.001, 0.004)))
        sink = rng.choice(sinks)
        ack_some(sink, rng, keen[sink.name])


class SlowFileStore(FileCheckpointStore):
    """The file store with slow writes now and then, its journal too (stress mode)."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        class Slow(FileBlobStore):
            def _replace(self, path: Path, data: bytes) -> None:
                time.sleep(rng.choice((0, 0, 0, 0.05, 0.3)))
                super()._replace(path, data)

            def _append(self, fd: int, data: bytes) -> None:
                time.sleep(rng.choice((0, 0, 0, 0, 0.05)))
                super()._append(fd, data)

        super().__init__(directory=directory, files=Slow)


def journal_text(ckpt: Path) -> str:
    return "".join(path.read_text() for path in sorted(ckpt.glob("*.journal")))


async def unknown_after_crash(ckpt: Path, held: dict[str, Held]) -> dict[str, Held]:
    """Per sink, what it holds that neither the checkpoint's base nor the journal knows after a
    crash. The journal's invariant (``bridge/delivery/journal.py``) says there is nothing: every
    object any sink may have received is known to the last checkpoint written or to the journal —
    else its delete is lost should it be deleted while the bridge is down past the history. Checked
    at every crash, a breach shows at the crash that made it, not only when a later history happens
    to need the lost delete."""
    cp = await FileCheckpointStore(directory=ckpt).load(IDENT)
    alive = dict(cp.objects) if cp is not None else {}
    for key, (uid, rv, deleted) in (cp.ahead if cp is not None else {}).items():
        if deleted:
            alive.pop(key, None)
        else:
            alive[key] = (uid, rv)
    known = {uid for uid, _ in alive.values()}
    for line in journal_text(ckpt).splitlines()[1:]:
        with contextlib.suppress(ValueError, IndexError):  # a torn last line
            known.add(json.loads(line)[2])
    unknown = {name: {k: v for k, v in objects.items() if v[0] not in known}
               for name, objects in held.items()}
    return {name: objects for name, objects in unknown.items() if objects}


async def history(seed: int, client: ApiClient, ckpt: Path, story: list[tuple[str, ...]]
                  ) -> dict[str, Held]:
    rng = random.Random(seed)
    held: dict[str, Held] = {name: {} for name in SINKS}
    for run in range(rng.randint(6, 10) if STRESS else rng.randint(3, 5)):
        keen = {name: rng.choice((0.05, 0.3, 0.9)) for name in SINKS}
        side = random.Random(f"{seed}:{run}")
        sinks: list[RecordingSink] = [
            JitterySink(name, random.Random(f"{seed}:{run}:{name}")) if STRESS
            else RecordingSink(name, auto_ack=False) for name in SINKS]
        p = await pipeline(client, ckpt, sinks,
                           checkpoint_interval=side.choice((0.002, 0.01, 0.03)) if STRESS else 3600,
                           store=SlowFileStore(ckpt, random.Random(f"{seed}:{run}:io")) if STRESS else None)
        await p.start()
        acking = asyncio.create_task(acker(sinks, side, keen)) if STRESS else None
        try:
            assert await p.wait_for_sync(10)
            for _ in range(rng.randint(5, 25)):
                await churn(client, rng)
                await asyncio.sleep(rng.choice((0, 0.005, 0.02)))
                for sink in sinks:
                    ack_some(sink, rng, keen[sink.name])
                if rng.random() < 0.25 and not STRESS:  # under stress the periodic writer does it
                    await p.write_checkpoints()
            if STRESS:
                await asyncio.sleep(side.choice((0, 0, 0.001, 0.003, 0.01)))
        finally:
            if acking is not None:
                acking.cancel()
            await p.abort()
        for sink in sinks:
            fold(held[sink.name], sink, story)
        unknown = await unknown_after_crash(ckpt, held)
        assert not unknown, (f"seed {seed}, crash {run}: sinks hold objects no store knows: {unknown}; "
                             f"checkpoint {await FileCheckpointStore(directory=ckpt).load(IDENT)!r}, "
                             f"journal {journal_text(ckpt)!r}; {story}")
        for _ in range(rng.choice((0, 0, 3, 8))):
            await churn(client, rng)
        if rng.random() < 0.5:
            await client.request("POST", "/_sim/compact")
    # The last run: every sink acknowledges, until the checkpoint passed the cluster's state.
    story.append(("checkpoint", repr(await FileCheckpointStore(directory=ckpt).load(IDENT))))
    story.append(("journal", journal_text(ckpt)))
    sinks = [RecordingSink(name) for name in SINKS]
    p = await pipeline(client, ckpt, sinks)
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        await churn(client, rng)
        marker = await client.create(PATH, {"metadata": {"name": f"marker-{seed}"}})
        rv = int(marker["metadata"]["resourceVersion"])
        tracker = p.tracker(IDENT)
        await until(lambda: tracker.resource_version.isdigit() and int(tracker.resource_version) >= rv
                    and tracker.lag == 0, what="everything acknowledged")
    finally:
        await p.shutdown(5)
    for sink in sinks:
        fold(held[sink.name], sink, story)
    return held


@pytest.mark.parametrize("seed", range(SEED_BASE, SEED_BASE + SEEDS))
async def test_every_sink_ends_with_the_clusters_objects(sim: tuple[Simulator, ApiClient], tmp_path: Path,
                                                         seed: int) -> None:
    _, client = sim
    story: list[tuple[str, ...]] = []
    held = await history(seed, client, tmp_path / "ckpt", story)
    listed = await client.get(PATH)
    cluster = {o["metadata"]["name"]: (o["metadata"]["uid"], o["metadata"]["resourceVersion"])
               for o in listed["items"]}
    for name in SINKS:
        phantom = {k: v for k, v in held[name].items() if cluster.get(k, ("",))[0] != v[0]}
        missing = {k: v for k, v in cluster.items() if held[name].get(k, ("",))[0] != v[0]}
        stale = {k: (held[name][k], v) for k, v in cluster.items() if k in held[name]
                 and held[name][k][0] == v[0] and held[name][k] != v}
        bad = set(phantom) | set(missing) | set(stale)
        told = [line for line in story if line[0] in ("checkpoint", "journal")
                or (line[0] == name and (len(line) < 3 or line[2] in bad or not line[2]))]
        assert (phantom, missing, stale) == ({}, {}, {}), f"sink {name}, seed {seed}: {told}"


class HeldStore(FileCheckpointStore):
    """The file store whose journal's first rewrite (the start-up compaction) waits in its thread
    until ``go`` is set."""

    def __init__(self, directory: Path) -> None:
        self.inside, self.go = threading.Event(), threading.Event()
        store = self

        class Held(FileBlobStore):
            def _replace(self, path: Path, data: bytes) -> None:
                if path.suffix == ".journal" and not store.go.is_set():
                    store.inside.set()
                    store.go.wait()
                super()._replace(path, data)

        super().__init__(directory=directory, files=Held)


async def test_a_crash_leaves_no_store_write_in_flight(sim: tuple[Simulator, ApiClient],
                                                      tmp_path: Path) -> None:
    """The crashes above are :meth:`BridgePipeline.abort`: in one process, a crash only if nothing
    of the aborted pipeline reaches the store afterwards. A journal write in its thread when the
    abort comes finishes before ``abort`` returns; landing later, it would replace the journal of
    the pipeline started next (the records of objects its sinks then received: their deletes lost
    after the next crash)."""
    _, client = sim
    store = HeldStore(tmp_path / "ckpt")
    p = await pipeline(client, tmp_path / "ckpt", [RecordingSink("a")], store=store)
    await p.start()
    try:
        await until(store.inside.is_set, what="the journal's start-up rewrite in its thread")
        aborting = asyncio.create_task(p.abort())
        for _ in range(50):
            await asyncio.sleep(0)
        returned_with_the_write_in_flight = aborting.done()
    finally:
        store.go.set()
        await p.abort()
    assert not returned_with_the_write_in_flight
