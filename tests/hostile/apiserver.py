"""A scripted, hostile Kubernetes API server over real HTTP (aiohttp), for the hostile-input suite.

It serves legacy discovery for two core resources (``pods`` and ``configmaps``), and for each a List
and a watch whose contents the test scripts as raw bytes: objects nested thousands of levels deep,
huge objects, numbers beyond 64 bits, duplicate keys, invalid UTF-8, watch lines split across chunks,
streams that trickle a byte at a time, lists whose continue token never ends. Nothing in it decodes
what it serves: the bytes go out exactly as scripted, which the simulator (a well-behaved server)
cannot do.

Run it standalone (``python -m tests.hostile.apiserver --port N --script NAME``) when the bridge under
test is a separate process; in-process tests use :class:`HostileApiServer` directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

RESOURCES = {"pods": "Pod", "configmaps": "ConfigMap"}


def deep_value(depth: int) -> bytes:
    """A JSON value ``depth`` levels deep: arrays and objects alternating, ``{"a":[{"a":[…]}]}``."""
    opens = [b'{"a":' if i % 2 == 0 else b"[" for i in range(depth)]
    closes = [b"}" if i % 2 == 0 else b"]" for i in reversed(range(depth))]
    return b"".join(opens) + b"0" + b"".join(closes)


def obj(kind: str, name: str, rv: int, *, namespace: str = "default", body: bytes = b'{"x":1}',
        uid: str = "") -> bytes:
    """An object's JSON as an API server lays it out (apiVersion, kind, metadata first), with
    ``body`` as its ``spec`` (or ``data`` for a ConfigMap). ``depth(obj(..., body=deep_value(n)))``
    is ``n + 1``."""
    meta = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "resourceVersion": str(rv)}
    member = b"data" if kind == "ConfigMap" else b"spec"
    return (b'{"apiVersion":"v1","kind":' + orjson.dumps(kind) + b',"metadata":' + orjson.dumps(meta)
            + b',"' + member + b'":' + body + b"}")


def event_line(type_: str, raw: bytes) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + raw + b"}\n"


@dataclass
class Resource:
    """What the server answers for one resource."""

    kind: str
    items: list[bytes] = field(default_factory=list)
    """The List's items as raw JSON (a List item's apiVersion and kind are left as they are)."""
    list_rv: int = 1
    later_items: list[bytes] | None = None
    """The items of every List after the first (the objects changed meanwhile); None: ``items``."""
    watch_lines: list[bytes] = field(default_factory=list)
    """What each watch sends before it waits (each line with its newline, or any bytes at all)."""
    chunk: int = 0
    """Send the watch bytes in chunks of this size (0: in one write)."""
    chunk_delay: float = 0.0
    """Seconds between chunks (a slow-loris stream)."""
    endless_continue: bool = False
    """Every List page carries a continue token, and the next page another one, forever."""
    changing_continue: bool = False
    """With ``endless_continue``: each page's token is new (``page-1``, ``page-2`` …), never repeated."""
    remaining_item_count: int | None = None
    """The ``remainingItemCount`` every page of an endless List reports."""
    lists: int = 0
    list_runs: list[int] = field(default_factory=list)
    """The pages of each list, a list being a request without ``continue`` and its continuations."""
    watches: int = 0
    watch_rvs: list[str] = field(default_factory=list)
    """The resourceVersion each watch asked for, in order."""
    live: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to push more lines to open watches (see :meth:`HostileApiServer.push`)."""
    pushed: list[bytes] = field(default_factory=list)


class HostileApiServer:
    """The server (start / stop in the running loop); ``resources`` holds each resource's script."""

    def __init__(self) -> None:
        self.resources: dict[str, Resource] = {name: Resource(kind=kind) for name, kind in RESOURCES.items()}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._closing = False

    def push(self, resource: str, line: bytes) -> None:
        """A line for every open (and later) watch of ``resource``, after its scripted lines."""
        res = self.resources[resource]
        res.pushed.append(line)
        res.live.set()

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_get("/api", self._api)
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/api/v1", self._resource_list)
        app.router.add_get("/api/v1/{resource}", self._collection)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}", self._collection)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{bound}"
        return self.url

    async def stop(self) -> None:
        self._closing = True
        for res in self.resources.values():
            res.live.set()  # open watches end
        if self._runner is not None:
            await self._runner.cleanup()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: hostile\n"
            f"clusters: [{{name: hostile, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: hostile, context: {cluster: hostile, user: u}}]\n")
        return path

    async def _api(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    async def _apis(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def _resource_list(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": name, "namespaced": True, "kind": kind,
             "verbs": ["get", "list", "watch"]} for name, kind in RESOURCES.items()]})

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        res = self.resources.get(request.match_info["resource"])
        if res is None:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, res)
        return self._list(request, res)

    def _list(self, request: web.Request, res: Resource) -> web.Response:
        res.lists += 1
        if not request.query.get("continue") or not res.list_runs:
            res.list_runs.append(0)
        res.list_runs[-1] += 1
        meta: dict[str, Any] = {"resourceVersion": str(res.list_rv)}
        if res.endless_continue:
            # The same token forever, or a new one every page.
            meta["continue"] = f"page-{res.lists}" if res.changing_continue else "again"
            if res.remaining_item_count is not None:
                meta["remainingItemCount"] = res.remaining_item_count
        items = res.items if res.later_items is None or len(res.list_runs) < 2 else res.later_items
        body = (b'{"kind":"' + res.kind.encode() + b'List","apiVersion":"v1","metadata":' + orjson.dumps(meta)
                + b',"items":[' + b",".join(items) + b"]}")
        return web.Response(body=body, content_type="application/json")

    async def _watch(self, request: web.Request, res: Resource) -> web.StreamResponse:
        res.watches += 1
        res.watch_rvs.append(request.query.get("resourceVersion", ""))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            data = b"".join(res.watch_lines)
            step = res.chunk or len(data) or 1
            for at in range(0, len(data), step):
                await resp.write(data[at:at + step])
                if res.chunk_delay:
                    await asyncio.sleep(res.chunk_delay)
            sent = 0
            timeout = float(request.query.get("timeoutSeconds") or 30)
            loop = asyncio.get_running_loop()
            end = loop.time() + min(timeout, 30.0)
            while loop.time() < end and not self._closing:
                while sent < len(res.pushed):
                    await resp.write(res.pushed[sent])
                    sent += 1
                if self._closing:
                    break
                res.live.clear()
                try:
                    await asyncio.wait_for(res.live.wait(), max(0.0, end - loop.time()))
                except TimeoutError:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        return resp


Script = Callable[[HostileApiServer], None]
