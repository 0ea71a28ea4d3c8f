"""A sink that lags across two relists and a crash: what the replay holds back is each relist's own
window, never the changes observed one by one between them (issue 34).

Real simulator over HTTP, the real pipeline, a file checkpoint store and its journal; one sink acknowledges
everything, the other nothing (it is frozen), so the checkpoint stays before both relists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from sinks.cloudevents import event_id
from sinks.contract import EventType
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until
from tests.checkpoint.test_resume_sim import NS, PATH, REFUSE_LISTS, make, rv, with_a_lagging_sink

CHANGES = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.5) as world:
        yield world


async def _relist(server: Simulator, client: ApiClient, fast: RecordingSink,
                  *values: str) -> list[dict[str, Any]]:
    """A 410 into the open watch and a list answered only after ``x`` was patched to each value: the
    relist coalesces those updates; returns them once the fast sink has the relist's end."""
    ends = sum(e.type is EventType.GAP_END for e in fast.events)
    server.set_faults(REFUSE_LISTS)
    server.expire_watches()
    updates = [await client.patch(f"{PATH}/x", {"data": {"v": v}}) for v in values]
    server.set_faults({})
    await until(lambda: sum(e.type is EventType.GAP_END for e in fast.events) > ends, what="the relist's end")
    return updates


