"""A checkpoint store in Kubernetes ConfigMaps.

For in-cluster deployments without a volume: checkpoints live next to the bridge, in its namespace,
and survive any pod. A Kubernetes object is limited to about 1 MiB, and the known-object index of a
large informer exceeds that, so a checkpoint is written as:

* a **manifest** ConfigMap ``<prefix>-<informer_id>`` carrying the checkpoint inline when it fits, or
  else the ordered list of its shard ConfigMaps, their total size and SHA-256;
* **shards** ``<prefix>-<informer_id>-s<generation>-<n>``, each holding up to ``shard_bytes`` of the
  encoded checkpoint (:func:`bridge.checkpoint.encode_checkpoint`).

A save writes the new generation's shards first and replaces the manifest last, so a crash at any
point leaves the previous manifest pointing at the previous, complete shards. Shards not referenced by
the manifest (older generations, or ones orphaned by a crash) are deleted afterwards, found by label.

Fencing (with a ``fence``, see :mod:`bridge.delivery.checkpoint`): the manifest carries the writer's
lease token in two annotations (holder, leaseTransitions) and the checkpoint body carries it too. The
manifest is only ever replaced with the ``resourceVersion`` this store last read or wrote; on a
conflict it is read again and the write goes ahead only if the stored token is not a later leader's.
Loading replaces the stored token with the loader's (same precondition), which claims the
checkpoint: from then on a deposed leader's replace fails on the resourceVersion and then on the token.

Shard names are new on every save (a deposed writer can never overwrite a live shard), so RBAC cannot
list them in ``resourceNames``: reading and deleting shards needs ``get``/``delete`` on every ConfigMap
of the namespace. With ``allow_shards=False`` the store never shards (a checkpoint larger than one
ConfigMap fails to save, with an error saying so) and touches no ConfigMap but its manifests, which
RBAC can name one by one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

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
from bridge.errors import ApiError, ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_SHARD_BYTES", "JOURNAL_BYTES", "ConfigMapCheckpointStore", "ConfigMapJournalBackend"]

DEFAULT_SHARD_BYTES = 900 * 1024
"""Bytes of encoded checkpoint per ConfigMap: room for metadata below the ~1 MiB object limit."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
OWNER_LABEL = "kube-event-bridge.io/checkpoint"
ROLE_LABEL = "kube-event-bridge.io/checkpoint-role"
WRITER_ANNOTATION = "kube-event-bridge.io/writer"
TERM_ANNOTATION = "kube-event-bridge.io/lease-transitions"
_CAS_ATTEMPTS = 5
JOURNAL_BYTES = 900 * 1024
"""The most one journal ConfigMap (the head or a sealed chunk) holds: the records of about 9,000 new
objects and deletes."""


def _stored_token(manifest: dict[str, Any]) -> FenceToken | None:
    notes = (manifest.get("metadata") or {}).get("annotations") or {}
    term = notes.get(TERM_ANNOTATION)
    if term is None or not str(term).lstrip("-").isdigit():
        return None
    return FenceToken(transitions=int(term), holder=str(notes.get(WRITER_ANNOTATION) or ""))


def _owner_value(informer_id: str) -> str:
    # Label values are limited to 63 characters; informer ids may be longer.
    return hashlib.sha256(informer_id.encode()).hexdigest()[:40]


