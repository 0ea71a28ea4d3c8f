"""Resharding, in-process against the simulator over real HTTP: shards whose checkpoints stopped at
different resourceVersions hand their objects over to a new total with no change lost, none sent
twice, no spurious ``added``; and the take-over as a function over checkpoints (docs/sharding.md)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline, WatchedResource, http_informer_builder
from bridge.delivery.sharding import (
    filter_checkpoint,
    merge_checkpoints,
    parse_shard_id,
    plan_handover,
    shard_id,
    stale_ready,
    take_over,
)
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.leaderelection import FenceToken
from bridge.kube.sharding import ShardFilter, shard_of
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointStore,
    FileCheckpointStore,
    SinkProgress,
    informer_id,
)
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from sinks.contract import EventType, ResourceRef
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until

NS = "reshard"
PATH = f"/api/v1/namespaces/{NS}/configmaps"
BASE = informer_id("configmaps", NS, "", "")
CHANGES = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[ApiClient]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.2) as (_, client):
        yield client


class Ledger:
    """Every change made, as the server answered it: (type, uid, resourceVersion)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.made: list[tuple[str, str, str]] = []

    def _note(self, type_: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.made.append((type_, obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]))
        return obj

    async def create(self, name: str) -> dict[str, Any]:
        return self._note("added", await self.client.create(PATH, {"metadata": {"name": name},
                                                                   "data": {"v": "0"}}))

    async def update(self, name: str, v: str) -> dict[str, Any]:
        return self._note("updated", await self.client.patch(f"{PATH}/{name}", {"data": {"v": v}}))

    async def delete(self, name: str) -> dict[str, Any]:
        return self._note("deleted", await self.client.delete(f"{PATH}/{name}"))

    @property
    def last_rv(self) -> int:
        return int(self.made[-1][2])


def store_for(client: ApiClient, ckpt: Path) -> CheckpointStore:
    """The file store in ``ckpt``, or, when ``ckpt`` is named ``configmap``, the ConfigMap store in
    the simulator (what a StatefulSet's shards share in a cluster), in a namespace not watched."""
    if ckpt.name == "configmap":
        return ConfigMapCheckpointStore(client=client, namespace="default", name_prefix="keb")
    return FileCheckpointStore(directory=ckpt)


async def shard(client: ApiClient, ckpt: Path, ordinal: int, total: int
                ) -> tuple[BridgePipeline, RecordingSink]:
    api = await Discovery(client=client).resolve("configmaps")
    ref = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
    watched = WatchedResource(key=InformerKey("configmaps", namespace=NS), api=api, ref=ref,
                              shard=ShardFilter(ordinal=ordinal, total=total))
    sink = RecordingSink("rec")  # one configuration for every shard: its progress moves with them
    pipeline = BridgePipeline(
        build_informer=http_informer_builder(client=client, clock=RealClock(), compact_cache=True),
        resources=[watched], sinks=[sink], checkpoint_store=store_for(client, ckpt),
        checkpoint_interval=0.05, cluster="sim")
    await pipeline.start()
    assert await pipeline.wait_for_sync(10)
    return pipeline, sink


async def run_until(pipeline: BridgePipeline, rv: int) -> None:
    """Until the pipeline's checkpoint reaches ``rv`` (everything before it acknowledged and saved)."""
    (ident,) = pipeline.informers
    await until(lambda: int(pipeline.stats().checkpoint_rv[ident] or 0) >= rv, what=f"checkpoint at {rv}")


def changes(sink: RecordingSink) -> list[tuple[str, str, str]]:
    return [(e.type.value, e.uid, e.resource_version) for e in sink.events if e.type in CHANGES]


