"""The file backend of the storage layer: values as files in one directory.

A value's head is the file ``<ident><suffix>`` (``pods.all.3f2a9c1d7e0b.ckpt``, ``….journal``) and
holds the value's bytes as they are, so a checkpoint file is exactly an encoded checkpoint and a
journal file exactly the journal's text (docs/architecture.md). A file has no size limit: values
are never chunked (the store keeps no chunks, :class:`~bridge.storage.blobstore.ChunkStore`).

Compare-and-set: a head's version is its file's (inode, size, mtime); a fenced replace compares it
and writes under an exclusive ``flock`` on ``directory/.lock``, which fences replicas sharing the
directory on one host (across hosts only as good as the shared filesystem's locks: several replicas
should use the ConfigMap or NATS KV store, docs/operations.md). A replace is a temporary file,
``fsync``, rename and a directory ``fsync``, so a crash leaves the old or the new file, never a torn
one; an append (a journal's group commit) is one ``write`` and ``fdatasync``. The writer's lease
token lives inside the value (a checkpoint carries it), read back by ``writer_of``; without it the
values are unfenced (journal files: one replica).

Writes run in a thread that a cancelled caller waits for (:mod:`bridge.storage.store_io`): a write
cancelled mid-way has landed or failed when it returns, never later.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bridge.kube.leaderelection import FenceToken
from bridge.storage.blobstore import BlobConflict, Head
from bridge.storage.fencing import BlobStoreError, CheckpointCorruptError
from bridge.storage.store_io import finish_in_thread

__all__ = ["FileBlobStore"]

LOCK = ".lock"


class FileBlobStore:
    """Values as files in ``directory`` (created when first written); a
    :class:`~bridge.storage.blobstore.AppendableBlobStore`.

    ``what`` names the kind in messages; ``writer_of`` reads the writer's token out of a value (None:
    the values carry none, they are not fenced)."""

    def __init__(self, *, directory: str | os.PathLike[str], suffix: str, what: str, fsync: bool = True,
                 writer_of: Callable[[bytes], FenceToken | None] | None = None) -> None:
        self._dir = Path(directory)
        self._suffix = suffix
        self._what = what
        self._fsync = fsync
        self._writer_of = writer_of

    def path_for(self, ident: str) -> Path:
        if not ident or "/" in ident or ident.startswith("."):
            raise ValueError(f"unsafe informer id for a file name: {ident!r}")
        return self._dir / f"{ident}{self._suffix}"

    # ---- BlobStore ---------------------------------------------------------------------------------

    def describe(self, ident: str) -> str:
        return str(self.path_for(ident))

    def head_room(self, chunks: Sequence[str]) -> int | None:
        return None

    async def get(self, ident: str) -> Head | None:
        return await asyncio.to_thread(self._get, ident)

    async def compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        return await finish_in_thread(self._compare_and_set, ident, head, version)

    async def append(self, ident: str, data: bytes, version: str) -> str:
        return await finish_in_thread(self._append_if, ident, data, version)

    async def delete(self, ident: str) -> None:
        await finish_in_thread(self._unlink, self.path_for(ident))

    async def list_heads(self, prefix: str) -> list[str]:
        names = await asyncio.to_thread(self._names)
        return sorted(n[: -len(self._suffix)] for n in names
                      if n.endswith(self._suffix) and n.startswith(prefix) and not n.startswith("."))

    # ---- in a thread -------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        try:
            return [p.name for p in self._dir.iterdir()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise BlobStoreError(f"cannot list directory {self._dir}: {exc}") from exc

    def _get(self, ident: str) -> Head | None:
        path = self.path_for(ident)
        try:
            with path.open("rb") as f:
                version = _version(os.fstat(f.fileno()))
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a file that cannot be read cannot be trusted either
            raise CheckpointCorruptError(
                f"cannot read {self._what} {path}: {type(exc).__name__}: {exc}") from exc
        writer = self._writer_of(data) if self._writer_of is not None else None
        return Head(writer=writer, inline=data, version=version)

    def _compare_and_set(self, ident: str, head: Head, version: str | None) -> str:
        path = self.path_for(ident)
        # Fenced writes compare and replace under the directory's lock (unfenced ones: one replica).
        with self._locked() if head.writer is not None else contextlib.nullcontext():
            try:
                current: str | None = _version(path.stat())
            except FileNotFoundError:
                current = None
            except OSError as exc:
                raise BlobStoreError(f"cannot write {self._what} {path}: {exc}") from exc
            if current != version:
                raise BlobConflict(f"{path}: version {current}, not {version}")
            self._replace(path, head.inline)
            return _version(path.stat())

    def _append_if(self, ident: str, data: bytes, version: str) -> str:
        path = self.path_for(ident)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError as exc:
            raise BlobConflict(f"{path} is gone") from exc
        try:
            if _version(os.fstat(fd)) != version:
                raise BlobConflict(f"{path} was replaced")
            self._append(fd, data)
            return _version(os.fstat(fd))
        finally:
            os.close(fd)

    def _append(self, fd: int, data: bytes) -> None:
        """Appends ``data`` durably to the open file ``fd`` (a test may hold it)."""
        _write_all(fd, data)
        if self._fsync:
            os.fdatasync(fd)

    def _replace(self, path: Path, data: bytes) -> None:
        """Replaces ``path`` by ``data`` atomically and durably (a test may hold it)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, data)
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
            raise BlobStoreError(f"cannot write {self._what} {path}: {exc}") from exc

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise BlobStoreError(f"cannot remove {self._what} {path}: {exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BlobStoreError(f"cannot lock directory {self._dir}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def _version(st: os.stat_result) -> str:
    return f"{st.st_ino}.{st.st_size}.{st.st_mtime_ns}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
