"""The acknowledgement of which only the first call counts.

A handler or a sink may call an acknowledgement twice (a retry racing its first success, a batch
failing after it acknowledged part of itself); the checkpoint must see each notification, and a sink
adapter each event, acknowledged exactly once. Every place that hands out an acknowledgement — the
listener (:mod:`bridge.informer.listener`) and the sink adapter of the delivery layer — builds it
here rather than writing its own closure:

* :func:`ack_once` — one acknowledgement (a closure around a flag);
* :func:`batch_acks` — the acknowledgements of a whole batch at once, for the per-notification
  path: one ``functools.partial`` per item over one shared ``bytearray`` of flags, and no Python
  frame of its own between the caller and what the acknowledgement does. Its function receives the
  flags and the item's index and makes the first-call check itself (:data:`BatchAckFunc`), so an
  acknowledgement costs one Python call, against three for an :func:`ack_once` around a bookkeeping
  method (building it, calling it, and the method it calls).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["BatchAckFunc", "ack_once", "batch_acks"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

BatchAckFunc = Callable[[Sequence[T], bytearray, int, Unpack[Ts]], None]
"""What a batch's acknowledgement runs: ``fn(items, called, index, *args)``. It must begin with the
first-call check, ``if called[index]: return`` then ``called[index] = 1`` (written inline, not as a
helper: that would be a call more per acknowledgement), and only then act on ``items[index]``."""


def ack_once(fn: Callable[[T, Unpack[Ts]], None], bound: T) -> Callable[[Unpack[Ts]], None]:
    """A function whose first call runs ``fn(bound, *args)``; every later call returns at once.

    ``bound`` is what the acknowledgement is of (a notification's ``seq``, an event's index, the
    acknowledgement to pass on); ``args`` are what the caller reports with it (a sink's outcome).
    """
    done = False

    def ack(*args: *Ts) -> None:
        nonlocal done
        if done:
            return
        done = True
        fn(bound, *args)

    return ack


def batch_acks(fn: BatchAckFunc[T, *Ts], items: Sequence[T]) -> list[Callable[[Unpack[Ts]], None]]:
    """One acknowledgement per item of ``items``, in order: calling the i-th runs
    ``fn(items, called, i, *args)``, where ``called`` (one flag per item, shared by the batch) lets
    ``fn`` act on the first call only (:data:`BatchAckFunc`). ``items`` is not copied: the caller
    must not change it while an acknowledgement may still be called."""
    called = bytearray(len(items))
    # The checker's partial cannot bind arguments ahead of a TypeVarTuple: typed by the signature.
    target: Callable[..., None] = fn
    acks: list[Any] = [partial(target, items, called, i) for i in range(len(items))]
    return acks

