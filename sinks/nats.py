"""The NATS sinks: core NATS publish and JetStream publish, acked once the server has the message.

Why two sinks:

- :class:`NatsSink` publishes with core NATS and acks an event once a ``PING``/``PONG`` round trip
  that followed the publish succeeded, i.e. once the server has *received* it. Core NATS is
  at-most-once on the server side: a message nobody is subscribed to at that moment is gone, and a
  server that dies before forwarding it loses it. Use it for live feeds; use JetStream when the
  stream itself must not lose events.
- :class:`JetStreamSink` publishes to a stream and acks on the stream's ``PubAck``: the message is
  stored (replicated if the stream is). The ``Nats-Msg-Id`` header is the event's CloudEvent id, so a
  message re-sent after a timeout or a reconnect is dropped by JetStream's duplicate window instead of
  being stored twice.

Throughput and latency: each sink has one publisher task. The messages of one loop turn come as one
batch; while the publisher waits for work and the client is connected, the batch is published at once
in its pass's place, else it queues for the task (bounded by the sink's in-flight window), which
publishes them back to back; either way they are handed to the socket at once (not on nats-py's
flusher task's next turn). Core publishes of a connected client are encoded
by the sink (the ``HPUB`` command nats-py's ``publish`` would buffer, with its checks and
statistics) and appended to nats-py's buffer in one loop, without a coroutine per message
(JetStream publishes too, once the connection's PubAck inbox exists). Core
publishes of one pass share one PING, written behind them, so its PONG proves the server read
them; PINGs are pipelined (one per pass, without waiting for the previous PONG), so a message waits
for one round trip, and the PONG settles its messages from nats-py's read loop directly. A PONG
that does not come within ``publish_timeout`` fails its messages as transient (retried). JetStream
publishes carry a reply subject on one inbox subscription per connection, so many wait for their
``PubAck`` at once (one that does not come within ``publish_timeout`` fails as transient and is
re-sent with the same ``Nats-Msg-Id``).

Those internals are private to nats-py, so the sinks accept only the nats-py releases they were
tested with (:data:`~sinks.nats_base.NATS_PY_TESTED`, the range ``pyproject.toml`` asks for), and
``tests/sinks/test_nats_client_internals.py`` checks each internal used against a real server;
through the public API alone the core sink costs about 1.3 times the CPU per event (docs/performance.md).

Subjects come from the destination template; each field value is sanitised into one subject token
(dots, spaces and the ``*`` / ``>`` wildcards become ``_``), so a name with dots cannot add tokens or
turn into a wildcard. The default subject ``k8s.{resource}.{namespace}.{name}`` is one subject per
object, which keeps each object's events in order for consumers too.

Connection handling: nats-py reconnects by itself (forever by default). While it is disconnected
nothing is acked: a publish waits for the connection to come back (bounded by ``publish_timeout``)
and otherwise fails as transient, so the sink retries it — nothing is lost, and
JetStream deduplicates the retries. A server that is down when the sink starts does not fail start:
a named background task keeps trying to connect and the sink reports itself unhealthy meanwhile.

Authentication: user/password, token, NKEY seed file, credentials file (NKEY and creds need the
``nkeys`` package: ``pip install nats-py[nkeys]``); TLS with a custom CA and client certificate.
Secrets are read from files. Dead letters go to a file or to a NATS subject (``dead_letter:
{kind: nats, target: SUBJECT}``): published through JetStream when a stream captures the subject,
otherwise with core NATS.

Beside this module: the options (:mod:`sinks.nats_options`), the connection
(:mod:`sinks.nats_connection`), and what both sinks share, pipelined publishing through nats-py's
internals and the dead letter (:mod:`sinks.nats_base`, which holds :data:`NATS_PY_TESTED`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import ClassVar

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from sinks.contract import SinkConfigError, SinkTransientError
from sinks.nats_base import (
    DEFAULT_SUBJECT,
    MSG_ID_HEADER,
    NatsDeadLetter,
    NatsSinkBase,
    NatsTransportBase,
    Sent,
    permanent_or_transient,
    settle,
    write_pending,
)
from sinks.nats_connection import NatsConnection
from sinks.nats_options import (
    JetStreamSinkOptions,
    NatsConnectionOptions,
    NatsSinkOptions,
    StreamOptions,
    stream_subjects_for,
)
from sinks.options import SinkOptions
from sinks.transport import EncodedMessage

__all__ = [
    "DEFAULT_SUBJECT",
    "JetStreamSink",
    "JetStreamSinkOptions",
    "JetStreamTransport",
    "NatsConnection",
    "NatsDeadLetter",
    "NatsSink",
    "NatsSinkOptions",
    "NatsTransport",
    "StreamOptions",
    "stream_subjects_for",
]

log = logging.getLogger(__name__)


class NatsTransport(NatsTransportBase):
    """Core NATS publish; confirmed by a PING round trip (see the module docstring)."""

    async def _publish_one(self, client: NatsClient, sent: Sent) -> None:
        msg = sent[0]
        try:
            # The sink's messages carry a dict (nats-py's parameter type); no copy per message.
            await client.publish(msg.destination, msg.body, headers=msg.headers)  # type: ignore[arg-type]
        except (nats.errors.Error, OSError) as exc:
            settle(sent, permanent_or_transient(exc, msg.destination))
            return
        self._unconfirmed.append(sent)

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[Sent]) -> bool:
        """The outbox's ``HPUB`` commands appended to nats-py's buffer in one loop (see
        :meth:`NatsTransportBase._buffer_publish`); only on a connected client: while reconnecting,
        nats-py's own publish decides what it buffers."""
        if not self._can_buffer(client):
            return False
        buffer = self._buffer_publish
        unconfirmed = self._unconfirmed
        blocks: dict[str, bytes] = {}
        while outbox:
            sent = outbox.popleft()
            if buffer(client, sent, sent[0].headers, "", blocks):
                unconfirmed.append(sent)
        return True


