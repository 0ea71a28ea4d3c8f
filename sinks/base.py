"""The machinery every sink shares, so that a concrete sink only has to send one message.

:class:`BaseSink` implements the :class:`~sinks.contract.Sink` protocol. For each event,
:meth:`BaseSink.deliver` runs, in order:

1. routing (resource, namespace, labels, event type), the change filter and the CEL ``filter``
   (:mod:`sinks.cel`; an event it fails on is counted in ``filter_errors`` and kept or dropped as
   ``filter_errors`` says) → ``ack(FILTERED)``;
2. redaction, the ``fields`` projection (:class:`~sinks.cel.Projection`), payload (object / object
   and old / merge patch), CloudEvent envelope, encoding
   (structured or binary with the sink's header prefix), key and destination template;
3. admission into a bounded in-flight window (``max_in_flight``): ``deliver`` blocks while it is full,
   which is the backpressure the bridge's per-sink buffer applies its overflow policy to; a full
   window lets its waiter go again once a sixteenth of it has settled (at least one message), so a
   backlog is admitted in steps rather than with one wake-up per settled message;
4. hand-off to the event's *lane*: one FIFO per object (resource + namespace/name). Only a lane's
   head is being sent; the next event of that object starts when the head is settled, so one
   object's events are sent strictly in order while different objects proceed concurrently, and one
   object stuck in retries holds back nothing but itself. A sink that sends several messages in one
   request (the webhook's batches) may take a *run*: the head and the messages queued behind it, in
   order, in that one request (``_run_limit``, ``_submit_run``); the others of a run that failed wait
   in their lane again (no attempt counted) and go after the head settles;
5. one *attempt* per send: :meth:`BaseSink._submit` starts it without waiting and the outcome comes
   back through :meth:`BaseSink._settle`. Sinks whose client pipelines override ``_submit`` (Kafka:
   ``produce`` + delivery report; NATS: publish + a shared PING/PONG round; JetStream: publish +
   PubAck on one inbox; file: lines written once per loop turn) so no task exists per event. The
   default ``_submit`` hands the message to a small pool of sender tasks that ``await self._send(msg)``
   (the subclass) one message after the other; the pool grows up to ``_max_senders()`` while
   messages wait and shrinks to nothing when idle;
6. outcomes: :class:`SinkTransientError` is retried with exponential backoff and jitter (honouring
   ``retry_after``) by re-submitting the same message after a sleep on the injected clock, until the
   circuit breaker opens (below);
   :class:`SinkPermanentError`, any other exception, or giving up after ``retry.max_attempts`` /
   ``retry.max_elapsed`` sends the message to the dead-letter destination with the reason and acks
   ``DEAD_LETTERED`` (``DROPPED`` when there is none); success acks ``DELIVERED``, i.e. once the
   destination confirmed it. Every event is acked exactly once: a report for a message with no
   attempt under way (a duplicate) is ignored, and after ``close`` nothing more is acked.

:meth:`BaseSink.deliver_batch` runs the same steps for each event of a batch in one loop (the
:class:`~sinks.contract.BatchSink` contract: exactly ``deliver`` per event, only cheaper): what is
the same for every event (options, filters, the destination when it has no field, the resource's
lane prefix and ``source``, whether redaction leaves an object alone) is looked up once per batch,
an object kept as bytes gets its envelope without a metadata mapping being built, and an event whose
lane is busy is appended to it without a call per step.

The circuit breaker (``breaker``, on by default): per-event timers are right for a failure of one
message, wrong for an outage of the destination, where each event's timer grows towards
``retry.max`` and, once the destination is back, the backlog trickles in for as long as the longest
timer. After ``breaker.failures`` consecutive transient failures (no success between them) the
breaker *opens*: every event whose attempt fails, whose retry timer fires or that reaches the head
of its lane *waits* (no attempt, no timer of its own) in the order it came; one *probe* at a time
re-sends the oldest waiting event, the probes backing off from ``retry.initial`` up to
``breaker.probe_interval`` (a server's Retry-After is honoured instead). The first success (or any
answer to the probe but a transient failure: a refusal is that event's problem) closes the breaker,
and everything that waited is submitted at once in that order: the backlog goes at the sink's full
rate (the in-flight window, the sink's own pipelining), each object's events still one after the
other in their lane (or together, in order, in one request: a run). While open, only probes count
attempts (``retry.max_attempts``); ``retry.max_elapsed`` still applies to every waiting event, checked
after each failed probe.

Oversized events: a sink whose destination refuses a message for its size raises
:class:`SinkMessageTooLargeError` (Kafka above ``max_message_bytes`` once compressed, NATS above
``max_payload``, a webhook's 413). Unless ``oversize`` is ``dead_letter``, the whole event is written
to the dead letter and the same message is sent again with a cut body in its place (``reference``:
the object's identity; ``truncate``: the object's top-level fields that fit), carrying the
``oversize*`` extension attributes (docs/event-format.md), so that the stream never loses the object.

Snapshot markers (events without an object) are *barriers*: a ``snapshot.begin`` / ``snapshot.end``
is sent only after every event accepted before it, and events accepted after it wait for it, so a
consumer sees a snapshot's ``sync`` events between its markers even when some of them were retried.

Time (backoff sleeps, give-up deadlines, dead-letter timestamps) comes from an injected clock with
``bridge.clock.Clock`` (the one clock of the project), so tests can drive retries without sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from time import time as wall_time
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from orjson import Fragment
from orjson import dumps as orjson_dumps

from bridge.clock import Clock, RealClock
from bridge.contracts import OverflowPolicy
from bridge.rawobject import RawObject, identity_metadata
from sinks.cel import FAIL, PASS, CelError, CelFilter, Projection, shared_filter
from sinks.cloudevents import (
    HTTP_PREFIX,
    STRUCTURED_CONTENT_TYPE,
    cloudevent_of,
    decode_binary,
    decode_structured,
    encode_binary,
    encode_structured,
    event_id,
    event_source,
    rfc3339,
    to_cloudevent,
)
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    ResourceRef,
    SinkConfigError,
    SinkError,
    SinkMessageTooLargeError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, FileDeadLetter
from sinks.filters import ChangeFilter, RoutingFilter, parse_path
from sinks.malformed import malformed_reason, quarantine_record, quarantine_record_body
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.payload import JSON_CONTENT_TYPE, PayloadMode, build_payload
from sinks.redaction import Mark, Redactor, keyed_mark
from sinks.retry import RetryPolicy
from sinks.templates import Template, TemplateError

__all__ = ["BaseSink", "OutgoingMessage", "SinkStats"]

_Outcome = BaseException | DeliveryOutcome | None
"""What settles one attempt: None (confirmed), the exception, or a final outcome."""

log = logging.getLogger(__name__)

O = TypeVar("O", bound=SinkOptions)  # noqa: E741


_EMPTY: Mapping[str, Any] = {}
_SANITIZED_MAX = 16_384


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's name, namespace, uid and resourceVersion as a metadata mapping (hot path; for a
    RawObject nothing else of its metadata)."""
    if obj is None:
        return _EMPTY
    if type(obj) is RawObject:
        return identity_metadata(obj)  # what sinks need, without decoding the whole metadata
    meta = obj.get("metadata")
    if type(meta) is dict or isinstance(meta, Mapping):
        return meta
    return _EMPTY


