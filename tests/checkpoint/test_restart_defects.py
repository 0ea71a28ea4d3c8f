"""Two restart defects of issue 24, reproduced in-process against the API-server simulator.

* **A replayed change after a delete already sent.** A relist inferred an object's delete; a restart
  replayed the object's history, held back the changes that relist had coalesced and sent the real
  delete framed as a gap. The journal must keep saying so: a second restart that replays the same
  history (the checkpoint still behind, one sink down) must hold the same changes back again. Seen
  in the fault schedule's combined profile: a sink got ``deleted`` (framed), then an older
  ``updated``, then the same ``deleted`` again: a consumer that drops repeated ids keeps a phantom.
* **A crash before the first checkpoint write.** The bridge listed, delivered, watched and
  delivered changes, and was killed before its first checkpoint write. Restarted while the server
  still holds the history, it must deliver every change made meanwhile, one by one (or, had the
  history expired, frame the relist as a gap) — not list from scratch as if sinks held nothing.
  Before every sink acknowledged the first list, it lists again at exactly that list's
  resourceVersion and watches from it; only when that resourceVersion expired is the list framed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from sinks.cloudevents import event_id
from sinks.contract import ChangeEvent, EventType
from tests.checkpoint.crash_harness import BridgeProcess, file_events, sim_process
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until
from tests.checkpoint.test_resume_sim import NS, PATH, REFUSE_LISTS, create, make, rv

CHANGES = (EventType.ADDED, EventType.UPDATED, EventType.DELETED)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.5) as world:
        yield world


def dedup_consumer(events: list[ChangeEvent]) -> tuple[dict[str, str], list[str]]:
    """What a consumer that drops repeated ids ends with (subject → resourceVersion), and the
    per-object order violations it saw: a change older than one it already applied, or a change of
    a uid after that uid's delete (a uid is deleted once: the consumer keeps a phantom)."""
    seen: set[str] = set()
    deleted: set[str] = set()
    state: dict[str, str] = {}
    top: dict[str, int] = {}
    violations: list[str] = []
    for e in events:
        if e.type not in CHANGES:
            continue
        ident = event_id(e)
        if ident in seen:
            continue
        seen.add(ident)
        at = int(e.resource_version)
        if at < top.get(e.subject, 0):
            violations.append(f"{e.type.value} {e.subject}@{at} after @{top[e.subject]}")
        elif e.uid in deleted:
            violations.append(f"{e.type.value} {e.subject}@{at} after the delete of its uid")
        top[e.subject] = max(top.get(e.subject, 0), at)
        if e.type is EventType.DELETED:
            deleted.add(e.uid)
            state.pop(e.subject, None)
        else:
            state[e.subject] = e.resource_version
    return state, violations


