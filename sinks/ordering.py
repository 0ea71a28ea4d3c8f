"""Per-object order: one lane per object, and snapshot / gap markers as barriers.

A lane is a FIFO per object (resource + namespace/name). Only a lane's head is being sent; the next
event of that object starts when the head is settled, so one object's events are sent strictly in
order while different objects proceed concurrently, and one object stuck in retries holds back
nothing but itself. A sink that sends several messages in one request (the webhook's batches) may
take a *run* (:meth:`Ordering.run`): the head and the messages queued behind it, in order, in that one
request; the others of a run that failed wait in their lane again and go after the head settles.

Markers (events without an object) are *barriers*: a ``snapshot.begin`` / ``snapshot.end`` is sent
only after every event accepted before it, and events accepted after it wait for it (in the *gate*),
so a consumer sees a snapshot's ``sync`` events between its markers even when some were retried.

Invariants: ``admitted`` counts the messages in lanes not yet settled (a marker starts only at zero);
a message is started (``begin``) when it heads its lane or is the gate's head with nothing admitted,
never twice for one head; everything here runs on the event loop, without awaiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice

from sinks.envelope import OutgoingMessage

__all__ = ["Ordering"]


class Ordering:
    """The lanes and the gate of one sink; ``begin`` starts a message that may go now."""

    __slots__ = ("_begin", "admitted", "gate", "lanes")

    def __init__(self, *, begin: Callable[[OutgoingMessage], None]) -> None:
        self._begin = begin
        self.lanes: dict[str, deque[OutgoingMessage]] = {}
        """Per object: the messages not yet settled, the head being sent (or waiting to retry)."""
        self.admitted = 0
        """Messages admitted into lanes and not yet settled (a marker waits for zero)."""
        self.gate: deque[OutgoingMessage] = deque()
        """A marker waiting for (or being sent after) everything before it, then what came after."""

    def accept(self, msg: OutgoingMessage) -> None:
        """A new message: behind the gate when something waits there, a marker into the gate (begun
        once nothing is admitted), any other into its lane."""
        gate = self.gate
        if gate:  # something waits behind a marker: so does this event
            msg.barrier = msg.event.obj is None
            gate.append(msg)
            return
        if msg.event.obj is None:
            # A marker: after everything accepted so far, before everything accepted later.
            msg.barrier = True
            gate.append(msg)
            if self.admitted == 0:
                self._begin(msg)
            return
        self.admit(msg)

    def admit(self, msg: OutgoingMessage) -> None:
        """Into the event's lane; begun at once when the lane was empty."""
        if self.enter(msg):
            self._begin(msg)

    def enter(self, msg: OutgoingMessage) -> bool:
        """Into the event's lane, counted as admitted: True when it heads the lane (the caller
        starts it), False when it waits behind the lane's head."""
        self.admitted += 1
        key = msg.lane
        lane = self.lanes.get(key)
        if lane is not None:
            lane.append(msg)
            return False
        self.lanes[key] = deque((msg,))
        return True

    def behind_head(self, msg: OutgoingMessage) -> bool:
        """True when ``msg`` is in its lane behind another message (it went in that one's run)."""
        lane = self.lanes.get(msg.lane)
        return lane is not None and lane[0] is not msg

    def run(self, head: OutgoingMessage, limit: int, max_bytes: int,
            now: Callable[[], float]) -> list[OutgoingMessage]:
        """``head`` (being dispatched) and, when it heads its lane, the lane's messages queued behind
        it, in order, up to ``limit`` messages (and ``max_bytes`` beyond the head's, 0: no bound) and
        the first one that cannot go in the same request (another destination, or one for the dead
        letter); each marked as under way (one attempt more, started at ``now()`` if its first)."""
        run = [head]
        lane = self.lanes.get(head.lane)
        if lane is None or lane[0] is not head or head.cut:  # a cut event goes alone: it must fit
            return run
        started = 0.0
        size = len(head.body)
        for msg in islice(lane, 1, limit):
            if msg.pending or msg.error is not None or msg.quarantine or msg.destination != head.destination:
                break
            size += len(msg.body)
            if max_bytes and size > max_bytes:
                break
            msg.attempts += 1
            if msg.attempts == 1:
                msg.started = started = started or now()
            msg.pending = True
            run.append(msg)
        return run

    def settled(self, msg: OutgoingMessage) -> None:
        """``msg`` has its final outcome: the next of its lane (or what waited behind a marker) begins."""
        if msg.barrier:
            gate = self.gate
            if gate and gate[0] is msg:
                gate.popleft()
            self.release()
            return
        lanes = self.lanes
        lane = lanes[msg.lane] if msg.lane in lanes else None  # noqa: SIM401 - no call per message
        if lane is not None and lane and lane[0] is msg:
            lane.popleft()
            if lane:
                self._begin(lane[0])
            else:
                del lanes[msg.lane]
        self.admitted -= 1
        if self.admitted == 0 and self.gate:
            self.release()

    def release(self) -> None:
        """After a marker completed: admits what waited behind it, up to the next marker."""
        gate = self.gate
        while gate:
            head = gate[0]
            if head.barrier:
                if self.admitted == 0:
                    self._begin(head)
                return
            gate.popleft()
            self.admit(head)

    def clear(self) -> None:
        self.lanes.clear()
        self.gate.clear()
