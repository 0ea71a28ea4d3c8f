"""The broker-specific part of a sink as a small Protocol: submit a batch of encoded messages, report
each one's outcome.

A destination written against :class:`Transport` alone gets everything else of a sink from
:class:`TransportSink`, a :class:`~sinks.base.BaseSink` over it: routing, filters, redaction, the
CloudEvent envelope, per-object order (:mod:`sinks.ordering`), the in-flight window
(:mod:`sinks.window`), retries, the circuit breaker (:mod:`sinks.breaker`), the ``oversize`` policy
(:mod:`sinks.oversize`) and dead letters (:mod:`sinks.settle`); and, being a sink like the others,
the bridge's per-sink buffer, spill and degraded mode. Every built-in sink is a transport too: file
and stdout (:mod:`sinks.file`), webhook (:mod:`sinks.webhook`), Kafka (:mod:`sinks.kafka`), NATS
and JetStream (:mod:`sinks.nats`).

Invariants the transport may rely on: a batch holds at most one message of any object (an object's
next message is submitted only once the previous one has its outcome; a :class:`RunTransport`'s
runs aside), so it may send a batch's
messages in any order or concurrently; the messages of one batch are those ready in one turn of the
event loop (at most ``max_in_flight``), in the order they became ready; ``submit`` and the
:class:`Report` run on the event loop. What the transport owes: exactly one outcome per message of
each batch (a second one is ignored), reported one by one (``report(i, outcome)``) or, when one
outcome holds for all of them (a file write, one request), with one call (``report.all(outcome)``).

Optional parts, each found once when the sink is built: a transport that is also a
:class:`DurableTransport` has ``flush()`` called by the sink's ``flush`` once nothing is in flight
(the file's fsync); one that is a :class:`RunTransport` is given, with an object's message, the
ones waiting behind it, to send in the same request (the webhook's batches). A sink kind with
options of its own (a path, a URL) subclasses :class:`TransportSink` with its ``kind``, its
``options_model`` and a ``_make_transport`` that builds the transport from them, so that
``from_options`` and the entry points work as for any sink.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from bridge.clock import Clock
from sinks.base import BaseSink
from sinks.envelope import OutgoingMessage
from sinks.options import SinkOptions
from sinks.settle import Settlement

__all__ = ["DurableTransport", "EncodedMessage", "Report", "RunTransport", "Transport", "TransportSink"]

O = TypeVar("O", bound=SinkOptions)  # noqa: E741


class EncodedMessage(Protocol):
    """What a transport reads of one message (:class:`~sinks.envelope.OutgoingMessage` is one)."""

    @property
    def key(self) -> bytes:
        """The ordering / partition key: the object's uid (or ``namespace/name``; a marker's id)."""

    @property
    def destination(self) -> str:
        """The sink's rendered ``destination`` template (a topic, subject, path …)."""

    @property
    def headers(self) -> Mapping[str, str]:
        """``content-type`` and, in binary mode, the CloudEvent attributes."""

    @property
    def body(self) -> bytes:
        """The encoded event (docs/event-format.md)."""

    @property
    def event_id(self) -> str:
        """The CloudEvent id, the same on every redelivery (consumers deduplicate on it)."""


class Report:
    """The outcomes of one submitted batch: ``report(i, outcome)`` for ``batch[i]``,
    ``report.each([(i, outcome), …])`` for several, or ``report.all(outcome)`` for every message not
    reported yet. An outcome is None once the destination has the message, else the error
    (:class:`~sinks.contract.SinkTransientError`: retried, and counted by the breaker;
    :class:`~sinks.contract.SinkMessageTooLargeError` with its ``limit``: the ``oversize`` policy;
    :class:`~sinks.contract.SinkPermanentError` or any other: the dead letter). A message's second
    outcome is ignored; so is every outcome after the sink closed."""

    __slots__ = ("_batch", "_owed", "_settlement")

    def __init__(self, batch: list[OutgoingMessage], settlement: Settlement) -> None:
        self._batch = batch
        self._settlement = settlement
        self._owed: list[bool] | None = None
        """Which messages have no outcome yet; None while none was reported one by one."""

    def __call__(self, i: int, outcome: BaseException | None, /) -> None:
        """The outcome of ``batch[i]``."""
        owed = self._owed
        if owed is None:
            owed = self._owed = [True] * len(self._batch)
        if 0 <= i < len(owed) and owed[i]:
            owed[i] = False
            self._settlement.settle(self._batch[i], outcome)

    def each(self, outcomes: Sequence[tuple[int, BaseException | None]], /) -> None:
        """``report(i, outcome)`` for each ``(i, outcome)`` in turn, with one call (a client that
        confirms many messages at once: a poll's delivery reports)."""
        batch = self._batch
        owed = self._owed
        if owed is None:
            owed = self._owed = [True] * len(batch)
        count = len(owed)
        results = [(batch[i], o) for i, o in outcomes if 0 <= i < count and owed[i]]
        for i, _ in outcomes:
            if 0 <= i < count:
                owed[i] = False
        self._settlement.settle_all(results)

    def all(self, outcome: BaseException | None, /) -> None:
        """``outcome`` for every message of the batch not reported yet, with one call."""
        batch, owed = self._batch, self._owed
        self._owed = [False] * len(batch)
        if owed is None:
            self._settlement.settle_all(zip(batch, itertools.repeat(outcome)))
        else:
            self._settlement.settle_all((m, outcome) for m, o in zip(batch, owed, strict=True) if o)


