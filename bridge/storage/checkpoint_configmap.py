"""A checkpoint store in Kubernetes ConfigMaps.

For in-cluster deployments without a volume: checkpoints live next to the bridge, in its namespace,
and survive any pod. A Kubernetes object is limited to about 1 MiB, and the known-object index of a
large informer exceeds that, so values are chunked by the storage layer's one writer
(:class:`~bridge.storage.blobstore.ChunkedValue`); this module supplies only the ConfigMap
primitives (:class:`ConfigMapBlobStore`) and their format:

* a checkpoint's **manifest** ``<prefix>-<informer_id>`` carries it inline (``data.checkpoint``) when
  it fits, else the comma-separated names of its **shards** (``data.shards``), their total size and
  SHA-256; shards are ``<prefix>-<informer_id>-s<generation>-<n>`` (``data.chunk``);
* a known-object journal's **head** ``<prefix>-<informer_id>-journal`` holds the journal's tail
  (``data.journal``) and the names of its sealed chunks (``data.chunks``, absent when there are
  none), which are ``<head>-c<generation>-<n>`` (``data.chunk``).

Heads carry the writer's lease token in two annotations (holder, leaseTransitions) and are replaced
with the ``resourceVersion`` last read or written (compare-and-set). Every ConfigMap is labelled
with the owner (a hash of the informer id) and its role (``manifest``, ``shard``, ``journal``,
``journal-chunk``), by which orphans are found.

Chunk names are new on every write (a deposed writer can never overwrite a live one), so RBAC cannot
list them in ``resourceNames``: reading and deleting them needs ``get``/``delete`` on every ConfigMap
of the namespace. With ``allow_shards=False`` the store never chunks (a checkpoint larger than one
ConfigMap fails to save, with an error saying so; a full journal waits for the next compaction) and
touches no ConfigMap but its heads, which RBAC can name one by one.

**Moving namespaces** (``migrate_from``): checkpoints kept in another namespace before (the chart's
release namespace, before it gave checkpoints a namespace of their own so that the bridge's Role
reaches no other workload's ConfigMaps) are moved on an informer's first load, when the new
namespace has none: its journal is copied, then its checkpoint written (the commit point) and read
back, and only then are the old ones deleted. A crash before the checkpoint is written leaves the
old ones to be moved again; a crash after it leaves both, and the next load keeps the new one and
deletes the old.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bridge.errors import ApiError, ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.storage.blobstore import BlobConflict, Head
from bridge.storage.checkpoint import BlobCheckpointStore, Checkpoint, CheckpointStoreError
from bridge.storage.fencing import BlobStoreError, FenceSource

__all__ = ["DEFAULT_SHARD_BYTES", "JOURNAL_BYTES", "ConfigMapBlobStore", "ConfigMapCheckpointStore"]

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 900 * 1024
"""Bytes of encoded checkpoint per ConfigMap: room for metadata below the ~1 MiB object limit."""
JOURNAL_BYTES = 900 * 1024
"""The most one journal ConfigMap (the head or a sealed chunk) holds: the records of about 9,000 new
objects and deletes."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
OWNER_LABEL = "kube-event-bridge.io/checkpoint"
ROLE_LABEL = "kube-event-bridge.io/checkpoint-role"
WRITER_ANNOTATION = "kube-event-bridge.io/writer"
TERM_ANNOTATION = "kube-event-bridge.io/lease-transitions"


@dataclass(frozen=True, slots=True)
class Kind:
    """How one kind of value is laid out in ConfigMaps."""

    what: str
    suffix: str
    """Appended to ``<prefix>-<informer_id>`` to name the head."""
    head_role: str
    chunk_role: str
    chunk_infix: str
    """Chunk ``n`` of a generation is ``<head><chunk_infix><generation>-<n>``."""


CHECKPOINTS = Kind("checkpoint", "", "manifest", "shard", "-s")
JOURNALS = Kind("journal", "-journal", "journal", "journal-chunk", "-c")


