"""Each injected fault, set per run or at run time through ``/_sim/faults``, and auth/RBAC refusals."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.sim import FaultSpec, Simulator
from tests.sim.helpers import read_events


def _fill(sim: Simulator, n: int) -> int:
    """Creates n configmaps; returns the RV before the first so a watch replays all n."""
    start = sim.store.resource_version
    for i in range(n):
        sim.store.create("configmaps", {"metadata": {"name": f"cm-{i}"}}, namespace="default")
    return start


async def test_close_watch_after_n_events() -> None:
    async with Simulator(faults={"watch_close_after": 2}) as sim, aiohttp.ClientSession() as http:
        start = _fill(sim, 5)
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1",
                                                                      "resourceVersion": str(start)})
        events = await read_events(resp)
        assert [e["object"]["metadata"]["name"] for e in events] == ["cm-0", "cm-1"]
        # resuming from the last RV seen makes progress, two events at a time
        last = events[-1]["object"]["metadata"]["resourceVersion"]
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": last})
        assert [e["object"]["metadata"]["name"] for e in await read_events(resp)] == ["cm-2", "cm-3"]
        assert sim.store.watcher_count() == 0


async def test_cut_line_in_half_then_drop_connection() -> None:
    async with Simulator() as sim, aiohttp.ClientSession() as http:
        start = _fill(sim, 3)
        sim.set_faults(watch_cut_after=1)
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1",
                                                                      "resourceVersion": str(start)})
        received = bytearray()

        async def drain() -> None:
            async for chunk in resp.content.iter_any():
                received.extend(chunk)

        with pytest.raises(aiohttp.ClientPayloadError):
            await drain()
        first, _, rest = bytes(received).partition(b"\n")
        assert orjson.loads(first)["object"]["metadata"]["name"] == "cm-0"
        assert rest
        assert b"\n" not in rest
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(rest)
        assert b'"name":"cm-1"' in rest or rest.startswith(b'{"type":"ADDED"')


async def test_send_410_error_in_stream_after_n_events() -> None:
    async with Simulator(faults=FaultSpec(watch_expire_after=1)) as sim, aiohttp.ClientSession() as http:
        start = _fill(sim, 3)
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1",
                                                                      "resourceVersion": str(start)})
        events = await read_events(resp)
        assert [e["type"] for e in events] == ["ADDED", "ERROR"]
        assert events[1]["object"]["code"] == 410
        assert events[1]["object"]["reason"] == "Expired"


async def test_expire_open_watches_through_admin_endpoint(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1", "resourceVersion": "1"})
        reader = asyncio.create_task(read_events(resp), name="reader")
        await asyncio.sleep(0.05)
        sim.store.create("configmaps", {"metadata": {"name": "a"}}, namespace="default")
        await asyncio.sleep(0.05)
        admin = await http.post(f"{sim.url}/_sim/faults", json={"expire_watches": True})
        assert (await admin.json())["watches_expired"] == 1
        events = await asyncio.wait_for(reader, 5)
    assert [e["type"] for e in events] == ["ADDED", "ERROR"]
    assert events[1]["object"]["code"] == 410


async def test_compact_through_admin_endpoint(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        start = _fill(sim, 2)
        resp = await http.post(f"{sim.url}/_sim/compact")
        assert (await resp.json()) == {"resourceVersion": str(sim.store.resource_version)}
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1",
                                                                      "resourceVersion": str(start)})
        events = await read_events(resp)
        assert events[0]["object"]["message"] == (
            f"too old resource version: {start} ({sim.store.resource_version})")


async def test_delay_responses(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{sim.url}/_sim/faults", json={"delay": 0.3})
        assert (await resp.json())["delay"] == 0.3
        loop = asyncio.get_running_loop()
        started = loop.time()
        resp = await http.get(f"{sim.url}/api/v1/configmaps")
        assert resp.status == 200
        assert loop.time() - started >= 0.3
        # admin endpoints are never delayed: with every answer delayed by a minute, the reset
        # answers (well within the minute, whatever the load)
        resp = await http.post(f"{sim.url}/_sim/faults", json={"delay": 60.0})
        assert (await resp.json())["delay"] == 60.0
        started = loop.time()
        await http.post(f"{sim.url}/_sim/faults", json={"reset": True})
        assert loop.time() - started < 60.0


@pytest.mark.parametrize(("code", "reason"), [(429, "TooManyRequests"), (500, "InternalError"),
                                              (503, "ServiceUnavailable")])
async def test_error_status_for_next_k_list_requests(sim: Simulator, code: int, reason: str) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{sim.url}/_sim/faults", json={
            "error_code": code, "error_count": 2, "error_retry_after": 3, "error_target": "list"})
        assert (await resp.json())["errors_remaining"] == 2
        # a watch is not a list: not affected
        watch = await http.get(f"{sim.url}/api/v1/configmaps",
                               params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "1"})
        assert watch.status == 200
        watch.close()
        for _ in range(2):
            resp = await http.get(f"{sim.url}/api/v1/configmaps")
            assert resp.status == code
            assert resp.headers["Retry-After"] == "3"
            body = await resp.json()
            assert (body["code"], body["reason"], body["details"]) == (code, reason, {"retryAfterSeconds": 3})
        resp = await http.get(f"{sim.url}/api/v1/configmaps")
        assert resp.status == 200
        state = await (await http.get(f"{sim.url}/_sim/state")).json()
        assert state["faults"]["errors_injected"] == 2
        assert state["faults"]["errors_remaining"] == 0


async def test_error_status_only_for_watch(sim: Simulator) -> None:
    sim.set_faults(error_code=503, error_count=1, error_target="watch")
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{sim.url}/api/v1/configmaps")).status == 200
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1"})
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"


async def test_invalid_fault_spec_is_a_400(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{sim.url}/_sim/faults", json={"error_code": 404})
        assert resp.status == 400
        resp = await http.post(f"{sim.url}/_sim/faults", json={"no_such_fault": 1})
        assert resp.status == 400
        faults = await (await http.get(f"{sim.url}/_sim/faults")).json()
        assert faults["error_code"] is None


async def test_bearer_token_required_when_configured() -> None:
    async with Simulator(token="s3cret") as sim, aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/pods")
        assert resp.status == 401
        assert (await resp.json())["reason"] == "Unauthorized"
        resp = await http.get(f"{sim.url}/api/v1/pods", headers={"Authorization": "Bearer wrong"})
        assert resp.status == 401
        resp = await http.get(f"{sim.url}/api/v1/pods", headers={"Authorization": "Bearer s3cret"})
        assert resp.status == 200


async def test_forbidden_resources_get_403(sim: Simulator) -> None:
    sim.forbidden.add(("", "secrets"))
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{sim.url}/api/v1/namespaces/default/secrets")
        assert resp.status == 403
        body: dict[str, Any] = await resp.json()
        assert body["reason"] == "Forbidden"
        assert body["message"] == ('secrets is forbidden: User "system:anonymous" cannot list resource '
                                   '"secrets" in API group "" in the namespace "default"')
        assert (await http.get(f"{sim.url}/api/v1/configmaps")).status == 200


async def test_state_endpoint(sim: Simulator) -> None:
    sim.store.create("pods", {"metadata": {"name": "p"}, "spec": {"containers": []}}, namespace="default")
    async with aiohttp.ClientSession() as http:
        await http.get(f"{sim.url}/api/v1/pods")
        state = await (await http.get(f"{sim.url}/_sim/state")).json()
    assert state["resourceVersion"] == str(sim.store.resource_version)
    assert state["objects"]["pods"] == 1
    assert state["objects"]["namespaces"] == 2
    assert state["requests"] == {"list": 1}
    assert state["watchers"] == 0
    assert "widgets.example.com" in state["resources"]


async def test_close_after_counts_single_events_across_write_batches() -> None:
    async with Simulator(faults={"watch_close_after": 300}) as sim, aiohttp.ClientSession() as http:
        start = _fill(sim, 600)
        resp = await http.get(f"{sim.url}/api/v1/configmaps",
                              params={"watch": "1", "resourceVersion": str(start)})
        events = await read_events(resp)
    assert [int(e["object"]["metadata"]["resourceVersion"]) for e in events] == list(
        range(start + 1, start + 301))


async def test_lease_requests_hang_selectively_while_the_rest_answers() -> None:
    """``lease_delay`` holds coordination.k8s.io Lease requests (only those whose User-Agent contains
    ``lease_delay_user_agent``) while every other request, and other clients' lease requests, answer."""
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
            "spec": {"holderIdentity": "a"}}
    async with Simulator() as sim, aiohttp.ClientSession() as http:
        async with http.post(f"{sim.url}/_sim/faults",
                             json={"lease_delay": 30, "lease_delay_user_agent": "replica-a"}) as r:
            assert r.status == 200
        hung = asyncio.create_task(http.post(f"{sim.url}{lease_path}", json=body,
                                             headers={"User-Agent": "kube-event-bridge replica-a"}))
        await asyncio.sleep(0.3)
        assert not hung.done()
        async with asyncio.timeout(2):
            async with http.get(f"{sim.url}{lease_path}",
                                headers={"User-Agent": "kube-event-bridge replica-b"}) as r:
                assert r.status == 200
            async with http.get(f"{sim.url}/api/v1/namespaces/default/configmaps",
                                headers={"User-Agent": "kube-event-bridge replica-a"}) as r:
                assert r.status == 200
        async with http.post(f"{sim.url}/_sim/faults", json={"reset": True}) as r:
            assert r.status == 200
        hung.cancel()
        # A slow answer rather than a hang: every lease request waits, then answers.
        sim.set_faults(lease_delay=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with http.get(f"{sim.url}{lease_path}") as r:
            assert r.status == 200
        assert loop.time() - started >= 0.3


async def test_garble_one_line_then_carry_on() -> None:
    async with Simulator() as sim, aiohttp.ClientSession() as http:
        start = _fill(sim, 3)
        sim.set_faults(watch_garble_after=1)
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1", "timeoutSeconds": "1",
                                                                      "resourceVersion": str(start)})
        lines = (await resp.read()).splitlines()
        assert len(lines) == 3
        assert orjson.loads(lines[0])["object"]["metadata"]["name"] == "cm-0"
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(lines[1])
        assert b'"name":"cm-1"' in lines[1].replace(b"\x00<garbled>", b"")
        assert orjson.loads(lines[2])["object"]["metadata"]["name"] == "cm-2"
        # Once per watch: a new watch garbles its own second line only.
        resp = await http.get(f"{sim.url}/api/v1/configmaps", params={"watch": "1", "timeoutSeconds": "1",
                                                                      "resourceVersion": str(start)})
        lines = (await resp.read()).splitlines()
        names = [orjson.loads(x)["object"]["metadata"]["name"] for x in (lines[0], lines[2])]
        assert names == ["cm-0", "cm-2"]