@pytest.mark.parametrize("store", ["file", "configmap"])
async def test_reshard_2_to_1_with_checkpoints_apart(sim: ApiClient, tmp_path: Path, store: str) -> None:
    """Shard 1 of 2 runs on alone while shard 0 is down, so their checkpoints stop far apart; the
    single shard that follows must resume from shard 0's older point, deliver shard 0's missed
    changes, and skip everything shard 1 had already delivered (no spurious ``added`` of the
    objects shard 1 created and deleted meanwhile, no second ``deleted``)."""
    ckpt = tmp_path / store
    ledger = Ledger(sim)
    for i in range(16):
        await ledger.create(f"cm-{i}")
    p0, s0 = await shard(sim, ckpt, 0, 2)
    p1, s1 = await shard(sim, ckpt, 1, 2)
    await run_until(p0, ledger.last_rv)
    await run_until(p1, ledger.last_rv)
    await p0.shutdown(5)
    # Shard 0 is gone; shard 1 goes on: updates, creations, deletions of every kind of object.
    for i in range(16):
        await ledger.update(f"cm-{i}", "1")
    for i in range(16, 28):
        await ledger.create(f"cm-{i}")
    for i in range(20, 28):
        await ledger.delete(f"cm-{i}")
    for i in range(0, 6):
        await ledger.delete(f"cm-{i}")
    await run_until(p1, ledger.last_rv)
    await p1.shutdown(5)
    uids = {u for _, u, _ in ledger.made}
    assert {shard_of(u, 2) for u in uids} == {0, 1}
    # What shard 1 delivered in its own run: its objects' changes only.
    assert all(shard_of(u, 2) == 1 for _, u, _ in changes(s1))
    assert all(shard_of(u, 2) == 0 for _, u, _ in changes(s0))

    # Reshard to one: it must take over both checkpoints.
    p, s = await shard(sim, ckpt, 0, 1)
    for i in range(6, 10):
        await ledger.update(f"cm-{i}", "2")
    await ledger.create("late")
    await run_until(p, ledger.last_rv)
    await p.shutdown(5)

    delivered = changes(s0) + changes(s1) + changes(s)
    counts = collections.Counter(delivered)
    assert {k: n for k, n in counts.items() if n > 1} == {}, "changes delivered twice"
    assert set(delivered) == set(ledger.made)
    # The single shard sent only what nobody had: shard 0's changes after it stopped, and the new ones.
    assert all(shard_of(u, 2) == 0 or int(rv) > int(ledger.made[-6][2]) for _, u, rv in changes(s))
    # Its first checkpoint past both old ones retires them: only the new shard's checkpoint is left.
    left = store_for(sim, ckpt)
    assert isinstance(left, FileCheckpointStore | ConfigMapCheckpointStore)
    assert await left.informer_ids(BASE) == [BASE]


async def test_list_is_shared_out_by_uid(sim: ApiClient, tmp_path: Path) -> None:
    """Three shards listing and watching the same namespace: each object reaches exactly one of them,
    the one its uid hashes to; the others decode nothing but its identity."""
    ledger = Ledger(sim)
    for i in range(30):
        await ledger.create(f"cm-{i}")
    shards = [await shard(sim, tmp_path / "ckpt", o, 3) for o in range(3)]
    for i in range(0, 30, 3):
        await ledger.update(f"cm-{i}", "1")
    await ledger.delete("cm-1")
    for p, _ in shards:
        await run_until(p, ledger.last_rv)
    per_shard = []
    for o, (p, s) in enumerate(shards):
        (ident,) = p.informers
        assert ident == shard_id(BASE, o, 3)
        cached = {obj["metadata"]["uid"] for obj in p.informers[ident].get_indexer().list()}
        assert all(shard_of(u, 3) == o for u in cached)
        per_shard.append({u for _, u, _ in changes(s)})
        await p.shutdown(5)
    assert set.union(*per_shard) == {u for _, u, _ in ledger.made}
    assert sum(len(x) for x in per_shard) == len(set.union(*per_shard))
    assert all(per_shard), "a shard got nothing: the hash does not spread"


# ---------------------------------------------------------------------------------------------------
# the take-over as a function over checkpoints


def cp(ident: str, rv: str, objects: dict[str, tuple[str, str]], written_at: float = 1.0,
       ahead: dict[str, tuple[str, str, bool]] | None = None) -> Checkpoint:
    return Checkpoint(informer_id=ident, resource_version=rv, objects=objects, written_at=written_at,
                      ahead=ahead or {})


