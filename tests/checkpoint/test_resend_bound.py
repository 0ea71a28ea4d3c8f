"""Issue #27: what a SIGKILL makes the next start send again is bounded by the in-flight window.

Real processes: the simulator under churn (200 changes/s) and the bridge
(``tests.checkpoint.bridge_proc``) with a JSON-lines file sink, a checkpoint interval of 5 s and the
group commit on (a write once the sink acknowledged ``COMMIT_EVENTS`` changes, or an acknowledgement
is ``COMMIT_DELAY`` seconds old). The bridge is SIGKILLed ten times and restarted each time. For each
kill, the changes the sink holds again after the restart that it already held before the kill are
counted from the file itself: each count stays within the contract's bound (what the sink had in
flight, plus ``COMMIT_EVENTS``, plus what is acknowledged during one check and one store write,
docs/delivery-contract.md), where the interval alone re-sends up to 5 s of changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
from pathlib import Path

import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from tests.checkpoint.crash_harness import CE_PREFIX, CHANGE_TYPES, BridgeProcess, Churn, sim_process

NS = "resend"
IDENT = informer_id("configmaps", NS, "", "")
RATE = 200.0
INTERVAL = 5.0
COMMIT_EVENTS = 100
COMMIT_DELAY = 1.0
MAX_IN_FLIGHT = 32
BUFFER = 64
KILLS = 10
SLACK = int(RATE * 0.25)
"""Acknowledgements during one check (≤ 50 ms) and one file-store write, on a loaded machine."""


def delivered(path: Path) -> list[tuple[str, str, str]]:
    """(type, uid, resourceVersion) of every change the file holds, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        e = orjson.loads(line)
        t = str(e["type"]).removeprefix(CE_PREFIX)
        if t in CHANGE_TYPES:
            out.append((t, str(e["uid"]), str(e["resourceversion"])))
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_resends_per_sigkill_stay_within_the_in_flight_window(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    rng = random.Random(27)
    cuts: list[int] = []
    async with contextlib.AsyncExitStack() as stack:
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        bridge = BridgeProcess(["--kubeconfig", str(kubeconfig), "--resource", "configmaps",
                                "--namespace", NS, "--checkpoint-dir", str(tmp_path / "ckpt"),
                                "--checkpoint-interval", str(INTERVAL),
                                "--commit-events", str(COMMIT_EVENTS), "--commit-delay", str(COMMIT_DELAY),
                                "--buffer", str(BUFFER), "--max-in-flight", str(MAX_IN_FLIGHT),
                                "--file", str(out)], log=tmp_path / "bridge.log")
        stack.push_async_callback(bridge.kill)
        churn = Churn(client=client, namespace=NS, rate=RATE, seed=27)
        stack.callback(churn.stop)
        await bridge.start()
        await bridge.wait_synced()
        churn_task = asyncio.create_task(churn.run(), name="resend-churn")
        for _ in range(KILLS):
            await asyncio.sleep(rng.uniform(1.5, 3.0))
            await bridge.kill()
            cuts.append(len(delivered(out)))
            await bridge.start()
            await bridge.wait_synced()
        await asyncio.sleep(2.0)
        churn.stop()
        await churn_task
        last = int(churn.last_rv)
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while (cp := await store.load(IDENT)) is None or int(cp.resource_version) < last:
            assert loop.time() < end, "the bridge did not catch up with the churn"
            await asyncio.sleep(0.1)
        await bridge.stop()

    events = delivered(out)
    assert {(t, u, rv) for t, _, u, rv in churn.produced} <= set(events)  # nothing lost
    resent = []
    for k, cut in enumerate(cuts):
        before = set(events[:cut])
        after = events[cut:cuts[k + 1] if k + 1 < len(cuts) else len(events)]
        resent.append(sum(1 for e in after if e in before))
    bound = MAX_IN_FLIGHT + COMMIT_EVENTS + SLACK
    print(f"\nre-sent per SIGKILL at {RATE:.0f} changes/s over {len(churn.produced)} changes: {resent} "
          f"(min {min(resent)}, median {statistics.median(resent)}, max {max(resent)}; bound {bound})")
    assert max(resent) <= bound, resent
