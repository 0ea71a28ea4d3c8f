"""JSON-lines sinks: a file (the embedded default, and the demo's) and stdout (debugging).

Each event is one line: the structured CloudEvent. Durability: an event is acked once its line was
written and flushed to the operating system (it survives the bridge crashing, not the machine
losing power); ``flush()`` additionally fsyncs, and ``fsync: always`` fsyncs before every ack, at a
large cost in throughput. Optional size-based rotation keeps ``path.1`` … ``path.{keep}``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field, model_validator

from sinks.base import BaseSink, OutgoingMessage, SinkClock
from sinks.contract import SinkTransientError
from sinks.options import SinkOptions

__all__ = ["FileSink", "FileSinkOptions", "StdoutSink", "StdoutSinkOptions"]


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


class FileSink(BaseSink[FileSinkOptions]):
    kind = "file"
    options_model = FileSinkOptions
    default_destination = ""

    def __init__(self, *, name: str, options: FileSinkOptions, clock: SinkClock | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock)
        self.path = Path(options.path)
        self._fh: IO[bytes] | None = None
        self._size = 0

    def _open(self) -> IO[bytes]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "ab")  # noqa: SIM115 - kept open for the sink's lifetime
        self._size = fh.tell()
        return fh

    async def _start(self) -> None:
        if self._fh is None:
            try:
                self._fh = self._open()
            except OSError as exc:
                raise self._config_error(f"cannot open {str(self.path)!r}: {exc}") from exc

    def _rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        keep = self.options.keep
        for i in range(keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fh = self._open()

    async def _send(self, msg: OutgoingMessage) -> None:
        try:
            if self._fh is None:
                self._fh = self._open()
            fh = self._fh
            fh.write(msg.body + b"\n")
            fh.flush()
            self._size += len(msg.body) + 1
            if self.options.fsync == "always":
                await asyncio.to_thread(os.fsync, fh.fileno())
            limit = self.options.rotate_bytes
            if limit and self._size >= limit:
                self._rotate()
        except OSError as exc:
            raise SinkTransientError(f"writing {str(self.path)!r} failed: {exc}") from exc

    async def _on_flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            await asyncio.to_thread(os.fsync, self._fh.fileno())

    async def _close(self) -> None:
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
        clock: SinkClock | None = None,
        stream: IO[bytes] | None = None,
    ) -> None:
        super().__init__(name=name, options=options, clock=clock)
        self._stream = stream

    async def _send(self, msg: OutgoingMessage) -> None:
        stream: Any = self._stream if self._stream is not None else sys.stdout.buffer
        try:
            stream.write(msg.body + b"\n")
            stream.flush()
        except (OSError, ValueError) as exc:
            raise SinkTransientError(f"writing to stdout failed: {exc}") from exc