UIDS = [f"uid-{i:03d}" for i in range(60)]


def test_shard_ids_round_trip() -> None:
    assert shard_id("pods.all.x", 0, 1) == "pods.all.x"
    assert shard_id("pods.all.x", 2, 3) == "pods.all.x.shard-2-of-3"
    assert parse_shard_id("pods.all.x", "pods.all.x.shard-2-of-3") == (2, 3)
    assert parse_shard_id("pods.all.x", "pods.all.x") == (0, 1)
    assert parse_shard_id("pods.all.x", "pods.all.xy.shard-0-of-2") is None
    assert parse_shard_id("pods.all.x", "pods.all.x.shard-3-of-3") is None


def test_every_uid_has_one_owner_at_every_total() -> None:
    for total in (1, 2, 3, 4, 7):
        owners = [[o for o in range(total) if ShardFilter(ordinal=o, total=total).owns(u)] for u in UIDS]
        assert all(len(x) == 1 for x in owners)
    # Stable across processes and releases: a known value.
    assert shard_of("5f1c1a52-7b9e-4c43-9a54-2d1f0b7c9e11", 1000) == shard_of(
        "5f1c1a52-7b9e-4c43-9a54-2d1f0b7c9e11", 1000)
    assert [shard_of(u, 4) for u in UIDS[:8]] == [shard_of(u, 4) for u in list(UIDS[:8])]


def three_shards(rvs: tuple[str, str, str]) -> dict[str, Checkpoint]:
    stored = {}
    for o in range(3):
        ident = shard_id("b", o, 3)
        mine = {f"ns/{u}": (u, "10") for u in UIDS if shard_of(u, 3) == o}
        stored[ident] = cp(ident, rvs[o], mine)
    return stored


def test_handover_3_to_4_takes_owned_objects_and_the_oldest_resume_point() -> None:
    stored = three_shards(("100", "80", "120"))
    seen: set[str] = set()
    for o in range(4):
        plan = plan_handover(base="b", shard=ShardFilter(ordinal=o, total=4), stored=stored)
        assert plan.checkpoint is not None
        got = {uid for uid, _ in plan.checkpoint.objects.values()}
        assert got == {u for u in UIDS if shard_of(u, 4) == o}
        seen |= got
        # Resumes from the oldest checkpoint it takes objects from; floors are each source's point.
        sources = {int(stored[s].resource_version) for s in plan.sources}
        assert int(plan.checkpoint.resource_version) == min(sources)
        assert set(plan.floors.values()) <= {100, 80, 120}
        assert plan.stale == tuple(sorted(stored))
    assert seen == set(UIDS)


def test_a_newer_total_knows_better_than_an_older_one() -> None:
    """4 shards took over from 3 and one object was deleted since: the 3-shard checkpoints (not
    yet removed) still list it, the 4-shard one does not; going to 2 must not bring it back."""
    old = three_shards(("100", "100", "100"))
    new: dict[str, Checkpoint] = {}
    gone = UIDS[0]
    for o in range(4):
        ident = shard_id("b", o, 4)
        mine = {f"ns/{u}": (u, "150") for u in UIDS if shard_of(u, 4) == o and u != gone}
        new[ident] = cp(ident, "150", mine, written_at=2.0)
    for o in range(2):
        plan = plan_handover(base="b", shard=ShardFilter(ordinal=o, total=2), stored={**old, **new})
        assert plan.checkpoint is not None
        got = {uid for uid, _ in plan.checkpoint.objects.values()}
        assert got == {u for u in UIDS if shard_of(u, 2) == o and u != gone}
        assert all(s.endswith("-of-4") for s in plan.sources)
        assert plan.checkpoint.resource_version == "150"
        # Changes up to 150 were delivered for every residue (max over the covering checkpoints).
        assert set(plan.floors.values()) == {150}