class ConfigMapCheckpointStore:
    """Checkpoints as ConfigMaps in ``namespace``, named ``<name_prefix>-<informer_id>…``.

    The ``client`` belongs to the caller and is not closed by :meth:`close`.
    """

    def __init__(
        self,
        *,
        client: ApiClient,
        namespace: str,
        name_prefix: str = "kube-event-bridge-ckpt",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        fence: FenceSource | None = None,
        allow_shards: bool = True,
        journal_bytes: int = JOURNAL_BYTES,
    ) -> None:
        """``journal_bytes``: the most one ConfigMap of the known-object journal holds (the journal
        spans several when shards are allowed)."""
        if shard_bytes < 1024:
            raise ValueError("shard_bytes must be at least 1024")
        self._fence = fence
        self._manifest_rv: dict[str, str] = {}
        """informer id → resourceVersion of the manifest as this store last read or wrote it."""
        self._client = client
        self._namespace = namespace
        self._prefix = name_prefix
        self._shard_bytes = shard_bytes
        self._allow_shards = allow_shards
        self._journal_bytes = journal_bytes
        self.last_shard_count = 0
        """Shards written by the last save (0 when the checkpoint fitted in the manifest)."""

    @property
    def _collection(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/configmaps"

    def manifest_name(self, informer_id: str) -> str:
        return f"{self._prefix}-{informer_id}"

    def journal_name(self, informer_id: str) -> str:
        """The ConfigMap holding the informer's known-object journal (:mod:`bridge.delivery.journal`)."""
        return f"{self._prefix}-{informer_id}-journal"

    def journal_backend(self, informer_id: str, *, fenced: bool = True) -> ConfigMapJournalBackend:
        """The informer's known-object journal storage: a ConfigMap next to its manifest, written
        with the same fencing, and its sealed chunks when it outgrows one (unless shards are off).
        ``fenced=False``: another shard's journal, read during a take-over (its writer holds another
        shard's Lease, whose term says nothing about this one's), as :meth:`peek` reads its checkpoint."""
        return ConfigMapJournalBackend(client=self._client, namespace=self._namespace,
                                       name=self.journal_name(informer_id),
                                       labels=self._labels(informer_id, "journal"),
                                       fence=self._fence if fenced else None,
                                       max_bytes=self._journal_bytes, chunking=self._allow_shards)

    def _labels(self, informer_id: str, role: str) -> dict[str, str]:
        return {
            MANAGED_BY_LABEL: "kube-event-bridge",
            OWNER_LABEL: _owner_value(informer_id),
            ROLE_LABEL: role,
        }

    # ---------------------------------------------------------------------------------------------

    async def load(self, informer_id: str) -> Checkpoint | None:
        name = self.manifest_name(informer_id)
        return await self._load(informer_id, fence_token(self._fence, f"loading checkpoint ConfigMap {name}"))

    async def peek(self, informer_id: str) -> Checkpoint | None:
        """The checkpoint, read without claiming it (another shard's, during a take-over)."""
        return await self._load(informer_id, None)

    async def informer_ids(self, prefix: str) -> list[str]:
        """Needs ``list`` on the namespace's ConfigMaps (resharding only)."""
        selector = f"{MANAGED_BY_LABEL}=kube-event-bridge,{ROLE_LABEL}=manifest"
        try:
            listed = await self._client.get(self._collection, params={"labelSelector": selector},
                                            context="list checkpoint manifests")
        except ApiError as exc:
            raise CheckpointStoreError(f"cannot list the checkpoint ConfigMaps: {exc}") from exc
        start = f"{self._prefix}-"
        names = [str((item.get("metadata") or {}).get("name") or "") for item in listed.get("items") or []]
        return sorted(n[len(start):] for n in names if n.startswith(start + prefix))

    async def remove(self, informer_id: str) -> None:
        fence_token(self._fence, f"removing checkpoint ConfigMap {self.manifest_name(informer_id)}")
        for name in (self.manifest_name(informer_id), self.journal_name(informer_id)):
            try:
                await self._client.delete(f"{self._collection}/{name}", context=f"delete {name}")
            except NotFoundError:
                pass
            except ApiError as exc:
                raise CheckpointStoreError(f"cannot remove checkpoint ConfigMap {name}: {exc}") from exc
        self._manifest_rv.pop(informer_id, None)
        if self._allow_shards:
            await self._delete_orphans(informer_id, keep=set())
            await self.journal_backend(informer_id).delete_chunks()

    async def _load(self, informer_id: str, token: FenceToken | None) -> Checkpoint | None:
        name = self.manifest_name(informer_id)
        for _ in range(_CAS_ATTEMPTS):
            try:
                try:
                    manifest = await self._client.get(f"{self._collection}/{name}", context=f"get {name}")
                except NotFoundError:
                    self._manifest_rv.pop(informer_id, None)
                    return None
                rv = str((manifest.get("metadata") or {}).get("resourceVersion") or "")
                data: dict[str, Any] = manifest.get("data") or {}
                if "checkpoint" in data:
                    encoded = str(data["checkpoint"]).encode()
                else:
                    encoded = await self._read_shards(name, data)
            except ApiError as exc:
                raise CheckpointStoreError(f"cannot read checkpoint ConfigMap {name}: {exc}") from exc
            try:
                checkpoint = decode_checkpoint(encoded, informer_id)
            except CheckpointCorruptError as exc:
                raise CheckpointCorruptError(f"ConfigMap {self._namespace}/{name}: {exc}") from exc
            what = f"checkpoint ConfigMap {self._namespace}/{name}"
            check_fence(token, _stored_token(manifest), what)
            check_fence(token, checkpoint.writer, what)
            self._manifest_rv[informer_id] = rv
            if token is None or _stored_token(manifest) == token:
                return checkpoint
            # Claim it for this term: from now on an older leader's write fails.
            claimed = {**manifest, "metadata": {**(manifest.get("metadata") or {}),
                                                "annotations": self._annotations(manifest, token)}}
            try:
                result = await self._client.replace(f"{self._collection}/{name}", claimed,
                                                    context=f"claim {name}")
            except ConflictError:
                continue  # written meanwhile: read it again
            except ApiError as exc:
                raise CheckpointStoreError(f"cannot claim checkpoint ConfigMap {name}: {exc}") from exc
            self._manifest_rv[informer_id] = str((result.get("metadata") or {}).get("resourceVersion") or "")
            return checkpoint
        raise CheckpointStoreError(f"cannot claim checkpoint ConfigMap {name}: it keeps changing")

    @staticmethod
    def _annotations(manifest: dict[str, Any] | None, token: FenceToken) -> dict[str, str]:
        notes = dict(((manifest or {}).get("metadata") or {}).get("annotations") or {})
        notes[WRITER_ANNOTATION] = token.holder
        notes[TERM_ANNOTATION] = str(token.transitions)
        return notes

    async def _read_shards(self, name: str, data: dict[str, Any]) -> bytes:
        try:
            shards = [s for s in str(data["shards"]).split(",") if s]
            size, digest = int(data["size"]), str(data["sha256"])
        except (KeyError, ValueError) as exc:
            raise CheckpointCorruptError(f"ConfigMap {self._namespace}/{name}: malformed manifest") from exc
        parts: list[bytes] = []
        for n, shard in enumerate(shards):
            try:
                cm = await self._client.get(f"{self._collection}/{shard}", context=f"get {shard}")
            except NotFoundError as exc:
                raise CheckpointCorruptError(
                    f"ConfigMap {self._namespace}/{name}: shard {n} ({shard}) of {len(shards)} is missing"
                ) from exc
            parts.append(str((cm.get("data") or {}).get("chunk", "")).encode())
        encoded = b"".join(parts)
        if len(encoded) != size or hashlib.sha256(encoded).hexdigest() != digest:
            raise CheckpointCorruptError(
                f"ConfigMap {self._namespace}/{name}: shards do not match the manifest checksum"
            )
        return encoded

    async def save(self, checkpoint: Checkpoint) -> None:
        ident = checkpoint.informer_id
        name = self.manifest_name(ident)
        token = fence_token(self._fence, f"checkpoint ConfigMap {name}")
        if token is not None:
            checkpoint = dataclasses.replace(checkpoint, writer=token)
        encoded = encode_checkpoint(checkpoint)
        text = encoded.decode()  # orjson emits UTF-8; the header is ASCII
        data: dict[str, str]
        shard_names: list[str] = []
        try:
            if len(encoded) <= self._shard_bytes:
                data = {"format": "1", "checkpoint": text}
            elif not self._allow_shards:
                raise CheckpointStoreError(
                    f"cannot write checkpoint ConfigMap {name}: the checkpoint is {len(encoded)} bytes, "
                    f"more than one ConfigMap holds ({self._shard_bytes}), and sharding is off "
                    "(checkpoint.shards: false); turn it on (it needs get/delete on the namespace's "
                    "ConfigMaps) or use the nats-kv store")
            else:
                generation = uuid.uuid4().hex[:10]
                for n, chunk in enumerate(_utf8_chunks(encoded, self._shard_bytes)):
                    shard = f"{name}-s{generation}-{n}"
                    shard_names.append(shard)
                    await self._client.create(
                        self._collection,
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": shard, "labels": self._labels(ident, "shard")},
                            "data": {"chunk": chunk},
                        },
                        context=f"create {shard}",
                    )
                data = {
                    "format": "1",
                    "shards": ",".join(shard_names),
                    "size": str(len(encoded)),
                    "sha256": hashlib.sha256(encoded).hexdigest(),
                }
            await self._put_manifest(name, ident, data, token)
        except ApiError as exc:
            raise CheckpointStoreError(f"cannot write checkpoint ConfigMap {name}: {exc}") from exc
        self.last_shard_count = len(shard_names)
        log.debug("checkpoint written", extra={"informer": ident,
                                              "resource_version": checkpoint.resource_version,
                                              "writer": token.holder if token else "",
                                              "lease_transitions": token.transitions if token else None})
        if self._allow_shards:
            await self._delete_orphans(ident, keep=set(shard_names))

    async def _put_manifest(self, name: str, ident: str, data: dict[str, str],
                            token: FenceToken | None) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": self._labels(ident, "manifest")},
            "data": data,
        }
        if token is None:
            try:
                await self._client.create(self._collection, body, context=f"create {name}")
                return
            except ConflictError:
                pass
            current = await self._client.get(f"{self._collection}/{name}", context=f"get {name}")
            body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            await self._client.replace(f"{self._collection}/{name}", body, context=f"replace {name}")
            return
        # Fenced: compare-and-set on the resourceVersion, the stored token decides after a conflict.
        body["metadata"]["annotations"] = self._annotations(None, token)
        rv = self._manifest_rv.get(ident)
        what = f"checkpoint ConfigMap {self._namespace}/{name}"
        for _ in range(_CAS_ATTEMPTS):
            try:
                if rv is None:
                    result = await self._client.create(self._collection, body, context=f"create {name}")
                else:
                    body["metadata"]["resourceVersion"] = rv
                    result = await self._client.replace(f"{self._collection}/{name}", body,
                                                        context=f"replace {name}")
            except ConflictError:
                try:
                    current = await self._client.get(f"{self._collection}/{name}", context=f"get {name}")
                except NotFoundError:
                    rv = None
                    body["metadata"].pop("resourceVersion", None)
                    continue
                check_fence(token, _stored_token(current), what)
                rv = str((current.get("metadata") or {}).get("resourceVersion") or "")
                continue
            self._manifest_rv[ident] = str((result.get("metadata") or {}).get("resourceVersion") or "")
            return
        raise CheckpointFencedError(f"{what}: kept changing under this writer; refused")

    async def _delete_orphans(self, ident: str, *, keep: set[str]) -> None:
        selector = f"{OWNER_LABEL}={_owner_value(ident)},{ROLE_LABEL}=shard"
        try:
            listed = await self._client.get(
                self._collection, params={"labelSelector": selector}, context="list checkpoint shards"
            )
            for item in listed.get("items") or []:
                shard = str((item.get("metadata") or {}).get("name") or "")
                if shard and shard not in keep:
                    with contextlib.suppress(NotFoundError):
                        await self._client.delete(f"{self._collection}/{shard}", context=f"delete {shard}")
        except ApiError:
            # Best effort: an orphan shard costs space, never correctness; the next save retries.
            return

    async def close(self) -> None:
        return None


