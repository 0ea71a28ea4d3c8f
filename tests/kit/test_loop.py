"""The kit's loop helpers: ``spin_until`` waits by turns of the event loop and fails naming what it
waited for; ``running_informer`` runs an informer for a block and, on the way out, releases held
handlers before it shuts the informer down, so nothing outlives the block."""

from __future__ import annotations

import asyncio

import pytest

from bridge.clock import FakeClock
from bridge.contracts import ListenerOptions
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.testing import FakeControllerSource, RecordingHandler, running_informer, spin_until


async def test_spin_until_returns_on_the_turn_the_condition_holds() -> None:
    turns = 0

    async def count() -> None:
        nonlocal turns
        while turns < 5:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count(), name="test-turn-counter")
    await spin_until(lambda: turns == 5, "five turns")
    assert turns == 5
    await counter


async def test_spin_until_fails_naming_what_never_held_after_its_turns() -> None:
    looked = 0

    def never() -> bool:
        nonlocal looked
        looked += 1
        return False

    with pytest.raises(AssertionError, match=r"^the flag never became true \(in 7 turns"):
        await spin_until(never, "the flag", turns=7)
    assert looked == 7


async def test_running_informer_releases_a_held_handler_then_shuts_the_informer_down() -> None:
    source = FakeControllerSource()
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="kit")
    gate = asyncio.Event()
    held, free = RecordingHandler(gate=gate), RecordingHandler()
    informer.add_event_handler(held, ListenerOptions(name="held"))
    informer.add_event_handler(free, ListenerOptions(name="free"))
    async with running_informer(informer, release=[gate]) as task:
        assert task.get_name() == "test-informer-kit"
        assert await informer.wait_for_cache_sync(5)
        source.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "a"}})
        assert await free.wait_for(1) == [("add", "ns/a", "1", False)]
        assert held.calls == []
    assert gate.is_set()
    assert task.done()
    assert held.calls == [("add", "ns/a", "1", False)]  # released before the shutdown drained it


async def test_running_informer_ends_its_task_when_the_block_raises() -> None:
    informer = SharedIndexInformer(lister_watcher=FakeControllerSource(), clock=FakeClock(), name="kit")
    with pytest.raises(LookupError, match="from the block"):
        async with running_informer(informer) as task:
            raise LookupError("from the block")
    assert task.done()
    assert not task.cancelled()