def test_a_missing_old_shard_means_a_full_list() -> None:
    stored = three_shards(("100", "100", "100"))
    del stored[shard_id("b", 1, 3)]
    plans = [plan_handover(base="b", shard=ShardFilter(ordinal=o, total=2), stored=stored) for o in range(2)]
    assert all(p.checkpoint is None and p.incomplete for p in plans)


def test_the_same_total_resumes_from_its_own_checkpoint() -> None:
    stored = three_shards(("100", "90", "80"))
    plan = plan_handover(base="b", shard=ShardFilter(ordinal=1, total=3), stored=stored)
    assert plan.checkpoint is stored[shard_id("b", 1, 3)]
    assert plan.stale == ()
    assert not plan.floors


def test_filter_and_merge() -> None:
    a = cp("a", "100", {"ns/x": ("ux", "90"), "ns/y": ("uy", "95")}, ahead={"ns/z": ("uz", "130", False),
                                                                         "ns/w": ("", "120", True)})
    b = cp("b", "110", {"ns/x": ("ux2", "105")})
    kept = filter_checkpoint(a, lambda uid: uid != "uy")
    assert dict(kept.objects) == {"ns/x": ("ux", "90")}
    assert dict(kept.ahead) == {"ns/z": ("uz", "130", False), "ns/w": ("", "120", True)}
    merged = merge_checkpoints("m", [kept, b])
    assert merged is not None
    assert merged.resource_version == "100"
    assert dict(merged.objects) == {"ns/x": ("ux2", "105")}  # the newer one on a key both know


def test_filter_and_merge_per_sink_sections() -> None:
    """Each sink's differences are filtered by the uid of the object they are about (a "gone" entry by
    the base's object of its key) and merged: the sink resumes from its oldest own point, what it
    knew beyond it elsewhere is kept per object, and it stays covered only where every part covers
    it."""
    a = dataclasses.replace(
        cp("a", "100", {"ns/x": ("ux", "90"), "ns/y": ("uy", "95"), "ns/v": ("uv", "80")}),
        sinks={"fast": SinkProgress(resource_version="150", objects={"ns/x": ("ux", "140"), "ns/y": None,
                                                                     "ns/v": None},
                                    ahead={"ns/n": ("un", "160", False)}),
               "slow": SinkProgress(), "new": SinkProgress()})
    kept = filter_checkpoint(a, lambda uid: uid not in ("uy", "un"))
    assert kept.sinks is not None
    assert dict(kept.sinks["fast"].objects) == {"ns/x": ("ux", "140"), "ns/v": None}  # not y's
    assert dict(kept.sinks["fast"].ahead) == {}
    b = dataclasses.replace(cp("b", "110", {"ns/p": ("up", "105"), "ns/q": ("uq", "107")}),
                            sinks={"fast": SinkProgress(resource_version="120", objects={"ns/q": None}),
                                   "slow": SinkProgress()})
    merged = merge_checkpoints("m", [kept, b])
    assert merged is not None
    assert merged.sinks is not None
    assert set(merged.sinks) == {"fast", "slow"}  # "new" is not covered by b: bootstrapped again
    assert merged.sinks["slow"].at_base
    fast = merged.sinks["fast"]
    assert fast.resource_version == "120"  # its oldest own point
    assert dict(fast.objects) == {"ns/q": None}  # gone at b's own point, which is the merged one
    # What it knew beyond 120 in a: x at 140, v gone at a's own point 150.
    assert dict(fast.ahead) == {"ns/x": ("ux", "140", False), "ns/v": ("", "150", True)}
    # Format-1 parts cover every sink at their base.
    old = merge_checkpoints("m", [cp("c", "90", {"ns/r": ("ur", "85")}), b])
    assert old is not None
    assert old.sinks is not None
    assert set(old.sinks) == {"fast", "slow"}
    assert old.sinks["fast"].resource_version == ""  # 90, the base of the format-1 part
    assert merge_checkpoints("m", [cp("c", "90", {}), cp("d", "95", {})]).sinks is None  # type: ignore[union-attr]


