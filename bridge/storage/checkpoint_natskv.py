"""A checkpoint store in a NATS JetStream key-value bucket.

For deployments that already run NATS: checkpoints survive the pod and its volume, and several
replicas of the bridge (leader-elected) share them. A checkpoint of a large informer can exceed the
server's maximum message size (1 MiB by default), so values are chunked by the storage layer's one
writer (:class:`~bridge.storage.blobstore.ChunkedValue`); this module supplies only the KV
primitives (:class:`NatsKvBlobStore`) and their format:

* a checkpoint's **manifest** is the key ``<informer_id>``: ``{"generation", "chunks", "size",
  "sha256", "writer"}``; its chunks, ``<informer_id>.c.<generation>.<n>``, hold consecutive slices of
  the encoded checkpoint (:func:`~bridge.storage.checkpoint.encode_checkpoint`);
* a known-object journal's **head** is the key ``<informer_id>.journal``: a header line
  ``{"writer": [leaseTransitions, holder] | null, "chunks": [...]}`` (``chunks`` only when there are
  sealed chunks, the keys ``<head>.c.<generation>.<n>``), then the journal's tail.

Heads are written with the revision last read or written (a KV update with the expected last
revision; a create when there was none), so a deposed leader's write fails on the revision and then
on the token (:mod:`bridge.storage.fencing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.kv import KeyValue

from bridge.kube.leaderelection import FenceToken
from bridge.storage.blobstore import BlobConflict, Head
from bridge.storage.checkpoint import BlobCheckpointStore, Checkpoint
from bridge.storage.fencing import BlobStoreError, CheckpointStoreError, FenceSource, token_json, token_of

__all__ = ["NatsKvBlobStore", "NatsKvCheckpointStore"]

log = logging.getLogger(__name__)

_HEADROOM = 8 * 1024
"""Bytes kept free in each message for the subject and headers."""
_JOURNAL_HEAD = 256
"""Bytes of a journal value kept for its header line (the writer's token)."""
_FAILURES = (nats.errors.Error, OSError, TimeoutError)


class NatsKvBlobStore:
    """The KV primitives (a :class:`~bridge.storage.blobstore.BlobStore`) for checkpoints
    (``journal=False``) or journals in one bucket; ``limit``: bytes one value holds."""

    def __init__(self, *, open_kv: Callable[[], Awaitable[KeyValue]], bucket: str, journal: bool,
                 limit: Callable[[], int]) -> None:
        self._open_kv = open_kv
        self._bucket = bucket
        self._journal = journal
        self._limit = limit

    def key_of(self, ident: str) -> str:
        return f"{ident}.journal" if self._journal else ident

    @property
    def _what(self) -> str:
        return "journal" if self._journal else "checkpoint"

    def describe(self, ident: str) -> str:
        return f"NATS KV {self._bucket}/{self.key_of(ident)}"

    def head_room(self, chunks: Sequence[str]) -> int | None:
        if not self._journal:
            return 0  # a manifest lists its chunks, it holds none of the checkpoint
        return self._limit() - _JOURNAL_HEAD - len(_journal_head(None, chunks))

    def chunk_room(self) -> int:
        return self._limit()

    def chunk_name(self, ident: str, generation: str, n: int) -> str:
        return f"{self.key_of(ident)}.c.{generation}.{n}"

    async def get(self, ident: str) -> Head | None:
        kv = await self._open_kv()
        try:
            entry = await kv.get(self.key_of(ident))
        except nats.js.errors.KeyNotFoundError:
            return None
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot read {self._what} {self.describe(ident)}: {exc}") from exc
        version, raw = str(entry.revision or 0), entry.value or b""
        try:
            head = _parse_journal(raw) if self._journal else _parse_manifest(raw, self.key_of(ident))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, IndexError):
            return Head(version=version, damage=f"the {'head' if self._journal else 'manifest'} is malformed")
        return replace(head, version=version)

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        key = self.key_of(ident)
        value = (_journal_head(head.writer, head.chunks) + b"\n" + head.inline if self._journal
                 else _manifest(head, key))
        kv = await self._open_kv()
        try:
            if version is None:
                return str(await kv.create(key, value))
            return str(await kv.update(key, value, last=int(version)))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise BlobConflict(str(exc)) from exc
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot write {self._what} {self.describe(ident)}: {exc}") from exc

    async def delete(self, ident: str) -> None:
        await self.delete_chunk(self.key_of(ident))

    async def list_heads(self, prefix: str) -> list[str]:
        # Manifests are keyed by the informer id; chunks and journals have suffixes of their own.
        return sorted(k for k in await self._keys() if k.startswith(prefix) and not k.endswith(".journal")
                      and ".c." not in k[len(prefix):])

    async def put_chunk(self, ident: str, name: str, data: bytes) -> None:
        kv = await self._open_kv()
        try:
            await kv.put(name, data)
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot write NATS KV chunk {self._bucket}/{name}: {exc}") from exc

    async def get_chunk(self, name: str) -> bytes | None:
        kv = await self._open_kv()
        try:
            return (await kv.get(name)).value or b""
        except nats.js.errors.KeyNotFoundError:
            return None
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot read NATS KV chunk {self._bucket}/{name}: {exc}") from exc

    async def delete_chunk(self, name: str) -> None:
        kv = await self._open_kv()
        try:
            await kv.purge(name)
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot purge NATS KV key {self._bucket}/{name}: {exc}") from exc

    async def chunks_of(self, ident: str) -> list[str]:
        prefix = f"{self.key_of(ident)}.c."
        return [k for k in await self._keys() if k.startswith(prefix)]

    async def _keys(self) -> list[str]:
        kv = await self._open_kv()
        try:
            return await live_keys(kv)
        except _FAILURES as exc:
            raise BlobStoreError(f"cannot list the NATS KV bucket {self._bucket!r}: {exc}") from exc


