"""The storage layer's one chunked writer (:class:`~bridge.storage.blobstore.ChunkedValue`) against
the primitives of every backend that chunks: ConfigMaps in the API-server simulator (real HTTP) and a
NATS KV bucket of a real nats-server with JetStream. Chunk boundaries, compare-and-set conflicts, the
fence refusing a deposed writer, and the orphan sweep after a crash between the chunks and the head.
Files are never chunked: a value is its file, appended to in place."""

from __future__ import annotations

import ast
import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import nats
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.sim import Simulator
from bridge.storage.blob_file import FileBlobStore
from bridge.storage.blobstore import BlobConflict, BlobStore, ChunkedValue, ChunkStore, Head
from bridge.storage.checkpoint import FileCheckpointStore, JournalStore, ListableCheckpointStore
from bridge.storage.checkpoint_configmap import JOURNALS, ConfigMapBlobStore, ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvBlobStore, NatsKvCheckpointStore
from bridge.storage.fencing import BlobStoreError, CheckpointFencedError
from bridge.testing import BareCheckpointStore, MemoryBlobStore
from tests.brokers import NatsServer, running_nats
from tests.checkpoint.test_fencing import Term

IDENT = "pods.all.0123456789ab"
ROOM = 1000
"""About the bytes one blob holds in these tests (each backend adds its own header room)."""
A = FenceToken(transitions=0, holder="a")
B = FenceToken(transitions=1, holder="b")
_buckets = itertools.count()


@pytest.fixture(scope="module")
def nats_js() -> Iterator[NatsServer]:
    with running_nats() as server:
        yield server


@pytest.fixture(params=["configmap", "natskv", "memory"])
async def blobs(request: pytest.FixtureRequest) -> AsyncIterator[ChunkStore]:
    """A journal-kind blob store of each chunking backend, holding about :data:`ROOM` bytes a blob
    (and the test kit's in-memory one, held to the same lines)."""
    if request.param == "memory":
        yield MemoryBlobStore(room=ROOM, what="journal")
    elif request.param == "configmap":
        sim = Simulator()
        await sim.start()
        client = ApiClient(server=sim.url)
        try:
            yield ConfigMapBlobStore(client=client, namespace="default", prefix="keb", kind=JOURNALS,
                                     room=ROOM)
        finally:
            await client.close()
            await sim.stop()
    else:
        server: NatsServer = request.getfixturevalue("nats_js")
        nc = await nats.connect(server.url)
        kv = await nc.jetstream().create_key_value(bucket=f"storage-{next(_buckets)}", history=1)

        async def open_kv() -> object:
            return kv

        try:
            yield NatsKvBlobStore(open_kv=open_kv, bucket="storage",  # type: ignore[arg-type]
                                  journal=True, limit=lambda: ROOM + 256)
        finally:
            await nc.close()


def value(store: BlobStore, fence: Term | None = None) -> ChunkedValue:
    return ChunkedValue(store=store, ident=IDENT, fence=fence)


def text(n: int) -> bytes:
    """``n`` bytes of UTF-8 text with a two-byte character at every other position."""
    out = ("aé" * n).encode()[:n]
    return out if out[-1:] != b"\xc3" else out[:-1] + b"b"


async def test_a_value_that_fits_is_its_head_and_one_byte_more_is_chunked(blobs: ChunkStore) -> None:
    v = value(blobs)
    room = blobs.head_room(())
    assert room is not None
    exact = text(room)
    await v.rewrite(exact)
    assert v.chunks == ()
    assert await value(blobs).read() == exact
    longer = text(room + 1)
    await v.rewrite(longer)
    assert len(v.chunks) >= 1
    assert await value(blobs).read() == longer


async def test_chunks_never_exceed_a_blob_nor_split_a_character(blobs: ChunkStore) -> None:
    v = value(blobs)
    data = text(int(3.5 * blobs.chunk_room()))
    await v.rewrite(data)
    assert len(v.chunks) >= 3
    for chunk in v.chunks:
        stored = await blobs.get_chunk(chunk)
        assert stored is not None
        assert len(stored) <= blobs.chunk_room()
        stored.decode()  # whole characters only (a ConfigMap holds text)
    head = await blobs.get(IDENT)
    assert head is not None
    assert head.chunks == v.chunks
    assert await value(blobs).read() == data


