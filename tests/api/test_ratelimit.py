"""The client-side token bucket, with client-go's semantics, and what the API client meters with it.

Each case follows client-go's ``util/flowcontrol/throttle.go`` (``NewTokenBucketRateLimiter``: a
``golang.org/x/time/rate`` limiter of ``qps`` and ``burst``, full at start; ``Wait`` reserves a token
and sleeps until it is due; a context deadline the wait would pass returns at once without taking a
token) and ``rest/request.go`` (``tryThrottle`` before every attempt and every retry; ``Watch`` does
not use the limiter). Times run on a fake clock: nothing here sleeps on the wall clock.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from bridge.clock import FakeClock
from bridge.errors import ApiUnavailableError, ConfigurationError
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket

from .conftest import ScriptedServer


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("qps", "burst", "requests", "seconds"),
    [
        # A full bucket lets ``burst`` through at once, then one every 1/qps (rate.Limiter).
        (1.0, 3, 3, 0.0),
        (1.0, 3, 5, 2.0),
        (10.0, 1, 11, 1.0),
        (5.0, 10, 20, 2.0),  # client-go's library defaults: 10 at once, then 5 a second
    ],
)
async def test_burst_then_the_rate(qps: float, burst: int, requests: int, seconds: float) -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=qps, burst=burst, clock=clock)
    start = clock.now()
    done: list[float] = []

    async def one() -> None:
        await bucket.acquire()
        done.append(clock.now() - start)

    tasks = [asyncio.create_task(one()) for _ in range(requests)]
    await _settle()
    assert len(done) == min(burst, requests)
    while clock.next_deadline() is not None:
        await clock.step()
    await asyncio.gather(*tasks)
    assert max(done) == pytest.approx(seconds)
    assert bucket.throttled_requests == max(0, requests - burst)


async def test_waiters_are_served_in_the_order_they_asked() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=2.0, burst=1, clock=clock)
    order: list[int] = []

    async def one(i: int) -> None:
        await bucket.acquire()
        order.append(i)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(one(i)))
        await _settle()
    while clock.next_deadline() is not None:
        await clock.step()
    await asyncio.gather(*tasks)
    assert order == list(range(6))
    # 5 waits of 0.5 s, 1.0 s ... 2.5 s: the throttled time is counted.
    assert bucket.throttled_seconds == pytest.approx(0.5 + 1.0 + 1.5 + 2.0 + 2.5)


async def test_the_bucket_refills_over_time_up_to_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=4.0, burst=4, clock=clock)
    for _ in range(4):
        assert bucket.try_acquire()
    assert not bucket.try_acquire()
    await clock.advance(0.5)
    assert bucket.tokens() == pytest.approx(2.0)
    await clock.advance(60.0)
    assert bucket.tokens() == pytest.approx(4.0)  # never above the burst


async def test_a_wait_past_the_deadline_is_not_made_and_takes_nothing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=1.0, burst=1, clock=clock)
    await bucket.acquire()
    with pytest.raises(ApiUnavailableError, match="past its deadline"):
        await bucket.acquire(deadline=clock.now() + 0.5, context="renewing the lease")
    assert bucket.tokens() == pytest.approx(0.0)  # nothing was reserved
    waited = asyncio.create_task(bucket.acquire(deadline=clock.now() + 1.0))
    await _settle()
    await clock.advance(1.0)
    assert await waited == pytest.approx(1.0)


async def test_a_cancelled_waiter_gives_its_token_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=1.0, burst=1, clock=clock)
    await bucket.acquire()
    first = asyncio.create_task(bucket.acquire())
    await _settle()
    assert bucket.tokens() == pytest.approx(-1.0)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert bucket.tokens() == pytest.approx(0.0)
    assert bucket.waiting == 0


def test_negative_qps_turns_the_limit_off_and_bad_values_are_refused() -> None:
    off = TokenBucket(qps=-1, burst=0)
    assert not off.enabled
    assert all(off.try_acquire() for _ in range(10_000))
    with pytest.raises(ValueError, match="qps: 0"):
        TokenBucket(qps=0, burst=10)
    with pytest.raises(ValueError, match="burst: must be at least 1"):
        TokenBucket(qps=5, burst=0)
    assert (DEFAULT_QPS, DEFAULT_BURST) == (50.0, 100)
    with pytest.raises(ConfigurationError, match="burst"):
        ApiClient(server="http://127.0.0.1:1", options=ApiClientOptions(qps=5, burst=0))


async def test_requests_and_retries_are_metered_the_opening_of_a_watch_is_not(
        server: ScriptedServer) -> None:
    answered_429 = False

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal answered_429
        if request.query.get("watch") == "true":
            if request.query.get("fail") == "1" and not answered_429:
                answered_429 = True
                return web.json_response({"kind": "Status", "code": 429, "message": "later"},
                                         status=429, headers={"Retry-After": "0"})
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"1"}}}\n')
            return response
        return web.json_response({"kind": "PodList", "items": []})

    server.handler = handler
    url = await server.start()
    clock = FakeClock()
    async with ApiClient(server=url, clock=clock, options=ApiClientOptions(qps=1.0, burst=2)) as client:
        lists = [asyncio.create_task(client.get("/api/v1/pods")) for _ in range(3)]
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(server.requests) >= 2:
                break
        await asyncio.sleep(0.05)
        assert len(server.requests) == 2  # the burst; the third waits for its token
        # A watch opens at once, empty bucket or not.
        stream = await client.open_stream("/api/v1/pods", {"watch": True})
        await stream.close()
        assert len(server.requests) == 3
        await clock.advance(1.0)
        await asyncio.gather(*lists)
        assert [r.query.get("watch") for r in server.requests] == [None, None, "true", None]
        # A watch re-opened after a Retry-After answer waits for a token like any retry: the
        # bucket is empty now, so 1 s for the token.
        reopened = asyncio.create_task(client.open_stream("/api/v1/pods", {"watch": True, "fail": 1}))
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(server.requests) == 5:
                break
        await asyncio.sleep(0.05)
        assert len(server.requests) == 5
        assert not reopened.done()
        assert client.rate_limiter.waiting == 1
        await clock.advance(1.0)
        stream = await reopened
        await stream.close()
        assert len(server.requests) == 6
        assert client.rate_limiter.throttled_requests == 2
