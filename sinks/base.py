"""The machinery every sink shares, so that a concrete sink only has to send one message.

:class:`BaseSink` implements the :class:`~sinks.contract.Sink` protocol. For each event,
:meth:`BaseSink.deliver` runs, in order:

1. routing (resource, namespace, labels, event type), the change filter and the CEL ``filter``
   (:mod:`sinks.cel`; an event it fails on is counted in ``filter_errors`` and kept or dropped as
   ``filter_errors`` says) → ``ack(FILTERED)``;
2. the envelope (:mod:`sinks.envelope`): redaction, the ``fields`` projection, payload, CloudEvent,
   encoding, key and destination template;
3. admission into the bounded in-flight window (:mod:`sinks.window`, ``max_in_flight``): ``deliver``
   blocks while it is full, the back-pressure the bridge's per-sink buffer applies its policy to;
4. hand-off to the event's *lane* (:mod:`sinks.ordering`): one FIFO per object, markers as barriers;
   a sink that sends several messages in one request may take a *run* (``_run_limit``,
   ``_submit_run``);
5. one *attempt* per send: :meth:`BaseSink._submit` starts it without waiting and the outcome comes
   back through :meth:`BaseSink._settle`. Sinks whose client pipelines override ``_submit`` so no
   task exists per event: :class:`~sinks.transport.TransportSink`, under which every built-in sink
   is a transport, hands the messages of one loop turn to its transport as one batch (Kafka:
   ``produce`` + delivery reports; NATS: publish + a shared PING/PONG round; JetStream: publish +
   PubAck on one inbox; file: one write; webhook: requests, or batches of runs). The
   default ``_submit`` hands the message to a small pool of sender tasks that ``await self._send(msg)``
   (the subclass) one message after the other; the pool grows up to ``_max_senders()`` while
   messages wait and shrinks to nothing when idle;
6. outcomes (:mod:`sinks.settle`): retries with backoff, the circuit breaker (:mod:`sinks.breaker`)
   during an outage, the ``oversize`` policy (:mod:`sinks.oversize`), the dead letter; every event is
   acked exactly once, and after ``close`` nothing more is acked.

:meth:`BaseSink.deliver_batch` runs the same steps for each event of a batch in one loop (the
:class:`~sinks.contract.BatchSink` contract: exactly ``deliver`` per event, only cheaper): what is
the same for every event (options, filters, the destination when it has no field, the resource's
lane prefix and ``source``, whether redaction leaves an object alone) is looked up once per batch,
an object kept as bytes gets its envelope without a metadata mapping being built, and an event whose
lane is busy is appended to it without a call per step.

Time (backoff sleeps, give-up deadlines, dead-letter timestamps) comes from an injected clock with
``bridge.clock.Clock`` (the one clock of the project), so tests can drive retries without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from bridge.clock import Clock, RealClock
from bridge.contracts import OverflowPolicy
from sinks.breaker import CircuitBreaker
from sinks.cel import FAIL, PASS, CelError, CelFilter, Projection, shared_filter
from sinks.cloudevents import HTTP_PREFIX
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    ResourceRef,
    SinkConfigError,
    SinkError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterWriter, FileDeadLetter
from sinks.envelope import Envelope, OutgoingMessage
from sinks.filters import ChangeFilter, RoutingFilter, parse_path
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.ordering import Ordering
from sinks.redaction import Mark, Redactor, keyed_mark
from sinks.retry import RetryPolicy
from sinks.settle import Outcome, Settlement
from sinks.stats import SinkStats
from sinks.templates import Template, TemplateError
from sinks.window import InFlightWindow

__all__ = ["BaseSink", "OutgoingMessage", "SinkStats"]

log = logging.getLogger(__name__)

O = TypeVar("O", bound=SinkOptions)  # noqa: E741


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
        self._configure_filters(options)
        self._dead_letter: DeadLetterWriter | None = self._make_dead_letter(options.dead_letter)
        self._envelope = Envelope(sink=name, options=options, template=self._template,
                                  redactor=self._redactor, projection=self._projection,
                                  header_prefix=self.header_prefix, sanitize=self._sanitize,
                                  quarantines=self._dead_letter is not None)
        self._ordering = Ordering(begin=self._begin)
        self._window = InFlightWindow(name=name, limit=options.max_in_flight, stats=self.stats)
        self._breaker = CircuitBreaker(sink=name, options=options.breaker, retry=options.retry,
                                       policy=self._retry, clock=self._clock, stats=self.stats,
                                       dispatch=self._dispatch, give_up=self._give_up, spawn=self._spawn,
                                       closed=lambda: self._settlement.closed)
        self._settlement = Settlement(sink=name, options=options, stats=self.stats, clock=self._clock,
                                      policy=self._retry, ordering=self._ordering, window=self._window,
                                      breaker=self._breaker, dead_letter=self._dead_letter,
                                      dispatch=self._dispatch, spawn=self._spawn,
                                      size_limit=self._size_limit)
        self._ready: deque[OutgoingMessage] = deque()
        """Messages waiting for a sender task (the default, ``_send``-based attempt)."""
        self._workers = 0
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._spill_mark: Mark | None = None
        self._started = False

    def _configure_filters(self, options: O) -> None:
        """The destination template, routing, change filter, redaction, CEL filter and projection."""
        text = options.destination if options.destination is not None else self.default_destination
        try:
            self._template = Template(text)
        except TemplateError as exc:
            raise self._config_error(f"destination: {exc}") from exc
        r = options.routing
        try:
            self._routing = RoutingFilter(
                resources=r.resources, namespaces=r.namespaces, exclude_namespaces=r.exclude_namespaces,
                label_selector=r.label_selector, event_types=r.event_types, events=r.events.route(),
            )
            cf = options.change_filter
            self._change = ChangeFilter(ignore_paths=cf.ignore_paths, only_paths=cf.only_paths)
            rd = options.redact
            self._redactor = Redactor(redact_paths=rd.paths, drop_paths=rd.drop, redact_secrets=rd.secrets,
                                      drop_managed_fields=rd.managed_fields == "drop")
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

    # ---- state the settlement keeps ---------------------------------------------------------------

    @property
    def _closed(self) -> bool:
        """The sink closed: nothing more is accepted, sent or acked."""
        return self._settlement.closed

    @property
    def _healthy(self) -> bool:
        """False since a transient failure, until a success (a sink may also clear it)."""
        return self._settlement.healthy

    @_healthy.setter
    def _healthy(self, value: bool) -> None:
        self._settlement.healthy = value

    @property
    def last_error(self) -> str:
        """The last transient failure, for the bridge's outage logs and readiness detail."""
        return self._settlement.last_error

    @last_error.setter
    def last_error(self, value: str) -> None:
        self._settlement.last_error = value

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

    def has_room(self, count: int) -> bool:
        """True when ``deliver_batch`` of ``count`` events would not wait: the window has room for
        all of them (:class:`~sinks.contract.Admits`; a closed sink raises instead, not waits)."""
        return self.stats.in_flight + count <= self._window.limit

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
        window = self._window
        while self.stats.in_flight >= window.limit:
            await window.wait_for_space()
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
        routing, change = self._routing, self._change
        accepts = None if routing.accepts_all else routing.accepts
        interesting = change.interesting if change.active else None
        knative = self.options.compat == "knative"
        rejects = None if self._filter is None else self._rejects
        build = self._envelope.batch_builder()
        stats, window, breaker = self.stats, self._window, self._breaker
        limit = window.limit
        gate, enter = self._ordering.gate, self._ordering.enter
        submit = self._submit
        clock_now = self._clock.now
        now = clock_now()
        updated, filtered = EventType.UPDATED, DeliveryOutcome.FILTERED
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
                    await window.wait_for_space()
                now = clock_now()
            if gate or obj is None or msg.error is not None or msg.quarantine or breaker.open:
                # behind a marker, a marker, straight to the dead letter (or to it first: a malformed
                # object), or waiting for the breaker
                self._accept(msg)
                continue
            window.enter()
            if enter(msg):
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

    async def flush(self, timeout: float) -> bool:
        if not await self._window.drained(timeout):
            return False
        await self._on_flush()
        return self.stats.in_flight == 0

    async def close(self) -> None:
        if self._closed:
            return
        self._settlement.closed = True
        self._window.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._ordering.clear()
        self._ready.clear()
        self._breaker.clear()
        self._settlement.close()
        try:
            await self._close()
        finally:
            if self._dead_letter is not None:
                await self._dead_letter.close()

    # ---- internals ------------------------------------------------------------------------------

    def _key(self, event: ChangeEvent, meta: Mapping[str, Any] | None = None) -> bytes:
        return self._envelope.key(event, meta)

    def _build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        return self._envelope.build(event, ack)

    def _accept(self, msg: OutgoingMessage) -> None:
        self._window.enter()
        self._ordering.accept(msg)

    def _begin(self, msg: OutgoingMessage) -> None:
        """The message is at the head of its lane (or is the current marker): send it (unless it
        already went, in the run of the message before it)."""
        if msg.pending:
            return
        if msg.error is not None:
            self._give_up(msg, msg.error)
            return
        if msg.quarantine:
            msg.pending = True
            self._spawn(self._settlement.quarantine_then_send(msg), "malformed")
            return
        self._dispatch(msg)

    def _dispatch(self, msg: OutgoingMessage) -> None:
        """One attempt at ``msg`` (with the run behind it when the sink takes runs), unless the
        breaker keeps it waiting."""
        breaker = self._breaker
        if breaker.open and breaker.holds(msg):
            return
        msg.attempts += 1
        if msg.attempts == 1:
            msg.started = self._clock.now()
        msg.pending = True
        limit = self._run_limit()
        if limit > 1 and not msg.barrier:
            run = self._ordering.run(msg, limit, self._run_max_bytes(), self._clock.now)
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

    def _give_up(self, msg: OutgoingMessage, reason: str) -> None:
        """``msg`` to the dead letter with ``reason``, then acked."""
        self._settlement.give_up(msg, reason)

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

    def _settle(self, msg: OutgoingMessage, result: Outcome) -> None:
        """Reports the outcome of one attempt started by ``_submit``: None when the destination
        confirmed the message, else the exception (a sink may also settle with a final
        :class:`DeliveryOutcome`). Call it exactly once per attempt, on the loop; later reports of
        the same attempt are ignored."""
        self._settlement.settle(msg, result)

    def _settle_all(self, results: Iterable[tuple[OutgoingMessage, Outcome]]) -> None:
        """:meth:`_settle` for each ``(message, outcome)`` in turn, with one call (a sink whose
        client confirms many messages at once: a written batch of lines, a poll's delivery reports)."""
        self._settlement.settle_all(results)