async def live_keys(kv: KeyValue, *, idle: float = 10.0) -> list[str]:
    """The bucket's keys that hold a value (not deleted or purged), sorted.

    Not ``kv.keys()``: nats-py ends that listing when the consumer's info says nothing is pending
    and the client has received nothing yet, but the server counts messages as delivered when its
    consumer queues them and may answer the info first, so the listing of a full bucket came back
    empty now and then (under load). Here the info only sets how many messages the listing must
    see (those delivered or pending when it was asked); it ends on the message that reaches that
    count with nothing more pending. ``idle``: seconds without a message before it gives up
    (:class:`TimeoutError`)."""
    prefix = f"$KV.{kv._name}."
    keys: set[str] = set()
    seen, last_pending = 0, -1
    changed = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        nonlocal seen, last_pending
        key, headers = msg.subject[len(prefix):], msg.headers or {}
        if headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
            keys.discard(key)
        else:
            keys.add(key)
        seen, last_pending = seen + 1, msg.metadata.num_pending
        changed.set()

    sub = await kv._js.subscribe(f"{prefix}>", stream=kv._stream, cb=on_message, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, headers_only=True,
                                 inactive_threshold=60.0)
    try:
        info = await sub.consumer_info()
        target = (info.delivered.consumer_seq if info.delivered else 0) + (info.num_pending or 0)
        while target and not (seen >= target and last_pending == 0):
            changed.clear()
            await asyncio.wait_for(changed.wait(), idle)
    finally:
        await sub.unsubscribe()
    return sorted(keys)


def _journal_head(writer: FenceToken | None, chunks: Sequence[str]) -> bytes:
    head: dict[str, Any] = {"writer": token_json(writer)}
    if chunks:
        head["chunks"] = list(chunks)
    return orjson.dumps(head)


def _parse_journal(raw: bytes) -> Head:
    line, sep, tail = raw.partition(b"\n")
    if not sep:
        raise ValueError("no header line")
    doc = orjson.loads(line)
    chunks = doc.get("chunks") or []
    if not isinstance(chunks, list) or not all(isinstance(c, str) and c for c in chunks):
        raise ValueError("chunks is not a list of keys")
    return Head(writer=token_of(doc["writer"]), chunks=tuple(chunks), inline=tail)


