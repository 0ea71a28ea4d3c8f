"""The bridge's HTTP client for the Kubernetes API.

The official ``kubernetes`` package is synchronous and builds typed models; the bridge needs neither on
its hot path. This client uses aiohttp, returns raw bytes or ``orjson``-decoded dicts, and keeps only
configuration and auth from the package (see :mod:`bridge.kube.kubeconfig`).

It is the edge where transport failures become :mod:`bridge.errors`: HTTP statuses through
:func:`~bridge.errors.status_error`, connection errors and timeouts as
:class:`~bridge.errors.ApiUnavailableError`, always with ``raise … from``. Like client-go's REST layer,
it retries a 429 or 5xx answer that carries ``Retry-After`` (up to ``max_retries`` times, waiting on the
injected clock) before the caller sees the error, and after a 401 it refreshes the credentials once.
A call given a ``timeout`` (leader election bounds every round by its deadline, as client-go gives
its leader-election client ``Timeout = RenewDeadline``) is bounded as a whole, retries included: no
attempt outlives it and no Retry-After is waited that would end past it.

Every request goes through the client's token bucket (:mod:`bridge.kube.ratelimit`; ``qps`` and
``burst`` in :class:`ApiClientOptions`), retries included, except the first attempt to open a watch,
as in client-go. The wait for a token is not part of ``request_timeout`` (client-go throttles before
it starts the request's timeout); it is part of a call's ``timeout``.

No token, key or certificate content appears in any message, log line or ``repr``.

Beside it: its options and retry observer (:mod:`bridge.kube.apioptions`), the HTTP details it
shares with its streams (:mod:`bridge.kube.apiwire`) and a watch's lines (:mod:`bridge.kube.linestream`).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Self

import aiohttp
import orjson

from bridge.bounded_read import ERROR_BODY_LIMIT, read_prefix
from bridge.clock import Clock, RealClock
from bridge.errors import (
    ApiUnavailableError,
    ConfigurationError,
    status_error,
)
from bridge.kube.apioptions import ApiClientOptions, RetryObserver
from bridge.kube.apiwire import (
    RETRYABLE_NETWORK_ERRORS,
    Params,
    encode_params,
    json_object,
    parse_retry_after,
    redact_url,
    status_body,
)
from bridge.kube.kubeconfig import (
    ClusterConfig,
    LoadedConfig,
    StaticTokenSource,
    TokenSource,
    in_cluster_available,
    load_in_cluster,
    load_kubeconfig,
)
from bridge.kube.linestream import LineStream
from bridge.kube.ratelimit import TokenBucket

__all__ = ["ApiClient", "ApiClientOptions", "LineStream", "Params", "RetryObserver"]

_log = logging.getLogger(__name__)


class ApiClient:
    """An asyncio client for one Kubernetes API server.

    Create it with :meth:`from_kubeconfig`, :meth:`in_cluster`, :meth:`auto`, or directly. The
    aiohttp session is opened on first use, in the running loop; :meth:`close` releases it.
    """

    def __init__(
        self,
        *,
        server: str,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        verify: bool = True,
        tls_server_name: str | None = None,
        token_source: TokenSource | None = None,
        options: ApiClientOptions | None = None,
        clock: Clock | None = None,
        source: str = "",
    ) -> None:
        if not server.startswith(("http://", "https://")):
            raise ConfigurationError(f"API server URL {redact_url(server)!r} must start with http(s)://")
        if token is not None and token_source is not None:
            raise ConfigurationError("give either token or token_source, not both")
        self._server = server.rstrip("/")
        self._display_server = redact_url(self._server)
        self._token_source: TokenSource | None = (
            StaticTokenSource(token) if token is not None else token_source
        )
        self._options = options or ApiClientOptions()
        self._clock: Clock = clock or RealClock()
        self._source = source
        self._tls_server_name = tls_server_name
        self._ssl = self._ssl_context(
            ca_file=ca_file, cert_file=cert_file, key_file=key_file, verify=verify
        )
        self._session: aiohttp.ClientSession | None = None
        self._stream_session: aiohttp.ClientSession | None = None
        self._closed = False
        try:
            self.rate_limiter = TokenBucket(qps=self._options.qps, burst=self._options.burst,
                                            clock=self._clock)
        except ValueError as e:
            raise ConfigurationError(f"API client for {self._display_server}: {e}") from e
        self.requests_sent = 0
        """Every HTTP request sent, retries included (for tests and metrics)."""
        self.retries = 0
        """Requests re-sent after a 429/5xx with Retry-After."""
        self.retry_observer: RetryObserver | None = None
        """Told of every retried answer and of how each retried call ended (see RetryObserver)."""

    def _ssl_context(
        self, *, ca_file: str | None, cert_file: str | None, key_file: str | None, verify: bool
    ) -> ssl.SSLContext | None:
        if not self._server.startswith("https://"):
            return None
        try:
            ctx = ssl.create_default_context(cafile=ca_file)
            if cert_file:
                ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            # The message names files, never their content.
            raise ConfigurationError(
                f"TLS configuration for {self._display_server}: cannot load "
                f"CA {ca_file or '(system)'} / client certificate {cert_file or '(none)'}: "
                f"{getattr(e, 'strerror', None) or type(e).__name__}"
            ) from e
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    # ----------------------------------------------------------------------------------------------
    # constructors

    @classmethod
    def from_loaded(
        cls, loaded: LoadedConfig, *, options: ApiClientOptions | None = None, clock: Clock | None = None
    ) -> ApiClient:
        c: ClusterConfig = loaded.cluster
        return cls(
            server=c.server,
            ca_file=c.ca_file,
            cert_file=c.cert_file,
            key_file=c.key_file,
            verify=c.verify,
            tls_server_name=c.tls_server_name,
            token_source=loaded.token_source,
            options=options,
            clock=clock,
            source=c.source,
        )

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | None = None,
        context: str | None = None,
        *,
        options: ApiClientOptions | None = None,
        clock: Clock | None = None,
    ) -> ApiClient:
        """From a kubeconfig (``path`` / ``$KUBECONFIG`` / ``~/.kube/config``) and ``context``.

        Blocking: may run an exec credential plugin. Raises ConfigurationError for a bad file."""
        return cls.from_loaded(load_kubeconfig(path, context), options=options, clock=clock)

    @classmethod
    def in_cluster(
        cls,
        *,
        options: ApiClientOptions | None = None,
        clock: Clock | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ApiClient:
        """From the Pod's service account; the token file is re-read as it rotates."""
        opts = options or ApiClientOptions()
        kwargs: dict[str, Any] = {}
        if token_file is not None:
            kwargs["token_file"] = token_file
        if ca_file is not None:
            kwargs["ca_file"] = ca_file
        loaded = load_in_cluster(
            environ=environ, refresh_interval=opts.token_refresh_interval, clock=clock, **kwargs
        )
        return cls.from_loaded(loaded, options=opts, clock=clock)

    @classmethod
    def auto(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        options: ApiClientOptions | None = None,
        clock: Clock | None = None,
    ) -> ApiClient:
        """In-cluster when running in a Pod (and no kubeconfig was named), else the kubeconfig."""
        if kubeconfig is None and context is None and in_cluster_available():
            return cls.in_cluster(options=options, clock=clock)
        return cls.from_kubeconfig(kubeconfig, context, options=options, clock=clock)

    # ----------------------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return self._display_server

    @property
    def options(self) -> ApiClientOptions:
        return self._options

    def __repr__(self) -> str:
        auth = "none" if self._token_source is None else type(self._token_source).__name__
        return f"ApiClient(server={self._display_server!r}, auth={auth})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection pool. Idempotent."""
        self._closed = True
        for attr in ("_session", "_stream_session"):
            session = getattr(self, attr)
            if session is not None:
                setattr(self, attr, None)
                await session.close()

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=limit)
        return aiohttp.ClientSession(
            connector=connector,
            headers={"User-Agent": self._options.user_agent, "Accept": "application/json"},
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
        )

    def _get_session(self, *, stream: bool = False) -> aiohttp.ClientSession:
        """The session for requests (a pool of ``connection_limit`` connections), or with
        ``stream`` the one for watches (one connection each, unbounded: see ``connection_limit``)."""
        if self._closed:
            raise ApiUnavailableError(f"API client for {self._display_server} is closed")
        if stream:
            if self._stream_session is None:
                self._stream_session = self._new_session(0)
            return self._stream_session
        if self._session is None:
            self._session = self._new_session(self._options.connection_limit)
        return self._session

    async def _headers(
        self, content_type: str | None, *, force_refresh: bool, accept: str | None = None
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        if content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        if self._token_source is not None:
            value = await self._token_source.authorization(force_refresh=force_refresh)
            if value:
                headers["Authorization"] = value
        return headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Params | None,
        data: bytes | None,
        content_type: str | None,
        context: str,
        timeout: aiohttp.ClientTimeout,
        budget: float | None = None,
        accept: str | None = None,
        watch: bool = False,
    ) -> aiohttp.ClientResponse:
        """Sends until an answer is final; returns a 2xx response (unread) or raises.

        Retries: a 429/5xx carrying Retry-After, up to ``max_retries`` times; a 401, once, with
        refreshed credentials. ``budget`` (seconds on the injected clock) bounds the whole call:
        each attempt's total timeout is cut to what is left, and a retry whose wait would end past
        it is not made (the server's error is raised instead). Each attempt takes a token of the
        rate limiter first, but for the first attempt of a ``watch``."""
        session = self._get_session(stream=watch)
        end = None if budget is None else self._clock.now() + max(0.0, budget)
        url = self._server + path
        query = encode_params(params)
        told: list[int] = []  # the retries told to the observer: then the call's end is told too
        try:
            response = await self._send_loop(method, url, query=query, data=data, content_type=content_type,
                                             context=context, timeout=timeout, end=end, accept=accept,
                                             session=session, watch=watch, told=told)
        except BaseException as e:
            if told and self.retry_observer is not None:
                self.retry_observer.settled(context, e)
            raise
        if told and self.retry_observer is not None:
            self.retry_observer.settled(context, None)
        return response

    async def _send_loop(self, method: str, url: str, *, query: Any, data: bytes | None,
                         content_type: str | None, context: str, timeout: aiohttp.ClientTimeout,
                         end: float | None, accept: str | None, session: aiohttp.ClientSession,
                         watch: bool, told: list[int]) -> aiohttp.ClientResponse:
        attempt = 0
        refreshed = False
        force_refresh = False
        while True:
            sent = self._clock.now()
            headers = await self._headers(content_type, force_refresh=force_refresh, accept=accept)
            force_refresh = False
            if attempt or refreshed or not watch:
                await self.rate_limiter.acquire(deadline=end, context=context)
            response = await self._attempt(session, method, url, query=query, data=data, headers=headers,
                                           timeout=self._attempt_timeout(timeout, end, context),
                                           context=context)
            if response.status < 400:
                return response
            body = await self._error_body(response, context)
            code = response.status
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            status = status_body(body, code)
            if code == 401 and not refreshed and self._token_source is not None:
                refreshed = force_refresh = True
                _log.info("%s: 401 from %s; refreshing credentials", context, self._display_server)
                continue
            # As client-go's REST layer, any 429/5xx carrying Retry-After is waited and sent again,
            # "Too large resource version" (504, Retry-After 1) included: the watch cache is behind
            # the RV asked for and usually catches up within a retry or two. Only after
            # ``max_retries`` does the reflector see the error (and relist from a consistent read).
            wait = min(retry_after or 0.0, self._options.max_retry_after)
            in_budget = end is None or self._clock.now() + wait < end
            if (code == 429 or code >= 500) and retry_after is not None and (
                attempt < self._options.max_retries
            ) and in_budget:
                attempt += 1
                self.retries += 1
                _log.info("%s: HTTP %d, retry %d/%d in %.1fs", context, code, attempt,
                          self._options.max_retries, wait)
                observer = self.retry_observer
                if observer is not None:
                    told.append(attempt)
                    observer.retrying(context, code, str(status.get("message") or ""), attempt=attempt,
                                      max_retries=self._options.max_retries, wait=wait,
                                      attempt_seconds=self._clock.now() - sent)
                await self._clock.sleep(wait)
                continue
            err = status_error(code, status, retry_after=retry_after, context=context)
            raise err from None

    def _attempt_timeout(self, timeout: aiohttp.ClientTimeout, end: float | None,
                         context: str) -> aiohttp.ClientTimeout:
        """``timeout`` with its total cut to what is left of the call's budget (ending at ``end``)."""
        if end is None:
            return timeout
        left = end - self._clock.now()
        if left <= 0:
            raise ApiUnavailableError(f"{context}: the call's deadline passed before sending")
        total = left if timeout.total is None else min(timeout.total, left)
        return aiohttp.ClientTimeout(
            total=total, sock_connect=timeout.sock_connect, sock_read=timeout.sock_read)

    async def _attempt(self, session: aiohttp.ClientSession, method: str, url: str, *, query: Any,
                       data: bytes | None, headers: dict[str, str], timeout: aiohttp.ClientTimeout,
                       context: str) -> aiohttp.ClientResponse:
        """One request sent; its answer, whatever the status; a transport failure as
        ApiUnavailableError."""
        self.requests_sent += 1
        try:
            return await session.request(
                method,
                url,
                params=query,
                data=data,
                headers=headers,
                timeout=timeout,
                server_hostname=self._tls_server_name,
            )
        except aiohttp.ClientConnectorCertificateError as e:
            raise ApiUnavailableError(
                f"{context}: TLS verification of {self._display_server} failed "
                f"({type(e.certificate_error).__name__}); check the certificate authority"
            ) from e
        except RETRYABLE_NETWORK_ERRORS as e:
            raise ApiUnavailableError(
                f"{context}: cannot reach the API server {self._display_server}: "
                f"{type(e).__name__}{': ' + str(e) if str(e) else ''}"
            ) from e

    @staticmethod
    async def _error_body(response: aiohttp.ClientResponse, context: str) -> bytes:
        """The (bounded) body of an error answer; the response is released."""
        try:
            body, _ = await read_prefix(response, ERROR_BODY_LIMIT)  # a Status: never this long
        except RETRYABLE_NETWORK_ERRORS as e:
            response.close()
            raise ApiUnavailableError(f"{context}: connection broke reading an error answer") from e
        finally:
            response.release()
        return body

    def _request_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self._options.request_timeout, sock_connect=self._options.connect_timeout
        )

    async def request_bytes(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str | None = None,
        context: str = "",
        timeout: float | None = None,
        accept: str | None = None,
    ) -> bytes:
        """One request; returns the raw body of a 2xx answer. ``body`` is bytes or JSON-able.
        ``timeout`` bounds the whole call, retries and reading the answer included. ``accept``: an
        ``Accept`` header of the caller's (content negotiation, e.g. metadata-only lists)."""
        context = context or f"{method} {path}"
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes | bytearray):
            data = bytes(body)
        else:
            data = orjson.dumps(body)
        if data is not None and content_type is None:
            content_type = "application/json"
        response = await self._send(
            method, path, params=params, data=data, content_type=content_type, context=context,
            timeout=self._request_timeout(), budget=timeout, accept=accept,
        )
        try:
            return await response.read()
        except RETRYABLE_NETWORK_ERRORS as e:
            raise ApiUnavailableError(f"{context}: connection broke while reading the answer") from e
        finally:
            response.release()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str | None = None,
        context: str = "",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; returns the decoded JSON object of a 2xx answer ({} for an empty body).
        ``timeout`` (seconds) bounds the whole call, retries included."""
        raw = await self.request_bytes(
            method, path, params=params, body=body, content_type=content_type, context=context,
            timeout=timeout,
        )
        return json_object(raw, context or f"{method} {path}")

    async def get_negotiated(
        self, path: str, *, accept: str, context: str = ""
    ) -> tuple[dict[str, Any], str]:
        """A GET with its own ``Accept`` header (content negotiation, as discovery does); returns the
        decoded JSON object and the answer's ``Content-Type`` (with its parameters)."""
        context = context or f"GET {path}"
        response = await self._send(
            "GET", path, params=None, data=None, content_type=None, context=context,
            timeout=self._request_timeout(), accept=accept,
        )
        try:
            raw = await response.read()
        except RETRYABLE_NETWORK_ERRORS as e:
            raise ApiUnavailableError(f"{context}: connection broke while reading the answer") from e
        finally:
            response.release()
        return json_object(raw, context), response.headers.get("Content-Type", "")

    async def get_json(self, path: str, params: Params | None = None, *, context: str = "") -> dict[str, Any]:
        return await self.request("GET", path, params=params, context=context)

    async def get(self, path: str, *, params: Params | None = None, context: str = "",
                  timeout: float | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params, context=context, timeout=timeout)

    async def create(self, path: str, body: Any, *, context: str = "",
                     timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to a collection path; returns the created object."""
        return await self.request("POST", path, body=body, context=context, timeout=timeout)

    async def replace(self, path: str, body: Any, *, context: str = "",
                      timeout: float | None = None) -> dict[str, Any]:
        """PUT ``body`` (with its resourceVersion: a stale one → ConflictError)."""
        return await self.request("PUT", path, body=body, context=context, timeout=timeout)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        content_type: str = "application/merge-patch+json",
        context: str = "",
    ) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type=content_type, context=context)

    async def delete(self, path: str, *, body: Any = None, context: str = "") -> dict[str, Any]:
        """DELETE; returns what the server answered (the object's last state or a Status)."""
        return await self.request("DELETE", path, body=body, context=context)

    async def open_stream(
        self,
        path: str,
        params: Params | None = None,
        *,
        context: str = "",
        read_timeout: float | None = None,
        accept: str | None = None,
    ) -> LineStream:
        """Opens a streaming GET (a watch). Errors while opening raise here (after the same retries
        as any request); the returned stream then yields lines until the server or :meth:`LineStream.
        close` ends it. ``read_timeout``: give up on a connection silent for that long. ``accept``:
        an ``Accept`` header of the caller's (e.g. a metadata-only watch)."""
        context = context or f"GET {path}"
        idle = read_timeout if read_timeout is not None else self._options.stream_idle_timeout
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._options.connect_timeout, sock_read=idle
        )
        response = await self._send(
            "GET", path, params=params, data=None, content_type=None, context=context, timeout=timeout,
            watch=True,
            accept=accept,
        )
        return LineStream(response=response, context=context, max_line_bytes=self._options.max_line_bytes)

    async def stream_lines(
        self, path: str, params: Params | None = None, *, context: str = ""
    ) -> AsyncGenerator[bytes, None]:
        """The lines of a streaming GET, as an async generator; the connection is released when the
        generator is closed. Prefer :meth:`open_stream` when opening errors must surface first."""
        stream = await self.open_stream(path, params, context=context)
        try:
            async for line in stream:
                yield line
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
