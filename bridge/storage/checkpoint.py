"""Checkpoints: where an informer resumes after a restart, and the stores that keep them.

A :class:`Checkpoint` holds, for one informer, the *base*: the resourceVersion up to which every
sink acknowledged every change and the known objects as of that point (so a relist after a 410 is
diffed against them); and per sink (format 2) only its differences from the base
(:class:`SinkProgress`). Every store writes one byte encoding (:func:`encode_checkpoint`): a header
with format, length and SHA-256, then the JSON body, so that damage, and nonsense behind a valid
checksum, is detected rather than trusted (docs/delivery-contract.md, section 8).

:class:`BlobCheckpointStore` keeps checkpoints and journals in a
:class:`~bridge.storage.blobstore.BlobStore` through the one chunked writer, fenced by
:mod:`bridge.storage.fencing` (loading claims a checkpoint for the loader's term, so a deposed leader
cannot write once a new one has loaded). Capabilities beyond :class:`CheckpointStore` are Protocols
(:class:`ListableCheckpointStore`, :class:`JournalStore`) checked once, when the pipeline is built.
The errors, re-exported here, are those of :mod:`bridge.storage.fencing`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from bridge.kube.leaderelection import FenceToken
from bridge.resource_version import is_rv
from bridge.storage.blob_file import FileBlobStore
from bridge.storage.blobstore import CAS_ATTEMPTS, BlobStore, ChunkedValue, JournalBackend
from bridge.storage.fencing import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointFencedError,
    CheckpointStoreError,
    FenceSource,
    check_fence,
    fence_token,
    token_json,
    token_of,
)

__all__ = [
    "FORMAT_VERSION",
    "BlobCheckpointStore",
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointStore",
    "CheckpointStoreError",
    "FenceSource",
    "FileCheckpointStore",
    "JournalStore",
    "ListableCheckpointStore",
    "SinkProgress",
    "decode_checkpoint",
    "encode_checkpoint",
    "informer_id",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 3
"""Written by this version. 2 added the per-sink section (``sinks``), 3 its ``owes``; formats 1 (it
covers every configured sink, at the base) and 2 are still read."""
_READABLE_VERSIONS = frozenset({1, 2, 3})
_MAGIC = b"kube-event-bridge-checkpoint"


@dataclass(frozen=True, slots=True)
class SinkProgress:
    """One sink's progress, as its differences from the checkpoint's shared base.

    Most sinks agree with the base (the slowest, lowest common state), so an empty section — the
    sink is exactly at the base — is the common case and costs a few bytes. A sink ahead of the base
    records only where it differs."""

    resource_version: str = ""
    """Its own resume point when it is ahead of the base ("" = the base's)."""
    objects: Mapping[str, tuple[str, str] | None] = field(default_factory=dict)
    """Known-object index entries that differ from the base's: key → (uid, resourceVersion), or
    None for a key the base knows and this sink does not (it saw the delete)."""
    ahead: Mapping[str, tuple[str, str, bool]] = field(default_factory=dict)
    """Its own delivered-ahead map (as :attr:`Checkpoint.ahead`), beyond its own resume point. A
    key in both maps under different uids: the sink acknowledged the later object (``ahead``) and
    still owes the delete of the earlier one (``objects``: its uid, the delete's resourceVersion),
    which a restart sends it again (a reader that knows only one object per key takes ``ahead``);
    under the same uid in both, it owes every earlier object's changes from ``objects``' resourceVersion."""
    owes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Keys in ``ahead`` (the later object it acknowledged) of which it owes changes of several
    earlier objects: key → uid → the resourceVersion from which it owes that object's changes
    (format 3; one earlier object is written in both maps, as format 2 did)."""

    def owed_deletes(self) -> frozenset[str]:
        """The uids whose delete the sink owes (a key in both maps under different uids, or in
        :attr:`owes`)."""
        return frozenset({*(entry[0] for key, (uid, _rv, _deleted) in self.ahead.items()
                            if (entry := self.objects.get(key)) is not None and entry[0] != uid),
                          *(uid for owed in self.owes.values() for uid in owed)})

    @property
    def at_base(self) -> bool:
        return not (self.resource_version or self.objects or self.ahead or self.owes)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where one informer may resume from."""

    informer_id: str
    resource_version: str
    """Every change up to this resourceVersion was acknowledged by every sink."""
    objects: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """The known objects as of ``resource_version``: key → (uid, resourceVersion)."""
    written_at: float = 0.0
    """Wall-clock seconds when the checkpoint was taken."""
    format_version: int = FORMAT_VERSION
    ahead: Mapping[str, tuple[str, str, bool]] = field(default_factory=dict)
    """Objects whose acknowledged changes go beyond ``resource_version``: key → (uid,
    resourceVersion, deleted) of the newest one. A resumed watch replays them; they are applied to
    the cache but not sent again."""
    writer: FenceToken | None = None
    """The leader that wrote it (fenced stores), or None."""
    sinks: Mapping[str, SinkProgress] | None = None
    """The sinks this checkpoint covers (sink name → its progress relative to the base). A sink
    configured but absent has no progress of its own (new, or its progress lost): it is bootstrapped
    with a snapshot. None for a format-1 checkpoint, written before progress was per sink: it covers
    every configured sink, at the base."""


class CheckpointStore(Protocol):
    """Persists one checkpoint per informer id."""

    async def load(self, informer_id: str) -> Checkpoint | None:
        """The last checkpoint saved for ``informer_id``, or None if there is none. Raises
        :class:`CheckpointCorruptError` when one exists but cannot be read or verified, and
        :class:`CheckpointStoreError` when the store itself cannot be reached."""

    async def save(self, checkpoint: Checkpoint) -> None:
        """Replaces the informer's checkpoint atomically: after a crash at any point a later
        ``load`` returns either the previous or this checkpoint, whole. Raises
        :class:`CheckpointStoreError` on failure."""

    async def close(self) -> None:
        """Releases connections. Idempotent."""


@runtime_checkable
class ListableCheckpointStore(CheckpointStore, Protocol):
    """A store that can also enumerate and remove checkpoints: what resharding needs
    (:mod:`bridge.delivery.sharding`). Every built-in store is one."""

    async def informer_ids(self, prefix: str) -> list[str]:
        """The ids of the stored checkpoints that start with ``prefix``, sorted. Raises
        :class:`CheckpointStoreError` when the store cannot be read."""

    async def remove(self, informer_id: str) -> None:
        """Deletes the informer's checkpoint and its known-object journal (absent ones are fine).
        Raises :class:`CheckpointStoreError` on failure."""

    async def peek(self, informer_id: str) -> Checkpoint | None:
        """As :meth:`CheckpointStore.load`, without claiming the checkpoint for this writer's term
        (fenced stores): reading another shard's checkpoint must not fence that shard out."""


@runtime_checkable
class JournalStore(CheckpointStore, Protocol):
    """A store that also keeps each informer's known-object journal (:mod:`bridge.delivery.journal`).
    Every built-in store is one; without it a restart rests on the checkpoint alone."""

    def journal_backend(self, informer_id: str, *, fenced: bool = True) -> JournalBackend:
        """The informer's journal storage, fenced like the checkpoint. ``fenced=False``: another
        shard's journal, read during a take-over (its writer holds another shard's Lease, whose term
        says nothing about this one's), as :meth:`ListableCheckpointStore.peek` reads its checkpoint."""
        ...


# --------------------------------------------------------------------------------------------------
# Identity


_UNSAFE = re.compile(r"[^a-z0-9.-]+")


def _slug(text: str, limit: int) -> str:
    return _UNSAFE.sub("-", text.lower()).strip(".-")[:limit] or "x"


def informer_id(
    resource: str, namespace: str = "", label_selector: str = "", field_selector: str = "",
    namespace_selector: str = "",
) -> str:
    """A stable id for one informer scope, safe as a file name, a ConfigMap name and a NATS KV key.

    Readable prefix (resource and namespace), then a hash of the exact scope so two selectors on the
    same resource never share a checkpoint: ``pods.default.3f2a9c1d7e0b``, ``nodes._all.…``. A
    ``namespace_selector`` joins the hashed scope only when set (the ids of other scopes stay as
    they were).
    """
    parts = (resource, namespace, label_selector, field_selector)
    scope = "\x00".join((*parts, namespace_selector) if namespace_selector else parts)
    digest = hashlib.sha256(scope.encode()).hexdigest()[:12]
    ns = _slug(namespace, 63) if namespace else "all"
    return f"{_slug(resource, 100)}.{ns}.{digest}"


# --------------------------------------------------------------------------------------------------
# Encoding


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Header line (magic, format, body length, SHA-256 of the body) + ``\\n`` + JSON body."""
    body = orjson.dumps(
        {
            "informer_id": checkpoint.informer_id,
            "resource_version": checkpoint.resource_version,
            "written_at": checkpoint.written_at,
            "objects": {k: [v[0], v[1]] for k, v in checkpoint.objects.items()},
            "ahead": {k: [v[0], v[1], v[2]] for k, v in checkpoint.ahead.items()},
            **({"writer": token_json(checkpoint.writer)} if checkpoint.writer is not None else {}),
            **({"sinks": {name: _encode_progress(p) for name, p in checkpoint.sinks.items()}}
               if checkpoint.sinks is not None else {}),
        }
    )
    header = b"%s %d %d %s" % (_MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).hexdigest().encode())
    return header + b"\n" + body


def decode_checkpoint(data: bytes, expected_id: str | None = None) -> Checkpoint:
    """Parses and verifies :func:`encode_checkpoint` output; :class:`CheckpointCorruptError` if
    anything does not match, including contents a valid checksum does not make sensible (a resume
    point that is not a resourceVersion: a watch from it fails with 400 for ever; a known object
    without uid: its delete could never be reported; entries of the wrong shape)."""
    head, sep, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 4 or parts[0] != _MAGIC:
        raise CheckpointCorruptError("not a kube-event-bridge checkpoint (bad header)")
    try:
        version, length = int(parts[1]), int(parts[2])
    except ValueError as exc:
        raise CheckpointCorruptError("bad checkpoint header") from exc
    if version not in _READABLE_VERSIONS:
        raise CheckpointCorruptError(
            f"checkpoint format {version} is not supported (expected {FORMAT_VERSION} or older)"
        )
    if len(body) != length:
        raise CheckpointCorruptError(f"checkpoint truncated: {len(body)} of {length} body bytes")
    if hashlib.sha256(body).hexdigest().encode() != parts[3]:
        raise CheckpointCorruptError("checkpoint checksum mismatch")
    try:
        doc: Any = orjson.loads(body)
        rv = _rv("", doc["resource_version"])
        if not isinstance(doc["written_at"], int | float):
            raise CheckpointCorruptError("checkpoint body is malformed: written_at is not a number")
        sinks = _sinks(doc.get("sinks"), rv)
        cp = Checkpoint(
            informer_id=str(doc["informer_id"]),
            resource_version=rv,
            objects=_index("", doc["objects"]),
            written_at=float(doc["written_at"]),
            format_version=version,
            ahead=_ahead("", doc.get("ahead") or {}),
            writer=token_of(doc.get("writer")),
            sinks=sinks if version >= 2 else None,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CheckpointCorruptError(f"checkpoint body is malformed: {exc}") from exc
    if expected_id is not None and cp.informer_id != expected_id:
        raise CheckpointCorruptError(
            f"checkpoint belongs to informer {cp.informer_id!r}, not {expected_id!r}"
        )
    return cp


def _encode_progress(p: SinkProgress) -> dict[str, Any]:
    """An empty object for a sink at the base; otherwise only the parts that differ."""
    out: dict[str, Any] = {}
    if p.resource_version:
        out["resource_version"] = p.resource_version
    if p.objects:
        out["objects"] = {k: (None if v is None else [v[0], v[1]]) for k, v in p.objects.items()}
    if p.ahead:
        out["ahead"] = {k: [v[0], v[1], v[2]] for k, v in p.ahead.items()}
    if p.owes:
        out["owes"] = {k: dict(v) for k, v in p.owes.items()}
    return out


def _sinks(raw: Any, base_rv: str) -> dict[str, SinkProgress] | None:
    """The per-sink sections, each checked as the base is (and never behind it)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointCorruptError("checkpoint per-sink section is malformed")
    sinks: dict[str, SinkProgress] = {}
    for name, section in raw.items():
        if not name or not isinstance(section, dict):
            raise CheckpointCorruptError(f"checkpoint per-sink section {name!r} is malformed")
        unknown = set(section) - {"resource_version", "objects", "ahead", "owes"}
        if unknown:
            raise CheckpointCorruptError(
                f"checkpoint per-sink section {name!r} has unknown fields {sorted(unknown)}")
        where = f"sink {name!r}: "
        rv = _rv(where, section["resource_version"]) if "resource_version" in section else ""
        if rv and int(rv) < int(base_rv):
            raise CheckpointCorruptError(
                f"checkpoint {where}resourceVersion {rv} is behind the base's {base_rv}")
        sinks[name] = SinkProgress(resource_version=rv,
                                   objects=_index(where, section.get("objects") or {}, absent=True),
                                   ahead=_ahead(where, section.get("ahead") or {}),
                                   owes=_owes(where, section.get("owes") or {}))
    return sinks


def _owes(where: str, owes: Any) -> dict[str, dict[str, str]]:
    """A sink's ``owes``: key → uid → resourceVersion, each key one of its delivered-ahead map's."""
    out: dict[str, dict[str, str]] = {}
    for key, owed in owes.items():
        _check_key(f"{where}owed changes", key)
        if not isinstance(owed, dict) or not owed or not all(
                isinstance(uid, str) and uid and is_rv(rv) for uid, rv in owed.items()):
            raise CheckpointCorruptError(f"checkpoint {where}owed changes of {key!r} are malformed")
        out[key] = {uid: str(rv) for uid, rv in owed.items()}
    return out


def _rv(where: str, rv: Any) -> str:
    if not is_rv(rv):
        raise CheckpointCorruptError(f"checkpoint {where}resourceVersion {rv!r} is not a resourceVersion")
    return str(rv)


def _check_key(where: str, key: object) -> None:
    if not isinstance(key, str) or not key:
        raise CheckpointCorruptError(f"checkpoint {where} has an empty key")
    if key.count("/") > 1 or key.startswith("/") or key.endswith("/"):
        raise CheckpointCorruptError(f"checkpoint {where} has key {key!r}, not namespace/name or name")


def _index(where: str, objects: Any, *, absent: bool = False) -> dict[str, Any]:
    """Known-object index entries, key → (uid, resourceVersion); ``absent``: a sink's differences,
    where None is a key the base knows and this sink does not."""
    index: dict[str, Any] = {}
    for key, entry in objects.items():
        _check_key(f"{where}known-object index", key)
        if entry is None and absent:
            index[key] = None
            continue
        if len(entry) != 2 or not isinstance(entry[0], str) or not entry[0]:
            raise CheckpointCorruptError(f"checkpoint {where}known object {key!r} has no uid")
        if not is_rv(entry[1]):
            raise CheckpointCorruptError(
                f"checkpoint {where}known object {key!r} has resourceVersion {entry[1]!r}")
        index[key] = (entry[0], entry[1])
    return index


def _ahead(where: str, ahead: Any) -> dict[str, tuple[str, str, bool]]:
    out: dict[str, tuple[str, str, bool]] = {}
    for key, entry in ahead.items():
        _check_key(f"{where}delivered-ahead map", key)
        if len(entry) != 3 or not isinstance(entry[2], bool) or not isinstance(entry[0], str):
            raise CheckpointCorruptError(f"checkpoint {where}delivered-ahead entry {key!r} is malformed")
        if not entry[2] and not entry[0]:
            raise CheckpointCorruptError(f"checkpoint {where}delivered-ahead entry {key!r} has no uid")
        if not is_rv(entry[1]):
            raise CheckpointCorruptError(
                f"checkpoint {where}delivered-ahead entry {key!r} has resourceVersion {entry[1]!r}")
        out[key] = (entry[0], entry[1], entry[2])
    return out


# --------------------------------------------------------------------------------------------------
# Stores


class BlobCheckpointStore:
    """Checkpoints (values of ``checkpoints``) and known-object journals (values of ``journals``),
    each written by a :class:`~bridge.storage.blobstore.ChunkedValue`: a
    :class:`ListableCheckpointStore` and a :class:`JournalStore`. A backend builds it with its blob
    stores; ``chunking=False`` keeps every value in one blob (``too_large`` says what to do when one
    does not fit)."""

    def __init__(self, *, checkpoints: BlobStore, journals: BlobStore, fence: FenceSource | None,
                 chunking: bool = True, too_large: str = "", fenced_journals: bool = True) -> None:
        self._checkpoints = checkpoints
        self._journals = journals
        self._fence = fence
        self._chunking = chunking
        self._too_large = too_large
        self._fenced_journals = fenced_journals
        self._values: dict[str, ChunkedValue] = {}
        """informer id → its checkpoint as this store last read or wrote it."""
        self.last_chunk_count = 0
        """Chunks written by the last save (0 when the checkpoint fitted in its head)."""

    def _value(self, informer_id: str, *, fenced: bool = True) -> ChunkedValue:
        value = self._values.get(informer_id) if fenced else None
        if value is None:
            fence = self._fence if fenced else None
            value = ChunkedValue(store=self._checkpoints, ident=informer_id, fence=fence,
                                 chunking=self._chunking, too_large=self._too_large, what="checkpoint")
            if fenced:
                self._values[informer_id] = value
        return value

    def journal_backend(self, informer_id: str, *, fenced: bool = True) -> ChunkedValue:
        fence = self._fence if fenced and self._fenced_journals else None
        return ChunkedValue(store=self._journals, ident=informer_id, fence=fence, chunking=self._chunking,
                            too_large=self._too_large)

    async def load(self, informer_id: str) -> Checkpoint | None:
        value = self._value(informer_id)
        return await self._load(value, informer_id, fence_token(self._fence, f"loading {value.name}"))

    async def peek(self, informer_id: str) -> Checkpoint | None:
        """The checkpoint, read without claiming it (another shard's, during a take-over)."""
        return await self._load(self._value(informer_id, fenced=False), informer_id, None)

    async def _load(self, value: ChunkedValue, informer_id: str,
                    token: FenceToken | None) -> Checkpoint | None:
        for _ in range(CAS_ATTEMPTS):
            head = await value.fetch(token)
            if head is None:
                return None
            try:
                checkpoint = decode_checkpoint(await value.assemble(head), informer_id)
            except CheckpointCorruptError as exc:
                raise CheckpointCorruptError(f"{value.name}: {exc}") from exc
            check_fence(token, checkpoint.writer, value.name)
            if token is None or head.writer == token:
                return checkpoint
            # Claim it for this term: from now on an older leader's write fails.
            if await value.claim(head, encode_checkpoint(dataclasses.replace(checkpoint, writer=token))):
                return checkpoint
        raise CheckpointStoreError(f"cannot claim {value.name}: it keeps changing")

    async def save(self, checkpoint: Checkpoint) -> None:
        value = self._value(checkpoint.informer_id)
        token = fence_token(self._fence, value.name)
        if token is not None:
            checkpoint = dataclasses.replace(checkpoint, writer=token)
        await value.rewrite(encode_checkpoint(checkpoint))
        self.last_chunk_count = len(value.chunks)
        log.debug("checkpoint written", extra={"informer": checkpoint.informer_id,
                                              "resource_version": checkpoint.resource_version,
                                              "writer": token.holder if token else "",
                                              "lease_transitions": token.transitions if token else None})

    async def informer_ids(self, prefix: str) -> list[str]:
        return await self._checkpoints.list_heads(prefix)

    async def remove(self, informer_id: str) -> None:
        # Only shard 0 of a new total removes the checkpoints of an earlier one, written under other
        # shards' leases: being the leader of its own shard is what it needs.
        fence_token(self._fence, f"removing checkpoint {self._checkpoints.describe(informer_id)}")
        await self._value(informer_id, fenced=False).remove()
        await self.journal_backend(informer_id, fenced=False).remove()
        self._values.pop(informer_id, None)

    async def close(self) -> None:
        return None


class FileCheckpointStore(BlobCheckpointStore):
    """One ``<informer_id>.ckpt`` file per informer in ``directory`` (created if missing), its
    journal ``<informer_id>.journal`` next to it; meant for one replica (fencing across hosts is
    only as good as the shared filesystem's locks: :mod:`bridge.storage.blob_file`). ``files``: the
    class of its files (a test's holds a write)."""

    SUFFIX = ".ckpt"

    def __init__(self, *, directory: str | os.PathLike[str], fsync: bool = True,
                 fence: FenceSource | None = None, files: type[FileBlobStore] = FileBlobStore) -> None:
        self._files = files(directory=directory, suffix=self.SUFFIX, what="checkpoint", fsync=fsync,
                            writer_of=_writer_of if fence is not None else None)  # unfenced: not read
        self._journal_files = files(directory=directory, suffix=".journal", what="journal", fsync=fsync)
        super().__init__(checkpoints=self._files, journals=self._journal_files, fence=fence,
                         fenced_journals=False)

    def path_for(self, informer_id: str) -> Path:
        return self._files.path_for(informer_id)

    def journal_path(self, informer_id: str) -> Path:
        """Where the informer's known-object journal lives (:mod:`bridge.delivery.journal`)."""
        return self._journal_files.path_for(informer_id)


def _writer_of(data: bytes) -> FenceToken | None:
    """The writer's token a checkpoint file carries (None: none, or unreadable)."""
    try:
        return decode_checkpoint(data).writer
    except CheckpointCorruptError:
        return None
