"""The machinery every sink shares, so that a concrete sink only has to send one message.

:class:`BaseSink` implements the :class:`~sinks.contract.Sink` protocol. For each event,
:meth:`BaseSink.deliver` runs, in order:

1. routing (resource, namespace, labels, event type) and the change filter → ``ack(FILTERED)``;
2. redaction, payload (object / object and old / merge patch), CloudEvent envelope, encoding
   (structured or binary with the sink's header prefix), key and destination template;
3. admission into a bounded in-flight window (``max_in_flight``): ``deliver`` blocks while it is full,
   which is the backpressure the bridge's per-sink buffer applies its overflow policy to;
4. hand-off to the event's *lane*: one FIFO per object (resource + namespace/name), drained by its own
   short-lived task, so one object's events are sent strictly in order while different objects
   proceed concurrently, and one object stuck in retries holds back nothing but itself;
5. ``await self._send(msg)`` (the subclass), retried with exponential backoff and jitter on
   :class:`SinkTransientError` (honouring ``retry_after``); :class:`SinkPermanentError`, or giving up
   after ``retry.max_attempts`` / ``retry.max_elapsed``, sends the message to the dead-letter
   destination with the reason and acks ``DEAD_LETTERED`` (``DROPPED`` when there is none);
6. ``ack(DELIVERED)`` once ``_send`` returned, i.e. once the destination confirmed it.

Snapshot markers (events without an object) are *barriers*: a ``snapshot.begin`` / ``snapshot.end``
is sent only after every event accepted before it, and events accepted after it wait for it, so a
consumer sees a snapshot's ``sync`` events between its markers even when some of them were retried.

Time (backoff sleeps, give-up deadlines, dead-letter timestamps) comes from an injected clock with
the same shape as ``bridge.clock.Clock``, so tests can drive retries without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, cast

from sinks.cloudevents import (
    HTTP_PREFIX,
    STRUCTURED_CONTENT_TYPE,
    encode_binary,
    encode_structured,
    event_id,
    to_cloudevent,
)
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    SinkConfigError,
    SinkError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, FileDeadLetter
from sinks.filters import ChangeFilter, RoutingFilter
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.payload import PayloadMode, build_payload
from sinks.redaction import Redactor
from sinks.retry import RetryPolicy
from sinks.templates import Template, TemplateError

__all__ = ["BaseSink", "OutgoingMessage", "SinkClock", "SinkStats", "SystemClock"]

log = logging.getLogger(__name__)

O = TypeVar("O", bound=SinkOptions)  # noqa: E741


class SinkClock(Protocol):
    """What sinks need of a clock; ``bridge.clock.RealClock`` / ``FakeClock`` fit."""

    def now(self) -> float:
        """Monotonic seconds."""

    def wall(self) -> float:
        """Seconds since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Returns once ``seconds`` have passed on this clock."""


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@dataclass(slots=True, eq=False)
class OutgoingMessage:
    """One encoded event on its way to the destination."""

    key: bytes
    """Partition / ordering key: the uid (or ``namespace/name``; ``snapshot/<id>`` for markers)."""
    destination: str
    """The rendered destination template (topic, subject or URL path)."""
    headers: dict[str, str]
    """``content-type`` plus, in binary mode, the CloudEvent attributes with the sink's prefix."""
    body: bytes
    event_id: str
    event: ChangeEvent
    ack: AckCallback
    cloudevent: dict[str, Any]
    """The envelope before encoding (shared, read-only)."""
    lane: str = ""
    attempts: int = 0
    barrier: bool = False
    error: str | None = None
    """Set when the event could not be encoded: the message goes straight to the dead letter."""
    after: asyncio.Future[None] | None = None
    waits: list[asyncio.Future[None]] = field(default_factory=list)
    done: asyncio.Future[None] | None = None


