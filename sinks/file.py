"""JSON-lines sinks: a file (the embedded default, and the demo's) and stdout (debugging).

Each event is one line: the structured CloudEvent. Durability: an event is acked once its line was
written and flushed to the operating system (it survives the bridge crashing, not the machine
losing power); ``flush()`` additionally fsyncs, and ``fsync: always`` fsyncs before every ack, at a
large cost in throughput. Optional size-based rotation keeps ``path.1`` … ``path.{keep}``.

Lines are written in batches: every message submitted during one turn of the event loop is written
with one ``write`` and one ``flush`` at the end of that turn, and all of them are acked after it, so
the per-event guarantee above holds at a fraction of the system calls. With ``fsync: always`` one
task fsyncs (off the loop) everything written since its previous fsync and then acks those events:
a group commit, so the cost of an fsync is shared by every event that waited for it. Lines keep
their submission order (and the base sink submits one object's next event only after the previous
one was acked).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field, model_validator

from bridge.clock import Clock
from sinks.base import BaseSink, OutgoingMessage
from sinks.contract import SinkTransientError
from sinks.options import SinkOptions

__all__ = ["FileSink", "FileSinkOptions", "StdoutSink", "StdoutSinkOptions"]

log = logging.getLogger(__name__)


class _JsonLinesOptions(SinkOptions):
    @model_validator(mode="after")
    def _structured_only(self) -> _JsonLinesOptions:
        if self.content_mode != "structured":
            raise ValueError("content_mode: JSON-lines sinks write structured events only")
        return self


class FileSinkOptions(_JsonLinesOptions):
    path: str
    rotate_bytes: int = Field(default=0, ge=0)
    """Rotate when the file reaches this size; 0 = never."""
    keep: int = Field(default=5, ge=1)
    """Rotated files kept (``path.1`` is the newest)."""
    fsync: Literal["flush", "always"] = "flush"


class StdoutSinkOptions(_JsonLinesOptions):
    pass


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


class _LineBatcher:
    """Collects the lines submitted during one loop turn and writes them with one call at its end."""

    __slots__ = ("_msgs", "_scheduled", "_write")

    def __init__(self, write: Callable[[list[bytes], list[OutgoingMessage]], None]) -> None:
        self._write = write
        self._msgs: list[OutgoingMessage] = []
        self._scheduled = False

    def add(self, msg: OutgoingMessage) -> None:
        self._msgs.append(msg)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        msgs, self._msgs = self._msgs, []
        if msgs:
            self._write([m.body for m in msgs], msgs)  # the lines in one pass, not one append each


class FileSink(BaseSink[FileSinkOptions]):
    kind = "file"
    options_model = FileSinkOptions
    default_destination = ""

    def __init__(self, *, name: str, options: FileSinkOptions, clock: Clock | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock)
        self.path = Path(options.path)
        self._fh: IO[bytes] | None = None
        self._size = 0
        self._batch = _LineBatcher(self._write_batch)
        self._unsynced: list[OutgoingMessage] = []
        """``fsync: always``: written, waiting for the syncer task's next fsync (group commit)."""
        self._unsynced_ready = asyncio.Event()
        self._syncer: asyncio.Task[None] | None = None

    def _open(self) -> IO[bytes]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "ab")  # noqa: SIM115 - kept open for the sink's lifetime
        self._size = fh.tell()
        if self._size and not _ends_with_newline(self.path):
            # A crash mid-write left a torn last line (its event was never acknowledged and is sent
            # again): end it, so that the next line is whole and readers can skip the torn one.
            fh.write(b"\n")
            fh.flush()
            self._size += 1
        return fh

    async def _start(self) -> None:
        if self._fh is None:
            try:
                self._fh = self._open()
            except OSError as exc:
                raise self._config_error(f"cannot open {str(self.path)!r}: {exc}") from exc

    def _rotate(self) -> None:
        if self._fh is not None:
            if self.options.fsync == "always":
                os.fsync(self._fh.fileno())  # what the syncer has not synced yet is in this file
            self._fh.close()
            self._fh = None
        keep = self.options.keep
        for i in range(keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fh = self._open()

    def _submit(self, msg: OutgoingMessage) -> None:
        self._batch.add(msg)

    def _write_batch(self, lines: list[bytes], msgs: list[OutgoingMessage]) -> None:
        """Writes the batch (rotating where a line crosses ``rotate_bytes``), then settles it."""
        if self._closed:
            return  # left unacked, as close promises
        error: Exception | None = None
        try:
            if self._fh is None:
                self._fh = self._open()
            limit = self.options.rotate_bytes
            if not limit:
                lines.append(b"")  # the join then ends with the last newline: no second copy
                data = b"\n".join(lines)
                self._fh.write(data)
                self._fh.flush()
                self._size += len(data)
            else:
                start = 0
                size = self._size
                for i, line in enumerate(lines):
                    size += len(line) + 1
                    if size >= limit:
                        self._fh.write(b"\n".join(lines[start : i + 1]) + b"\n")
                        self._fh.flush()
                        self._size = size
                        self._rotate()
                        size = self._size
                        start = i + 1
                if start < len(lines):
                    self._fh.write(b"\n".join(lines[start:]) + b"\n")
                    self._fh.flush()
                    self._size = size
        except (OSError, ValueError) as exc:
            error = SinkTransientError(f"writing {str(self.path)!r} failed: {exc}")
        except Exception as exc:  # never strand the batch: unexpected errors are dead-lettered
            error = exc
        if error is None and self.options.fsync == "always":
            self._unsynced.extend(msgs)
            self._unsynced_ready.set()
            if self._syncer is None or self._syncer.done():
                self._syncer = asyncio.get_running_loop().create_task(
                    self._sync_loop(), name=f"sink:{self.name}:fsync"
                )
            return
        self._settle_all(zip(msgs, itertools.repeat(error)))

    async def _sync_loop(self) -> None:
        """One fsync for everything written since the previous one, then those events are acked."""
        while True:
            if not self._unsynced:
                self._unsynced_ready.clear()
                await self._unsynced_ready.wait()
                continue
            msgs, self._unsynced = self._unsynced, []
            error: Exception | None = None
            try:
                if self._fh is not None:
                    # A duplicate descriptor stays valid even if the file is rotated meanwhile.
                    fd = os.dup(self._fh.fileno())
                    try:
                        await asyncio.to_thread(os.fsync, fd)
                    finally:
                        os.close(fd)
            except OSError as exc:
                error = SinkTransientError(f"fsync of {str(self.path)!r} failed: {exc}")
            except Exception as exc:  # never strand the batch: unexpected errors are dead-lettered
                log.exception("fsync failed unexpectedly", extra={"sink": self.name})
                error = exc
            self._settle_all(zip(msgs, itertools.repeat(error)))

    async def _on_flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            await asyncio.to_thread(os.fsync, self._fh.fileno())

    async def _close(self) -> None:
        syncer, self._syncer = self._syncer, None
        if syncer is not None:
            syncer.cancel()
            await asyncio.gather(syncer, return_exceptions=True)
        self._unsynced.clear()
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


class StdoutSink(BaseSink[StdoutSinkOptions]):
    kind = "stdout"
    options_model = StdoutSinkOptions
    default_destination = ""

    def __init__(
        self,
        *,
        name: str,
        options: StdoutSinkOptions,
        clock: Clock | None = None,
        stream: IO[bytes] | None = None,
    ) -> None:
        super().__init__(name=name, options=options, clock=clock)
        self._stream = stream
        self._batch = _LineBatcher(self._write_batch)

    def _submit(self, msg: OutgoingMessage) -> None:
        self._batch.add(msg)

    def _write_batch(self, lines: list[bytes], msgs: list[OutgoingMessage]) -> None:
        if self._closed:
            return
        stream: Any = self._stream if self._stream is not None else sys.stdout.buffer
        error: Exception | None = None
        try:
            lines.append(b"")
            stream.write(b"\n".join(lines))
            stream.flush()
        except (OSError, ValueError) as exc:
            error = SinkTransientError(f"writing to stdout failed: {exc}")
        except Exception as exc:  # never strand the batch: unexpected errors are dead-lettered
            error = exc
        self._settle_all(zip(msgs, itertools.repeat(error)))
