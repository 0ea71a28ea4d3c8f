"""The kit's in-memory stores hold to the storage Protocols: checked by type (mypy reads the
assignments below) and at run time, and by one behavioural contract run against the in-memory store
and the file store alike. The chunked writer's own tests (tests/checkpoint/test_storage.py) run
against the in-memory blob store beside the ConfigMap and NATS KV ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from bridge.contracts import NotificationKind
from bridge.delivery.journal import Exists, KnownObjectJournal
from bridge.storage.blobstore import AppendableBlobStore, BlobStore, ChunkStore, JournalBackend
from bridge.storage.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointFencedError,
    CheckpointStore,
    FileCheckpointStore,
    JournalStore,
    ListableCheckpointStore,
)
from bridge.storage.fencing import BlobStoreError
from bridge.testing import BareCheckpointStore, MemoryBlobStore, MemoryCheckpointStore, MemoryJournal
from tests.checkpoint.journal_scenarios import (
    DEPOSED,
    SUCCESSOR,
    FencedJournals,
    a_deposed_leader_cannot_write_the_journal_its_successor_wrote,
)
from tests.checkpoint.test_fencing import Term
from tests.checkpoint.test_journal import note

IDENT = "configmaps.default.0123456789ab"
OTHER = "configmaps.default.ba9876543210"

# Static conformance: mypy checks these against the Protocols.
_blob: BlobStore = MemoryBlobStore()
_chunks: ChunkStore = MemoryBlobStore(room=100)
_appends: AppendableBlobStore = MemoryBlobStore()
_listable: ListableCheckpointStore = MemoryCheckpointStore()
_journals: JournalStore = MemoryCheckpointStore()
_bare: CheckpointStore = BareCheckpointStore()
_journal: JournalBackend = MemoryJournal()


def test_the_stores_are_the_protocols_at_run_time() -> None:
    assert isinstance(MemoryBlobStore(), ChunkStore)
    assert isinstance(MemoryBlobStore(), AppendableBlobStore)
    store = MemoryCheckpointStore()
    assert isinstance(store, ListableCheckpointStore)
    assert isinstance(store, JournalStore)
    assert not isinstance(BareCheckpointStore(), ListableCheckpointStore | JournalStore)


StoreFactory = Callable[[], ListableCheckpointStore]


@pytest.fixture(params=["memory", "memory-chunked", "file"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Builds stores over one storage: each call is a process started again on it."""
    if request.param == "file":
        return lambda: FileCheckpointStore(directory=tmp_path / "ckpt", fsync=False)
    first = MemoryCheckpointStore(room=300 if request.param == "memory-chunked" else None)
    built = [first]

    def again() -> ListableCheckpointStore:
        if not built:
            built.append(MemoryCheckpointStore(blobs=first.blobs))
        return built.pop()

    return again


def checkpoint(ident: str, rv: str, n: int = 3) -> Checkpoint:
    objects = {f"default/cm-{i}": (f"uid-{i}", str(int(rv) - i)) for i in range(n)}
    return Checkpoint(informer_id=ident, resource_version=rv, objects=objects, written_at=5.0)


async def test_a_checkpoint_saved_is_what_the_next_run_loads(stores: StoreFactory) -> None:
    store = stores()
    assert await store.load(IDENT) is None
    await store.save(checkpoint(IDENT, "20"))
    await store.save(checkpoint(IDENT, "40", n=30))  # replaced whole (chunked where blobs are small)
    await store.close()
    again = stores()
    loaded = await again.load(IDENT)
    assert loaded is not None
    want = checkpoint(IDENT, "40", n=30)
    assert (loaded.resource_version, dict(loaded.objects)) == ("40", dict(want.objects))
    assert await again.peek(IDENT) == loaded
    await again.close()


async def test_listing_and_removal_cover_checkpoints_and_journals(stores: StoreFactory) -> None:
    store = stores()
    for ident in (IDENT, OTHER):
        await store.save(checkpoint(ident, "10"))
    assert isinstance(store, JournalStore)
    journal = store.journal_backend(IDENT)
    await journal.rewrite(b"head\n")
    await journal.append(b"one\n")
    assert await store.informer_ids("configmaps.") == sorted([IDENT, OTHER])
    assert await store.informer_ids("pods.") == []
    await store.remove(IDENT)
    await store.remove("configmaps.default.000000000000")  # absent: fine
    assert await store.informer_ids("configmaps.") == [OTHER]
    assert await store.load(IDENT) is None
    assert await store.journal_backend(IDENT).read() is None


