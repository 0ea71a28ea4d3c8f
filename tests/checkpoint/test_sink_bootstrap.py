"""Issue #13: a sink added to a running deployment is bootstrapped; a sink removed loses its progress.

Real processes: the simulator under churn, the bridge (``tests.checkpoint.bridge_proc``) with file
sinks, a file checkpoint store and a spill directory.

1. The bridge runs with sink ``a`` under churn, and stops (SIGTERM).
2. Sink ``b`` is added to the configuration; churn goes on while the bridge is down and after it is
   back. ``b``'s first record is the ``snapshot.begin`` of its bootstrap snapshot (no change of the
   resource reaches it before), and replaying ``b`` (snapshot, then changes) gives exactly the
   simulator's objects, whole (their data, not checkpoint stubs). ``a`` receives no re-sends: every
   change it holds, counted from its own file, was delivered once, and it got no snapshot.
3. ``b`` is removed: after the restart the checkpoint no longer has its progress, and its spill
   directory is gone.

A second run adds ``b`` while the simulator fails every list request (503) for a few seconds: the
start-up list of the bootstrap fails, the resumed watch goes on (no 410, so no relist comes), and
``a`` keeps receiving the changes. ``b`` receives nothing until the API answers lists again; then it
is bootstrapped as above, and the checkpoint covers it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.sim import Simulator
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from bridge.testing.processes import wait_until
from sinks.contract import DeliveryOutcome, EventType
from tests.checkpoint.crash_harness import BridgeProcess, Churn, event_kind, file_events, sim_process
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until, watched_over_http

NS = "boot"
IDENT = informer_id("configmaps", NS, "", "")
PATH = f"/api/v1/namespaces/{NS}/configmaps"
CHANGES = ("added", "updated", "deleted")


def consumer_view(events: list[dict[str, Any]]) -> dict[str, tuple[str, str, Any]]:
    """What a consumer holds after applying the events in order (a snapshot's ``sync`` objects
    included): uid → (subject, resourceVersion, the ConfigMap's data)."""
    state: dict[str, tuple[str, str, Any] | None] = {}
    for e in events:
        t = event_kind(e)
        if t not in (*CHANGES, "sync"):
            continue
        state[e["uid"]] = None if t == "deleted" else (e["subject"], e["resourceversion"],
                                                       (e.get("data") or {}).get("data"))
    return {u: s for u, s in state.items() if s is not None}


async def live(client: ApiClient) -> dict[str, tuple[str, str, Any]]:
    listed = await client.get(PATH)
    return {i["metadata"]["uid"]: (f"{NS}/{i['metadata']['name']}", i["metadata"]["resourceVersion"],
                                   i.get("data")) for i in listed["items"]}


async def covered(store: FileCheckpointStore) -> set[str] | None:
    """The sinks the stored checkpoint covers (None: no checkpoint, or one without the section)."""
    cp = await store.load(IDENT)
    return None if cp is None or cp.sinks is None else set(cp.sinks)


def bridge_args(kubeconfig: Path, tmp_path: Path, *sinks: str) -> list[str]:
    """The bridge process's arguments: configmaps in NS, checkpoints every 0.1 s in the file store
    under ``tmp_path / "ckpt"``, the spill under ``tmp_path / "spill"``, and ``sinks``."""
    return ["--kubeconfig", str(kubeconfig), "--resource", "configmaps", "--namespace", NS,
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "0.1",
            "--spill-dir", str(tmp_path / "spill"), *(f"--sink={s}" for s in sinks)]


async def checkpoint_at(store: FileCheckpointStore, rv: str) -> bool:
    cp = await store.load(IDENT)
    return cp is not None and int(cp.resource_version) >= int(rv)


async def run_a_under_churn(stack: contextlib.AsyncExitStack, args: list[str], tmp_path: Path,
                            store: FileCheckpointStore, churn: Churn, out_a: Path, *,
                            seconds: float) -> tuple[int, int]:
    """Runs the bridge with sink ``a`` alone while ``churn`` runs: started once objects exist,
    stopped (SIGTERM) ``seconds`` after its sync, its checkpoint covering ``a`` alone. Returns how
    many changes the churn had made before a's first list (coalesced by it) and how many events
    ``a`` holds."""
    with_a = BridgeProcess(args, log=tmp_path / "bridge.log")
    stack.push_async_callback(with_a.kill)
    await asyncio.sleep(0.5)  # objects exist before the bridge's first list
    await with_a.start()
    await with_a.wait_synced()
    listed_by_a = len(churn.produced)  # the changes before were coalesced by a's first list
    await asyncio.sleep(seconds)
    await with_a.stop()
    assert await covered(store) == {"a"}
    return listed_by_a, len(file_events(out_a))


def check_bootstrapped(b: list[dict[str, Any]], final: dict[str, tuple[str, str, Any]]) -> tuple[
        int, list[dict[str, Any]]]:
    """``b`` received the snapshot first, whole objects, then the changes; together the simulator's
    state (``final``). Returns where the snapshot ends and its ``sync`` events."""
    assert event_kind(b[0]) == "snapshot.begin", [event_kind(e) for e in b[:3]]
    end = next(i for i, e in enumerate(b) if event_kind(e) == "snapshot.end")
    snapshot = b[1:end]
    assert snapshot
    assert all(event_kind(e) == "sync" for e in snapshot)
    assert all((e.get("data") or {}).get("data") for e in snapshot)  # whole objects, not stubs
    assert any(event_kind(e) in CHANGES for e in b[end + 1:])  # then the live stream
    assert consumer_view(b) == final
    return end, snapshot


def check_sent_once(a: list[dict[str, Any]], final: dict[str, tuple[str, str, Any]], churn: Churn,
                    listed_by_a: int) -> None:
    """``a`` got every change the churn made after its first list, each once, and its view is the
    simulator's state (``final``)."""
    counts = collections.Counter((event_kind(e), e["uid"], e["resourceversion"]) for e in a
                                 if event_kind(e) in CHANGES)
    resent = {k: n for k, n in counts.items() if n > 1}
    assert not resent, f"{len(resent)} changes sent to a more than once, e.g. {list(resent)[:5]}"
    assert consumer_view(a) == final
    produced = {(t, u, rv) for t, _, u, rv in churn.produced[listed_by_a:]}
    assert produced <= set(counts)  # a missed nothing


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_new_sink_is_bootstrapped_and_a_removed_one_forgotten(tmp_path: Path) -> None:
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    spill = tmp_path / "spill"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")

    async with contextlib.AsyncExitStack() as stack:
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))

        def args(*sinks: str) -> list[str]:
            return bridge_args(kubeconfig, tmp_path, *sinks)

        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        churn = Churn(client=client, namespace=NS, rate=100.0, seed=13)
        churn_task = asyncio.create_task(churn.run(), name="bootstrap-churn")
        stack.callback(churn.stop)
        listed_by_a, a_before = await run_a_under_churn(stack, args(f"a=file:{out_a}"), tmp_path, store,
                                                        churn, out_a, seconds=1.5)

        await asyncio.sleep(0.5)  # changes while the bridge is down
        with_b = BridgeProcess(args(f"a=file:{out_a}", f"b=file:{out_b}"), log=tmp_path / "bridge.log")
        stack.push_async_callback(with_b.kill)
        await with_b.start()
        await with_b.wait_synced()
        await asyncio.sleep(1.5)
        churn.stop()
        await churn_task
        await wait_until(lambda: checkpoint_at(store, churn.last_rv), timeout=30,
                         what="a checkpoint covering every change")

        async def b_covered() -> bool:
            return await covered(store) == {"a", "b"}

        await wait_until(b_covered, timeout=10, what="the checkpoint to cover b once bootstrapped")
        await with_b.stop()
        final = await live(client)
        assert any(d.name.startswith("b-") for d in spill.iterdir())

        check_bootstrapped(file_events(out_b), final)

        # a: nothing re-sent by b's arrival (or by the restart), no snapshot; its own view is right.
        a = file_events(out_a)
        assert len(a) > a_before
        assert not any(event_kind(e).startswith("snapshot") for e in a)
        check_sent_once(a, final, churn, listed_by_a)

        # b removed: its progress goes at the next checkpoint write, its spill at start.
        only_a = BridgeProcess(args(f"a=file:{out_a}"), log=tmp_path / "bridge.log")
        stack.push_async_callback(only_a.kill)
        await only_a.start()
        await only_a.wait_synced()

        async def b_forgotten() -> bool:
            return await covered(store) == {"a"}

        await wait_until(b_forgotten, timeout=10, what="the checkpoint to drop b's progress")
        assert not any(d.name.startswith("b-") for d in spill.iterdir())
        await only_a.stop()
        assert len(file_events(out_a)) == len(a)  # nothing happened meanwhile, nothing re-sent


