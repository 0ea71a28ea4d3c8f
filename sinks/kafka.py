"""The Kafka sink: every change event becomes one record, keyed per object, acked on its delivery report.

Why it looks the way it does:

- **No loss, per-object order.** The producer is idempotent with ``acks=all`` by default, so
  librdkafka's own retries neither duplicate nor reorder records of a partition, and
  ``message.timeout.ms`` is infinite by default: while the brokers are down librdkafka keeps the
  records and keeps retrying, so nothing is lost and the events simply stay unacked (the checkpoint
  waits). The record key is the event key (the object's uid by default), so one object's records land
  in one partition; :class:`~sinks.base.BaseSink` sends an object's next event only after the previous
  one was acknowledged, which keeps order even across a producer restart.
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
  ``message.max.bytes`` is then raised to :data:`UNCOMPRESSED_CEILING` so that it does not refuse it
  uncompressed. One that does not fit (or that the broker refuses, ``MSG_SIZE_TOO_LARGE``) fails with
  :class:`~sinks.contract.SinkMessageTooLargeError` and the sink's ``oversize`` policy sends a
  reference or a truncated event in its place (:mod:`sinks.base`). ``dead_letter_max_message_bytes``
  creates the dead-letter topic with a larger limit, so that it can hold the whole event.
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
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import re
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, cast

import lz4.frame
import orjson
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from pydantic import AliasChoices, Field, field_validator, model_validator

from sinks.addresses import check_kafka_brokers
from sinks.base import BaseSink, OutgoingMessage
from sinks.cloudevents import KAFKA_PREFIX
from sinks.contract import (
    EventType,
    SinkConfigError,
    SinkMessageTooLargeError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, dead_letter_json
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.templates import sanitize_kafka_topic
from sinks.transport_security import InsecureSetting, all_loopback

__all__ = [
    "KafkaDeadLetter",
    "KafkaProducerClient",
    "KafkaSink",
    "KafkaSinkOptions",
    "is_permanent",
    "librdkafka_logger",
]

log = logging.getLogger(__name__)

LibrdkafkaValue = str | int | float | bool
DeliveryReport = tuple[Any, SinkPermanentError | SinkTransientError | None]
"""``(token, error)``: a record enqueued with :meth:`KafkaProducerClient.produce` and its outcome."""

_PERMANENT_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
        KafkaError._MSG_TIMED_OUT,
    }
)
"""Errors retrying cannot fix. ``_MSG_TIMED_OUT`` only happens when the user bounded
``message.timeout.ms`` — an explicit request to give up, so the record is dead-lettered."""

_DLQ_MARGIN = 4096
_RECORD_OVERHEAD = 512
"""Bytes of a record's framing counted on top of its value, key and headers."""
_TOO_LARGE_CODES = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE}
)
UNCOMPRESSED_CEILING = 64 << 20
"""librdkafka's ``message.max.bytes`` when records are compressed: a record is judged by its
compressed size (``max_message_bytes``) here, not refused by librdkafka for its uncompressed one."""
_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]*")
_TEMPLATE_FIELD = re.compile(r"\{[^{}]*\}")
_PROBE_INTERVAL = 5.0
_BUSY_POLL = 0.001
"""Seconds between ``poll(0)`` calls while records wait for their delivery reports."""
_IDLE_POLL = 0.05
"""Seconds between metadata probes while the brokers are reported down."""


def is_permanent(error: KafkaError) -> bool:
    """True if a record failing with ``error`` can never be delivered by retrying it."""
    return error.code() in _PERMANENT_CODES