@runtime_checkable
class Transport(Protocol):
    """Sends encoded messages to one destination."""

    async def start(self) -> None:
        """Connects to the destination; an error here fails the sink's start (a
        :class:`~sinks.contract.SinkConfigError` says what to change)."""

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """Starts sending ``batch`` without waiting for it, and reports an outcome exactly once for
        each message ``batch[i]`` (``report(i, outcome)``, ``report.each`` or ``report.all``), on the event
        loop, in any order, possibly from inside ``submit``. Raising here is the outcome of every
        message not reported yet."""

    async def close(self) -> None:
        """Releases the destination's connections; reports still owed are ignored."""


@runtime_checkable
class DurableTransport(Transport, Protocol):
    """A transport whose reported messages may still be made more durable (a file's fsync)."""

    async def flush(self) -> None:
        """Makes every message reported so far durable; called by the sink's ``flush`` once nothing
        is in flight. Raising fails that ``flush``."""


@runtime_checkable
class RunTransport(Transport, Protocol):
    """A transport that sends one object's waiting messages together, in one request (a *run*):
    while ``run_limit()`` is more than 1, a batch may hold up to that many messages of one object,
    adjacent, in their order, with one ``key`` and one ``destination`` and at most
    ``run_max_bytes()`` body bytes beyond the first's. The transport sends a run in one request, in
    that order (never split across two, or a later one could land before an earlier one that
    failed), and reports the same outcome for each of its messages; a failed run goes again whole."""

    def run_limit(self) -> int:
        """How many messages of one object a batch may hold now (1: one, as for any transport)."""

    def run_max_bytes(self) -> int:
        """The most body bytes a run may carry beyond its first message's (0: no bound of its own)."""


class TransportSink(BaseSink[O], Generic[O]):
    """A sink over a :class:`Transport`: the messages ready in one turn of the loop go to the
    transport as one batch, and its reports settle them."""

    kind = "transport"

    def __init__(self, *, name: str, options: O, transport: Transport | None = None,
                 clock: Clock | None = None, rng: Callable[[], float] | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock, rng=rng)
        self.transport: Transport = transport if transport is not None else self._make_transport()
        self._durable = self.transport if isinstance(self.transport, DurableTransport) else None
        self._runs = self.transport if isinstance(self.transport, RunTransport) else None
        self._batch: list[OutgoingMessage] = []
        """The messages submitted in this turn of the loop, sent together at its end."""

    @classmethod
    def over(cls, transport: Transport, name: str, options: Mapping[str, Any] | None = None, *,
             kind: str = "transport", clock: Clock | None = None) -> TransportSink[SinkOptions]:
        """The sink named ``name`` over ``transport``, with the sink options of ``options`` (the
        keys every sink has: docs/sinks.md); raises SinkConfigError. A factory registered for a
        kind (:mod:`sinks.registry`) returns ``TransportSink.over(its transport, name, options)``
        with its own keys taken out of ``options``."""
        opts = SinkOptions.from_mapping(name, options, kind=kind)
        return TransportSink(name=name, options=opts, transport=transport, clock=clock)

    def _make_transport(self) -> Transport:
        """The transport of a sink kind with options of its own, built from ``self.options``
        (a subclass's); raises SinkConfigError."""
        raise self._config_error("a transport sink is built over its transport: "
                                 "TransportSink.over(transport, name, options)")

    async def _start(self) -> None:
        await self.transport.start()

    def _submit(self, msg: OutgoingMessage) -> None:
        batch = self._batch
        if not batch:
            asyncio.get_running_loop().call_soon(self._send_batch)
        batch.append(msg)

    def _run_limit(self) -> int:
        return 1 if self._runs is None else self._runs.run_limit()

    def _run_max_bytes(self) -> int:
        return 0 if self._runs is None else self._runs.run_max_bytes()

    # _submit_run is the base sink's: it submits a run's messages in order, so they are adjacent in
    # the batch, as RunTransport says.

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        if self._closed or not batch:
            return
        report = Report(batch, self._settlement)
        try:
            self.transport.submit(batch, report)
        except Exception as exc:  # the outcome of every message not reported yet
            report.all(exc)

    async def _on_flush(self) -> None:
        if self._durable is not None:
            await self._durable.flush()

    async def _close(self) -> None:
        self._batch.clear()
        await self.transport.close()
