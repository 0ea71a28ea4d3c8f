"""Checkpoints: where an informer resumes after a restart, and the stores that keep them.

A :class:`Checkpoint` holds, for one informer, the resourceVersion up to which every sink has
acknowledged every change, and the known-object index (key → (uid, resourceVersion)) as of that
point. On start the bridge seeds the informer with the index and resumes the watch from the
resourceVersion; if the server answers 410 the relist is diffed against the index so only real
differences are emitted.

Progress is also kept per sink (format 2): the fields above are the *base*, the slowest common state
(what every sink acknowledged), and :attr:`Checkpoint.sinks` names the sinks the checkpoint covers,
each with only its differences from the base (:class:`SinkProgress`: its own resume point, the
known objects that differ, its own delivered-ahead changes). A configured sink it does not name is
bootstrapped with a snapshot; a format-1 checkpoint (no section) covers every configured sink at the
base.

Stores share one small contract (:class:`CheckpointStore`) and one byte encoding
(:func:`encode_checkpoint` / :func:`decode_checkpoint`): a header line (format version, length,
SHA-256) followed by the JSON body, so truncation and bit rot are detected instead of trusted. A
checkpoint that cannot be read or verified raises :class:`CheckpointCorruptError`; the bridge then
logs a warning and does a full, correct resync — never a crash, never a silent loss. A valid
checksum over nonsense (a resourceVersion that is not an integer, a known object without uid) is
corrupt too: a watch from such a resume point would fail for ever.

:class:`FileCheckpointStore` is the embedded default: one file per informer, written to a temporary
file, fsynced, renamed over the old one, and the directory fsynced, so a crash leaves either the old
or the new checkpoint, never a torn one. The ConfigMap and NATS KV stores live in their own modules.

Fencing (leader election): a store built with a ``fence`` (a callable returning the writer's
:class:`~bridge.kube.leaderelection.FenceToken`, or None once it no longer leads) writes nothing when
the fence says None, stamps every checkpoint with the token (``writer``), and refuses, by the store's
own compare-and-set, a write whose token is older than the stored one: a ConfigMap replace with the
``resourceVersion`` read, a NATS KV update with the expected revision, a file rewritten under an
exclusive lock. Loading claims the checkpoint for the loader's term (the stored token is replaced by
the loader's with the same precondition), so once a new leader has loaded, a deposed one cannot
write, whatever it believes. Loading as an older term than the stored one is refused as well.

    CheckpointError
    ├── CheckpointCorruptError   unreadable, truncated, wrong checksum/format: resync fully
    └── CheckpointStoreError     the store could not be reached or written: retry later
        └── CheckpointFencedError   this writer no longer leads, or a later leader owns it
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from bridge.delivery.store_io import finish_in_thread
from bridge.errors import BridgeError
from bridge.kube.leaderelection import FenceToken

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointStore",
    "CheckpointStoreError",
    "FenceSource",
    "FileCheckpointStore",
    "ListableCheckpointStore",
    "SinkProgress",
    "decode_checkpoint",
    "encode_checkpoint",
    "informer_id",
]

if TYPE_CHECKING:
    from bridge.delivery.journal import FileJournalBackend

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Written by this version. 2 added the per-sink section (``sinks``); format 1 is still read (it
covers every configured sink, at the base)."""
_READABLE_VERSIONS = frozenset({1, 2})
_MAGIC = b"kube-event-bridge-checkpoint"


class CheckpointError(BridgeError):
    """Base of the checkpoint errors."""


class CheckpointCorruptError(CheckpointError):
    """A stored checkpoint cannot be trusted. The bridge warns and resyncs fully."""


class CheckpointStoreError(CheckpointError):
    """The store failed (unreachable, write refused). The previous checkpoint stays in place."""


class CheckpointFencedError(CheckpointStoreError):
    """The write (or load) was refused by fencing: this replica no longer leads, or a later leader
    owns the checkpoint. Nothing was written."""


FenceSource = Callable[[], FenceToken | None]
"""The writer's current token; None once it no longer leads."""


