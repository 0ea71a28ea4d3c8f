"""In-memory storage for tests: blob, checkpoint and journal stores that implement the real Protocols.

:class:`MemoryBlobStore` is a :class:`~bridge.storage.blobstore.BlobStore` (also a
:class:`~bridge.storage.blobstore.ChunkStore` and an
:class:`~bridge.storage.blobstore.AppendableBlobStore`) keeping heads and sealed chunks in dicts.
Without a ``room`` it behaves like a file (no size limit, appended in place); with one, like a
ConfigMap or a KV value (a value larger than a blob is sealed into chunks), so the one chunked
writer's paths can be driven without a backend.

:class:`MemoryCheckpointStore` is the bridge's own
:class:`~bridge.storage.checkpoint.BlobCheckpointStore` over two memory blob stores: the same
encoding, verification, fencing and known-object journal as the file, ConfigMap and NATS KV stores
(a :class:`~bridge.storage.checkpoint.ListableCheckpointStore` and a
:class:`~bridge.storage.checkpoint.JournalStore`). What it holds outlives the store object: build a
new store over :attr:`MemoryCheckpointStore.blobs` to "restart" on the same storage.

:class:`BareCheckpointStore` has the three methods of
:class:`~bridge.storage.checkpoint.CheckpointStore` and nothing else, as a third-party store may:
no listing, no journal, so a restart rests on the checkpoint alone. :class:`MemoryJournal` is a
:class:`~bridge.storage.blobstore.JournalBackend` on its own.

Every write yields to the event loop once (as a real store's I/O does), reads do not; nothing
sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from bridge.storage.blobstore import BlobConflict, Head
from bridge.storage.checkpoint import BlobCheckpointStore, Checkpoint
from bridge.storage.fencing import BlobStoreError, FenceSource

__all__ = ["BareCheckpointStore", "MemoryBlobStore", "MemoryBlobs", "MemoryCheckpointStore",
           "MemoryJournal"]

_LISTING_BYTES = 3
"""What a head spends per chunk it lists besides the name (a separator and quotes)."""


class MemoryBlobStore:
    """Heads and sealed chunks in memory (module docstring). ``room``: the bytes one blob holds
    (None: no limit, and values are appended to in place); ``chunk_room``: the bytes one sealed chunk
    holds (default ``room``). ``what`` names the kind in messages."""

    def __init__(self, *, room: int | None = None, chunk_room: int | None = None,
                 what: str = "blob") -> None:
        if room is not None and room < 1:
            raise ValueError(f"room must be at least 1 byte, not {room}")
        self._room = room
        self._chunk_room = chunk_room or room or 1 << 20
        self._what = what
        self._versions = itertools.count(1)
        self.heads: dict[str, Head] = {}
        """ident → its stored head (with its version)."""
        self.chunks: dict[str, tuple[str, bytes]] = {}
        """chunk name → (the ident of its value, its bytes)."""
        self.writes = 0
        """Head writes and appends (for tests that count I/O)."""

    # ---- BlobStore -------------------------------------------------------------------------------

    def describe(self, ident: str) -> str:
        return f"memory {self._what} {ident}"

    def head_room(self, chunks: Sequence[str]) -> int | None:
        if self._room is None:
            return None
        return max(0, self._room - sum(len(c) + _LISTING_BYTES for c in chunks))

    async def get(self, ident: str) -> Head | None:
        return self.heads.get(ident)

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        await asyncio.sleep(0)
        current = self.heads.get(ident)
        if (current.version if current is not None else None) != version:
            raise BlobConflict(f"{self.describe(ident)}: version "
                               f"{current.version if current else None}, not {version}")
        new = str(next(self._versions))
        self.heads[ident] = replace(head, version=new, damage="")
        self.writes += 1
        return new

    async def delete(self, ident: str) -> None:
        await asyncio.sleep(0)
        self.heads.pop(ident, None)

    async def list_heads(self, prefix: str) -> list[str]:
        return sorted(ident for ident in self.heads if ident.startswith(prefix))

    # ---- AppendableBlobStore ---------------------------------------------------------------------

    async def append(self, ident: str, data: bytes, version: str) -> str:
        await asyncio.sleep(0)
        current = self.heads.get(ident)
        if current is None or current.version != version:
            raise BlobConflict(f"{self.describe(ident)} was replaced")
        new = str(next(self._versions))
        self.heads[ident] = replace(current, inline=current.inline + data, version=new)
        self.writes += 1
        return new

    # ---- ChunkStore ------------------------------------------------------------------------------

    def chunk_room(self) -> int:
        return self._chunk_room

    def chunk_name(self, ident: str, generation: str, n: int) -> str:
        return f"{ident}.{generation}.{n}"

    async def put_chunk(self, ident: str, name: str, data: bytes) -> None:
        await asyncio.sleep(0)
        if name in self.chunks:
            raise BlobStoreError(f"chunk {name} of {self.describe(ident)} exists already")
        if len(data) > self._chunk_room:
            raise BlobStoreError(f"chunk {name}: {len(data)} bytes, more than a chunk holds "
                                 f"({self._chunk_room})")
        self.chunks[name] = (ident, bytes(data))

    async def get_chunk(self, name: str) -> bytes | None:
        entry = self.chunks.get(name)
        return None if entry is None else entry[1]

    async def delete_chunk(self, name: str) -> None:
        await asyncio.sleep(0)
        self.chunks.pop(name, None)

    async def chunks_of(self, ident: str) -> list[str]:
        return sorted(name for name, (owner, _) in self.chunks.items() if owner == ident)

    # ---- for tests -------------------------------------------------------------------------------

    def value(self, ident: str) -> bytes | None:
        """The whole value ``ident``'s head commits (its chunks' bytes, then its inline bytes), None
        when there is no head: what a reader would get, without the checks a reader makes."""
        head = self.heads.get(ident)
        if head is None:
            return None
        return b"".join(self.chunks[c][1] for c in head.chunks if c in self.chunks) + head.inline


@dataclass(slots=True)
class MemoryBlobs:
    """The storage of a :class:`MemoryCheckpointStore`: what outlives a store object (a "crash")."""

    checkpoints: MemoryBlobStore = field(default_factory=lambda: MemoryBlobStore(what="checkpoint"))
    journals: MemoryBlobStore = field(default_factory=lambda: MemoryBlobStore(what="journal"))


class MemoryCheckpointStore(BlobCheckpointStore):
    """The bridge's checkpoint store over memory blobs (module docstring). ``blobs``: storage a
    previous store wrote (default: new and empty); ``room``: bytes one blob holds (None: no limit,
    as a file; a number: values beyond it are chunked, as in a ConfigMap); ``fence``: the leader's
    term, as the fenced stores take it. Without a ``room`` a journal is appended to in place, as a
    file is, and an append checks only that this writer still leads; with one every write is a
    compare-and-set that the fence checks against the stored writer, as in a ConfigMap."""

    def __init__(self, *, blobs: MemoryBlobs | None = None, room: int | None = None,
                 fence: FenceSource | None = None) -> None:
        self.blobs = blobs if blobs is not None else MemoryBlobs(
            checkpoints=MemoryBlobStore(room=room, what="checkpoint"),
            journals=MemoryBlobStore(room=room, what="journal"))
        super().__init__(checkpoints=self.blobs.checkpoints, journals=self.blobs.journals, fence=fence)

    def stored(self, informer_id: str) -> bytes | None:
        """The encoded checkpoint stored for ``informer_id`` (None: none), read without a load."""
        return self.blobs.checkpoints.value(informer_id)

    def journal(self, informer_id: str) -> bytes | None:
        """The informer's known-object journal as stored (None: none)."""
        return self.blobs.journals.value(informer_id)


