"""A sink for tests that records what the bridge hands it and acknowledges as its script says.

:class:`RecordingSink` implements :class:`sinks.contract.Sink` and nothing more (no
:class:`sinks.base.BaseSink`): it is the stand-in for "a destination" when what is tested is the
bridge's side (checkpoints, replay, routing, buffering, spill), and it stays valid whatever the
built-in sinks' internals become. By default it acknowledges every event at once as delivered; a
test scripts anything else per event (:class:`Step`): another outcome, an acknowledgement held until
the test releases it, one that comes after a delay on the sink's clock, a failure raised from
``deliver``, or a delay before the event is accepted (back-pressure). :class:`RecordingBatchSink`
adds ``deliver_batch`` (:class:`sinks.contract.BatchSink`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bridge.clock import Clock, RealClock
from bridge.contracts import OverflowPolicy
from sinks.contract import (
    AckCallback,
    ChangeEvent,
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    SinkTransientError,
)

__all__ = ["RecordingBatchSink", "RecordingSink", "Step"]

_CHANGES = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)


@dataclass(frozen=True, slots=True)
class Step:
    """What a :class:`RecordingSink` does with one event: build one with :meth:`ack`, :meth:`hold`
    or :meth:`fail`, and :meth:`accepted_after` for a ``deliver`` that first waits."""

    outcome: DeliveryOutcome | None = DeliveryOutcome.DELIVERED
    """The acknowledgement's outcome; None: held in :attr:`RecordingSink.unacked` until released."""
    ack_after: float = 0.0
    """Seconds (on the sink's clock) between accepting the event and acknowledging it; 0: at once,
    inside ``deliver``."""
    error: Exception | None = None
    """Raised from ``deliver`` instead of accepting the event (it is never acknowledged)."""
    accept_after: float = 0.0
    """Seconds (on the sink's clock) ``deliver`` waits before it does the rest (a full window)."""

    @classmethod
    def ack(cls, outcome: DeliveryOutcome = DeliveryOutcome.DELIVERED, *, after: float = 0.0) -> Step:
        """Acknowledges with ``outcome``, ``after`` seconds after accepting the event."""
        return cls(outcome=outcome, ack_after=after)

    @classmethod
    def hold(cls) -> Step:
        """Accepts the event and keeps its acknowledgement until the test releases it."""
        return cls(outcome=None)

    @classmethod
    def fail(cls, error: Exception | None = None) -> Step:
        """``deliver`` raises ``error`` (default: a :class:`~sinks.contract.SinkTransientError`)."""
        return cls(outcome=None, error=error or SinkTransientError("scripted failure"))

    def accepted_after(self, seconds: float) -> Step:
        """This step, with ``deliver`` waiting ``seconds`` first."""
        return replace(self, accept_after=seconds)