def fence_token(fence: FenceSource | None, what: str) -> FenceToken | None:
    """The token a fenced store writes with; raises :class:`CheckpointFencedError` when the writer
    no longer leads. None for an unfenced store."""
    if fence is None:
        return None
    token = fence()
    if token is None:
        raise CheckpointFencedError(f"{what}: this replica is not the leader (any more); not written")
    return token


def check_fence(token: FenceToken | None, stored: FenceToken | None, what: str) -> None:
    """Raises :class:`CheckpointFencedError` when ``stored`` belongs to a later leader than
    ``token``."""
    if token is not None and stored is not None and not token.supersedes(stored):
        raise CheckpointFencedError(
            f"{what}: owned by {stored.holder!r} (lease term {stored.transitions}), a later leader than "
            f"{token.holder!r} (term {token.transitions}); refused"
        )


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
    """Its own delivered-ahead map (as :attr:`Checkpoint.ahead`), beyond its own resume point."""

    @property
    def at_base(self) -> bool:
        return not (self.resource_version or self.objects or self.ahead)


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
            **({"writer": [checkpoint.writer.transitions, checkpoint.writer.holder]}
               if checkpoint.writer is not None else {}),
            **({"sinks": {name: _encode_progress(p) for name, p in checkpoint.sinks.items()}}
               if checkpoint.sinks is not None else {}),
        }
    )
    header = b"%s %d %d %s" % (_MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).hexdigest().encode())
    return header + b"\n" + body