class ConfigMapJournalBackend(ChunkedJournalBackend):
    """A known-object journal in ConfigMaps (:class:`~bridge.delivery.journal.ChunkedJournalBackend`).

    The head is the ConfigMap ``name``: ``data.journal`` holds the journal's tail, ``data.chunks``
    the comma-separated names of its sealed chunks (absent when there are none), the annotations the
    writer's lease token. It is replaced with the ``resourceVersion`` this backend last read or
    wrote, so one group commit is one API write and is atomic. Sealed chunks are the ConfigMaps
    ``<name>-c<generation>-<n>`` (``data.chunk``), labelled with the store's owner label and the role
    ``journal-chunk``; they are created once and deleted once no head lists them.

    With ``chunking=False`` (the store's ``allow_shards=False``: RBAC names its ConfigMaps one by
    one) the journal is the head alone, at most ``max_bytes``: a full journal waits for the next
    checkpoint write's compaction.
    """

    def __init__(self, *, client: ApiClient, namespace: str, name: str, labels: dict[str, str],
                 fence: FenceSource | None = None, max_bytes: int = JOURNAL_BYTES,
                 chunking: bool = True) -> None:
        super().__init__(fence=fence, chunking=chunking)
        self._client = client
        self._namespace = namespace
        self._name = name
        self._labels = labels
        self._max_bytes = max_bytes

    @property
    def name(self) -> str:
        return f"ConfigMap {self._namespace}/{self._name}"

    @property
    def _collection(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/configmaps"

    @property
    def _path(self) -> str:
        return f"{self._collection}/{self._name}"

    def _chunk_labels(self) -> dict[str, str]:
        return {**self._labels, ROLE_LABEL: "journal-chunk"}

    async def _load_head(self) -> JournalHead | None:
        try:
            cm = await self._client.get(self._path, context=f"get {self._name}")
        except NotFoundError:
            return None
        except ApiError as exc:
            raise JournalStoreError(f"cannot read journal {self.name}: {exc}") from exc
        data = cm.get("data") or {}
        chunks = tuple(c for c in str(data.get("chunks", "")).split(",") if c)
        return JournalHead(version=str((cm.get("metadata") or {}).get("resourceVersion") or ""),
                           writer=_stored_token(cm), chunks=chunks,
                           tail=str(data.get("journal", "")).encode())

    async def _store_head(self, version: str | None, writer: FenceToken | None, chunks: Sequence[str],
                          tail: bytes) -> str:
        metadata: dict[str, Any] = {"name": self._name, "labels": self._labels}
        if writer is not None:
            metadata["annotations"] = {WRITER_ANNOTATION: writer.holder,
                                       TERM_ANNOTATION: str(writer.transitions)}
        data = {"journal": tail.decode()}
        if chunks:
            data["chunks"] = ",".join(chunks)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
        try:
            if version is None:
                result = await self._client.create(self._collection, body, context=f"create {self._name}")
            else:
                metadata["resourceVersion"] = version
                result = await self._client.replace(self._path, body, context=f"replace {self._name}")
        except (ConflictError, NotFoundError) as exc:
            raise JournalConflict(str(exc)) from exc  # written, created or deleted meanwhile
        except ApiError as exc:
            raise JournalStoreError(f"cannot write journal {self.name}: {exc}") from exc
        return str((result.get("metadata") or {}).get("resourceVersion") or "")

    def _head_room(self, chunks: Sequence[str]) -> int:
        return self._max_bytes - (len(",".join(chunks)) + 16 if chunks else 0)

    def _chunk_room(self) -> int:
        return self._max_bytes

    def _chunk_name(self, generation: str, n: int) -> str:
        return f"{self._name}-c{generation}-{n}"

    async def _create_chunk(self, name: str, data: bytes) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": self._chunk_labels()}, "data": {"chunk": data.decode()}}
        try:
            await self._client.create(self._collection, body, context=f"create {name}")
        except ApiError as exc:
            raise JournalStoreError(f"cannot write a chunk of journal {self.name}: {exc}") from exc

    async def _read_chunk(self, name: str) -> bytes | None:
        try:
            cm = await self._client.get(f"{self._collection}/{name}", context=f"get {name}")
        except NotFoundError:
            return None
        except ApiError as exc:
            raise JournalStoreError(f"cannot read a chunk of journal {self.name}: {exc}") from exc
        return str((cm.get("data") or {}).get("chunk", "")).encode()

    async def _delete_chunk(self, name: str) -> None:
        try:
            await self._client.delete(f"{self._collection}/{name}", context=f"delete {name}")
        except NotFoundError:
            return
        except ApiError as exc:
            raise JournalStoreError(f"cannot delete a chunk of journal {self.name}: {exc}") from exc

    async def _stored_chunks(self) -> list[str]:
        selector = ",".join(f"{k}={v}" for k, v in self._chunk_labels().items())
        try:
            listed = await self._client.get(self._collection, params={"labelSelector": selector},
                                            context="list journal chunks")
        except ApiError as exc:
            raise JournalStoreError(f"cannot list the chunks of journal {self.name}: {exc}") from exc
        prefix = f"{self._name}-c"
        names = (str((item.get("metadata") or {}).get("name") or "") for item in listed.get("items") or [])
        return [n for n in names if n.startswith(prefix)]


def _utf8_chunks(data: bytes, limit: int) -> list[str]:
    """Splits UTF-8 ``data`` into strings of at most ``limit`` bytes, never inside a character."""
    out: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        # Step back over continuation bytes (10xxxxxx) so the slice ends on a character boundary.
        while end < len(data) and end > start and (data[end] & 0xC0) == 0x80:
            end -= 1
        out.append(data[start:end].decode())
        start = end
    return out

