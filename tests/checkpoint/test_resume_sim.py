"""Resume against the API-server simulator over real HTTP, through the service's wiring
(SharedInformerFactory + HttpListerWatcher + BridgePipeline), in-process."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.delivery.progress import AckTracker
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from sinks.cloudevents import event_id
from sinks.contract import EventType
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until, watched_over_http
from tests.checkpoint.test_file_store import _sealed

NS = "resume"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.5) as world:
        yield world


async def make(client: ApiClient, ckpt: Path, sink: RecordingSink, *more: RecordingSink,
               interval: float = 0.05) -> BridgePipeline:
    # As the service runs by default: objects kept as bytes (RawObject) in a compact cache.
    factory, watched = await watched_over_http(client, "configmaps", "ConfigMap", NS)
    return BridgePipeline(factory=factory, resources=[watched],
                          sinks=[sink, *more], checkpoint_store=FileCheckpointStore(directory=ckpt),
                          checkpoint_interval=interval, cluster="sim")


PATH = f"/api/v1/namespaces/{NS}/configmaps"


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


async def create(client: ApiClient, name: str, **data: str) -> dict[str, Any]:
    return await client.create(PATH, {"metadata": {"name": name}, "data": dict(data)})


async def first_run(client: ApiClient, ckpt: Path) -> tuple[RecordingSink, str]:
    sink = RecordingSink("rec")
    p = await make(client, ckpt, sink)
    await p.start()
    assert await p.wait_for_sync(10)
    ident = next(iter(p.informers))
    listed = await client.get(PATH)
    list_rv = listed["metadata"]["resourceVersion"]
    tracker = p.tracker(ident)
    await until(lambda: int(tracker.resource_version or 0) >= int(list_rv) and not tracker.pending,
                what="everything acked")
    await p.shutdown(5)
    return sink, ident


async def test_resume_over_http_delivers_every_change_without_listing(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    server, client = sim
    a = await create(client, "a", v="0")
    b = await create(client, "b", v="0")
    first, ident = await first_run(client, tmp_path)
    assert sorted(first.changes()) == [("added", f"{NS}/a", a["metadata"]["resourceVersion"], False),
                                       ("added", f"{NS}/b", b["metadata"]["resourceVersion"], False)]
    made = []
    for v in ("1", "2", "3"):
        o = await client.patch(f"{PATH}/a", {"data": {"v": v}})
        made.append(("updated", f"{NS}/a", o["metadata"]["resourceVersion"], False))
    o = await client.delete(f"{PATH}/b")
    made.append(("deleted", f"{NS}/b", o["metadata"]["resourceVersion"], False))
    o = await create(client, "c")
    made.append(("added", f"{NS}/c", o["metadata"]["resourceVersion"], False))
    lists_before = server.requests["list"]

    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    await p.start()
    assert p.resumed(ident)
    await until(lambda: len(sink.changes()) == len(made), what="every change")
    assert sink.changes() == made
    assert server.requests["list"] == lists_before  # resumed with a watch, no list
    await until(lambda: p.tracker(ident).resource_version == made[-1][2], what="acked")
    await p.shutdown(5)
    assert sink.changes() == made  # nothing more during shutdown


async def test_compacted_history_gives_410_and_only_the_differences(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    server, client = sim
    objs = {n: await create(client, n, v="0") for n in ("same", "changed", "gone", "recreated")}
    await first_run(client, tmp_path)
    await client.patch(f"{PATH}/changed", {"data": {"v": "1"}})
    changed = await client.patch(f"{PATH}/changed", {"data": {"v": "2"}})
    await client.delete(f"{PATH}/gone")
    await client.delete(f"{PATH}/recreated")
    recreated = await create(client, "recreated", v="new")
    fresh = await create(client, "fresh")
    server.compact()
    lists_before = server.requests["list"]

    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    await p.start()
    await until(lambda: len(sink.changes()) == 5, what="the differences")
    assert sorted(sink.changes()) == sorted([
        ("updated", f"{NS}/changed", rv(changed), False),
        ("deleted", f"{NS}/gone", rv(objs["gone"]), True),
        ("deleted", f"{NS}/recreated", rv(objs["recreated"]), True),
        ("added", f"{NS}/recreated", rv(recreated), False),
        ("added", f"{NS}/fresh", rv(fresh), False),
    ])
    assert server.requests["list"] > lists_before  # the 410 forced a relist
    tomb = next(e for e in sink.events if e.subject == f"{NS}/gone")
    # The checkpoint only knew metadata: the final-state-unknown delete carries that stub.
    assert dict(tomb.obj or {}) == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "gone", "namespace": NS, "uid": objs["gone"]["metadata"]["uid"],
        "resourceVersion": rv(objs["gone"])}}
    ident = next(iter(p.informers))
    await until(lambda: p.tracker(ident).resource_version == rv(fresh), what="acked")
    await p.shutdown(5)
    assert not [e for e in sink.events if e.subject == f"{NS}/same"]  # unchanged: not re-sent


async def test_checkpoint_with_a_nonsense_resource_version_is_corrupt_and_lists_fully(
    sim: tuple[Simulator, ApiClient], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checksum over nonsense is still nonsense: a resume point of "abc" would make every watch and
    list fail with 400 for ever; the bridge warns and lists from scratch instead."""
    _, client = sim
    a = await create(client, "a")
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    store = FileCheckpointStore(directory=tmp_path)
    ident = informer_id("configmaps", NS)
    store.path_for(ident).parent.mkdir(parents=True, exist_ok=True)
    store.path_for(ident).write_bytes(_sealed({
        "informer_id": ident, "resource_version": "abc", "written_at": 1.0,
        "objects": {f"{NS}/a": [a["metadata"]["uid"], rv(a)]}, "ahead": {}}))
    with caplog.at_level(logging.WARNING, logger="bridge.delivery"):
        await p.start()
    assert not p.resumed(ident)
    assert any("corrupt" in r.getMessage() and "'abc'" in r.getMessage() for r in caplog.records)
    await until(lambda: sink.changes() == [("added", f"{NS}/a", rv(a), False)], what="a full list")
    assert p.not_ready_reasons() == []
    await p.shutdown(5)


