"""A webhook receiver for tests: a real HTTP server whose answers the test scripts.

:class:`WebhookReceiver` listens on 127.0.0.1 (a port the system picks, so none is taken between
choosing and binding), answers every method and path, and records each request: method, path,
headers, body, when it came, what it was answered (:class:`ReceivedRequest`). Answers are
:class:`Reply` values: a default (:attr:`WebhookReceiver.reply`, 204 at first), one-shot replies
queued with :meth:`WebhookReceiver.script`, or a ``respond`` coroutine that decides from the request
(and may wait on anything the test controls). A reply carries a status code, a ``Retry-After``, a
body, headers and a latency. The CloudEvents of the accepted (2xx) requests are counted and decoded
(:attr:`WebhookReceiver.events`): structured ones (a JSON object or, batched, an array) and binary
ones (``ce-*`` headers and the data as the body). Use it as an async context manager; on exit the
handlers still answering (a deliberately slow reply) are cancelled and the server stops.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

__all__ = ["ReceivedRequest", "Reply", "Responder", "WebhookReceiver", "decode_cloudevents"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of the receiver."""

    status: int = 204
    retry_after: float | str | None = None
    """Sent as the ``Retry-After`` header (seconds, or an HTTP date as a string) when set."""
    delay: float = 0.0
    """Seconds the receiver waits before it answers (the client may time out meanwhile)."""
    body: bytes | str = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass(slots=True)
