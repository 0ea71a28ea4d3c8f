"""After a restart, the acknowledgements of one sink's notifications in the order its objects need.

A sink with a replay stage (:mod:`bridge.delivery.replay`) has some notifications acknowledged
without delivery (the replay held them back); :class:`PerObjectAcks` holds each of those behind the
same object's notifications still in flight to the sink, so an acknowledgement never claims a state
the sink's destination does not hold (the class's invariant). Used by
:class:`~bridge.delivery.sink_listener.SinkListener`.
"""

from __future__ import annotations

from bridge.contracts import AckFunc

__all__ = ["PerObjectAcks"]


class PerObjectAcks:
    """Per object, the notifications handed to the sink and not yet acknowledged, and behind them
    the acknowledgements of the object's notifications the replay stage held back.

    **Invariant** (the sink's own progress, section 3 of docs/delivery-contract.md): a sink
    acknowledges an object's changes in order, so what it acknowledged of an object past its resume
    point is what its destination holds, and a restart skips that object's older changes. A change
    the replay holds back (coalesced by a relist, or newer than a delete already sent) is
    acknowledged without delivery; acknowledged while an earlier change of the object is still in
    flight to a frozen sink, it would claim a state the destination does not hold, and after the
    next crash the changes before it would be skipped for good (issue 34). So it is acknowledged
    only once nothing of its object is in flight."""

    __slots__ = ("_announce", "_out", "_waiting")

    def __init__(self) -> None:
        self._out: dict[str, int] = {}
        self._waiting: dict[str, list[AckFunc]] = {}
        self._announce: dict[str, list[AckFunc]] = {}
        """Per object, the acknowledgements of changes a relist coalesced, held back until the next
        notification of the object handed over (the relisted state framed by their window) is
        acknowledged: before, the base would pass them while a frozen sink has neither them nor
        the window naming them, and a restart relisting from there would never name them."""

    def handed(self, key: str, ack: AckFunc) -> AckFunc:
        """``ack`` of a notification of ``key`` handed to the sink, counted until it is called."""
        self._out[key] = self._out.get(key, 0) + 1
        if (announced := self._announce.pop(key, None)) is not None:
            self._waiting.setdefault(key, []).extend(announced)
        called = False

        def done() -> None:
            nonlocal called
            if called:
                return
            called = True
            ack()
            left = self._out[key] - 1
            if left:
                self._out[key] = left
                return
            del self._out[key]
            for waiting in self._waiting.pop(key, ()):
                waiting()

        return done

    def without_delivery(self, key: str, ack: AckFunc, *, announced_later: bool = False) -> None:
        """Acknowledges now, or once the object's notifications in flight are acknowledged;
        ``announced_later`` (a change a relist coalesced): once the next one handed over is."""
        if announced_later:
            self._announce.setdefault(key, []).append(ack)
        elif key in self._out:
            self._waiting.setdefault(key, []).append(ack)
        else:
            ack()
