"""The known-object journal in a ConfigMap, against the API-server simulator (real HTTP): group commits
as single writes, reading back, corrupt data, resourceVersion conflicts, fencing and the size limit."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.contracts import NotificationKind
from bridge.delivery.journal import Deleted, Exists, KnownObjectJournal
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.sim import Simulator
from bridge.storage.blobstore import ChunkedValue
from bridge.storage.checkpoint import Checkpoint, CheckpointFencedError
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.fencing import BlobStoreError
from tests.checkpoint.helpers import until
from tests.checkpoint.journal_scenarios import (
    DEPOSED,
    SUCCESSOR,
    FencedJournals,
    a_deposed_leader_cannot_write_the_journal_its_successor_wrote,
)
from tests.checkpoint.test_fencing import Term
from tests.checkpoint.test_journal import IDENT, note

NS = "bridge-system"
NAME = f"keb-{IDENT}-journal"
PATH = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[ApiClient]:
    sim = Simulator(namespaces=("default", NS))
    await sim.start()
    api = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        yield api
    finally:
        await api.close()
        await sim.stop()


def backend(client: ApiClient, fence: Term | None = None) -> ChunkedValue:
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", fence=fence)
    assert store.journal_name(IDENT) == NAME
    return store.journal_backend(IDENT)


async def stored(client: ApiClient) -> list[Any]:
    cm = await client.get(PATH)
    lines = str(cm["data"]["journal"]).encode().splitlines()
    assert orjson.loads(lines[0]) == {"journal": 1, "informer_id": IDENT}
    return [orjson.loads(line) for line in lines[1:]]


async def running(j: KnownObjectJournal, checkpoint: Checkpoint | None = None) -> asyncio.Task[None]:
    await j.load(checkpoint)
    return asyncio.create_task(j.run(), name="journal-under-test")


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_records_are_written_in_group_commits_and_read_back_by_the_next_run(client: ApiClient) -> None:
    b = backend(client)
    j = KnownObjectJournal(backend=b, informer_id=IDENT)
    task = await running(j, Checkpoint(informer_id=IDENT, resource_version="10",
                                       objects={"ns/known": ("u-known", "9")}))
    try:
        async with asyncio.timeout(10):
            await j.idle()  # the initial rewrite creates the ConfigMap
        writes = b.writes
        for i in range(100):
            note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
        note(j, 100, NotificationKind.DELETE, "known", "u-known", "200")
        assert j.must_wait(100)
        async with asyncio.timeout(10):
            await j.wait(100)
        assert b.writes - writes <= 2  # a burst is one or two writes, not one per record
        assert len(await stored(client)) == 101
    finally:
        await stop(task)
    again = KnownObjectJournal(backend=backend(client), informer_id=IDENT)
    entries = await again.load(None)
    assert entries["u-known"] == Deleted("ns/known", "200")
    assert entries["u-7"] == Exists("ns/o7", "27")
    assert len(entries) == 101


async def test_corrupt_journal_data_makes_the_journal_unreadable(client: ApiClient,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    header = orjson.dumps({"journal": 1, "informer_id": IDENT}).decode()
    text = "\n".join([header, '["a","ns/a","u-a","12"]', "{not json", '["a","ns/b","u-b","13"]']) + "\n"
    await client.create(f"/api/v1/namespaces/{NS}/configmaps",
                        {"metadata": {"name": NAME}, "data": {"journal": text}})
    j = KnownObjectJournal(backend=backend(client), informer_id=IDENT)
    with caplog.at_level(logging.WARNING):
        assert await j.load(None) == {}
    assert "line 3 is corrupt" in caplog.text
    assert NAME in caplog.text
    assert "line 3 is corrupt" in j.unreadable
    cm = await client.get(PATH)
    cm["data"]["journal"] = '{"journal": 1, "informer_id": "someone-else"}\n'
    await client.replace(PATH, cm)
    assert await j.load(None) == {}
    assert "not this informer's journal" in j.unreadable
    cm = await client.get(PATH)
    cm["data"] = {"journal": header + "\n", "chunks": f"{NAME}-cgone-0"}
    await client.replace(PATH, cm)
    assert await j.load(None) == {}
    assert "chunk 0" in j.unreadable
    assert "missing" in j.unreadable


async def test_a_write_after_a_conflicting_change_rewrites_the_whole_journal(client: ApiClient) -> None:
    b = backend(client)
    await b.rewrite(b'{"journal":1,"informer_id":"' + IDENT.encode() + b'"}\n')
    await b.append(b'["a","ns/a","u-a","12"]\n')
    cm = await client.get(PATH)
    cm["data"]["journal"] = "overwritten by hand\n"
    await client.replace(PATH, cm)  # the resourceVersion b holds is stale now
    await b.append(b'["a","ns/b","u-b","13"]\n')
    assert await stored(client) == [["a", "ns/a", "u-a", "12"], ["a", "ns/b", "u-b", "13"]]
    await client.delete(PATH)
    await b.append(b'["a","ns/c","u-c","14"]\n')  # deleted meanwhile: created again, whole
    assert [r[2] for r in await stored(client)] == ["u-a", "u-b", "u-c"]


async def test_a_deposed_leader_cannot_write_the_journal_its_successor_wrote(client: ApiClient) -> None:
    term_b = Term(SUCCESSOR)

    async def marked_by_b() -> None:
        cm = await client.get(PATH)
        assert cm["metadata"]["annotations"]["kube-event-bridge.io/lease-transitions"] == "1"

    await a_deposed_leader_cannot_write_the_journal_its_successor_wrote(FencedJournals(
        old=backend(client, Term(DEPOSED)), new=backend(client, term_b), successor=term_b,
        records=functools.partial(stored, client), check_successor_mark=marked_by_b))


async def test_a_journal_larger_than_one_configmap_spans_sealed_chunks(client: ApiClient) -> None:
    """Room for about 70 records per ConfigMap: 300 new objects before any checkpoint (a first list)
    are all recorded, in sealed chunks the head lists, and released without waiting for a
    compaction; a next run reads them all back; a compaction seals a fresh generation and deletes
    the chunks no head lists any more."""
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", journal_bytes=2000)
    b = store.journal_backend(IDENT)
    j = KnownObjectJournal(backend=b, informer_id=IDENT)
    task = await running(j)
    try:
        for i in range(300):
            note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
        async with asyncio.timeout(10):
            await j.wait(299)
        assert j.last_error == ""
        head = await client.get(PATH)
        chunks = str(head["data"]["chunks"]).split(",")
        assert len(chunks) >= 4
        assert len(head["data"]["journal"]) <= 2000
        for chunk in chunks:
            sealed = await client.get(f"/api/v1/namespaces/{NS}/configmaps/{chunk}")
            assert len(sealed["data"]["chunk"]) <= 2000
        entries = await KnownObjectJournal(backend=store.journal_backend(IDENT), informer_id=IDENT).load(None)
        assert entries == {f"u-{i}": Exists(f"ns/o{i}", str(20 + i)) for i in range(300)}
        # The first checkpoint knows all but three: the journal shrinks to them, old chunks go.
        j.compact(Checkpoint(informer_id=IDENT, resource_version="316",
                             objects={f"ns/o{i}": (f"u-{i}", str(20 + i)) for i in range(297)}))
        await until(lambda: j._compact_to is None, what="the compaction")
        head = await client.get(PATH)
        assert "chunks" not in head["data"]
        assert [r[2] for r in await stored(client)] == ["u-297", "u-298", "u-299"]
        listed = await client.get(f"/api/v1/namespaces/{NS}/configmaps")
        names = {item["metadata"]["name"] for item in listed["items"]}
        assert not names & set(chunks)
    finally:
        await stop(task)


async def test_a_deposed_leader_cannot_commit_a_chunked_journal(client: ApiClient) -> None:
    """The head is the commit point: a deposed leader may create chunks (orphans no head lists), never
    the head; the successor's next run deletes them."""
    term_a = Term(FenceToken(transitions=0, holder="a"))
    term_b = Term(FenceToken(transitions=1, holder="b"))
    head = b'{"journal":1,"informer_id":"' + IDENT.encode() + b'"}\n'
    records = b"".join(b'["a","ns/o%d","u-%d","%d"]\n' % (i, i, 20 + i) for i in range(60))

    def fenced(term: Term) -> ChunkedValue:
        return ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", fence=term,
                                        journal_bytes=1000).journal_backend(IDENT)

    old, new = fenced(term_a), fenced(term_b)
    await old.rewrite(head)
    assert await new.read() == head
    await new.rewrite(head + b'["a","ns/b","u-b","13"]\n')
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.append(records)  # needs chunks: they are created, the head write is refused
    assert await new.read() == head + b'["a","ns/b","u-b","13"]\n'
    selector = "kube-event-bridge.io/checkpoint-role=journal-chunk"
    orphans = (await client.get(f"/api/v1/namespaces/{NS}/configmaps",
                                params={"labelSelector": selector}))["items"]
    assert orphans
    await new.append(records)
    # A run's first rewrite (the compaction at start) looks for orphans and deletes them.
    again = fenced(term_b)
    await again.read()
    await again.rewrite(head)
    left = await client.get(f"/api/v1/namespaces/{NS}/configmaps", params={"labelSelector": selector})
    assert left["items"] == []