def _manifest(head: Head, key: str) -> bytes:
    generation = head.chunks[0][len(key) + 3:].partition(".")[0]
    # A checkpoint's head holds none of it (head_room 0): one generation of chunks, in order.
    assert head.digest is not None
    assert list(head.chunks) == [f"{key}.c.{generation}.{n}" for n in range(len(head.chunks))]
    return orjson.dumps({"generation": generation, "chunks": len(head.chunks), "size": head.digest[0],
                         "sha256": head.digest[1],
                         **({"writer": token_json(head.writer)} if head.writer is not None else {})})


def _parse_manifest(raw: bytes, key: str) -> Head:
    doc = orjson.loads(raw)
    generation, count = str(doc["generation"]), int(doc["chunks"])
    if count < 1 or not generation.isalnum():
        raise ValueError("no chunks")
    return Head(writer=token_of(doc.get("writer")),
                chunks=tuple(f"{key}.c.{generation}.{n}" for n in range(count)),
                digest=(int(doc["size"]), str(doc["sha256"])))


class NatsKvCheckpointStore(BlobCheckpointStore):
    """Checkpoints and their journals in the KV bucket ``bucket`` (created with history 1 if missing).

    Give either ``nats_url`` (the store connects and owns the connection) or an already connected
    ``nc`` (left open on :meth:`close`). ``chunk_size`` defaults to the server's max payload less
    some headroom; ``journal_bytes``: the most one value of a journal holds (default: as a chunk).
    ``connect_options``: further keyword arguments of ``nats.connect`` with ``nats_url`` (TLS,
    credentials: ``tls``, ``user``/``password``, ``token``, ``nkeys_seed``, ``user_credentials``).
    """

    def __init__(self, *, nats_url: str | None = None, nc: NatsClient | None = None,
                 bucket: str = "kube-event-bridge-checkpoints", chunk_size: int | None = None,
                 connect_timeout: float = 5.0, fence: FenceSource | None = None,
                 journal_bytes: int | None = None,
                 connect_options: Mapping[str, Any] | None = None) -> None:
        if (nats_url is None) == (nc is None):
            raise ValueError("give exactly one of nats_url or nc")
        self._url = nats_url
        self._nc = nc
        self._owns_nc = nc is None
        self._bucket = bucket
        self._chunk_size = chunk_size
        self._journal_bytes = journal_bytes
        self._connect_timeout = connect_timeout
        self._connect_options = dict(connect_options or {})
        self._kv: KeyValue | None = None
        super().__init__(
            checkpoints=NatsKvBlobStore(open_kv=self._bucket_kv, bucket=bucket, journal=False,
                                        limit=self._chunk_limit),
            journals=NatsKvBlobStore(open_kv=self._bucket_kv, bucket=bucket, journal=True,
                                     limit=self._journal_limit),
            fence=fence)

    async def _bucket_kv(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        try:
            if self._nc is None:
                assert self._url is not None
                self._nc = await nats.connect(
                    self._url, connect_timeout=self._connect_timeout, max_reconnect_attempts=3,
                    reconnect_time_wait=0.5, allow_reconnect=True, error_cb=self._on_error,
                    **self._connect_options,
                )
            js = self._nc.jetstream()
            try:
                self._kv = await js.key_value(self._bucket)
            except nats.js.errors.BucketNotFoundError:
                self._kv = await js.create_key_value(bucket=self._bucket, history=1)
        except _FAILURES as exc:
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

    def _journal_limit(self) -> int:
        limit = self._chunk_limit()
        return limit if self._journal_bytes is None else min(limit, self._journal_bytes + _JOURNAL_HEAD)

    async def save(self, checkpoint: Checkpoint) -> None:
        await self._bucket_kv()  # chunks are sized by the server's max payload: connect first
        await super().save(checkpoint)

    def journal_key(self, informer_id: str) -> str:
        """The key of the informer's known-object journal (:mod:`bridge.delivery.journal`)."""
        return f"{informer_id}.journal"

    async def close(self) -> None:
        nc, self._nc, self._kv = self._nc, None, None
        if nc is not None and self._owns_nc and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await nc.close()
        if not self._owns_nc:
            self._nc = nc
