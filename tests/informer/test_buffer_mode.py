"""The listener buffer's mode: every transition of the state machine, in the table and in a listener.

The first table is the whole of :data:`~bridge.informer.buffer_mode.TRANSITIONS`, written out: each
allowed (mode, event) and where it leads; every other pair is refused. The second drives a real
:class:`~bridge.informer.listener.ProcessorListener` (real spill on disk) through each transition and
reads its mode before and after.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import AckFunc, ListenerOptions, Notification, NotificationKind, ObjectKey
from bridge.delivery.spill import SegmentSpill, encode_notification
from bridge.informer.buffer_mode import TRANSITIONS, BufferEvent, BufferMode, InvalidTransition, next_mode
from bridge.informer.listener import ProcessorListener
from bridge.testing.loop import spin_until

M, E = BufferMode, BufferEvent

ALLOWED = [
    # mode, event, next mode — why
    (M.NORMAL, E.FULL_WAIT, M.CATCHING_UP),  # memory full, a spill and a worker: give it turns
    (M.NORMAL, E.SPILLED, M.SPILLING),  # memory full: the overflow goes to disk
    (M.NORMAL, E.DEGRADED, M.DEGRADED),  # memory full, no spill: latest states
    (M.NORMAL, E.CLOSED, M.CLOSED),
    (M.CATCHING_UP, E.WAIT_OVER, M.NORMAL),  # then the when-full policy decides
    (M.CATCHING_UP, E.CLOSED, M.CLOSED),
    (M.SPILLING, E.SPILL_EMPTIED, M.NORMAL),  # the backlog on disk is read back
    (M.SPILLING, E.DEGRADED, M.DEGRADED),  # the spill is full
    (M.SPILLING, E.CLOSED, M.CLOSED),
    (M.DEGRADED, E.GAP_OPENED, M.DRAINING_GAP),  # what was older is delivered: the window opens
    (M.DEGRADED, E.CLOSED, M.CLOSED),
    (M.DRAINING_GAP, E.GAP_CLOSED, M.NORMAL),  # no latest state left: the window closes
    (M.DRAINING_GAP, E.CLOSED, M.CLOSED),
]


@pytest.mark.parametrize(("mode", "event", "after"), ALLOWED,
                         ids=[f"{m.value}-{e.value}" for m, e, _ in ALLOWED])
def test_an_allowed_transition_leads_where_the_table_says(mode: BufferMode, event: BufferEvent,
                                                          after: BufferMode) -> None:
    assert next_mode(mode, event) is after


def test_the_table_holds_exactly_these_transitions() -> None:
    assert dict(TRANSITIONS) == {(m, e): a for m, e, a in ALLOWED}


REFUSED = [(m, e) for m, e in itertools.product(BufferMode, BufferEvent) if (m, e) not in TRANSITIONS]


@pytest.mark.parametrize(("mode", "event"), REFUSED, ids=[f"{m.value}-{e.value}" for m, e in REFUSED])
def test_any_other_event_is_a_defect(mode: BufferMode, event: BufferEvent) -> None:
    with pytest.raises(InvalidTransition, match=f"mode {mode.value} cannot take the event {event.value}"):
        next_mode(mode, event)


# -------------------------------------------------------------------------------------------------
# the same transitions, in a listener


def change(i: int) -> Notification:
    obj: dict[str, Any] = {"metadata": {"namespace": "ns", "name": f"o{i}", "resourceVersion": str(i + 1)}}
    return Notification(kind=NotificationKind.ADD, obj=obj, key=ObjectKey(f"ns/o{i}"), seq=i)


class Gated:
    """A notification handler that holds the calls ``hold`` picks (every one by default) until
    ``gate`` is set; records what it got."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.seen: list[Notification] = []
        self.hold: Callable[[Notification], bool] = lambda _n: True

    async def handle(self, n: Notification, ack: AckFunc) -> None:
        self.seen.append(n)
        self.entered.set()
        if self.hold(n):
            await self.gate.wait()
        ack()


def gap_marker(n: Notification) -> bool:
    return n.kind is NotificationKind.GAP


def mode(case: Case) -> BufferMode:
    """The listener's mode now (a function, so a check after an await is not narrowed away)."""
    return case.listener.mode


class Case:
    """A listener with memory for one notification; a spill when ``spill_records`` is given (room
    for that many records of :func:`change`)."""

    def __init__(self, tmp_path: Path, *, spill_records: int | None) -> None:
        self.handler = Gated()
        spill = None
        if spill_records is not None:
            record = 8 + len(encode_notification(change(0)))
            spill = SegmentSpill(tmp_path / "spill", limit_bytes=record * spill_records)
        self.listener = ProcessorListener(handler=self.handler, options=ListenerOptions(
            name="l", buffer_capacity=1, spill=spill), clock=FakeClock(), name="l")

    async def fill(self, count: int) -> None:
        for i in range(count):
            await self.listener.add(change(i))

    async def drained(self) -> None:
        self.handler.gate.set()
        await asyncio.wait_for(self.listener.wait_drained(), 5)

    async def catching_up(self) -> asyncio.Task[None]:
        """Started, the worker held on the first change, memory full: a third change waits."""
        self.listener.start()
        await self.fill(1)
        await asyncio.wait_for(self.handler.entered.wait(), 5)
        await self.listener.add(change(1))
        adding = asyncio.create_task(self.listener.add(change(2)), name="test-add")
        await spin_until(lambda: mode(self) is M.CATCHING_UP, "catching up", turns=5000)
        return adding

    async def draining_gap(self) -> None:
        """No spill: degraded, then the handler holds the gap's begin marker."""
        self.handler.hold = gap_marker
        await self.fill(3)
        assert mode(self) is M.DEGRADED
        self.listener.start()
        await spin_until(lambda: len(self.handler.seen) == 2, "the gap's begin marker handed out", turns=5000)
        assert self.handler.seen[-1].kind is NotificationKind.GAP
        assert mode(self) is M.DRAINING_GAP


