"""What both NATS sinks share: the transport's pipelined publishing (one publisher task, a batch of
publishes confirmed by one PING round trip, through nats-py's private internals where it allows),
the mapping of nats-py's errors, the dead letter to a NATS subject, and the sink over the transport
(:class:`NatsSinkBase`, a :class:`~sinks.transport.TransportSink`). The why is in :mod:`sinks.nats`."""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from itertools import repeat
from typing import Any, ClassVar

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.transport import Transport
from nats.js.client import JetStreamContext

from sinks.cloudevents import HTTP_PREFIX
from sinks.contract import SinkConfigError, SinkMessageTooLargeError, SinkPermanentError, SinkTransientError
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, dead_letter_json
from sinks.nats_connection import NatsConnection
from sinks.nats_options import NatsConnectionOptions
from sinks.options import DeadLetterOptions
from sinks.templates import sanitize_nats_token
from sinks.transport import EncodedMessage, Report, TransportSink

__all__ = [
    "CLIENT_INTERNALS",
    "DEFAULT_SUBJECT",
    "MSG_ID_HEADER",
    "NATS_PY_TESTED",
    "PUBLISH_INTERNALS",
    "NatsDeadLetter",
    "NatsSinkBase",
    "NatsTransportBase",
    "Sent",
    "header_block",
    "hpub",
    "nats_py_tested",
    "nats_py_version",
    "permanent_or_transient",
    "write_pending",
]

log = logging.getLogger("sinks.nats")
"""The sinks' logger."""

DEFAULT_SUBJECT = "k8s.{resource}.{namespace}.{name}"
MSG_ID_HEADER = "Nats-Msg-Id"
_DLQ_MARGIN = 2048

_TRANSIENT_NATS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    OSError,
)


def permanent_or_transient(exc: Exception, subject: str, max_payload: int | None = None) -> Exception:
    if isinstance(exc, nats.errors.MaxPayloadError):
        return SinkMessageTooLargeError(
            f"nats: message too large for the server's max_payload ({subject}): {exc}", limit=max_payload)
    if isinstance(exc, nats.errors.BadSubjectError):
        return SinkPermanentError(f"nats: invalid subject {subject!r}")
    if isinstance(exc, nats.js.errors.BadRequestError):
        return SinkPermanentError(f"jetstream rejected the message on {subject!r}: {exc.description} "
                                  f"(err_code {exc.err_code})")
    if isinstance(exc, nats.js.errors.APIError) and exc.code not in (None, 503) and exc.code < 500:
        return SinkPermanentError(f"jetstream rejected the message on {subject!r}: {exc.description} "
                                  f"(code {exc.code})")
    return SinkTransientError(f"nats: publish to {subject!r} not confirmed: {exc!r}")


NATS_PY_TESTED = ((2, 16), (2, 17))
"""The nats-py releases the sinks are tested with: ``[lower, upper)`` by (major, minor). The sinks
use private parts of nats-py's client (below) for their speed, so ``pyproject.toml`` accepts exactly
this range and ``tests/sinks/test_nats_client_internals.py`` fails on any other release; widening
it is done by running that file and the NATS sink tests against the new release (docs/sinks.md)."""
CLIENT_INTERNALS = ("_pongs", "_pending", "_pending_data_size", "_transport")
"""What pipelined confirmation uses of nats-py's client: its PONG futures (resolved in order by its
read loop), its buffer of commands not yet written, and the socket's transport."""
PUBLISH_INTERNALS = ("_max_pending_size", "_max_payload", "stats")
"""What :meth:`NatsSink._publish_direct` uses besides (else every publish goes through nats-py's)."""
_PING = b"PING\r\n"
_HAS_CLIENT_INTERNALS = all(hasattr(NatsClient(), a) for a in CLIENT_INTERNALS)
_HAS_PUBLISH_INTERNALS = _HAS_CLIENT_INTERNALS and all(hasattr(NatsClient(), a) for a in PUBLISH_INTERNALS)


