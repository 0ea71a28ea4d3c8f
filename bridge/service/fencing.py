"""The delivery side of fencing: the stage that hands changes on only while this replica leads.

With leader election the service ends every sink's delivery chain (:mod:`bridge.delivery.chain`)
with a :class:`FenceStage`, the last stage before the sink, so that nothing reaches the sink once
leadership ended, whatever an earlier stage held (an Events repetition released by its coalescing
window). The moment leadership ends (:meth:`bridge.kube.leaderelection.LeaderElector.is_leader`
turns false at the renew deadline, before any task runs), the stage stops handing changes on: it
holds the listener (or the stage's timer), acks nothing, and waits to be cancelled by the pipeline's
abort, which then closes the sinks (cancelling their sends under way). What was not acknowledged is
re-sent by the next leader: at-least-once, and never two replicas handing events to sinks at the
same time.

A batch is checked once, before it is handed on: it is whatever one listener had ready, handed to
the sink without the listener running anything else, and should the sink wait for room in its
in-flight window halfway, that wait is what the pipeline's abort cancels when leadership ends, as
it cancels a single event's. For a sink without ``deliver_batch`` the chain runs once per event,
so the check comes before each event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from bridge.delivery.chain import HandOn
from sinks.contract import AckCallback, ChangeEvent

__all__ = ["FenceStage"]


class FenceStage:
    """Hands changes on while ``is_leader()``; refuses for good (unacknowledged) once it is not."""

    name = "fence"
    reads = ("(the elector's is_leader)",)
    adds = ("refuses every change once leadership ended: nothing handed on, nothing acknowledged",)

    def __init__(self, *, is_leader: Callable[[], bool]) -> None:
        self._is_leader = is_leader
        self.refused = 0
        """Events not handed on because leadership had ended."""

    async def start(self, hand_on: HandOn) -> None:
        pass

    def has_room(self, count: int) -> bool:
        """While leading: the fence waits only once leadership ended (:class:`~sinks.contract.Admits`)."""
        return self._is_leader()

    async def process(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                      hand_on: HandOn) -> None:
        if not self._is_leader():
            self.refused += len(events)
            # Abandoned: nothing acked, nothing sent; the pipeline's abort cancels this wait.
            await asyncio.Event().wait()
        await hand_on(events, acks)

    async def flush(self, hand_on: HandOn) -> None:
        pass

    async def close(self) -> None:
        pass