async def test_appends_grow_the_head_then_seal_chunks_and_read_back_whole(blobs: ChunkStore) -> None:
    v = value(blobs)
    await v.rewrite(b"head\n")
    records = [b'["a","ns/o%d","u-%d","%d"]\n' % (i, i, 20 + i) for i in range(120)]
    for start in range(0, len(records), 7):
        await v.append(b"".join(records[start:start + 7]))
    assert v.chunks  # about 3.4 KB: beyond one blob
    assert await value(blobs).read() == b"head\n" + b"".join(records)


async def test_compare_and_set_refuses_a_stale_version(blobs: ChunkStore) -> None:
    first = await blobs.compare_and_set(IDENT, Head(inline=b"one"), None)
    with pytest.raises(BlobConflict):
        await blobs.compare_and_set(IDENT, Head(inline=b"two"), None)  # it exists
    second = await blobs.compare_and_set(IDENT, Head(inline=b"two"), first)
    with pytest.raises(BlobConflict):
        await blobs.compare_and_set(IDENT, Head(inline=b"three"), first)  # written since
    head = await blobs.get(IDENT)
    assert head is not None
    assert (head.inline, head.version) == (b"two", second)


async def test_a_claim_loses_to_a_write_made_since_it_read(blobs: ChunkStore) -> None:
    reader, writer = value(blobs), value(blobs)
    await writer.rewrite(b"first")
    head = await reader.fetch(None)
    assert head is not None
    await writer.rewrite(text(3 * ROOM))  # chunked, meanwhile
    assert not await reader.claim(head, b"claimed")
    assert await value(blobs).read() == text(3 * ROOM)
    head = await reader.fetch(None)
    assert head is not None
    assert await reader.claim(head, b"claimed")
    assert await value(blobs).read() == b"claimed"


async def test_a_deposed_writer_is_refused_and_its_chunks_are_swept(blobs: ChunkStore) -> None:
    old_term, new_term = Term(A), Term(B)
    old, new = value(blobs, old_term), value(blobs, new_term)
    await old.rewrite(b"by a\n")
    assert await new.read() == b"by a\n"
    await new.rewrite(b"by b\n")
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.append(b"late\n")
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.read()  # a stale leader does not resume from it either
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.append(b"late\n")  # nor does reading teach it the version to write over
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.rewrite(text(3 * ROOM))  # seals chunks first: orphans, the head is refused
    assert await value(blobs).read() == b"by b\n"
    assert await blobs.chunks_of(IDENT)  # the deposed writer's orphans
    new_term.token = None  # b's lease ran out too: it writes nothing at all
    with pytest.raises(CheckpointFencedError, match="not the leader"):
        await new.append(b"after the loss\n")
    successor = value(blobs, Term(B))
    assert await successor.read() == b"by b\n"
    await successor.rewrite(b"compacted\n")  # a run's first rewrite sweeps the orphans
    assert await blobs.chunks_of(IDENT) == []
    head = await blobs.get(IDENT)
    assert head is not None
    assert head.writer == B


class CrashBeforeHead:
    """Injects a crash between a write's chunks and its head: the head write fails while ``crash``."""

    def __init__(self, inner: ChunkStore) -> None:
        self.inner = inner
        self.crash = True

    def __getattr__(self, name: str) -> Callable[..., object]:
        attr: Callable[..., object] = getattr(self.inner, name)
        return attr

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        if self.crash:
            raise BlobStoreError("the process died here (injected)")
        return await self.inner.compare_and_set(ident, head, version)


async def test_orphans_of_a_crash_mid_write_are_swept_by_the_next_run(blobs: ChunkStore) -> None:
    before = text(2 * ROOM)
    await value(blobs).rewrite(before)
    listed = set(await blobs.chunks_of(IDENT))
    crashing = CrashBeforeHead(blobs)
    dying = value(crashing)  # type: ignore[arg-type]
    assert await dying.read() == before
    with pytest.raises(BlobStoreError, match="injected"):
        await dying.rewrite(text(4 * ROOM))
    orphans = set(await blobs.chunks_of(IDENT)) - listed
    assert orphans  # sealed before the head write that never happened
    restarted = value(blobs)
    assert await restarted.read() == before  # the last head written still commits complete chunks
    await restarted.rewrite(b"next run\n")
    assert await blobs.chunks_of(IDENT) == []
    assert await value(blobs).read() == b"next run\n"


