"""How a listener hands a batch to its handler: the call's shape, its acknowledgements, its failures.

A listener (:class:`~bridge.informer.listener.ProcessorListener`) takes what is ready and hands it
over as one batch; :class:`HandlerCall` turns that batch into the call the handler understands, once
decided at construction:

* a :class:`~bridge.contracts.BatchNotificationHandler` gets ``handle_batch`` (``handle`` for a
  batch of one), each notification with its own ``ack``;
* a :class:`~bridge.contracts.NotificationHandler` gets ``handle`` (its batches are of one);
* a plain :class:`~bridge.contracts.EventHandler` gets ``on_add``/``on_update``/``on_delete`` (a
  snapshot as one resync update per object, a gap marker not at all) and is acknowledged when the
  method returns.

A batch's acks are built at once by :func:`~bridge.informer.ack.batch_acks`: only the first call of
each counts, and it runs the listener's bookkeeping with no frame in between. A call that
raises is counted and logged, and acknowledges what it had not (a broken handler must not stall
every checkpoint); a batch interrupted at one notification (:class:`~bridge.contracts.BatchInterrupted`)
acknowledges that one and the rest is handed over again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from bridge.contracts import (
    AckFunc,
    BatchInterrupted,
    DeletedFinalStateUnknown,
    EventHandler,
    Notification,
    NotificationHandler,
    NotificationKind,
    ReadyNotificationHandler,
)
from bridge.informer.ack import BatchAckFunc, batch_acks

__all__ = ["HandlerCall"]

log = logging.getLogger(__name__)

_BatchHandle = Callable[[Sequence[Notification], Sequence[AckFunc]], Awaitable[None]]


class HandlerCall:
    """Hands batches to one handler (module docs); ``acked(batch, called, index)`` runs on each call
    of an ack (:data:`~bridge.informer.ack.BatchAckFunc`: it makes the first-call check)."""

    def __init__(self, *, handler: EventHandler | NotificationHandler, acked: BatchAckFunc[Notification],
                 name: str) -> None:
        self.name = name
        self._acked = acked
        # Decided once: a runtime-checkable Protocol isinstance check is far too slow per call.
        self._handle: Callable[[Notification, AckFunc], Awaitable[None]] | None = None
        self._event_handler: EventHandler | None = None
        if isinstance(handler, NotificationHandler):
            self._handle = handler.handle
        else:
            self._event_handler = handler
        # Looked up on the type: a wrapper forwarding unknown attributes to what it wraps must not
        # have its own ``handle`` bypassed.
        self._handle_batch: _BatchHandle | None = None
        if self._handle is not None and callable(getattr(type(handler), "handle_batch", None)):
            self._handle_batch = handler.handle_batch  # type: ignore[union-attr]
        self.ready_for: Callable[[Sequence[Notification]], bool] | None = None
        """The handler's own ``ready_for``, when it has one (:class:`~bridge.contracts.
        ReadyNotificationHandler`): whether a batch would be handled without waiting."""
        if self._handle_batch is not None and issubclass(type(handler), ReadyNotificationHandler):
            self.ready_for = handler.ready_for  # type: ignore[union-attr]
        self.busy = False
        """True while a call is running."""
        self.in_hand = 0
        """Notifications of the batch in the call, its first excepted (they count as waiting)."""
        self.delivered = 0
        """Notifications handed over whose call returned without raising."""
        self.errors = 0

    @property
    def takes_batches(self) -> bool:
        """True when the handler takes several notifications in one call."""
        return self._handle_batch is not None

    async def deliver(self, batch: list[Notification]) -> None:
        """Hands ``batch`` over, each notification with an ack that counts once. Never raises but
        for cancellation: the handler's failures are counted, logged and acknowledged."""
        acks = batch_acks(self._acked, batch)
        count = len(batch)
        start = delivered = 0
        self.busy = True
        try:
            while start < count:
                self.in_hand = count - start - 1
                try:
                    if count == 1:
                        handle = self._handle
                        if handle is not None:
                            await handle(batch[0], acks[0])
                        else:
                            await self._call_event_handler(batch[0])
                            acks[0]()
                    else:
                        handle_batch = self._handle_batch
                        assert handle_batch is not None  # other handlers get batches of one
                        await handle_batch(batch[start:] if start else batch, acks[start:] if start else acks)
                    delivered += count - start
                    break
                except asyncio.CancelledError:
                    raise
                except BatchInterrupted as exc:
                    delivered += exc.index
                    start = self._interrupted(batch, acks, start, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._failed(batch, acks, start)
        finally:
            self.busy = False
            self.in_hand = 0
            self.delivered += delivered

    def _interrupted(self, batch: list[Notification], acks: list[AckFunc], start: int,
                     exc: BatchInterrupted) -> int:
        """Acknowledges and counts the notification a batch call stopped at; the next to hand over."""
        failed = start + exc.index
        if not start <= failed < len(batch):
            raise RuntimeError(f"handle_batch reported index {exc.index} of a batch of "
                               f"{len(batch) - start}") from exc
        self.errors += 1
        n = batch[failed]
        log.error("handler failed on %s of %r (seq %d); carrying on", n.kind.value, n.key, n.seq,
                  exc_info=exc.__cause__ or exc, extra={"listener": self.name})
        acks[failed]()
        return failed + 1

    def _failed(self, batch: list[Notification], acks: list[AckFunc], start: int) -> None:
        """A call raised: counted, logged, and every notification of it acknowledged."""
        self.errors += 1
        first = batch[start]
        if start == len(batch) - 1:
            log.exception("handler failed on %s of %r (seq %d); carrying on",
                          first.kind.value, first.key, first.seq, extra={"listener": self.name})
        else:
            log.exception("handler failed on a batch of %d notifications (seq %d to %d); carrying on",
                          len(batch) - start, first.seq, batch[-1].seq, extra={"listener": self.name})
        for ack in acks[start:]:
            ack()

    async def _call_event_handler(self, n: Notification) -> None:
        handler = self._event_handler
        assert handler is not None
        if n.kind is NotificationKind.ADD:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            await handler.on_add(n.obj, n.is_in_initial_list)
        elif n.kind is NotificationKind.UPDATE:
            assert not isinstance(n.obj, DeletedFinalStateUnknown)
            await handler.on_update(n.old if n.old is not None else n.obj, n.obj)
        elif n.kind is NotificationKind.DELETE:
            await handler.on_delete(n.obj)
        elif n.kind is NotificationKind.SNAPSHOT:
            await self._snapshot_as_updates(handler, n)
        # GAP: no counterpart in client-go's handler interface

    async def _snapshot_as_updates(self, handler: EventHandler, n: Notification) -> None:
        """A snapshot reaches a plain handler as one resync update per object; one object's failure
        does not hide the others."""
        failures = 0
        for obj in n.snapshot or ():
            try:
                await handler.on_update(obj, obj)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                self.errors += 1
                log.exception("handler failed on snapshot object (seq %d)",
                              n.seq, extra={"listener": self.name})
        if failures:
            log.warning("%d snapshot objects failed (seq %d)", failures, n.seq,
                        extra={"listener": self.name})
