"""The known-object journal in a NATS KV key, against a real nats-server with JetStream: group
commits as single writes, reading back, malformed values, revision conflicts, fencing, the size
limit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import orjson
import pytest

from bridge.contracts import NotificationKind
from bridge.delivery.journal import Deleted, Exists, KnownObjectJournal
from bridge.storage.checkpoint import Checkpoint
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore, live_keys
from tests.brokers import NatsServer, running_nats
from tests.checkpoint.helpers import until
from tests.checkpoint.journal_scenarios import (
    DEPOSED,
    HEAD,
    SUCCESSOR,
    FencedJournals,
    a_deposed_leader_cannot_write_the_journal_its_successor_wrote,
)
from tests.checkpoint.test_fencing import Term
from tests.checkpoint.test_journal import IDENT, note


@pytest.fixture(scope="module")
def nats_js() -> Iterator[NatsServer]:
    with running_nats() as server:
        yield server


def store_for(nats_js: NatsServer, bucket: str, fence: Term | None = None,
              chunk_size: int | None = None) -> NatsKvCheckpointStore:
    return NatsKvCheckpointStore(nats_url=nats_js.url, bucket=bucket, fence=fence, chunk_size=chunk_size)


async def stored(store: NatsKvCheckpointStore) -> tuple[list[object], object]:
    kv = await store._bucket_kv()
    head, *lines = ((await kv.get(store.journal_key(IDENT))).value or b"").splitlines()
    assert orjson.loads(lines[0]) == {"journal": 1, "informer_id": IDENT}
    return [orjson.loads(line) for line in lines[1:]], orjson.loads(head)["writer"]


async def test_records_are_written_in_group_commits_and_read_back(nats_js: NatsServer) -> None:
    store = store_for(nats_js, "journal-roundtrip")
    try:
        b = store.journal_backend(IDENT)
        j = KnownObjectJournal(backend=b, informer_id=IDENT)
        await j.load(None)
        task = asyncio.create_task(j.run(), name="journal-under-test")
        try:
            async with asyncio.timeout(10):
                await j.idle()
            writes = b.writes
            for i in range(100):
                note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
            note(j, 100, NotificationKind.DELETE, "o3", "u-3", "200")
            async with asyncio.timeout(10):
                await j.wait(100)
            assert b.writes - writes <= 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        records, writer = await stored(store)
        assert len(records) == 101  # u-3's add, then its delete
        assert writer is None
        entries = await KnownObjectJournal(backend=store.journal_backend(IDENT), informer_id=IDENT).load(None)
        assert entries["u-3"] == Deleted("ns/o3", "200")
        assert len(entries) == 100
        # The checkpoint's chunk purge leaves the journal alone.
        assert store.journal_key(IDENT) in await live_keys(await store._bucket_kv())
    finally:
        await store.close()


async def test_malformed_values_and_conflicting_writes(nats_js: NatsServer,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    store = store_for(nats_js, "journal-malformed")
    try:
        kv = await store._bucket_kv()
        await kv.put(store.journal_key(IDENT), b"not json")
        with caplog.at_level(logging.WARNING):
            assert await KnownObjectJournal(backend=store.journal_backend(IDENT),
                                            informer_id=IDENT).load(None) == {}
        assert "malformed" in caplog.text
        b = store.journal_backend(IDENT)
        await b.rewrite(HEAD)  # not read first: the create conflicts, then it replaces the value
        await b.append(b'["a","ns/a","u-a","12"]\n')
        await kv.put(store.journal_key(IDENT), b'{"writer": null}\nby hand\n')
        await b.append(b'["a","ns/b","u-b","13"]\n')  # stale revision: the whole journal again
        assert (await stored(store))[0] == [["a", "ns/a", "u-a", "12"], ["a", "ns/b", "u-b", "13"]]
        # A record larger than one message is split across chunks and read back whole.
        big = b'["a","ns/big","u-big","14"' + b" " * (2 * 1024 * 1024) + b"]\n"
        await b.append(big)
        assert len(b.chunks) >= 2
        stored_text = await store.journal_backend(IDENT).read()
        assert stored_text is not None
        assert stored_text.endswith(b'"13"]\n' + big)
    finally:
        await store.close()


async def test_a_deposed_leader_cannot_write_the_journal_its_successor_wrote(nats_js: NatsServer) -> None:
    term_b = Term(SUCCESSOR)
    old_store = store_for(nats_js, "journal-fence", fence=Term(DEPOSED))
    new_store = store_for(nats_js, "journal-fence", fence=term_b)

    async def records() -> list[object]:
        return (await stored(new_store))[0]

    async def marked_by_b() -> None:
        assert (await stored(new_store))[1] == [1, "b"]

    try:
        await a_deposed_leader_cannot_write_the_journal_its_successor_wrote(FencedJournals(
            old=old_store.journal_backend(IDENT), new=new_store.journal_backend(IDENT), successor=term_b,
            records=records, check_successor_mark=marked_by_b))
    finally:
        await old_store.close()
        await new_store.close()


async def test_a_journal_larger_than_one_value_spans_sealed_chunks(nats_js: NatsServer) -> None:
    """Room for about 70 records per value: 300 new objects before any checkpoint (a first list) are
    all recorded, in chunk keys the head lists, and released without waiting for a compaction; a
    next run reads them all back; a compaction purges the chunks no head lists any more."""
    store = NatsKvCheckpointStore(nats_url=nats_js.url, bucket="journal-large", journal_bytes=2000)
    try:
        j = KnownObjectJournal(backend=store.journal_backend(IDENT), informer_id=IDENT)
        await j.load(None)
        task = asyncio.create_task(j.run(), name="journal-under-test")
        try:
            for i in range(300):
                note(j, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
            async with asyncio.timeout(10):
                await j.wait(299)
            assert j.last_error == ""
            kv = await store._bucket_kv()
            value = (await kv.get(store.journal_key(IDENT))).value or b""
            chunks = orjson.loads(value.split(b"\n", 1)[0])["chunks"]
            assert len(chunks) >= 4
            assert len(value) <= 2000 + 256
            entries = await KnownObjectJournal(backend=store.journal_backend(IDENT),
                                               informer_id=IDENT).load(None)
            assert entries == {f"u-{i}": Exists(f"ns/o{i}", str(20 + i)) for i in range(300)}
            j.compact(Checkpoint(informer_id=IDENT, resource_version="316",
                                 objects={f"ns/o{i}": (f"u-{i}", str(20 + i)) for i in range(297)}))
            await until(lambda: j._compact_to is None, what="the compaction")
            records, _ = await stored(store)
            assert records == [["a", f"ns/o{i}", f"u-{i}", str(20 + i)] for i in (297, 298, 299)]
            keys = await live_keys(kv)
            assert not set(keys) & set(chunks)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await store.close()
