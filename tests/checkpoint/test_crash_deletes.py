"""Deletes after a crash whose resume point expired, with real processes (simulator, bridge, file sink).

The bridge is SIGKILLed right after it delivered changes that no checkpoint write has covered yet:

* ``fresh`` was created after the last checkpoint write, delivered as ``added``, then deleted while the
  bridge was down. The checkpoint's known-object index never held it: only the known-object journal
  (written before its first event was released) lets the restarted bridge report its delete.
* ``doomed`` was in the checkpoint and its real delete was delivered before the crash: the restart
  must not send a second delete with an older resourceVersion, and whatever it re-sends for it has
  the real delete's id.

While it is down the history is compacted, so the resume gets 410 and relists. It runs with the file
store (journal file), the configmap store (journal ConfigMap in the simulator) and the nats-kv store
(journal key in a real nats-server's bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import orjson
import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import CheckpointStore, FileCheckpointStore, informer_id
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore
from bridge.testing.processes import wait_until
from tests.brokers import running_nats
from tests.checkpoint.crash_harness import CE_PREFIX, BridgeProcess, file_events, live_objects, sim_process

NS = "phantom"
IDENT = informer_id("configmaps", NS, "", "")
PATH = f"/api/v1/namespaces/{NS}/configmaps"
INTERVAL = 5.0
"""Long enough that no checkpoint is written between the first one and the kill."""


def changes(path: Path) -> list[tuple[str, str, str, str, bool]]:
    return [(str(e["type"]).removeprefix(CE_PREFIX), e.get("subject", ""), e.get("uid", ""),
             e.get("resourceversion", ""), e.get("finalstateunknown") == "true")
            for e in file_events(path) if "subject" in e]


async def until_checkpoint(store: CheckpointStore, rv: str, timeout: float) -> None:
    """Until a checkpoint at ``rv`` or later is written (with the configmap store, the bridge's own
    writes and bookmarks move the namespace-wide resourceVersion on)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while int((current := await checkpoint_rv(store)) or 0) < int(rv):
        assert loop.time() < end, f"no checkpoint at {rv} (last {current!r})"
        await asyncio.sleep(0.02)


def checkpoint_store(kind: str, *, client: ApiClient, stack: contextlib.AsyncExitStack, tmp_path: Path,
                     args: list[str]) -> CheckpointStore:
    """The checkpoint store of kind ``kind`` the bridge writes to (``--checkpoint-store``), for the
    test to read: the file store under ``tmp_path / "ckpt"``, the configmap store in ``default``
    (through ``client``), or the nats-kv store of a nats-server started for the test, whose URL is
    added to the bridge's ``args``; ``stack`` stops the server and closes the store."""
    if kind == "file":
        return FileCheckpointStore(directory=tmp_path / "ckpt")
    if kind == "configmap":
        return ConfigMapCheckpointStore(client=client, namespace="default")
    nats_url = stack.enter_context(running_nats()).url
    args += ["--checkpoint-nats", nats_url]
    store = NatsKvCheckpointStore(nats_url=nats_url)
    stack.push_async_callback(store.close)
    return store


async def checkpoint_rv(store: CheckpointStore) -> str:
    cp = await store.load(IDENT)
    return cp.resource_version if cp is not None else ""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["file", "configmap", "nats-kv"])