async def sim_faults(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """Sets (or, with ``{"reset": True}``, clears) the simulator's faults; returns their state."""
    async with http.post(f"{url}/_sim/faults", json=body) as resp:
        resp.raise_for_status()
        state: dict[str, Any] = await resp.json()
        return state


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_a_bootstrap_whose_start_up_list_fails_is_taken_once_lists_answer(tmp_path: Path) -> None:
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")

    async with contextlib.AsyncExitStack() as stack:
        url, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))

        def args(*sinks: str) -> list[str]:
            return bridge_args(kubeconfig, tmp_path, *sinks)

        http = await stack.enter_async_context(aiohttp.ClientSession())
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        for i in range(3):  # never changed: only the start-up list (or its retry) has them whole
            await client.create(PATH, {"metadata": {"name": f"still-{i}"}, "data": {"v": str(i)}})
        churn = Churn(client=client, namespace=NS, rate=60.0, seed=29)
        churn_task = asyncio.create_task(churn.run(), name="bootstrap-churn")
        stack.callback(churn.stop)
        listed_by_a, a_before = await run_a_under_churn(stack, args(f"a=file:{out_a}"), tmp_path, store,
                                                        churn, out_a, seconds=1.0)

        # Every list fails (the API client's own retries included); watches and writes go on.
        await sim_faults(http, url, {"error_code": 503, "error_count": 1_000_000, "error_target": "list",
                                     "error_retry_after": 0})
        with_b = BridgeProcess(args(f"a=file:{out_a}", f"b=file:{out_b}"), log=tmp_path / "bridge.log")
        stack.push_async_callback(with_b.kill)
        await with_b.start()
        await with_b.wait_synced()

        async def lists_failed() -> bool:
            async with http.get(f"{url}/_sim/faults") as resp:
                return int((await resp.json())["errors_injected"]) > 0

        await wait_until(lists_failed, timeout=30, what="the bootstrap's start-up list to fail")
        await asyncio.sleep(3.0)  # the API refuses lists a while; changes go on
        assert file_events(out_b) == []  # nothing reaches b before its snapshot
        a_during = len(file_events(out_a))
        assert a_during > a_before  # a follows the live stream meanwhile
        await sim_faults(http, url, {"reset": True})

        async def b_covered() -> bool:
            return await covered(store) == {"a", "b"}

        await wait_until(b_covered, timeout=60, what="the checkpoint to cover b once bootstrapped")
        await asyncio.sleep(1.0)  # live changes after b's snapshot
        churn.stop()
        await churn_task
        await wait_until(lambda: checkpoint_at(store, churn.last_rv), timeout=30,
                         what="a checkpoint covering every change")
        await with_b.stop()
        final = await live(client)

        b = file_events(out_b)
        end, snapshot = check_bootstrapped(b, final)
        assert {e["subject"] for e in snapshot} >= {f"{NS}/still-{i}" for i in range(3)}
        assert not any(event_kind(e).startswith("snapshot") for e in b[end + 1:])  # one snapshot

        a = file_events(out_a)
        assert not any(event_kind(e).startswith(("snapshot", "gap")) for e in a)
        check_sent_once(a, final, churn, listed_by_a)  # the outage included


