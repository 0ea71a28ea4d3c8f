"""Fenced checkpoint writes: a deposed leader cannot overwrite its successor's progress.

Each store is driven as two leaders would drive it, with lease tokens (holder, leaseTransitions):
``a`` in term 0 writes, ``b`` takes over in term 1 and loads (which claims the checkpoint), after
which every write carrying ``a``'s older token is refused by the store itself, whatever that
replica believes; and a replica that no longer leads writes nothing at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.sim import Simulator
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointFencedError,
    CheckpointStore,
    FileCheckpointStore,
    decode_checkpoint,
    encode_checkpoint,
)
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore
from tests.brokers import NatsServer, running_nats

IDENT = "configmaps.failover.0123456789ab"
A = FenceToken(transitions=0, holder="a")
B = FenceToken(transitions=1, holder="b")


class Term:
    """A settable fence: the token while leading, None after the loss."""

    def __init__(self, token: FenceToken | None) -> None:
        self.token = token

    def __call__(self) -> FenceToken | None:
        return self.token


def cp(rv: str, n: int = 3) -> Checkpoint:
    objects = {f"ns/o-{i:05d}": (f"uid-{i}", str(int(rv) - i)) for i in range(n)}
    return Checkpoint(informer_id=IDENT, resource_version=rv, objects=objects, written_at=1.5)


def same(got: Checkpoint | None, want: Checkpoint) -> bool:
    return got is not None and dataclasses.replace(got, writer=None) == want


StoreFactory = Callable[[Term], Awaitable[CheckpointStore]]


@pytest.fixture(scope="module")
def nats_js() -> Iterator[NatsServer]:
    with running_nats() as server:
        yield server


@pytest.fixture(params=["configmap", "configmap-sharded", "natskv", "file"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    opened: list[CheckpointStore] = []
    sim: Simulator | None = None
    client: ApiClient | None = None
    kind = str(request.param)
    if kind.startswith("configmap"):
        sim = Simulator()
        await sim.start()
        client = ApiClient(server=sim.url)
    bucket = f"fence-{tmp_path.name[-20:]}".replace("_", "-")

    async def factory(term: Term) -> CheckpointStore:
        store: CheckpointStore
        if kind.startswith("configmap"):
            assert client is not None
            store = ConfigMapCheckpointStore(client=client, namespace="default", name_prefix="keb",
                                             shard_bytes=1024 if kind.endswith("sharded") else 900 * 1024,
                                             fence=term)
        elif kind == "natskv":
            nats_server: NatsServer = request.getfixturevalue("nats_js")
            store = NatsKvCheckpointStore(nats_url=nats_server.url, bucket=bucket, fence=term)
        else:
            store = FileCheckpointStore(directory=tmp_path / "ckpt", fsync=False, fence=term)
        opened.append(store)
        return store

    try:
        yield factory
    finally:
        for s in opened:
            await s.close()
        if client is not None:
            await client.close()
        if sim is not None:
            await sim.stop()


async def test_a_deposed_leader_cannot_overwrite_its_successor(make_store: StoreFactory) -> None:
    a_term, b_term = Term(A), Term(B)
    a = await make_store(a_term)
    assert await a.load(IDENT) is None
    first = cp("100", n=40)  # 40 objects: several shards in the sharded variant
    await a.save(first)

    b = await make_store(b_term)
    loaded = await b.load(IDENT)  # b takes over: loading claims the checkpoint for term 1
    assert same(loaded, first)

    # a does not know it was deposed (its renewals hang): its write is refused by the store.
    with pytest.raises(CheckpointFencedError):
        await a.save(cp("150", n=40))
    assert same(await (await make_store(Term(B))).load(IDENT), first)

    progress = cp("200", n=40)
    await b.save(progress)
    # A late write, forced from a fresh store with a's old token, is refused too.
    late = await make_store(Term(A))
    with pytest.raises(CheckpointFencedError):
        await late.save(cp("120", n=40))
    with pytest.raises(CheckpointFencedError):
        await a.save(cp("130", n=40))
    # And loading as term 0 after term 1 wrote is refused: a stale leader must not resume.
    with pytest.raises(CheckpointFencedError):
        await late.load(IDENT)
    reader = await make_store(Term(B))
    final = await reader.load(IDENT)
    assert same(final, progress)
    assert final is not None
    assert final.writer == B


async def test_no_write_once_leadership_has_ended(make_store: StoreFactory) -> None:
    term = Term(A)
    a = await make_store(term)
    await a.load(IDENT)
    await a.save(cp("100"))
    term.token = None  # the renew deadline passed
    with pytest.raises(CheckpointFencedError, match="not the leader"):
        await a.save(cp("101"))
    assert same(await (await make_store(Term(A))).load(IDENT), cp("100"))


async def test_the_same_leader_keeps_writing(make_store: StoreFactory) -> None:
    a = await make_store(Term(A))
    for rv in ("100", "101", "102"):
        await a.save(cp(rv))
    # A second store of the same term (the same replica, restarted store) continues.
    again = await make_store(Term(A))
    await again.save(cp("103"))
    assert same(await again.load(IDENT), cp("103"))


def test_the_writer_token_travels_in_the_checkpoint() -> None:
    stamped = dataclasses.replace(cp("7"), writer=B)
    assert decode_checkpoint(encode_checkpoint(stamped), IDENT).writer == B
    assert decode_checkpoint(encode_checkpoint(cp("7")), IDENT).writer is None