async def test_crash_with_expired_history_deletes_what_sinks_saw_and_never_an_older_delete(
    tmp_path: Path, kind: str,
) -> None:
    out = tmp_path / "events.jsonl"
    args = ["--kubeconfig", "", "--resource", "configmaps", "--namespace", NS,
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", str(INTERVAL),
            "--checkpoint-store", kind, "--checkpoint-namespace", "default", "--file", str(out)]
    async with contextlib.AsyncExitStack() as stack:
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        args[1] = str(kubeconfig)
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        store = checkpoint_store(kind, client=client, stack=stack, tmp_path=tmp_path, args=args)
        bridge = BridgeProcess(args, log=tmp_path / "bridge.log")
        try:
            old = await client.create(PATH, {"metadata": {"name": "old"}})
            doomed = await client.create(PATH, {"metadata": {"name": "doomed"}})
            await bridge.start()
            await bridge.wait_synced()
            await wait_until(lambda: len(changes(out)) == 2, timeout=20, what="the initial adds")
            # The first checkpoint write covers both; the next one is INTERVAL seconds away.
            await until_checkpoint(store, doomed["metadata"]["resourceVersion"], 20)
            fresh = await client.create(PATH, {"metadata": {"name": "fresh"}})
            gone = await client.delete(f"{PATH}/doomed")
            await wait_until(lambda: len(changes(out)) == 4, timeout=3,
                             what="fresh's add and doomed's delete")
            await bridge.kill()
            assert int(await checkpoint_rv(store)) < int(fresh["metadata"]["resourceVersion"])  # not covered
            # The outage: fresh is deleted, and the history is compacted.
            await client.delete(f"{PATH}/fresh")
            await client.request("POST", "/_sim/compact")
            await bridge.start()
            await bridge.wait_synced()
            listed = await client.get(PATH)
            await wait_until(lambda: any(c[1] == f"{NS}/fresh" and c[0] == "deleted" for c in changes(out)),
                             timeout=20, what="fresh's delete")
            await bridge.stop()
            final = await live_objects(client, NS)
        finally:
            await bridge.kill()
            await client.close()

    seen = changes(out)
    uid = {n: o["metadata"]["uid"] for n, o in (("old", old), ("doomed", doomed), ("fresh", fresh))}
    # Phantoms: fresh reached the sink as existing and is gone; it got a delete (inferred).
    fresh_events = [c for c in seen if c[2] == uid["fresh"]]
    assert [c[0] for c in fresh_events] == ["added", "deleted"]
    assert fresh_events[1][4] is True  # final state unknown: the bridge did not see it happen
    # One delete per uid: doomed's real delete was delivered; nothing older, nothing inferred follows.
    doomed_deletes = [c for c in seen if c[2] == uid["doomed"] and c[0] == "deleted"]
    real = ("deleted", f"{NS}/doomed", uid["doomed"], gone["metadata"]["resourceVersion"], False)
    assert doomed_deletes[0] == real
    assert all(c == doomed_deletes[0] for c in doomed_deletes), doomed_deletes
    ids = {e["id"] for e in file_events(out)
           if e.get("uid") == uid["doomed"] and e["type"].endswith("deleted")}
    assert len(ids) == 1
    # The consumer's state is the cluster's.
    state: dict[str, tuple[str, str] | None] = {}
    for t, subject, u, rv, _ in seen:
        state[u] = None if t == "deleted" else (subject, rv)
    assert {u: s for u, s in state.items() if s is not None} == final
    assert listed["metadata"]["resourceVersion"]


async def journal_chunks(kind: str, client: ApiClient, store: CheckpointStore) -> list[str]:
    """The sealed chunks the stored journal head lists (it spans them beyond one value)."""
    if kind == "configmap":
        assert isinstance(store, ConfigMapCheckpointStore)
        head = await client.get(f"/api/v1/namespaces/default/configmaps/{store.journal_name(IDENT)}")
        return [c for c in str((head.get("data") or {}).get("chunks", "")).split(",") if c]
    assert isinstance(store, NatsKvCheckpointStore)
    kv = await store._bucket_kv()
    value = (await kv.get(store.journal_key(IDENT))).value or b""
    return list(orjson.loads(value.split(b"\n", 1)[0]).get("chunks") or [])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["configmap", "nats-kv"])
async def test_a_first_list_larger_than_one_journal_value_gets_its_deletes_after_a_crash(
    tmp_path: Path, kind: str,
) -> None:
    """A fresh start whose first list is larger than one journal value holds (here 1,200 bytes, about
    a dozen records): the journal spans several ConfigMaps / KV keys, so every object is recorded
    before its ``added`` is released. SIGKILL before the first checkpoint write, every object deleted
    and the history compacted while the bridge is down: each gets its delete after the restart."""
    out = tmp_path / "events.jsonl"
    args = ["--kubeconfig", "", "--resource", "configmaps", "--namespace", NS,
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "30",
            "--checkpoint-store", kind, "--checkpoint-namespace", "default", "--file", str(out),
            "--journal-bytes", "1200"]
    count = 90  # ~6 KB of records: at least three full chunks, however the group commits fall
    async with contextlib.AsyncExitStack() as stack:
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        args[1] = str(kubeconfig)
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        store = checkpoint_store(kind, client=client, stack=stack, tmp_path=tmp_path, args=args)
        bridge = BridgeProcess(args, log=tmp_path / "bridge.log")
        try:
            created = [await client.create(PATH, {"metadata": {"name": f"o{i}"}}) for i in range(count)]
            await bridge.start()
            await wait_until(lambda: len(changes(out)) == count, timeout=30, what="the first list's adds")
            await bridge.kill()
            assert await checkpoint_rv(store) == ""  # no checkpoint yet: only the journal knows them
            assert len(await journal_chunks(kind, client, store)) >= 3
            for obj in created:
                await client.delete(f"{PATH}/{obj['metadata']['name']}")
            await client.request("POST", "/_sim/compact")
            await bridge.start()
            await wait_until(lambda: sum(c[0] == "deleted" for c in changes(out)) >= count,
                             timeout=30, what="every delete")
            await bridge.stop()
            final = await live_objects(client, NS)
        finally:
            await bridge.kill()
            await client.close()

    seen = changes(out)
    for obj in created:
        uid = obj["metadata"]["uid"]
        kinds = [(c[0], c[4]) for c in seen if c[2] == uid]
        assert kinds[0] == ("added", False), (obj["metadata"]["name"], kinds)
        assert kinds[-1] == ("deleted", True), (obj["metadata"]["name"], kinds)
    assert final == {}
