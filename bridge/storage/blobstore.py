"""One storage layer: a small fenced blob-store interface and the one chunked writer over it.

Checkpoints and known-object journals are values of any size kept in stores whose values are not (a
ConfigMap holds about 1 MiB, a NATS message the server's max payload). :class:`ChunkedValue` is the
only place that knows chunking, compare-and-set, fencing and the orphan sweep; a backend
(:mod:`~bridge.storage.blob_file`, :mod:`~bridge.storage.checkpoint_configmap`,
:mod:`~bridge.storage.checkpoint_natskv`) implements only its primitives: :class:`BlobStore` for
heads, and :class:`ChunkStore` when its values may outgrow one blob.

A value is a **head** (one stored blob, the commit point of every write, written only by
compare-and-set) and **sealed chunks** (blobs created once under a fresh name, never changed). A
value larger than the head's room is sealed into chunks of a fresh generation first and the head is
written last, so a crash at any point leaves the last head written pointing at complete chunks; a
chunk no head lists is an orphan, which costs space, never correctness. Store capabilities are
Protocols checked once, when a value is built; nothing probes a store.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from bridge.kube.leaderelection import FenceToken
from bridge.storage.fencing import (
    BlobStoreError,
    CheckpointCorruptError,
    CheckpointFencedError,
    CheckpointStoreError,
    FenceSource,
    check_fence,
    fence_token,
)

__all__ = ["AppendableBlobStore", "BlobConflict", "BlobStore", "ChunkStore", "ChunkedValue", "Head",
           "JournalBackend", "utf8_pieces"]

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 5
"""Compare-and-set rounds before a writer gives up (the value keeps changing under it)."""


@dataclass(frozen=True, slots=True)
class Head:
    """A value's head: its commit point."""

    writer: FenceToken | None = None
    """The lease token of the replica that wrote it (None without leader election)."""
    chunks: tuple[str, ...] = ()
    """The sealed chunks holding the value's beginning, in order."""
    inline: bytes = b""
    """The value's end, after the chunks' bytes (all of it when there are no chunks)."""
    digest: tuple[int, str] | None = None
    """(size, SHA-256 hex) of the whole value, for stores whose format keeps one."""
    version: str = ""
    """The store's version of the stored head (a ConfigMap's resourceVersion, a KV revision)."""
    damage: str = ""
    """Why the stored head could not be parsed ("" = it could): unreadable, yet replaceable."""


class BlobConflict(Exception):
    """The head changed since it was last read or written, or was created or deleted meanwhile."""


class BlobStore(Protocol):
    """One backend's primitives for the heads of one kind of value (checkpoints, or journals).
    ``ident`` is the value's logical name (an informer id); the store maps it to its own names.
    Every method raises :class:`~bridge.storage.fencing.BlobStoreError` (or another
    :class:`~bridge.storage.fencing.CheckpointStoreError`) when the store fails."""

    def describe(self, ident: str) -> str:
        """Where the value lives, for messages (``ConfigMap ns/name``)."""
        ...

    def head_room(self, chunks: Sequence[str]) -> int | None:
        """Inline bytes a head listing ``chunks`` holds (None: no limit)."""
        ...

    async def get(self, ident: str) -> Head | None:
        """The stored head (with its version), None when there is none; one that cannot be parsed
        comes back with ``damage`` set."""
        ...

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        """Writes ``head`` if the stored version is ``version`` (None: creates it, it must not exist)
        and returns the new version; raises :class:`BlobConflict` when the version does not match."""
        ...

    async def delete(self, ident: str) -> None:
        """Deletes the head (absent: nothing to do)."""
        ...

    async def list_heads(self, prefix: str) -> list[str]:
        """The idents of the stored heads that start with ``prefix``, sorted."""
        ...


@runtime_checkable
class ChunkStore(BlobStore, Protocol):
    """A store that also keeps sealed chunks, for values larger than one head."""

    def chunk_room(self) -> int:
        """Bytes one sealed chunk holds."""
        ...

    def chunk_name(self, ident: str, generation: str, n: int) -> str:
        """The name of chunk ``n`` of a generation (unique: the generation is random)."""
        ...

    async def put_chunk(self, ident: str, name: str, data: bytes) -> None:
        """Creates a sealed chunk of the value ``ident`` (its name is new)."""
        ...

    async def get_chunk(self, name: str) -> bytes | None:
        """A chunk's bytes, None when it does not exist."""
        ...

    async def delete_chunk(self, name: str) -> None:
        """Deletes a chunk (absent: nothing to do)."""
        ...

    async def chunks_of(self, ident: str) -> list[str]:
        """The names of every stored chunk of the value (listed or not by its head): to find orphans."""
        ...


@runtime_checkable
class AppendableBlobStore(BlobStore, Protocol):
    """A store that appends to a head in place (a file: one write and ``fdatasync``)."""

    async def append(self, ident: str, data: bytes, version: str) -> str:
        """Appends ``data`` to the head's inline bytes if its version is ``version``; returns the new
        version. Raises :class:`BlobConflict` on a mismatch; a failure may leave a torn tail."""
        ...