def _stored_token(cm: dict[str, Any]) -> FenceToken | None:
    notes = (cm.get("metadata") or {}).get("annotations") or {}
    term = notes.get(TERM_ANNOTATION)
    if term is None or not (digits := str(term).lstrip("-")).isascii() or not digits.isdigit():
        return None
    return FenceToken(transitions=int(term), holder=str(notes.get(WRITER_ANNOTATION) or ""))


def _owner_value(informer_id: str) -> str:
    # Label values are limited to 63 characters; informer ids may be longer.
    return hashlib.sha256(informer_id.encode()).hexdigest()[:40]


def _version(cm: dict[str, Any]) -> str:
    return str((cm.get("metadata") or {}).get("resourceVersion") or "")


class ConfigMapBlobStore:
    """The ConfigMap primitives (a :class:`~bridge.storage.blobstore.BlobStore`) for one ``kind``
    of value in ``namespace``; ``room``: bytes one ConfigMap holds."""

    def __init__(self, *, client: ApiClient, namespace: str, prefix: str, kind: Kind, room: int) -> None:
        self._client = client
        self._namespace = namespace
        self._prefix = prefix
        self._kind = kind
        self._room = room

    @property
    def _collection(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/configmaps"

    def name_of(self, ident: str) -> str:
        return f"{self._prefix}-{ident}{self._kind.suffix}"

    def labels(self, ident: str, role: str) -> dict[str, str]:
        return {MANAGED_BY_LABEL: "kube-event-bridge", OWNER_LABEL: _owner_value(ident), ROLE_LABEL: role}

    def describe(self, ident: str) -> str:
        return f"ConfigMap {self._namespace}/{self.name_of(ident)}"

    def head_room(self, chunks: Sequence[str]) -> int | None:
        if self._kind is CHECKPOINTS:
            return 0 if chunks else self._room  # a manifest holds the checkpoint or lists shards
        return self._room - (len(",".join(chunks)) + 16 if chunks else 0)

    def chunk_room(self) -> int:
        return self._room

    def chunk_name(self, ident: str, generation: str, n: int) -> str:
        return f"{self.name_of(ident)}{self._kind.chunk_infix}{generation}-{n}"

    async def _read(self, name: str, what: str) -> dict[str, Any] | None:
        try:
            cm: dict[str, Any] = await self._client.get(f"{self._collection}/{name}", context=f"get {name}")
        except NotFoundError:
            return None
        except ApiError as exc:
            raise BlobStoreError(f"cannot read {self._kind.what} {what}: {exc}") from exc
        return cm

    async def get(self, ident: str) -> Head | None:
        cm = await self._read(self.name_of(ident), self.describe(ident))
        if cm is None:
            return None
        data: dict[str, Any] = cm.get("data") or {}
        head = Head(writer=_stored_token(cm), version=_version(cm))
        if self._kind is JOURNALS:
            chunks = tuple(c for c in str(data.get("chunks", "")).split(",") if c)
            return replace(head, chunks=chunks, inline=str(data.get("journal", "")).encode())
        if "checkpoint" in data:
            return replace(head, inline=str(data["checkpoint"]).encode())
        try:
            shards = tuple(s for s in str(data["shards"]).split(",") if s)
            return replace(head, chunks=shards, digest=(int(data["size"]), str(data["sha256"])))
        except (KeyError, ValueError):
            return replace(head, damage="malformed manifest")

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        name = self.name_of(ident)
        metadata: dict[str, Any] = {"name": name, "labels": self.labels(ident, self._kind.head_role)}
        if head.writer is not None:
            metadata["annotations"] = {WRITER_ANNOTATION: head.writer.holder,
                                       TERM_ANNOTATION: str(head.writer.transitions)}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                                "data": self._data(head)}
        try:
            if version is None:
                result = await self._client.create(self._collection, body, context=f"create {name}")
            else:
                metadata["resourceVersion"] = version
                result = await self._client.replace(f"{self._collection}/{name}", body,
                                                    context=f"replace {name}")
        except (ConflictError, NotFoundError) as exc:
            raise BlobConflict(str(exc)) from exc  # written, created or deleted meanwhile
        except ApiError as exc:
            raise BlobStoreError(f"cannot write {self._kind.what} {self.describe(ident)}: {exc}") from exc
        return _version(result)

    def _data(self, head: Head) -> dict[str, str]:
        if self._kind is JOURNALS:
            data = {"journal": head.inline.decode()}
            if head.chunks:
                data["chunks"] = ",".join(head.chunks)
            return data
        if not head.chunks:
            return {"format": "1", "checkpoint": head.inline.decode()}
        size, digest = head.digest if head.digest is not None else (0, "")
        return {"format": "1", "shards": ",".join(head.chunks), "size": str(size), "sha256": digest}

    async def delete(self, ident: str) -> None:
        await self.delete_chunk(self.name_of(ident))

    async def list_heads(self, prefix: str) -> list[str]:
        """Needs ``list`` on the namespace's ConfigMaps (resharding only)."""
        names = await self._names(f"{MANAGED_BY_LABEL}=kube-event-bridge,{ROLE_LABEL}={self._kind.head_role}")
        start, end = f"{self._prefix}-", len(self._kind.suffix)
        return sorted(n[len(start):len(n) - end] for n in names if n.startswith(start + prefix))

    async def put_chunk(self, ident: str, name: str, data: bytes) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": self.labels(ident, self._kind.chunk_role)},
                "data": {"chunk": data.decode()}}
        try:
            await self._client.create(self._collection, body, context=f"create {name}")
        except ApiError as exc:
            raise BlobStoreError(f"cannot write {self._kind.what} ConfigMap {name}: {exc}") from exc

    async def get_chunk(self, name: str) -> bytes | None:
        cm = await self._read(name, f"ConfigMap {name}")
        return None if cm is None else str((cm.get("data") or {}).get("chunk", "")).encode()

    async def delete_chunk(self, name: str) -> None:
        try:
            await self._client.delete(f"{self._collection}/{name}", context=f"delete {name}")
        except NotFoundError:
            return
        except ApiError as exc:
            raise BlobStoreError(f"cannot delete {self._kind.what} ConfigMap {name}: {exc}") from exc

    async def chunks_of(self, ident: str) -> list[str]:
        labels = self.labels(ident, self._kind.chunk_role)
        prefix = f"{self.name_of(ident)}{self._kind.chunk_infix}"
        return [n for n in await self._names(",".join(f"{k}={v}" for k, v in labels.items()))
                if n.startswith(prefix)]

    async def _names(self, selector: str) -> list[str]:
        try:
            listed = await self._client.get(self._collection, params={"labelSelector": selector},
                                            context=f"list {self._kind.what} ConfigMaps")
        except ApiError as exc:
            raise BlobStoreError(f"cannot list the {self._kind.what} ConfigMaps: {exc}") from exc
        return [str((item.get("metadata") or {}).get("name") or "") for item in listed.get("items") or []]


