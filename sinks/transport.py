"""The broker-specific part of a sink as a small Protocol: submit a batch of encoded messages, report
each one's outcome.

A destination written against :class:`Transport` alone gets everything else of a sink from
:class:`TransportSink`, a :class:`~sinks.base.BaseSink` over it: routing, filters, redaction, the
CloudEvent envelope, per-object order (:mod:`sinks.ordering`), the in-flight window
(:mod:`sinks.window`), retries, the circuit breaker (:mod:`sinks.breaker`), the ``oversize`` policy
(:mod:`sinks.oversize`) and dead letters (:mod:`sinks.settle`); and, being a sink like the others,
the bridge's per-sink buffer, spill and degraded mode.

Invariants the transport may rely on: a batch holds at most one message of any object (an object's
next message is submitted only once the previous one has its outcome), so it may send a batch's
messages in any order or concurrently; the messages of one batch are those ready in one turn of the
event loop (at most ``max_in_flight``); ``submit`` and ``report`` run on the event loop. What the
transport owes: exactly one report per message of each batch (a second one is ignored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

from bridge.clock import Clock
from sinks.base import BaseSink
from sinks.contract import SinkConfigError
from sinks.envelope import OutgoingMessage
from sinks.options import SinkOptions

__all__ = ["EncodedMessage", "Report", "Transport", "TransportSink"]


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


Report = Callable[[int, BaseException | None], None]
"""``report(i, outcome)``: the outcome of ``batch[i]``: None once the destination has it, else the
error (:class:`~sinks.contract.SinkTransientError`: retried, and counted by the breaker;
:class:`~sinks.contract.SinkMessageTooLargeError` with its ``limit``: the ``oversize`` policy;
:class:`~sinks.contract.SinkPermanentError` or any other: the dead letter)."""


@runtime_checkable
class Transport(Protocol):
    """Sends encoded messages to one destination."""

    async def start(self) -> None:
        """Connects to the destination; an error here fails the sink's start."""

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """Starts sending ``batch`` without waiting for it, and calls ``report(i, outcome)`` exactly
        once for each message ``batch[i]``, on the event loop, in any order, possibly from inside
        ``submit``. Raising here is the outcome of every message not reported yet."""

    async def close(self) -> None:
        """Releases the destination's connections; reports still owed are ignored."""


class TransportSink(BaseSink[SinkOptions]):
    """A sink over a :class:`Transport`: the messages ready in one turn of the loop go to the
    transport as one batch, and each report settles its message."""

    kind = "transport"

    def __init__(self, *, name: str, options: SinkOptions, transport: Transport, clock: Clock | None = None,
                 rng: Callable[[], float] | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock, rng=rng)
        self.transport = transport
        self._batch: list[OutgoingMessage] = []
        """The messages submitted in this turn of the loop, sent together at its end."""

    @classmethod
    def over(cls, transport: Transport, name: str, options: Mapping[str, Any] | None = None, *,
             kind: str = "transport", clock: Clock | None = None) -> Self:
        """The sink named ``name`` over ``transport``, with the sink options of ``options`` (the
        keys every sink has: docs/sinks.md); raises SinkConfigError. A factory registered for a
        kind (:mod:`sinks.registry`) returns ``TransportSink.over(its transport, name, options)``
        with its own keys taken out of ``options``."""
        opts = SinkOptions.from_mapping(name, options, kind=kind)
        return cls(name=name, options=opts, transport=transport, clock=clock)

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> Self:
        raise SinkConfigError(f"sink {name!r}: a transport sink is built over its transport: "
                              "TransportSink.over(transport, name, options)")

    async def _start(self) -> None:
        await self.transport.start()

    def _submit(self, msg: OutgoingMessage) -> None:
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._send_batch)
        self._batch.append(msg)

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        if self._closed or not batch:
            return
        owed = [True] * len(batch)

        def report(i: int, outcome: BaseException | None) -> None:
            if 0 <= i < len(batch) and owed[i]:  # exactly once per message of this batch
                owed[i] = False
                self._settle(batch[i], outcome)

        try:
            self.transport.submit(batch, report)
        except Exception as exc:  # the outcome of every message not reported yet
            self._settle_all((m, exc) for i, m in enumerate(batch) if owed[i])
            owed[:] = [False] * len(batch)

    async def _close(self) -> None:
        self._batch.clear()
        await self.transport.close()
