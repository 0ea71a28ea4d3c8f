"""Losing leadership stops delivery at once: the fence stage hands nothing on, the pipeline's abort
abandons what is in flight and writes no checkpoint, and the fenced store refuses a late write."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.clock import FakeClock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.leaderelection import FenceToken
from bridge.service.fencing import FenceStage
from bridge.storage.checkpoint import Checkpoint, CheckpointFencedError, FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from tests.checkpoint.helpers import WATCHED, BatchSink, RecordingSink, cm, fake_builder, until

IDENT = WATCHED.informer_id


class Leadership:
    def __init__(self) -> None:
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def token(self) -> FenceToken | None:
        return FenceToken(transitions=3, holder="a") if self.leading else None


async def test_after_the_loss_nothing_reaches_a_sink_and_no_checkpoint_is_written(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(5):
        source.add(cm(f"cm-{i}"))
    lead = Leadership()
    inner = RecordingSink("hook", auto_ack=False)  # the destination has not confirmed: in flight
    store = FileCheckpointStore(directory=tmp_path, fsync=False, fence=lead.token)
    clock = FakeClock()
    pipeline = BridgePipeline(
        resources=[WATCHED], sinks=[DeliveryChain(sink=inner, stages=[FenceStage(is_leader=lead.is_leader)])],
        checkpoint_store=store, build_informer=fake_builder(source, clock), clock=clock,
        cluster="test", checkpoint_interval=3600,
    )
    await pipeline.start()
    await until(lambda: len(inner.events) == 5, what="the listed objects handed to the sink")
    inner.ack_all()
    assert await pipeline.write_checkpoints() == 1
    saved = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert saved is not None
    assert saved.writer == FenceToken(transitions=3, holder="a")

    source.modify(cm("cm-0", v="1"))
    await until(lambda: len(inner.events) == 6, what="one more event in flight")
    lead.leading = False  # the renew deadline passed
    for i in range(5, 10):
        source.add(cm(f"cm-{i}"))
    await until(lambda: pipeline.stats().received[IDENT].get("add", 0) >= 10, what="new changes received")
    assert len(inner.events) == 6  # nothing new handed to the sink
    inner.ack_all()  # the in-flight one is confirmed after the loss: acknowledged, not checkpointed
    assert await pipeline.write_checkpoints() == 0
    await pipeline.abort()
    assert inner.closed
    assert len(inner.events) == 6
    after = await FileCheckpointStore(directory=tmp_path).load(IDENT)
    assert after == saved  # the store still holds what was written while leading

    late = FileCheckpointStore(directory=tmp_path, fsync=False, fence=lambda: FenceToken(2, "old"))
    with pytest.raises(CheckpointFencedError):
        await late.save(Checkpoint(informer_id=IDENT, resource_version="1", objects={}))


async def test_a_fenced_chain_hands_batches_on_while_leading_and_nothing_after_the_loss(
    tmp_path: Path,
) -> None:
    source = FakeControllerSource()
    for i in range(300):
        source.add(cm(f"cm-{i}"))
    lead = Leadership()
    inner = BatchSink("hook")
    fence = FenceStage(is_leader=lead.is_leader)
    fenced = DeliveryChain(sink=inner, stages=[fence])
    clock = FakeClock()
    pipeline = BridgePipeline(
        resources=[WATCHED], sinks=[fenced], checkpoint_store=None,
        build_informer=fake_builder(source, clock), clock=clock, cluster="test", checkpoint_interval=3600,
    )
    await pipeline.start()
    try:
        await until(lambda: len(inner.events) == 300, what="the listed objects handed to the sink")
        # The initial list reached the sink in batches through the fence, not one call per event.
        assert inner.calls
        assert max(inner.calls) > 1
        assert sum(inner.calls) <= 300
        lead.leading = False  # the renew deadline passed
        for i in range(300, 600):
            source.add(cm(f"cm-{i}"))
        await until(lambda: pipeline.stats().received[IDENT].get("add", 0) >= 600,
                    what="new changes received")
        await until(lambda: fence.refused > 0, what="the fence refusing")
        assert len(inner.events) == 300  # nothing new handed to the sink, batched or not
    finally:
        await pipeline.abort()
    assert len(inner.events) == 300
