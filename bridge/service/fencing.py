"""The delivery side of fencing: a sink decorator that hands events on only while this replica leads.

With leader election the service wraps every sink in a :class:`FencedSink`. The moment leadership
ends (:meth:`bridge.kube.leaderelection.LeaderElector.is_leader` turns false at the renew deadline,
before any task runs), ``deliver`` stops handing events to the sink: it holds the listener, acks
nothing, and waits to be cancelled by the pipeline's abort, which then closes the sinks (cancelling
their sends under way). What was not acknowledged is re-sent by the next leader: at-least-once, and
never two replicas handing events to sinks at the same time.

A batch (:meth:`FencedSink.deliver_batch`) is checked once, before it is handed on: it is whatever
one listener had ready, handed to the sink without the listener running anything else, and should
the sink wait for room in its in-flight window halfway, that wait is what the pipeline's abort
cancels when leadership ends, as it cancels a single event's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, Sink, takes_batches

__all__ = ["FencedSink"]


class FencedSink:
    def __init__(self, *, inner: Sink, is_leader: Callable[[], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self._is_leader = is_leader
        self._inner_batch = inner if takes_batches(inner) else None
        self.refused = 0
        """Events not handed on because leadership had ended."""

    def __getattr__(self, item: str) -> Any:
        # Whatever else the wrapped sink has (its stats, …), for tools and tests.
        return getattr(self.inner, item)

    @property
    def delivery(self) -> DeliveryOptions:
        return self.inner.delivery

    @property
    def last_error(self) -> str:
        return self.inner.last_error

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight

    async def start(self) -> None:
        await self.inner.start()

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if not self._is_leader():
            self.refused += 1
            # Abandoned: nothing acked, nothing sent; the pipeline's abort cancels this wait.
            await asyncio.Event().wait()
        await self.inner.deliver(event, ack)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        if not self._is_leader():
            self.refused += len(events)
            await asyncio.Event().wait()  # abandoned, as in deliver
        if self._inner_batch is not None:
            await self._inner_batch.deliver_batch(events, acks)
            return
        for event, ack in zip(events, acks, strict=True):
            if not self._is_leader():
                self.refused += 1
                await asyncio.Event().wait()
            await self.inner.deliver(event, ack)

    async def flush(self, timeout: float) -> bool:
        return await self.inner.flush(timeout)

    async def close(self) -> None:
        await self.inner.close()

    def healthy(self) -> bool:
        return self.inner.healthy()
