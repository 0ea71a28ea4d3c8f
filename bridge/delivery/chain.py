"""A sink's delivery chain: the declared stages a change passes between its listener and the sink.

What the bridge does to a change on its way to one sink, beyond what the listener and the sink do
themselves (metering, the Events profile, fencing, any later enrichment), is a
:class:`DeliveryStage`: a small object that says what it reads of a change and what it adds
(:attr:`~DeliveryStage.reads`, :attr:`~DeliveryStage.adds`), and hands what goes on to the rest of
the chain. The assembly (the service) builds one :class:`DeliveryChain` per sink, from the
configuration, in a fixed order; the chain is what the sink's listeners deliver to, and what the
pipeline takes (:class:`~bridge.delivery.pipeline.BridgePipeline`: a plain sink handed to it gets
a chain of no stages, :func:`as_chain`).

No stage imitates a sink, and the chain forwards nothing it does not declare: it is started,
flushed and closed with its sink, hands each batch to its first stage (a stage's ``hand_on`` is the
rest of the chain: the next stages, then the sink), and what the bridge reads of the sink's status
(``delivery``, ``last_error``, ``healthy()``) is the sink's own, read from :attr:`DeliveryChain.sink`;
so are the sink's metrics (the service reads them from the sink itself, never through a stage).
``in_flight`` is the one figure the chain counts: events it accepted and that are not acknowledged
yet, counted by its first stage that sees every acknowledgement (:class:`CountsInFlight`: the
meter), else the sink's own count. :meth:`DeliveryChain.has_room` says whether a batch would pass
without waiting: only when every stage and the sink declare it (:class:`~sinks.contract.Admits`) and
agree; a chain with any other stage or sink never says so, and its listeners' workers deliver.

A batch stays a batch through the chain when the sink takes batches
(:func:`~sinks.contract.takes_batches`); for a sink without ``deliver_batch`` the chain runs once
per event, so every stage sees each event as that sink's ``deliver`` would (a fence checks before
each one) and the sink gets one ``deliver`` call per event.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from sinks.contract import AckCallback, Admits, Batched, ChangeEvent, DeliveryOptions, Sink, takes_batches

__all__ = ["BatchReceiver", "CountsInFlight", "DeliveryChain", "DeliveryStage", "HandOn", "Receiver",
           "StageDeclaration", "as_chain", "receives_batches"]

log = logging.getLogger(__name__)

HandOn = Callable[[Sequence[ChangeEvent], Sequence[AckCallback]], Awaitable[None]]
"""The rest of a chain after a stage: ``hand_on(events, acks)`` passes the next stages, then
reaches the sink (one ack per event, in the order of the events)."""


class Receiver(Protocol):
    """What a sink's listener hands its events to: the sink's :class:`DeliveryChain` (in tests and
    tools, a sink itself). Only what the listener uses."""

    @property
    def name(self) -> str: ...

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None: ...


class BatchReceiver(Receiver, Protocol):
    """A :class:`Receiver` that takes a batch in one call."""

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None: ...


def receives_batches(receiver: Receiver) -> TypeGuard[BatchReceiver]:
    """Whether ``receiver``'s class declares ``deliver_batch`` (a chain always does), checked on the
    class as :func:`~sinks.contract.takes_batches` does."""
    return issubclass(type(receiver), Batched)


class DeliveryStage(Protocol):
    """One step of a sink's delivery chain, between the sink's listeners and the sink."""

    @property
    def name(self) -> str:
        """Short and fixed (``meter``, ``events``, ``fence``): logs and docs name the stage by it."""

    @property
    def reads(self) -> tuple[str, ...]:
        """What the stage reads: :class:`~sinks.contract.ChangeEvent` fields, or, in parentheses,
        what it consults outside the change."""

    @property
    def adds(self) -> tuple[str, ...]:
        """What the stage adds to a change (``extensions.reason``) or to its acknowledgement, and
        what it may do instead of handing a change on (hold it, acknowledge it, refuse it)."""

    async def start(self, hand_on: HandOn) -> None:
        """Called once, after the sink started. ``hand_on`` is the rest of the chain, for what the
        stage hands on of its own accord (a held change whose window ended)."""

    async def process(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                      hand_on: HandOn) -> None:
        """Takes one batch (``len(events) == len(acks)``, never empty) and hands what goes on to
        ``hand_on``, in order, with an ack for each event (its own wrapper of the event's ack, or
        the ack itself). An event it does not hand on now it acknowledges itself (an outcome such
        as ``filtered``) or holds and hands on later; it never drops one unacknowledged, but at
        :meth:`close`. May wait (back-pressure, or refusing for good: the pipeline's abort then
        cancels the wait); raises what ``hand_on`` raises."""

    async def flush(self, hand_on: HandOn) -> None:
        """Hands on everything the stage holds (a shutdown: the chain then flushes the sink)."""

    async def close(self) -> None:
        """Stops the stage's own work. What it holds stays unacknowledged: the checkpoint did not
        pass it, and a restart re-reads it. Idempotent."""


@runtime_checkable
class CountsInFlight(Protocol):
    """A stage that sees every acknowledgement of what it handed on, and counts what is not
    acknowledged yet: the chain's :attr:`~DeliveryChain.in_flight` is its count."""

    @property
    def in_flight(self) -> int:
        """Events handed on by this stage and not acknowledged yet."""


