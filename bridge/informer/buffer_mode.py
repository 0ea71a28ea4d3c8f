"""The mode of a listener's buffer, as an explicit state machine.

A listener (:class:`~bridge.informer.listener.ProcessorListener`) keeps what its handler has not
taken yet in memory, then on disk (its spill), then as the latest state of each object. Where a new
notification goes, and what the worker hands out next, depend on one value: its
:class:`BufferMode`. The mode changes only through :func:`next_mode`, on one of the
:class:`BufferEvent` s below, and only along the transitions of :data:`TRANSITIONS`; anything else
is a defect of the listener and raises :class:`InvalidTransition`.

The modes (what a new notification does / what the worker hands out):

* ``NORMAL``: it goes to memory. When memory is full the listener's when-full policy
  (:class:`~bridge.contracts.OverflowPolicy`, the counterpart of Vector's ``WhenFull``) decides:
  ``BLOCK`` waits for room, ``DROP`` discards it, ``COALESCE`` merges it into the pending
  notification of its object when it can, and otherwise (``SPILL``, or a change ``COALESCE`` cannot
  merge) it is written to the spill (``SPILLED``) or, with no spill or a spill that refuses it, kept
  as a latest state (``DEGRADED``). A gap or snapshot marker always goes to memory, past the
  capacity. The worker hands out memory, oldest first.
* ``CATCHING_UP``: memory is full, the listener has a spill and a running worker; the producer gives
  the worker a few turns of the event loop (``FULL_WAIT``) before the when-full policy applies
  (``WAIT_OVER`` brings it back to ``NORMAL``, then the policy decides). Lasts only inside one
  ``add`` call.
* ``SPILLING``: the spill holds older notifications, so a new one goes to the spill behind them (a
  refused one is kept as a latest state: ``DEGRADED``). The worker reads the spill back into memory
  as memory empties; once it has read the last one (``SPILL_EMPTIED``) the mode is ``NORMAL``.
* ``DEGRADED``: a notification could not be kept as it is, so every later one is kept as the latest
  state of its object (merged with the pending one when possible; markers in place), memory bounded
  by the number of objects. The worker first hands out what memory and the spill hold (older), then
  opens the listener's own gap window (``GAP_OPENED``).
* ``DRAINING_GAP``: the worker hands out the gap's begin marker, the latest states, and — once none
  is left — the end marker (``GAP_CLOSED``): back to ``NORMAL``. Notifications arriving meanwhile
  are still kept as latest states, inside the same window.
* ``CLOSED``: the listener was removed or shut down; nothing is taken in or handed out again (a
  handler call in progress finishes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["TRANSITIONS", "BufferEvent", "BufferMode", "InvalidTransition", "next_mode"]


class BufferMode(enum.Enum):
    """Where a listener's new notifications go and what its worker hands out (module docs)."""

    NORMAL = "normal"
    CATCHING_UP = "catching_up"
    SPILLING = "spilling"
    DEGRADED = "degraded"
    DRAINING_GAP = "draining_gap"
    CLOSED = "closed"


class BufferEvent(enum.Enum):
    """What happened to a listener's buffer; each may change its mode (:data:`TRANSITIONS`)."""

    FULL_WAIT = "full_wait"
    """Memory is full, a spill and a running worker exist: the producer gives the worker turns."""
    WAIT_OVER = "wait_over"
    """The producer's turns are over (room was made, or not): the when-full policy decides."""
    SPILLED = "spilled"
    """A notification was written to an empty spill."""
    SPILL_EMPTIED = "spill_emptied"
    """The worker read the spill's last notification back into memory (or lost it, unreadable)."""
    DEGRADED = "degraded"
    """A notification was kept as its object's latest state: no spill, or the spill refused it."""
    GAP_OPENED = "gap_opened"
    """Memory and spill are empty: the worker hands out the begin marker of its gap window."""
    GAP_CLOSED = "gap_closed"
    """No latest state is left: the worker hands out the end marker of its gap window."""
    CLOSED = "closed"
    """The listener is removed or shut down."""


_M = BufferMode
_E = BufferEvent

TRANSITIONS: Mapping[tuple[BufferMode, BufferEvent], BufferMode] = MappingProxyType({
    (_M.NORMAL, _E.FULL_WAIT): _M.CATCHING_UP,
    (_M.NORMAL, _E.SPILLED): _M.SPILLING,
    (_M.NORMAL, _E.DEGRADED): _M.DEGRADED,
    (_M.NORMAL, _E.CLOSED): _M.CLOSED,
    (_M.CATCHING_UP, _E.WAIT_OVER): _M.NORMAL,
    (_M.CATCHING_UP, _E.CLOSED): _M.CLOSED,
    (_M.SPILLING, _E.SPILL_EMPTIED): _M.NORMAL,
    (_M.SPILLING, _E.DEGRADED): _M.DEGRADED,
    (_M.SPILLING, _E.CLOSED): _M.CLOSED,
    (_M.DEGRADED, _E.GAP_OPENED): _M.DRAINING_GAP,
    (_M.DEGRADED, _E.CLOSED): _M.CLOSED,
    (_M.DRAINING_GAP, _E.GAP_CLOSED): _M.NORMAL,
    (_M.DRAINING_GAP, _E.CLOSED): _M.CLOSED,
})
"""Every allowed (mode, event) → next mode. A pair not listed is a defect (:class:`InvalidTransition`):
for example a spill emptied while ``DEGRADED`` changes nothing and is not reported, and nothing
leaves ``CLOSED``."""


class InvalidTransition(RuntimeError):
    """An event that cannot happen in the listener's current mode: a defect of the listener."""


def next_mode(mode: BufferMode, event: BufferEvent) -> BufferMode:
    """The mode after ``event`` in ``mode``; raises :class:`InvalidTransition` if not allowed."""
    try:
        return TRANSITIONS[(mode, event)]
    except KeyError:
        raise InvalidTransition(f"a listener buffer in mode {mode.value} cannot take the event "
                                f"{event.value}") from None