class ReceivedRequest:
    """One request the receiver got, and what it answered (``status`` is 0 while it answers)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """As sent (names in the client's case; a repeated header keeps its last value): a plain dict,
    as the CloudEvents and Standard Webhooks libraries take headers."""
    body: bytes
    at: float
    """``time.monotonic()`` when the body had been read."""
    peer_certificate: Mapping[str, Any] | None = None
    """The client's TLS certificate as :meth:`ssl.SSLSocket.getpeercert` gives it (mTLS), or None."""
    status: int = 0
    """The status answered (0: not answered yet, or the client went away first)."""
    _decoded: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body, decoded as JSON."""
        return json.loads(self.body)

    def cloudevents(self) -> list[dict[str, Any]]:
        """The CloudEvents the request carries (:func:`decode_cloudevents`), decoded when first
        asked for (not while the receiver answers)."""
        if self._decoded is None:
            self._decoded = decode_cloudevents(self.headers, self.body)
        return self._decoded


Responder = Callable[[ReceivedRequest], Awaitable[Reply | None]]
"""Decides the answer to a request; None: the receiver's default reply."""


def decode_cloudevents(headers: Mapping[str, str], body: bytes) -> list[dict[str, Any]]:
    """The CloudEvents of one HTTP request, as dicts of their attributes and ``data``: binary mode
    (a ``ce-specversion`` header: the ``ce-*`` headers are the attributes, the body is the data,
    decoded as JSON when its content type says so) or structured (the body is one JSON event, or an
    array of them in batched mode). An empty or non-JSON structured body carries none."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "ce-specversion" in lowered:
        event: dict[str, Any] = {k[3:]: v for k, v in lowered.items() if k.startswith("ce-")}
        content_type = lowered.get("content-type", "")
        if content_type:
            event["datacontenttype"] = content_type
        event["data"] = json.loads(body) if body and "json" in content_type else body
        return [event]
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    if isinstance(doc, list):
        return [e for e in doc if isinstance(e, dict)]
    return [doc] if isinstance(doc, dict) else []


class WebhookReceiver:
    """A real HTTP endpoint for a webhook sink (module docstring).

    ``path``: the path :attr:`url` names (every path is answered; "": none, the URL is the
    server's, for a test that adds its own); ``reply``: the default answer;
    ``respond``: decides answers the script does not; ``ssl_context``: serve HTTPS (and record the
    client's certificate); ``max_body``: the largest body accepted (aiohttp answers 413 beyond it);
    ``port``: 0, the default, lets the system pick one."""

    def __init__(self, *, path: str = "/events", reply: Reply | None = None,
                 respond: Responder | None = None, ssl_context: ssl.SSLContext | None = None,
                 max_body: int = 1 << 20, host: str = "127.0.0.1", port: int = 0) -> None:
        self.path = path if not path or path.startswith("/") else f"/{path}"
        self.reply = reply or Reply()
        """The answer when neither the script nor ``respond`` gives one (change it any time)."""
        self.respond = respond
        self.requests: list[ReceivedRequest] = []
        """Every request, in the order their bodies were read."""
        self.in_flight = 0
        """Requests being answered now."""
        self.max_in_flight = 0
        """The most requests answered at the same time so far."""
        self._script: deque[Reply] = deque()
        self._ssl = ssl_context
        self._max_body = max_body
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._accepted: list[ReceivedRequest] = []
        self._changed = asyncio.Event()
        """Set, and replaced by a new one, at every request and answer."""

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> WebhookReceiver:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=self._max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, ssl_context=self._ssl)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])
        self._runner = runner
        return self

    async def close(self) -> None:
        """Cancels the handlers still answering and stops the server. Idempotent."""
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> WebhookReceiver:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- where it is -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._runner is None:
            raise RuntimeError("the receiver is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http(s)://127.0.0.1:<port>``, no path."""
        return f"{'https' if self._ssl else 'http'}://{self._host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL with :attr:`path`: what a sink's ``url`` option takes."""
        return self.base_url + self.path

    # ---- scripting ---------------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queues one-shot ``replies``: the next requests get them, in order, before ``respond`` or
        the default is asked."""
        self._script.extend(replies)

    @property
    def scripted(self) -> int:
        """Queued replies not used yet."""
        return len(self._script)

    # ---- what was received ---------------------------------------------------------------------------

    @property
    def accepted(self) -> list[ReceivedRequest]:
        """The requests answered 2xx, in the order they were answered (what the destination holds,
        in the order it took it)."""
        return list(self._accepted)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The CloudEvents of the accepted requests, in the order they were accepted."""
        return [event for r in self._accepted for event in r.cloudevents()]

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    def event_count(self) -> int:
        """CloudEvents in accepted requests."""
        return sum(len(r.cloudevents()) for r in self._accepted)

    async def wait_for(self, predicate: Callable[[WebhookReceiver], bool],
                       timeout: float | None = None) -> None:
        """Returns once ``predicate(self)`` holds, checked after every request and answer; raises
        :class:`TimeoutError` after ``timeout`` seconds (None: waits as long as it takes)."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                await self._changed.wait()

    async def wait_for_events(self, count: int, timeout: float | None = None) -> list[dict[str, Any]]:
        """Waits until at least ``count`` events were accepted; returns them all."""
        await self.wait_for(lambda r: r.event_count >= count, timeout)
        return self.events

    # ---- serving -------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1
            if task is not None:
                self._handlers.discard(task)
            self._notify()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None and self._ssl else None
        rec = ReceivedRequest(method=request.method, path=request.path, query=request.query_string,
                              headers={str(k): v for k, v in request.headers.items()}, body=body,
                              at=time.monotonic(), peer_certificate=cert)
        self.requests.append(rec)
        self._notify()
        reply = await self._choose(rec)
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)
        headers = dict(reply.headers)
        if reply.retry_after is not None:
            headers["Retry-After"] = str(reply.retry_after)
        rec.status = reply.status
        if reply.accepted:
            self._accepted.append(rec)
        data = reply.body.encode() if isinstance(reply.body, str) else reply.body
        return web.Response(status=reply.status, body=data or None, headers=headers)

    async def _choose(self, rec: ReceivedRequest) -> Reply:
        if self._script:
            return self._script.popleft()
        if self.respond is not None:
            chosen = await self.respond(rec)
            if chosen is not None:
                return chosen
        return self.reply

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
