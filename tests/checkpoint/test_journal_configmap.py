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
from bridge.delivery.checkpoint import Checkpoint, CheckpointFencedError
from bridge.delivery.checkpoint_configmap import ConfigMapCheckpointStore, ConfigMapJournalBackend
from bridge.delivery.journal import JournalEntry, JournalStoreError, KnownObjectJournal
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.sim import Simulator
from tests.checkpoint.helpers import until
from tests.checkpoint.test_fencing import Term
from tests.checkpoint.test_journal import IDENT, note

NS = "bridge-system"
NAME = f"keb-{IDENT}-journal"
PATH = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"
A = FenceToken(transitions=0, holder="a")
B = FenceToken(transitions=1, holder="b")


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


def backend(client: ApiClient, fence: Term | None = None) -> ConfigMapJournalBackend:
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
    assert entries["u-known"] == JournalEntry("ns/known", "200", deleted=True)
    assert entries["u-7"] == JournalEntry("ns/o7", "27")
    assert len(entries) == 101


async def test_corrupt_journal_data_keeps_what_precedes_it(client: ApiClient,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    header = orjson.dumps({"journal": 1, "informer_id": IDENT}).decode()
    text = "\n".join([header, '["a","ns/a","u-a","12"]', "{not json", '["a","ns/b","u-b","13"]']) + "\n"
    await client.create(f"/api/v1/namespaces/{NS}/configmaps",
                        {"metadata": {"name": NAME}, "data": {"journal": text}})
    with caplog.at_level(logging.WARNING):
        assert await KnownObjectJournal(backend=backend(client), informer_id=IDENT).load(None) == {
            "u-a": JournalEntry("ns/a", "12")}
    assert "line 3 is corrupt" in caplog.text
    cm = await client.get(PATH)
    cm["data"]["journal"] = '{"journal": 1, "informer_id": "someone-else"}\n'
    await client.replace(PATH, cm)
    assert await KnownObjectJournal(backend=backend(client), informer_id=IDENT).load(None) == {}


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
    head = b'{"journal":1,"informer_id":"' + IDENT.encode() + b'"}\n'
    term_a, term_b = Term(A), Term(B)
    old, new = backend(client, term_a), backend(client, term_b)
    assert await old.read() is None
    await old.rewrite(head)
    await old.append(b'["a","ns/a","u-a","12"]\n')
    assert await new.read() == head + b'["a","ns/a","u-a","12"]\n'
    await new.rewrite(head + b'["a","ns/b","u-b","13"]\n')
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.append(b'["d","ns/b","u-b","14",false]\n')
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.read()
    assert await stored(client) == [["a", "ns/b", "u-b", "13"]]
    cm = await client.get(PATH)
    assert cm["metadata"]["annotations"]["kube-event-bridge.io/lease-transitions"] == "1"
    term_b.token = None  # leadership lost: no write at all
    with pytest.raises(CheckpointFencedError):
        await new.append(b'["a","ns/c","u-c","15"]\n')
    assert await stored(client) == [["a", "ns/b", "u-b", "13"]]


async def test_a_full_journal_releases_what_fits_and_the_rest_after_the_next_checkpoint_write(
    client: ApiClient,
) -> None:
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb")
    b = ConfigMapJournalBackend(client=client, namespace=NS, name=store.journal_name(IDENT), labels={},
                                max_bytes=2000)
    j = KnownObjectJournal(backend=b, informer_id=IDENT)
    task = await running(j, FIRST)
    try:
        await full_then_compacted(j)
    finally:
        await stop(task)
    assert len(await stored(client)) < 100  # never more than fits
    with pytest.raises(JournalStoreError, match=r"more than one ConfigMap holds \(2000\)"):
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


async def test_a_first_list_larger_than_the_journal_is_released_not_held_forever(
    client: ApiClient, caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the first checkpoint write nothing can compact the journal (a first list is written to
    a checkpoint only once all of it is delivered): what does not fit is released unrecorded."""
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb")
    b = ConfigMapJournalBackend(client=client, namespace=NS, name=store.journal_name(IDENT), labels={},
                                max_bytes=2000)
    j = KnownObjectJournal(backend=b, informer_id=IDENT)
    task = await running(j)
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(100):
                note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
            async with asyncio.timeout(10):
                await j.wait(99)
        assert "full before the first checkpoint write" in caplog.text
        assert 0 < j.overflowed < 100
        assert len(await stored(client)) == 100 - j.overflowed  # the first ones are recorded
        # Once a checkpoint was written, a full journal holds its records again.
        released = list(range(100))
        j.compact(Checkpoint(informer_id=IDENT, resource_version="119",
                             objects={f"ns/o{i}": (f"u-{i}", str(20 + i)) for i in released}))
        await full_then_compacted_from(j, 100)
    finally:
        await stop(task)
