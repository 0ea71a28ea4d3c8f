"""A TCP proxy between NATS clients and a real nats-server that makes one reordering certain.

nats-server counts a push consumer's messages as delivered when its consumer hands them to its
outbound queue, and answers a JetStream API request from another goroutine: the reply to a
consumer-info request can reach the client before messages the info already counts as delivered.
:class:`DeliveriesAfterInfo` does that every time: after a consumer is created, it holds the client's
consumer-info request until the server has sent the consumer's initial messages (a delivery whose
acknowledgement subject says nothing more is pending), and holds those messages back until the
client has acted on the info's reply: until it sends its next request, or half a second later when
it sends none (it waits for the messages). Everything else is passed through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["DeliveriesAfterInfo"]


async def _frames(reader: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bytes]]:
    """(protocol line, payload) pairs of one direction of a NATS connection."""
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        op = line.split(b" ", 1)[0].strip().upper()
        payload = b""
        if op in (b"PUB", b"MSG", b"HPUB", b"HMSG"):
            payload = await reader.readexactly(int(line.split()[-1]) + 2)
        yield line, payload


def _pending(ack_subject: bytes) -> int:
    """The messages still pending after this one, from a delivery's acknowledgement subject:
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>`` or the form with a
    domain and account hash in front and a random token after."""
    tokens = ack_subject.split(b".")
    return int(tokens[8] if len(tokens) == 9 else tokens[10])


class DeliveriesAfterInfo:
    """The proxy on ``127.0.0.1:port`` (:meth:`start`) in front of the server on ``upstream``."""

    def __init__(self, upstream: int) -> None:
        self._upstream = upstream
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.reordered = 0
        """Consumer-info replies sent ahead of messages the info had counted as delivered."""

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        conn = _Connection(self)
        for pump in (conn.to_server(reader, up_writer), conn.to_client(up_reader, writer)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class _Connection:
    def __init__(self, proxy: DeliveriesAfterInfo) -> None:
        self._proxy = proxy
        self._armed = False
        """A consumer was created and its first info reply has not passed yet."""
        self._delivered = asyncio.Event()
        self._acted = asyncio.Event()
        """The client sent something since the info reply passed."""
        self._info_replies: set[bytes] = set()
        self._held: list[bytes] = []

    async def to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async for line, payload in _frames(reader):
                self._acted.set()
                parts = line.split()
                subject = parts[1] if len(parts) > 1 else b""

                if subject.startswith(b"$JS.API.CONSUMER.CREATE."):
                    self._armed, self._held = True, []
                    self._delivered.clear()
                elif subject.startswith(b"$JS.API.CONSUMER.INFO.") and self._armed:
                    self._info_replies.add(parts[2])
                    with contextlib.suppress(TimeoutError):  # a consumer with nothing to deliver
                        await asyncio.wait_for(self._delivered.wait(), 5.0)
                writer.write(line + payload)
                await writer.drain()
        finally:
            writer.close()

    async def to_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async for line, payload in _frames(reader):
                parts = line.split()
                if parts[0].upper() in (b"MSG", b"HMSG"):
                    with_reply = len(parts) == (5 if parts[0].upper() == b"MSG" else 6)
                    reply = parts[3] if with_reply else b""
                    if self._armed and reply.startswith(b"$JS.ACK."):
                        self._held.append(line + payload)
                        if _pending(reply) == 0:
                            self._delivered.set()
                        continue
                    if parts[1] in self._info_replies:
                        self._info_replies.discard(parts[1])
                        writer.write(line + payload)
                        await writer.drain()
                        await self._release(writer)
                        continue
                writer.write(line + payload)
                await writer.drain()
        finally:
            writer.close()

    async def _release(self, writer: asyncio.StreamWriter) -> None:
        self._acted.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acted.wait(), 0.5)
        if self._held:
            self._proxy.reordered += 1
        writer.write(b"".join(self._held))
        self._armed, self._held = False, []