def test_a_sink_ahead_somewhere_keeps_its_floors_per_residue() -> None:
    """Where a sink's own point was beyond the base in the checkpoint a residue comes from, the plan
    keeps it, per residue: the sink's listener skips the replay of what it had acknowledged there."""
    stored = {shard_id("b", o, 2): dataclasses.replace(
        cp(shard_id("b", o, 2), "100", {}, written_at=1.0 + o),
        sinks={"fast": SinkProgress(resource_version=str(200 + 50 * o)), "slow": SinkProgress()})
        for o in range(2)}
    plan = plan_handover(base="b", shard=ShardFilter(ordinal=0, total=1), stored=stored)
    assert plan.checkpoint is not None
    assert plan.checkpoint.sinks is not None
    assert plan.checkpoint.sinks["fast"].resource_version == "200"
    assert dict(plan.sink_floors["fast"]) == {0: 200, 1: 250}
    assert "slow" not in plan.sink_floors
    floor = plan.sink_floor("fast")
    assert floor is not None
    assert {floor(u) for u in UIDS} == {200, 250}
    assert all(floor(u) == 200 + 50 * shard_of(u, 2) for u in UIDS)
    assert plan.sink_floor("slow") is None


async def test_earlier_totals_are_removed_only_once_past_every_sinks_progress(tmp_path: Path) -> None:
    """The clean-up rule counts what each sink recorded in the earlier total's checkpoints too: its
    own resume point and delivered-ahead entries, not only the base's."""
    store = FileCheckpointStore(directory=tmp_path)
    await store.save(dataclasses.replace(
        cp(shard_id("b", 0, 2), "100", {}),
        sinks={"fast": SinkProgress(resource_version="300"), "slow": SinkProgress()}))
    await store.save(dataclasses.replace(
        cp(shard_id("b", 1, 2), "100", {}),
        sinks={"fast": SinkProgress(ahead={"ns/x": ("ux", "320", False)}), "slow": SinkProgress()}))
    stale = [shard_id("b", 0, 2), shard_id("b", 1, 2)]
    shard = ShardFilter(ordinal=0, total=1)
    for rv, ready in (("250", False), ("319", False), ("320", True)):
        await store.save(cp("b", rv, {}))
        assert await stale_ready(store, base="b", shard=shard, stale=stale) is ready, rv


async def test_file_store_lists_and_removes(tmp_path: Path) -> None:
    store = FileCheckpointStore(directory=tmp_path)
    for ident in ("b", "b.shard-0-of-2", "b.shard-1-of-2", "c"):
        await store.save(cp(ident, "1", {}))
    store.journal_path("b.shard-0-of-2").write_text("x")
    assert await store.informer_ids("b") == ["b", "b.shard-0-of-2", "b.shard-1-of-2"]
    await store.remove("b.shard-0-of-2")
    assert await store.informer_ids("b") == ["b", "b.shard-1-of-2"]
    assert not store.journal_path("b.shard-0-of-2").exists()
    await store.remove("never-was")


async def test_journal_records_move_with_their_objects(sim: ApiClient, tmp_path: Path) -> None:
    """An object a shard delivered after its last checkpoint write is known only from that shard's
    journal. Deleted while every shard is down, with the history compacted meanwhile (the resume
    gets 410): the shard that owns it after the reshard must take the journal record over and
    report the delete from its relist."""
    ckpt = tmp_path / "ckpt"
    ledger = Ledger(sim)
    for i in range(6):
        await ledger.create(f"cm-{i}")
    for o in range(2):
        p, _ = await shard(sim, ckpt, o, 2)
        await run_until(p, ledger.last_rv)
        await p.shutdown(5)
    # An object created and delivered by its shard after that shard's last checkpoint write: the
    # journal is what knows it (written before the event was released to the sinks).
    late = await ledger.create("late")
    uid, key = late["metadata"]["uid"], f"{NS}/late"
    old = shard_id(BASE, shard_of(uid, 2), 2)
    store = FileCheckpointStore(directory=ckpt)
    store.journal_path(old).write_bytes(
        orjson.dumps({"journal": 1, "informer_id": old}) + b"\n"
        + orjson.dumps(["a", key, uid, late["metadata"]["resourceVersion"]]) + b"\n")
    await ledger.delete("late")
    await sim.request("POST", "/_sim/compact")
    p, s = await shard(sim, ckpt, 0, 1)
    await run_until(p, ledger.last_rv)
    await p.shutdown(5)
    deletes = [e for e in s.events if e.type is EventType.DELETED]
    assert [(e.uid, e.final_state_unknown) for e in deletes] == [(uid, True)]