class NatsSink(NatsSinkBase):
    """Core NATS publish; acked when the server confirmed receipt (see the module docstring)."""

    kind: ClassVar[str] = "nats"
    options_model: ClassVar[type[SinkOptions]] = NatsSinkOptions
    transport_class: ClassVar[type[NatsTransportBase]] = NatsTransport


class JetStreamTransport(NatsTransportBase):
    """JetStream publish; confirmed by the stream's PubAck, deduplicated by ``Nats-Msg-Id``."""

    publishes_to_jetstream: ClassVar[bool] = True

    def __init__(self, *, name: str, options: NatsConnectionOptions,
                 config_error: Callable[[str], SinkConfigError]) -> None:
        super().__init__(name=name, options=options, config_error=config_error)
        self._awaiting: dict[str, tuple[Sent, float]] = {}
        """Reply subject → the message published with it and its PubAck deadline (in publish
        order, hence deadline order)."""
        self._ack_seq = 0
        self._inbox = ""
        self._inbox_client: NatsClient | None = None
        self._expirer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await super().start()
        stream: StreamOptions | None = self.options.stream
        if stream is not None and stream.create:
            client = await self.conn.ready(self.options.connect_timeout)
            await self._ensure_stream(client, stream)

    def stream_config(self) -> StreamConfig | None:
        stream: StreamOptions | None = self.options.stream
        if stream is None:
            return None
        text = self.options.destination if self.options.destination is not None else DEFAULT_SUBJECT
        return StreamConfig(
            name=stream.name,
            subjects=list(stream.subjects) or stream_subjects_for(text),
            storage=StorageType.FILE if stream.storage == "file" else StorageType.MEMORY,
            num_replicas=stream.replicas,
            duplicate_window=stream.duplicate_window,
            max_age=stream.max_age or None,
            max_bytes=stream.max_bytes,
            max_msg_size=stream.max_msg_size,
        )

    async def _ensure_stream(self, client: NatsClient, stream: StreamOptions) -> None:
        config = self.stream_config()
        assert config is not None
        js = self._js(client)
        try:
            info = await js.stream_info(stream.name)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(config)
            except nats.js.errors.APIError as exc:
                msg = f"stream {stream.name!r}: cannot create it: {exc.description}"
                raise self._config_error(msg) from exc
            log.info("created stream %r for %s", stream.name, config.subjects, extra={"sink": self.name})
            return
        existing = set(info.config.subjects or [])
        if not set(config.subjects or []) <= existing:
            log.warning("stream %r exists with subjects %s (wanted %s); left unchanged",
                        stream.name, sorted(existing), config.subjects, extra={"sink": self.name})

    def _js_headers(self, msg: EncodedMessage) -> dict[str, str]:
        headers = dict(msg.headers)
        headers[MSG_ID_HEADER] = msg.event_id
        stream: StreamOptions | None = self.options.stream
        if stream is not None:
            headers["Nats-Expected-Stream"] = stream.name
        return headers

    # ---- pipelined publishing: many publishes in flight, PubAcks on one inbox subscription --------

    async def _publish_one(self, client: NatsClient, sent: Sent) -> None:
        if self._inbox_client is client:
            prefix = self._inbox
        else:
            try:
                prefix = await self._ack_inbox(client)
            except (nats.errors.Error, OSError) as exc:
                settle(sent, SinkTransientError(f"jetstream: cannot subscribe to PubAcks: {exc!r}"))
                return
        msg = sent[0]
        self._ack_seq += 1
        reply = f"{prefix}.{self._ack_seq}"
        self._awaiting[reply] = (sent, time.monotonic() + self.options.publish_timeout)
        try:
            await client.publish(msg.destination, msg.body, reply=reply, headers=self._js_headers(msg))
        except (nats.errors.Error, OSError) as exc:
            if self._awaiting.pop(reply, None) is not None:
                settle(sent, permanent_or_transient(exc, msg.destination))

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[Sent]) -> bool:
        """The outbox's publishes (each with its PubAck reply subject) appended to nats-py's buffer
        in one loop, once this connection's PubAck inbox exists (see
        :meth:`NatsTransportBase._buffer_publish`)."""
        if self._inbox_client is not client or not self._can_buffer(client):
            return False
        buffer = self._buffer_publish
        awaiting = self._awaiting
        prefix = self._inbox
        deadline = time.monotonic() + self.options.publish_timeout
        blocks: dict[str, bytes] = {}
        while outbox:
            sent = outbox.popleft()
            self._ack_seq += 1
            reply = f"{prefix}.{self._ack_seq}"
            awaiting[reply] = (sent, deadline)
            if not buffer(client, sent, self._js_headers(sent[0]), reply, blocks):
                awaiting.pop(reply, None)
        return True

    def _end_of_pass(self, client: NatsClient) -> None:
        """The pass's publishes go to the socket now rather than on nats-py's flusher task's next
        turn: their PubAcks come a loop turn sooner."""
        if client.is_connected:
            try:
                write_pending(client)
            except (OSError, RuntimeError) as exc:  # nats-py's flusher sees (and reports) it too
                log.debug("writing publishes failed: %r", exc, extra={"sink": self.name})

    async def _ack_inbox(self, client: NatsClient) -> str:
        """Subscribes (once per connection) to the inbox the stream's PubAcks are sent to."""
        prefix = client.new_inbox()
        await client.subscribe(f"{prefix}.*", cb=self._on_puback)
        self._inbox, self._inbox_client = prefix, client
        if self._expirer is None or self._expirer.done():
            self._expirer = asyncio.get_running_loop().create_task(
                self._expire_loop(), name=f"jetstream-expire:{self.name}"
            )
        return prefix

    async def _on_puback(self, reply: Msg) -> None:
        entry = self._awaiting.pop(reply.subject, None)
        if entry is None:
            return  # already timed out (and retried: the stream drops the duplicate)
        sent = entry[0]
        msg = sent[0]
        subject = msg.destination
        if reply.headers and reply.headers.get(nats.js.api.Header.STATUS) == "503":
            settle(sent, SinkTransientError(f"jetstream: no stream answered for {subject!r}"))
            return
        try:
            answer = orjson.loads(reply.data)
        except orjson.JSONDecodeError as exc:
            settle(sent, SinkTransientError(f"jetstream: unreadable PubAck for {subject!r}: {exc}"))
            return
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is not None:
            try:
                nats.js.errors.APIError.from_error(error)  # raises the error's own class
            except nats.js.errors.APIError as api_error:
                settle(sent, permanent_or_transient(api_error, subject))
            else:
                settle(sent, SinkTransientError(f"jetstream: error for {subject!r}: {error!r}"))
            return
        if answer.get("duplicate"):
            log.debug("%s already stored (seq %s)", msg.event_id, answer.get("seq"),
                      extra={"sink": self.name})
        sent[1](sent[2], None)

    async def _expire_loop(self) -> None:
        """Fails publishes whose PubAck did not come within ``publish_timeout`` (retried with the
        same ``Nats-Msg-Id``, so a PubAck that was merely lost does not store the message twice)."""
        awaiting = self._awaiting
        timeout = self.options.publish_timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            while awaiting:
                reply = next(iter(awaiting))
                sent, deadline = awaiting[reply]
                if deadline > now:
                    break
                del awaiting[reply]
                try:
                    settle(sent, SinkTransientError(
                        f"jetstream: no PubAck for {sent[0].destination!r} within {timeout}s"))
                except Exception:  # keep expiring the others
                    log.exception("settling an expired publish failed", extra={"sink": self.name})

    async def close(self) -> None:
        expirer, self._expirer = self._expirer, None
        if expirer is not None:
            expirer.cancel()
            await asyncio.gather(expirer, return_exceptions=True)
        self._awaiting.clear()
        await super().close()


class JetStreamSink(NatsSinkBase):
    """JetStream publish; acked on the stream's PubAck, deduplicated by ``Nats-Msg-Id``."""

    kind: ClassVar[str] = "jetstream"
    options_model: ClassVar[type[SinkOptions]] = JetStreamSinkOptions
    transport_class: ClassVar[type[NatsTransportBase]] = JetStreamTransport

    def stream_config(self) -> StreamConfig | None:
        """The stream the sink's options ask for (None: none)."""
        assert isinstance(self.nats, JetStreamTransport)
        return self.nats.stream_config()
