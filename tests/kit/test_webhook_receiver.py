"""The kit's webhook receiver over real HTTP: scripted status codes and Retry-After, a default that
can change, a responder, latency, counting, recorded bodies and headers, CloudEvents decoded in both
content modes."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from bridge.testing import ReceivedRequest, Reply, WebhookReceiver, decode_cloudevents

CE = {"specversion": "1.0", "id": "1", "source": "s", "type": "t", "subject": "default/a"}


async def post(http: aiohttp.ClientSession, url: str, body: bytes,
               headers: dict[str, str] | None = None) -> tuple[int, str | None, bytes]:
    async with http.post(url, data=body, headers=headers or {}) as r:
        return r.status, r.headers.get("Retry-After"), await r.read()


async def test_scripted_replies_come_first_then_the_default() -> None:
    async with WebhookReceiver() as hook, aiohttp.ClientSession() as http:
        assert hook.url == f"http://127.0.0.1:{hook.port}/events"
        hook.script(Reply(503, retry_after=2), Reply(429, retry_after="0.5", body="slow down"))
        body = orjson.dumps(CE)
        assert await post(http, hook.url, body) == (503, "2", b"")
        assert await post(http, hook.url, body) == (429, "0.5", b"slow down")
        assert await post(http, hook.url, body, {"X-Team": "a"}) == (204, None, b"")
        hook.reply = Reply(200, headers={"X-Seen": "yes"})
        async with http.put(f"{hook.base_url}/other?x=1", data=b"[]") as r:
            assert (r.status, r.headers["X-Seen"]) == (200, "yes")
        assert [r.status for r in hook.requests] == [503, 429, 204, 200]
        assert [(r.method, r.path, r.query) for r in hook.requests][-1] == ("PUT", "/other", "x=1")
        assert hook.requests[2].headers["X-Team"] == "a"
        assert (hook.request_count, hook.event_count, hook.events) == (4, 1, [CE])
        assert [r.body for r in hook.accepted] == [body, b"[]"]
        assert hook.scripted == 0


async def test_a_responder_decides_what_the_script_does_not() -> None:
    async def respond(request: ReceivedRequest) -> Reply | None:
        return Reply(400, body="rejected") if b"bad" in request.body else None

    async with WebhookReceiver(respond=respond) as hook, aiohttp.ClientSession() as http:
        assert (await post(http, hook.url, b'{"bad": 1}'))[0] == 400
        assert (await post(http, hook.url, b'{"good": 1}'))[0] == 204
        assert hook.events == [{"good": 1}]


async def test_latency_overlaps_requests_and_waiting_needs_no_polling() -> None:
    release = asyncio.Event()

    async def respond(request: ReceivedRequest) -> Reply | None:
        await release.wait()
        return Reply(200, delay=0.01)

    async with WebhookReceiver(respond=respond) as hook, aiohttp.ClientSession() as http:
        batch = orjson.dumps([{**CE, "id": str(i)} for i in range(3)])
        posts = [asyncio.create_task(post(http, hook.url, batch), name=f"post-{i}") for i in range(2)]
        await hook.wait_for(lambda h: h.in_flight == 2)
        assert hook.event_count == 0
        release.set()
        events = await hook.wait_for_events(6)
        await asyncio.gather(*posts)
        assert (len(events), hook.max_in_flight, hook.in_flight) == (6, 2, 0)
        with pytest.raises(TimeoutError):
            await hook.wait_for_events(7, timeout=0.05)


async def test_a_slow_answer_is_cancelled_when_the_receiver_closes() -> None:
    hook = await WebhookReceiver(reply=Reply(204, delay=3600)).start()
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(post(http, hook.url, b"{}"), name="slow-post")
        await hook.wait_for(lambda h: h.in_flight == 1)
        await hook.close()
        with pytest.raises(aiohttp.ClientError):
            await task
    await hook.close()  # idempotent
    assert hook.requests[0].status == 0


def test_binary_and_structured_cloudevents_decode_alike() -> None:
    binary = {"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t",
              "ce-subject": "default/a", "Content-Type": "application/json"}
    (event,) = decode_cloudevents(binary, b'{"kind": "Pod"}')
    assert event == {**CE, "datacontenttype": "application/json", "data": {"kind": "Pod"}}
    assert decode_cloudevents({}, orjson.dumps([CE, CE])) == [CE, CE]
    assert decode_cloudevents({}, b"not json") == []