def uid_of_shard(ordinal: int, total: int, tag: str) -> str:
    return next(u for n in range(1000) if shard_of(u := f"{tag}-{n:04d}", total) == ordinal)


async def test_a_fenced_take_over_reads_other_shards_journals(sim: ApiClient) -> None:
    """With leader election, each shard's checkpoint and journal carry its own Lease's token
    (<name>-shard-<o>), whose term says nothing about another shard's Lease: a take-over reads the
    other shards' journals as it peeks their checkpoints, without fencing against them."""
    late: dict[str, int] = {}
    for o, token in enumerate((FenceToken(transitions=5, holder="keb-0"),
                               FenceToken(transitions=7, holder="keb-1"))):
        ident = shard_id(BASE, o, 2)
        store = ConfigMapCheckpointStore(client=sim, namespace="default", name_prefix="keb",
                                         fence=lambda t=token: t)  # type: ignore[misc]
        await store.save(Checkpoint(informer_id=ident, resource_version="10", written_at=1.0 + o))
        uid = uid_of_shard(o, 2, f"late-{o}")
        late[uid] = 20 + o
        await store.journal_backend(ident).rewrite(
            orjson.dumps({"journal": 1, "informer_id": ident}) + b"\n"
            + orjson.dumps(["a", f"{NS}/late-{o}", uid, str(20 + o)]) + b"\n")
    # Shard 0 of the new total 1, a leader of term 0 on its own Lease.
    new = ConfigMapCheckpointStore(client=sim, namespace="default", name_prefix="keb",
                                   fence=lambda: FenceToken(transitions=0, holder="keb-standby-0"))
    out = await take_over(new, base=BASE, shard=ShardFilter(ordinal=0, total=1))
    assert out.plan.sources == (shard_id(BASE, 0, 2), shard_id(BASE, 1, 2))
    assert {uid: int(e.resource_version) for uid, e in out.adopted.items()} == late


async def two_sink_shard(client: ApiClient, ckpt: Path, ordinal: int, total: int, *, interval: float
                         ) -> tuple[BridgePipeline, RecordingSink, RecordingSink]:
    """A shard with two sinks, ``fast`` and ``slow`` (each may hold back its acks), whose backlog
    never holds the informer."""
    api = await Discovery(client=client).resolve("configmaps")
    ref = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
    watched = WatchedResource(key=InformerKey("configmaps", namespace=NS), api=api, ref=ref,
                              shard=ShardFilter(ordinal=ordinal, total=total))
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    for sink in (fast, slow):
        sink.overflow_policy = "spill"  # memory only: no spill directory
    pipeline = BridgePipeline(
        build_informer=http_informer_builder(client=client, clock=RealClock(), compact_cache=True),
        resources=[watched], sinks=[fast, slow], checkpoint_store=store_for(client, ckpt),
        checkpoint_interval=interval, cluster="sim")
    await pipeline.start()
    assert await pipeline.wait_for_sync(10)
    return pipeline, fast, slow


async def crash_with_fast_at(p: BridgePipeline, ckpt: Path, rv: int) -> Checkpoint:
    """Once the fast sink's own progress (what the checkpoint writer computes) is at ``rv``, writes a
    checkpoint and crashes the shard (nothing drained, nothing flushed). Returns that checkpoint."""
    (ident,) = p.informers
    tracker = p.tracker(ident)
    # A fresh shard: the fast sink had no progress of its own at start (floor 0, nothing known).
    await until(lambda: tracker.listener_state("fast", 0, {})[0] >= rv, what=f"fast's progress at {rv}")
    assert await p.write_checkpoints() == 1
    await p.abort()
    cp = await FileCheckpointStore(directory=ckpt).load(ident)
    assert cp is not None
    return cp