Scenario = Callable[[Case], Awaitable[None]]


async def full_wait_then_room(case: Case) -> None:
    adding = await case.catching_up()  # NORMAL → CATCHING_UP
    case.handler.gate.set()  # the worker makes room: WAIT_OVER, then memory takes it
    await adding
    assert mode(case) is M.NORMAL
    assert case.listener.stats().spilled == 0


async def full_wait_then_spilled(case: Case) -> None:
    adding = await case.catching_up()
    await adding  # the worker finished nothing: WAIT_OVER → NORMAL, then SPILLED
    assert mode(case) is M.SPILLING
    await case.drained()


async def spilled(case: Case) -> None:
    await case.fill(1)
    assert mode(case) is M.NORMAL
    await case.fill(2)  # no worker yet: memory full, the second one spills
    assert mode(case) is M.SPILLING


async def spill_emptied(case: Case) -> None:
    await case.fill(3)
    assert mode(case) is M.SPILLING
    case.listener.start()
    await case.drained()
    assert mode(case) is M.NORMAL
    assert [n.seq for n in case.handler.seen] == [0, 1, 2]


async def degraded_without_spill(case: Case) -> None:
    await case.fill(2)
    assert mode(case) is M.DEGRADED


async def degraded_spill_full(case: Case) -> None:
    await case.fill(2)  # one in memory, one in the spill (room for one record)
    assert mode(case) is M.SPILLING
    await case.listener.add(change(2))
    assert mode(case) is M.DEGRADED


async def gap_opened_then_closed(case: Case) -> None:
    await case.draining_gap()
    await case.drained()
    assert mode(case) is M.NORMAL
    kinds = [(n.kind, n.gap.end if n.gap else None) for n in case.handler.seen]
    add, gap = NotificationKind.ADD, NotificationKind.GAP
    assert kinds == [(add, None), (gap, False), (add, None), (add, None), (gap, True)]


async def draining_gap_held(case: Case) -> None:
    await case.draining_gap()
    await case.drained()


def closing(into: Scenario | None) -> Scenario:
    async def scenario(case: Case) -> None:
        if into is not None:
            await into(case)
        before = case.listener.mode
        case.listener.close()
        assert mode(case) is M.CLOSED, before
        case.handler.gate.set()
        if case.listener.task is not None:
            await asyncio.wait_for(case.listener.task, 5)
    return scenario


async def close_catching_up(case: Case) -> None:
    adding = await case.catching_up()
    case.listener.close()
    assert mode(case) is M.CLOSED
    await adding  # the producer is released, nothing queued
    case.handler.gate.set()
    assert case.listener.task is not None
    await asyncio.wait_for(case.listener.task, 5)


async def close_draining_gap(case: Case) -> None:
    await case.draining_gap()
    case.listener.close()
    assert mode(case) is M.CLOSED
    case.handler.gate.set()
    assert case.listener.task is not None
    await asyncio.wait_for(case.listener.task, 5)
    assert len(case.handler.seen) == 2  # nothing after the call in progress


LISTENER_CASES: list[tuple[str, int | None, Scenario]] = [
    ("normal-full_wait-catching_up-wait_over-normal", 100, full_wait_then_room),
    ("catching_up-wait_over-normal-spilled-spilling", 100, full_wait_then_spilled),
    ("normal-spilled-spilling", 100, spilled),
    ("spilling-spill_emptied-normal", 100, spill_emptied),
    ("normal-degraded-degraded", None, degraded_without_spill),
    ("spilling-degraded-degraded", 1, degraded_spill_full),
    ("degraded-gap_opened-draining_gap", None, draining_gap_held),
    ("draining_gap-gap_closed-normal", None, gap_opened_then_closed),
    ("normal-closed", 100, closing(None)),
    ("catching_up-closed", 100, close_catching_up),
    ("spilling-closed", 100, closing(spilled)),
    ("degraded-closed", None, closing(degraded_without_spill)),
    ("draining_gap-closed", None, close_draining_gap),
]


@pytest.mark.parametrize(("spill_records", "scenario"), [c[1:] for c in LISTENER_CASES],
                         ids=[c[0] for c in LISTENER_CASES])
async def test_a_listener_takes_each_transition(tmp_path: Path, spill_records: int | None,
                                                scenario: Scenario) -> None:
    case = Case(tmp_path, spill_records=spill_records)
    try:
        await scenario(case)
    finally:
        case.handler.gate.set()
        case.listener.close()
        if case.listener.task is not None:
            await asyncio.wait_for(case.listener.task, 5)


def test_every_allowed_transition_has_a_listener_case() -> None:
    named = " ".join(c[0] for c in LISTENER_CASES)
    for mode, event, after in ALLOWED:
        assert f"{mode.value}-{event.value}-{after.value}" in named or (
            event is E.CLOSED and f"{mode.value}-closed" in named), (mode, event)
