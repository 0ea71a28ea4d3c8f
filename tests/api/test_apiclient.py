"""ApiClient against a real local HTTP(S) server: error mapping, REST-layer retries, 401 refresh,
TLS (custom CA, client certificates, insecure), timeouts, and credentials kept out of messages."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from aiohttp import web

from bridge.clock import FakeClock
from bridge.errors import (
    ApiUnavailableError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ResourceExpiredError,
    ServerError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
    UnauthorizedError,
)
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.kube.kubeconfig import FileTokenSource

from .conftest import InstantClock, ScriptedServer

SECRET = "s3cr3t-token-value"


def status(code: int, reason: str, message: str) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


async def test_get_json_sends_params_and_token(server: ScriptedServer) -> None:
    async def ok(request: web.Request) -> web.StreamResponse:
        return web.json_response({"kind": "PodList", "items": []})

    server.handler = ok
    url = await server.start()
    async with ApiClient(server=url, token=SECRET) as client:
        body = await client.get_json(
            "/api/v1/pods", {"limit": 5, "watch": False, "allowWatchBookmarks": True, "continue": None}
        )
    assert body == {"kind": "PodList", "items": []}
    [req] = server.requests
    assert (req.method, req.path) == ("GET", "/api/v1/pods")
    assert req.query == {"limit": "5", "watch": "false", "allowWatchBookmarks": "true"}
    assert req.authorization == f"Bearer {SECRET}"


async def test_create_replace_patch_delete_send_bodies(server: ScriptedServer) -> None:
    async def echo(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        return web.json_response({"method": request.method, "got": body})

    server.handler = echo
    url = await server.start()
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
    async with ApiClient(server=url) as client:
        assert await client.create(path, {"a": 1}) == {"method": "POST", "got": {"a": 1}}
        assert await client.replace(f"{path}/x", {"b": 2}) == {"method": "PUT", "got": {"b": 2}}
        assert await client.patch(f"{path}/x", {"c": 3}) == {"method": "PATCH", "got": {"c": 3}}
        assert await client.delete(f"{path}/x") == {"method": "DELETE", "got": {}}
        assert await client.get(f"{path}/x") == {"method": "GET", "got": {}}
    kinds = [(r.method, r.content_type) for r in server.requests]
    assert kinds == [
        ("POST", "application/json"),
        ("PUT", "application/json"),
        ("PATCH", "application/merge-patch+json"),
        ("DELETE", None),
        ("GET", None),
    ]
    assert all(r.authorization is None for r in server.requests)


@pytest.mark.parametrize(
    ("code", "reason", "message", "error"),
    [
        (404, "NotFound", 'pods "x" not found', NotFoundError),
        (403, "Forbidden", "pods is forbidden", ForbiddenError),
        (401, "Unauthorized", "Unauthorized", UnauthorizedError),
        (409, "AlreadyExists", "already exists", ConflictError),
        (410, "Expired", "The provided continue parameter is too old", ResourceExpiredError),
        (422, "Invalid", "bad", BadRequestError),
        (504, "Timeout", "Too large resource version: 99, current: 5", TooLargeResourceVersionError),
        (500, "InternalError", "boom", ServerError),
    ],
)
async def test_statuses_map_to_errors(
    server: ScriptedServer, code: int, reason: str, message: str, error: type[Exception]
) -> None:
    async def fail(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(code, reason, message), status=code)

    server.handler = fail
    url = await server.start()
    async with ApiClient(server=url) as client:
        with pytest.raises(error) as info:
            await client.get_json("/api/v1/pods", context="list pods")
    assert str(info.value) == f"list pods: {message}"
    assert info.value.code == code  # type: ignore[attr-defined]
    assert info.value.reason == reason  # type: ignore[attr-defined]
    assert len(server.requests) == 1


async def test_non_json_error_body_is_reported(server: ScriptedServer) -> None:
    async def fail(request: web.Request) -> web.StreamResponse:
        return web.Response(text="upstream connect error", status=502)

    server.handler = fail
    url = await server.start()
    async with ApiClient(server=url) as client:
        with pytest.raises(ServerError, match=r"^list pods: upstream connect error$"):
            await client.get_json("/api/v1/pods", context="list pods")


@pytest.mark.parametrize("code", [429, 503])
async def test_retry_after_is_honoured_then_succeeds(server: ScriptedServer, code: int) -> None:
    answers = 0

    async def flaky(request: web.Request) -> web.StreamResponse:
        nonlocal answers
        answers += 1
        if answers <= 3:
            return web.json_response(status(code, "TooManyRequests", "slow down"), status=code,
                                     headers={"Retry-After": str(answers)})
        return web.json_response({"ok": True})

    server.handler = flaky
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock) as client:
        assert await client.get_json("/api/v1/pods") == {"ok": True}
        assert client.retries == 3
        assert client.requests_sent == 4
    assert len(server.requests) == 4
    assert clock.sleeps == [1.0, 2.0, 3.0]


async def test_too_large_resource_version_with_retry_after_is_waited_and_retried(
    server: ScriptedServer,
) -> None:
    """A list "not older than" an RV the API server's watch cache has not reached yet answers 504
    "Too large resource version" with Retry-After 1 (after waiting ~3 s itself); as client-go's REST
    layer, the client waits and sends the same request again: the cache usually catches up."""
    answers = 0

    async def catching_up(request: web.Request) -> web.StreamResponse:
        nonlocal answers
        answers += 1
        if answers <= 2:
            return web.json_response(status(504, "Timeout", "Too large resource version: 12, current: 11"),
                                     status=504, headers={"Retry-After": "1"})
        return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "12"}, "items": []})

    server.handler = catching_up
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock) as client:
        body = await client.get_json("/api/v1/pods", {"resourceVersion": "12"})
        assert body["metadata"] == {"resourceVersion": "12"}
        assert client.retries == 2
    assert [r.query for r in server.requests] == [{"resourceVersion": "12"}] * 3
    assert clock.sleeps == [1.0, 1.0]


async def test_retries_give_up_after_max_retries(server: ScriptedServer) -> None:
    async def busy(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(429, "TooManyRequests", "slow down"), status=429,
                                 headers={"Retry-After": "2"})

    server.handler = busy
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock, options=ApiClientOptions(max_retries=4)) as client:
        with pytest.raises(TooManyRequestsError) as info:
            await client.get_json("/api/v1/pods", context="list pods")
    assert info.value.retry_after == 2.0
    assert len(server.requests) == 5
    assert clock.sleeps == [2.0] * 4


async def test_default_is_ten_retries_like_client_go(server: ScriptedServer) -> None:
    async def busy(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(503, "ServiceUnavailable", "busy"), status=503,
                                 headers={"Retry-After": "0"})

    server.handler = busy
    url = await server.start()
    async with ApiClient(server=url, clock=InstantClock()) as client:
        with pytest.raises(ServerError):
            await client.get_json("/api/v1/pods")
    assert len(server.requests) == 11


async def test_5xx_without_retry_after_is_not_retried(server: ScriptedServer) -> None:
    async def fail(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(500, "InternalError", "boom"), status=500)

    server.handler = fail
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock) as client:
        with pytest.raises(ServerError) as info:
            await client.get_json("/api/v1/pods")
    assert info.value.retry_after is None
    assert len(server.requests) == 1
    assert clock.sleeps == []


async def test_retry_waits_on_the_injected_clock(server: ScriptedServer) -> None:
    answers = 0

    async def once_busy(request: web.Request) -> web.StreamResponse:
        nonlocal answers
        answers += 1
        if answers == 1:
            return web.json_response(status(429, "TooManyRequests", "x"), status=429,
                                     headers={"Retry-After": "30"})
        return web.json_response({"ok": True})

    server.handler = once_busy
    url = await server.start()
    clock = FakeClock()
    async with ApiClient(server=url, clock=clock) as client:
        task = asyncio.create_task(client.get_json("/x"), name="get-x")
        for _ in range(1000):
            if clock.pending_sleepers:
                break
            await asyncio.sleep(0.005)
        await clock.advance(29)
        assert not task.done()
        await clock.advance(1)
        assert await task == {"ok": True}
    assert len(server.requests) == 2


async def test_post_is_retried_with_its_body(server: ScriptedServer) -> None:
    answers = 0

    async def once_busy(request: web.Request) -> web.StreamResponse:
        nonlocal answers
        answers += 1
        if answers == 1:
            return web.json_response(status(429, "TooManyRequests", "x"), status=429,
                                     headers={"Retry-After": "1"})
        return web.json_response(await request.json(), status=201)

    server.handler = once_busy
    url = await server.start()
    async with ApiClient(server=url, clock=InstantClock()) as client:
        assert await client.create("/api/v1/namespaces/ns/configmaps", {"data": {"k": "v"}}) == {
            "data": {"k": "v"}
        }
    assert [r.body for r in server.requests] == [b'{"data":{"k":"v"}}'] * 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_server_is_api_unavailable() -> None:
    port = _free_port()
    async with ApiClient(server=f"http://127.0.0.1:{port}", token=SECRET) as client:
        with pytest.raises(ApiUnavailableError) as info:
            await client.get_json("/api", context="discovery /api")
    message = str(info.value)
    assert message.startswith(f"discovery /api: cannot reach the API server http://127.0.0.1:{port}")
    assert info.value.__cause__ is not None
    assert SECRET not in message


async def test_slow_answer_times_out_as_api_unavailable(server: ScriptedServer) -> None:
    release = asyncio.Event()
    answering = 0
    idle = asyncio.Event()
    idle.set()

    async def slow(request: web.Request) -> web.StreamResponse:
        nonlocal answering
        answering += 1
        idle.clear()
        try:
            await release.wait()
            return web.json_response({})
        finally:
            answering -= 1
            if not answering:
                idle.set()

    server.handler = slow
    url = await server.start()
    async with ApiClient(server=url, options=ApiClientOptions(request_timeout=0.2)) as client:
        with pytest.raises(ApiUnavailableError, match="TimeoutError"):
            await client.get_json("/api")
    # The handlers that were reached end once released (under load the client's 0.2 s can run out
    # before the server reaches the handler at all: then none is waiting).
    release.set()
    await idle.wait()
    await asyncio.sleep(0.01)


async def test_401_rereads_the_token_file_once(server: ScriptedServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")

    async def rotate_then_accept(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") == "Bearer new-token":
            return web.json_response({"ok": True})
        token_file.write_text("new-token\n")  # the kubelet rotated it meanwhile
        return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)

    server.handler = rotate_then_accept
    url = await server.start()
    source = FileTokenSource(path=str(token_file), refresh_interval=3600, clock=FakeClock())
    async with ApiClient(server=url, token_source=source) as client:
        assert await client.get_json("/api") == {"ok": True}
        assert await client.get_json("/api") == {"ok": True}
    assert [r.authorization for r in server.requests] == [
        "Bearer old-token", "Bearer new-token", "Bearer new-token"
    ]
    assert source.reads == 2


async def test_a_second_401_raises_unauthorized(server: ScriptedServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET)

    async def reject(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)

    server.handler = reject
    url = await server.start()
    source = FileTokenSource(path=str(token_file), refresh_interval=3600, clock=FakeClock())
    async with ApiClient(server=url, token_source=source) as client:
        with pytest.raises(UnauthorizedError) as info:
            await client.get_json("/api/v1/pods", context="list pods")
        assert SECRET not in repr(client)
        assert SECRET not in str(client)
    assert str(info.value) == "list pods: Unauthorized"
    assert SECRET not in repr(info.value)
    assert len(server.requests) == 2
    assert SECRET not in repr(source)


async def test_retries_stop_at_the_call_timeout(server: ScriptedServer) -> None:
    """A call with a timeout (a leader-election round) never waits a Retry-After that would end
    past it: it gives up with the server's error instead of retrying ten times."""
    async def busy(request: web.Request) -> web.StreamResponse:
        return web.json_response(status(429, "TooManyRequests", "slow down"), status=429,
                                 headers={"Retry-After": "2"})

    server.handler = busy
    url = await server.start()
    clock = InstantClock()
    async with ApiClient(server=url, clock=clock) as client:
        with pytest.raises(TooManyRequestsError):
            await client.get("/apis/coordination.k8s.io/v1/namespaces/ns/leases/x", timeout=5.0)
    assert clock.sleeps == [2.0, 2.0]
    assert len(server.requests) == 3


async def test_a_hanging_answer_is_cut_at_the_call_timeout(server: ScriptedServer) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({})

    server.handler = hang
    url = await server.start()
    async with ApiClient(server=url) as client:  # request_timeout 60 s
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ApiUnavailableError, match="TimeoutError"):
            await client.replace("/apis/coordination.k8s.io/v1/namespaces/ns/leases/x", {}, timeout=0.3)
        assert loop.time() - started < 30.0  # the call's 0.3 s, not the client's 60 s
        with pytest.raises(ApiUnavailableError, match="deadline"):
            await client.get("/x", timeout=0.0)
    release.set()