def acked(sink: RecordingSink) -> set[tuple[str, str, str]]:
    """The changes a sink acknowledged (received, not left unacknowledged)."""
    held = {id(e) for e, _ in sink.unacked}
    return {(e.type.value, e.uid, e.resource_version) for e in sink.events
            if e.type in CHANGES and id(e) not in held}


async def test_reshard_with_two_sinks_far_apart(sim: ApiClient, tmp_path: Path) -> None:
    """Per-sink progress across a reshard (2 → 1). ``slow`` stops acknowledging right after the
    initial list in both old shards; ``fast`` acknowledges everything. Shard 0 crashes after a first
    batch of changes, shard 1 after a second one (updates, creations, deletions, an object created
    and deleted, a base object updated then deleted), each right after a checkpoint write holding
    fast's own progress. The shard that takes both over resumes the watch from the oldest base
    (slow's); each sink must then receive exactly what it did not acknowledge: fast nothing it had
    (its own progress from the older checkpoint is the merged resume point, and what it acknowledged
    beyond it in the other one is kept per object), slow every change it missed, deletes
    included, once."""
    ckpt = tmp_path / "ckpt"
    ledger = Ledger(sim)
    # Objects of both old shards (uids are the server's: as many as it takes for three of each).
    base: dict[int, list[str]] = {0: [], 1: []}
    while min(len(v) for v in base.values()) < 3:
        obj = await ledger.create(f"cm-{len(ledger.made)}")
        base[shard_of(obj["metadata"]["uid"], 2)].append(obj["metadata"]["name"])
    initial = len(ledger.made)
    old = [await two_sink_shard(sim, ckpt, o, 2, interval=3600) for o in range(2)]
    await until(lambda: sum(len(changes(f)) for _, f, _ in old) == initial
                and sum(len(changes(s)) for _, _, s in old) == initial, what="the initial adds")
    for _, _, slow in old:
        slow.auto_ack = False  # far behind from here on

    async def create_in(ordinal: int, name: str) -> str:
        """Creates ``name``-0, -1, … until one belongs to old shard ``ordinal``; returns its name."""
        n = 0
        while True:
            obj = await ledger.create(f"{name}-{n}")
            if shard_of(obj["metadata"]["uid"], 2) == ordinal:
                return str(obj["metadata"]["name"])
            n += 1

    # Batch 1, seen by both shards: updates, an object of each shard created and deleted.
    for o in (0, 1):
        for name in base[o]:
            await ledger.update(name, "1")
        await ledger.delete(await create_in(o, f"brief{o}"))
    await ledger.delete(base[0][0])
    batch1_end = ledger.last_rv
    first = await crash_with_fast_at(old[0][0], ckpt, batch1_end)
    # Batch 2, seen by shard 1 only (shard 0 is down). Shard 1's changes are known to fast beyond
    # the older checkpoint's point, kept per residue and per object: an object created and deleted,
    # a base object updated then deleted, an update, a creation. Shard 0's changes are replayed to
    # both sinks after the reshard.
    await ledger.delete(await create_in(1, "gone1"))
    await ledger.update(base[1][1], "2")
    await ledger.delete(base[1][1])
    await ledger.update(base[1][2], "2")
    await create_in(1, "new1")
    await ledger.update(base[0][1], "2")
    await ledger.delete(base[0][2])
    await create_in(0, "new0")
    second = await crash_with_fast_at(old[1][0], ckpt, ledger.last_rv)
    # The checkpoints: slow at the base (the initial list), fast far ahead, the two apart.
    assert first.sinks is not None
    assert second.sinks is not None
    assert first.sinks["slow"].at_base
    assert second.sinks["slow"].at_base
    fast_rvs = [int(cp.sinks["fast"].resource_version) for cp in (first, second) if cp.sinks]
    assert fast_rvs[0] >= batch1_end > int(first.resource_version)
    assert fast_rvs[1] >= ledger.last_rv > fast_rvs[0]
    before = {name: set().union(*(acked(sinks[i]) for _, *sinks in old))
              for i, name in enumerate(("fast", "slow"))}
    assert before["slow"] == set(ledger.made[:initial])  # the initial adds only
    assert {c for c in ledger.made if shard_of(c[1], 2) == 1} <= before["fast"]
    # While every shard is down: a delete of an object both sinks know.
    await ledger.delete(base[1][0])
    down_end = len(ledger.made)

    p, fast, slow = await two_sink_shard(sim, ckpt, 0, 1, interval=0.05)
    await ledger.update(base[0][1], "3")
    await run_until(p, ledger.last_rv)
    await p.shutdown(5)

    made = set(ledger.made)
    for name, sink in (("fast", fast), ("slow", slow)):
        after = changes(sink)
        counts = collections.Counter(after)
        assert {k: n for k, n in counts.items() if n > 1} == {}, f"{name}: changes delivered twice"
        # Nothing it had acknowledged is sent again; everything else is sent, deletes included.
        assert set(after) & before[name] == set(), f"{name} re-sent what it had acknowledged"
        assert set(after) == made - before[name], f"{name} missed changes"
        deletes = [c for c in ledger.made if c[0] == "deleted"]
        assert all((c in before[name]) != (c in set(after)) for c in deletes)
    # Per uid, each sink's changes after the reshard come in the order they were made.
    for sink in (fast, slow):
        order = {c: n for n, c in enumerate(ledger.made)}
        by_uid: dict[str, list[int]] = collections.defaultdict(list)
        for c in changes(sink):
            by_uid[c[1]].append(order[c])
        assert all(v == sorted(v) for v in by_uid.values())
    # The fast sink got only what nobody had acknowledged for it: shard 0's batch 2 and later.
    assert {c for c in changes(fast)} == {c for c in ledger.made[:down_end] if c not in before["fast"]} \
        | set(ledger.made[down_end:])


