"""The Kafka sink: every change event becomes one record, keyed per object, acked on its delivery report.

Why it looks the way it does:

- **No loss, per-object order.** The producer is idempotent with ``acks=all`` by default, so
  librdkafka's own retries neither duplicate nor reorder records of a partition, and
  ``message.timeout.ms`` is infinite by default: while the brokers are down librdkafka keeps the
  records and keeps retrying, so nothing is lost and the events simply stay unacked (the checkpoint
  waits). The record key is the event key (the object's uid by default), so one object's records land
  in one partition; the sink (:class:`~sinks.transport.TransportSink`) sends an object's next event
  only after the previous one was acknowledged, which keeps order even across a producer restart.
- **Never block the event loop, never a task per record.** confluent-kafka calls are synchronous.
  ``produce`` only enqueues: the records submitted during one loop turn are produced together at its
  end, each with the message itself as the token of its delivery report. A named task serves the
  reports with a non-blocking ``poll(0)`` on the loop's own thread (every millisecond while records
  are outstanding, and after every produce batch, so a busy loop does not hold reports until its
  timer runs), so reports need no hand-over of the GIL per record, and settles them in batches.
  ``linger.ms`` defaults to 1 and Nagle's algorithm is off: both would otherwise add their wait to
  every record. Blocking calls (flush, metadata, admin) run in a dedicated thread.
- **Oversized records.** ``max_message_bytes`` is the topic's limit on a record *as the broker
  stores it*, i.e. compressed. A record above it is compressed here with the producer's codec (lz4,
  gzip; zstd and snappy are judged uncompressed) and sent whole when that fits: librdkafka's own
  ``message.max.bytes`` is then raised to :data:`~sinks.kafka_options.UNCOMPRESSED_CEILING` so
  that it does not refuse it uncompressed. One that does not fit (or that the broker refuses,
  ``MSG_SIZE_TOO_LARGE``) fails with :class:`~sinks.contract.SinkMessageTooLargeError` and the
  sink's ``oversize`` policy sends a reference or a truncated event in its place (:mod:`sinks.oversize`).
  ``dead_letter_max_message_bytes`` creates the dead-letter topic with a larger limit, so that it can
  hold the whole event.
- **Failures.** A record the broker (or librdkafka) can never take — too large, invalid — raises
  :class:`~sinks.contract.SinkPermanentError` and goes to the dead letter: a Kafka topic
  (``dead_letter: {kind: kafka, target: TOPIC}``) written by the same producer, or a file. Anything
  else is transient and retried by the base class.
- **Materialised view.** With ``snapshot_topic`` set, every object event is also written to a
  compacted topic keyed per object: the latest state, and a tombstone (a record with no value) on
  delete, so a consumer reading that topic from the start rebuilds the current state of the cluster.
- **Readiness.** :meth:`KafkaSink.healthy` turns false when librdkafka reports that every broker is
  down and true again on the next successful delivery or metadata answer.

Security settings (TLS, SASL PLAIN / SCRAM / OAUTHBEARER) are librdkafka properties: pass them
through ``librdkafka``; secrets are read from files with ``secret_files`` (property → path) so they
never sit in the configuration itself.

The options and the librdkafka configuration are in :mod:`sinks.kafka_options`, the producer
client and its delivery reports in :mod:`sinks.kafka_producer`.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import lz4.frame
import orjson
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bridge.clock import Clock
from sinks.cloudevents import KAFKA_PREFIX
from sinks.contract import (
    ChangeEvent,
    EventType,
    SinkConfigError,
    SinkMessageTooLargeError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, dead_letter_json
from sinks.envelope import OutgoingMessage
from sinks.kafka_options import KafkaSinkOptions, read_secrets
from sinks.kafka_producer import DeliveryReport, KafkaProducerClient, is_permanent, librdkafka_logger
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.templates import sanitize_kafka_topic
from sinks.transport import EncodedMessage, Report, TransportSink

__all__ = [
    "KafkaDeadLetter",
    "KafkaProducerClient",
    "KafkaSink",
    "KafkaSinkOptions",
    "KafkaTransport",
    "is_permanent",
    "librdkafka_logger",
]

log = logging.getLogger(__name__)

_DLQ_MARGIN = 4096
_RECORD_OVERHEAD = 512
"""Bytes of a record's framing counted on top of its value, key and headers."""