def nats_py_version() -> tuple[int, int]:
    """The installed nats-py's (major, minor)."""
    match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("nats-py"))
    return (int(match[1]), int(match[2])) if match is not None else (0, 0)


def nats_py_tested() -> bool:
    """Whether the installed nats-py is one the sinks are tested with (:data:`NATS_PY_TESTED`)."""
    lower, upper = NATS_PY_TESTED
    return lower <= nats_py_version() < upper
_SUBJECT_INVALID = re.compile(r"[ \t\r\n]")
"""What nats-py refuses in a published subject (empty too)."""
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


def header_block(headers: Mapping[str, str]) -> bytes:
    """The ``NATS/1.0`` header block of a message, as nats-py's publish encodes it (keys and values
    stripped, empty keys skipped, CR / LF in values turned into spaces); ValueError for a key
    outside the HTTP token alphabet (nats-py's BadHeaderError)."""
    lines = [b"NATS/1.0\r\n"]
    for k, v in headers.items():
        key = k.strip()
        if not key:
            continue
        if not _HEADER_KEY.fullmatch(key):
            raise ValueError(f"invalid header name {key!r}")
        lines.append(f"{key}: {v.strip().translate(_HEADER_NEWLINES)}\r\n".encode())
    lines.append(b"\r\n")
    return b"".join(lines)


def hpub(subject: str, reply: str, block: bytes, body: bytes) -> bytes:
    """The ``HPUB`` command of one message, byte for byte what nats-py's ``publish`` buffers (an
    empty reply leaves two spaces, as nats-py writes it)."""
    line = f"HPUB {subject} {reply} {len(block)} {len(block) + len(body)}\r\n"
    return b"".join((line.encode(), block, body, b"\r\n"))


def write_pending(client: NatsClient) -> Transport:
    """Hands the commands nats-py has buffered to the socket now, in order, rather than on its
    flusher task's next turn; returns the transport. (nats-py's flusher also waits for the socket
    to drain; the sink's in-flight window bounds what can be buffered here instead.)"""
    transport = client._transport
    if transport is None:
        raise RuntimeError("no transport")
    if client._pending:
        transport.writelines(client._pending)
        client._pending = []
        client._pending_data_size = 0
    return transport


Sent = tuple[EncodedMessage, Report, int]
"""A submitted message on its way: the message, its batch's report and its index there."""
Waiter = asyncio.Future[None] | Sent
"""What a confirmation round settles: a submitted message, or the future of a dead letter's publish."""


def settle(sent: Sent, outcome: BaseException | None) -> None:
    """The outcome of one submitted message."""
    sent[1](sent[2], outcome)


def settle_each(sents: list[Sent], outcome: BaseException | None) -> None:
    """``outcome`` for each of ``sents``: one :meth:`~sinks.transport.Report.each` call per batch's
    run of them (they come in submission order, batch after batch)."""
    start = 0
    current = sents[0][1]
    for j, sent in enumerate(sents):
        if sent[1] is not current:
            current.each([(x[2], outcome) for x in sents[start:j]])
            current, start = sent[1], j
    current.each([(x[2], outcome) for x in sents[start:]])


