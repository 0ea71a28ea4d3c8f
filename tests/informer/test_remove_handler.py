"""Removing an event handler while it works: the call in progress finishes, nothing after it runs.

client-go 1.36 (``tools/cache/shared_informer.go``): ``sharedProcessor.removeListener`` only closes
the listener's ``addCh`` (line 1088); ``processorListener.pop`` then returns and closes ``nextCh``
(line 1298, "Tell .run() to stop"), so ``run``'s ``for next := range p.nextCh`` (line 1338) ends after
the handler call it is in returns: ``RemoveEventHandler`` (line 1004) returns at once, the running
call is never interrupted, and what was pending is discarded. ``TestRemoveWhileActive``
(``shared_informer_test.go`` line 1068) checks the last part: no event reaches a removed handler.
The rows below follow that source for each kind of handler this project accepts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import AckFunc, KubeObject, ListenerOptions, Notification
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.recorder import RecordingHandler
from tests.informer.observer import RecordingObserver
from tests.informer.test_shared_informer import cm, until


class Held:
    """Holds every call until ``release`` is set; records which calls finished and which were
    cancelled (a removal must never cancel one)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.finished: list[str] = []
        self.cancelled = 0

    async def hold(self, names: Sequence[str]) -> None:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished.extend(names)


def name_of(obj: Any) -> str:
    return str(obj["metadata"]["name"])


class HeldEventHandler(Held):
    """A plain :class:`~bridge.contracts.EventHandler` (acknowledged when its method returns)."""

    async def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
        await self.hold([name_of(obj)])

    async def on_update(self, old: KubeObject, new: KubeObject) -> None:
        await self.hold([name_of(new)])

    async def on_delete(self, obj: Any) -> None:
        await self.hold([name_of(obj)])


class HeldNotificationHandler(Held):
    """A :class:`~bridge.contracts.NotificationHandler` (acknowledges through ``ack``)."""

    async def handle(self, notification: Notification, ack: AckFunc) -> None:
        await self.hold([name_of(notification.obj)])
        ack()


class HeldBatchHandler(HeldNotificationHandler):
    """A :class:`~bridge.contracts.BatchNotificationHandler`."""

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        await self.hold([name_of(n.obj) for n in notifications])
        for ack in acks:
            ack()


Informer = tuple[SharedIndexInformer, FakeControllerSource, RecordingObserver]


@pytest.fixture
async def informer() -> AsyncIterator[Informer]:
    """An informer over a fake source; started by the test (:func:`start`), shut down here."""
    source = FakeControllerSource()
    observer = RecordingObserver()
    inf = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm", observer=observer)
    yield inf, source, observer
    await inf.shutdown(2)
    for task in RUNS.pop(inf, ()):
        await task


RUNS: dict[SharedIndexInformer, list[asyncio.Task[None]]] = {}


async def start(inf: SharedIndexInformer) -> None:
    RUNS.setdefault(inf, []).append(asyncio.create_task(inf.run(), name="test-informer-run"))
    assert await inf.wait_for_cache_sync(5)


HANDLERS = [
    pytest.param(HeldEventHandler, id="event handler"),
    pytest.param(HeldNotificationHandler, id="notification handler"),
    pytest.param(HeldBatchHandler, id="batch handler"),
]


@pytest.mark.parametrize("kind", HANDLERS)
async def test_removing_a_handler_lets_its_running_call_finish_and_discards_the_rest(
    informer: Informer, kind: type[Held]
) -> None:
    inf, source, observer = informer
    held: Any = kind()
    kept = RecordingHandler()
    reg = inf.add_event_handler(held, ListenerOptions(name="held"))
    inf.add_event_handler(kept, ListenerOptions(name="kept"))
    await start(inf)
    source.add(cm("a"))
    await asyncio.wait_for(held.entered.wait(), 5)  # "a" is in the handler's call, held there
    source.add(cm("b"))
    source.add(cm("c"))
    await kept.wait_for(3)  # "b" and "c" wait in the held listener's buffer
    task = reg.listener.task
    assert task is not None

    inf.remove_event_handler(reg)  # returns at once (a plain function), the call still running

    assert not task.done()
    held.release.set()
    await until(task.done, "the removed listener's worker ends by itself")
    assert not task.cancelled()
    assert held.cancelled == 0
    assert held.finished == ["a"]  # the running call finished; "b" and "c" were discarded
    assert observer.events.count(("removed", "held")) == 1
    source.add(cm("d"))  # TestRemoveWhileActive: nothing reaches a removed handler
    await kept.wait_for(4)
    assert held.finished == ["a"]


@pytest.mark.parametrize("kind", HANDLERS)
async def test_removing_an_idle_handler_ends_its_worker_without_cancelling_it(
    informer: Informer, kind: type[Held]
) -> None:
    inf, source, _ = informer
    held: Any = kind()
    held.release.set()
    reg = inf.add_event_handler(held, ListenerOptions(name="held"))
    await start(inf)
    source.add(cm("a"))
    await until(lambda: held.finished == ["a"], "the handler got a")
    task = reg.listener.task
    assert task is not None
    inf.remove_event_handler(reg)
    await until(task.done, "the removed listener's worker ends by itself")
    assert not task.cancelled()


async def test_a_handler_removed_before_the_informer_starts_is_never_called(
    informer: Informer,
) -> None:
    inf, source, _ = informer
    source.add(cm("a"))
    held = HeldEventHandler()
    held.release.set()
    reg = inf.add_event_handler(held, ListenerOptions(name="held"))
    inf.remove_event_handler(reg)
    await start(inf)
    await asyncio.sleep(0)
    assert held.finished == []
    assert reg.listener.task is None