class RecordingSink:
    """A :class:`sinks.contract.Sink` that records every event (module docstring).

    ``auto_ack=False`` holds every unscripted event's acknowledgement (as :meth:`Step.hold`). The
    delivery options are plain attributes read when the bridge asks (a test may change them after
    construction); ``overflow_policy`` defaults to ``block``, so that a test's informer waits for a
    slow recording sink rather than spilling. ``clock`` times the scripted delays (a
    :class:`~bridge.clock.FakeClock` makes them deterministic)."""

    def __init__(self, name: str, *, auto_ack: bool = True, resync_period: float = 0.0,
                 routing_resources: frozenset[str] = frozenset(), buffer_capacity: int = 1024,
                 overflow_policy: OverflowPolicy | str = OverflowPolicy.BLOCK,
                 heartbeat_interval: float = 0.0, clock: Clock | None = None) -> None:
        self.name = name
        self.auto_ack = auto_ack
        self.resync_period = resync_period
        self.routing_resources = routing_resources
        self.buffer_capacity = buffer_capacity
        self.overflow_policy: OverflowPolicy | str = overflow_policy
        self.heartbeat_interval = heartbeat_interval
        self.clock: Clock = clock or RealClock()
        self.events: list[ChangeEvent] = []
        """Every event accepted, in the order ``deliver`` was called."""
        self.unacked: list[tuple[ChangeEvent, AckCallback]] = []
        """Accepted events whose acknowledgement is held, with it (call it, or :meth:`ack_all`)."""
        self.acks: list[tuple[ChangeEvent, DeliveryOutcome]] = []
        """Every acknowledgement made, in order, whoever called it."""
        self.refused: list[tuple[ChangeEvent, Exception]] = []
        """Events ``deliver`` raised for (:meth:`Step.fail`), with the error."""
        self.started = False
        self.closed = False
        self._script: deque[Step] = deque()
        self._by_subject: dict[str, deque[Step]] = {}
        self._timed: set[asyncio.Task[None]] = set()
        self._error = ""

    # ---- scripting -------------------------------------------------------------------------------

    def script(self, *steps: Step, subject: str | None = None) -> None:
        """Queues ``steps`` for the next events (of ``subject``, ``namespace/name``, when given;
        those are looked up first), one step each; events beyond the script get the default."""
        queue = self._script if subject is None else self._by_subject.setdefault(subject, deque())
        queue.extend(steps)

    def ack_all(self, outcome: DeliveryOutcome = DeliveryOutcome.DELIVERED) -> int:
        """Acknowledges every held event with ``outcome``; returns how many there were."""
        pending, self.unacked = self.unacked, []
        for _, ack in pending:
            ack(outcome)
        return len(pending)

    def _next_step(self, event: ChangeEvent) -> Step:
        own = self._by_subject.get(event.subject) if event.obj is not None else None
        if own:
            return own.popleft()
        if self._script:
            return self._script.popleft()
        return Step() if self.auto_ack else Step.hold()

    # ---- the Sink contract -------------------------------------------------------------------------

    async def start(self) -> None:
        self.started = True

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        step = self._next_step(event)
        if step.accept_after > 0:
            await self.clock.sleep(step.accept_after)
        if step.error is not None:
            self.refused.append((event, step.error))
            self._error = str(step.error) or type(step.error).__name__
            raise step.error
        self._error = ""
        self.events.append(event)
        recorded = self._recording(event, ack)
        if step.outcome is None:
            self.unacked.append((event, recorded))
        elif step.ack_after > 0:
            task = asyncio.create_task(self._ack_later(step.ack_after, step.outcome, recorded),
                                       name=f"recording-sink-{self.name}-ack")
            self._timed.add(task)
            task.add_done_callback(self._timed.discard)
        else:
            recorded(step.outcome)

    def _recording(self, event: ChangeEvent, ack: AckCallback) -> AckCallback:
        def recorded(outcome: DeliveryOutcome) -> None:
            self.acks.append((event, outcome))
            ack(outcome)

        return recorded

    async def _ack_later(self, seconds: float, outcome: DeliveryOutcome, ack: AckCallback) -> None:
        await self.clock.sleep(seconds)
        ack(outcome)

    async def flush(self, timeout: float) -> bool:
        if self._timed:
            await asyncio.wait(set(self._timed), timeout=timeout)
        return not self.unacked and not self._timed

    async def close(self) -> None:
        """Closes; acknowledgements still timed are never made (as a destination that went away)."""
        self.closed = True
        for task in list(self._timed):
            task.cancel()
        await asyncio.gather(*self._timed, return_exceptions=True)

    def healthy(self) -> bool:
        return not self.closed

    @property
    def delivery(self) -> DeliveryOptions:
        """What its attributes say when asked."""
        return DeliveryOptions(routing=self.routing_resources, buffer_capacity=self.buffer_capacity,
                               overflow_policy=OverflowPolicy(self.overflow_policy),
                               resync_period=self.resync_period,
                               heartbeat_interval=self.heartbeat_interval)

    @property
    def last_error(self) -> str:
        return "closed" if self.closed else self._error

    @property
    def in_flight(self) -> int:
        return len(self.unacked) + len(self._timed)

    # ---- reading what happened ---------------------------------------------------------------------

    def changes(self) -> list[tuple[str, str, str, bool]]:
        """(type, subject, resourceVersion, final_state_unknown) of every added, updated and deleted
        event accepted, in order (snapshot, gap and heartbeat events left out)."""
        return [(e.type.value, e.subject, e.resource_version, e.final_state_unknown)
                for e in self.events if e.type in _CHANGES]

    def outcomes(self) -> list[tuple[str, DeliveryOutcome]]:
        """(subject, outcome) of every acknowledgement made, in order."""
        return [(e.subject, outcome) for e, outcome in self.acks]


class RecordingBatchSink(RecordingSink):
    """A :class:`RecordingSink` that also takes batches (:class:`sinks.contract.BatchSink`): each
    call's size is kept in :attr:`calls`, and each event goes through ``deliver``."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.calls: list[int] = []
        """The size of every ``deliver_batch`` call, in order."""

    def has_room(self, count: int) -> bool:
        """Whether a batch would be taken without waiting (:class:`sinks.contract.Admits`): while no
        step scripted for the coming events waits before accepting (:meth:`Step.accepted_after`)."""
        return not any(step.accept_after > 0 for steps in (self._script, *self._by_subject.values())
                       for step in steps)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        self.calls.append(len(events))
        for event, ack in zip(events, acks, strict=True):
            await self.deliver(event, ack)