def compressed_size(value: bytes, codec: str) -> int:
    """The size of ``value`` once the producer compresses it with ``codec`` (lz4: LZ4 frames as
    librdkafka writes them; gzip: deflate); the size itself for codecs judged uncompressed."""
    if codec == "lz4":
        return len(lz4.frame.compress(value))
    if codec == "gzip":
        return len(zlib.compress(value, 6))
    return len(value)


class KafkaDeadLetter:
    """Writes dead-letter records (JSON, see :mod:`sinks.deadletter`) to a Kafka topic through the
    sink's producer. A record too large for the topic is written without the message body."""

    def __init__(self, *, transport: KafkaTransport, topic: str) -> None:
        self._transport = transport
        self.topic = topic

    async def start(self) -> None:
        await self._transport.ensure_client()
        limit = self._transport.options.dead_letter_max_message_bytes
        try:
            await self._transport.ensure_topic(self.topic, {"max.message.bytes": str(limit)} if limit else {})
        except SinkTransientError as exc:  # brokers down at start: created on first use
            log.warning("dead-letter topic not created yet: %s", exc, extra={"sink": self._transport.name})

    async def write(self, record: DeadLetterRecord) -> None:
        client = await self._transport.ensure_client()
        value = dead_letter_json(record)
        opts = self._transport.options
        limit = opts.dead_letter_max_message_bytes or opts.max_message_bytes
        if compressed_size(value, opts.compression) + _DLQ_MARGIN > limit:
            value = orjson.dumps({
                "sink": record.sink,
                "reason": record.reason,
                "attempts": record.attempts,
                "event_id": record.event_id,
                "key": record.key.decode("utf-8", "replace"),
                "destination": record.destination,
                "headers": record.headers,
                "message": None,
                "message_bytes": len(record.body),
                "message_omitted": "too large for the dead-letter topic",
            })
        headers: list[tuple[str, str | bytes | None]] = [
            ("reason", record.reason.encode()[:1000]),
            ("event_id", record.event_id.encode()),
        ]
        await client.send_and_wait(self.topic, key=record.key, value=value, headers=headers)

    async def close(self) -> None:
        """The producer belongs to the sink, which closes it."""


