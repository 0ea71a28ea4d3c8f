"""The other decoders of outside input are bounded too: the simulator refuses a request body nested
deeper than the bound (its store copies objects with orjson, which stops at 254 levels) and keeps
serving; the API client refuses an answer nested too deep with its own error, never a RecursionError
or an encoder's TypeError later."""

from __future__ import annotations

import pytest
from aiohttp import web

from bridge.errors import ApiStatusError, BadRequestError
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from tests.api.conftest import InstantClock, ScriptedServer, server  # noqa: F401 - the fixture

from .apiserver import deep_value


async def test_the_simulator_refuses_a_body_nested_beyond_the_bound_and_keeps_serving() -> None:
    async with Simulator() as sim:
        client = ApiClient(server=sim.url, clock=InstantClock())
        try:
            for levels in (201, 300, 5000):
                deep = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"deep-{levels}"}}
                body = (b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"data":'
                        + deep_value(levels) + b"}")
                with pytest.raises(BadRequestError, match="nested deeper than 200 levels"):
                    await client.create("/api/v1/namespaces/default/configmaps", body)
                created = await client.create("/api/v1/namespaces/default/configmaps", deep)
                assert created["metadata"]["name"] == f"deep-{levels}"
        finally:
            await client.close()


async def test_the_api_client_refuses_an_answer_nested_too_deep(server: ScriptedServer) -> None:  # noqa: F811
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b'{"kind":"Pod","spec":' + deep_value(5000) + b"}",
                            content_type="application/json")

    server.handler = answer
    url = await server.start()
    client = ApiClient(server=url, clock=InstantClock())
    try:
        with pytest.raises(ApiStatusError, match="nested deeper than 200 levels"):
            await client.get("/api/v1/namespaces/default/pods/x")
    finally:
        await client.close()