@dataclass(slots=True)
class SinkStats:
    """Counters of one sink since it was built."""

    accepted: int = 0
    delivered: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    failed: int = 0
    """Permanent failures with no dead-letter destination (acked ``DROPPED``)."""
    retries: int = 0
    in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "delivered": self.delivered,
            "filtered": self.filtered,
            "dead_lettered": self.dead_lettered,
            "failed": self.failed,
            "retries": self.retries,
            "in_flight": self.in_flight,
        }


class BaseSink(Generic[O]):
    """Common sink behaviour; subclasses implement :meth:`_send` (and optionally the hooks)."""

    kind: ClassVar[str] = ""
    options_model: ClassVar[type[SinkOptions]] = SinkOptions
    default_destination: ClassVar[str] = "{resource}"
    header_prefix: ClassVar[str] = HTTP_PREFIX

    def __init__(
        self,
        *,
        name: str,
        options: O,
        clock: SinkClock | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.options: O = options
        self.stats = SinkStats()
        self._clock: SinkClock = clock or SystemClock()
        self._retry = RetryPolicy(options.retry, rng or random.random)
        text = options.destination if options.destination is not None else self.default_destination
        try:
            self._template = Template(text)
        except TemplateError as exc:
            raise self._config_error(f"destination: {exc}") from exc
        r = options.routing
        try:
            self._routing = RoutingFilter(
                resources=r.resources,
                namespaces=r.namespaces,
                exclude_namespaces=r.exclude_namespaces,
                label_selector=r.label_selector,
                event_types=r.event_types,
            )
            cf = options.change_filter
            self._change = ChangeFilter(ignore_paths=cf.ignore_paths, only_paths=cf.only_paths)
            rd = options.redact
            self._redactor = Redactor(
                redact_paths=rd.paths,
                drop_paths=rd.drop,
                redact_secrets=rd.secrets,
                drop_managed_fields=rd.managed_fields == "drop",
            )
        except ValueError as exc:
            raise self._config_error(str(exc)) from exc
        self._dead_letter: DeadLetterWriter | None = self._make_dead_letter(options.dead_letter)
        self._lanes: dict[str, deque[OutgoingMessage]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._barrier: asyncio.Future[None] | None = None
        self._healthy = True
        self._started = False
        self._closed = False

    # ---- construction ---------------------------------------------------------------------------

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> Self:
        """Builds the sink from its configuration mapping; raises SinkConfigError."""
        opts = cls.options_model.from_mapping(name, options, kind=cls.kind)
        return cls(name=name, options=cast(Any, opts))

    def _config_error(self, message: str) -> SinkConfigError:
        kind = f" ({self.kind})" if self.kind else ""
        return SinkConfigError(f"sink {self.name!r}{kind}: {message}")

    def _make_dead_letter(self, options: DeadLetterOptions) -> DeadLetterWriter | None:
        """The dead-letter writer for ``options``; Kafka / NATS sinks extend this for their kinds."""
        if options.kind == "none":
            return None
        if options.kind == "file":
            return FileDeadLetter(path=options.target)
        raise self._config_error(
            f"dead_letter: kind {options.kind!r} is not supported by this sink (use 'file' or 'none')"
        )

    # ---- what the bridge reads when wiring the sink ---------------------------------------------

    @property
    def routing_resources(self) -> frozenset[str]:
        """Resources this sink wants, as written by the user (empty = all)."""
        return frozenset(self._routing.resources)

    @property
    def resync_period(self) -> float:
        return self.options.resync_period

    @property
    def buffer_capacity(self) -> int:
        return self.options.buffer.capacity

    @property
    def overflow_policy(self) -> str:
        return self.options.buffer.policy

    def accepts(self, event: ChangeEvent) -> bool:
        """The routing decision alone (no change filter)."""
        return self._routing.accepts(event)

    # ---- subclass hooks -------------------------------------------------------------------------

    async def _start(self) -> None:
        """Connects to the destination."""

    async def _send(self, msg: OutgoingMessage) -> None:
        """Delivers one message; returns once the destination confirmed it. Raises
        SinkTransientError (retried) or SinkPermanentError (dead-lettered)."""
        raise NotImplementedError

    async def _on_flush(self) -> None:
        """Called by ``flush`` after the in-flight window drained (e.g. fsync)."""

    async def _close(self) -> None:
        """Releases the destination's connections."""

    def _sanitize(self, value: str) -> str:
        """Applied to every template field value (NATS tokens, Kafka topic alphabet, URL segments)."""
        return value

    # ---- Sink protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if self._dead_letter is not None:
            await self._dead_letter.start()
        await self._start()
        self._started = True

    def healthy(self) -> bool:
        return self._healthy and not self._closed

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if self._closed:
            raise SinkError(f"sink {self.name!r} is closed")
        if not self._routing.accepts(event) or (
            event.type is EventType.UPDATED and not self._change.interesting(event.old, event.obj)
        ):
            self.stats.filtered += 1
            ack(DeliveryOutcome.FILTERED)
            return
        msg = self._build(event, ack)
        limit = self.options.max_in_flight
        while self.stats.in_flight >= limit:
            self._space.clear()
            await self._space.wait()
            if self._closed:
                raise SinkError(f"sink {self.name!r} is closed")
        self._enqueue(msg)

    async def flush(self, timeout: float) -> bool:
        if self.stats.in_flight:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                return False
        await self._on_flush()
        return self.stats.in_flight == 0

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._space.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._lanes.clear()
        try:
            await self._close()
        finally:
            if self._dead_letter is not None:
                await self._dead_letter.close()

    # ---- internals ------------------------------------------------------------------------------

    def _key(self, event: ChangeEvent) -> bytes:
        if event.obj is None:
            snap = event.snapshot
            return f"snapshot/{snap.id if snap else event.resource.qualified}".encode()
        meta = event.metadata
        uid = meta.get("uid")
        if uid and self.options.key == "uid":
            return str(uid).encode()
        return event.subject.encode()

    def _build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        opts = self.options
        eid = event_id(event)
        key = self._key(event)
        try:
            destination = self._template.render(event, self._sanitize)
            res = event.resource
            obj = self._redactor.apply(event.obj, res)
            old = None
            if event.old is not None and opts.payload is not PayloadMode.OBJECT:
                old = self._redactor.apply(event.old, res)
            data, content_type = build_payload(opts.payload, event.type, obj, old)
            ce = to_cloudevent(
                event,
                data=data,
                datacontenttype=content_type,
                compat=opts.compat,
                knative_source=opts.knative_source,
                event_id_value=eid,
            )
            if opts.content_mode == "structured":
                headers = {"content-type": STRUCTURED_CONTENT_TYPE}
                body = encode_structured(ce)
            else:
                headers, body = encode_binary(ce, self.header_prefix)
        except Exception as exc:  # an object the envelope cannot encode is a permanent failure
            log.warning("sink %r: cannot encode event %s: %r", self.name, eid, exc)
            return OutgoingMessage(
                key=key, destination="", headers={}, body=b"", event_id=eid, event=event, ack=ack,
                cloudevent={}, error=f"cannot encode event: {exc!r}",
            )
        return OutgoingMessage(
            key=key, destination=destination, headers=headers, body=body, event_id=eid, event=event,
            ack=ack, cloudevent=ce,
        )

    def _enqueue(self, msg: OutgoingMessage) -> None:
        loop = asyncio.get_running_loop()
        self.stats.accepted += 1
        self.stats.in_flight += 1
        self._idle.clear()
        if msg.event.obj is None:
            # A marker: after everything accepted so far, before everything accepted later.
            msg.barrier = True
            msg.lane = "\0barrier"
            for lane in self._lanes.values():
                tail = lane[-1]
                if tail.done is None:
                    tail.done = loop.create_future()
                msg.waits.append(tail.done)
            msg.done = loop.create_future()
            if self._barrier is not None and not self._barrier.done():
                msg.after = self._barrier
            self._barrier = msg.done
        else:
            msg.lane = f"{msg.event.resource.qualified}\0{msg.event.subject}"
            if self._barrier is not None and not self._barrier.done():
                msg.after = self._barrier
        existing = self._lanes.get(msg.lane)
        if existing is not None:
            existing.append(msg)
            return
        lane = deque((msg,))
        self._lanes[msg.lane] = lane
        task = loop.create_task(self._run_lane(msg.lane, lane), name=f"sink:{self.name}:lane")
        self._tasks.add(task)
        task.add_done_callback(self._lane_done)

    def _lane_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("sink %r: lane task failed", self.name, exc_info=task.exception())

    async def _run_lane(self, lane_key: str, lane: deque[OutgoingMessage]) -> None:
        try:
            while lane:
                msg = lane[0]
                try:
                    outcome = await self._process(msg)
                except Exception:  # a bug here must not strand the lane and stall the checkpoint
                    log.exception("sink %r: failed to process %s; dropping it", self.name, msg.event_id)
                    self.stats.failed += 1
                    outcome = DeliveryOutcome.DROPPED
                lane.popleft()
                self._complete(msg, outcome)
        finally:
            if self._lanes.get(lane_key) is lane and not lane:
                del self._lanes[lane_key]

    async def _process(self, msg: OutgoingMessage) -> DeliveryOutcome:
        if msg.waits:
            await asyncio.wait(msg.waits)
        if msg.after is not None and not msg.after.done():
            await asyncio.wait((msg.after,))
        if msg.error is not None:
            return await self._to_dead_letter(msg, msg.error)
        retry = self._retry
        started = self._clock.now()
        while True:
            msg.attempts += 1
            try:
                await self._send(msg)
            except SinkTransientError as exc:
                self._healthy = False
                elapsed = self._clock.now() - started
                if retry.give_up(msg.attempts, elapsed):
                    return await self._to_dead_letter(
                        msg, f"gave up after {msg.attempts} attempts over {elapsed:.1f}s: {exc}"
                    )
                self.stats.retries += 1
                delay = retry.delay(msg.attempts, exc.retry_after)
                log.debug("sink %r: retrying %s in %.3fs: %s", self.name, msg.event_id, delay, exc)
                await self._clock.sleep(delay)
            except SinkPermanentError as exc:
                return await self._to_dead_letter(msg, str(exc))
            except Exception as exc:  # a bug in a sink must not stall the checkpoint forever
                log.exception("sink %r: unexpected error sending %s", self.name, msg.event_id)
                return await self._to_dead_letter(msg, f"unexpected error: {exc!r}")
            else:
                self._healthy = True
                return DeliveryOutcome.DELIVERED

    async def _to_dead_letter(self, msg: OutgoingMessage, reason: str) -> DeliveryOutcome:
        writer = self._dead_letter
        if writer is None:
            log.warning("sink %r: dropping %s (no dead letter): %s", self.name, msg.event_id, reason)
            self.stats.failed += 1
            return DeliveryOutcome.DROPPED
        record = DeadLetterRecord(
            sink=self.name,
            reason=reason,
            attempts=msg.attempts,
            time=self._clock.wall(),
            event_id=msg.event_id,
            key=msg.key,
            destination=msg.destination,
            headers=msg.headers,
            body=msg.body if msg.body else encode_structured({"id": msg.event_id, "error": reason}),
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                await writer.write(record)
            except Exception as exc:
                # Not acking keeps the checkpoint behind this event until the dead letter works.
                log.warning("sink %r: dead letter write failed (%r); retrying", self.name, exc)
                await self._clock.sleep(self._retry.delay(attempt))
            else:
                self.stats.dead_lettered += 1
                return DeliveryOutcome.DEAD_LETTERED

    def _complete(self, msg: OutgoingMessage, outcome: DeliveryOutcome) -> None:
        stats = self.stats
        stats.in_flight -= 1
        if outcome is DeliveryOutcome.DELIVERED:
            stats.delivered += 1
        if msg.done is not None and not msg.done.done():
            msg.done.set_result(None)
        self._space.set()
        if stats.in_flight == 0:
            self._idle.set()
        try:
            msg.ack(outcome)
        except Exception:
            log.exception("sink %r: ack callback failed for %s", self.name, msg.event_id)