async def test_a_journal_written_by_one_run_is_read_by_the_next(stores: StoreFactory) -> None:
    store = stores()
    assert isinstance(store, JournalStore)
    journal = KnownObjectJournal(informer_id=IDENT, backend=store.journal_backend(IDENT))
    await journal.load(None)
    task = asyncio.create_task(journal.run(), name="journal-under-test")
    try:
        for i in range(40):
            note(journal, i, NotificationKind.ADD, f"o{i}", f"u-{i}", str(20 + i))
        await journal.wait(39)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    again = stores()
    assert isinstance(again, JournalStore)
    entries = await KnownObjectJournal(informer_id=IDENT, backend=again.journal_backend(IDENT)).load(None)
    assert entries == {f"u-{i}": Exists(f"ns/o{i}", str(20 + i)) for i in range(40)}


async def test_damage_is_detected_not_trusted() -> None:
    store = MemoryCheckpointStore()
    await store.save(checkpoint(IDENT, "10"))
    head = store.blobs.checkpoints.heads[IDENT]
    store.blobs.checkpoints.heads[IDENT] = type(head)(inline=head.inline[:-3], version=head.version)
    with pytest.raises(CheckpointCorruptError, match="truncated"):
        await MemoryCheckpointStore(blobs=store.blobs).load(IDENT)


async def test_a_deposed_leader_is_fenced_out_of_checkpoints() -> None:
    old_term, new_term = Term(DEPOSED), Term(SUCCESSOR)
    old = MemoryCheckpointStore(fence=old_term)
    new = MemoryCheckpointStore(blobs=old.blobs, fence=new_term)
    await old.save(checkpoint(IDENT, "10"))
    assert await new.load(IDENT) is not None  # claims it for the later term
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.save(checkpoint(IDENT, "11"))
    loaded = await MemoryCheckpointStore(blobs=old.blobs).peek(IDENT)
    assert loaded is not None
    assert (loaded.resource_version, loaded.writer) == ("10", SUCCESSOR)


async def test_a_deposed_leader_cannot_write_the_journal_its_successor_wrote() -> None:
    # With a limit (as a ConfigMap or KV value): every write is a compare-and-set the fence checks.
    old = MemoryCheckpointStore(fence=Term(DEPOSED), room=4096)
    successor = Term(SUCCESSOR)
    new = MemoryCheckpointStore(blobs=old.blobs, fence=successor)

    async def records() -> list[object]:
        data = old.journal(IDENT) or b""
        return [orjson.loads(line) for line in data.splitlines()[1:]]

    async def marked() -> None:
        head = old.blobs.journals.heads[IDENT]
        assert head.writer == SUCCESSOR

    await a_deposed_leader_cannot_write_the_journal_its_successor_wrote(FencedJournals(
        old=old.journal_backend(IDENT), new=new.journal_backend(IDENT), successor=successor,
        records=records, check_successor_mark=marked))


async def test_the_bare_store_keeps_what_it_was_given_and_saved() -> None:
    first = checkpoint(IDENT, "10")
    store = BareCheckpointStore(first)
    assert await store.load(IDENT) == first
    await store.save(checkpoint(IDENT, "12"))
    loaded = await store.load(IDENT)
    assert loaded is not None
    assert (loaded.resource_version, store.saves) == ("12", 1)
    assert await store.load(OTHER) is None
    await store.close()
    assert store.closed


async def test_the_standalone_journal_is_bounded_by_its_room() -> None:
    journal = MemoryJournal(room=10)
    assert await journal.read() is None
    await journal.rewrite(b"head\n")
    assert journal.room() == 5
    await journal.append(b"1234\n")
    with pytest.raises(BlobStoreError, match="more than it holds"):
        await journal.append(b"x")
    assert await journal.read() == b"head\n1234\n"
