"""Issue #13: while one sink is down under churn its backlog grows on disk, not in memory; and when
even its spill is full, that sink alone degrades (latest state per object inside a gap window)."""

from __future__ import annotations

import asyncio
import functools
import gc
from pathlib import Path
from typing import Any

from bridge.clock import RealClock
from bridge.contracts import OverflowPolicy
from bridge.delivery.pipeline import BridgePipeline
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType
from tests.checkpoint.helpers import WATCHED, fake_builder, until

PAYLOAD = "x" * 4096


def big(name: str, v: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {"v": str(v), "blob": f"{v:08d}{PAYLOAD}"}}  # a string of its own per change


class CountingSink:
    """Acks at once and keeps only counts and the event types (never the objects)."""

    def __init__(self, name: str, *, down: bool = False, spill_limit: int = 1 << 30,
                 buffer_capacity: int = 256) -> None:
        self.name = name
        self.delivery = DeliveryOptions(buffer_capacity=buffer_capacity, overflow_policy=OverflowPolicy.SPILL,
                                        spill_limit=spill_limit)
        self.last_error = ""
        self.in_flight = 0
        self.down = asyncio.Event() if down else None
        self.count = 0
        self.types: list[str] = []
        self.versions: dict[str, list[str]] = {}

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        if self.down is not None:
            await self.down.wait()  # a destination that accepts nothing: its window is full
        self.count += 1
        self.types.append(event.type.value)
        if event.type in (EventType.ADDED, EventType.UPDATED):
            assert event.obj is not None
            self.versions.setdefault(event.subject, []).append(str(event.obj["data"]["v"]))
        ack(DeliveryOutcome.DELIVERED)

    async def flush(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        if self.down is not None:
            self.down.set()

    def healthy(self) -> bool:
        return True


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def caught_up(sink: CountingSink, wanted: int) -> bool:
    return sink.count >= wanted


async def churn(source: FakeControllerSource, up: CountingSink, start: int, changes: int) -> None:
    for n in range(start, start + changes):
        source.modify(big(f"o{n % 200}", n))
        if n % 250 == 249:
            await until(functools.partial(caught_up, up, n + 1 - start + up_base[0]), 30,
                        "the up sink keeps up")
            source.compact()  # the fake API server forgets its history, as a real one does


up_base = [0]


async def test_memory_stays_bounded_while_one_sink_is_down_and_its_spill_grows(tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(200):
        source.add(big(f"o{i}", 0))
    up, down = CountingSink("up"), CountingSink("down", down=True)
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[up, down], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill")
    await p.start()
    try:
        await until(lambda: up.count == 200, 30, "initial adds")
        up_base[0] = up.count
        await churn(source, up, 0, 2000)  # warm-up: buffers full, spill started
        gc.collect()
        before, spill_before = rss_bytes(), p.sink_backlog("down").spill_bytes
        up_base[0] = up.count
        await churn(source, up, 2000, 10000)  # ~40 MiB of objects for the down sink
        await until(lambda: up.count == 12200, 30, "the up sink got everything")
        gc.collect()
        growth = rss_bytes() - before
        backlog = p.sink_backlog("down")
        spill_growth = backlog.spill_bytes - spill_before
        print(f"RSS growth {growth / 2**20:.1f} MiB while the spill grew {spill_growth / 2**20:.1f} MiB")
        assert spill_growth > 35 << 20  # the backlog is on disk…
        assert growth < 16 << 20  # …not in memory (stated bound: 16 MiB while 80 MiB went to disk)
        assert backlog.depth == 12200 - 1  # all but the one its deliver call holds
        assert backlog.degraded == 0
    finally:
        await p.shutdown(5)


async def test_a_full_spill_degrades_one_sink_behind_a_gap_and_the_others_get_every_change(
        tmp_path: Path) -> None:
    source = FakeControllerSource()
    for i in range(20):
        source.add(big(f"o{i}", 0))
    up = CountingSink("up")
    slow = CountingSink("slow", down=True, spill_limit=64 << 10, buffer_capacity=16)
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[up, slow], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill")
    await p.start()
    try:
        await until(lambda: up.count == 20, 30, "initial adds")
        for n in range(1, 401):
            source.modify(big(f"o{n % 20}", n))
        await until(lambda: up.count == 420, 30, "the up sink got everything")
        assert up.types.count("gap.begin") == 0
        backlog = p.sink_backlog("slow")
        assert backlog.degraded > 0
        assert backlog.spill_bytes <= 64 << 10
        assert backlog.depth < 420  # the degraded part is one state per object
        assert slow.down is not None
        slow.down.set()  # the destination is back
        await until(lambda: p.sink_backlog("slow").depth == 0 and "gap.end" in slow.types, 30,
                    "the slow sink caught up")
        begin, end = slow.types.index("gap.begin"), slow.types.index("gap.end")
        assert slow.types[begin + 1:end] == ["updated"] * (end - begin - 1)
        # Each object's last state is its final one, as for the sink that was never behind.
        assert {k: v[-1] for k, v in slow.versions.items()} == {k: v[-1] for k, v in up.versions.items()}
        assert p.sink_backlog("slow").gaps == 1
    finally:
        await p.shutdown(5)
