"""A checkpoint store in a NATS JetStream key-value bucket.

For deployments that already run NATS: checkpoints survive the pod and its volume, and several
replicas of the bridge (leader-elected) share them. A checkpoint of a large informer can exceed the
server's maximum message size (1 MiB by default), so values are chunked:

* ``<informer_id>.c.<generation>.<n>`` hold consecutive slices of the encoded checkpoint
  (:func:`bridge.checkpoint.encode_checkpoint`, which carries its own length and SHA-256);
* ``<informer_id>`` is the manifest: ``{"generation", "chunks", "size", "sha256"}``.

A save writes every chunk of a fresh generation first and the manifest last, so a crash mid-save
leaves the previous manifest pointing at the previous, complete chunks. Chunks of older generations
(including ones orphaned by a crash) are purged after the manifest is written.

Fencing (with a ``fence``, see :mod:`bridge.delivery.checkpoint`): the manifest carries the writer's
lease token and is only written with the revision this store last read or wrote (a KV update with
the expected last revision; a create when there was none). After a mismatch the manifest is read
again and the write goes ahead only if the stored token is not a later leader's. Loading rewrites
the token with the loader's under the same precondition, claiming the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue

from bridge.delivery.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointFencedError,
    CheckpointStoreError,
    FenceSource,
    check_fence,
    decode_checkpoint,
    encode_checkpoint,
    fence_token,
)
from bridge.delivery.journal import ChunkedJournalBackend, JournalConflict, JournalHead, JournalStoreError
from bridge.kube.leaderelection import FenceToken

__all__ = ["NatsKvCheckpointStore", "NatsKvJournalBackend"]

log = logging.getLogger(__name__)

_HEADROOM = 8 * 1024
"""Bytes kept free in each message for the subject and headers."""
_CAS_ATTEMPTS = 5
_JOURNAL_HEAD = 256
"""Bytes of a journal value kept for its header line (the writer's token)."""


class NatsKvCheckpointStore:
    """Checkpoints in the KV bucket ``bucket`` (created with history 1 if missing).

    Give either ``nats_url`` (the store connects and owns the connection) or an already connected
    ``nc`` (left open on :meth:`close`). ``chunk_size`` defaults to the server's max payload less
    some headroom.
    """

    def __init__(
        self,
        *,
        nats_url: str | None = None,
        nc: NatsClient | None = None,
        bucket: str = "kube-event-bridge-checkpoints",
        chunk_size: int | None = None,
        connect_timeout: float = 5.0,
        fence: FenceSource | None = None,
        journal_bytes: int | None = None,
    ) -> None:
        """``journal_bytes``: the most one value of the known-object journal holds (default: as a
        checkpoint chunk, the server's max payload less some headroom; the journal spans several)."""
        if (nats_url is None) == (nc is None):
            raise ValueError("give exactly one of nats_url or nc")
        self._fence = fence
        self._revision: dict[str, int] = {}
        """informer id → revision of the manifest as this store last read or wrote it."""
        self._url = nats_url
        self._nc = nc
        self._owns_nc = nc is None
        self._bucket = bucket
        self._chunk_size = chunk_size
        self._journal_bytes = journal_bytes
        self._connect_timeout = connect_timeout
        self._kv: KeyValue | None = None

    async def _bucket_kv(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        try:
            if self._nc is None:
                assert self._url is not None
                self._nc = await nats.connect(
                    self._url, connect_timeout=self._connect_timeout, max_reconnect_attempts=3,
                    reconnect_time_wait=0.5, allow_reconnect=True, error_cb=self._on_error,
                )
            js = self._nc.jetstream()
            try:
                self._kv = await js.key_value(self._bucket)
            except nats.js.errors.BucketNotFoundError:
                self._kv = await js.create_key_value(bucket=self._bucket, history=1)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise CheckpointStoreError(
                f"cannot open the NATS KV bucket {self._bucket!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return self._kv

    async def _on_error(self, exc: Exception) -> None:
        # nats-py's default callback logs every connection error with a full traceback; what
        # failed is said by the error itself (and the store's caller reports the outcome).
        log.warning("checkpoint store: NATS connection error: %s: %s", type(exc).__name__, exc,
                    extra={"bucket": self._bucket})

    def _chunk_limit(self) -> int:
        if self._chunk_size is not None:
            return self._chunk_size
        max_payload = self._nc.max_payload if self._nc is not None else 1024 * 1024
        return max(1024, max_payload - _HEADROOM)

    def journal_key(self, informer_id: str) -> str:
        """The key of the informer's known-object journal (:mod:`bridge.delivery.journal`)."""
        return f"{informer_id}.journal"

    def journal_backend(self, informer_id: str, *, fenced: bool = True) -> NatsKvJournalBackend:
        """The informer's known-object journal storage: a key of the bucket, written with the same
        fencing as the manifest, and its sealed chunks when it outgrows one message.
        ``fenced=False``: another shard's journal, read during a take-over (see :meth:`peek`)."""
        return NatsKvJournalBackend(open_kv=self._bucket_kv, key=self.journal_key(informer_id),
                                    bucket=self._bucket, fence=self._fence if fenced else None,
                                    limit=self._journal_limit)

    def _journal_limit(self) -> int:
        limit = self._chunk_limit()
        return limit if self._journal_bytes is None else min(limit, self._journal_bytes + _JOURNAL_HEAD)

    async def load(self, informer_id: str) -> Checkpoint | None:
        return await self._load(informer_id, fence_token(self._fence,
                                                         f"loading NATS KV checkpoint {informer_id!r}"))

    async def peek(self, informer_id: str) -> Checkpoint | None:
        """The checkpoint, read without claiming it (another shard's, during a take-over)."""
        return await self._load(informer_id, None)

    async def informer_ids(self, prefix: str) -> list[str]:
        kv = await self._bucket_kv()
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise CheckpointStoreError(f"cannot list the NATS KV bucket {self._bucket!r}: {exc}") from exc
        # Manifests are keyed by the informer id; chunks and journals have suffixes of their own.
        return sorted(k for k in keys if k.startswith(prefix) and not k.endswith(".journal")
                      and ".c." not in k[len(prefix):])

    async def remove(self, informer_id: str) -> None:
        fence_token(self._fence, f"removing NATS KV checkpoint {informer_id!r}")
        kv = await self._bucket_kv()
        journal = self.journal_key(informer_id)
        # The manifest, its chunks, the journal's head and the journal's sealed chunks.
        prefixes = (f"{informer_id}.c.", f"{journal}.c.")
        try:
            try:
                keys = await kv.keys()
            except nats.js.errors.NoKeysError:
                return
            for key in keys:
                if key in (informer_id, journal) or key.startswith(prefixes):
                    await kv.purge(key)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise CheckpointStoreError(f"cannot remove NATS KV checkpoint {informer_id!r}: {exc}") from exc
        self._revision.pop(informer_id, None)

    async def _load(self, informer_id: str, token: FenceToken | None) -> Checkpoint | None:
        kv = await self._bucket_kv()
        for _ in range(_CAS_ATTEMPTS):
            try:
                try:
                    manifest_entry = await kv.get(informer_id)
                except nats.js.errors.KeyNotFoundError:
                    self._revision.pop(informer_id, None)
                    return None
                raw_manifest = manifest_entry.value or b""
                manifest = _parse_manifest(raw_manifest, informer_id)
                parts: list[bytes] = []
                for n in range(manifest["chunks"]):
                    key = _chunk_key(informer_id, manifest["generation"], n)
                    try:
                        parts.append((await kv.get(key)).value or b"")
                    except nats.js.errors.KeyNotFoundError as exc:
                        raise CheckpointCorruptError(
                            f"NATS KV checkpoint {informer_id!r}: chunk {n} of {manifest['chunks']} "
                            "is missing") from exc
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                raise CheckpointStoreError(
                    f"cannot read checkpoint {informer_id!r} from NATS KV: {exc}") from exc
            data = b"".join(parts)
            if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
                raise CheckpointCorruptError(
                    f"NATS KV checkpoint {informer_id!r}: chunks do not match the manifest checksum"
                )
            try:
                checkpoint = decode_checkpoint(data, informer_id)
            except CheckpointCorruptError as exc:
                raise CheckpointCorruptError(f"NATS KV checkpoint {informer_id!r}: {exc}") from exc
            what = f"NATS KV checkpoint {informer_id!r}"
            check_fence(token, manifest["writer"], what)
            check_fence(token, checkpoint.writer, what)
            self._revision[informer_id] = int(manifest_entry.revision or 0)
            if token is None or manifest["writer"] == token:
                return checkpoint
            # Claim it for this term: from now on an older leader's update fails.
            claimed = orjson.dumps({**orjson.loads(raw_manifest),
                                    "writer": [token.transitions, token.holder]})
            try:
                self._revision[informer_id] = await kv.update(informer_id, claimed,
                                                              last=self._revision[informer_id])
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                raise CheckpointStoreError(f"cannot claim NATS KV checkpoint {informer_id!r}: {exc}") from exc
            return checkpoint
        raise CheckpointStoreError(f"cannot claim NATS KV checkpoint {informer_id!r}: it keeps changing")

    async def save(self, checkpoint: Checkpoint) -> None:
        token = fence_token(self._fence, f"NATS KV checkpoint {checkpoint.informer_id!r}")
        if token is not None:
            checkpoint = dataclasses.replace(checkpoint, writer=token)
        kv = await self._bucket_kv()
        data = encode_checkpoint(checkpoint)
        limit = self._chunk_limit()
        generation = uuid.uuid4().hex[:12]
        chunks = [data[i : i + limit] for i in range(0, len(data), limit)] or [b""]
        ident = checkpoint.informer_id
        manifest = orjson.dumps({
            "generation": generation,
            "chunks": len(chunks),
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            **({"writer": [token.transitions, token.holder]} if token is not None else {}),
        })
        previous = await self._current_manifest(kv, ident)
        try:
            for n, chunk in enumerate(chunks):
                await kv.put(_chunk_key(ident, generation, n), chunk)
            if token is None:
                await kv.put(ident, manifest)
            else:
                await self._put_fenced(kv, ident, manifest, token)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise CheckpointStoreError(f"cannot write checkpoint {ident!r} to NATS KV: {exc}") from exc
        log.debug("checkpoint written", extra={"informer": ident,
                                              "resource_version": checkpoint.resource_version,
                                              "writer": token.holder if token else "",
                                              "lease_transitions": token.transitions if token else None})
        await self._purge_old_chunks(kv, ident, generation, previous)

    async def _put_fenced(self, kv: KeyValue, ident: str, manifest: bytes, token: FenceToken) -> None:
        """Writes the manifest with the expected revision; after a mismatch, again only if the
        stored writer is not a later leader."""
        what = f"NATS KV checkpoint {ident!r}"
        for _ in range(_CAS_ATTEMPTS):
            last = self._revision.get(ident)
            try:
                if last is None:
                    self._revision[ident] = await kv.create(ident, manifest)
                else:
                    self._revision[ident] = await kv.update(ident, manifest, last=last)
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                try:
                    entry = await kv.get(ident)
                except nats.js.errors.KeyNotFoundError:
                    self._revision.pop(ident, None)
                    continue
                try:
                    stored = _parse_manifest(entry.value or b"", ident)["writer"]
                except CheckpointCorruptError:
                    stored = None
                check_fence(token, stored, what)
                self._revision[ident] = int(entry.revision or 0)
        raise CheckpointFencedError(f"{what}: kept changing under this writer; refused")

    async def _current_manifest(self, kv: KeyValue, ident: str) -> dict[str, Any] | None:
        try:
            return _parse_manifest((await kv.get(ident)).value or b"", ident)
        except (nats.errors.Error, OSError, TimeoutError, CheckpointCorruptError):
            return None

    async def _purge_old_chunks(
        self, kv: KeyValue, ident: str, keep: str, previous: dict[str, Any] | None
    ) -> None:
        prefix = f"{ident}.c."
        # Best effort: a leftover chunk costs space, never correctness.
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            if previous is not None and previous["generation"] != keep:
                for n in range(previous["chunks"]):
                    await kv.purge(_chunk_key(ident, previous["generation"], n))
            # Chunks orphaned by a crash between chunk writes and the manifest write.
            keys = await kv.keys()
            for key in keys:
                if key.startswith(prefix) and not key.startswith(f"{prefix}{keep}."):
                    await kv.purge(key)

    async def close(self) -> None:
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None and self._owns_nc and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await nc.close()
        if not self._owns_nc:
            self._nc = nc


class NatsKvJournalBackend(ChunkedJournalBackend):
    """A known-object journal in keys of the checkpoint bucket
    (:class:`~bridge.delivery.journal.ChunkedJournalBackend`).

    The head is the key ``key``: a header line ``{"writer": [leaseTransitions, holder] | null,
    "chunks": [...]}`` (``chunks`` only when there are sealed chunks), then the journal's tail. It is
    written with the revision this backend last read or wrote (a KV update with the expected last
    revision; a create when there was none), so one group commit is one acknowledged JetStream
    write and there is never a torn tail. Sealed chunks are the keys ``<key>.c.<generation>.<n>``,
    each at most one message; they are written once and purged once no head lists them.
    """

    def __init__(self, *, open_kv: Callable[[], Awaitable[KeyValue]], key: str, bucket: str,
                 fence: FenceSource | None, limit: Callable[[], int]) -> None:
        super().__init__(fence=fence)
        self._open_kv = open_kv
        self._key = key
        self._bucket = bucket
        self._limit = limit

    @property
    def name(self) -> str:
        return f"NATS KV {self._bucket}/{self._key}"

    async def _load_head(self) -> JournalHead | None:
        kv = await self._kv()
        try:
            entry = await kv.get(self._key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot read journal {self.name}: {exc}") from exc
        version = str(entry.revision or 0)
        try:
            writer, chunks, tail = _parse_journal_value(entry.value or b"", self.name)
        except JournalStoreError as exc:
            return JournalHead(version=version, writer=None, chunks=(), tail=b"", damage=str(exc))
        return JournalHead(version=version, writer=writer, chunks=chunks, tail=tail)

    async def _store_head(self, version: str | None, writer: FenceToken | None, chunks: Sequence[str],
                          tail: bytes) -> str:
        value = _journal_head(writer, chunks) + b"\n" + tail
        kv = await self._kv()
        try:
            if version is None:
                revision = await kv.create(self._key, value)
            else:
                revision = await kv.update(self._key, value, last=int(version))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise JournalConflict(str(exc)) from exc
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot write journal {self.name}: {exc}") from exc
        return str(revision)

    def _head_room(self, chunks: Sequence[str]) -> int:
        return self._limit() - _JOURNAL_HEAD - len(_journal_head(None, chunks))

    def _chunk_room(self) -> int:
        return self._limit()

    def _chunk_name(self, generation: str, n: int) -> str:
        return f"{self._key}.c.{generation}.{n}"

    async def _create_chunk(self, name: str, data: bytes) -> None:
        kv = await self._kv()
        try:
            await kv.put(name, data)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot write a chunk of journal {self.name}: {exc}") from exc

    async def _read_chunk(self, name: str) -> bytes | None:
        kv = await self._kv()
        try:
            return (await kv.get(name)).value or b""
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot read a chunk of journal {self.name}: {exc}") from exc

    async def _delete_chunk(self, name: str) -> None:
        kv = await self._kv()
        try:
            await kv.purge(name)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot purge a chunk of journal {self.name}: {exc}") from exc

    async def _stored_chunks(self) -> list[str]:
        kv = await self._kv()
        prefix = f"{self._key}.c."
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise JournalStoreError(f"cannot list the chunks of journal {self.name}: {exc}") from exc
        return [k for k in keys if k.startswith(prefix)]

    async def _kv(self) -> KeyValue:
        try:
            return await self._open_kv()
        except CheckpointStoreError as exc:
            raise JournalStoreError(str(exc)) from exc


def _journal_head(writer: FenceToken | None, chunks: Sequence[str]) -> bytes:
    head: dict[str, Any] = {"writer": [writer.transitions, writer.holder] if writer is not None else None}
    if chunks:
        head["chunks"] = list(chunks)
    return orjson.dumps(head)


def _parse_journal_value(raw: bytes, name: str) -> tuple[FenceToken | None, tuple[str, ...], bytes]:
    """(stored writer, sealed chunks, journal tail) of a journal head value."""
    head, sep, text = raw.partition(b"\n")
    try:
        if not sep:
            raise ValueError("no header line")
        doc = orjson.loads(head)
        writer = doc["writer"]
        token = (FenceToken(transitions=int(writer[0]), holder=str(writer[1]))
                 if writer is not None else None)
        chunks = doc.get("chunks") or []
        if not isinstance(chunks, list) or not all(isinstance(c, str) and c for c in chunks):
            raise ValueError("chunks is not a list of keys")
        return token, tuple(chunks), text
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise JournalStoreError(f"journal {name} is malformed") from exc


def _chunk_key(ident: str, generation: str, n: int) -> str:
    return f"{ident}.c.{generation}.{n}"


def _parse_manifest(raw: bytes, ident: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
        manifest: dict[str, Any] = {
            "generation": str(doc["generation"]),
            "chunks": int(doc["chunks"]),
            "size": int(doc["size"]),
            "sha256": str(doc["sha256"]),
            "writer": (FenceToken(transitions=int(doc["writer"][0]), holder=str(doc["writer"][1]))
                       if doc.get("writer") is not None else None),
        }
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointCorruptError(f"NATS KV checkpoint {ident!r}: the manifest is malformed") from exc
    if manifest["chunks"] < 1 or not manifest["generation"].isalnum():
        raise CheckpointCorruptError(f"NATS KV checkpoint {ident!r}: the manifest is malformed")
    return manifest
