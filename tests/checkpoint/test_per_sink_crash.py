"""Issue #13: per-sink progress across a SIGKILL, with real processes.

The simulator (a process) under churn; the bridge (``tests.checkpoint.bridge_proc``) with two sinks:
``fast``, a JSON-lines file, and ``slow``, a webhook (a real HTTP server in this test) that answers 503
for seconds before the crash, so it falls far behind (its backlog spills to disk). The bridge is
SIGKILLed while ``slow`` is behind, then restarted with the webhook healthy again. Counted from each
sink's own output:

* ``fast`` receives again at most what it had in flight or acknowledged after the last checkpoint
  write: its buffer plus its in-flight window plus the changes of one checkpoint interval — not the
  seconds of changes ``slow`` missed;
* ``slow`` receives every change it missed, in each object's order, and replaying it gives the
  simulator's objects;
* with the history expired while the bridge is down (the resume gets 410 and relists), each sink
  ends with the simulator's objects, gets a delete only for objects it knew (and of objects created
  after its own resume point that the known-object journal says a sink may have received: for
  ``slow`` most objects created since the base, for ``fast`` one in flight to it at the kill), and
  ``fast`` is not sent again what it had.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from pathlib import Path
from typing import Any

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from bridge.testing import Reply, WebhookReceiver
from bridge.testing.processes import wait_until
from tests.checkpoint.crash_harness import (
    BridgeProcess,
    Churn,
    event_kind,
    file_events,
    live_objects,
    sim_process,
)

NS = "twosinks"
IDENT = informer_id("configmaps", NS, "", "")
CHANGES = ("added", "updated", "deleted")
BUFFER = 16
MAX_IN_FLIGHT = 8
INTERVAL = 0.1
RATE = 60.0


def view(events: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """uid → (subject, resourceVersion) after applying the events in order."""
    state: dict[str, tuple[str, str] | None] = {}
    for e in events:
        if event_kind(e) in CHANGES:
            state[e["uid"]] = None if event_kind(e) == "deleted" else (e["subject"], e["resourceversion"])
    return {u: s for u, s in state.items() if s is not None}


async def run_crash(tmp_path: Path, *, expire: bool) -> None:
    out = tmp_path / "fast.jsonl"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    async with contextlib.AsyncExitStack() as stack:
        hook = await stack.enter_async_context(WebhookReceiver(reply=Reply(200)))
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        args = ["--kubeconfig", str(kubeconfig), "--resource", "configmaps", "--namespace", NS,
                "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", str(INTERVAL),
                "--spill-dir", str(tmp_path / "spill"), "--buffer", str(BUFFER),
                "--max-in-flight", str(MAX_IN_FLIGHT), f"--sink=fast=file:{out}",
                f"--sink=slow=webhook:{hook.url}"]
        bridge = BridgeProcess(args, log=tmp_path / "bridge.log")
        stack.push_async_callback(bridge.kill)
        churn = Churn(client=client, namespace=NS, rate=RATE, seed=31)
        stack.callback(churn.stop)
        await bridge.start()
        await bridge.wait_synced()
        churn_task = asyncio.create_task(churn.run(), name="per-sink-churn")
        await asyncio.sleep(1.0)
        hook.reply = Reply(503, body="down")
        await asyncio.sleep(3.0)  # slow falls ~180 changes behind; fast keeps up

        async def fast_ahead() -> bool:
            cp = await store.load(IDENT)
            return (cp is not None and cp.sinks is not None
                    and int(cp.sinks["fast"].resource_version or 0) > int(cp.resource_version) + 100)

        await wait_until(fast_ahead, timeout=10, what="a checkpoint with fast far ahead of the base")
        await bridge.kill()
        crashed = await store.load(IDENT)
        assert crashed is not None
        assert crashed.sinks is not None
        fast_rv = int(crashed.sinks["fast"].resource_version)
        base_rv = int(crashed.resource_version)
        fast_before = len(file_events(out))
        hook.reply = Reply(200)
        if expire:
            churn.stop()
            await churn_task
            await client.request("POST", "/_sim/compact")
        await bridge.start()
        await bridge.wait_synced()
        if not expire:
            await asyncio.sleep(1.0)
            churn.stop()
            await churn_task
        last = (await client.get(f"/api/v1/namespaces/{NS}/configmaps"))["metadata"]["resourceVersion"]

        async def caught_up() -> bool:
            cp = await store.load(IDENT)
            return cp is not None and int(cp.resource_version) >= int(last)

        await wait_until(caught_up, timeout=60, what="both sinks caught up")
        await bridge.stop()
        final = await live_objects(client, NS)

    fast, slow = file_events(out), hook.events
    assert view(fast) == final
    assert view(slow) == final
    produced = churn.produced
    fast_keys = [(event_kind(e), e["uid"], e["resourceversion"]) for e in fast if event_kind(e) in CHANGES]
    slow_keys = [(event_kind(e), e["uid"], e["resourceversion"]) for e in slow if event_kind(e) in CHANGES]
    # fast: what it is sent again after the restart is bounded by its in-flight state at the crash.
    resent = [k for k in fast_keys[fast_before:] if k in set(fast_keys[:fast_before])]
    bound = BUFFER + MAX_IN_FLIGHT + int(RATE * INTERVAL) + 5
    print(f"\nper-sink crash (expire={expire}): base rv {base_rv}, fast rv {fast_rv}, "
          f"{len(produced)} changes, fast re-sent {len(resent)} (bound {bound}), slow got {len(slow_keys)}")
    assert len(resent) <= bound, resent[:10]
    assert fast_rv - base_rv > bound  # without per-sink progress fast would get all of these again
    # Deletes only of objects the sink had. The one exception: an object created after the sink's
    # own resume point in the last checkpoint written that the known-object journal says some sink
    # may have received (the journal is the union of what any sink may have received, made durable
    # before an object's add is handed over) gets its delete, as it was sent. For slow that is
    # most objects created since the base; for fast, one whose add was in flight to it at the kill
    # and that was deleted before the relist (the bridge cannot tell it from one whose add landed:
    # tests/contract/test_spec_scenarios.py, the stories *_gets_its_delete_after_a_relist).
    added_at = {u: int(rv) for t, _, u, rv in produced if t == "added"}
    points = {"fast": fast_rv, "slow": base_rv}
    never_had = {"fast": 0, "slow": 0}
    for name, events in (("fast", fast), ("slow", slow)):
        seen: set[str] = set()
        for e in events:
            if event_kind(e) in ("added", "updated", "sync"):
                seen.add(e["uid"])
            elif event_kind(e) == "deleted" and e["uid"] not in seen:
                created = added_at.get(e["uid"], 0)
                assert created > points[name], (
                    f"{name}: a delete of {e['subject']} it never had, created at {created}, at or "
                    f"before its own resume point {points[name]}")
                never_had[name] += 1
    print(f"deletes of objects created after a sink's own resume point that it never had: {never_had}")
    if not expire:
        # slow: every change after its first list, in each object's order (first delivery).
        missing = {(t, u, rv) for t, _, u, rv in produced} - set(slow_keys)
        assert not missing, sorted(missing)[:5]
        order = {(t, u, rv): i for i, (t, _, u, rv) in enumerate(produced)}
        firsts: dict[str, list[int]] = collections.defaultdict(list)
        first_seen: set[tuple[str, str, str]] = set()
        for k in slow_keys:
            if k not in first_seen and k in order:
                first_seen.add(k)
                firsts[k[1]].append(order[k])
        assert all(seq == sorted(seq) for seq in firsts.values())


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sigkill_with_one_sink_far_behind(tmp_path: Path) -> None:
    await run_crash(tmp_path, expire=False)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sigkill_with_one_sink_far_behind_and_history_expired(tmp_path: Path) -> None:
    await run_crash(tmp_path, expire=True)