async def test_with_shards_off_a_full_journal_waits_for_the_next_checkpoint_write(client: ApiClient) -> None:
    """``checkpoint.shards: false`` (RBAC names the store's ConfigMaps one by one): the journal is one
    ConfigMap; a group commit appends what fits, the rest waits for a compaction."""
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", allow_shards=False,
                                     journal_bytes=2000)
    b = store.journal_backend(IDENT)
    j = KnownObjectJournal(backend=b, informer_id=IDENT)
    task = await running(j, FIRST)
    try:
        await full_then_compacted(j)
    finally:
        await stop(task)
    assert len(await stored(client)) < 100  # never more than fits
    with pytest.raises(BlobStoreError, match=r"more than one value holds \(2000\), and chunking is off"):
        await b.append(b"x" * 3000)


FIRST = Checkpoint(informer_id=IDENT, resource_version="10", objects={})
"""A checkpoint written before: the journal resumes from it."""


def more_released(j: KnownObjectJournal, seqs: range, n: int) -> bool:
    return sum(not j.must_wait(i) for i in seqs) > n


async def full_then_compacted(j: KnownObjectJournal) -> None:
    await full_then_compacted_from(j, 0)


async def full_then_compacted_from(j: KnownObjectJournal, first: int) -> None:
    """100 new objects (seq ``first``…) in a journal with room for fewer: the first are released at
    once, the rest wait (the error says why) until checkpoint writes that know the released ones
    compact it."""
    seqs = range(first, first + 100)
    for i in seqs:
        note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
    await until(lambda: bool(j.last_error), 10, "the journal to fill")
    assert "is full" in j.last_error
    assert "next checkpoint write" in j.last_error
    assert not j.must_wait(first)
    assert j.must_wait(first + 99)
    for _ in range(100):
        if not j.must_wait(first + 99):
            break
        released = [i for i in seqs if not j.must_wait(i)]
        j.compact(Checkpoint(informer_id=IDENT, resource_version=str(20 + released[-1]),
                             objects={f"ns/o{i}": (f"u-{i}", str(20 + i)) for i in released}))
        await until(functools.partial(more_released, j, seqs, len(released)), 10,
                    "room after a compaction")
    async with asyncio.timeout(10):
        await j.wait(first + 99)
    assert j.last_error == ""


async def test_with_shards_off_a_first_list_larger_than_the_journal_waits_never_unrecorded(
    client: ApiClient,
) -> None:
    """Before the first checkpoint write nothing can compact a bounded journal (a first list is
    checkpointed only once all of it is delivered): what does not fit waits — the journal fails
    closed — and readiness says why (``last_error``). Nothing is released unrecorded."""
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", allow_shards=False,
                                     journal_bytes=2000)
    j = KnownObjectJournal(backend=store.journal_backend(IDENT), informer_id=IDENT)
    task = await running(j)
    try:
        for i in range(100):
            note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
        await until(lambda: bool(j.last_error), 10, "the journal to fill")
        assert "is full" in j.last_error
        released = [i for i in range(100) if not j.must_wait(i)]
        assert 0 < len(released) < 100
        assert [r[2] for r in await stored(client)] == [f"u-{i}" for i in released]  # all recorded
        await asyncio.sleep(1.5)  # a retry or two: still waiting, still nothing unrecorded
        assert j.must_wait(99)
        assert len(await stored(client)) == len(released)
    finally:
        await stop(task)
