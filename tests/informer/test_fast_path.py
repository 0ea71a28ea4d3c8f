"""Issue #36: the fast path. While a sink has room, what a run of the informer brings its idle
listener reaches the sink in the informer's own task (no worker woken); a sink without room gets its
changes from its listener's worker and buffer, and holds neither the informer nor the others."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bridge.clock import FakeClock
from bridge.contracts import ListenerOptions
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.sink_listener import SinkListener
from bridge.informer.eager import run_eagerly
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.loop import running_informer, spin_until
from bridge.testing.sink import RecordingBatchSink
from sinks.contract import AckCallback, ChangeEvent, ResourceRef
from tests.informer.slow_and_fast import cm

CONFIGMAPS = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")


class TaskRecordingSink(RecordingBatchSink):
    """A recording batch sink that notes which task made each ``deliver_batch`` call; with a
    ``gate``, it has no room and its calls wait until the gate is set (a frozen destination)."""

    def __init__(self, name: str, gate: asyncio.Event | None = None) -> None:
        super().__init__(name)
        self.gate = gate
        self.tasks: list[str] = []

    def has_room(self, count: int) -> bool:
        return (self.gate is None or self.gate.is_set()) and super().has_room(count)

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        task = asyncio.current_task()
        self.tasks.append(task.get_name() if task is not None else "")
        if self.gate is not None:
            await self.gate.wait()
        await super().deliver_batch(events, acks)


def sink_listener(sink: TaskRecordingSink) -> SinkListener:
    return SinkListener(sink=DeliveryChain(sink=sink), resource=CONFIGMAPS, cluster="c", clock=FakeClock())


async def test_a_sink_with_room_gets_its_changes_in_the_informers_task() -> None:
    source = FakeControllerSource()
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    fast = TaskRecordingSink("fast")
    registration = informer.add_event_handler(sink_listener(fast), ListenerOptions(name="fast"))
    async with running_informer(informer):
        assert await informer.wait_for_cache_sync(5)
        for i in range(60):  # one change at a time: each run of the informer brings one
            if i < 30:
                source.add(cm(f"o{i}"))
            else:
                source.modify(cm(f"o{i - 30}", v="1"))
            await spin_until(lambda: len(fast.events) == i + 1, f"the sink got change {i}")  # noqa: B023
        assert fast.tasks, "no batch reached the sink"
        # Every batch was handed over by the informer's pop loop, none by the listener's worker.
        assert all(name.startswith("informer:cm:") for name in fast.tasks), fast.tasks
        assert [e.name for e in fast.events[:30]] == [f"o{i}" for i in range(30)]
        assert registration.stats().delivered == 60
        await spin_until(lambda: registration.stats().acked == 60, "every change acknowledged")


async def test_a_frozen_sink_gets_its_changes_through_its_buffer_and_holds_no_one() -> None:
    source = FakeControllerSource()
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm")
    gate = asyncio.Event()
    fast, slow = TaskRecordingSink("fast"), TaskRecordingSink("slow", gate=gate)
    informer.add_event_handler(sink_listener(fast), ListenerOptions(name="fast"))
    slow_reg = informer.add_event_handler(sink_listener(slow), ListenerOptions(name="slow"))
    async with running_informer(informer, release=[gate]):
        assert await informer.wait_for_cache_sync(5)
        for i in range(40):  # one change at a time: each run of the informer brings one
            source.add(cm(f"o{i}"))
            await spin_until(lambda: len(fast.events) == i + 1, f"the fast sink got change {i}")  # noqa: B023
        await spin_until(lambda: slow_reg.stats().depth == 39, "the frozen sink's changes wait for it")
        assert all(name.startswith("informer:cm:") for name in fast.tasks), fast.tasks
        # The frozen sink said it had no room: its one call came from its worker, and waits.
        assert slow.tasks == ["listener:cm:slow"]
        assert slow.events == []
        gate.set()
        await spin_until(lambda: len(slow.events) == 40, "the frozen sink caught up")
        assert [e.name for e in slow.events] == [e.name for e in fast.events]
        assert all(name == "listener:cm:slow" for name in slow.tasks), slow.tasks
        # Room again: the next change takes the fast path for both.
        await spin_until(lambda: slow_reg.stats().depth == 0, "the frozen sink drained")
        fast.tasks.clear()
        slow.tasks.clear()
        source.add(cm("late"))
        await spin_until(lambda: len(slow.events) == 41 and len(fast.events) == 41, "both got the change")
        assert fast.tasks
        assert slow.tasks
        assert all(name.startswith("informer:cm:") for name in [*fast.tasks, *slow.tasks])


async def test_a_call_that_waits_all_the_same_carries_on_in_a_task_of_its_own() -> None:
    gate = asyncio.Event()
    steps: list[str] = []

    async def call() -> None:
        steps.append("begun")
        await gate.wait()
        steps.append("ended")

    carried = run_eagerly(call(), "carried")
    assert carried is not None
    assert steps == ["begun"]
    gate.set()
    await carried
    assert steps == ["begun", "ended"]

    async def quick() -> None:
        steps.append("quick")

    assert run_eagerly(quick(), "quick") is None
    assert steps[-1] == "quick"

    gate.clear()
    stuck = run_eagerly(call(), "stuck")
    assert stuck is not None
    await asyncio.sleep(0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