def _subject(meta: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` when cluster-scoped), as ``ChangeEvent.subject``."""
    namespace = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{namespace}/{name}" if namespace else name


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
    header_prefix: str = HTTP_PREFIX
    """The prefix of CloudEvent attribute headers in binary mode (``ce_`` for Kafka)."""
    lane: str = ""
    attempts: int = 0
    barrier: bool = False
    error: str | None = None
    """Set when the event could not be encoded: the message goes straight to the dead letter."""
    started: float = 0.0
    """Clock time of the first attempt (the give-up deadline counts from it)."""
    pending: bool = False
    """An attempt (or the dead-letter write) is under way and its outcome not yet settled."""
    cut: bool = False
    """The body is the ``oversize`` policy's cut event (the whole one went to the dead letter)."""
    quarantine: bytes = b""
    """For a malformed object (:mod:`sinks.malformed`): what its dead letter gets before the event
    is sent (the bytes as they came, or its identity alone); emptied once written."""

    @property
    def cloudevent(self) -> dict[str, Any]:
        """The envelope as sent, decoded from ``body`` (and ``headers`` in binary mode); empty for a
        message that could not be encoded. Decoded on demand rather than kept from encoding: a
        window of kept envelopes (each holding its object) is work for the garbage collector on
        every event."""
        if self.error is not None or not self.body:
            return {}
        if self.headers.get("content-type") == STRUCTURED_CONTENT_TYPE:
            return decode_structured(self.body)
        return decode_binary(self.headers, self.body, self.header_prefix)


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
    filter_errors: int = 0
    """Events the CEL filter failed on (then kept or dropped as ``filter_errors`` says)."""

    def as_dict(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "delivered": self.delivered,
            "filtered": self.filtered,
            "dead_lettered": self.dead_lettered,
            "failed": self.failed,
            "retries": self.retries,
            "in_flight": self.in_flight,
            "filter_errors": self.filter_errors,
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
        clock: Clock | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.options: O = options
        self.stats = SinkStats()
        self._clock: Clock = clock or RealClock()
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
                events=r.events.route(),
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
            self._spill_mark: Mark | None = None
        except ValueError as exc:
            raise self._config_error(str(exc)) from exc
        self._filter: CelFilter | None = None
        if options.filter is not None:
            try:
                self._filter = shared_filter(options.filter, redactor=self._redactor,
                                             redaction_key=rd.model_dump_json())
            except CelError as exc:
                raise self._config_error(f"filter: {exc}") from exc
        self._projection: Projection | None = None
        if options.fields:
            self._projection = Projection(paths=[parse_path(p) for p in options.fields], texts=options.fields)
        self._dead_letter: DeadLetterWriter | None = self._make_dead_letter(options.dead_letter)
        self._lanes: dict[str, deque[OutgoingMessage]] = {}
        """Per object: the messages not yet settled, the head being sent (or waiting to retry)."""
        self._admitted = 0
        """Messages admitted into lanes and not yet settled (a marker waits for zero)."""
        self._gate: deque[OutgoingMessage] = deque()
        """A marker waiting for (or being sent after) everything before it, then what came after."""
        self._outcomes: deque[tuple[OutgoingMessage, BaseException | DeliveryOutcome | None]] = deque()
        self._settling = False
        self._ready: deque[OutgoingMessage] = deque()
        """Messages waiting for a sender task (the default, ``_send``-based attempt)."""
        self._workers = 0
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._space = asyncio.Event()
        self._space_waiters = 0
        self._space_low = options.max_in_flight - max(1, options.max_in_flight // 16)
        """A full window wakes a waiting ``deliver`` once it is down to this: room for a sixteenth
        of the window at once, not one wake-up (and one event admitted) per settled message."""
        self._sanitized: dict[str, str] = {}
        self._time_text: tuple[float, str] = (-1.0, "")
        """The last event time formatted (the batches of a burst share their changes' seconds)."""
        """Template field value → its ``_sanitize``d form (batches; emptied beyond _SANITIZED_MAX)."""
        """``deliver`` / ``deliver_batch`` calls waiting for room: a settled message sets ``_space``
        only when one waits."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._breaker_failures = 0
        """Consecutive transient failures since the last success (the breaker opens at its limit)."""
        self._breaker_open = False
        """The breaker is open: failed and new attempts wait in ``_breaker_waiting``, one probe at a time."""
        self._breaker_waiting: deque[OutgoingMessage] = deque()
        self._breaker_probe: OutgoingMessage | None = None
        self._breaker_probes = 0
        self._breaker_opened_at = 0.0
        self._healthy = True
        self.last_error = ""
        """The last transient failure, for the bridge's outage logs and readiness detail."""
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
    def delivery(self) -> DeliveryOptions:
        """Its ``routing``, ``buffer``, ``resync_period`` and ``heartbeat`` options, for the bridge."""
        opts = self.options
        return DeliveryOptions(routing=frozenset(self._routing.resources),
                               buffer_capacity=opts.buffer.capacity,
                               overflow_policy=OverflowPolicy(opts.buffer.policy),
                               spill_limit=opts.buffer.spill_limit, resync_period=opts.resync_period,
                               heartbeat_interval=(opts.heartbeat.interval if opts.heartbeat is not None
                                                   else 0.0),
                               spill_form=self._spill_form)

    def _spill_form(self, obj: Mapping[str, Any], resource: ResourceRef) -> Mapping[str, Any]:
        """What this sink's spill keeps of an object: its redactions, each value marked under a key
        of this process (sinks/redaction.py), so that its backlog on disk holds no secret."""
        if self._spill_mark is None:
            self._spill_mark = keyed_mark(os.urandom(32))
        return self._redactor.spill_form(obj, resource, self._spill_mark)

    @property
    def in_flight(self) -> int:
        return self.stats.in_flight

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

    def _submit(self, msg: OutgoingMessage) -> None:
        """Starts one attempt at ``msg`` without waiting for it, and arranges for
        :meth:`_settle` to be called with its outcome exactly once, on the event loop (it may be
        called from inside ``_submit``). Raising here counts as the attempt's outcome.

        The default hands the message to a sender task running :meth:`_send` (up to
        ``max_in_flight`` sender tasks, each taking ready messages one after the other). Sinks whose
        client can pipeline (a producer's delivery reports, a publish followed by a shared
        confirmation) override this and never create a task per message."""
        self._ready.append(msg)
        if len(self._ready) > self._workers - self._sending and self._workers < self._max_senders():
            self._workers += 1
            self._spawn(self._work(), "sender")

    def _size_limit(self) -> int | None:
        """The largest message the destination takes, when the sink knows it (the ``oversize``
        policy's cut event must fit it); None: unknown."""
        return None

    def _max_senders(self) -> int:
        """How many ``_send`` calls may run at once (default: the whole in-flight window)."""
        return self.options.max_in_flight

    def _run_limit(self) -> int:
        """How many of one lane's waiting messages one attempt may carry (default 1: the lane's head
        alone). A sink that sends a *run* (the head and the messages queued behind it, in lane order)
        in one request, so that they are confirmed or refused together, returns more; see
        :meth:`_submit_run`."""
        return 1

    def _run_max_bytes(self) -> int:
        """The most body bytes a run may carry beyond its head's (0: no bound of its own)."""
        return 0

    def _submit_run(self, msgs: list[OutgoingMessage]) -> None:
        """Starts one attempt at a run of one lane's messages (more than one only when
        :meth:`_run_limit` allows it): the sink must send them in this order in one request and
        settle each, in this order, with the request's outcome. The default submits each."""
        for msg in msgs:
            self._submit(msg)

    async def _on_flush(self) -> None:
        """Called by ``flush`` after the in-flight window drained (e.g. fsync)."""

    async def _close(self) -> None:
        """Releases the destination's connections."""

    def _sanitize(self, value: str) -> str:
        """Applied to every template field value (NATS tokens, Kafka topic alphabet, URL segments).
        A function of the value alone: ``deliver_batch`` keeps each value's result for the batch."""
        return value

    # ---- Sink protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        for name, what in self.options.insecure_settings():  # accepted with allow_insecure: true
            log.warning("sink %s: %s: %s (allow_insecure: true)", self.name, name, what,
                        extra={"sink": self.name, "setting": name})
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
        ) or (event.obj is None and self.options.compat == "knative") or (  # Knative has no markers
            self._filter is not None and self._rejects(event)
        ):
            self.stats.filtered += 1
            ack(DeliveryOutcome.FILTERED)
            return
        msg = self._build(event, ack)
        limit = self.options.max_in_flight
        while self.stats.in_flight >= limit:
            await self._wait_for_space()
        self._accept(msg)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        """``deliver(events[i], acks[i])`` for each i in turn (see :class:`~sinks.contract.Sink`),
        in one loop: what is the same for every event (the options, the filters, the envelope's
        constant parts) is looked up once per batch, and an event whose object already has a message
        under way is appended to its lane without a call per step."""
        count = len(events)
        if count != len(acks):
            raise ValueError(f"deliver_batch: {count} events but {len(acks)} acks")
        if not count:
            return
        if self._closed:
            raise SinkError(f"sink {self.name!r} is closed")
        opts = self.options
        stats = self.stats
        routing = self._routing
        accepts = None if routing.accepts_all else routing.accepts
        change = self._change
        interesting = change.interesting if change.active else None
        knative = opts.compat == "knative"
        rejects = None if self._filter is None else self._rejects
        build = self._batch_builder()
        limit = opts.max_in_flight
        idle = self._idle
        lanes = self._lanes
        gate = self._gate
        submit = self._submit
        clock_now = self._clock.now
        now = clock_now()
        updated = EventType.UPDATED
        filtered = DeliveryOutcome.FILTERED
        for i in range(count):
            event = events[i]
            obj = event.obj
            if (
                (accepts is not None and not accepts(event))
                or (interesting is not None and event.type is updated and not interesting(event.old, obj))
                or (obj is None and knative)  # Knative has no markers
                or (rejects is not None and rejects(event))
            ):
                stats.filtered += 1
                acks[i](filtered)
                continue
            msg = build(event, acks[i])
            if stats.in_flight >= limit:
                while stats.in_flight >= limit:
                    await self._wait_for_space()
                now = clock_now()
            if gate or obj is None or msg.error is not None or msg.quarantine or self._breaker_open:
                # behind a marker, a marker, straight to the dead letter (or to it first: a malformed
                # object), or waiting for the breaker
                self._accept(msg)
                continue
            stats.accepted += 1
            stats.in_flight += 1
            if stats.in_flight == 1:  # _idle is set exactly while nothing is in flight
                idle.clear()
            self._admitted += 1
            key = msg.lane
            lane = lanes.get(key)
            if lane is not None:
                lane.append(msg)
                continue
            lanes[key] = deque((msg,))
            # _dispatch's first attempt, with the batch's clock reading (no await since).
            msg.attempts = 1
            msg.started = now
            msg.pending = True
            try:
                submit(msg)
            except Exception as exc:  # a synchronous failure is the attempt's outcome
                self._settle(msg, exc)

    def _rejects(self, event: ChangeEvent) -> bool:
        """The CEL filter's decision: True when the event is not for this sink."""
        flt = self._filter
        assert flt is not None
        verdict = flt.decide(event)
        if verdict == PASS:
            return False
        if verdict == FAIL:
            return True
        self.stats.filter_errors += 1
        if not flt.logged:
            flt.logged = True
            subject = f"{event.resource.qualified} {event.namespace}/{event.name}" if event.obj is not None \
                else f"{event.resource.qualified} {event.type.value} marker"
            log.warning("filter %r failed on %s: %s; the event is %s as filter_errors says; further "
                        "failures of this expression are counted (keb_sink_filter_errors_total), not logged",
                        flt.source, subject, flt.last_error,
                        "dropped" if self.options.filter_errors == "drop" else "kept",
                        extra={"sink": self.name})
        return self.options.filter_errors == "drop"

    async def _wait_for_space(self) -> None:
        """Until a message settles (or the sink closes: SinkError)."""
        self._space.clear()
        self._space_waiters += 1
        try:
            await self._space.wait()
        finally:
            self._space_waiters -= 1
        if self._closed:
            raise SinkError(f"sink {self.name!r} is closed")

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
        self._gate.clear()
        self._ready.clear()
        self._breaker_waiting.clear()
        self._outcomes.clear()
        try:
            await self._close()
        finally:
            if self._dead_letter is not None:
                await self._dead_letter.close()

    # ---- internals ------------------------------------------------------------------------------

    def _key(self, event: ChangeEvent, meta: Mapping[str, Any] | None = None) -> bytes:
        if event.obj is None:
            if event.gap is not None:
                return f"gap/{event.gap.id}".encode()
            snap = event.snapshot
            return f"snapshot/{snap.id if snap else event.resource.qualified}".encode()
        if meta is None:
            meta = _metadata(event.obj)
        uid = meta.get("uid")
        if uid and self.options.key == "uid":
            return str(uid).encode()
        return _subject(meta).encode()

    def _build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        opts = self.options
        res = event.resource
        meta = _metadata(event.obj)
        eid = event_id(event, meta)
        key = self._key(event, meta)
        lane = f"{res.group}/{res.resource}\0{_subject(meta)}"
        try:
            obj = self._redactor.apply(event.obj, res)
            # A template reads labels: from the redacted object, so a redacted label stays redacted.
            shown = event if obj is event.obj else dataclasses.replace(event, obj=obj)
            destination = self._template.render(shown, self._sanitize)
            projection = self._projection
            if projection is not None:  # after the template: the envelope and the destination stay whole
                obj = projection.apply(obj)
            old = None
            if event.old is not None and opts.payload is not PayloadMode.OBJECT:
                old = self._redactor.apply(event.old, res)
                if projection is not None:
                    old = projection.apply(old)
            data, content_type = build_payload(opts.payload, event.type, obj, old)
            ce = to_cloudevent(
                event,
                data=data,
                datacontenttype=content_type,
                compat=opts.compat,
                knative_source=opts.knative_source,
                knative_mode=opts.knative_mode,
                event_id_value=eid,
                metadata=meta,
            )
            if projection is not None and obj is not None:
                ce["fields"] = projection.attribute  # so a consumer never takes it for the whole object
            malformed = malformed_reason(event.obj)
            if malformed:
                ce["malformed"] = malformed
            if opts.content_mode == "structured":
                headers = {"content-type": STRUCTURED_CONTENT_TYPE}
                body = encode_structured(ce)
            else:
                headers, body = encode_binary(ce, self.header_prefix)
        except Exception as exc:  # an object the envelope cannot encode is a permanent failure
            log.warning("cannot encode event %s: %r", eid, exc, extra={"sink": self.name})
            return OutgoingMessage(
                key=key, destination="", headers={}, body=b"", event_id=eid, event=event, ack=ack,
                header_prefix=self.header_prefix, lane=lane, error=f"cannot encode event: {exc!r}",
            )
        msg = OutgoingMessage(
            key=key, destination=destination, headers=headers, body=body, event_id=eid, event=event,
            ack=ack, header_prefix=self.header_prefix, lane=lane,
        )
        if malformed and self._dead_letter is not None:
            msg.quarantine = quarantine_record_body(event, keep_bytes=self._redactor.leaves_raw(res))
        return msg

    def _batch_builder(self) -> Callable[[ChangeEvent, AckCallback], OutgoingMessage]:
        """``_build`` for the events of one batch: the same message, with what is constant (the
        options, the destination when it has no field, the resource's lane prefix, whether redaction
        leaves an object alone) looked up once. An object kept as bytes (RawObject) takes the short
        path (identity fields read directly, the envelope built around its bytes); anything else
        goes through ``_build``."""
        opts = self.options
        slow = self._build
        if opts.compat != "native" or opts.payload is not PayloadMode.OBJECT or self._projection is not None:
            return slow
        header_prefix = self.header_prefix
        structured = opts.content_mode == "structured"
        by_uid = opts.key == "uid"
        template = self._template
        static = template.text if template.static else None
        render = template.render
        sanitize = self._sanitize
        memo = self._sanitized
        if len(memo) > _SANITIZED_MAX:
            memo.clear()
        render_identity = None if static is not None else template.identity_renderer(sanitize, memo)
        redactor = self._redactor
        last_res: Any = None
        last_cluster = ""
        last_time, time_text = self._time_text
        lane_prefix = source = ""
        untouched = False  # redaction leaves this resource's RawObjects (without managedFields) alone

        def build(event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
            nonlocal last_res, last_cluster, lane_prefix, source, untouched, last_time, time_text
            obj = event.obj
            if type(obj) is not RawObject or obj.managed_fields or obj.malformed:
                return slow(event, ack)
            res = event.resource
            if res is not last_res or event.cluster != last_cluster:
                last_res = res
                last_cluster = event.cluster
                lane_prefix = f"{res.group}/{res.resource}\0"
                source = event_source(event)
                untouched = redactor.leaves_raw(res)
            if not untouched:
                return slow(event, ack)
            namespace = obj.namespace
            name = obj.name
            uid = obj.uid
            rv = obj.resource_version
            subject = f"{namespace}/{name}" if namespace else name
            seconds = event.time
            if seconds != last_time or not seconds:  # a burst's changes often share their second
                last_time = seconds
                time_text = rfc3339(seconds or wall_time())
                self._time_text = (seconds, time_text)
            key = (uid if uid and by_uid else subject).encode()
            lane = lane_prefix + subject
            try:
                if static is not None:
                    destination = static
                elif render_identity is not None:
                    destination = render_identity(event, namespace, name, uid)
                else:
                    destination = render(event, sanitize)
                if structured:
                    # The object's bytes spliced in as they are: what encode_structured does.
                    ce = cloudevent_of(event, None, namespace=namespace, name=name, uid=uid,
                                       resource_version=rv, data=Fragment(obj.raw),
                                       datacontenttype=JSON_CONTENT_TYPE, source=source, time=time_text)
                    headers = {"content-type": STRUCTURED_CONTENT_TYPE}
                    body = orjson_dumps(ce)
                else:
                    ce = cloudevent_of(event, None, namespace=namespace, name=name, uid=uid,
                                       resource_version=rv, data=obj,
                                       datacontenttype=JSON_CONTENT_TYPE, source=source, time=time_text)
                    headers, body = encode_binary(ce, header_prefix)
            except Exception:  # the slow path logs it and makes the dead-letter message
                return slow(event, ack)
            return OutgoingMessage(
                key=key, destination=destination, headers=headers, body=body, event_id=ce["id"],
                event=event, ack=ack, header_prefix=header_prefix, lane=lane,
            )

        return build

    def _accept(self, msg: OutgoingMessage) -> None:
        stats = self.stats
        stats.accepted += 1
        stats.in_flight += 1
        self._idle.clear()
        gate = self._gate
        if gate:  # something waits behind a marker: so does this event
            msg.barrier = msg.event.obj is None
            gate.append(msg)
            return
        if msg.event.obj is None:
            # A marker: after everything accepted so far, before everything accepted later.
            msg.barrier = True
            gate.append(msg)
            if self._admitted == 0:
                self._begin(msg)
            return
        self._admit(msg)

    def _admit(self, msg: OutgoingMessage) -> None:
        """Into the event's lane; started at once when the lane was empty."""
        self._admitted += 1
        key = msg.lane
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(msg)
            return
        self._lanes[key] = deque((msg,))
        self._begin(msg)

    def _release_gate(self) -> None:
        """After a marker completed: admits what waited behind it, up to the next marker."""
        gate = self._gate
        while gate:
            head = gate[0]
            if head.barrier:
                if self._admitted == 0:
                    self._begin(head)
                return
            gate.popleft()
            self._admit(head)

    def _begin(self, msg: OutgoingMessage) -> None:
        """The message is at the head of its lane (or is the current marker): send it (unless it
        already went, in the run of the message before it)."""
        if msg.pending:
            return
        if msg.error is not None:
            self._spawn(self._dead_letter_then_complete(msg, msg.error), "dead-letter")
            return
        if msg.quarantine:
            msg.pending = True
            self._spawn(self._quarantine_then_send(msg), "malformed")
            return
        self._dispatch(msg)

    async def _quarantine_then_send(self, msg: OutgoingMessage) -> None:
        """A malformed object's bytes (or identity) to the dead letter, then its event to the stream."""
        try:
            record = quarantine_record(self.name, msg.event, msg.quarantine, event_id=msg.event_id,
                                       key=msg.key, destination=msg.destination, headers=msg.headers,
                                       now=self._clock.wall())
            await self._to_dead_letter(msg, "", record)
        except Exception:  # a bug here must not strand the lane: the event still goes
            log.exception("cannot dead-letter malformed object %s", msg.event_id, extra={"sink": self.name})
        msg.quarantine = b""
        msg.pending = False
        if not self._closed:
            self._dispatch(msg)

    def _dispatch(self, msg: OutgoingMessage) -> None:
        if self._breaker_open and msg is not self._breaker_probe:
            msg.pending = False
            self._breaker_waiting.append(msg)  # waits for the breaker to close (or to be the probe)
            return
        msg.attempts += 1
        if msg.attempts == 1:
            msg.started = self._clock.now()
        msg.pending = True
        limit = self._run_limit()
        if limit > 1 and not msg.barrier:
            run = self._run(msg, limit)
            if len(run) > 1:
                try:
                    self._submit_run(run)
                except Exception as exc:  # a synchronous failure is the attempt's outcome
                    self._settle_all((m, exc) for m in run)
                return
        try:
            self._submit(msg)
        except Exception as exc:  # a synchronous failure is the attempt's outcome
            self._settle(msg, exc)

    def _run(self, head: OutgoingMessage, limit: int) -> list[OutgoingMessage]:
        """``head`` (being dispatched) and, when it heads its lane, the lane's messages queued behind
        it, in order, up to ``limit`` messages (and ``_run_max_bytes``) and the first one that cannot
        go in the same request (another destination, or one for the dead letter); each marked as
        under way."""
        run = [head]
        lane = self._lanes.get(head.lane)
        if lane is None or lane[0] is not head or head.cut:  # a cut event goes alone: it must fit
            return run
        now = 0.0
        max_bytes = self._run_max_bytes()
        size = len(head.body)
        for msg in islice(lane, 1, limit):
            if msg.pending or msg.error is not None or msg.quarantine or msg.destination != head.destination:
                break
            size += len(msg.body)
            if max_bytes and size > max_bytes:
                break
            msg.attempts += 1
            if msg.attempts == 1:
                msg.started = now = now or self._clock.now()
            msg.pending = True
            run.append(msg)
        return run

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"sink:{self.name}:{what}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(),
                      exc_info=task.exception(), extra={"sink": self.name})

    # ---- the default, task-based attempt ----------------------------------------------------------

    async def _work(self) -> None:
        """A sender: runs ``_send`` for ready messages one after the other until none is left."""
        ready = self._ready
        try:
            while ready and not self._closed:
                msg = ready.popleft()
                self._sending += 1
                try:
                    await self._send(msg)
                except asyncio.CancelledError as exc:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the sink is closing: the message stays unacked
                    # A client cancelling its own internals must not strand the message.
                    error: BaseException | None = SinkTransientError(f"send cancelled: {exc!r}")
                except Exception as exc:
                    error = exc
                else:
                    error = None
                finally:
                    self._sending -= 1
                self._settle(msg, error)
        finally:
            self._workers -= 1

    # ---- outcomes ---------------------------------------------------------------------------------

    def _settle(self, msg: OutgoingMessage, result: BaseException | DeliveryOutcome | None) -> None:
        """Reports the outcome of one attempt started by ``_submit``: None when the destination
        confirmed the message, else the exception (a sink may also settle with a final
        :class:`DeliveryOutcome`). Call it exactly once per attempt, on the loop; later reports of
        the same attempt are ignored."""
        self._outcomes.append((msg, result))
        if not self._settling:  # else the running drain picks it up: no recursion through lanes
            self._drain_outcomes()

    def _settle_all(self, results: Iterable[tuple[OutgoingMessage, _Outcome]]) -> None:
        """:meth:`_settle` for each ``(message, outcome)`` in turn, with one call (a sink whose
        client confirms many messages at once: a written batch of lines, a poll's delivery reports)."""
        self._outcomes.extend(results)
        if not self._settling:
            self._drain_outcomes()

    def _drain_outcomes(self) -> None:
        self._settling = True
        try:
            outcomes = self._outcomes
            settle_one = self._settle_one
            complete = self._complete
            delivered = DeliveryOutcome.DELIVERED
            while outcomes:
                item, result = outcomes.popleft()
                try:
                    if result is None and item.pending and not self._closed:
                        # _settle_one's confirmed case, inline: the common one
                        item.pending = False
                        self._healthy = True
                        if self._breaker_failures:
                            self._recovered()
                        complete(item, delivered)
                    else:
                        settle_one(item, result)
                except Exception:  # a bug here must not strand the lane and stall the checkpoint
                    log.exception("failed to settle %s", item.event_id, extra={"sink": self.name})
        finally:
            self._settling = False

    def _settle_one(self, msg: OutgoingMessage, result: BaseException | DeliveryOutcome | None) -> None:
        if self._closed or not msg.pending:
            return  # closed (left unacked), or a duplicate report
        if msg is self._breaker_probe and not isinstance(result, SinkTransientError):
            # The destination answered (a refusal is an answer: the event alone is bad), so the
            # waiting events go; the probe itself takes its own outcome below.
            self._recovered()
        if result is None:
            msg.pending = False
            self._healthy = True
            if self._breaker_failures:
                self._recovered()
            self._complete(msg, DeliveryOutcome.DELIVERED)
            return
        if isinstance(result, DeliveryOutcome):
            msg.pending = False
            self._complete(msg, result)
            return
        msg.pending = False
        if not msg.barrier:
            lane = self._lanes.get(msg.lane)
            if lane is not None and lane[0] is not msg:
                # It went in the run of an earlier message of its lane, which failed with it: it
                # waits in its lane (no attempt counted, no timer of its own) and goes again once
                # the messages before it settle, so one object's events never overtake each other.
                msg.attempts -= 1
                return
        if isinstance(result, SinkTransientError):
            self._healthy = False
            self.last_error = f"{type(result).__name__}: {result}"
            elapsed = self._clock.now() - msg.started
            if self._retry.give_up(msg.attempts, elapsed):
                reason = f"gave up after {msg.attempts} attempts over {elapsed:.1f}s: {result}"
                self._spawn(self._dead_letter_then_complete(msg, reason), "dead-letter")
                if msg is self._breaker_probe:
                    self._probe_failed(None)
                return
            if self._breaker_takes(msg, result):
                return
            self.stats.retries += 1
            delay = self._retry.delay(msg.attempts, result.retry_after)
            log.debug("retrying %s in %.3fs: %s", msg.event_id, delay, result, extra={"sink": self.name})
            self._spawn(self._retry_later(msg, delay), "retry")
            return
        if (isinstance(result, SinkMessageTooLargeError) and self.options.oversize != "dead_letter"
                and msg.event.obj is not None and not msg.cut):
            self._spawn(self._cut_then_send(msg, result), "oversize")
            return
        if isinstance(result, SinkPermanentError):
            reason = str(result)
        else:  # a bug in a sink must not stall the checkpoint forever
            log.error("unexpected error sending %s", msg.event_id, exc_info=result, extra={"sink": self.name})
            reason = f"unexpected error: {result!r}"
        self._spawn(self._dead_letter_then_complete(msg, reason), "dead-letter")

    # ---- oversized events -----------------------------------------------------------------------

    def _dead_letter_address(self) -> str:
        """Where the dead letter keeps whole events: ``kafka:<topic>``, ``nats:<subject>``,
        ``file:<path>``; empty without a dead letter."""
        dl = self.options.dead_letter
        return "" if dl.kind == "none" else f"{dl.kind}:{dl.target}"

    async def _cut_then_send(self, msg: OutgoingMessage, error: SinkMessageTooLargeError) -> None:
        """The ``oversize`` policy: the whole event to the dead letter, then the cut event (the
        object's identity and resourceVersion, and what was cut) in its place on the stream."""
        msg.pending = True
        policy = self.options.oversize
        size = len(msg.body)
        try:
            if self._dead_letter is not None:
                await self._to_dead_letter(msg, f"{error}; the stream got a {policy} event instead")
            limit = error.limit if error.limit is not None else self._size_limit()
            headers, body = self._cut(msg, policy, limit, size)
        except Exception:  # a bug here must not strand the lane and stall the checkpoint
            log.exception("cannot cut oversized event %s", msg.event_id, extra={"sink": self.name})
            self._settle(msg, DeliveryOutcome.DROPPED)
            return
        log.warning("event %s of %s is %d bytes, more than the destination takes (%s): sending a %s "
                    "event in its place%s", msg.event_id, msg.event.subject, size, error, policy,
                    f", the whole event is in {self._dead_letter_address()}" if self._dead_letter else
                    " (no dead letter configured: the whole event is not kept)", extra={"sink": self.name})
        msg.headers, msg.body, msg.cut = headers, body, True
        msg.pending = False
        if not self._closed:
            self._dispatch(msg)

    def _cut(self, msg: OutgoingMessage, policy: str, limit: int | None,
             size: int) -> tuple[dict[str, str], bytes]:
        """The cut event's headers and body: the envelope of ``msg`` with its data replaced (see
        docs/event-format.md, *Oversized objects*)."""
        ce = dict(msg.cloudevent)
        data = ce.get("data")
        res = msg.event.resource
        meta = _metadata(msg.event.obj)
        identity_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if meta.get(k)}
        identity: dict[str, Any] = {"apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
                                    "kind": res.kind, "metadata": identity_meta}
        ce["datacontenttype"] = JSON_CONTENT_TYPE
        ce["oversize"] = policy
        ce["oversizebytes"] = str(size)
        address = self._dead_letter_address()
        if address:
            ce["oversizeref"] = address

        def encode(candidate: Mapping[str, Any]) -> tuple[dict[str, str], bytes]:
            if self.options.content_mode == "structured":
                return {"content-type": STRUCTURED_CONTENT_TYPE}, encode_structured(candidate)
            return encode_binary(dict(candidate), self.header_prefix)

        def fits(candidate: Mapping[str, Any]) -> bool:
            headers, body = encode(candidate)
            overhead = sum(len(k) + len(v) + 4 for k, v in headers.items()) + len(msg.key) + 512
            return limit is not None and len(body) + overhead <= limit

        kept: dict[str, Any] = identity
        if policy == "truncate" and isinstance(data, Mapping) and isinstance(data.get("metadata"), Mapping):
            # The object's top-level fields in order, each kept when the event still fits.
            dropped: list[str] = []
            full_meta = {k: v for k, v in data["metadata"].items() if k != "managedFields"}
            trial = {**identity, "metadata": full_meta}
            if fits({**ce, "data": trial}):
                kept = trial
            else:
                dropped.append("metadata")
            for key, value in data.items():
                if key in ("apiVersion", "kind", "metadata"):
                    continue
                trial = {**kept, key: value}
                if fits({**ce, "data": trial}):
                    kept = trial
                else:
                    dropped.append(key)
            ce["oversizedropped"] = ",".join(dropped)
        ce["data"] = kept
        return encode(ce)

    # ---- the circuit breaker -------------------------------------------------------------------

    def _breaker_takes(self, msg: OutgoingMessage, error: SinkTransientError) -> bool:
        """After a transient failure: True when the breaker keeps ``msg`` (waiting, or as the
        failed probe), False to retry it on its own timer (the breaker is closed and stays so)."""
        breaker = self.options.breaker
        if not breaker.enabled:
            return False
        self._breaker_failures += 1
        if not self._breaker_open and self._breaker_failures < breaker.failures:
            return False
        self.stats.retries += 1  # sent again: as a probe, or once the breaker closes
        if msg is self._breaker_probe:
            self._breaker_waiting.appendleft(msg)  # the oldest waiting event: the next probe again
            self._probe_failed(error.retry_after)
            return True
        self._breaker_waiting.append(msg)
        if self._breaker_open:  # an attempt sent before the breaker opened
            return True
        self._breaker_open = True
        self._healthy = False
        self._breaker_opened_at = self._clock.now()
        self._breaker_probes = 0
        log.warning("%d consecutive failures (last: %s): the breaker opens; one probe at a time "
                    "until the destination answers, then the waiting events at full rate",
                    self._breaker_failures, error, extra={"sink": self.name})
        self._schedule_probe(error.retry_after)
        return True

    def _probe_failed(self, retry_after: float | None) -> None:
        self._breaker_probe = None
        self._breaker_probes += 1
        if self.options.retry.max_elapsed:
            self._expire_parked()
        self._schedule_probe(retry_after)

    def _expire_parked(self) -> None:
        """Waiting events past ``retry.max_elapsed`` go to the dead letter."""
        now = self._clock.now()
        keep: deque[OutgoingMessage] = deque()
        for waiting in self._breaker_waiting:
            elapsed = now - waiting.started
            if self._retry.give_up(0, elapsed):
                reason = f"gave up after {elapsed:.1f}s waiting for the destination: {self.last_error}"
                self._spawn(self._dead_letter_then_complete(waiting, reason), "dead-letter")
            else:
                keep.append(waiting)
        self._breaker_waiting = keep

    def _schedule_probe(self, retry_after: float | None) -> None:
        retry = self.options.retry
        if retry_after is not None:
            delay = min(max(retry_after, 0.0), retry.max_retry_after)
        else:
            delay = min(self.options.breaker.probe_interval, self._retry.delay(self._breaker_probes + 1))
        self._spawn(self._probe_later(delay), "probe")

    async def _probe_later(self, delay: float) -> None:
        await self._clock.sleep(delay)
        if self._closed or not self._breaker_open or self._breaker_probe is not None:
            return
        if not self._breaker_waiting:  # nothing waits (all gave up): the next event is the probe
            self._close_breaker()
            return
        probe = self._breaker_waiting.popleft()
        self._breaker_probe = probe
        self._dispatch(probe)

    def _recovered(self) -> None:
        """A success: the failures in a row end; an open breaker closes."""
        self._breaker_failures = 0
        if self._breaker_open:
            self._close_breaker()

    def _close_breaker(self) -> None:
        self._breaker_open = False
        self._breaker_probe = None
        self._breaker_failures = 0
        waiting, self._breaker_waiting = self._breaker_waiting, deque()
        log.info("the destination answers again after %.1fs: the breaker closes; sending the %d "
                 "waiting events", self._clock.now() - self._breaker_opened_at, len(waiting),
                 extra={"sink": self.name})
        for msg in waiting:
            if not self._closed:
                self._dispatch(msg)

    async def _retry_later(self, msg: OutgoingMessage, delay: float) -> None:
        await self._clock.sleep(delay)
        if not self._closed:
            self._dispatch(msg)

    async def _dead_letter_then_complete(self, msg: OutgoingMessage, reason: str) -> None:
        msg.pending = True
        try:
            outcome = await self._to_dead_letter(msg, reason)
        except Exception:  # a bug here must not strand the lane and stall the checkpoint
            log.exception("failed to process %s; dropping it", msg.event_id, extra={"sink": self.name})
            self.stats.failed += 1
            outcome = DeliveryOutcome.DROPPED
        self._settle(msg, outcome)

    async def _to_dead_letter(self, msg: OutgoingMessage, reason: str,
                              record: DeadLetterRecord | None = None) -> DeliveryOutcome:
        """``msg`` (or ``record``, when given) to the dead letter, retried until it is written."""
        writer = self._dead_letter
        if writer is None:
            log.warning("dropping %s (no dead letter): %s", msg.event_id, reason, extra={"sink": self.name})
            self.stats.failed += 1
            return DeliveryOutcome.DROPPED
        record = record or DeadLetterRecord(
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
                log.warning("dead letter write failed (%r); retrying", exc, extra={"sink": self.name})
                await self._clock.sleep(self._retry.delay(attempt))
            else:
                self.stats.dead_lettered += 1
                return DeliveryOutcome.DEAD_LETTERED

    def _complete(self, msg: OutgoingMessage, outcome: DeliveryOutcome) -> None:
        if msg.barrier:
            gate = self._gate
            if gate and gate[0] is msg:
                gate.popleft()
            self._release_gate()
        else:
            lanes = self._lanes
            lane = lanes[msg.lane] if msg.lane in lanes else None  # noqa: SIM401 - no call per message
            if lane is not None and lane and lane[0] is msg:
                lane.popleft()
                if lane:
                    self._begin(lane[0])
                else:
                    del self._lanes[msg.lane]
            self._admitted -= 1
            if self._admitted == 0 and self._gate:
                self._release_gate()
        stats = self.stats
        stats.in_flight -= 1
        if outcome is DeliveryOutcome.DELIVERED:
            stats.delivered += 1
        if self._space_waiters and stats.in_flight <= self._space_low:
            self._space.set()
        if stats.in_flight == 0:
            self._idle.set()
        try:
            msg.ack(outcome)
        except Exception:
            log.exception("ack callback failed for %s", msg.event_id, extra={"sink": self.name})
