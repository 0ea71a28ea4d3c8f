"""One informer over a fake source with two listeners: a slow one behind a small buffer and a spill,
and a fast sibling with the default options. The setup the isolation tests
(tests/informer/test_isolation.py) and the damaged-spill test (tests/hostile/test_damaged_spill.py)
share: the slow listener's handler waits on a gate while changes pile up, so its buffer overflows
into the spill (and past the spill's limit, degrades) while the fast one receives everything.

Objects are ConfigMaps in namespace ``ns`` (:func:`cm`), keyed ``ns/<name>``; the changes are made
by :func:`add_then_modify` (a few objects, many rounds of updates) or :func:`adds_then_modifies`
(one long run of changes over 50 objects).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bridge.clock import FakeClock
from bridge.contracts import EventHandler, KubeObject, ListenerOptions, NotificationHandler
from bridge.delivery.spill import SegmentSpill
from bridge.informer.registration import HandlerRegistration
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.loop import running_informer


def cm(name: str, **data: str) -> KubeObject:
    """A ConfigMap in namespace ``ns``; the fake source gives it its uid and resourceVersion."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": name},
            "data": data}


def add_then_modify(source: FakeControllerSource, *, objects: int, rounds: int) -> None:
    """Adds ``o0`` … ``o<objects-1>``, then updates each of them ``rounds`` times, round by round
    (the data ``v`` is the round's number): ``objects * (1 + rounds)`` changes."""
    for i in range(objects):
        source.add(cm(f"o{i}"))
    for round_ in range(rounds):
        for i in range(objects):
            source.modify(cm(f"o{i}", v=str(round_)))


def adds_then_modifies(source: FakeControllerSource, count: int) -> None:
    """``count`` changes: adds of ``o0`` … ``o49``, then updates of ``o<i % 50>`` (data ``v`` the
    change's index ``i``)."""
    for i in range(count):
        if i < 50:
            source.add(cm(f"o{i}"))
        else:
            source.modify(cm(f"o{i % 50}", v=str(i)))


@dataclass(frozen=True, slots=True)
class SlowAndFast:
    """The running pair: the informer (its cache is the truth both listeners should reach) and the
    slow listener's registration (its stats say what was spilled, degraded, still queued)."""

    informer: SharedIndexInformer
    slow: HandlerRegistration


@contextlib.asynccontextmanager
async def slow_beside_fast(source: FakeControllerSource, *, slow: EventHandler | NotificationHandler,
                           fast: EventHandler | NotificationHandler, gate: asyncio.Event,
                           spill: SegmentSpill, buffer_capacity: int) -> AsyncIterator[SlowAndFast]:
    """An informer named ``cm`` over ``source`` with ``slow`` (listener ``slow``: ``buffer_capacity``
    and ``spill``) and ``fast`` (listener ``fast``, default options), running and synced for the
    block. ``gate`` is what ``slow`` waits on: it is set on the way out, before the shutdown."""
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    registration = informer.add_event_handler(
        slow, ListenerOptions(name="slow", buffer_capacity=buffer_capacity, spill=spill))
    informer.add_event_handler(fast, ListenerOptions(name="fast"))
    async with running_informer(informer, release=[gate]):
        assert await informer.wait_for_cache_sync(5)
        yield SlowAndFast(informer=informer, slow=registration)
