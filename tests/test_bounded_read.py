"""Bounded reads of answers from outside, against a real aiohttp server: a prefix and whether the
body was longer; a body already received consumed without waiting, a longer or still arriving one
left unread with its connection closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bridge.bounded_read import drain_buffered, read_prefix


@pytest.fixture
async def server() -> AsyncIterator[str]:
    done = asyncio.Event()
    async def small(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(1000):
                await resp.write(b"x" * 65536)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass
        return resp

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "10"})
        await resp.prepare(request)
        await resp.write(b"ab")
        await done.wait()
        return resp

    app = web.Application()
    app.router.add_get("/small", small)
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    done.set()
    await runner.cleanup()


async def test_read_prefix_says_whether_the_body_was_longer(server: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{server}/small") as r:
            assert await read_prefix(r, 4096) == (b"ok", False)
        async with s.get(f"{server}/big") as r:
            head, cut = await read_prefix(r, 4096)
            assert (len(head), cut) == (4096, True)
            assert r.closed


async def test_drain_buffered_never_waits_for_a_body(server: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{server}/small") as r:
            await r.content.wait_eof()  # the two-byte body has arrived (nothing consumed)
            assert drain_buffered(r, 65536) is True
        async with s.get(f"{server}/slow") as r:
            assert drain_buffered(r, 65536) is False  # 2 of 10 bytes: closed, not waited for
            assert r.closed
        async with s.get(f"{server}/big") as r:
            assert drain_buffered(r, 65536) is False
