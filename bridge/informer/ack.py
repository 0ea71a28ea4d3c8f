"""The acknowledgement of which only the first call counts.

A handler or a sink may call an acknowledgement twice (a retry racing its first success, a batch
failing after it acknowledged part of itself); the checkpoint must see each notification, and a sink
adapter each event, acknowledged exactly once. Every place that hands out an acknowledgement — the
listener (:mod:`bridge.informer.listener`) and the sink adapter of the delivery layer — builds it
with :func:`ack_once` rather than writing the guard again.

The helper costs one closure and one call more than the guard written inline: it runs once per
notification, so it takes its bound argument directly instead of through a ``functools.partial``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

__all__ = ["ack_once"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


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