async def test_a_change_observed_between_two_relists_reaches_a_sink_that_lagged_across_a_crash(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """``x`` is updated behind a relist (coalesced: the relist sends its last state), then once on
    the watch, then again behind a second relist. The sink that is down holds the checkpoint before
    both; the bridge crashes. After the restart the watch replays from that checkpoint and the
    lagging sink must get the update the watch showed one by one between the relists: the first
    relist's window ends at the state it sent, the second's begins after that update. (Issue 34: the
    Kafka sink, frozen across relists and a crash, never received the changes just after a relist's
    end, and no marker announced them.)"""
    server, client = sim
    x, fast, _slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    u1, u2 = await _relist(server, client, fast, "1", "2")
    u3 = await client.patch(f"{PATH}/x", {"data": {"v": "3"}})
    await until(lambda: fast.changes()[-1:] == [("updated", f"{NS}/x", rv(u3), False)],
                what="x's live update")
    u4, u5 = await _relist(server, client, fast, "4", "5")
    assert [c[2] for c in fast.changes() if c[1] == f"{NS}/x"] == [rv(x), rv(u2), rv(u3), rv(u5)]
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging")
    await p.abort()  # the crash: the checkpoint is still at x's creation

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow")
    p2 = await make(client, tmp_path, fast2, slow2, interval=3600)
    await p2.start()
    try:
        assert p2.resumed(ident)
        await until(lambda: (f"{NS}/x", rv(u5)) in {(c[1], c[2]) for c in slow2.changes()},
                    what="x's last state, to the lagging sink")
        await until(lambda: p2.tracker(ident).lag == 0, what="everything acknowledged")
        got = [c[2] for c in slow2.changes() if c[1] == f"{NS}/x"]
        # Every change the watch showed one by one reaches it, in order; what each relist coalesced
        # does not (sent after the state the relist sent, it would break per-object order).
        assert got == [rv(u2), rv(u3), rv(u5)], got
        windows = [(int(e.gap.from_resource_version), int(e.gap.to_resource_version)) for e in slow2.events
                   if e.type is EventType.GAP_END and e.gap is not None]
        for coalesced in (u1, u4):
            assert any(lo < int(rv(coalesced)) <= hi for lo, hi in windows), (rv(coalesced), windows)
        # No window claims the update the watch showed one by one was not observed.
        assert not any(lo < int(rv(u3)) <= hi for lo, hi in windows), (rv(u3), windows)
        # The sink that had everything (its progress never written) gets x's events again, the same
        # events (same ids), in order: a consumer dropping repeated ids drops them.
        first = [event_id(e) for e in fast.events if e.subject == f"{NS}/x" and e.type in CHANGES]
        again = [event_id(e) for e in fast2.events if e.subject == f"{NS}/x" and e.type in CHANGES]
        assert again == first[len(first) - len(again):], (first, again)
    finally:
        await p2.shutdown(5)


async def test_a_journal_written_before_relist_windows_were_kept_resumes_without_loss(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """Mid-schedule with the slow sink frozen: one relist sent ``x`` (coalescing an update), the
    watch then showed one more. The checkpoint and the journal are then exactly as the tree before
    relist windows wrote them (format 3; the journal's relisted record has no earlier windows) —
    checked byte for byte against that layout. Crash, restart from them, a second relist in the
    restarted run, crash again, restart: the lagging sink gets each relist's state, and the update
    the watch showed one by one between the relists, outside any window."""
    server, client = sim
    x, fast, _slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    u1, u2 = await _relist(server, client, fast, "1", "2")
    u3 = await client.patch(f"{PATH}/x", {"data": {"v": "3"}})
    await until(lambda: fast.changes()[-1:] == [("updated", f"{NS}/x", rv(u3), False)],
                what="x's live update")
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging")
    await p.write_checkpoints()
    await p.abort()
    raw = (tmp_path / f"{ident}.journal").read_bytes().splitlines()
    assert [orjson.loads(line) for line in raw[1:] if line.startswith(b'["r"')] == [
        ["r", f"{NS}/x", x["metadata"]["uid"], rv(u2), rv(x), False]]
    assert orjson.loads(raw[0]) == {"journal": 1, "informer_id": ident}

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow", auto_ack=False)
    p2 = await make(client, tmp_path, fast2, slow2, interval=3600)
    await p2.start()
    try:
        assert p2.resumed(ident)
        assert await p2.wait_for_sync(10)
        await until(lambda: server.store.watcher_count() > 0, what="the resumed watch")
        _u4, u5 = await _relist(server, client, fast2, "4", "5")
        await until(lambda: not p2.tracker(ident).pending_by_listener().get("fast"),
                    what="fast acknowledging")
    finally:
        await p2.abort()

    fast3, slow3 = RecordingSink("fast"), RecordingSink("slow")
    p3 = await make(client, tmp_path, fast3, slow3, interval=3600)
    await p3.start()
    try:
        await until(lambda: (f"{NS}/x", rv(u5)) in {(c[1], c[2]) for c in slow3.changes()},
                    what="x's last state, to the lagging sink")
        await until(lambda: p3.tracker(ident).lag == 0, what="everything acknowledged")
        assert [c[2] for c in slow3.changes() if c[1] == f"{NS}/x"] == [rv(u2), rv(u3), rv(u5)]
        windows = [(int(e.gap.from_resource_version), int(e.gap.to_resource_version)) for e in slow3.events
                   if e.type is EventType.GAP_END and e.gap is not None]
        assert any(lo < int(rv(u1)) <= hi for lo, hi in windows), windows
        assert not any(lo < int(rv(u3)) <= hi for lo, hi in windows), windows
    finally:
        await p3.shutdown(5)


async def test_a_change_held_back_by_a_replay_is_not_taken_as_delivered_to_a_frozen_sink(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """``x`` is updated on the watch (the frozen sink owes it), then twice behind a relist (it sends
    the last state); crash. The restart replays from the checkpoint: the frozen sink is handed the
    update it owes (still not acknowledged: its broker answers nothing) and the replay holds back the
    update the relist coalesced — acknowledged without delivery. A checkpoint is written, the bridge
    crashes again. That acknowledgement must not make the sink's own progress say it holds ``x`` at
    the held-back state: the next restart would skip the update it never received. (Issue 34's
    webhook, frozen across relists and crashes, lost the changes before a relist's window.)"""
    server, client = sim
    _x, fast, _slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    u1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    await until(lambda: fast.changes()[-1:] == [("updated", f"{NS}/x", rv(u1), False)],
                what="x's live update")
    _u2, u3 = await _relist(server, client, fast, "2", "3")
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging")
    await p.abort()

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow", auto_ack=False)
    p2 = await make(client, tmp_path, fast2, slow2, interval=3600)
    await p2.start()
    try:
        await until(lambda: (f"{NS}/x", rv(u3)) in {(c[1], c[2]) for c in slow2.changes()},
                    what="x's relisted state, handed to the frozen sink")
        await until(lambda: not p2.tracker(ident).pending_by_listener().get("fast"), what="fast")
        await p2.write_checkpoints()
    finally:
        await p2.abort()

    fast3, slow3 = RecordingSink("fast"), RecordingSink("slow")
    p3 = await make(client, tmp_path, fast3, slow3, interval=3600)
    await p3.start()
    try:
        await until(lambda: (f"{NS}/x", rv(u3)) in {(c[1], c[2]) for c in slow3.changes()},
                    what="x's relisted state, to the sink now back")
        await until(lambda: p3.tracker(ident).lag == 0, what="everything acknowledged")
        assert [c[2] for c in slow3.changes() if c[1] == f"{NS}/x"] == [rv(u1), rv(u3)]
    finally:
        await p3.shutdown(5)
