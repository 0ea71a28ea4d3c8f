"""The Kafka producer client: a confluent-kafka ``Producer`` made awaitable without blocking the
event loop, its delivery reports served on the loop and librdkafka's errors mapped to the sink's
(:mod:`sinks.kafka` for the why of the design)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from sinks.contract import (
    SinkConfigError,
    SinkMessageTooLargeError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.kafka_options import LibrdkafkaValue
from sinks.transport import EncodedMessage

__all__ = ["DeliveryReport", "KafkaProducerClient", "is_permanent", "librdkafka_logger"]

log = logging.getLogger("sinks.kafka")
"""The sink's logger: the producer's lines are the Kafka sink's."""

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

_TOO_LARGE_CODES = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE}
)
_PROBE_INTERVAL = 5.0
"""Seconds between metadata probes while the brokers are reported down."""
_BUSY_POLL = 0.001
"""Seconds between ``poll(0)`` calls while records wait for their delivery reports."""
_IDLE_POLL = 0.05
"""Seconds the poll loop sleeps at most while no record is outstanding (error callbacks)."""


def is_permanent(error: KafkaError) -> bool:
    """True if a record failing with ``error`` can never be delivered by retrying it."""
    return error.code() in _PERMANENT_CODES


def librdkafka_logger(sink: str) -> logging.LoggerAdapter[logging.Logger]:
    """Where librdkafka's own log lines go (the ``logger`` client setting): the process's logging,
    as records of ``sinks.kafka.librdkafka`` carrying the sink's name, instead of raw
    ``%4|…|FAIL|…`` lines written to stderr. They are served by the producer's ``poll``."""
    return logging.LoggerAdapter(logging.getLogger("sinks.kafka.librdkafka"), {"sink": sink})


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

    def produce_each(self, msgs: Sequence[EncodedMessage], group: Any,
                     skip: Container[int] | None = None) -> list[tuple[int, BaseException]]:
        """:meth:`produce` for each message ``msgs[i]`` in turn but those whose index is in ``skip``
        (its ``destination``, ``key``, ``body`` and ``headers``; ``(group, i)`` the token of its
        delivery report), in one loop with the poller woken once; returns the indices of the
        messages that were not enqueued with why (``BufferError`` when the local queue is full, else
        the error :meth:`produce` would raise)."""
        produce = self.producer.produce
        delivered = self._token_delivered
        failed: list[tuple[int, BaseException]] = []
        produced = False
        for i, msg in enumerate(msgs):
            if skip and i in skip:
                continue
            headers: Any = msg.headers  # a Mapping[str, str], which the client takes; no cast() call
            try:
                produce(msg.destination, value=msg.body, key=msg.key, headers=headers,
                        on_delivery=functools.partial(delivered, (group, i)))
            except BufferError as exc:
                failed.append((i, exc))
            except KafkaException as exc:
                failed.append((i, _enqueue_error(exc, msg.destination)))
            else:
                produced = True
        if produced:
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