class BareCheckpointStore:
    """A :class:`~bridge.storage.checkpoint.CheckpointStore` and nothing more (module docstring):
    the checkpoints saved, by informer id, kept as the objects saved. ``initial``: checkpoints to
    start from (a scenario that starts the bridge from a chosen resourceVersion)."""

    def __init__(self, *initial: Checkpoint) -> None:
        self.saved: dict[str, Checkpoint] = {c.informer_id: c for c in initial}
        """informer id → the last checkpoint saved (or given)."""
        self.saves = 0
        self.closed = False

    async def load(self, informer_id: str) -> Checkpoint | None:
        return self.saved.get(informer_id)

    async def save(self, checkpoint: Checkpoint) -> None:
        await asyncio.sleep(0)
        self.saved[checkpoint.informer_id] = checkpoint
        self.saves += 1

    async def close(self) -> None:
        self.closed = True


class MemoryJournal:
    """A :class:`~bridge.storage.blobstore.JournalBackend` holding one journal's bytes in memory.
    ``room``: the bytes it holds at the most (None: no limit); an append beyond it raises
    :class:`~bridge.storage.fencing.BlobStoreError`, as a full store does."""

    def __init__(self, name: str = "memory journal", *, room: int | None = None) -> None:
        self._name = name
        self._room = room
        self.data: bytes | None = None
        """The journal's bytes (None: never written)."""
        self.writes = 0

    @property
    def name(self) -> str:
        return self._name

    async def read(self) -> bytes | None:
        return self.data

    async def rewrite(self, data: bytes) -> None:
        await asyncio.sleep(0)
        self._check(len(data))
        self.data = bytes(data)
        self.writes += 1

    async def append(self, data: bytes) -> None:
        await asyncio.sleep(0)
        current = self.data or b""
        self._check(len(current) + len(data))
        self.data = current + data
        self.writes += 1

    def room(self) -> int | None:
        return None if self._room is None else max(0, self._room - len(self.data or b""))

    def _check(self, size: int) -> None:
        if self._room is not None and size > self._room:
            raise BlobStoreError(f"cannot write {self._name}: {size} bytes, more than it holds "
                                 f"({self._room})")