class KafkaSinkOptions(SinkOptions):
    """Options of the ``kafka`` sink (on top of :class:`~sinks.options.SinkOptions`)."""

    brokers: str = Field(min_length=1, validation_alias=AliasChoices("brokers", "bootstrap_servers"))
    """``bootstrap.servers``: ``host:port[,host:port…]`` (``bootstrap_servers`` is accepted too)."""

    @field_validator("brokers")
    @classmethod
    def _brokers(cls, value: str) -> str:
        return check_kafka_brokers(value)
    client_id: str = "kube-event-bridge"
    idempotent: bool = True
    acks: Literal["all", "1", "0"] = "all"
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    linger_ms: float = Field(default=1.0, ge=0)
    """How long librdkafka waits for more records before sending a batch. Every record waits that
    long before it is even sent, so it adds to each event's latency; under load batches fill while
    earlier requests are in flight anyway (up to five per broker)."""
    batch_size: int = Field(default=1_000_000, ge=1)
    """Maximum bytes of one record batch (``batch.size``)."""
    batch_num_messages: int = Field(default=10_000, ge=1)
    message_timeout_ms: int = Field(default=0, ge=0)
    """How long librdkafka may hold a record before failing it; 0 = forever (nothing is lost while
    the brokers are down). A bounded value dead-letters records that time out."""
    max_message_bytes: int = Field(default=1_000_000, ge=1000)
    """The topic's ``max.message.bytes``: a record larger once compressed takes the ``oversize``
    policy (keep it ≤ the topic's limit)."""
    dead_letter_max_message_bytes: int | None = Field(default=None, ge=1000)
    """Creates the dead-letter topic with this ``max.message.bytes``, and dead-letter records up
    to it keep the whole event (None: ``max_message_bytes``; larger records keep the reason only)."""
    queue_max_messages: int = Field(default=100_000, ge=1)
    """``queue.buffering.max.messages``: records held in librdkafka's local queue."""
    librdkafka: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    """Any librdkafka property, applied last (TLS: ``security.protocol``, ``ssl.ca.location`` …;
    SASL: ``sasl.mechanism`` PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 / OAUTHBEARER,
    ``sasl.username``, ``sasl.oauthbearer.*`` …)."""
    secret_files: dict[str, str] = Field(default_factory=dict)
    """librdkafka property → file whose content (stripped) is its value, e.g.
    ``{"sasl.password": "/var/run/secrets/kafka/password"}``. Read at start."""
    auto_create_topics: bool = False
    """Create missing topics (events, snapshot, dead letter) with the settings below."""
    topic_partitions: int = Field(default=6, ge=1)
    topic_replication_factor: int = Field(default=-1)
    """-1 = the broker's default."""
    topic_config: dict[str, str] = Field(default_factory=dict)
    snapshot_topic: str | None = None
    """A compacted topic receiving every object's latest state keyed per object, with a tombstone
    on delete: a materialised view of the watched resources."""
    snapshot_topic_config: dict[str, str] = Field(default_factory=dict)
    """Extra topic settings for the snapshot topic (``cleanup.policy=compact`` is always set)."""
    connect_timeout: float = Field(default=5.0, gt=0)
    """Seconds ``start`` waits for a first metadata answer (a broker that is down does not fail
    start; it only leaves the sink unhealthy)."""

    def insecure_settings(self) -> list[InsecureSetting]:
        props = {k.lower(): v for k, v in self.librdkafka.items()}
        found: list[InsecureSetting] = []
        if str(props.get("enable.ssl.certificate.verification", "true")).lower() in ("false", "0"):
            found.append(("librdkafka.enable.ssl.certificate.verification",
                          "turns TLS certificate verification off"))
        brokers = [b.strip() for b in self.brokers.split(",") if b.strip()]
        if (str(props.get("security.protocol", "")).lower() == "sasl_plaintext"
                and not all_loopback(brokers, "kafka")):
            found.append(("librdkafka.security.protocol",
                          "SASL_PLAINTEXT sends the SASL credentials (and every record) in plaintext "
                          "to brokers other than loopback: use SASL_SSL"))
        return found

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.idempotent and self.acks != "all":
            raise ValueError(f"acks: an idempotent producer needs acks 'all' (got {self.acks!r}); "
                             "set idempotent: false to use another value")
        if self.topic_replication_factor == 0 or self.topic_replication_factor < -1:
            raise ValueError("topic_replication_factor must be -1 (broker default) or >= 1")
        if self.snapshot_topic is not None and not self.snapshot_topic:
            raise ValueError("snapshot_topic must not be empty")
        topics = [("destination", self.destination), ("snapshot_topic", self.snapshot_topic)]
        if self.dead_letter.kind == "kafka":
            topics.append(("dead_letter.target", self.dead_letter.target))
        for what, text in topics:
            if text is None:
                continue
            literal = _TEMPLATE_FIELD.sub("", text) if what == "destination" else text
            if not text or not _TOPIC_CHARS.fullmatch(literal) or len(text) > 249:
                raise ValueError(f"{what}: {text!r} is not a valid Kafka topic name (at most 249 of "
                                 "a-z A-Z 0-9 . _ -)")
        return self

    def producer_config(self) -> dict[str, LibrdkafkaValue]:
        """The librdkafka configuration (secret files not yet read)."""
        conf: dict[str, LibrdkafkaValue] = {
            "bootstrap.servers": self.brokers,
            "client.id": self.client_id,
            "enable.idempotence": self.idempotent,
            "acks": self.acks,
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "batch.size": self.batch_size,
            "batch.num.messages": self.batch_num_messages,
            "message.timeout.ms": self.message_timeout_ms,
            "message.max.bytes": self.max_message_bytes if self.compression == "none" else max(
                self.max_message_bytes, self.dead_letter_max_message_bytes or 0, UNCOMPRESSED_CEILING),
            "queue.buffering.max.messages": self.queue_max_messages,
            # TCP_NODELAY, as the Java client always sets: with Nagle's algorithm on (librdkafka's
            # default) a small produce request can wait for the ACK of the previous one.
            "socket.nagle.disable": True,
        }
        conf.update(self.librdkafka)
        return conf