async def test_the_same_writer_sweeps_after_its_own_failed_write(blobs: ChunkStore) -> None:
    crashing = CrashBeforeHead(blobs)
    v = value(crashing)  # type: ignore[arg-type]
    crashing.crash = False
    await v.rewrite(b"start\n")
    await v.rewrite(b"again\n")  # swept once already: nothing to list
    crashing.crash = True
    with pytest.raises(BlobStoreError):
        await v.rewrite(text(3 * ROOM))
    assert await blobs.chunks_of(IDENT)
    crashing.crash = False
    await v.rewrite(b"recovered\n")
    assert await blobs.chunks_of(IDENT) == []


async def test_without_chunking_a_value_larger_than_a_blob_is_refused(blobs: ChunkStore) -> None:
    v = ChunkedValue(store=blobs, ident=IDENT, fence=None, chunking=False, too_large=" (say what to do)")
    await v.rewrite(b"small\n")
    room = v.room()
    assert room is not None
    assert room < ROOM
    with pytest.raises(BlobStoreError, match=r"and chunking is off \(say what to do\)"):
        await v.append(text(ROOM + 1))
    assert await value(blobs).read() == b"small\n"


async def test_a_file_is_never_chunked(tmp_path: Path) -> None:
    """A file has no size limit: a value of any size is its one file, exactly its bytes."""
    files = FileBlobStore(directory=tmp_path, suffix=".ckpt", what="checkpoint", fsync=False)
    assert not isinstance(files, ChunkStore)
    v = value(files)
    data = text(3 << 20)
    await v.rewrite(data)
    await v.append(b"end")
    assert v.chunks == ()
    assert os.listdir(tmp_path) == [f"{IDENT}.ckpt"]
    assert (tmp_path / f"{IDENT}.ckpt").read_bytes() == data + b"end"
    assert await value(files).read() == data + b"end"


async def test_a_file_appended_in_place_refuses_an_append_after_it_was_replaced(tmp_path: Path) -> None:
    """Without a limit a file's group commits are appended in place (one write and fdatasync), its
    bytes not kept in memory: a file replaced meanwhile fails the append, and the journal then
    rewrites its whole durable state (as after any failed write)."""
    files = FileBlobStore(directory=tmp_path, suffix=".journal", what="journal", fsync=False)
    mine, other = value(files), value(files)
    await mine.rewrite(b"head\n")
    await mine.append(b"one\n")
    await mine.append(b"two\n")
    assert (tmp_path / f"{IDENT}.journal").read_bytes() == b"head\none\ntwo\n"
    assert await other.read() == b"head\none\ntwo\n"
    await other.rewrite(b"replaced\n")
    with pytest.raises(BlobStoreError, match="replaced meanwhile"):
        await mine.append(b"three\n")
    assert await value(files).read() == b"replaced\n"
    await mine.rewrite(b"head\none\ntwo\nthree\n")
    assert await value(files).read() == b"head\none\ntwo\nthree\n"


async def test_store_capabilities_are_protocols_every_built_in_store_has(tmp_path: Path) -> None:
    """What the pipeline needs beyond load and save is declared (``ListableCheckpointStore``,
    ``JournalStore``) and checked once when it is built: every built-in store has both; a store
    written against ``CheckpointStore`` alone has neither, and nothing else is looked for."""
    sim = Simulator()
    await sim.start()
    client = ApiClient(server=sim.url)
    try:
        stores = [FileCheckpointStore(directory=tmp_path),
                  ConfigMapCheckpointStore(client=client, namespace="default"),
                  NatsKvCheckpointStore(nats_url="nats://127.0.0.1:1")]
        for store in stores:
            assert isinstance(store, ListableCheckpointStore)
            assert isinstance(store, JournalStore)
        assert not isinstance(BareCheckpointStore(), JournalStore | ListableCheckpointStore)
    finally:
        await client.close()
        await sim.stop()


def test_no_store_is_probed_for_undeclared_attributes() -> None:
    """No ``getattr``/``hasattr`` on a store anywhere in the bridge: capabilities are Protocols."""
    root = Path(__file__).resolve().parents[2] / "bridge"
    probes = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and "store" in ast.unparse(node.args[0]).lower()):
                probes.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert probes == []
