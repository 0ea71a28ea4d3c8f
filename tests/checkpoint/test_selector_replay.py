"""Issue #12, under a label selector: a sink that lagged across a crash gets every change it lacked
before an object's delete or selector exit, and nothing of a uid outlives its real delete — with real
processes.

The simulator (a process); the bridge (``tests.checkpoint.bridge_proc``) watching ConfigMaps through
the label selector ``app=web`` with two sinks: ``fast``, a JSON-lines file, and ``slow``, a webhook
(a real HTTP server in this test) answering 503, so it acknowledges nothing and holds the checkpoint
back. While ``slow`` is down, ``x`` is updated twice (``fast`` gets both), its watch is expired and the
relist is held off (503 on lists) while ``x`` is updated once more and then deleted, or leaves the
selector: the relist infers its delete, with the last state the bridge knew. The bridge is SIGKILLed;
its checkpoint is still at ``x``'s creation, so the restarted watch replays ``x``'s history. Counted
from what each sink holds:

* ``slow`` gets the updates it lacked, in order, before the delete or the exit (it never had them);
* a consumer that drops repeated ids (JetStream's duplicate window) ends, for each sink, with the
  objects the selector holds now: a change the relist coalesced is never sent before a real delete
  whose id (the uid's, that of the inferred delete the sink may hold) such a consumer would drop;
* an object that left the selector and came back while the bridge was down is delivered: its exit
  (``leftselector``), then its return.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.storage.checkpoint import FileCheckpointStore, informer_id
from bridge.testing import Reply, WebhookReceiver
from bridge.testing.processes import wait_until
from tests.checkpoint.crash_harness import BridgeProcess, event_kind, file_events, sim_process

NS = "selreplay"
SELECTOR = "app=web"
IDENT = informer_id("configmaps", NS, SELECTOR, "")
PATH = f"/api/v1/namespaces/{NS}/configmaps"
CHANGES = ("added", "updated", "deleted")


def of(events: list[dict[str, Any]], uid: str) -> list[tuple[str, str, bool, bool]]:
    """(type, resourceVersion, finalstateunknown, leftselector) of ``uid``'s changes, in order."""
    return [(event_kind(e), e["resourceversion"], e.get("finalstateunknown") == "true",
             e.get("leftselector") == "true")
            for e in events if event_kind(e) in CHANGES and e.get("uid") == uid]


def view(events: list[dict[str, Any]], *, drop_repeated_ids: bool) -> dict[str, tuple[str, str]]:
    """uid → (subject, resourceVersion) after applying the events in order; with
    ``drop_repeated_ids``, as a consumer (or JetStream) that drops an event whose id it has seen."""
    state: dict[str, tuple[str, str] | None] = {}
    seen: set[str] = set()
    for e in events:
        if drop_repeated_ids:
            if e["id"] in seen:
                continue
            seen.add(e["id"])
        if event_kind(e) in CHANGES:
            state[e["uid"]] = None if event_kind(e) == "deleted" else (e["subject"], e["resourceversion"])
    return {u: s for u, s in state.items() if s is not None}


async def selected(client: ApiClient) -> dict[str, tuple[str, str]]:
    listed = await client.get(PATH, params={"labelSelector": SELECTOR})
    return {i["metadata"]["uid"]: (f"{NS}/{i['metadata']['name']}", i["metadata"]["resourceVersion"])
            for i in listed["items"]}


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