class KafkaTransport:
    """Produces each message as a record (see the module docstring): a batch in one loop with the
    message's report and index as the token of its delivery report, reports settled a poll at a
    time; what needs an await first (no producer yet, a producer to replace, a topic to create, a
    second record for the snapshot topic, a full local queue) goes through a task of its own.
    ``brokers_up`` is false while librdkafka reports every broker down."""

    def __init__(self, *, name: str, options: KafkaSinkOptions,
                 config_error: Callable[[str], SinkConfigError]) -> None:
        self.name = name
        self.options = options
        self._config_error = config_error
        self.client: KafkaProducerClient | None = None
        self._client_lock: asyncio.Lock | None = None
        self._known_topics: set[str] = set()
        self._topic_lock = asyncio.Lock()
        self.brokers_up = True
        self._senders: set[asyncio.Task[None]] = set()
        """The records that needed an await first, one task each (the uncommon path)."""
        self._closed = False

    async def start(self) -> None:
        client = await self.ensure_client()
        self.brokers_up = await client.metadata_ok(self.options.connect_timeout)
        if self.options.snapshot_topic is not None:
            try:
                await self._ensure_snapshot_topic()
            except SinkTransientError as exc:  # brokers down at start: created on first use
                log.warning("snapshot topic not created yet: %s", exc, extra={"sink": self.name})

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """Produces the batch in one go (the client's state stays in the CPU caches across the
        calls, and the poller is woken once); the delivery reports settle it.

        Per-object order: the sink submits an object's next event only once this one was settled,
        so a record is never overtaken by a later one of the same object, even when it is retried
        or the producer is replaced."""
        opts = self.options
        limit = opts.max_message_bytes - _RECORD_OVERHEAD
        skip: set[int] | None = None
        large = [i for i, m in enumerate(batch) if len(m.body) > limit]
        if large:
            skip = set()
            for i in large:
                too_large = self._too_large(batch[i])
                if too_large is not None:
                    skip.add(i)
                    report(i, too_large)
        client = self.client
        if client is not None and client.fatal is None and opts.snapshot_topic is None:
            # The common case: every record straight into the producer's queue, in one loop.
            if opts.auto_create_topics:
                known = self._known_topics
                for i, msg in enumerate(batch):
                    if msg.destination not in known and not (skip and i in skip):
                        skip = skip or set()
                        skip.add(i)
                        self._send_later(msg, report, i)  # the topic is created first
            for i, error in client.produce_each(batch, report, skip):
                if isinstance(error, BufferError):
                    self._send_later(batch[i], report, i)  # waits for room in the local queue
                else:
                    report(i, error)
        else:
            for i, msg in enumerate(batch):
                if not (skip and i in skip):
                    self._send_later(msg, report, i)
        if self.client is not None:
            # Serve the delivery reports that came meanwhile now: on a busy loop the poller's next
            # turn can be several milliseconds away.
            self.client.serve_reports()

    def _too_large(self, msg: EncodedMessage) -> SinkMessageTooLargeError | None:
        """Why a record over ``max_message_bytes`` uncompressed cannot be sent, if it cannot even
        once compressed; None when it fits."""
        opts = self.options
        size = compressed_size(msg.body, opts.compression)
        overhead = _RECORD_OVERHEAD + len(msg.key) + sum(len(k) + len(v) for k, v in msg.headers.items())
        if size + overhead <= opts.max_message_bytes:
            return None
        codec = "" if opts.compression == "none" else f", {size} compressed with {opts.compression}"
        return SinkMessageTooLargeError(
            f"kafka: MSG_SIZE_TOO_LARGE: a record of {len(msg.body)} bytes{codec}, more than "
            f"max_message_bytes ({opts.max_message_bytes})", limit=opts.max_message_bytes)

    def _on_reports(self, reports: list[DeliveryReport]) -> None:
        """A poll's delivery reports, each token a ``(report, index)``: settled one batch's run of
        them at a time (reports come in the order records were produced, batch after batch)."""
        start = 0
        current: Report = reports[0][0][0]
        for j, (token, _) in enumerate(reports):
            if token[0] is not current:
                current.each([(t[1], e) for t, e in reports[start:j]])
                current, start = token[0], j
        current.each([(t[1], e) for t, e in reports[start:]])

    def _send_later(self, msg: EncodedMessage, report: Report, i: int) -> None:
        task = asyncio.get_running_loop().create_task(self._send_reported(msg, report, i),
                                                      name=f"sink:{self.name}:sender")
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _send_reported(self, msg: EncodedMessage, report: Report, i: int) -> None:
        try:
            await self._send(msg)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the sink is closing: the message stays unacked
            # A client cancelling its own internals must not strand the message.
            report(i, SinkTransientError(f"send cancelled: {exc!r}"))
        except Exception as exc:
            report(i, exc)
        else:
            report(i, None)

    async def _send(self, msg: EncodedMessage) -> None:
        client = self.client or await self.ensure_client()
        if client.fatal is not None:
            client = await self._replace_client(client)
        headers: list[tuple[str, str | bytes | None]] = [(k, v.encode()) for k, v in msg.headers.items()]
        if self.options.auto_create_topics and msg.destination not in self._known_topics:
            await self.ensure_topic(msg.destination, {})
        waits = [self._enqueue_record(client, msg.destination, msg.key, msg.body, headers)]
        snapshot_topic = self.options.snapshot_topic
        change = _change(msg) if snapshot_topic is not None else None
        if snapshot_topic is not None and change is not None and change.obj is not None:
            await self._ensure_snapshot_topic()
            value = None if change.type is EventType.DELETED else msg.body
            waits.append(self._enqueue_record(client, snapshot_topic, msg.key, value, headers))
        if len(waits) == 1:
            await waits[0]
            return
        results = await asyncio.gather(*waits, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        permanent = [e for e in errors if isinstance(e, SinkPermanentError)]
        if permanent:
            raise permanent[0]
        if errors:
            raise errors[0]

    async def flush(self) -> None:
        if self.client is not None:
            await self.client.flush(0)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._senders)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client, self.client = self.client, None
        if client is not None:
            await client.close()

    # ---- internals ------------------------------------------------------------------------------

    def _enqueue_record(
        self,
        client: KafkaProducerClient,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
    ) -> asyncio.Future[None]:
        """Enqueues now (so records of one ``_send`` are queued in order) and returns the delivery
        future; a full local queue is waited out asynchronously."""
        try:
            return client.send(topic, key=key, value=value, headers=headers)
        except BufferError:
            return asyncio.ensure_future(client.send_and_wait(topic, key=key, value=value, headers=headers))

    async def _replace_client(self, broken: KafkaProducerClient) -> KafkaProducerClient:
        """Swaps a producer in a fatal state for a new one; its unconfirmed records fail as
        transient, so their lanes re-send them through the new producer, in order."""
        if self.client is broken:
            self.client = None
            log.warning("replacing the kafka producer after a fatal error: %s",
                        broken.fatal.str() if broken.fatal is not None else "", extra={"sink": self.name})
            await broken.close()
        return await self.ensure_client()

    def _set_brokers_up(self, up: bool) -> None:
        self.brokers_up = up

    async def ensure_client(self) -> KafkaProducerClient:
        """The producer, started on first use; raises SinkConfigError for a configuration librdkafka
        refuses or a secret file that cannot be read."""
        if self.client is not None:
            return self.client
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self.client is None:
                conf = self.options.producer_config()
                conf.update(read_secrets(self.options.secret_files, f"sink {self.name!r} (kafka)"))
                client = KafkaProducerClient(
                    config=conf, name=self.name, on_broker_state=self._set_brokers_up
                )
                client.on_reports = self._on_reports
                try:
                    await client.start()
                except SinkConfigError as exc:
                    await client.close()
                    raise self._config_error(str(exc)) from exc
                self.client = client
        assert self.client is not None
        return self.client

    async def _ensure_snapshot_topic(self) -> None:
        topic = self.options.snapshot_topic
        if topic is not None:
            config = {**self.options.snapshot_topic_config, "cleanup.policy": "compact"}
            await self.ensure_topic(topic, config)

    async def ensure_topic(self, topic: str, config: dict[str, str]) -> None:
        """Creates ``topic`` once if auto-creation is on (an existing topic is fine)."""
        if topic in self._known_topics or not self.options.auto_create_topics:
            return
        async with self._topic_lock:
            if topic not in self._known_topics:
                await self._create_topic(topic, config)
                self._known_topics.add(topic)

    async def _create_topic(self, topic: str, config: dict[str, str]) -> None:
        client = await self.ensure_client()
        opts = self.options
        new = NewTopic(
            topic,
            num_partitions=opts.topic_partitions,
            replication_factor=opts.topic_replication_factor,
            config={**opts.topic_config, **config},
        )

        def create() -> None:
            conf: dict[str, Any] = {**client.config, "logger": librdkafka_logger(self.name)}
            admin = AdminClient(conf)
            futures = admin.create_topics([new], operation_timeout=10, request_timeout=15)
            futures[topic].result(timeout=20)

        try:
            await client.run(create)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise SinkTransientError(f"kafka: cannot create topic {topic!r}: {exc}") from exc
        log.info("topic %r ready", topic, extra={"sink": self.name})


