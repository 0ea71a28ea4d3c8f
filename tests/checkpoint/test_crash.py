"""The crash tests: a bridge process under SIGKILL, a simulator process under churn, a real Kafka.

* ``test_sigkill_under_churn``: the bridge is killed at random moments ten times and restarted while
  ConfigMaps are created, updated and deleted. Replaying the topic must give exactly the simulator's
  final state, every change the simulator made must have been delivered (the resume point never
  expires here), and each restart may re-send only what the killed run's last checkpoint had not
  saved for the sink (in flight, or acknowledged after that checkpoint was taken).
* ``test_long_outage_resumes_with_a_diff``: while the bridge is down the history is compacted, so the
  resume gets 410; the relist must emit exactly the differences.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from pathlib import Path

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import Checkpoint, FileCheckpointStore, SinkProgress, informer_id
from tests.brokers import TansuBroker, unique_name
from tests.checkpoint.crash_harness import (
    CHANGE_TYPES,
    BridgeProcess,
    Churn,
    Delivered,
    decode,
    live_objects,
    replay,
    sim_process,
)

NS = "crash"
IDENT = informer_id("configmaps", NS, "", "")
MAX_IN_FLIGHT = 64
BUFFER = 64
CHECKPOINT_INTERVAL = 0.1


async def wait_checkpoint(store: FileCheckpointStore, rv: str | None, timeout: float) -> str:
    """Waits for a checkpoint (at ``rv`` when given); returns its resourceVersion."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        cp = None
        try:
            cp = await store.load(IDENT)
        except Exception:
            cp = None
        if cp is not None and (rv is None or cp.resource_version == rv):
            return cp.resource_version
        if loop.time() > end:
            raise AssertionError(f"no checkpoint at {rv!r} within {timeout}s (last: {cp})")
        await asyncio.sleep(0.05)


def covered(cp: Checkpoint, d: Delivered) -> bool:
    """Whether the checkpoint saved ``d`` as acknowledged by the sink: at or below the sink's resume
    point, or at or below what it holds as acknowledged ahead of it for that object."""
    (own,) = (cp.sinks or {"": SinkProgress()}).values()  # the one sink's own progress
    if int(d.rv) <= int(own.resource_version or cp.resource_version):
        return True
    ahead = own.ahead.get(d.subject) or cp.ahead.get(d.subject)
    return ahead is not None and ahead[0] == d.uid and int(d.rv) <= int(ahead[1])


def next_offsets(records: list[Delivered]) -> collections.Counter[int]:
    """Per partition, the offset after the last of ``records``."""
    out: collections.Counter[int] = collections.Counter()
    for d in records:
        out[d.partition] = max(out[d.partition], d.offset + 1)
    return out


def bridge_args(kubeconfig: Path, ckpt: Path, kafka: TansuBroker, topic: str) -> list[str]:
    return ["--kubeconfig", str(kubeconfig), "--resource", "configmaps", "--namespace", NS,
            "--checkpoint-dir", str(ckpt), "--checkpoint-interval", str(CHECKPOINT_INTERVAL),
            "--kafka", kafka.bootstrap, "--topic", topic,
            "--max-in-flight", str(MAX_IN_FLIGHT), "--buffer", str(BUFFER), "--verbose"]


