"""JSON-lines sinks: a file (the embedded default, and the demo's) and stdout (debugging), each a
:class:`~sinks.transport.Transport` under a :class:`~sinks.transport.TransportSink`.

Each event is one line: the structured CloudEvent. Durability: an event is acked once its line was
written and flushed to the operating system (it survives the bridge crashing, not the machine
losing power); ``flush()`` additionally fsyncs (the transport's ``flush`` hook), and
``fsync: always`` fsyncs before every ack, at a large cost in throughput. Optional size-based
rotation keeps ``path.1`` … ``path.{keep}``.

Lines are written in batches: the transport sink hands over every message submitted during one turn
of the event loop as one batch, written with one ``write`` and one ``flush``, and all of them are
acked after it with one report, so the per-event guarantee above holds at a fraction of the system
calls. With ``fsync: always`` one task fsyncs (off the loop) everything written since its previous
fsync and then acks those events: a group commit, so the cost of an fsync is shared by every event
that waited for it. Lines keep their submission order (and the sink submits one object's next event
only after the previous one was acked).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field, model_validator

from bridge.clock import Clock
from sinks.contract import SinkConfigError, SinkTransientError
from sinks.options import SinkOptions
from sinks.transport import EncodedMessage, Report, Transport, TransportSink

__all__ = ["FileSink", "FileSinkOptions", "FileTransport", "StdoutSink", "StdoutSinkOptions",
           "StdoutTransport"]

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


class FileTransport:
    """Appends each batch's lines to a file (rotated by size), reported once written and flushed to
    the operating system, or with ``fsync: always`` once a shared fsync covered them; ``flush``
    fsyncs. ``config_error`` makes the error of a file that cannot be opened at start."""

    def __init__(self, *, name: str, options: FileSinkOptions,
                 config_error: Callable[[str], SinkConfigError]) -> None:
        self.name = name
        self.path = Path(options.path)
        self._rotate_bytes = options.rotate_bytes
        self._keep = options.keep
        self._always = options.fsync == "always"
        self._config_error = config_error
        self._fh: IO[bytes] | None = None
        self._size = 0
        self._unsynced: list[Report] = []
        """``fsync: always``: batches written, waiting for the syncer task's next fsync (group commit)."""
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

    async def start(self) -> None:
        if self._fh is None:
            try:
                self._fh = self._open()
            except OSError as exc:
                raise self._config_error(f"cannot open {str(self.path)!r}: {exc}") from exc

    def _rotate(self) -> None:
        if self._fh is not None:
            if self._always:
                os.fsync(self._fh.fileno())  # what the syncer has not synced yet is in this file
            self._fh.close()
            self._fh = None
        keep = self._keep
        for i in range(keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fh = self._open()

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """Writes the batch (rotating where a line crosses ``rotate_bytes``), then reports it.
        An unexpected error propagates: the sink dead-letters the batch rather than strand it."""
        try:
            self._write([m.body for m in batch])  # the lines in one pass, not one append each
        except (OSError, ValueError) as exc:
            report.all(SinkTransientError(f"writing {str(self.path)!r} failed: {exc}"))
            return
        if self._always:
            self._unsynced.append(report)
            self._unsynced_ready.set()
            if self._syncer is None or self._syncer.done():
                self._syncer = asyncio.get_running_loop().create_task(
                    self._sync_loop(), name=f"sink:{self.name}:fsync"
                )
            return
        report.all(None)

    def _write(self, lines: list[bytes]) -> None:
        if self._fh is None:
            self._fh = self._open()
        limit = self._rotate_bytes
        if not limit:
            lines.append(b"")  # the join then ends with the last newline: no second copy
            data = b"\n".join(lines)
            self._fh.write(data)
            self._fh.flush()
            self._size += len(data)
            return
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

    async def _sync_loop(self) -> None:
        """One fsync for everything written since the previous one, then those events are acked."""
        while True:
            if not self._unsynced:
                self._unsynced_ready.clear()
                await self._unsynced_ready.wait()
                continue
            reports, self._unsynced = self._unsynced, []
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
            for report in reports:
                report.all(error)

    async def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            await asyncio.to_thread(os.fsync, self._fh.fileno())

    async def close(self) -> None:
        syncer, self._syncer = self._syncer, None
        if syncer is not None:
            syncer.cancel()
            await asyncio.gather(syncer, return_exceptions=True)
        self._unsynced.clear()
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


class StdoutTransport:
    """Writes each batch's lines to a stream (the process's stdout by default), reported once
    written and flushed."""

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._stream = stream

    async def start(self) -> None:
        pass

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        stream: Any = self._stream if self._stream is not None else sys.stdout.buffer
        lines = [m.body for m in batch]
        lines.append(b"")
        try:
            stream.write(b"\n".join(lines))
            stream.flush()
        except (OSError, ValueError) as exc:
            report.all(SinkTransientError(f"writing to stdout failed: {exc}"))
            return
        report.all(None)

    async def close(self) -> None:
        pass


class FileSink(TransportSink[FileSinkOptions]):
    """The ``file`` sink: a :class:`FileTransport` under the transport sink."""

    kind = "file"
    options_model = FileSinkOptions
    default_destination = ""

    def __init__(self, *, name: str, options: FileSinkOptions, clock: Clock | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock)
        self.path = Path(options.path)

    def _make_transport(self) -> Transport:
        return FileTransport(name=self.name, options=self.options, config_error=self._config_error)


class StdoutSink(TransportSink[StdoutSinkOptions]):
    """The ``stdout`` sink: a :class:`StdoutTransport` under the transport sink."""

    kind = "stdout"
    options_model = StdoutSinkOptions
    default_destination = ""

    def __init__(self, *, name: str, options: StdoutSinkOptions, clock: Clock | None = None,
                 stream: IO[bytes] | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock, transport=StdoutTransport(stream))
