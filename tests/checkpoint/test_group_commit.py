"""The group commit (issue #27): the checkpoint follows the acknowledgements, written once they
advanced by ``events`` or an acknowledgement is ``delay`` seconds old, whichever comes first, however
long ``checkpoint_interval`` is; each write also compacts the journal as the interval's writes do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.clock import RealClock
from bridge.delivery.checkpoint_writer import GroupCommit
from bridge.delivery.pipeline import BridgePipeline
from bridge.storage.checkpoint import Checkpoint, FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from tests.checkpoint.helpers import WATCHED, RecordingSink, cm, fake_builder, until

IDENT = WATCHED.informer_id


class CountingStore(FileCheckpointStore):
    """The file store, remembering the resourceVersion of every checkpoint saved."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory=directory)
        self.saved: list[str] = []

    async def save(self, checkpoint: Checkpoint) -> None:
        await super().save(checkpoint)
        self.saved.append(checkpoint.resource_version)


async def started(source: FakeControllerSource, store: CountingStore, commit: GroupCommit
                  ) -> BridgePipeline:
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[RecordingSink("k")], checkpoint_store=store,
                       build_informer=fake_builder(source, clock), clock=clock, cluster="test",
                       checkpoint_interval=3600, group_commit=commit)
    await p.start()
    assert await p.wait_for_sync(10)
    await until(lambda: store.saved[-1:] == [str(source.resource_version)], what="the first list saved")
    return p


async def test_a_write_once_the_acknowledgements_advanced_by_n(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for name in "abcde":  # the first list: 5 acknowledgements, one write
        source.add(cm(name))
    store = CountingStore(tmp_path)
    p = await started(source, store, GroupCommit(events=5, delay=3600))
    try:
        writes = len(store.saved)
        for v in range(4):
            source.modify(cm("a", v=str(v)))
        await until(lambda: p.tracker(IDENT).resource_version == str(source.resource_version), what="acks")
        await asyncio.sleep(0.3)
        assert len(store.saved) == writes  # 4 acknowledgements: below N, and the delay is an hour
        source.modify(cm("a", v="last"))
        # The N-th acknowledgement writes (the delay and the interval are an hour: nothing else
        # can); the deadline only stops a hang.
        await until(lambda: store.saved[-1] == str(source.resource_version), timeout=60.0,
                    what="a write at the N-th acknowledgement")
        assert len(store.saved) == writes + 1
        assert p._writer.group_writes >= 2
    finally:
        await p.shutdown(5)


async def test_a_write_once_an_acknowledgement_is_t_old(tmp_path: Path) -> None:
    source = FakeControllerSource()
    source.add(cm("a"))
    store = CountingStore(tmp_path)
    p = await started(source, store, GroupCommit(events=1000, delay=0.5))
    try:
        writes = len(store.saved)
        source.modify(cm("a", v="1"))
        loop = asyncio.get_running_loop()
        changed = loop.time()
        await until(lambda: len(store.saved) > writes, timeout=60.0, what="a write after the delay")
        took = loop.time() - changed
        assert store.saved[-1] == str(source.resource_version)
        # Not before the delay, and the delay's doing: N is 1,000 and the interval an hour, so nothing
        # else writes (how soon after the delay is the machine's load; the deadline stops a hang).
        assert 0.4 <= took < 60.0, took
        await asyncio.sleep(0.7)
        assert len(store.saved) == writes + 1  # nothing moved since: no more writes
    finally:
        await p.shutdown(5)


def test_bad_group_commit_values_are_refused() -> None:
    with pytest.raises(ValueError, match="events must be at least 1"):
        GroupCommit(events=0)
    with pytest.raises(ValueError, match="delay must be positive"):
        GroupCommit(delay=0)