class KafkaSink(TransportSink[KafkaSinkOptions]):
    """Delivers events as Kafka records (see the module docstring): a :class:`KafkaTransport`
    under the transport sink."""

    kind: ClassVar[str] = "kafka"
    options_model: ClassVar[type[SinkOptions]] = KafkaSinkOptions
    default_destination: ClassVar[str] = "k8s.{resource}"
    header_prefix: ClassVar[str] = KAFKA_PREFIX

    def __init__(self, *, name: str, options: KafkaSinkOptions, clock: Clock | None = None,
                 rng: Callable[[], float] | None = None) -> None:
        # Built first: a dead letter of kind kafka writes through its producer.
        self.kafka = KafkaTransport(
            name=name, options=options,
            config_error=lambda message: SinkConfigError(f"sink {name!r} (kafka): {message}"))
        super().__init__(name=name, options=options, transport=self.kafka, clock=clock, rng=rng)

    def _make_dead_letter(self, options: DeadLetterOptions) -> DeadLetterWriter | None:
        if options.kind == "kafka":
            return KafkaDeadLetter(transport=self.kafka, topic=options.target)
        return super()._make_dead_letter(options)

    def _sanitize(self, value: str) -> str:
        return sanitize_kafka_topic(value)

    def healthy(self) -> bool:
        return super().healthy() and self.kafka.brokers_up


def _change(msg: EncodedMessage) -> ChangeEvent:
    """The change ``msg`` carries: the sink gives its transport its own messages."""
    assert isinstance(msg, OutgoingMessage)
    return msg.event