# --------------------------------------------------------------------------------------------------
# In-process, against the simulator over HTTP: the details of the bootstrap.


async def _pipeline(client: ApiClient, ckpt: Path, sinks: list[RecordingSink]) -> BridgePipeline:
    factory, watched = await watched_over_http(client, "configmaps", "ConfigMap", NS)
    return BridgePipeline(factory=factory, resources=[watched],
                          sinks=sinks, checkpoint_store=FileCheckpointStore(directory=ckpt),
                          checkpoint_interval=0.05, cluster="sim")


async def _run_once(client: ApiClient, ckpt: Path, sinks: list[RecordingSink],
                    until_done: Any) -> None:
    p = await _pipeline(client, ckpt, sinks)
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        await until(until_done, what="the run's events")
        tracker = p.tracker(IDENT)
        await until(lambda: not tracker.pending and tracker.lag == 0, what="everything acked")
    finally:
        await p.shutdown(5)


async def test_unchanged_objects_are_snapshotted_whole_at_once(tmp_path: Path) -> None:
    """Nothing changed while the bridge was down: every checkpoint stub has its listed twin, so the
    snapshot goes out at once (no bookmark nor change is needed to move the informer), with whole
    objects; the old sink receives nothing; a sink section is written for the new one."""
    sim = Simulator(bookmark_interval=3600, namespaces=("default", NS))
    await sim.start()
    client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")))
    try:
        for i in range(5):
            await client.create(PATH, {"metadata": {"name": f"o{i}"}, "data": {"v": str(i)}})
        a = RecordingSink("a")
        await _run_once(client, tmp_path / "ckpt", [a], lambda: len(a.events) == 5)
        a2, b = RecordingSink("a"), RecordingSink("b")
        await _run_once(client, tmp_path / "ckpt", [a2, b], lambda: len(b.events) == 7)
        assert a2.events == []
        assert [e.type for e in b.events] == [EventType.SNAPSHOT_BEGIN, *[EventType.SYNC] * 5,
                                              EventType.SNAPSHOT_END]
        assert sorted((e.name, e.obj["data"]["v"]) for e in b.events[1:-1]  # type: ignore[index]
                      ) == [(f"o{i}", str(i)) for i in range(5)]
        assert await covered(FileCheckpointStore(directory=tmp_path / "ckpt")) == {"a", "b"}
        # Once covered, b is not bootstrapped again.
        a3, b3 = RecordingSink("a"), RecordingSink("b")
        await client.create(PATH, {"metadata": {"name": "later"}})
        await _run_once(client, tmp_path / "ckpt", [a3, b3], lambda: len(b3.events) == 1)
        assert [e.type for e in b3.events] == [e.type for e in a3.events] == [EventType.ADDED]
    finally:
        await client.close()
        await sim.stop()