def librdkafka_logger(sink: str) -> logging.LoggerAdapter[logging.Logger]:
    """Where librdkafka's own log lines go (the ``logger`` client setting): the process's logging,
    as records of ``sinks.kafka.librdkafka`` carrying the sink's name, instead of raw
    ``%4|…|FAIL|…`` lines written to stderr. They are served by the producer's ``poll``."""
    return logging.LoggerAdapter(logging.getLogger("sinks.kafka.librdkafka"), {"sink": sink})


def _read_secrets(files: dict[str, str], who: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for prop, path in files.items():
        try:
            out[prop] = Path(path).read_text().strip()
        except OSError as exc:
            raise SinkConfigError(
                f"{who}: secret_files[{prop!r}]: cannot read {path!r}: {exc.strerror}"
            ) from exc
    return out


class KafkaProducerClient:
    """A confluent-kafka ``Producer`` made awaitable without blocking the event loop.

    ``send`` enqueues one record and returns a future resolved (on the loop) by its delivery
    report. A named task keeps calling ``poll`` in a dedicated thread so delivery reports flow.
    """

    def __init__(
        self,
        *,
        config: dict[str, LibrdkafkaValue],
        name: str,
        on_broker_state: Callable[[bool], None] | None = None,
    ) -> None:
        self.name = name
        self._config = dict(config)
        self._on_broker_state = on_broker_state
        self._producer: Producer | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"kafka-{name}"
        )
        self._poller: asyncio.Task[None] | None = None
        self._reports: collections.deque[tuple[asyncio.Future[None], KafkaError | None]] = collections.deque()
        self._token_reports: collections.deque[tuple[Any, KafkaError | None]] = collections.deque()
        self.on_reports: Callable[[list[DeliveryReport]], None] | None = None
        """Receives, on the loop, the delivery reports of records enqueued with :meth:`produce`."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.fatal: KafkaError | None = None
        """Set (from the producer's thread) when librdkafka reports a fatal error."""
        self._broker_up = True
        self._next_probe = 0.0
        self._wake = asyncio.Event()

    @property
    def config(self) -> dict[str, LibrdkafkaValue]:
        """The librdkafka configuration this client was built with (secrets included)."""
        return dict(self._config)

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError(f"kafka producer {self.name!r} is not started")
        return self._producer

    async def start(self) -> None:
        if self._producer is not None:
            return
        self._loop = asyncio.get_running_loop()
        conf: dict[str, Any] = dict(self._config)
        conf["error_cb"] = self._on_error
        conf["logger"] = librdkafka_logger(self.name)
        try:
            self._producer = Producer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise SinkConfigError(
                f"kafka producer {self.name!r}: invalid librdkafka configuration: {exc}"
            ) from exc
        self._poller = self._loop.create_task(self._poll_loop(), name=f"kafka-poll:{self.name}")

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs a blocking client call in the producer's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def _poll_loop(self) -> None:
        """Serves delivery reports (and error callbacks) on the loop's own thread.

        ``poll(0)`` never blocks, and serving the reports where the records are produced avoids
        handing the GIL back and forth with a polling thread for every single report (which made
        each report wait for the interpreter's switch interval while the loop was busy encoding).
        While records are outstanding it polls every millisecond; otherwise it sleeps until a
        record is produced, waking at least every ``_IDLE_POLL`` seconds for error callbacks."""
        # No local reference to the producer: a cancelled task's traceback would keep it (and its
        # connections) alive after close.
        try:
            while not self._closed and self._producer is not None:
                self._producer.poll(0)
                self._drain()
                if not self._broker_up and time.monotonic() >= self._next_probe:
                    # Readiness must come back even when no record is waiting to prove it.
                    self._next_probe = time.monotonic() + _PROBE_INTERVAL
                    if await self.metadata_ok(1.0):
                        self._set_up(True)
                if self._producer is not None and len(self._producer) > 0:
                    await asyncio.sleep(_BUSY_POLL)
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _IDLE_POLL)
        except asyncio.CancelledError:
            raise
        except Exception:  # never fail silently: delivery reports would stop
            log.exception("kafka producer: poll loop failed", extra={"sink": self.name})
            raise

    def serve_reports(self) -> None:
        """``poll(0)`` now, on the loop: delivery reports already received are settled at once."""
        if not self._closed and self._producer is not None:
            self._producer.poll(0)
            self._drain()

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback (called from the poll thread)."""
        code = error.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            log.warning("kafka producer: all brokers are down (%s); records are kept and retried",
                        error.str(), extra={"sink": self.name})
            self._broker_state(False)
        elif error.fatal():
            # An idempotent producer in a fatal state never delivers again: the sink replaces it.
            log.error("kafka producer: fatal error, the producer will be replaced: %s",
                      error.str(), extra={"sink": self.name})
            self.fatal = error
        else:
            log.info("kafka producer: %s", error.str(), extra={"sink": self.name})

    def _broker_state(self, up: bool) -> None:
        """From the producer's thread."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._set_up, up)

    def _set_up(self, up: bool) -> None:
        if up == self._broker_up:
            return
        self._broker_up = up
        if not up:
            self._next_probe = time.monotonic() + _PROBE_INTERVAL
        if self._on_broker_state is not None:
            self._on_broker_state(up)

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> asyncio.Future[None]:
        """Enqueues one record. Raises SinkPermanentError if it can never be sent, BufferError when
        librdkafka's local queue is full (the caller waits and retries)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._enqueue(topic, key, value, headers, functools.partial(self._delivered, fut))
        return fut

    def produce(
        self,
        topic: str,
        token: Any,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Enqueues one record without a future: its delivery report reaches :attr:`on_reports` as
        ``(token, error)`` with the other reports of the same ``poll``. Raises like :meth:`send`."""
        self._enqueue(topic, key, value, headers, functools.partial(self._token_delivered, token))

    def produce_each(self, msgs: Sequence[OutgoingMessage]) -> list[tuple[OutgoingMessage, BaseException]]:
        """:meth:`produce` for each message in turn (its ``destination``, ``key``, ``body`` and
        ``headers``, the message itself as the token), in one loop with the poller woken once;
        returns the messages that were not enqueued with why (``BufferError`` when the local queue
        is full, else the error :meth:`produce` would raise)."""
        produce = self.producer.produce
        delivered = self._token_delivered
        failed: list[tuple[OutgoingMessage, BaseException]] = []
        for msg in msgs:
            try:
                produce(msg.destination, value=msg.body, key=msg.key, headers=cast(Any, msg.headers),
                        on_delivery=functools.partial(delivered, msg))
            except BufferError as exc:
                failed.append((msg, exc))
            except KafkaException as exc:
                failed.append((msg, _enqueue_error(exc, msg.destination)))
        if len(failed) < len(msgs):
            self._wake.set()
        return failed

    def _enqueue(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
        on_delivery: Any,
    ) -> None:
        """``produce`` with librdkafka's errors mapped: permanent ones (the record can never be
        sent) to SinkPermanentError, the rest to SinkTransientError; BufferError passes through."""
        try:
            self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
            self._wake.set()
        except KafkaException as exc:
            raise _enqueue_error(exc, topic) from exc

    async def send_and_wait(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """``send``, waiting for room in the local queue, then for the delivery report."""
        while True:
            try:
                fut = self.send(topic, key=key, value=value, headers=headers)
            except BufferError:
                await asyncio.sleep(0.01)
                continue
            break
        await fut

    def _delivered(self, fut: asyncio.Future[None], err: KafkaError | None, _msg: Any) -> None:
        """Delivery report, called in the producer's thread: queued, and resolved on the loop when the
        thread's call returns (one hand-over per ``poll`` rather than one loop wake-up per record)."""
        self._reports.append((fut, err))

    def _token_delivered(self, token: Any, err: KafkaError | None, _msg: Any) -> None:
        """Delivery report of a :meth:`produce` record, in the producer's thread (see ``_delivered``)."""
        self._token_reports.append((token, err))

    def _drain(self) -> None:
        reports = self._reports
        while reports:
            fut, err = reports.popleft()
            self._resolve(fut, err)
        tokens = self._token_reports
        if tokens:
            batch: list[DeliveryReport] = []
            delivered = False
            while tokens:
                token, err = tokens.popleft()
                if err is None:
                    delivered = True
                    batch.append((token, None))
                else:
                    batch.append((token, _report_error(err)))
            if delivered and not self._broker_up:
                self._set_up(True)
            if self.on_reports is not None:
                self.on_reports(batch)

    def _resolve(self, fut: asyncio.Future[None], err: KafkaError | None) -> None:
        if fut.done():
            return
        if err is None:
            if not self._broker_up:
                self._set_up(True)
            fut.set_result(None)
        else:
            fut.set_exception(_report_error(err))

    async def metadata_ok(self, timeout: float) -> bool:
        """True if a broker answered a metadata request within ``timeout`` seconds."""
        try:
            await self.run(self.producer.list_topics, None, timeout)
        except (KafkaException, RuntimeError) as exc:
            log.warning("kafka producer: no metadata answer within %.1fs: %s", timeout, exc,
                        extra={"sink": self.name})
            self._set_up(False)
            return False
        self._set_up(True)
        return True

    async def flush(self, timeout: float) -> int:
        """Waits (off the loop) for outstanding records; returns how many are still queued."""
        remaining = int(await self.run(self.producer.flush, timeout))
        self._drain()
        return remaining

    async def close(self) -> None:
        """Stops polling and drops records not yet delivered (they stay unacked). Idempotent."""
        if self._closed:
            return
        self._closed = True
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        producer, self._producer = self._producer, None
        if producer is not None:
            await self.run(_shutdown_producer, producer)
            del producer  # the last reference: librdkafka's handle and connections go with it
        self._drain()  # purged records fail as transient: whoever still waits retries elsewhere
        self._thread.shutdown(wait=False)


def _enqueue_error(exc: KafkaException, topic: str) -> SinkPermanentError | SinkTransientError:
    """librdkafka refusing a record: permanent when it can never be sent, else transient."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    error: SinkPermanentError | SinkTransientError
    if err is not None and err.code() in _TOO_LARGE_CODES:
        error = SinkMessageTooLargeError(f"kafka: {err.name()}: {err.str()}")
    elif err is not None and is_permanent(err):
        error = SinkPermanentError(f"kafka: {err.name()}: {err.str()}")
    else:
        error = SinkTransientError(f"kafka: cannot enqueue record for {topic!r}: {exc}")
    error.__cause__ = exc
    return error


def _report_error(err: KafkaError) -> SinkPermanentError | SinkTransientError:
    """A failed delivery report as the sink's exception."""
    if err.code() in _TOO_LARGE_CODES:
        return SinkMessageTooLargeError(f"kafka: {err.name()}: {err.str()}")
    if is_permanent(err):
        return SinkPermanentError(f"kafka: {err.name()}: {err.str()}")
    return SinkTransientError(f"kafka: delivery failed: {err.name()}: {err.str()}")


def _shutdown_producer(producer: Producer) -> None:
    producer.purge(in_queue=True, in_flight=True, blocking=False)
    producer.flush(0)


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

    def __init__(self, *, sink: KafkaSink, topic: str) -> None:
        self._sink = sink
        self.topic = topic

    async def start(self) -> None:
        await self._sink._ensure_client()
        limit = self._sink.options.dead_letter_max_message_bytes
        try:
            await self._sink._ensure_topic(self.topic, {"max.message.bytes": str(limit)} if limit else {})
        except SinkTransientError as exc:  # brokers down at start: created on first use
            log.warning("dead-letter topic not created yet: %s", exc, extra={"sink": self._sink.name})

    async def write(self, record: DeadLetterRecord) -> None:
        client = await self._sink._ensure_client()
        value = dead_letter_json(record)
        opts = self._sink.options
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


class KafkaSink(BaseSink[KafkaSinkOptions]):
    """Delivers events as Kafka records (see the module docstring)."""

    kind: ClassVar[str] = "kafka"
    options_model: ClassVar[type[SinkOptions]] = KafkaSinkOptions
    default_destination: ClassVar[str] = "k8s.{resource}"
    header_prefix: ClassVar[str] = KAFKA_PREFIX

    def __init__(self, *, options: KafkaSinkOptions, **kwargs: Any) -> None:
        self._client: KafkaProducerClient | None = None
        self._client_lock: asyncio.Lock | None = None
        self._known_topics: set[str] = set()
        self._topic_lock = asyncio.Lock()
        self._brokers_up = True
        self._to_produce: list[OutgoingMessage] = []
        self._produce_scheduled = False
        super().__init__(options=options, **kwargs)

    # ---- hooks ----------------------------------------------------------------------------------

    def _make_dead_letter(self, options: DeadLetterOptions) -> DeadLetterWriter | None:
        if options.kind == "kafka":
            return KafkaDeadLetter(sink=self, topic=options.target)
        return super()._make_dead_letter(options)

    def _sanitize(self, value: str) -> str:
        return sanitize_kafka_topic(value)

    async def _start(self) -> None:
        client = await self._ensure_client()
        self._brokers_up = await client.metadata_ok(self.options.connect_timeout)
        if self.options.snapshot_topic is not None:
            try:
                await self._ensure_snapshot_topic()
            except SinkTransientError as exc:  # brokers down at start: created on first use
                log.warning("snapshot topic not created yet: %s", exc, extra={"sink": self.name})

    async def _send(self, msg: OutgoingMessage) -> None:
        client = self._client or await self._ensure_client()
        if client.fatal is not None:
            client = await self._replace_client(client)
        headers: list[tuple[str, str | bytes | None]] = [(k, v.encode()) for k, v in msg.headers.items()]
        if self.options.auto_create_topics and msg.destination not in self._known_topics:
            await self._ensure_topic(msg.destination, {})
        waits = [self._enqueue_record(client, msg.destination, msg.key, msg.body, headers)]
        snapshot_topic = self.options.snapshot_topic
        if snapshot_topic is not None and msg.event.obj is not None:
            await self._ensure_snapshot_topic()
            value = None if msg.event.type is EventType.DELETED else msg.body
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

    def _submit(self, msg: OutgoingMessage) -> None:
        """The common case without a task: ``produce`` at the end of this loop turn (with the
        turn's other records), settled by the delivery report.

        Per-object order: the base sink starts an object's next event only once this one was
        settled, so a record is never overtaken by a later one of the same object, even when it is
        retried or the producer is replaced. Anything needing an await first (no producer yet, a
        producer to replace, a topic to create, a second record for the snapshot topic, a full
        local queue) takes the task-based path through :meth:`_send`."""
        opts = self.options
        if len(msg.body) + _RECORD_OVERHEAD > opts.max_message_bytes:
            size = compressed_size(msg.body, opts.compression)
            overhead = _RECORD_OVERHEAD + len(msg.key) + sum(len(k) + len(v) for k, v in msg.headers.items())
            if size + overhead > opts.max_message_bytes:
                codec = "" if opts.compression == "none" else f", {size} compressed with {opts.compression}"
                self._settle(msg, SinkMessageTooLargeError(
                    f"kafka: MSG_SIZE_TOO_LARGE: a record of {len(msg.body)} bytes{codec}, more than "
                    f"max_message_bytes ({opts.max_message_bytes})", limit=opts.max_message_bytes))
                return
        self._to_produce.append(msg)
        if not self._produce_scheduled:
            self._produce_scheduled = True
            asyncio.get_running_loop().call_soon(self._produce_batch)

    def _produce_batch(self) -> None:
        """Produces what was submitted during one loop turn in one go (the client's state stays
        in the CPU caches across the calls, and the poller is woken once)."""
        self._produce_scheduled = False
        batch, self._to_produce = self._to_produce, []
        if self._closed:
            return
        client = self._client
        opts = self.options
        if client is not None and client.fatal is None and opts.snapshot_topic is None:
            # The common case: every record straight into the producer's queue, in one loop.
            if opts.auto_create_topics:
                known = self._known_topics
                later = [msg for msg in batch if msg.destination not in known]
                if later:
                    batch = [msg for msg in batch if msg.destination in known]
                    for msg in later:
                        super()._submit(msg)  # the topic is created first, by a sender task
            for msg, error in client.produce_each(batch):
                if isinstance(error, BufferError):
                    super()._submit(msg)  # waits for room in the local queue
                else:
                    self._settle(msg, error)
        else:
            for msg in batch:
                try:
                    self._produce_now(msg)
                except Exception as exc:  # the attempt's outcome, like a raise from _submit
                    self._settle(msg, exc)
        if self._client is not None:
            # Serve the delivery reports that came meanwhile now: on a busy loop the poller's next
            # turn can be several milliseconds away.
            self._client.serve_reports()

    def _produce_now(self, msg: OutgoingMessage) -> None:
        client = self._client
        opts = self.options
        if (
            client is None
            or client.fatal is not None
            or opts.snapshot_topic is not None
            or (opts.auto_create_topics and msg.destination not in self._known_topics)
        ):
            super()._submit(msg)
            return
        try:
            client.produce(msg.destination, msg, key=msg.key, value=msg.body, headers=cast(Any, msg.headers))
        except BufferError:
            super()._submit(msg)

    def _on_reports(self, reports: list[DeliveryReport]) -> None:
        self._settle_all(reports)

    async def _on_flush(self) -> None:
        if self._client is not None:
            await self._client.flush(0)

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def healthy(self) -> bool:
        return super().healthy() and self._brokers_up

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
        if self._client is broken:
            self._client = None
            log.warning("replacing the kafka producer after a fatal error: %s",
                        broken.fatal.str() if broken.fatal is not None else "", extra={"sink": self.name})
            await broken.close()
        return await self._ensure_client()

    def _set_brokers_up(self, up: bool) -> None:
        self._brokers_up = up

    async def _ensure_client(self) -> KafkaProducerClient:
        if self._client is not None:
            return self._client
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self._client is None:
                conf = self.options.producer_config()
                conf.update(_read_secrets(self.options.secret_files, f"sink {self.name!r} (kafka)"))
                client = KafkaProducerClient(
                    config=conf, name=self.name, on_broker_state=self._set_brokers_up
                )
                client.on_reports = self._on_reports
                try:
                    await client.start()
                except SinkConfigError as exc:
                    await client.close()
                    raise self._config_error(str(exc)) from exc
                self._client = client
        assert self._client is not None
        return self._client

    async def _ensure_snapshot_topic(self) -> None:
        topic = self.options.snapshot_topic
        if topic is not None:
            config = {**self.options.snapshot_topic_config, "cleanup.policy": "compact"}
            await self._ensure_topic(topic, config)

    async def _ensure_topic(self, topic: str, config: dict[str, str]) -> None:
        """Creates ``topic`` once if auto-creation is on (an existing topic is fine)."""
        if topic in self._known_topics or not self.options.auto_create_topics:
            return
        async with self._topic_lock:
            if topic not in self._known_topics:
                await self._create_topic(topic, config)
                self._known_topics.add(topic)

    async def _create_topic(self, topic: str, config: dict[str, str]) -> None:
        client = await self._ensure_client()
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