async def relabel(client: ApiClient, app: str) -> dict[str, Any]:
    return await client.patch(f"{PATH}/x", {"metadata": {"labels": {"app": app}}})


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fate", ["deleted", "exited", "exited-and-back"])
async def test_a_lagging_sink_gets_the_changes_it_lacked_before_a_delete_or_exit_under_a_selector(
    tmp_path: Path, fate: str,
) -> None:
    out = tmp_path / "fast.jsonl"
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    async with contextlib.AsyncExitStack() as stack:
        hook = await stack.enter_async_context(WebhookReceiver(reply=Reply(200)))
        _, kubeconfig = await stack.enter_async_context(sim_process(tmp_path, namespaces=(NS,)))
        client = ApiClient.from_kubeconfig(str(kubeconfig))
        stack.push_async_callback(client.close)
        args = ["--kubeconfig", str(kubeconfig), "--resource", "configmaps", "--namespace", NS,
                "--label-selector", SELECTOR, "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--checkpoint-interval", "0.1", "--spill-dir", str(tmp_path / "spill"),
                f"--sink=fast=file:{out}", f"--sink=slow=webhook:{hook.url}"]
        bridge = BridgeProcess(args, log=tmp_path / "bridge.log")
        stack.push_async_callback(bridge.kill)
        x = await client.create(PATH, {"metadata": {"name": "x", "labels": {"app": "web"}},
                                       "data": {"v": "0"}})
        uid = x["metadata"]["uid"]
        await bridge.start()
        await bridge.wait_synced()
        await wait_until(lambda: bool(of(file_events(out), uid) and of(hook.events, uid)),
                         timeout=20, what="x's add, to both sinks")
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while int(getattr(await store.load(IDENT), "resource_version", "") or 0) < int(rv(x)):
            assert loop.time() < end, "no checkpoint covering x"
            await asyncio.sleep(0.05)

        # slow is down from now on: it holds the checkpoint at x's creation
        hook.reply = Reply(503, body="down")
        u1 = await client.patch(f"{PATH}/x", {"data": {"v": "1"}})
        u2 = await client.patch(f"{PATH}/x", {"data": {"v": "2"}})
        await wait_until(lambda: [c[1] for c in of(file_events(out), uid)][-1:] == [rv(u2)],
                         timeout=20, what="u2, to fast")
        # The watch expires and the relist is held off while x changes once more and goes: the
        # relist infers x's delete, with u2 (the last state the bridge knew).
        faults = await client.request("POST", "/_sim/faults", body={
            "error_code": 503, "error_count": 1000, "error_target": "list", "error_retry_after": 1,
            "expire_watches": True})
        assert faults["watches_expired"] >= 1
        u3 = await client.patch(f"{PATH}/x", {"data": {"v": "3"}})
        gone = await client.delete(f"{PATH}/x") if fate == "deleted" else await relabel(client, "other")
        await client.request("POST", "/_sim/faults", body={"reset": True})
        await wait_until(lambda: any(c[:3] == ("deleted", rv(u2), True) for c in of(file_events(out), uid)),
                         timeout=20, what="the inferred delete, to fast")
        # A relist cannot tell a delete from an exit by itself; the API server can, as for a delete
        # the watch showed: an exit the relist inferred is marked, and keeps an id of its own.
        assert ("deleted", rv(u2), True, fate != "deleted") in of(file_events(out), uid)
        await bridge.kill()
        crashed = await store.load(IDENT)
        assert crashed is not None
        assert int(crashed.resource_version) < int(rv(u1))  # slow held it back: the watch replays x

        changes = [("updated", rv(u1), False, False), ("updated", rv(u2), False, False)]
        if fate == "deleted":
            # u3 was coalesced by the relist: it never reached a sink one by one, and it is older
            # than the delete they may hold.
            last = ("deleted", rv(gone), False, False)
            expected = [*changes, last]
        else:
            last = ("deleted", rv(gone), False, True)
            expected = [*changes, ("updated", rv(u3), False, False), last]
        if fate == "exited-and-back":
            back = await relabel(client, "web")
            u4 = await client.patch(f"{PATH}/x", {"data": {"v": "4"}})
            expected += [("added", rv(back), False, False), ("updated", rv(u4), False, False)]
            last = expected[-1]
        hook.reply = Reply(200)
        slow_before = len(of(hook.events, uid))
        await bridge.start()
        await bridge.wait_synced()
        await wait_until(lambda: last in of(hook.events, uid), timeout=30, what="x's last change, to slow")
        now = (await client.get(PATH))["metadata"]["resourceVersion"]
        end = loop.time() + 30
        while int(getattr(await store.load(IDENT), "resource_version", "") or 0) < int(now):
            assert loop.time() < end, "the sinks never caught up"
            await asyncio.sleep(0.05)
        await bridge.stop()
        final = await selected(client)

    fast, slow = file_events(out), hook.events
    # The lagging sink: every change it lacked, in order, before the delete or exit.
    assert of(slow, uid)[slow_before:] == expected
    # Nothing revived: each sink, read as a consumer that drops repeated ids, holds the selection.
    for name, events in (("fast", fast), ("slow", slow)):
        assert view(events, drop_repeated_ids=False) == final, name
        assert view(events, drop_repeated_ids=True) == final, name
    if fate == "deleted":
        # One delete per uid: the real delete slow got has the id of the inferred one fast got.
        ids = {e["id"] for e in fast + slow if e.get("uid") == uid and event_kind(e) == "deleted"}
        assert len(ids) == 1
