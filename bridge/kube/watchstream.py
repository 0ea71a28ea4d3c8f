"""An open watch over HTTP: :class:`HttpWatchStream`, its lines decoded a read at a time.

The things a long-running watch meets in practice are absorbed here rather than crashing the
informer: a half-written last line when the connection drops (discarded), a connection reset
mid-stream (the stream simply ends, and the reflector re-watches from its last resourceVersion), and
a line that is not a watch event: as client-go's stream watcher does, the stream ends there with an
``ERROR`` event (a 500 Status whose cause is :data:`DECODE_ERROR_CAUSE`), so that the reflector
re-watches from the last resourceVersion it applied and the change that line carried comes again
(counted in :attr:`HttpWatchStream.garbage_lines`). Skipping the line and reading on would lose it.
But a line that ends the next watch the same way is what the server holds (an object stored with
bytes no decoder takes), and re-watching would read it forever: that time the stream goes on past
it. Its object, when the line still names one, is quarantined in its place (``encoding``, ``syntax``:
:mod:`bridge.kube.bounded`); a line that names no object is skipped and counted (``unreadable``), and
the stream ends after its read with an ``ERROR`` event (:data:`SKIPPED_LINE_CAUSE`) that makes the
reflector relist, since the change it carried is unknown (client-go relists at a decoding error too).
So does a line longer than the line reader holds.

Invariants: a stream is iterated once (a second ``async for`` raises rather than silently starting a
second reader over the same connection); a batch is never empty; an ``ERROR`` event that ends the
stream is the last event of its batch. Lines of objects another shard owns are not decoded
(:mod:`bridge.kube.sharding`). The per-line loop is the hot path: per line it calls the decoder
(and, sharded, the shard's line check) and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from bridge.contracts import WatchEvent, WatchEventType
from bridge.kube.apiclient import LineStream
from bridge.kube.bounded import SIZE, UNREADABLE, quarantined, report_malformed, salvage_line
from bridge.kube.sharding import ShardFilter, skipped_bookmark
from bridge.kube.watchdecode import WatchDecodeError, WatchDecoder

__all__ = [
    "DECODE_ERROR_CAUSE",
    "SKIPPED_LINE_CAUSE",
    "HttpWatchStream",
    "decode_error_status",
    "skipped_line_status",
]

_log = logging.getLogger("bridge.kube.listwatch")  # the lister-watcher's, which its streams log under


DECODE_ERROR_CAUSE = "ClientWatchDecoding"
"""The cause type of the ``ERROR`` event that ends a watch at an undecodable line (client-go's)."""


def decode_error_status(message: str) -> dict[str, Any]:
    """The Status of the ``ERROR`` event a stream ends with at a line it cannot decode: what
    client-go's stream watcher reports (a 500 InternalError caused by ``ClientWatchDecoding``)."""
    text = f"unable to decode an event from the watch stream: {message}"
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": text, "reason": "InternalError", "code": 500,
        "details": {"causes": [{"type": DECODE_ERROR_CAUSE, "message": text}]},
    }


SKIPPED_LINE_CAUSE = "WatchLineSkipped"
"""The cause type of the ``ERROR`` event that ends a watch after it skipped a line naming no object."""


def skipped_line_status() -> dict[str, Any]:
    """The Status of the ``ERROR`` event a stream ends with after it skipped a line that came the same
    way twice and names no object: the change it carried is unknown, so the reflector relists (the
    relist is framed by gap markers: how the delivery contract announces changes not observed). Any
    ``ERROR`` but a decoding, expiry or throttling one makes the reflector relist, as client-go's
    does for an internal error it does not retry."""
    text = "skipped a watch line that names no object; relisting"
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": text, "reason": "InternalError", "code": 500,
        "details": {"causes": [{"type": SKIPPED_LINE_CAUSE, "message": text}]},
    }


def _ignore(reason: str) -> None:
    """Counts nothing (a stream opened without a lister-watcher to count for)."""


