"""A watch's answer read as lines: :class:`LineStream`, what
:meth:`~bridge.kube.apiclient.ApiClient.open_stream` returns."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

import aiohttp

from bridge.kube.apiwire import RETRYABLE_NETWORK_ERRORS as _RETRYABLE_NETWORK_ERRORS

__all__ = ["LineStream"]

_log = logging.getLogger("bridge.kube.apiclient")
"""The client's logger: a broken stream is reported as it was before the stream had a module."""


class LineStream:
    """A streaming response read as newline-terminated lines (a watch).

    Iterating yields each complete line without its newline. A connection that breaks mid-stream ends
    the iteration (``broken`` is set) rather than raising: the caller re-watches. Bytes after the last
    newline when the stream ends are kept in ``tail`` (a half-written line, or a last line whose newline
    never came) for the caller to judge.
    """

    def __init__(self, *, response: aiohttp.ClientResponse, context: str, max_line_bytes: int) -> None:
        self._response = response
        self._context = context
        self._max_line_bytes = max_line_bytes
        self._closed = False
        self.tail = b""
        self.broken: BaseException | None = None
        """The transport error that ended the stream, if it did not end cleanly."""
        self.oversized_lines = 0
        self._iterated = False

    @property
    def status(self) -> int:
        return self._response.status

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The lines, once: a second iteration would start a second reader over the same
        connection (and lose what the first had buffered), so it raises instead."""
        return self._lines(self.batches())

    def batches(self) -> AsyncGenerator[list[bytes], None]:
        """The lines a read at a time: each item holds every complete line one read of the
        connection made available (never empty), so a consumer pays its per-item cost per read, not
        per line. Never waits for more than what is there. Like ``__aiter__``, once per stream (the
        two share the one reader)."""
        if self._iterated:
            raise RuntimeError(f"{self._context}: a stream's lines can be iterated only once")
        self._iterated = True
        return self._batches()

    @staticmethod
    async def _lines(batches: AsyncGenerator[list[bytes], None]) -> AsyncIterator[bytes]:
        try:
            async for batch in batches:
                for line in batch:
                    yield line
        finally:
            await batches.aclose()

    async def _batches(self) -> AsyncGenerator[list[bytes], None]:
        buf = bytearray()
        content = self._response.content
        try:
            while not self._closed:
                try:
                    chunk = await content.readany()
                except _RETRYABLE_NETWORK_ERRORS as e:
                    self.broken = e
                    _log.info("%s: stream broke: %s", self._context, type(e).__name__)
                    break
                if not chunk:
                    break
                start = len(buf)
                buf += chunk
                if buf.find(b"\n", start) < 0:
                    if len(buf) > self._max_line_bytes:
                        self.oversized_lines += 1
                        self.broken = ValueError(f"line longer than {self._max_line_bytes} bytes")
                        _log.warning("%s: line over %d bytes; ending the stream", self._context,
                                     self._max_line_bytes)
                        buf.clear()
                        break
                    continue
                end = buf.rfind(b"\n")
                # One copy of the complete lines, split in one call; blank lines are skipped.
                parts = bytes(memoryview(buf)[:end]).split(b"\n")
                del buf[:end + 1]
                lines = [line for line in parts if line and not line.isspace()]
                if lines:
                    yield lines
        finally:
            self.tail = bytes(buf).strip()
            self._release()

    def _release(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.close()

    async def close(self) -> None:
        """Drops the connection. Idempotent."""
        self._release()