async def test_a_second_restart_holds_back_what_the_first_replay_held_for_an_object_the_base_never_knew(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """``x`` is created after the last checkpoint write (the base never knew it), updated, then
    updated again and deleted behind a relist that infers its delete. Run 2 replays x's history
    (the checkpoint is held back by a sink that is down): it holds the coalesced update back and
    sends the real delete framed. Crash. Run 3 replays the same history: the delete the fast sink
    holds must stay its last word on x (no update after it, for any consumer)."""
    server, client = sim
    await create(client, "w")
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    p = await make(client, tmp_path, fast, slow, interval=3600)
    await p.start()
    assert await p.wait_for_sync(10)
    ident = next(iter(p.informers))
    tracker = p.tracker(ident)
    await until(lambda: bool(tracker.resource_version) and not tracker.pending, what="w acknowledged")
    assert await p.write_checkpoints() == 1  # the base: w alone
    slow.auto_ack = False
    x = await create(client, "x")
    u1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
    await until(lambda: ("updated", f"{NS}/x", rv(u1), False) in fast.changes(), what="u1, to fast")
    server.set_faults(REFUSE_LISTS)
    assert server.expire_watches() >= 1
    u2 = await client.patch(f"{PATH}/x", {"data": {"v": "2"}})
    gone = await client.delete(f"{PATH}/x")
    server.set_faults({})
    await until(lambda: ("deleted", f"{NS}/x", rv(u1), True) in fast.changes(), what="the inferred delete")
    await p.abort()

    runs: list[RecordingSink] = [fast]
    for last in (False, True):
        fast_n, slow_n = RecordingSink("fast"), RecordingSink("slow", auto_ack=last)
        p_n = await make(client, tmp_path, fast_n, slow_n, interval=3600)
        await p_n.start()
        try:
            await until(lambda s=fast_n: ("deleted", f"{NS}/x", rv(gone), False) in s.changes()  # type: ignore[misc]
                        or any(e.type is EventType.DELETED and e.resource_version == rv(gone)
                               for e in s.events), what="x's delete, replayed to fast")
            if last:
                t = p_n.tracker(ident)
                await until(lambda t=t: t.lag == 0, what="everything acknowledged")  # type: ignore[misc]
        finally:
            await (p_n.shutdown(5) if last else p_n.abort())
        runs.append(fast_n)
    every = [e for sink in runs for e in sink.events]
    state, violations = dedup_consumer(every)
    assert violations == []
    assert f"{NS}/x" not in state
    assert rv(u2) not in {e.resource_version for e in every if e.subject == f"{NS}/x"}
    assert rv(x) in {e.resource_version for e in every if e.subject == f"{NS}/x"}


async def test_a_crash_before_the_first_checkpoint_write_delivers_every_change_made_meanwhile(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """The first run lists, delivers, watches, and is killed before any checkpoint write. While it
    is down, ``a`` is updated twice, ``b`` deleted and ``c`` created (the server keeps the history).
    The restart must deliver each of those changes, one by one, in order, outside any gap — or,
    had it relisted, inside a gap window; here the history is there, so no window is needed."""
    _, client = sim
    a = await create(client, "a", v="0")
    await create(client, "b", v="0")
    sink = RecordingSink("rec")
    p = await make(client, tmp_path, sink, interval=3600)
    await p.start()
    assert await p.wait_for_sync(10)
    live = await client.patch(f"{PATH}/a", {"data": {"v": "live"}})
    await until(lambda: ("updated", f"{NS}/a", rv(live), False) in sink.changes(), what="a live update")
    await p.abort()  # killed before its first checkpoint write
    assert await FileCheckpointStore(directory=tmp_path).load(next(iter(p.informers))) is None
    assert rv(a) in {c[2] for c in sink.changes()}

    made: list[tuple[str, str, str]] = []
    for v in ("1", "2"):
        o = await client.patch(f"{PATH}/a", {"data": {"v": v}})
        made.append(("updated", f"{NS}/a", rv(o)))
    o = await client.delete(f"{PATH}/b")
    made.append(("deleted", f"{NS}/b", rv(o)))
    o = await create(client, "c")
    made.append(("added", f"{NS}/c", rv(o)))

    sink2 = RecordingSink("rec")
    p2 = await make(client, tmp_path, sink2, interval=3600)
    await p2.start()
    try:
        await until(lambda: ("added", f"{NS}/c", made[-1][2]) in {c[:3] for c in sink2.changes()},
                    what="c's creation")
        t = p2.tracker(next(iter(p2.informers)))
        await until(lambda: t.lag == 0, what="everything acknowledged")
        got = [(c[0], c[1], c[2]) for c in sink2.changes()]
        for change in made:  # each change, one by one
            assert change in got, (change, got)
        assert [c for c in got if c[1] == f"{NS}/a" and c in made] == made[:2]  # in order
        gaps = [e for e in sink2.events if e.type in (EventType.GAP_BEGIN, EventType.GAP_END)]
        assert gaps == []  # the history was kept: nothing to frame
        state, violations = dedup_consumer([*sink.events, *sink2.events])
        assert violations == []
        assert state == {f"{NS}/a": made[1][2], f"{NS}/c": made[3][2]}
    finally:
        await p2.shutdown(5)



async def test_a_crash_before_every_sink_acknowledged_the_first_list_lists_it_again_exactly(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """One sink acknowledges nothing of the first list, the other gets it and a live change; the
    bridge is killed and ``a`` changes while it is down. Nobody acknowledged a resume point, so the
    restart lists at exactly the first list's resourceVersion — the same states, the same event ids
    (an id-deduplicating consumer drops them) — and watches from there: the live change and the
    later one come one by one, no gap (resume plan, invariant 6)."""
    _, client = sim
    a = await create(client, "a", v="0")
    fast, down = RecordingSink("fast"), RecordingSink("down", auto_ack=False)
    p = await make(client, tmp_path, fast, down, interval=3600)
    await p.start()
    assert await p.wait_for_sync(10)
    live = await client.patch(f"{PATH}/a", {"data": {"v": "live"}})
    await until(lambda: ("updated", f"{NS}/a", rv(live), False) in fast.changes(), what="a live update")
    first = [e for e in fast.events if e.subject == f"{NS}/a" and e.type is EventType.ADDED]
    await p.abort()
    later = await client.patch(f"{PATH}/a", {"data": {"v": "later"}})

    fast2, down2 = RecordingSink("fast"), RecordingSink("down")
    p2 = await make(client, tmp_path, fast2, down2, interval=3600)
    await p2.start()
    try:
        wanted = ("updated", f"{NS}/a", rv(later), False)
        await until(lambda: wanted in fast2.changes() and wanted in down2.changes(),
                    what="the change made while down")
        for sink in (fast2, down2):
            assert sink.changes() == [("added", f"{NS}/a", rv(a), False),
                                      ("updated", f"{NS}/a", rv(live), False),
                                      ("updated", f"{NS}/a", rv(later), False)]
            assert not [e for e in sink.events if e.type in (EventType.GAP_BEGIN, EventType.GAP_END)]
        again = [e for e in fast2.events if e.type is EventType.ADDED]
        assert [event_id(e) for e in again] == [event_id(e) for e in first]  # the same ids
    finally:
        await p2.shutdown(5)


async def test_a_crash_before_every_sink_acknowledged_the_first_list_frames_the_relist_once_it_expired(
    sim: tuple[Simulator, ApiClient], tmp_path: Path
) -> None:
    """The same crash, and the server compacts its history while the bridge is down: the first
    list's resourceVersion is gone (410), so the restart lists the current state and frames it as a
    gap from that resourceVersion, since sinks hold state from then; ``b``, created and deleted
    while the first run ran (only the journal knows it), gets its delete inside that window."""
    _, client = sim
    a = await create(client, "a", v="0")
    fast, down = RecordingSink("fast"), RecordingSink("down", auto_ack=False)
    p = await make(client, tmp_path, fast, down, interval=3600)
    await p.start()
    assert await p.wait_for_sync(10)
    b = await create(client, "b", v="0")
    await until(lambda: ("added", f"{NS}/b", rv(b), False) in fast.changes(), what="b's add")
    await p.abort()
    await client.delete(f"{PATH}/b")
    later = await client.patch(f"{PATH}/a", {"data": {"v": "later"}})
    await client.request("POST", "/_sim/compact")

    fast2, down2 = RecordingSink("fast"), RecordingSink("down")
    p2 = await make(client, tmp_path, fast2, down2, interval=3600)
    await p2.start()
    try:
        await until(lambda: any(e.type is EventType.GAP_END for e in fast2.events), what="the gap's end")
        ends = [e.gap for e in fast2.events if e.type is EventType.GAP_END and e.gap is not None]
        assert [g.from_resource_version for g in ends] == [rv(a)]  # the first list's resourceVersion
        # a's latest state, inside the window (as an add: the journal cannot say who had a).
        (state,) = [e for e in fast2.events if e.subject == f"{NS}/a"]
        assert (state.type, state.resource_version) == (EventType.ADDED, rv(later))
        assert state.gap is not None
        assert state.gap.id == ends[0].id
        (gone,) = [e for e in fast2.events if e.subject == f"{NS}/b"]
        assert gone.type is EventType.DELETED
        assert gone.gap is not None
        assert gone.gap.id == ends[0].id
    finally:
        await p2.shutdown(5)


@pytest.mark.timeout(120)
async def test_a_bridge_process_killed_before_its_first_checkpoint_write_resumes_from_its_first_list(
    tmp_path: Path,
) -> None:
    """The same crash with real processes: the bridge (``tests.checkpoint.bridge_proc``, a file sink,
    checkpoints every hour) is SIGKILLed about a second after it delivered its first list and a live
    change; changes are made while it is down (the simulator keeps the history); the restarted
    process delivers each of them, one by one, outside any gap. (Killed before the acknowledgement
    of its first list is durable, it lists again at exactly the first list's resourceVersion and
    watches from there, as the third test shows.)"""
    out = tmp_path / "out.jsonl"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    ident = informer_id("configmaps", NS, "", "")
    async with sim_process(tmp_path, namespaces=(NS,)) as (_, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        args = ["--kubeconfig", str(kubeconfig), "--resource", "configmaps", "--namespace", NS,
                "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "3600",
                "--file", str(out)]
        bridge = BridgeProcess(args, log=tmp_path / "bridge.log")
        try:
            for name in ("a", "b"):
                await create(client, name, v="0")
            await bridge.start()
            await bridge.wait_synced()
            live = await client.patch(f"{PATH}/a", {"data": {"v": "live"}})
            await until_file(out, lambda seen: ("updated", f"{NS}/a", rv(live)) in seen, "the live change")
            await asyncio.sleep(1.0)  # killed about a second after start, as in the report
            await bridge.kill()
            assert await store.load(ident) is None  # no checkpoint was written
            made = [("updated", f"{NS}/a", rv(await client.patch(f"{PATH}/a", {"data": {"v": "1"}}))),
                    ("deleted", f"{NS}/b", rv(await client.delete(f"{PATH}/b"))),
                    ("added", f"{NS}/c", rv(await create(client, "c")))]
            before = len(file_events(out))
            await bridge.start()
            await bridge.wait_synced()
            await until_file(out, lambda seen: set(made) <= set(seen), "every change made while down")
            after = file_events(out)[before:]
            assert not [e for e in after if str(e["type"]).endswith(("gap.begin", "gap.end"))]
        finally:
            await bridge.kill()
            await client.close()


def changes_in(path: Path) -> list[tuple[str, str, str]]:
    """(type, subject, resourceVersion) of every change event in the file sink's output."""
    out = []
    for e in file_events(path):
        kind = str(e["type"]).rsplit(".", 1)[-1]
        if kind in ("added", "updated", "deleted"):
            out.append((kind, str(e["subject"]), str(e["resourceversion"])))
    return out


async def until_file(path: Path, predicate: Callable[[list[tuple[str, str, str]]], bool],
                     what: str) -> None:
    await until(lambda: predicate(changes_in(path)), 30, what=what)