async def test_readiness_reports_an_informer_that_cannot_list_or_watch(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    server, client = sim
    await create(client, "a")
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    await p.start()
    assert await p.wait_for_sync(10)
    assert p.ready()
    assert p.not_ready_reasons() == []
    # Every request fails from now on; the open watch ends, and the relist cannot succeed.
    server.set_faults(error_code=500, error_count=1_000_000, error_retry_after=0)
    server.expire_watches()
    await until(lambda: not p.ready(), what="readiness to drop")
    [reason] = p.not_ready_reasons()
    assert reason.startswith(f"informer {informer_id('configmaps', NS)} cannot list or watch: ServerError")
    server.set_faults({})
    await until(p.ready, timeout=30, what="readiness to return once the server answers")
    await p.shutdown(5)


def framed(sink: RecordingSink) -> list[tuple[str, str, str]]:
    """(type, subject or window, gap id) of every event: gap markers show ``from..to``."""
    out = []
    for e in sink.events:
        gap = e.gap.id if e.gap is not None else ""
        if e.type in (EventType.GAP_BEGIN, EventType.GAP_END):
            assert e.gap is not None
            out.append((e.type.value, f"{e.gap.from_resource_version}..{e.gap.to_resource_version}", gap))
        else:
            out.append((e.type.value, e.subject, gap))
    return out


async def test_a_relist_on_resume_is_framed_by_gap_markers(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    server, client = sim
    await create(client, "same")
    gone = await create(client, "gone")
    first, _ = await first_run(client, tmp_path)
    assert [e.type for e in first.events] == [EventType.ADDED, EventType.ADDED]  # a first list: no gap
    assert all(e.gap is None for e in first.events)
    await client.delete(f"{PATH}/gone")
    fresh = await create(client, "fresh")
    server.compact()

    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    await p.start()
    await until(lambda: any(e.type is EventType.GAP_END for e in sink.events), what="the gap's end")
    [gap_id] = {e.gap.id for e in sink.events if e.gap is not None}
    listed = rv(fresh)
    assert framed(sink)[0] == ("gap.begin", f"{rv(gone)}..", gap_id)  # from the checkpoint's resourceVersion
    assert framed(sink)[-1] == ("gap.end", f"{rv(gone)}..{listed}", gap_id)
    assert sorted(framed(sink)[1:-1]) == [("added", f"{NS}/fresh", gap_id), ("deleted", f"{NS}/gone", gap_id)]
    # A change after the relist is observed on the watch: outside any gap.
    later = await client.patch(f"{PATH}/same", {"data": {"v": "1"}})
    await until(lambda: sink.events[-1].resource_version == rv(later), what="the next change")
    assert sink.events[-1].gap is None
    await p.shutdown(5)


async def test_a_relist_after_410_mid_watch_is_framed_by_gap_markers(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    server, client = sim
    a = await create(client, "a")
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    await p.start()
    assert await p.wait_for_sync(10)
    await until(lambda: len(sink.events) == 1, what="the initial add")
    server.set_faults({"delay": 0.3})  # the relist comes after the changes below
    server.expire_watches()
    await client.patch(f"{PATH}/a", {"data": {"v": "2"}})
    b = await create(client, "b")
    server.set_faults({})
    await until(lambda: any(e.type is EventType.GAP_END for e in sink.events), what="the gap's end")
    gap_ids = {e.gap.id for e in sink.events if e.gap is not None}
    assert len(gap_ids) == 1
    [gap_id] = gap_ids
    got = framed(sink)
    assert got[0] == ("added", f"{NS}/a", "")
    assert got[1] == ("gap.begin", f"{rv(a)}..", gap_id)
    assert sorted(got[2:-1]) == [("added", f"{NS}/b", gap_id), ("updated", f"{NS}/a", gap_id)]
    assert got[-1] == ("gap.end", f"{rv(a)}..{rv(b)}", gap_id)
    await p.shutdown(5)


async def test_an_unreadable_journal_without_a_checkpoint_frames_the_first_list_as_a_gap(
    sim: tuple[Simulator, ApiClient], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The previous run crashed before its first checkpoint write and its journal is damaged: the
    objects it had delivered are unknown, so one deleted while the bridge was down gets no delete.
    The bridge says so — a warning naming the journal, and the full list framed by gap markers
    from resourceVersion 0 — instead of presenting the list as a first start."""
    _, client = sim
    a = await create(client, "a")
    ident = informer_id("configmaps", NS)
    journal = FileCheckpointStore(directory=tmp_path).journal_path(ident)
    journal.parent.mkdir(parents=True, exist_ok=True)
    head = orjson.dumps({"journal": 1, "informer_id": ident})
    journal.write_bytes(head + b'\n["a","ns/gone","u-g",\x00\x01\n["a","ns/x","u-x","3"]\n')
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    with caplog.at_level(logging.WARNING):
        await p.start()
    await until(lambda: any(e.type is EventType.GAP_END for e in sink.events), what="the gap's end")
    assert any(str(journal) in r.getMessage() and "gap markers from resourceVersion 0" in r.getMessage()
               for r in caplog.records)
    [gap_id] = {e.gap.id for e in sink.events if e.gap is not None}
    listed = (await client.get(PATH))["metadata"]["resourceVersion"]
    assert int(listed) >= int(rv(a))
    assert framed(sink) == [("gap.begin", "0..", gap_id), ("added", f"{NS}/a", gap_id),
                            ("gap.end", f"0..{listed}", gap_id)]
    await p.shutdown(5)


async def test_an_unreadable_journal_with_a_checkpoint_resumes_and_warns(
    sim: tuple[Simulator, ApiClient], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a checkpoint, the watch resumed from it replays every change since (deletes of objects
    only the journal knew included): no gap, and the warning says what a relist would lose."""
    _, client = sim
    await create(client, "a")
    _, ident = await first_run(client, tmp_path)
    journal = FileCheckpointStore(directory=tmp_path).journal_path(ident)
    journal.write_bytes(orjson.dumps({"journal": 1, "informer_id": "someone-else"}) + b"\n")
    fresh = await create(client, "fresh")
    await client.delete(f"{PATH}/fresh")
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink)
    with caplog.at_level(logging.WARNING):
        await p.start()
    assert p.resumed(ident)
    assert any(str(journal) in r.getMessage() and "resuming from the checkpoint" in r.getMessage()
               for r in caplog.records)
    await until(lambda: len(sink.events) == 2, what="fresh's add and delete, replayed")
    assert framed(sink) == [("added", f"{NS}/fresh", ""), ("deleted", f"{NS}/fresh", "")]
    assert sink.events[0].resource_version == rv(fresh)
    await p.shutdown(5)


async def with_a_lagging_sink(client: ApiClient, tmp_path: Path) -> tuple[
    dict[str, Any], RecordingSink, RecordingSink, BridgePipeline, str, AckTracker
]:
    """The start of the crash-and-replay tests: ``x`` created; a pipeline (no periodic checkpoint
    writes) with the sinks ``fast`` and ``slow``, started and synced; a checkpoint written once ``x``
    is acknowledged; then ``slow`` goes down (acknowledges nothing from now on), so the checkpoint
    stays at ``x``'s creation. Returns ``x``, both sinks, the pipeline, its informer id and tracker."""
    x = await create(client, "x")
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await make(client, tmp_path, fast, slow, interval=3600)
    await p.start()
    assert await p.wait_for_sync(10)
    ident = next(iter(p.informers))
    tracker = p.tracker(ident)
    await until(lambda: tracker.resource_version == rv(x) and not tracker.pending, what="x checkpointed")
    await p.write_checkpoints()
    slow.auto_ack = False
    return x, fast, slow, p, ident, tracker


@pytest.mark.parametrize("written", [False, True],
                         ids=["no-write-after-the-relist", "written-after-the-relist"])
async def test_a_lagging_sink_gets_the_changes_it_lacked_before_an_inferred_delete_after_a_crash(
    sim: tuple[Simulator, ApiClient], tmp_path: Path, written: bool
) -> None:
    """One sink is down (it acknowledges nothing, so the checkpoint stays behind) while an object is
    updated and then deleted behind a relist (a 410 mid-watch: the delete is inferred). The other
    sink gets everything; the bridge crashes. After the restart the watch replays from the
    checkpoint: the lagging sink must get the updates it lacked — the watch showed them one by one,
    outside any gap — and then the delete. (One way to the signature of a fault-schedule failure,
    seed 4001: the JetStream sink, behind a NATS restart, missed updates outside any gap marker.)
    The sink that had the inferred delete resumes from its own progress (per-sink resume points):
    it gets none of the updates again — only the real delete, whose id is the inferred one's, when
    its own progress written before the crash does not cover the relist; nothing at all when it
    does (it acknowledged the inferred delete). Checkpoints are written only where the test says:
    whether a periodic write fell between the relist and the crash made this test flaky."""
    server, client = sim
    _x, fast, _slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    u1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    u2 = await client.patch(f"{PATH}/x", {"data": {"v": "2"}})
    await until(lambda: [c[2] for c in fast.changes()][-1:] == [rv(u2)], what="the updates, to the fast sink")
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging the updates")
    assert await p.write_checkpoints() == 1  # fast's own progress has them
    server.set_faults({"delay": 0.3})  # the relist comes after the delete: it infers it
    server.expire_watches()
    gone = await client.delete(f"{PATH}/x")
    server.set_faults({})
    await until(lambda: any(e.type is EventType.GAP_END for e in fast.events), what="the relist's gap")
    assert ("deleted", f"{NS}/x", rv(u2), True) in fast.changes()  # inferred: x's last known state
    assert rv(gone) not in {c[2] for c in fast.changes()}
    if written:
        await until(lambda: not tracker.pending_by_listener().get("fast"),
                    what="fast acknowledging the relist")
        assert await p.write_checkpoints() == 1
        cp = await FileCheckpointStore(directory=tmp_path).load(ident)
        assert cp is not None
        assert cp.sinks is not None
        assert int(cp.sinks["fast"].resource_version) >= int(rv(gone))  # its own progress covers it
    await p.abort()  # the crash: the checkpoint is still at x's creation (the slow sink holds it back)

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow")
    p2 = await make(client, tmp_path, fast2, slow2)
    await p2.start()
    try:
        await _lagging_sink_after_the_restart(p2, ident, fast2, slow2, u1, u2, gone, covered=written)
    finally:
        await p2.shutdown(5)


async def _lagging_sink_after_the_restart(p2: BridgePipeline, ident: str, fast2: RecordingSink,
                                          slow2: RecordingSink, u1: dict[str, Any], u2: dict[str, Any],
                                          gone: dict[str, Any], *, covered: bool = False) -> None:
    assert p2.resumed(ident)
    await until(lambda: any(c[0] == "deleted" for c in slow2.changes()), what="x's delete, to the slow sink")
    assert [(c[0], c[2]) for c in slow2.changes()] == [("updated", rv(u1)), ("updated", rv(u2)),
                                                        ("deleted", rv(gone))]
    assert all(e.gap is None for e in slow2.events)  # observed on the watch, one by one
    if covered:
        tracker = p2.tracker(ident)
        await until(lambda: tracker.lag == 0, what="everything acknowledged")
        assert fast2.changes() == []  # its own progress has the (inferred) delete
        return
    await until(lambda: any(c[0] == "deleted" for c in fast2.changes()), what="x's delete, to the fast sink")
    assert [(c[0], c[2]) for c in fast2.changes()] == [("deleted", rv(gone))]
    (fast_delete,) = [e for e in fast2.events if e.type is EventType.DELETED]
    (slow_delete,) = [e for e in slow2.events if e.type is EventType.DELETED]
    assert event_id(fast_delete) == event_id(slow_delete)  # one delete per uid, the inferred one's id


def has_gap_end(sink: RecordingSink) -> bool:
    return any(e.type is EventType.GAP_END for e in sink.events)


async def test_two_restarts_relisting_from_the_same_checkpoint_send_distinct_gaps(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """A sink that is down holds the checkpoint back, so two restarts in a row resume from the same
    resourceVersion and, the history being compacted each time, both relist from it. Their gaps have
    different windows (each ends at its own list's resourceVersion) and must have different ids:
    markers with one id are one event to a consumer that drops repeated ids — JetStream drops the
    second run's markers as duplicates, and the window it keeps is too short: the JetStream sink
    then misses changes outside any gap it knows (the other way to the seed-4001 signature)."""
    server, client = sim
    await create(client, "a")
    await first_run(client, tmp_path)
    gaps: list[set[tuple[str, str, str]]] = []
    for n in range(2):
        await create(client, f"b{n}")
        server.compact()
        sink, down = RecordingSink("rec"), RecordingSink("down", auto_ack=False)
        p = await make(client, tmp_path, sink, down)
        await p.start()
        await until(functools.partial(has_gap_end, sink), what="the gap's end")
        gaps.append({(e.gap.id, e.gap.from_resource_version, e.gap.to_resource_version)
                     for e in sink.events if e.type is EventType.GAP_END and e.gap is not None})
        await p.abort()  # a crash: the checkpoint never moved (the down sink acknowledged nothing)
    [(first_id, first_from, first_to)], [(second_id, second_from, second_to)] = gaps
    assert first_from == second_from
    assert first_to != second_to
    assert first_id != second_id


async def test_a_second_crash_during_the_replay_keeps_holding_what_the_relist_coalesced(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """A sink that is down holds the checkpoint back while an object is updated twice, then updated
    once more and deleted behind a relist (lists refused a while after a 410): the relist infers the
    delete with the second update's state; the third update reached no sink one by one. Crash. The
    restart replays the object's history and holds that update back (the replayed delete is framed
    as a gap); the sink is still down, and the bridge crashes again before any checkpoint write. The
    journal now holds the delete the replay sent (observed, not inferred): the second restart must
    still hold the coalesced update back — sent after the delete the other sink holds, it would bring
    the object back for good for a consumer that drops repeated ids (the delete after it has the
    uid's delete id, already seen)."""
    server, client = sim
    _x, fast, _slow, p, _ident, tracker = await with_a_lagging_sink(client, tmp_path)
    await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    u2 = await client.patch(f"{PATH}/x", {"data": {"v": "2"}})
    await until(lambda: [c[2] for c in fast.changes()][-1:] == [rv(u2)], what="the updates, to the fast sink")
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging the updates")
    assert await p.write_checkpoints() == 1
    server.set_faults({"error_code": 503, "error_count": 1000, "error_target": "list",
                       "error_retry_after": 1})
    assert server.expire_watches() >= 1
    u3 = await client.patch(f"{PATH}/x", {"data": {"v": "3"}})
    gone = await client.delete(f"{PATH}/x")
    server.set_faults({})
    await until(lambda: ("deleted", f"{NS}/x", rv(u2), True) in fast.changes(), what="the inferred delete")
    await p.abort()

    runs: list[RecordingSink] = [fast]
    for down in (True, False):  # the second run crashes with the slow sink still down
        fast_n, slow_n = RecordingSink("fast"), RecordingSink("slow", auto_ack=not down)
        p_n = await make(client, tmp_path, fast_n, slow_n, interval=3600)
        await p_n.start()
        try:
            await until(functools.partial(has_delete, slow_n), what="x's delete, to slow")
            await until(functools.partial(has_delete, fast_n), what="x's delete, to fast")
            assert rv(u3) not in [c[2] for c in fast_n.changes() + slow_n.changes()]
        finally:
            await (p_n.abort() if down else p_n.shutdown(5))
        runs.append(fast_n)
    # Read as a consumer that drops repeated ids, the fast sink holds no x.
    seen: set[str] = set()
    alive: str | None = None
    for e in (e for sink in runs for e in sink.events):
        if event_id(e) in seen or e.type not in (EventType.ADDED, EventType.UPDATED, EventType.DELETED):
            continue
        seen.add(event_id(e))
        alive = None if e.type is EventType.DELETED else e.resource_version
    assert alive is None
    # Both replays framed the delete alike: one window, one id.
    windows = {(e.gap.id, e.gap.from_resource_version, e.gap.to_resource_version)
               for sink in runs[1:] for e in sink.events if e.type is EventType.GAP_END and e.gap is not None}
    assert windows == {(next(iter(windows))[0], rv(u2), rv(gone))}


def has_delete(sink: RecordingSink) -> bool:
    return any(c[0] == "deleted" for c in sink.changes())


REFUSE_LISTS = {"error_code": 503, "error_count": 1000, "error_target": "list", "error_retry_after": 0}
"""Lists answer 503 until the faults are reset: a relist comes only after the changes made meanwhile."""


async def test_a_restart_never_sends_the_changes_a_relist_coalesced_after_the_state_it_sent(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """A sink that is down holds the checkpoint back. Behind a relist (a 410 mid-watch, the list
    answered late), ``x`` is updated twice and ``y`` created and updated: the relist coalesces them,
    the sink that is up gets ``x`` at its second update and ``y`` added at its update (inside the
    gap), then a live update of ``x``. Crash before any checkpoint covers the relist; the watch,
    resumed from the checkpoint (history kept), replays every change since. The signature of the
    fault-schedule failure of seed 3002 (order violations in a sink after a kill): the replay sent
    the coalesced changes — ``x``'s first update, ``y``'s creation — after the newer states the sink
    held. Per-object order: no sink may get a change older than one it had, unless it is the same
    event again (same id); the lagging sink learns of the held-back changes from a gap window."""
    server, client = sim
    x, fast, _slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    server.set_faults(REFUSE_LISTS)  # the relist's list comes after the changes: it coalesces them
    server.expire_watches()
    u1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    u2 = await client.patch(f"{PATH}/x", {"data": {"v": "2"}})
    y1 = await create(client, "y")
    y2 = await client.patch(f"{PATH}/y", {"data": {"v": "2"}})
    server.set_faults({})
    await until(lambda: any(e.type is EventType.GAP_END for e in fast.events), what="the relist's gap")
    assert ("updated", f"{NS}/x", rv(u2), False) in fast.changes()
    assert ("added", f"{NS}/y", rv(y2), False) in fast.changes()
    assert not {rv(u1), rv(y1)} & {c[2] for c in fast.changes()}  # coalesced
    u3 = await client.patch(f"{PATH}/x", {"data": {"v": "3"}})
    await until(lambda: fast.changes()[-1:] == [("updated", f"{NS}/x", rv(u3), False)],
                what="x's live update")
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging")
    await p.abort()  # the crash: no checkpoint written since x's creation

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow")
    p2 = await make(client, tmp_path, fast2, slow2, interval=3600)
    await p2.start()
    try:
        assert p2.resumed(ident)
        tracker2 = p2.tracker(ident)
        def has_u3(sink: RecordingSink) -> bool:
            return (f"{NS}/x", rv(u3)) in {(c[1], c[2]) for c in sink.changes()}

        for sink in (fast2, slow2):
            await until(functools.partial(has_u3, sink), what=f"x's last update, to {sink.name}")
        await until(lambda: tracker2.lag == 0, what="everything acknowledged")
        for before, after in ((fast, fast2), (RecordingSink("none"), slow2)):
            # What a consumer of the sink holds across the crash, in order: per object, never a
            # change older than one it already had, unless it is that same event again.
            held: dict[str, tuple[int, set[str]]] = {}
            for e in [*before.events, *after.events]:
                if e.type not in (EventType.ADDED, EventType.UPDATED, EventType.DELETED):
                    continue
                top, ids = held.get(e.subject, (0, set()))
                ident_ = event_id(e)
                assert int(e.resource_version) >= top or ident_ in ids, (
                    f"{after.name}: {e.type.value} {e.subject}@{e.resource_version} after @{top}")
                held[e.subject] = (max(top, int(e.resource_version)), ids | {ident_})
        # Per object (there is no order between objects): the relist's states again, as it sent
        # them (the same ids as in the sink that had them), then what came after.
        for name, expected in (("x", [("updated", rv(u2)), ("updated", rv(u3))]), ("y", [("added", rv(y2))])):
            assert [(c[0], c[2]) for c in slow2.changes() if c[1] == f"{NS}/{name}"] == expected
        # In place of the held changes, an update from the state before the window (what the
        # lagging sink holds): a merge patch built from it applies to that state.
        (resent,) = [e for e in slow2.events if e.subject == f"{NS}/x" and e.resource_version == rv(u2)]
        assert resent.old is not None
        assert resent.old["metadata"]["resourceVersion"] == rv(x)
        kinds = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)
        first = {(e.subject, e.resource_version): event_id(e) for e in fast.events if e.type in kinds}
        again = [e for e in fast2.events if (e.subject, e.resource_version) in first]
        assert again
        assert all(first[(e.subject, e.resource_version)] == event_id(e) for e in again)
        # The lagging sink never had the relist: gap windows tell it what it did not get one by one.
        windows = [(e.gap.from_resource_version, e.gap.to_resource_version) for e in slow2.events
                   if e.type is EventType.GAP_END and e.gap is not None]
        for lost in (rv(u1), rv(y1)):
            assert any(int(lo) < int(lost) <= int(hi) for lo, hi in windows), (lost, windows)
    finally:
        await p2.shutdown(5)


async def test_an_inferred_delete_every_sink_acknowledged_still_holds_back_the_replay_after_a_crash(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """Behind a relist, ``x`` is updated and deleted: the relist infers the delete with x's last
    known state, older than the checkpoint's resourceVersion. Every sink acknowledges the inferred
    delete, but one sink not yet the relist's end: the checkpoint written then stays at the relist's
    start, and its index no longer holds x (a relist's delete happened no later than the list). The
    journal must keep the inferred delete all the same: after a crash the watch, resumed from that
    checkpoint, replays x's update and real delete, and only that record makes the restart hold the
    update back (section 6). Seen in the fault schedule of seed 3002: the update went out, as an
    ``added``, after the delete the sink held."""
    server, client = sim
    x, _fast, slow, p, ident, tracker = await with_a_lagging_sink(client, tmp_path)
    server.set_faults(REFUSE_LISTS)  # the relist comes after x's update and delete: it infers it
    server.expire_watches()
    x1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    gone = await client.delete(f"{PATH}/x")
    server.set_faults({})
    await until(lambda: any(e.type is EventType.GAP_END for e in slow.events), what="the relist, to slow")
    assert ("deleted", f"{NS}/x", rv(x), True) in slow.changes()
    end = slow.unacked.pop()
    assert end[0].type is EventType.GAP_END
    slow.ack_all()  # everything but the relist's end
    slow.unacked = [end]
    await until(lambda: not tracker.pending_by_listener().get("fast"), what="fast acknowledging")
    await until(lambda: tracker.pending_by_listener().get("slow") == 1, what="slow acknowledging")
    assert await p.write_checkpoints() == 1
    await p.abort()  # the crash

    fast2, slow2 = RecordingSink("fast"), RecordingSink("slow")
    p2 = await make(client, tmp_path, fast2, slow2, interval=3600)
    await p2.start()
    try:
        assert p2.resumed(ident)
        tracker2 = p2.tracker(ident)
        await until(lambda: int(tracker2.resource_version or 0) >= int(rv(gone)) and tracker2.lag == 0,
                    what="the replay, acknowledged")
        for sink in (fast2, slow2):
            # Nothing of x but the delete it already holds (x1 would bring x back).
            assert rv(x1) not in {c[2] for c in sink.changes() if c[1] == f"{NS}/x"}, sink.changes()
    finally:
        await p2.shutdown(5)
