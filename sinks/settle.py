"""What becomes of each attempt's outcome: acknowledgement, retry, dead letter, oversize cut.

A sink reports the outcome of every attempt it started (``BaseSink._settle``); this module decides:

- confirmed (None) → ``ack(DELIVERED)``, once the destination has it;
- :class:`~sinks.contract.SinkTransientError` → retried with exponential backoff and jitter
  (honouring ``retry_after``) by re-dispatching the same message after a sleep on the injected clock,
  unless the circuit breaker (:mod:`sinks.breaker`) keeps it, until ``retry.max_attempts`` /
  ``retry.max_elapsed`` give up;
- :class:`~sinks.contract.SinkMessageTooLargeError` → the ``oversize`` policy (:mod:`sinks.oversize`)
  unless it is ``dead_letter``;
- :class:`~sinks.contract.SinkPermanentError`, any other exception, or giving up → the dead-letter
  destination with the reason, ``ack(DEAD_LETTERED)`` (``DROPPED`` when there is none);
- a final :class:`~sinks.contract.DeliveryOutcome` → acked as it is.

Invariants: every accepted event is acked exactly once: a report for a message with no attempt
under way (a duplicate) is ignored, and after ``close`` nothing more is acked. Outcomes reported
while others are being settled queue behind them (no recursion through the lanes). A message of a
run that failed behind its lane's head waits in its lane again, with no attempt counted. A dead
letter that cannot be written is retried until it is: not acking keeps the checkpoint behind the
event. A bug while settling is logged, never left to strand a lane.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from bridge.clock import Clock
from sinks.breaker import CircuitBreaker
from sinks.cloudevents import encode_structured
from sinks.contract import (
    DeliveryOutcome,
    SinkMessageTooLargeError,
    SinkPermanentError,
    SinkTransientError,
)
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter
from sinks.envelope import OutgoingMessage
from sinks.malformed import quarantine_record
from sinks.options import SinkOptions
from sinks.ordering import Ordering
from sinks.oversize import cut_event, dead_letter_address
from sinks.retry import RetryPolicy
from sinks.stats import SinkStats
from sinks.window import InFlightWindow

__all__ = ["Outcome", "Settlement"]

Outcome = BaseException | DeliveryOutcome | None
"""What settles one attempt: None (confirmed), the exception, or a final outcome."""

log = logging.getLogger("sinks.base")  # the sink's own log: its retries and dead letters


class Settlement:
    """Settles the outcomes of one sink's attempts (see the module's docstring). ``dispatch``
    starts an attempt, ``spawn`` a named background task, ``size_limit`` is the destination's
    largest message when known."""

    def __init__(self, *, sink: str, options: SinkOptions, stats: SinkStats, clock: Clock,
                 policy: RetryPolicy, ordering: Ordering, window: InFlightWindow, breaker: CircuitBreaker,
                 dead_letter: DeadLetterWriter | None, dispatch: Callable[[OutgoingMessage], None],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None],
                 size_limit: Callable[[], int | None]) -> None:
        self._sink = sink
        self._options = options
        self._stats = stats
        self._clock = clock
        self._policy = policy
        self._ordering = ordering
        self._window = window
        self._breaker = breaker
        self._dead_letter = dead_letter
        self._dispatch = dispatch
        self._spawn = spawn
        self._size_limit = size_limit
        self._outcomes: deque[tuple[OutgoingMessage, Outcome]] = deque()
        self._settling = False
        self.closed = False
        """The sink closed: nothing more is acked or retried."""
        self.healthy = True
        """False since a transient failure, until a success (the sink's readiness)."""
        self.last_error = ""
        """The last transient failure, for the bridge's outage logs and readiness detail."""

    # ---- reports ----------------------------------------------------------------------------------

    def settle(self, msg: OutgoingMessage, result: Outcome) -> None:
        """The outcome of one attempt (see ``BaseSink._settle``)."""
        self._outcomes.append((msg, result))
        if not self._settling:  # else the running drain picks it up: no recursion through lanes
            self._drain()

    def settle_all(self, results: Iterable[tuple[OutgoingMessage, Outcome]]) -> None:
        """:meth:`settle` for each ``(message, outcome)`` in turn, with one call."""
        self._outcomes.extend(results)
        if not self._settling:
            self._drain()

    def _drain(self) -> None:
        self._settling = True
        try:
            outcomes = self._outcomes
            breaker = self._breaker
            settle_one = self._settle_one
            complete = self.complete
            delivered = DeliveryOutcome.DELIVERED
            while outcomes:
                item, result = outcomes.popleft()
                try:
                    if result is None and item.pending and not self.closed:
                        # _settle_one's confirmed case, inline: the common one
                        item.pending = False
                        self.healthy = True
                        if breaker.failures:
                            breaker.recovered()
                        complete(item, delivered)
                    else:
                        settle_one(item, result)
                except Exception:  # a bug here must not strand the lane and stall the checkpoint
                    log.exception("failed to settle %s", item.event_id, extra={"sink": self._sink})
        finally:
            self._settling = False

    def _settle_one(self, msg: OutgoingMessage, result: Outcome) -> None:
        if self.closed or not msg.pending:
            return  # closed (left unacked), or a duplicate report
        self._breaker.answered(msg, isinstance(result, SinkTransientError))
        msg.pending = False
        if result is None:
            self.healthy = True
            if self._breaker.failures:
                self._breaker.recovered()
            self.complete(msg, DeliveryOutcome.DELIVERED)
            return
        if isinstance(result, DeliveryOutcome):
            self.complete(msg, result)
            return
        if not msg.barrier and self._ordering.behind_head(msg):
            # It went in the run of an earlier message of its lane, which failed with it: it
            # waits in its lane (no attempt counted, no timer of its own) and goes again once
            # the messages before it settle, so one object's events never overtake each other.
            msg.attempts -= 1
            return
        if isinstance(result, SinkTransientError):
            self._transient(msg, result)
            return
        if (isinstance(result, SinkMessageTooLargeError) and self._options.oversize != "dead_letter"
                and msg.event.obj is not None and not msg.cut):
            self._spawn(self._cut_then_send(msg, result), "oversize")
            return
        if isinstance(result, SinkPermanentError):
            reason = str(result)
        else:  # a bug in a sink must not stall the checkpoint forever
            log.error("unexpected error sending %s", msg.event_id, exc_info=result,
                      extra={"sink": self._sink})
            reason = f"unexpected error: {result!r}"
        self.give_up(msg, reason)

    def _transient(self, msg: OutgoingMessage, error: SinkTransientError) -> None:
        """Retried on its own timer, kept by the breaker, or given up (its budget spent)."""
        self.healthy = False
        self.last_error = f"{type(error).__name__}: {error}"
        elapsed = self._clock.now() - msg.started
        if self._policy.give_up(msg.attempts, elapsed):
            self.give_up(msg, f"gave up after {msg.attempts} attempts over {elapsed:.1f}s: {error}")
            if msg is self._breaker.probe:
                self._breaker.probe_failed(None, self.last_error)
            return
        if self._breaker.takes(msg, error, self.last_error):
            return
        self._stats.retries += 1
        delay = self._policy.delay(msg.attempts, error.retry_after)
        log.debug("retrying %s in %.3fs: %s", msg.event_id, delay, error, extra={"sink": self._sink})
        self._spawn(self._retry_later(msg, delay), "retry")

    async def _retry_later(self, msg: OutgoingMessage, delay: float) -> None:
        await self._clock.sleep(delay)
        if not self.closed:
            self._dispatch(msg)

    # ---- final outcomes ---------------------------------------------------------------------------

    def complete(self, msg: OutgoingMessage, outcome: DeliveryOutcome) -> None:
        """``msg``'s final outcome: the next of its lane begins, the window has room, it is acked."""
        self._ordering.settled(msg)
        self._window.leave()
        if outcome is DeliveryOutcome.DELIVERED:
            self._stats.delivered += 1
        try:
            msg.ack(outcome)
        except Exception:
            log.exception("ack callback failed for %s", msg.event_id, extra={"sink": self._sink})

    def give_up(self, msg: OutgoingMessage, reason: str) -> None:
        """``msg`` to the dead letter with ``reason``, then acked (in a task of its own)."""
        self._spawn(self._dead_letter_then_complete(msg, reason), "dead-letter")

    async def _dead_letter_then_complete(self, msg: OutgoingMessage, reason: str) -> None:
        msg.pending = True
        try:
            outcome = await self.to_dead_letter(msg, reason)
        except Exception:  # a bug here must not strand the lane and stall the checkpoint
            log.exception("failed to process %s; dropping it", msg.event_id, extra={"sink": self._sink})
            self._stats.failed += 1
            outcome = DeliveryOutcome.DROPPED
        self.settle(msg, outcome)

    async def to_dead_letter(self, msg: OutgoingMessage, reason: str,
                             record: DeadLetterRecord | None = None) -> DeliveryOutcome:
        """``msg`` (or ``record``, when given) to the dead letter, retried until it is written."""
        writer = self._dead_letter
        if writer is None:
            log.warning("dropping %s (no dead letter): %s", msg.event_id, reason, extra={"sink": self._sink})
            self._stats.failed += 1
            return DeliveryOutcome.DROPPED
        record = record or DeadLetterRecord(
            sink=self._sink, reason=reason, attempts=msg.attempts, time=self._clock.wall(),
            event_id=msg.event_id, key=msg.key, destination=msg.destination, headers=msg.headers,
            body=msg.body if msg.body else encode_structured({"id": msg.event_id, "error": reason}),
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                await writer.write(record)
            except Exception as exc:
                # Not acking keeps the checkpoint behind this event until the dead letter works.
                log.warning("dead letter write failed (%r); retrying", exc, extra={"sink": self._sink})
                await self._clock.sleep(self._policy.delay(attempt))
            else:
                self._stats.dead_lettered += 1
                return DeliveryOutcome.DEAD_LETTERED

    # ---- before or instead of an attempt ----------------------------------------------------------

    async def quarantine_then_send(self, msg: OutgoingMessage) -> None:
        """A malformed object's bytes (or identity) to the dead letter, then its event to the stream."""
        try:
            record = quarantine_record(self._sink, msg.event, msg.quarantine, event_id=msg.event_id,
                                       key=msg.key, destination=msg.destination, headers=msg.headers,
                                       now=self._clock.wall())
            await self.to_dead_letter(msg, "", record)
        except Exception:  # a bug here must not strand the lane: the event still goes
            log.exception("cannot dead-letter malformed object %s", msg.event_id, extra={"sink": self._sink})
        msg.quarantine = b""
        msg.pending = False
        if not self.closed:
            self._dispatch(msg)

    async def _cut_then_send(self, msg: OutgoingMessage, error: SinkMessageTooLargeError) -> None:
        """The ``oversize`` policy: the whole event to the dead letter, then the cut event (the
        object's identity and resourceVersion, and what was cut) in its place on the stream."""
        msg.pending = True
        policy = self._options.oversize
        size = len(msg.body)
        address = dead_letter_address(self._options.dead_letter)
        try:
            if self._dead_letter is not None:
                await self.to_dead_letter(msg, f"{error}; the stream got a {policy} event instead")
            limit = error.limit if error.limit is not None else self._size_limit()
            headers, body = cut_event(msg, policy=policy, limit=limit, size=size, address=address,
                                      structured=self._options.content_mode == "structured")
        except Exception:  # a bug here must not strand the lane and stall the checkpoint
            log.exception("cannot cut oversized event %s", msg.event_id, extra={"sink": self._sink})
            self.settle(msg, DeliveryOutcome.DROPPED)
            return
        log.warning("event %s of %s is %d bytes, more than the destination takes (%s): sending a %s "
                    "event in its place%s", msg.event_id, msg.event.subject, size, error, policy,
                    f", the whole event is in {address}" if self._dead_letter else
                    " (no dead letter configured: the whole event is not kept)", extra={"sink": self._sink})
        msg.headers, msg.body, msg.cut = headers, body, True
        msg.pending = False
        if not self.closed:
            self._dispatch(msg)

    def close(self) -> None:
        self.closed = True
        self._outcomes.clear()