async def test_a_failed_start_up_list_is_retried_and_a_quiet_resource_snapshotted_at_once(
    tmp_path: Path,
) -> None:
    """The bootstrap's start-up list fails, and its first retry too: the next retry's list alone
    puts whole objects in place of the stubs, so on a quiet resource (no change, no bookmark, no
    relist) the snapshot goes out at once; the old sink receives nothing."""
    async with simulated_cluster(tmp_path, NS, bookmark_interval=3600) as (sim, client):
        for i in range(5):
            await client.create(PATH, {"metadata": {"name": f"o{i}"}, "data": {"v": str(i)}})
        a = RecordingSink("a")
        await _run_once(client, tmp_path / "ckpt", [a], lambda: len(a.events) == 5)
        per_list = ApiClientOptions().max_retries + 1  # one failed list: the client's own retries too
        sim.faults.replace({"error_code": 503, "error_count": 2 * per_list, "error_target": "list",
                            "error_retry_after": 0})
        a2, b = RecordingSink("a"), RecordingSink("b")
        await _run_once(client, tmp_path / "ckpt", [a2, b], lambda: len(b.events) == 7)
        assert (sim.faults.injected, sim.faults.errors_remaining) == (2 * per_list, 0)
        assert a2.events == []
        assert [e.type for e in b.events] == [EventType.SNAPSHOT_BEGIN, *[EventType.SYNC] * 5,
                                              EventType.SNAPSHOT_END]
        assert sorted((e.name, e.obj["data"]["v"]) for e in b.events[1:-1]  # type: ignore[index]
                      ) == [(f"o{i}", str(i)) for i in range(5)]
        assert await covered(FileCheckpointStore(directory=tmp_path / "ckpt")) == {"a", "b"}


