"""Random histories against per-sink progress: whatever each sink acknowledged, whenever the bridge
crashed, each sink ends with exactly the cluster's objects (no phantom, nothing missing or stale).

In-process against the simulator over HTTP: three sinks that acknowledge at random (in any order,
some barely at all), churn of a few ConfigMaps (creates, updates, deletes, re-creations under new
uids), checkpoint writes at random points, crashes (:meth:`BridgePipeline.abort`: nothing drained),
changes while the bridge is down and compactions of the history (the resume gets 410 and relists).
A sink's contents are every event it was handed, in order — an event delivered but never
acknowledged counts as landed (the worst case for a lost delete). Seeds are fixed; a short run is
CI's, ``KEB_PER_SINK_SEEDS=N`` runs more.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from bridge.delivery.checkpoint import FileCheckpointStore
from bridge.errors import ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from sinks.contract import DeliveryOutcome, EventType
from tests.checkpoint.helpers import RecordingSink, until
from tests.checkpoint.test_per_sink_progress import IDENT, PATH, pipeline, sim

__all__ = ["sim"]  # the simulator fixture

SINKS = ("a", "b", "c")
NAMES = tuple(f"r{i}" for i in range(6))
SEEDS = int(os.environ.get("KEB_PER_SINK_SEEDS", "4"))

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


def journal_text(ckpt: Path) -> str:
    return "".join(path.read_text() for path in sorted(ckpt.glob("*.journal")))


async def history(seed: int, client: ApiClient, ckpt: Path, story: list[tuple[str, ...]]
                  ) -> dict[str, Held]:
    rng = random.Random(seed)
    held: dict[str, Held] = {name: {} for name in SINKS}
    for _run in range(rng.randint(3, 5)):
        keen = {name: rng.choice((0.05, 0.3, 0.9)) for name in SINKS}
        sinks = [RecordingSink(name, auto_ack=False) for name in SINKS]
        p = await pipeline(client, ckpt, sinks)
        await p.start()
        try:
            assert await p.wait_for_sync(10)
            for _ in range(rng.randint(5, 25)):
                await churn(client, rng)
                await asyncio.sleep(rng.choice((0, 0.005, 0.02)))
                for sink in sinks:
                    ack_some(sink, rng, keen[sink.name])
                if rng.random() < 0.25:
                    await p.write_checkpoints()
        finally:
            await p.abort()
        for sink in sinks:
            fold(held[sink.name], sink, story)
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


@pytest.mark.parametrize("seed", range(SEEDS))
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