async def test_the_earlier_total_goes_when_the_last_shard_passes_it_after_shard_0(
        sim: ApiClient, tmp_path: Path) -> None:
    """Shard 0 of the new total reaches the end first and then has nothing more to save (no change
    in its part of the cluster); shard 1 passes the earlier total's checkpoint later. Shard 0 still
    removes it, at its next interval: it looked only when it saved a checkpoint of its own, so the
    earlier total stayed as long as nothing of shard 0's changed (what a loaded machine made of the
    3 → 4 → 2 reshard under churn, its last shards catching up one after the other)."""
    ckpt = tmp_path / "file"
    ledger = Ledger(sim)
    for i in range(8):
        await ledger.create(f"cm-{i}")
    p, _ = await shard(sim, ckpt, 0, 1)
    await run_until(p, ledger.last_rv)
    await p.shutdown(5)
    p0, _ = await shard(sim, ckpt, 0, 2)
    try:
        n = 8  # changes in both shards' parts after the reshard, shard 1 not running yet
        while {shard_of(u, 2) for _, u, _ in ledger.made[8:]} != {0, 1}:
            await ledger.create(f"cm-{n}")
            n += 1
        await run_until(p0, ledger.last_rv)
        store = store_for(sim, ckpt)
        assert isinstance(store, FileCheckpointStore)
        assert await store.informer_ids(BASE) == [BASE, shard_id(BASE, 0, 2)]  # shard 1 has none yet
        p1, _ = await shard(sim, ckpt, 1, 2)
        try:
            await run_until(p1, ledger.last_rv)
            left: list[str] = []
            for _ in range(200):  # 10 s of polls; shard 0 writes every 0.05 s
                left = await store.informer_ids(BASE)
                if BASE not in left:
                    break
                await asyncio.sleep(0.05)
            assert left == [shard_id(BASE, 0, 2), shard_id(BASE, 1, 2)]
        finally:
            await p1.shutdown(5)
    finally:
        await p0.shutdown(5)