async def test_a_sink_not_yet_bootstrapped_at_a_crash_is_bootstrapped_again(tmp_path: Path) -> None:
    """The checkpoint covers a new sink only once it acknowledged its whole snapshot: a sink that
    never acknowledged it (down, or the bridge crashed first) has no progress after the restart and
    gets the snapshot again, while the old sink's progress moved on meanwhile."""
    sim = Simulator(bookmark_interval=0.2, namespaces=("default", NS))
    await sim.start()
    client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")))
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    try:
        for i in range(3):
            await client.create(PATH, {"metadata": {"name": f"o{i}"}})
        a = RecordingSink("a")
        await _run_once(client, tmp_path / "ckpt", [a], lambda: len(a.events) == 3)
        a2, b = RecordingSink("a"), RecordingSink("b", auto_ack=False)
        p = await _pipeline(client, tmp_path / "ckpt", [a2, b])
        await p.start()
        try:
            await until(lambda: len(b.unacked) == 5, what="b's snapshot, unacknowledged")
            await client.create(PATH, {"metadata": {"name": "new"}})
            await until(lambda: len(a2.events) == 1, what="a's add")
            await until(lambda: len(b.unacked) == 6, what="b's add, after its snapshot")
            assert b.unacked[4][0].type is EventType.SNAPSHOT_END
            for i, (_, ack) in enumerate(b.unacked):
                if i != 4:  # all but the snapshot's end
                    ack(DeliveryOutcome.DELIVERED)
            await p.write_checkpoints()
        finally:
            await p.abort()
        assert await covered(store) == {"a"}
        a3, b3 = RecordingSink("a"), RecordingSink("b")
        await _run_once(client, tmp_path / "ckpt", [a3, b3], lambda: len(b3.events) >= 6)
        assert b3.events[0].type == EventType.SNAPSHOT_BEGIN
        assert sorted(e.name for e in b3.events if e.type is EventType.SYNC) == ["new", "o0", "o1", "o2"]
        assert await covered(store) == {"a", "b"}
    finally:
        await client.close()
        await sim.stop()


async def test_a_format_1_checkpoint_covers_every_configured_sink(tmp_path: Path) -> None:
    """A checkpoint written before progress was per sink has no per-sink section: every configured
    sink resumes at its base, none is bootstrapped (nothing re-sent to any)."""
    sim = Simulator(bookmark_interval=0.2, namespaces=("default", NS))
    await sim.start()
    client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")))
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    try:
        for i in range(3):
            await client.create(PATH, {"metadata": {"name": f"o{i}"}})
        a = RecordingSink("a")
        await _run_once(client, tmp_path / "ckpt", [a], lambda: len(a.events) == 3)
        cp = await store.load(IDENT)
        assert cp is not None
        await store.save(dataclasses.replace(cp, sinks=None))  # as format 1 wrote it
        a2, b = RecordingSink("a"), RecordingSink("b")
        await client.create(PATH, {"metadata": {"name": "later"}})
        await _run_once(client, tmp_path / "ckpt", [a2, b], lambda: len(b.events) == 1)
        assert [(e.type, e.name) for e in b.events] == [(e.type, e.name) for e in a2.events] \
            == [(EventType.ADDED, "later")]
        assert await covered(store) == {"a", "b"}
    finally:
        await client.close()
        await sim.stop()