def decode_checkpoint(data: bytes, expected_id: str | None = None) -> Checkpoint:
    """Parses and verifies :func:`encode_checkpoint` output; :class:`CheckpointCorruptError` if
    anything does not match."""
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
        objects = {str(k): (str(v[0]), str(v[1])) for k, v in doc["objects"].items()}
        ahead = {str(k): (str(v[0]), str(v[1]), bool(v[2])) for k, v in (doc.get("ahead") or {}).items()}
        _check_contents(doc)
        writer_raw = doc.get("writer")
        writer = (FenceToken(transitions=int(writer_raw[0]), holder=str(writer_raw[1]))
                  if writer_raw is not None else None)
        sinks_raw = doc.get("sinks") if version >= 2 else None
        sinks = ({str(name): _decode_progress(p) for name, p in sinks_raw.items()}
                 if sinks_raw is not None else None)
        cp = Checkpoint(
            informer_id=str(doc["informer_id"]),
            resource_version=str(doc["resource_version"]),
            objects=objects,
            written_at=float(doc["written_at"]),
            format_version=version,
            ahead=ahead,
            writer=writer,
            sinks=sinks,
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
    return out


def _decode_progress(raw: Any) -> SinkProgress:
    return SinkProgress(
        resource_version=str(raw.get("resource_version", "")),
        objects={str(k): (None if v is None else (str(v[0]), str(v[1])))
                 for k, v in (raw.get("objects") or {}).items()},
        ahead={str(k): (str(v[0]), str(v[1]), bool(v[2])) for k, v in (raw.get("ahead") or {}).items()},
    )


def _is_rv(value: object) -> bool:
    """A resourceVersion the bridge can resume from: a non-negative decimal integer (an etcd
    revision; the bookkeeping compares them as integers, see docs/delivery-contract.md)."""
    return isinstance(value, str) and value.isascii() and value.isdigit()


def _check_key(where: str, key: object) -> None:
    if not isinstance(key, str) or not key:
        raise CheckpointCorruptError(f"checkpoint {where} has an empty key")
    if key.count("/") > 1 or key.startswith("/") or key.endswith("/"):
        raise CheckpointCorruptError(f"checkpoint {where} has key {key!r}, not namespace/name or name")


def _check_contents(doc: Any) -> None:
    """Contents that a valid checksum does not make sensible: a resume point that is not a
    resourceVersion (a watch from it fails with 400 for ever), a known object without uid (its delete
    could never be reported), entries of the wrong shape — in the shared base and in every sink's
    section. Raises :class:`CheckpointCorruptError`."""
    rv = doc["resource_version"]
    if not _is_rv(rv):
        raise CheckpointCorruptError(f"checkpoint resourceVersion {rv!r} is not a resourceVersion")
    if not isinstance(doc["written_at"], int | float):
        raise CheckpointCorruptError("checkpoint body is malformed: written_at is not a number")
    _check_index("", doc["objects"], allow_absent=False)
    _check_ahead("", doc.get("ahead") or {})
    sinks = doc.get("sinks")
    if sinks is None:
        return
    if not isinstance(sinks, dict):
        raise CheckpointCorruptError("checkpoint per-sink section is malformed")
    for name, section in sinks.items():
        if not name or not isinstance(section, dict):
            raise CheckpointCorruptError(f"checkpoint per-sink section {name!r} is malformed")
        unknown = set(section) - {"resource_version", "objects", "ahead"}
        if unknown:
            raise CheckpointCorruptError(
                f"checkpoint per-sink section {name!r} has unknown fields {sorted(unknown)}")
        where = f"sink {name!r}: "
        if "resource_version" in section:
            sink_rv = section["resource_version"]
            if not _is_rv(sink_rv):
                raise CheckpointCorruptError(
                    f"checkpoint {where}resourceVersion {sink_rv!r} is not a resourceVersion")
            if int(sink_rv) < int(rv):
                raise CheckpointCorruptError(
                    f"checkpoint {where}resourceVersion {sink_rv} is behind the base's {rv}")
        _check_index(where, section.get("objects") or {}, allow_absent=True)
        _check_ahead(where, section.get("ahead") or {})


def _check_index(where: str, objects: Any, *, allow_absent: bool) -> None:
    for key, entry in objects.items():
        _check_key(f"{where}known-object index", key)
        if entry is None and allow_absent:
            continue  # a sink's difference: the base knows the key, this sink does not
        if len(entry) != 2 or not isinstance(entry[0], str) or not entry[0]:
            raise CheckpointCorruptError(f"checkpoint {where}known object {key!r} has no uid")
        if not _is_rv(entry[1]):
            raise CheckpointCorruptError(
                f"checkpoint {where}known object {key!r} has resourceVersion {entry[1]!r}")


def _check_ahead(where: str, ahead: Any) -> None:
    for key, entry in ahead.items():
        _check_key(f"{where}delivered-ahead map", key)
        if len(entry) != 3 or not isinstance(entry[2], bool) or not isinstance(entry[0], str):
            raise CheckpointCorruptError(f"checkpoint {where}delivered-ahead entry {key!r} is malformed")
        if not entry[2] and not entry[0]:
            raise CheckpointCorruptError(f"checkpoint {where}delivered-ahead entry {key!r} has no uid")
        if not _is_rv(entry[1]):
            raise CheckpointCorruptError(
                f"checkpoint {where}delivered-ahead entry {key!r} has resourceVersion {entry[1]!r}")


# --------------------------------------------------------------------------------------------------
# File store


class FileCheckpointStore:
    """One ``<informer_id>.ckpt`` file per informer in ``directory`` (created if missing).

    Meant for one replica. With a ``fence`` (leader election), the check of the stored writer and
    the rewrite happen under an exclusive ``flock`` on ``directory/.lock``, which fences replicas
    sharing the directory on one host; across hosts it is only as good as the shared filesystem's
    locks, so for several replicas use the ConfigMap or NATS KV store (docs/operations.md).

    Writes run in a thread that a cancelled caller waits for (:mod:`bridge.delivery.store_io`): a
    save cancelled mid-way has landed or failed when it returns, never later."""

    SUFFIX = ".ckpt"
    LOCK = ".lock"

    def __init__(self, *, directory: str | os.PathLike[str], fsync: bool = True,
                 fence: FenceSource | None = None) -> None:
        self._dir = Path(directory)
        self._fsync = fsync
        self._fence = fence

    @property
    def directory(self) -> Path:
        return self._dir

    def path_for(self, informer_id: str) -> Path:
        if not informer_id or "/" in informer_id or informer_id.startswith("."):
            raise ValueError(f"unsafe informer id for a file name: {informer_id!r}")
        return self._dir / f"{informer_id}{self.SUFFIX}"

    def journal_path(self, informer_id: str) -> Path:
        """Where the informer's known-object journal lives (:mod:`bridge.delivery.journal`)."""
        return self.path_for(informer_id).with_suffix(".journal")

    def journal_backend(self, informer_id: str, *, fenced: bool = True) -> FileJournalBackend:
        """The informer's known-object journal storage: the file at :meth:`journal_path` (files are
        not fenced: ``fenced`` is accepted for the stores' common shape)."""
        del fenced
        from bridge.delivery.journal import FileJournalBackend  # journal imports this module
        return FileJournalBackend(self.journal_path(informer_id), fsync=self._fsync)

    async def peek(self, informer_id: str) -> Checkpoint | None:
        """The checkpoint, read without claiming it (another shard's, during a take-over)."""
        return await asyncio.to_thread(self._load, informer_id)

    async def load(self, informer_id: str) -> Checkpoint | None:
        token = fence_token(self._fence, f"loading checkpoint {informer_id}")
        if token is None:
            return await asyncio.to_thread(self._load, informer_id)
        return await finish_in_thread(self._load_and_claim, informer_id, token)

    async def save(self, checkpoint: Checkpoint) -> None:
        token = fence_token(self._fence, f"checkpoint {checkpoint.informer_id}")
        if token is None:
            await finish_in_thread(self._save, checkpoint.informer_id, encode_checkpoint(checkpoint))
            return
        data = encode_checkpoint(dataclasses.replace(checkpoint, writer=token))
        await finish_in_thread(self._save_fenced, checkpoint.informer_id, data, token)
        log.debug("checkpoint written", extra={"informer": checkpoint.informer_id,
                                              "resource_version": checkpoint.resource_version,
                                              "writer": token.holder, "lease_transitions": token.transitions})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._dir / self.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CheckpointStoreError(f"cannot lock checkpoint directory {self._dir}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _stored_writer(self, informer_id: str) -> FenceToken | None:
        try:
            current = self._load(informer_id)
        except CheckpointCorruptError:
            return None  # a corrupt checkpoint is replaced, never trusted
        return current.writer if current is not None else None

    def _load_and_claim(self, informer_id: str, token: FenceToken) -> Checkpoint | None:
        with self._locked():
            current = self._load(informer_id)
            if current is None:
                return None
            check_fence(token, current.writer, f"checkpoint {informer_id}")
            if current.writer != token:
                self._save(informer_id, encode_checkpoint(dataclasses.replace(current, writer=token)))
            return current

    def _save_fenced(self, informer_id: str, data: bytes, token: FenceToken) -> None:
        with self._locked():
            check_fence(token, self._stored_writer(informer_id), f"checkpoint {informer_id}")
            self._save(informer_id, data)

    async def close(self) -> None:
        return None

    async def informer_ids(self, prefix: str) -> list[str]:
        def scan() -> list[str]:
            try:
                names = [p.name for p in self._dir.iterdir()]
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise CheckpointStoreError(f"cannot list checkpoint directory {self._dir}: {exc}") from exc
            return sorted(n[: -len(self.SUFFIX)] for n in names
                          if n.endswith(self.SUFFIX) and n.startswith(prefix) and not n.startswith("."))

        return await asyncio.to_thread(scan)

    async def remove(self, informer_id: str) -> None:
        token = fence_token(self._fence, f"removing checkpoint {informer_id}")

        # Only shard 0 of a new total removes the checkpoints of an earlier one, written under other
        # shards' leases: being the leader of its own shard (the fence above) is what it needs.
        del token

        def unlink() -> None:
            try:
                self.path_for(informer_id).unlink(missing_ok=True)
                self.journal_path(informer_id).unlink(missing_ok=True)
            except OSError as exc:
                raise CheckpointStoreError(f"cannot remove checkpoint {informer_id}: {exc}") from exc

        await finish_in_thread(unlink)

    def _load(self, informer_id: str) -> Checkpoint | None:
        path = self.path_for(informer_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointCorruptError(f"cannot read checkpoint {path}: {exc}") from exc
        try:
            return decode_checkpoint(data, informer_id)
        except CheckpointCorruptError as exc:
            raise CheckpointCorruptError(f"{path}: {exc}") from exc

    def _save(self, informer_id: str, data: bytes) -> None:
        path = self.path_for(informer_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if self._fsync:
                dfd = os.open(self._dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise CheckpointStoreError(f"cannot write checkpoint {path}: {exc}") from exc