class JournalBackend(Protocol):
    """Where one informer's journal bytes live (:mod:`bridge.delivery.journal`): stored durably,
    whole or appended to. Every method raises :class:`OSError` or
    :class:`~bridge.storage.fencing.CheckpointError` on failure."""

    @property
    def name(self) -> str:
        """Where the journal lives, for messages."""
        ...

    async def read(self) -> bytes | None:
        """The stored journal, None when there is none."""
        ...

    async def rewrite(self, data: bytes) -> None:
        """Replaces the whole journal by ``data``, durably and atomically."""
        ...

    async def append(self, data: bytes) -> None:
        """Appends ``data`` durably (after a :meth:`rewrite` of this run). A failure may leave a torn
        tail: the journal rewrites everything before its next append."""
        ...

    def room(self) -> int | None:
        """Bytes an append may still add (None: no limit). Records that do not fit wait for a
        compaction (after the next checkpoint write) to make room."""
        ...


class ChunkedValue:
    """One value of a :class:`BlobStore` (see the module docstring); a :class:`JournalBackend`.

    A chunked head carries the value's size and SHA-256 (in the stores whose format keeps it), which a
    read verifies. ``chunking=False`` (or a store without chunks) keeps every value in its head;
    ``too_large``: what the error says when one does not fit. ``what`` names the kind in messages (a
    journal's own messages name it)."""

    def __init__(self, *, store: BlobStore, ident: str, fence: FenceSource | None,
                 chunking: bool = True, too_large: str = "", what: str = "") -> None:
        self._store = store
        self._chunk_store = store if isinstance(store, ChunkStore) else None
        self._what = f"{what} " if what else ""
        self._too_large = too_large
        self._ident = ident
        self._fence = fence
        self._chunking = chunking and self._chunk_store is not None
        self._appends = store if isinstance(store, AppendableBlobStore) else None
        self._version: str | None = None
        """Version of the head as last read or written; None = not known to exist."""
        self._chunks: tuple[str, ...] = ()
        self._tail = b""
        self._swept = False
        """Whether orphan chunks were looked for since this value started or last failed."""
        self.writes = 0
        """Head writes (one per group commit or rewrite)."""
        self.chunk_writes = 0
        """Chunks created."""

    @property
    def name(self) -> str:
        return self._what + self._store.describe(self._ident)

    @property
    def chunks(self) -> tuple[str, ...]:
        """The chunks the head lists, as last read or written."""
        return self._chunks

    # ---- reading ---------------------------------------------------------------------------------

    async def read(self) -> bytes | None:
        head = await self.fetch(fence_token(self._fence, f"loading {self.name}"))
        return None if head is None else await self.assemble(head)

    async def fetch(self, token: FenceToken | None) -> Head | None:
        """The stored head, checked against ``token`` (a later leader's is refused with
        :class:`~bridge.storage.fencing.CheckpointFencedError`); a damaged one raises
        :class:`~bridge.storage.fencing.CheckpointCorruptError`."""
        head = await self._store.get(self._ident)
        self._swept = False  # a read starts a run (or follows a crash's): look for orphans again
        if head is None:
            self._version, self._chunks, self._tail = None, (), b""
            return None
        if head.damage:
            self._version = head.version  # unreadable, yet a write may replace it
            raise CheckpointCorruptError(f"{self.name}: {head.damage}")
        check_fence(token, head.writer, self.name)  # before it adopts the version
        self._version, self._chunks, self._tail = head.version, head.chunks, self._kept(head.inline)
        return head

    async def assemble(self, head: Head) -> bytes:
        """The value ``head`` commits: its chunks' bytes and its inline bytes, verified against its
        digest. Raises :class:`~bridge.storage.fencing.CheckpointCorruptError` when a chunk is
        missing or the digest does not match."""
        parts: list[bytes] = []
        for n, chunk in enumerate(head.chunks):
            data = None if self._chunk_store is None else await self._chunk_store.get_chunk(chunk)
            if data is None:
                raise CheckpointCorruptError(
                    f"{self.name}: chunk {n} ({chunk}) of {len(head.chunks)} is missing")
            parts.append(data)
        parts.append(head.inline)
        value = b"".join(parts)
        if head.digest is not None and head.digest != _digest(value):
            raise CheckpointCorruptError(f"{self.name}: chunks do not match the manifest checksum")
        return value

    # ---- writing ---------------------------------------------------------------------------------

    async def rewrite(self, data: bytes) -> None:
        """Replaces the whole value, then deletes the chunks no head lists any more."""
        previous = self._chunks
        await self._write((), b"", data, retry=True)
        await self._drop(previous)

    async def claim(self, head: Head, data: bytes) -> bool:
        """Rewrites the value ``head`` committed as ``data`` (the same value stamped with this
        writer's token) if nothing was written since it was read; False when something was."""
        previous, self._version = head.chunks, head.version
        try:
            await self._write((), b"", data, retry=False)
        except BlobConflict:
            return False
        await self._drop(previous)
        return True

    async def append(self, data: bytes) -> None:
        if self._appends is not None and self._version is not None and self._store.head_room(()) is None:
            # In place (a file without a limit): the head is not kept in memory, so a head replaced
            # meanwhile fails the append, and the journal rewrites its whole durable state.
            fence_token(self._fence, self.name)
            try:
                self._version = await self._appends.append(self._ident, data, self._version)
            except BlobConflict as exc:
                self._version = None
                raise BlobStoreError(f"cannot append to {self.name}: it was replaced meanwhile") from exc
            self._tail = b""
            self.writes += 1
            return
        await self._write(self._chunks, self._tail, data, retry=True)

    def room(self) -> int | None:
        if self._chunking:
            return None
        room = self._store.head_room(())
        return None if room is None else max(0, room - len(self._tail))

    async def remove(self) -> None:
        """Deletes the head, then (best effort) every chunk of the value."""
        await self._store.delete(self._ident)
        self._version, previous, self._chunks, self._tail = None, self._chunks, (), b""
        self._swept = False
        await self._drop(previous)

    # ---------------------------------------------------------------------------------------------

    async def _write(self, chunks: tuple[str, ...], tail: bytes, data: bytes, *, retry: bool) -> None:
        """Writes a value whose bytes are ``chunks`` + ``tail`` + ``data``: in the head when it fits,
        else sealed into new chunks first (the last piece stays in the head when it fits there)."""
        content = tail + data
        room = self._store.head_room(chunks)
        if room is None or len(content) <= room:
            await self._put_head(Head(chunks=chunks, inline=content), retry=retry)
            return
        store = self._chunk_store
        if store is None or not self._chunking:
            raise BlobStoreError(f"cannot write {self.name}: {len(content)} bytes, more than one value "
                                 f"holds ({room}), and chunking is off{self._too_large}")
        digest = None if chunks else _digest(content)
        pieces = utf8_pieces(content, store.chunk_room())
        generation = uuid.uuid4().hex[:10]
        names = [store.chunk_name(self._ident, generation, n) for n in range(len(pieces))]
        last_room = self._store.head_room((*chunks, *names[:-1]))
        keep_tail = last_room is None or len(pieces[-1]) <= last_room
        sealed = pieces[:-1] if keep_tail else pieces
        created = tuple(names[:len(sealed)])
        try:
            for name, piece in zip(created, sealed, strict=True):
                await store.put_chunk(self._ident, name, piece)
                self.chunk_writes += 1
            inline = pieces[-1] if keep_tail else b""
            await self._put_head(Head(chunks=(*chunks, *created), inline=inline, digest=digest),
                                 retry=retry)
        except BaseException:
            # Not deleted here: a head write that failed may still have been applied. The next
            # rewrite looks for orphans.
            self._swept = False
            raise

    async def _put_head(self, head: Head, *, retry: bool) -> None:
        token = fence_token(self._fence, self.name)
        head = replace(head, writer=token)
        for _ in range(CAS_ATTEMPTS):
            try:
                self._version = await self._store.compare_and_set(self._ident, head, self._version)
            except BlobConflict:
                if not retry:
                    raise
                try:
                    current = await self._store.get(self._ident)
                except CheckpointCorruptError as exc:  # cannot tell whose it is: not overwritten
                    raise BlobStoreError(f"cannot write {self.name}: {exc}") from exc
                if current is not None:
                    check_fence(token, current.writer, self.name)  # before it adopts the version
                self._version = None if current is None else current.version
                continue
            self._chunks, self._tail = head.chunks, self._kept(head.inline)
            self.writes += 1
            return
        raise CheckpointFencedError(f"{self.name}: kept changing under this writer; refused")

    def _kept(self, inline: bytes) -> bytes:
        """What of a head's inline bytes an append needs: nothing when the head has no limit (it is
        appended to in place, or rewritten whole), so a file's value is not held in memory."""
        return inline if self._store.head_room(()) is not None else b""

    async def _drop(self, previous: Sequence[str]) -> None:
        """Deletes the chunks of ``previous`` the head no longer lists and, once per run (and after
        a failure), every other orphan. Best effort: an orphan costs space, never correctness."""
        store = self._chunk_store
        if store is None:
            return
        stale = [c for c in previous if c not in self._chunks]
        if self._chunking and not self._swept:  # without chunking there are none (nor may it list)
            self._swept = True
            with contextlib.suppress(CheckpointStoreError, OSError):
                stored = await store.chunks_of(self._ident)
                stale.extend(c for c in stored if c not in self._chunks and c not in stale)
        for chunk in stale:
            try:
                await store.delete_chunk(chunk)
            except (CheckpointStoreError, OSError) as exc:
                log.debug("%s: cannot delete chunk %s: %s", self.name, chunk, exc)


def _digest(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


def utf8_pieces(data: bytes, limit: int) -> list[bytes]:
    """Splits UTF-8 ``data`` into pieces of at most ``limit`` bytes, never inside a character (a
    ConfigMap holds text); at least one piece."""
    out: list[bytes] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        # Step back over continuation bytes (10xxxxxx) so the slice ends on a character boundary.
        while end < len(data) and end > start + 1 and (data[end] & 0xC0) == 0x80:
            end -= 1
        out.append(data[start:end])
        start = end
    return out or [b""]
