"""A spill file damaged on disk (bytes overwritten, or cut short) loses the notifications it held. The
listener announces that as the delivery contract announces any change not observed: a gap window
from the last change it delivered, and a snapshot of the cache requested for it alone, whose passage
closes the window; a consumer applying what it receives ends with exactly the informer's cache.
The other listener is not touched."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind
from bridge.delivery.spill import SegmentSpill
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.loop import spin_until
from tests.informer.slow_and_fast import add_then_modify, cm, slow_beside_fast


def _rv(obj: Any) -> str:
    if isinstance(obj, DeletedFinalStateUnknown):
        obj = obj.obj
    return str(obj["metadata"]["resourceVersion"])


class Consumer:
    """A NotificationHandler that keeps what a sink's consumer would hold (key → resourceVersion),
    a snapshot replacing it whole, and acks at once."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.seen: list[Notification] = []
        self.state: dict[str, str] = {}

    async def handle(self, n: Notification, ack: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.seen.append(n)
        if n.kind is NotificationKind.SNAPSHOT:
            assert n.snapshot is not None
            self.state = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": _rv(o)
                          for o in n.snapshot}
        elif n.kind is NotificationKind.DELETE:
            self.state.pop(str(n.key), None)
        elif n.kind in (NotificationKind.ADD, NotificationKind.UPDATE):
            self.state[str(n.key)] = _rv(n.obj)
        ack()


def _damage(directory: Path, how: str) -> None:
    [segment] = sorted(directory.glob("*.seg"))
    size = segment.stat().st_size
    assert size > 64
    if how == "overwritten":
        with open(segment, "r+b") as f:  # the first record's payload: its checksum no longer matches
            f.seek(12)
            f.write(b"\x00garbage\x00")
            f.flush()
            os.fsync(f.fileno())
    else:
        os.truncate(segment, size // 2)


@pytest.mark.parametrize("how", ["overwritten", "truncated"])
async def test_a_damaged_spill_opens_a_gap_and_a_snapshot_makes_the_sink_exact(
        tmp_path: Path, how: str) -> None:
    source = FakeControllerSource()
    spill = SegmentSpill(tmp_path / "spill", limit_bytes=10 << 20, sync_bytes=1)
    gate = asyncio.Event()
    slow, fast = Consumer(gate), Consumer()
    async with slow_beside_fast(source, slow=slow, fast=fast, gate=gate, spill=spill,
                                buffer_capacity=4) as pair:
        add_then_modify(source, objects=10, rounds=5)
        source.delete(cm("o3"))
        await spin_until(lambda: len(fast.seen) == 61, "the other listener got everything")
        assert pair.slow.stats().spilled > 0
        spill.sync()
        _damage(tmp_path / "spill", how)
        gate.set()
        await spin_until(lambda: any(n.kind is NotificationKind.GAP and n.gap is not None and n.gap.end
                                     for n in slow.seen), "the gap window closed")
        await spin_until(lambda: pair.slow.stats().depth == 0, "the slow listener drained")
    assert spill.corrupt > 0
    gaps = [(i, n.gap) for i, n in enumerate(slow.seen) if n.kind is NotificationKind.GAP]
    assert len(gaps) == 2
    (begin_at, begin), (end_at, end) = gaps
    assert begin is not None
    assert end is not None
    assert begin.id == end.id
    assert begin.id.startswith("spill:slow:")
    assert not begin.end
    assert end.end
    snapshots = [i for i, n in enumerate(slow.seen) if n.kind is NotificationKind.SNAPSHOT]
    assert snapshots == [end_at - 1], "the snapshot closes the window it was asked for"
    assert begin_at < end_at
    cache = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": _rv(o)
             for o in pair.informer.get_store().list()}
    assert "ns/o3" not in cache
    assert slow.state == cache == fast.state
    assert end.to_resource_version == slow.seen[end_at - 1].resource_version
    assert not any(n.kind is NotificationKind.GAP for n in fast.seen)