@pytest.mark.slow
@pytest.mark.timeout(240)  # ~35 s on 2 idle cores; the headroom is for loaded CI machines
async def test_sigkill_under_churn(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    topic = unique_name("crash")
    kafka_broker.create_topic(topic, partitions=3)
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    rng = random.Random(20261121)
    async with sim_process(tmp_path, namespaces=(NS,)) as (_, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        churn = Churn(client=client, namespace=NS, rate=60.0)
        bridge = BridgeProcess(bridge_args(kubeconfig, tmp_path / "ckpt", kafka_broker, topic),
                               log=tmp_path / "bridge.log")
        churn_task: asyncio.Task[None] | None = None
        try:
            await bridge.start()
            await bridge.wait_synced()
            # From the first checkpoint on, every restart resumes from one.
            await wait_checkpoint(store, None, 20)
            churn_task = asyncio.create_task(churn.run(), name="crash-churn")
            kills = 0
            resumed_from: list[int] = []
            """The checkpoint each restart resumed from."""
            saved: list[Checkpoint | None] = []
            cuts: list[list[Delivered]] = []
            killed_at: list[float] = []
            """What the topic held after each kill."""
            for _ in range(10):
                # A random moment while it runs: after it resumed (importing takes a while).
                await bridge.wait_synced()
                await asyncio.sleep(rng.uniform(0.05, 1.5))
                await bridge.kill()
                kills += 1
                resumed_from.append(int(await wait_checkpoint(store, None, 1)))
                # What the killed run had saved, and what it had delivered (to the topic's end).
                killed_at.append(time.time())
                saved.append(await store.load(IDENT))
                cuts.append(decode(await asyncio.to_thread(kafka_broker.read_all, topic)))
                await asyncio.sleep(rng.uniform(0.0, 0.4))
                await bridge.start()
            await asyncio.sleep(1.0)
            churn.stop()
            await churn_task
            churn_task = None
            print(f"[crash] churn stopped at rv {churn.last_rv}", flush=True)
            await wait_checkpoint(store, churn.last_rv, 150)  # caught up: everything acked
            await bridge.stop()
            final = await live_objects(client, NS)
        finally:
            churn.stop()
            if churn_task is not None:
                await asyncio.gather(churn_task, return_exceptions=True)
            await bridge.kill()
            await client.close()

    records = await asyncio.to_thread(kafka_broker.read_all, topic)
    delivered = decode(records)
    changes = [d for d in delivered if d.type in CHANGE_TYPES]
    produced = {(t, s, u, rv) for t, s, u, rv in churn.produced}
    seen = {(d.type, d.subject, d.uid, d.rv) for d in changes}

    # Replaying the topic reconstructs exactly the simulator's final state.
    assert replay(delivered) == final
    # Every change the simulator made was delivered (the resume point never expired), and nothing else.
    missing = produced - seen
    assert not missing, f"{len(missing)} changes never delivered, e.g. {sorted(missing)[:5]}"
    extra = seen - produced
    assert not extra, f"{len(extra)} events never made: {sorted(extra, key=lambda e: int(e[3]))[:10]}"
    assert not any(d.final_state_unknown for d in changes)
    # Per-object order: for every uid, the first delivery of each change follows the server's order.
    order = {(t, u, rv): i for i, (t, _, u, rv) in enumerate(churn.produced)}
    by_uid: dict[str, list[int]] = collections.defaultdict(list)
    first_seen: set[tuple[str, str, str]] = set()
    for d in sorted(changes, key=lambda d: (d.partition, d.offset)):
        k = (d.type, d.uid, d.rv)
        if k not in first_seen:
            first_seen.add(k)
            by_uid[d.uid].append(order[k])
    assert all(seq == sorted(seq) for seq in by_uid.values())
    # Duplicates: a change is re-sent only by a restart whose checkpoint did not cover it yet (it
    # was in flight, unacked, or acked after the last checkpoint), and at most once per such restart.
    deliveries = collections.Counter((d.type, d.uid, d.rv) for d in changes)
    for (t, u, rv), count in deliveries.items():
        restarts_behind = sum(1 for c in resumed_from if c < int(rv))
        assert count - 1 <= restarts_behind, f"{(t, u, rv)}: {count} deliveries, {restarts_behind} restarts"
    duplicates = len(changes) - len(seen)
    behind = [int(churn.produced[-1][3]) - c for c in resumed_from]
    print(f"\ncrash test: {len(churn.produced)} changes, {kills} SIGKILLs, {len(changes)} change events "
          f"delivered, {duplicates} duplicates (re-sent after resuming from checkpoints {resumed_from}), "
          f"final objects {len(final)}")
    assert kills == 10
    assert all(b >= 0 for b in behind)
    # Per kill (docs/delivery-contract.md section 3): what the restart sent again is what the
    # killed run had delivered but its last checkpoint had not saved (in flight, or acknowledged
    # after the checkpoint was taken: with group commit off, the acknowledgements of the last
    # interval and of one store write); changes the checkpoint covered, by its resourceVersion or
    # as acknowledged ahead of it, are applied to the cache without being sent again.
    resent = []
    for i, (cp, before) in enumerate(zip(saved, cuts, strict=True)):
        assert cp is not None
        high = next_offsets(before)
        upto = next_offsets(cuts[i + 1]) if i + 1 < len(cuts) else None
        held = {(d.type, d.uid, d.rv) for d in before if d.type in CHANGE_TYPES}
        again = {(d.type, d.uid, d.rv) for d in changes if d.offset >= high[d.partition]
                 and (upto is None or d.offset < upto[d.partition])} & held
        unsaved = {(d.type, d.uid, d.rv) for d in before
                   if d.type in CHANGE_TYPES and not covered(cp, d)}
        assert again <= unsaved, f"kill {i}: re-sent what its checkpoint saved: {sorted(again - unsaved)[:5]}"
        resent.append((len(again), len(unsaved), round(killed_at[i] - cp.written_at, 2)))
    print(f"per kill (re-sent, delivered and not saved, seconds since the checkpoint was taken): {resent}")
    assert len(churn.produced) > 500


@pytest.mark.slow
async def test_long_outage_resumes_with_a_diff(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    topic = unique_name("outage")
    kafka_broker.create_topic(topic, partitions=2)
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    path = f"/api/v1/namespaces/{NS}/configmaps"
    async with sim_process(tmp_path, namespaces=(NS,)) as (url, kubeconfig):
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        bridge = BridgeProcess(bridge_args(kubeconfig, tmp_path / "ckpt", kafka_broker, topic),
                               log=tmp_path / "bridge.log")
        try:
            objs = {}
            for name in ("same", "changed", "gone", "recreated"):
                objs[name] = await client.create(path, {"metadata": {"name": name}, "data": {"v": "0"}})
            await bridge.start()
            await bridge.wait_synced()
            last = objs["recreated"]["metadata"]["resourceVersion"]
            await wait_checkpoint(store, last, 20)
            await bridge.kill()
            # The outage: changes, then the history is compacted.
            await client.patch(f"{path}/changed", {"data": {"v": "1"}})
            changed = await client.patch(f"{path}/changed", {"data": {"v": "2"}})
            await client.delete(f"{path}/gone")
            await client.delete(f"{path}/recreated")
            recreated = await client.create(path, {"metadata": {"name": "recreated"}, "data": {"v": "new"}})
            fresh = await client.create(path, {"metadata": {"name": "fresh"}})
            await client.request("POST", "/_sim/compact")
            await bridge.start()
            await wait_checkpoint(store, fresh["metadata"]["resourceVersion"], 30)
            await bridge.stop()
            final = await live_objects(client, NS)
        finally:
            await bridge.kill()
            await client.close()
    assert url.startswith("http://127.0.0.1:")
    delivered = decode(await asyncio.to_thread(kafka_broker.read_all, topic))
    first = [d for d in delivered if d.type == "added" and int(d.rv) <= int(last)]
    after = [(d.type, d.subject, d.uid, d.rv, d.final_state_unknown) for d in delivered
             if d not in first and d.type in CHANGE_TYPES]
    # The relist's differences are framed by one pair of gap markers.
    assert sorted(d.type for d in delivered if d.type not in CHANGE_TYPES) == ["gap.begin", "gap.end"]
    assert sorted((d.type, d.subject) for d in first) == sorted(
        ("added", f"{NS}/{n}") for n in ("same", "changed", "gone", "recreated"))
    uid = {n: o["metadata"]["uid"] for n, o in objs.items()}
    assert sorted(after) == sorted([
        ("updated", f"{NS}/changed", uid["changed"], changed["metadata"]["resourceVersion"], False),
        ("deleted", f"{NS}/gone", uid["gone"], objs["gone"]["metadata"]["resourceVersion"], True),
        ("deleted", f"{NS}/recreated", uid["recreated"], objs["recreated"]["metadata"]["resourceVersion"],
         True),
        ("added", f"{NS}/recreated", recreated["metadata"]["uid"], recreated["metadata"]["resourceVersion"],
         False),
        ("added", f"{NS}/fresh", fresh["metadata"]["uid"], fresh["metadata"]["resourceVersion"], False),
    ])
    # The unchanged object was not re-sent, and the replay matches the cluster.
    assert [d for d in delivered if d.subject == f"{NS}/same" and d not in first] == []
    assert replay(delivered) == final