class HttpWatchStream:
    """An open watch over HTTP (:class:`bridge.contracts.WatchStream`)."""

    def __init__(
        self,
        *,
        lines: LineStream,
        decoder: WatchDecoder,
        context: str,
        on_garbage: Callable[[], None] | None = None,
        shard: ShardFilter | None = None,
        on_malformed: Callable[[str], None] | None = None,
        on_bad_line: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``shard``: lines of objects it does not keep are not decoded; each run of them in one
        read becomes one bookmark at the last one's resourceVersion (:mod:`bridge.kube.sharding`).
        ``on_bad_line``: whether a line that is not a watch event failed the same way on the watch
        before (then it is the server's, and the stream goes on past it); None: never."""
        self._lines = lines
        self._decoder = decoder
        self._shard = shard
        self._context = context
        self._on_garbage = on_garbage
        self._on_malformed = on_malformed
        self._on_bad_line = on_bad_line
        self.malformed = 0
        """Objects quarantined (:mod:`bridge.kube.bounded`)."""
        self.events = 0
        """Events yielded."""
        self.garbage_lines = 0
        """Lines that were not watch events (the stream ends at the first unless it is persistent)."""
        self.truncated_lines = 0
        """An unterminated, undecodable last line when the stream ended (0 or 1)."""
        self._iterated = False
        self._bad_at = 0

    @property
    def broken(self) -> BaseException | None:
        """The transport error that ended the stream, None for a clean end."""
        return self._lines.broken

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        """The events, once (a second iteration raises: see the module docstring)."""
        return self._events(self.batches())

    def batches(self) -> AsyncGenerator[list[WatchEvent], None]:
        """The events a read at a time (:class:`bridge.contracts.BatchedWatchStream`): every line
        one read of the connection made available, decoded in one loop. A batch is never empty and
        never waits for more lines; one that meets a line that is not a watch event ends with the
        ``ERROR`` event, and the stream with it. Once per stream, like ``__aiter__``."""
        if self._iterated:
            raise RuntimeError(f"{self._context}: a watch stream can be iterated only once")
        self._iterated = True
        return self._batches()

    @staticmethod
    async def _events(batches: AsyncGenerator[list[WatchEvent], None]) -> AsyncIterator[WatchEvent]:
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            await batches.aclose()

    def _decode_lines(self, lines: list[bytes], pos: int, events: list[WatchEvent]) -> int:
        """Decodes ``lines[pos:]`` into ``events``; returns where it stopped (the end). A line that is
        not a watch event raises, its index kept in :attr:`_bad_at`."""
        shard = self._shard
        if shard is not None and shard.filtering:
            self._decode_sharded(lines, pos, events, shard)
            return len(lines)
        decode = self._decoder
        append = events.append
        before = len(events)
        try:
            for line in (lines if pos == 0 else lines[pos:]):
                append(decode(line))
        except WatchDecodeError:
            self._bad_at = pos + len(events) - before
            raise
        return len(lines)

    def _end_at_garbage(self, events: list[WatchEvent], bad: bytes, e: WatchDecodeError) -> None:
        """The first time a line fails: the stream ends there with the decoding ``ERROR`` event, and
        the reflector watches again from the last event applied (a line garbled on the way comes
        again as it should)."""
        self.events += len(events)
        _log.warning(
            "%s: a line is not a watch event (%d bytes): %s; ending the watch after %d events",
            self._context, len(bad), e, self.events,
        )
        events.append(WatchEvent(type=WatchEventType.ERROR, object=decode_error_status(str(e))))

    def _skip_persistent(self, bad: bytes, e: WatchDecodeError, events: list[WatchEvent]) -> bool:
        """A line that failed the same way on the watch before (the server's bytes, not the
        connection's): the stream goes on past it. Its object, when the line still names one, is
        quarantined in its place; otherwise the line is counted (``unreadable``) and True says that
        the resource must relist, since the change it carried is unknown."""
        salvaged = salvage_line(bad)
        if salvaged is not None:
            events.append(salvaged)
            return False
        if self._on_malformed is not None:
            self._on_malformed(UNREADABLE)
        self.malformed += 1
        _log.warning(
            "%s: skipped a line that is not a watch event and names no object (%d bytes, the same on "
            "the watch before): %s; a change may be lost, relisting (the relist is framed by gap "
            "markers)", self._context, len(bad), e,
        )
        return True

    def _skip_oversized(self) -> WatchEvent:
        """The stream ended at a line longer than the line reader holds (``max_line_bytes``), which
        nothing reads: what it carried is unknown, and watching again from the same resourceVersion
        would meet it again. Counted (``size``), and the ``ERROR`` event that makes the reflector relist."""
        if self._on_malformed is not None:
            self._on_malformed(SIZE)
        self.malformed += 1
        _log.warning("%s: skipped a watch line longer than the line reader holds (%s); a change may be "
                     "lost, relisting (the relist is framed by gap markers)",
                     self._context, self._lines.broken)
        return WatchEvent(type=WatchEventType.ERROR, object=skipped_line_status())

    def _decode_sharded(self, lines: list[bytes], pos: int, events: list[WatchEvent],
                        shard: ShardFilter) -> None:
        """Decodes ``lines[pos:]`` into ``events`` but those ``shard`` does not keep: each run of them
        becomes one bookmark at its last resourceVersion, before the next event or at the end (a
        batch of lines is never an empty batch of events). A line that is not a watch event raises,
        its index kept in :attr:`_bad_at`."""
        decode = self._decoder
        skip = shard.skip_line
        append = events.append
        pending: str | None = None
        for at in range(pos, len(lines)):
            line = lines[at]
            rv = skip(line)
            if rv is not None:
                if rv or pending is None:
                    pending = rv
                continue
            try:
                event = decode(line)
            except WatchDecodeError:
                if pending:
                    append(skipped_bookmark(pending))
                self._bad_at = at
                raise
            if pending:
                append(skipped_bookmark(pending))
            pending = None
            append(event)
        if pending is not None:
            append(skipped_bookmark(pending))

    async def _batches(self) -> AsyncGenerator[list[WatchEvent], None]:
        async for lines in self._lines.batches():
            events: list[WatchEvent] = []
            seen = quarantined()
            pos, relist = 0, False
            while pos < len(lines):
                try:
                    pos = self._decode_lines(lines, pos, events)
                except WatchDecodeError as e:
                    bad = lines[self._bad_at]
                    self.garbage_lines += 1
                    if self._on_garbage is not None:
                        self._on_garbage()
                    if self._on_bad_line is None or not self._on_bad_line(bad):
                        self._end_at_garbage(events, bad, e)
                        yield events
                        await self._lines.close()
                        return
                    relist = self._skip_persistent(bad, e, events) or relist
                    pos = self._bad_at + 1
            if quarantined() != seen:
                self.malformed += report_malformed([e.object for e in events], self._context,
                                                   self._on_malformed or _ignore)
            self.events += len(events)
            if relist:
                events.append(WatchEvent(type=WatchEventType.ERROR, object=skipped_line_status()))
                yield events
                await self._lines.close()
                return
            if events:
                yield events
        if self._lines.oversized_lines:
            yield [self._skip_oversized()]
            return
        tail = self._lines.tail
        if tail:
            # The last line had no newline: a complete event whose terminator never came is still
            # an event; anything else is a line cut by the connection drop.
            try:
                rv = self._shard.skip_line(tail) if self._shard is not None else None
                event = self._decoder(tail) if rv is None else skipped_bookmark(rv)
            except WatchDecodeError:
                self.truncated_lines += 1
                _log.info("%s: discarded a half-written last line (%d bytes)", self._context, len(tail))
                return
            self.events += 1
            yield [event]

    async def close(self) -> None:
        await self._lines.close()