class _PongRound(asyncio.Future[bool]):
    """The PONG future of one PING, queued in nats-py's ``Client._pongs``.

    nats-py's read loop resolves the oldest PONG future with ``set_result`` when a PONG arrives;
    this one settles its round's messages right there instead of a loop turn later through a
    done-callback (under load a loop turn is several milliseconds)."""

    def __init__(self, transport: NatsTransportBase, waiters: list[Waiter],
                 deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.transport = transport
        self.waiters = waiters
        self.deadline = deadline
        self.answered = False

    def set_result(self, result: bool, /) -> None:
        super().set_result(result)
        try:
            self.transport._round_answered(self)
        except Exception:  # never break nats-py's read loop
            log.exception("settling a confirmed round failed", extra={"sink": self.transport.name})


class NatsTransportBase:
    """Publishes to NATS over one connection: submitted messages queue for one publisher task,
    published back to back and confirmed as the subclass says (core: a shared PING round;
    JetStream: PubAcks on one inbox)."""

    publishes_to_jetstream: ClassVar[bool] = False
    """Whether the sink publishes to JetStream (then its dead letters go there when a stream
    captures their subject)."""

    def __init__(self, *, name: str, options: NatsConnectionOptions,
                 config_error: Callable[[str], SinkConfigError]) -> None:
        self.name = name
        self.options: Any = options
        self._config_error = config_error
        self.conn = NatsConnection(options=options, name=name)
        self._unconfirmed: list[Waiter] = []
        """Published by the current publisher pass, waiting for the PING that ends the pass."""
        self._rounds: collections.deque[_PongRound] = collections.deque()
        """PINGs written and not yet answered or expired, oldest first."""
        self._round_expirer: asyncio.Task[None] | None = None
        self._outbox: collections.deque[Sent] = collections.deque()
        """Submitted messages the publisher task has not published yet (bounded by the window)."""
        self._outbox_ready = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        self._idle = True
        """No publisher pass is under way (the task waits for work, or does not exist)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"sink:{self.name}:{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        if not nats_py_tested():
            (lower, upper), found = NATS_PY_TESTED, nats_py_version()
            log.warning("nats-py %d.%d is outside the releases this sink is tested with (>=%d.%d,<%d.%d): "
                        "it relies on the client's private internals (docs/sinks.md)",
                        *found, *lower, *upper, extra={"sink": self.name})
        await self.conn.start()

    async def close(self) -> None:
        tasks = [t for t in (self._publisher, self._round_expirer, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._outbox.clear()
        self._unconfirmed.clear()
        self._rounds.clear()
        await self.conn.close()

    # ---- pipelined publishing ---------------------------------------------------------------------

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """Publishes the batch at once, as the publisher's pass would, when the publisher waits
        for work and the client takes publishes into its buffer (no hand-over to the task); else
        queues it for the publisher task. No task per message either way, and a whole batch of
        publishes shares one confirmation round trip."""
        outbox = self._outbox
        outbox.extend(zip(batch, repeat(report), range(len(batch))))
        if self._idle and len(outbox) == len(batch):  # nothing of an earlier pass is left
            client = self.conn.client
            if client is not None and self._publish_direct(client, outbox):
                self._end_of_pass(client)
                return
        self._outbox_ready.set()
        publisher = self._publisher
        if publisher is None or publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(
                self._publish_loop(), name=f"nats-publish:{self.name}"
            )
            self._publisher.add_done_callback(self._publisher_done)

    def _publisher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        log.error("NATS publisher stopped", exc_info=exc, extra={"sink": self.name})
        self._idle = True
        # What it held is retried (the next submit starts a new publisher).
        outbox, self._outbox = self._outbox, collections.deque()
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        self._fail_round([*unconfirmed, *outbox], SinkTransientError(f"nats publisher stopped: {exc!r}"))

    async def _publish_loop(self) -> None:
        outbox = self._outbox
        ready = self._outbox_ready
        timeout = self.options.publish_timeout
        while True:
            if not outbox:
                ready.clear()
                self._idle = True
                await ready.wait()
                continue
            self._idle = False
            try:
                client = await self.conn.ready(timeout)
            except SinkTransientError as exc:
                while outbox:  # retried with backoff by the sink
                    settle(outbox.popleft(), exc)
                continue
            if self._publish_direct(client, outbox):
                self._end_of_pass(client)
                continue
            while outbox:
                sent = outbox.popleft()
                try:
                    await self._publish_one(client, sent)
                except Exception as exc:  # never strand a message: it is settled either way
                    settle(sent, exc)
            self._end_of_pass(client)

    async def _publish_one(self, client: NatsClient, sent: Sent) -> None:
        """Publishes one message of the outbox and arranges for its confirmation."""
        raise NotImplementedError

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[Sent]) -> bool:
        """Publishes the whole outbox without a coroutine per message when the sink can (True), or
        leaves it to :meth:`_publish_one` (False)."""
        return False

    @staticmethod
    def _can_buffer(client: NatsClient) -> bool:
        """Whether :meth:`_buffer_publish` may write into this client's buffer now."""
        return _HAS_PUBLISH_INTERNALS and client.is_connected and not client.is_draining_pubs

    def _buffer_publish(self, client: NatsClient, sent: Sent, headers: Mapping[str, str],
                        reply: str, blocks: dict[str, bytes]) -> bool:
        """Appends the ``HPUB`` command of ``msg`` to nats-py's pending buffer, as its ``publish``
        would (same checks: a subject that is empty or has whitespace, a body above the server's
        ``max_payload`` and a bad header name are permanent failures, settled here (False); same
        statistics; the buffer handed to the socket when it outgrows the client's
        ``pending_size``). ``blocks`` keeps the header block of messages whose only header is
        their content type (structured mode) for the caller's loop."""
        msg = sent[0]
        subject = msg.destination
        body = msg.body
        if not subject or _SUBJECT_INVALID.search(subject) or (reply and _SUBJECT_INVALID.search(reply)):
            settle(sent, permanent_or_transient(nats.errors.BadSubjectError(), subject))
            return False
        if len(body) > client._max_payload:
            settle(sent, permanent_or_transient(nats.errors.MaxPayloadError(), subject,
                                                client._max_payload))
            return False
        try:
            if len(headers) == 1 and "content-type" in headers:
                ctype = headers["content-type"]
                block = blocks.get(ctype)
                if block is None:
                    block = blocks[ctype] = header_block(headers)
            else:
                block = header_block(headers)
        except ValueError as exc:
            settle(sent, SinkPermanentError(f"nats: {exc} for {subject!r}"))
            return False
        cmd = hpub(subject, reply, block, body)
        client._pending.append(cmd)
        client._pending_data_size += len(cmd)
        stats = client.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(body)
        if 0 < client._max_pending_size < client._pending_data_size:
            try:
                write_pending(client)
            except (OSError, RuntimeError) as exc:  # the confirmation fails the messages: retried
                log.debug("writing publishes failed: %r", exc, extra={"sink": self.name})
        return True

    def _end_of_pass(self, client: NatsClient) -> None:
        """Called once the publisher emptied the outbox: core publishes of the pass share one PING."""
        if self._unconfirmed:
            waiters, self._unconfirmed = self._unconfirmed, []
            self._ping_round(client, waiters)

    def size_limit(self) -> int | None:
        """The server's ``max_payload`` (headers and body), once connected."""
        client = self.conn.client
        return None if client is None else int(client.max_payload)

    async def _publish_core(self, subject: str, body: bytes, headers: dict[str, str] | None) -> None:
        """Publishes and waits for a PING/PONG round trip proving the server received it."""
        timeout = self.options.publish_timeout
        client = await self.conn.ready(timeout)
        try:
            await client.publish(subject, body, headers=headers)
        except (nats.errors.Error, OSError) as exc:
            raise permanent_or_transient(exc, subject) from exc
        await self._confirmed(client, subject)

    async def _confirmed(self, client: NatsClient, subject: str) -> None:
        """Waits for a PING/PONG round trip sent after this publish."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ping_round(client, [waiter])
        try:
            await waiter
        except SinkTransientError as exc:
            raise SinkTransientError(f"nats: publish to {subject!r} not confirmed: {exc}") from exc

    def _ping_round(self, client: NatsClient, waiters: list[Waiter]) -> None:
        """Writes what nats-py has buffered, then a PING, and settles ``waiters`` when its PONG comes.

        Rounds are pipelined: a PING is written at the end of every publisher pass without waiting
        for the previous PONG (the server answers PINGs in order, nats-py pops the oldest PONG
        future), so a message waits for one round trip, not for the round in flight and then its
        own. The buffered PUBs are written first, synchronously, so the PING follows them on the
        wire and its PONG proves the server read them (``Client.flush`` writes its PING at once,
        ahead of publishes still in nats-py's buffer)."""
        if not client.is_connected:
            # nats-py keeps publishes made while reconnecting in its buffer, unconfirmed.
            self._fail_round(waiters, SinkTransientError("not connected to NATS"))
            return
        loop = asyncio.get_running_loop()
        if not _HAS_CLIENT_INTERNALS:
            self._spawn(self._flush_then_settle(client, waiters), "nats-flush")
            return
        pong = _PongRound(self, waiters, time.monotonic() + self.options.publish_timeout, loop)
        try:
            transport = write_pending(client)
            transport.write(_PING)
        except (OSError, RuntimeError) as exc:
            self._fail_round(waiters, SinkTransientError(f"cannot write to NATS: {exc!r}"))
            return
        # Queued only once its PING is written (nothing runs in between): nats-py's PONG futures
        # must stay in the order of the PINGs on the wire.
        client._pongs.append(pong)
        self._rounds.append(pong)
        if self._round_expirer is None or self._round_expirer.done():
            self._round_expirer = loop.create_task(self._expire_rounds(), name=f"nats-pong:{self.name}")

    async def _flush_then_settle(self, client: NatsClient, waiters: list[Waiter]) -> None:
        """The confirmation through nats-py's public ``flush`` (a nats-py without the internals
        ``_ping_round`` relies on, hence outside :data:`NATS_PY_TESTED`): one round trip per pass.
        Weaker than ``_ping_round``'s: nats-py 2.16's ``flush`` writes its PING straight to the
        socket, possibly ahead of publishes still in nats-py's buffer, so its PONG does not prove
        the server read them."""
        error: Exception | None = None
        try:
            await client.flush(timeout=self.options.publish_timeout)
        except (nats.errors.Error, OSError) as exc:
            error = SinkTransientError(repr(exc))
        if error is None and not client.is_connected:  # flush returns at once while reconnecting
            error = SinkTransientError("connection lost")
        if error is not None:
            self._fail_round(waiters, error)
            return
        for waiter in waiters:
            if isinstance(waiter, tuple):
                settle(waiter, None)
            elif not waiter.done():
                waiter.set_result(None)

    def _round_answered(self, pong: _PongRound) -> None:
        """The PONG of ``pong`` came (called from nats-py's read loop): its messages are confirmed."""
        if pong.answered:
            return  # expired before its PONG came (and retried)
        pong.answered = True
        rounds = self._rounds
        while rounds and rounds[0].answered:
            rounds.popleft()
        confirmed: list[Sent] = []
        for waiter in pong.waiters:
            if isinstance(waiter, tuple):
                confirmed.append(waiter)
            elif not waiter.done():
                waiter.set_result(None)
        if confirmed:
            settle_each(confirmed, None)

    def _fail_round(self, waiters: list[Waiter], error: Exception) -> None:
        for waiter in waiters:
            if isinstance(waiter, tuple):
                settle(waiter, error)
            elif not waiter.done():
                waiter.set_exception(error)

    async def _expire_rounds(self) -> None:
        """Fails rounds whose PONG did not come within ``publish_timeout`` (a connection lost after
        the PING: nats-py forgets its PONG futures on reconnect); their messages are retried."""
        rounds = self._rounds
        timeout = self.options.publish_timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            while rounds:
                pong = rounds[0]
                if not pong.answered:
                    if pong.deadline > now:
                        break
                    pong.answered = True
                    try:
                        self._fail_round(pong.waiters, SinkTransientError(f"no PONG within {timeout}s"))
                    except Exception:  # keep expiring the others
                        log.exception("failing an unconfirmed round failed", extra={"sink": self.name})
                rounds.popleft()

    async def _publish_js(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        timeout = self.options.publish_timeout
        client = await self.conn.ready(timeout)
        js = self._js(client)
        try:
            ack = await js.publish(subject, body, timeout=timeout, headers=headers)
        except (nats.errors.Error, OSError) as exc:
            raise permanent_or_transient(exc, subject) from exc
        if ack.duplicate:
            log.debug("%s already stored (seq %s)", headers.get(MSG_ID_HEADER), ack.seq,
                      extra={"sink": self.name})

    def _js(self, client: NatsClient) -> JetStreamContext:
        return client.jetstream(timeout=self.options.publish_timeout)


class NatsSinkBase(TransportSink[Any]):
    """A NATS sink: a :class:`NatsTransportBase` of ``transport_class`` under the transport sink,
    healthy while connected, its size limit the server's ``max_payload``."""

    default_destination: ClassVar[str] = DEFAULT_SUBJECT
    header_prefix: ClassVar[str] = HTTP_PREFIX
    transport_class: ClassVar[type[NatsTransportBase]] = NatsTransportBase

    def __init__(self, *, name: str, options: NatsConnectionOptions, **kwargs: Any) -> None:
        kind = self.kind
        # Built first: a dead letter of kind nats publishes through its connection.
        self.nats = self.transport_class(
            name=name, options=options,
            config_error=lambda message: SinkConfigError(f"sink {name!r} ({kind}): {message}"))
        super().__init__(name=name, options=options, transport=self.nats, **kwargs)

    def _make_dead_letter(self, options: DeadLetterOptions) -> DeadLetterWriter | None:
        if options.kind == "nats":
            if any(c in options.target for c in "*> \t") or not options.target:
                raise self._config_error(f"dead_letter: {options.target!r} is not a valid NATS subject")
            return NatsDeadLetter(transport=self.nats, subject=options.target)
        return super()._make_dead_letter(options)

    def _sanitize(self, value: str) -> str:
        return sanitize_nats_token(value)

    def healthy(self) -> bool:
        return super().healthy() and self.nats.conn.is_connected

    def _size_limit(self) -> int | None:
        return self.nats.size_limit()


class NatsDeadLetter:
    """Publishes dead-letter records (JSON, see :mod:`sinks.deadletter`) to a NATS subject through
    the sink's connection: JetStream first (stored and deduplicated by event id) when a stream
    captures the subject, core NATS otherwise. A record too large for the server is sent without the
    message body."""

    def __init__(self, *, transport: NatsTransportBase, subject: str) -> None:
        self._sink = transport
        self.subject = subject
        self._jetstream: bool | None = None

    async def start(self) -> None:
        """The connection is opened by the sink's own start."""

    async def write(self, record: DeadLetterRecord) -> None:
        sink = self._sink
        client = await sink.conn.ready(sink.options.publish_timeout)
        value = dead_letter_json(record)
        if len(value) + _DLQ_MARGIN > client.max_payload:
            value = orjson.dumps({
                "sink": record.sink, "reason": record.reason, "attempts": record.attempts,
                "event_id": record.event_id, "key": record.key.decode("utf-8", "replace"),
                "destination": record.destination, "headers": record.headers, "message": None,
                "message_bytes": len(record.body),
                "message_omitted": "too large for the dead-letter subject",
            })
        headers = {"reason": record.reason[:1000], MSG_ID_HEADER: f"dlq-{record.event_id}"}
        if sink.publishes_to_jetstream and self._jetstream is not False:
            try:
                await sink._publish_js(self.subject, value, headers)
            except SinkTransientError as exc:
                if self._jetstream or not isinstance(exc.__cause__, nats.js.errors.NoStreamResponseError):
                    raise
                log.info("sink %r: no stream captures %r; dead letters use core NATS",
                         sink.name, self.subject)
                self._jetstream = False
            else:
                self._jetstream = True
                return
        await sink._publish_core(self.subject, value, headers)

    async def close(self) -> None:
        """The connection belongs to the sink, which closes it."""
