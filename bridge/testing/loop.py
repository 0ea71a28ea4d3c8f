"""Driving the event loop in a test without the wall clock: waiting by turns, and an informer that
runs for the length of a block.

Over a :class:`~bridge.testing.fake_source.FakeControllerSource` and a fake clock, everything the
informer does happens on the event loop's turns, so a test waits for a condition by letting the loop
turn (:func:`spin_until`), never by sleeping: a passing test waits exactly as long as the work takes,
and a condition that never holds fails after a bounded number of turns, with what was awaited.

:func:`running_informer` runs :meth:`~bridge.informer.shared_informer.SharedIndexInformer.run` as a
named task for the length of an ``async with`` block, and on the way out (whatever the block raised)
releases the events the test held its handlers on, shuts the informer down and awaits its task, so
the task never outlives the test and an error the informer ended with is raised::

    gate = asyncio.Event()  # the slow handler waits on it
    async with running_informer(informer, release=[gate]):
        assert await informer.wait_for_cache_sync(5)
        source.add(obj)
        await spin_until(lambda: len(fast.calls) == 1, "the fast handler got the add")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from bridge.informer.shared_informer import SharedIndexInformer

__all__ = ["SPIN_TURNS", "running_informer", "spin_until"]

SPIN_TURNS = 20_000
"""Turns of the event loop :func:`spin_until` allows by default: far more than an informer over a
fake source needs for a few hundred changes, few enough that a condition that never holds fails in
well under a second."""


async def spin_until(condition: Callable[[], object], what: str, *, turns: int = SPIN_TURNS) -> None:
    """Lets the event loop turn (``asyncio.sleep(0)``) until ``condition()`` is true, looking before
    each turn; raises ``AssertionError`` naming ``what`` when it is still false after ``turns``
    turns. Nothing waits on the wall clock, so load on the machine cannot make it fail."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what} never became true (in {turns} turns of the event loop)")


@contextlib.asynccontextmanager
async def running_informer(informer: SharedIndexInformer, *, release: Iterable[asyncio.Event] = (),
                           shutdown_timeout: float = 2.0) -> AsyncIterator[asyncio.Task[None]]:
    """Runs ``informer`` in a task named after it for the block, and yields the task.

    On leaving the block, in this order: sets every event of ``release`` (a handler held on one
    would otherwise keep the shutdown waiting for ``shutdown_timeout``), calls ``shutdown`` with
    ``shutdown_timeout`` (loop time), and awaits the task, which raises what the informer's run
    raised. It does not wait for the cache to sync: a test that needs that says so in the block.
    """
    task = asyncio.create_task(informer.run(), name=f"test-informer-{informer.name}")
    try:
        yield task
    finally:
        for event in release:
            event.set()
        await informer.shutdown(shutdown_timeout)
        await task