class ConfigMapCheckpointStore(BlobCheckpointStore):
    """Checkpoints as ConfigMaps in ``namespace``, named ``<name_prefix>-<informer_id>…``, and their
    journals (``journal_bytes``: the most one journal ConfigMap holds).

    ``migrate_from``: a namespace whose checkpoints (same prefix) are moved here on first load (module
    docs). The ``client`` belongs to the caller and is not closed by :meth:`close`.
    """

    def __init__(self, *, client: ApiClient, namespace: str, name_prefix: str = "kube-event-bridge-ckpt",
                 shard_bytes: int = DEFAULT_SHARD_BYTES, fence: FenceSource | None = None,
                 allow_shards: bool = True, journal_bytes: int = JOURNAL_BYTES,
                 migrate_from: str = "") -> None:
        if shard_bytes < 1024:
            raise ValueError("shard_bytes must be at least 1024")
        self._namespace = namespace
        self._old: ConfigMapCheckpointStore | None = None
        if migrate_from and migrate_from != namespace:
            self._old = ConfigMapCheckpointStore(client=client, namespace=migrate_from,
                                                 name_prefix=name_prefix, shard_bytes=shard_bytes,
                                                 allow_shards=allow_shards, journal_bytes=journal_bytes)
        self._settled: set[str] = set()
        """Informer ids whose old location was looked at (and emptied) by this store."""
        self._manifests = ConfigMapBlobStore(client=client, namespace=namespace, prefix=name_prefix,
                                             kind=CHECKPOINTS, room=shard_bytes)
        self._journal_maps = ConfigMapBlobStore(client=client, namespace=namespace, prefix=name_prefix,
                                                kind=JOURNALS, room=journal_bytes)
        super().__init__(checkpoints=self._manifests, journals=self._journal_maps, fence=fence,
                         chunking=allow_shards,
                         too_large=" (checkpoint.shards: false, sharding is off); turn it on (it needs "
                                   "get/delete on the namespace's ConfigMaps) or use the nats-kv store")

    @property
    def manifests(self) -> ConfigMapBlobStore:
        """The ConfigMaps of the checkpoints (manifests and shards)."""
        return self._manifests

    def journal_name(self, informer_id: str) -> str:
        """The ConfigMap holding the informer's known-object journal (:mod:`bridge.delivery.journal`)."""
        return self._journal_maps.name_of(informer_id)

    async def load(self, informer_id: str) -> Checkpoint | None:
        checkpoint = await super().load(informer_id)
        old = self._old
        if old is None or informer_id in self._settled:
            return checkpoint
        if checkpoint is None:
            try:
                checkpoint = await self._copy(old, informer_id)
            except CheckpointStoreError as exc:
                raise CheckpointStoreError(
                    f"cannot move the checkpoint of {informer_id} from namespace {old._namespace} to "
                    f"{self._namespace}: {exc}. The chart's Role there names only the checkpoints' own "
                    "ConfigMaps; a checkpoint split over shard ConfigMaps, or one of per-node replicas, "
                    "needs checkpointNamespace.migrateAll=true for one upgrade (docs/operations.md, "
                    "\"Upgrading the chart\")") from exc
        # The copy here is confirmed (read back, or written by an earlier start that died before it
        # deleted the old one, or since): the old one goes.
        try:
            await old.remove(informer_id)
        except CheckpointStoreError as exc:
            log.warning("cannot delete the moved checkpoint of %s from namespace %s (tried again at the "
                        "next start): %s", informer_id, old._namespace, exc)
            return checkpoint
        self._settled.add(informer_id)
        return checkpoint

    async def _copy(self, old: ConfigMapCheckpointStore, informer_id: str) -> Checkpoint | None:
        """Copies the old checkpoint and journal here and reads the copy back (None: no old one)."""
        found = await old.peek(informer_id)
        if found is None:
            return None
        journal = await old.journal_backend(informer_id, fenced=False).read()
        if journal is not None:
            await self.journal_backend(informer_id).rewrite(journal)
        await self.save(found)  # the commit point: from here on the new copy is the checkpoint
        moved = await super().load(informer_id)
        if moved is None or (moved.resource_version, moved.objects) != (found.resource_version,
                                                                        found.objects):
            raise CheckpointStoreError(f"the copy in {self.manifests.describe(informer_id)} does not "
                                       "read back as written; the old one is kept")
        log.info("checkpoint moved to the checkpoint namespace", extra={
            "informer": informer_id, "from": old._namespace, "to": self._namespace,
            "resource_version": moved.resource_version})
        return moved
