"""The simulator's priority and fairness, and the API client's rate limit against it.

A client with more requests executing than its flow allows gets ``429 Too Many Requests`` with
``Retry-After`` (what kube-apiserver's APF answers once a flow's queue is full), each client (token,
else User-Agent) is its own flow, watches hold no seat; and the bridge's client, rate-limited, sends
the same work without a single 429 where the unlimited one meets a storm of them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest

from bridge.errors import TooManyRequestsError
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.sim import Simulator
from bridge.sim.apf import FlowControl


async def _get(session: aiohttp.ClientSession, url: str,
               agent: str) -> tuple[int, str | None, dict[str, object]]:
    async with session.get(url, headers={"User-Agent": agent}) as r:
        return r.status, r.headers.get("Retry-After"), await r.json()


async def test_beyond_its_concurrency_a_client_gets_429_with_retry_after() -> None:
    async with Simulator(flow_control=FlowControl(concurrency=2, retry_after=3),
                         faults={"delay": 0.3}) as sim, aiohttp.ClientSession() as session:
        url = f"{sim.url}/api/v1/namespaces/default/pods"
        answers = await asyncio.gather(*(_get(session, url, "busy/1") for _ in range(5)),
                                       _get(session, url, "other/1"))
        busy, other = answers[:5], answers[5]
        assert sorted(code for code, _, _ in busy) == [200, 200, 429, 429, 429]
        for code, retry_after, body in busy:
            if code == 429:
                assert retry_after == "3"
                assert body["reason"] == "TooManyRequests"
                assert body["message"] == "Too many requests, please try again later."
        assert other[0] == 200  # another flow has its own seats
        # A watch holds no seat: two long watches, and the flow still gets its two lists through.
        watches = [asyncio.create_task(session.get(url + "?watch=true&timeoutSeconds=2",
                                                   headers={"User-Agent": "busy/1"})) for _ in range(2)]
        await asyncio.sleep(0.1)
        lists = await asyncio.gather(*(_get(session, url, "busy/1") for _ in range(2)))
        assert [code for code, _, _ in lists] == [200, 200]
        for w in watches:
            (await w).close()
        state = sim.state()["flow_control"]
        assert state["rejected"] == 3
        assert state["flows"]["agent:busy/1"]["peak"] == 2


async def test_a_request_waits_in_the_queue_for_a_seat_before_it_is_refused() -> None:
    async with Simulator(flow_control=FlowControl(concurrency=1, queue_wait=1.0),
                         faults={"delay": 0.2}) as sim, aiohttp.ClientSession() as session:
        url = f"{sim.url}/api/v1/namespaces/default/pods"
        # 3 requests, one seat, 1 s of queue: 0.2 + 0.2 + 0.2 s, all served in turn.
        answers = await asyncio.gather(*(_get(session, url, "q/1") for _ in range(3)))
        assert [code for code, _, _ in answers] == [200, 200, 200]
        # 8 requests: what cannot start within 1 s is refused.
        answers = await asyncio.gather(*(_get(session, url, "q/1") for _ in range(8)))
        codes = sorted(code for code, _, _ in answers)
        assert codes.count(200) in (5, 6)
        assert codes.count(429) == 8 - codes.count(200)


async def test_a_request_beyond_the_queue_length_is_refused_at_once() -> None:
    async with Simulator(flow_control=FlowControl(concurrency=1, queue_wait=10.0, queue_length=2),
                         faults={"delay": 0.3}) as sim, aiohttp.ClientSession() as session:
        url = f"{sim.url}/api/v1/namespaces/default/pods"
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(_get(session, url, "q/1") for _ in range(6)))
        codes = sorted(code for code, _, _ in answers)
        # One executes, two wait their turn, three find the queues full.
        assert codes == [200, 200, 200, 429, 429, 429]
        assert asyncio.get_running_loop().time() - started < 5.0
        assert sim.state()["flow_control"]["queue_length"] == 2


async def test_the_rate_limit_keeps_the_bridge_out_of_a_429_storm() -> None:
    """40 lists sent at once against a flow of 4 seats and a queue of 2 (each list takes 0.2 s):
    the unlimited client (no retries, to count them) meets a wall of 429s. Paced at 4 a second
    (under one seat busy of four), the limited one stays within its seats and gets every answer
    first time. The simulator shares the test's event loop, so a stall of the loop on a loaded
    machine wakes every paced request that fell due meanwhile at once: seats and queue take a
    bunch of six, a stall of 1.5 s; paced at 5 a second without a queue, a stall of 0.8 s filled
    the seats and the test failed beside other work."""
    async with Simulator(flow_control=FlowControl(concurrency=4, queue_length=2, queue_wait=1.0),
                         faults={"delay": 0.2}) as sim:
        path = "/api/v1/namespaces/default/pods"
        unlimited = ApiClient(server=sim.url, options=ApiClientOptions(qps=-1, max_retries=0))
        async with unlimited:
            outcomes = await asyncio.gather(*(unlimited.get(path) for _ in range(40)),
                                            return_exceptions=True)
        refused = sum(isinstance(o, TooManyRequestsError) for o in outcomes)
        assert refused >= 30, outcomes
        before = sim.flow_control.rejected if sim.flow_control else 0
        limited = ApiClient(server=sim.url, options=ApiClientOptions(qps=4, burst=2, max_retries=0))
        async with limited:
            outcomes = await asyncio.gather(*(limited.get(path) for _ in range(24)),
                                            return_exceptions=True)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        assert sim.flow_control is not None
        assert sim.flow_control.rejected == before
        assert limited.rate_limiter.throttled_requests == 22
        assert limited.rate_limiter.throttled_seconds > 0


def test_the_command_line_sets_the_flow_control() -> None:
    from bridge.sim.cli import build_parser

    args = build_parser().parse_args(["--apf-concurrency", "3", "--apf-queue-wait", "0.5",
                                      "--apf-retry-after", "2", "--apf-queue-length", "300"])
    assert (args.apf_concurrency, args.apf_queue_wait, args.apf_retry_after, args.apf_queue_length) == (
        3, 0.5, 2, 300)
    r = subprocess.run([sys.executable, "-m", "bridge.sim", "--apf-concurrency", "0"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert "concurrency must be at least 1" in r.stderr


@pytest.mark.parametrize(("bad", "message"), [({"concurrency": 0}, "concurrency must be at least 1"),
                                              ({"concurrency": 1, "queue_wait": -1}, "must not be negative")])
def test_bad_flow_control_is_refused(bad: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FlowControl(**bad)  # type: ignore[arg-type]