@dataclass(frozen=True, slots=True)
class StageDeclaration:
    """What one stage of a chain declares (:meth:`DeliveryChain.declarations`)."""

    name: str
    reads: tuple[str, ...]
    adds: tuple[str, ...]


class DeliveryChain:
    """One sink's delivery chain: what its listeners hand over passes ``stages`` in order, then
    reaches ``sink`` (see the module docs). Lifecycle as a sink's: ``start`` → ``deliver`` /
    ``deliver_batch`` → ``flush`` → ``close``."""

    __slots__ = ("_after", "_counter", "_entry", "_per_event", "_room", "name", "sink", "stages")

    def __init__(self, *, sink: Sink, stages: Sequence[DeliveryStage] = ()) -> None:
        self.sink = sink
        """The sink itself: its status, its metrics and its stats are read from it."""
        self.stages = tuple(stages)
        self.name = sink.name
        self._per_event = not takes_batches(sink)
        rest: HandOn = sink.deliver_batch if takes_batches(sink) else self._deliver_each
        after: list[HandOn] = []
        for stage in reversed(self.stages):
            after.insert(0, rest)
            rest = _link(stage, rest)
        self._after = tuple(after)
        """For each stage, the rest of the chain after it (as many as there are stages)."""
        self._entry = rest
        self._counter = next((s for s in self.stages if isinstance(s, CountsInFlight)), None)
        admitting = [*self.stages, sink]
        checks = tuple(a.has_room for a in admitting if isinstance(a, Admits))
        self._room = checks if len(checks) == len(admitting) else None
        """Each stage's and the sink's ``has_room``, in order; None when one of them has none."""

    def declarations(self) -> list[StageDeclaration]:
        """Each stage's name and what it reads and adds, in the chain's order."""
        return [StageDeclaration(s.name, tuple(s.reads), tuple(s.adds)) for s in self.stages]

    def describe(self) -> str:
        """The chain in one line, for the start's log: ``meter → events → fence → sink hook``."""
        return " → ".join([*(s.name for s in self.stages), f"sink {self.name}"])

    # --- what the pipeline reads: the sink's own status ------------------------------------------

    @property
    def delivery(self) -> DeliveryOptions:
        return self.sink.delivery

    @property
    def last_error(self) -> str:
        return self.sink.last_error

    def healthy(self) -> bool:
        return self.sink.healthy()

    def has_room(self, count: int) -> bool:
        """True when a batch of ``count`` events would pass every stage and reach the sink without
        waiting (see the module docs): the informer may then hand it over in its own task."""
        room = self._room
        return room is not None and all(has_room(count) for has_room in room)

    @property
    def in_flight(self) -> int:
        """Events the chain accepted and that are not acknowledged yet (see the module docs)."""
        return self._counter.in_flight if self._counter is not None else self.sink.in_flight

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.sink.start()
        for stage, hand_on in zip(self.stages, self._after, strict=True):
            await stage.start(hand_on)

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        await self._entry((event,), (ack,))

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        if len(events) != len(acks):
            raise ValueError(f"deliver_batch: {len(events)} events but {len(acks)} acks")
        if not events:
            return
        if self._per_event:
            entry = self._entry
            for i in range(len(events)):
                await entry((events[i],), (acks[i],))
            return
        await self._entry(events, acks)

    async def flush(self, timeout: float) -> bool:
        for stage, hand_on in zip(self.stages, self._after, strict=True):
            await stage.flush(hand_on)
        return await self.sink.flush(timeout)

    async def close(self) -> None:
        try:
            for stage in self.stages:
                try:
                    await stage.close()
                except Exception:
                    log.exception("closing the %s stage of sink %s failed", stage.name, self.name,
                                  extra={"sink": self.name})
        finally:
            await self.sink.close()

    async def _deliver_each(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        """The end of the chain of a sink without ``deliver_batch``: one ``deliver`` per event."""
        deliver = self.sink.deliver
        for i in range(len(events)):
            await deliver(events[i], acks[i])


def as_chain(sink: DeliveryChain | Sink) -> DeliveryChain:
    """What the pipeline delivers to for ``sink``: a chain is itself, a plain sink (a test's, a
    tool's, one handed over through the public API) gets a chain of no stages, which hands each
    batch to the sink as it is (one ``deliver`` per event for a sink without ``deliver_batch``)."""
    return sink if isinstance(sink, DeliveryChain) else DeliveryChain(sink=sink)


def _link(stage: DeliveryStage, rest: HandOn) -> HandOn:
    """``stage`` followed by ``rest``, as one hand-on (a partial: no call of its own per batch)."""
    return functools.partial(stage.process, hand_on=rest)
