"""The webhook sink: CloudEvents over HTTP POST (aiohttp), one event per request or batched; a
:class:`WebhookTransport` (a :class:`~sinks.transport.RunTransport`) under the transport sink.

Every event goes to ``url`` (plus the rendered ``destination`` path template, if set) using the
CloudEvents HTTP binding: structured (``application/cloudevents+json``) or binary (``ce-*`` headers,
the data as the body). With ``batch.max_events > 1`` events waiting at the same time are posted
together as a JSON array (``application/cloudevents-batch+json``, or ``application/json`` with
``batch.format: array``); batching needs structured mode.

Failures: connection errors, timeouts, 408, 429 and 5xx are transient (retried by the sink with
backoff, ``Retry-After`` honoured, seconds or HTTP date); 413 (Content Too Large) takes the sink's
``oversize`` policy (the webhook has no size limit of its own: it gets whole objects unless its
server refuses them); any other non-2xx answer is permanent and the event goes to the dead letter
with the status and the start of the response body.

Order and concurrency: requests for different objects are in flight at the same time (up to
``connections``), while one object's events are never in two requests at once: the sink keeps
each object's events in a lane and sends its next event only once the one before it is settled
(acknowledged after a 2xx, or dead-lettered). In batch mode an object's events that wait in its lane
go together, in order, in one batch (a *run*: its array holds them in the order they happened; cut
to fit ``batch.max_events`` and ``batch.max_bytes``, never split across two requests), so a
backlog (after an outage, once the breaker closes) drains at the rate of whole batches rather than one
round trip per change of the busiest object. A run that fails goes again as a whole, from its first
event. Knative mode (``compat: knative``) sends one event per request: no batches.

Security: with ``hmac_secret`` (inline or from a file) every request is signed. The default scheme,
``signature: standard-webhooks``, follows the Standard Webhooks specification
(https://www.standardwebhooks.com): ``webhook-id`` (the CloudEvent id; for a batch a digest of its
ids, the same on every retry), ``webhook-timestamp`` (Unix seconds of this attempt) and
``webhook-signature: v1,<base64 HMAC-SHA256 over "id.timestamp.body">``, so a receiver can reject a
replayed request (outside its tolerance window, or an id it already processed). A secret written
``whsec_<base64>`` is base64-decoded as the specification's libraries do; any other secret is used as
its UTF-8 bytes. ``signature: hmac-sha256`` keeps the older ``X-Signature-256: sha256=<hex>`` HMAC of
the body alone (no replay protection); ``both`` sends both header sets while receivers migrate.
Also: bearer or basic auth (secrets from files allowed, read at start), custom headers, TLS with a
custom CA or verification off, and a client certificate for mTLS.

The options (and how a URL is shown) are in :mod:`sinks.webhook_options`.

The signing is written here rather than taken from the ``standardwebhooks`` package: it is three
lines over ``hmac``, signs the exact body bytes (the package signs text), and the tests verify the
requests with that package.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import email.utils
import hashlib
import hmac
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

from bridge.bounded_read import drain_buffered, read_prefix
from bridge.clock import Clock
from sinks.cloudevents import BATCH_CONTENT_TYPE, HTTP_PREFIX
from sinks.contract import SinkConfigError, SinkMessageTooLargeError, SinkPermanentError, SinkTransientError
from sinks.templates import sanitize_url_segment
from sinks.transport import EncodedMessage, Report, Transport, TransportSink
from sinks.webhook_options import (
    WebhookAuthOptions,
    WebhookBatchOptions,
    WebhookOptions,
    WebhookTLSOptions,
    display_url,
)

__all__ = [
    "SIGNATURE_HEADER",
    "StandardSigner",
    "WebhookAuthOptions",
    "WebhookBatchOptions",
    "WebhookOptions",
    "WebhookSink",
    "WebhookTLSOptions",
    "WebhookTransport",
    "display_url",
    "parse_retry_after",
    "sign",
]

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Signature-256"
_TRANSIENT_STATUS = frozenset({408, 425, 429})
_ANSWER_SHOWN = 200
"""Characters of an error answer's body quoted in its message (and the dead letter's reason)."""
_ANSWER_READ = 4096
"""Bytes read of an error answer at most; a longer body is cut and its connection closed."""
_OK_DRAINED = 64 * 1024
"""Bytes of a 2xx answer's body consumed if already received; beyond, or still arriving, the
connection is closed instead (the status is the outcome: the body is never waited for)."""


def sign(secret: bytes, body: bytes) -> str:
    """The ``hmac-sha256`` scheme's header value: ``sha256=<hex of HMAC-SHA256(secret, body)>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


_WHSEC_PREFIX = "whsec_"


class StandardSigner:
    """Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``."""

    __slots__ = ("_key",)

    def __init__(self, secret: str) -> None:
        """``secret``: ``whsec_<base64>`` (the key is the decoded bytes) or any other text (its UTF-8
        bytes). Raises ValueError for a ``whsec_`` secret that is not base64."""
        if secret.startswith(_WHSEC_PREFIX):
            try:
                self._key = base64.b64decode(secret[len(_WHSEC_PREFIX):], validate=True)
            except ValueError as exc:
                raise ValueError("a whsec_ secret must be base64 after the prefix") from exc
        else:
            self._key = secret.encode()
        if not self._key:
            raise ValueError("the secret is empty")

    def headers(self, msg_id: str, timestamp: float, body: bytes) -> dict[str, str]:
        ts = str(int(timestamp))
        mac = hmac.new(self._key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": ts,
            "webhook-signature": "v1," + base64.b64encode(mac).decode(),
        }


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _read_secret(inline: str | None, path: str | None, what: str) -> str | None:
    if inline:
        return inline
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror}") from exc
    return None


class _Pending:
    """One message on its way: where it goes, and the report that takes its outcome."""

    __slots__ = ("index", "msg", "report", "url")

    def __init__(self, msg: EncodedMessage, url: str, report: Report, index: int) -> None:
        self.msg = msg
        self.url = url
        self.report = report
        self.index = index

    def resolve(self, error: BaseException | None) -> None:
        self.report(self.index, error)


def _runs(batch: Sequence[EncodedMessage], url: Callable[[EncodedMessage], str],
          report: Report) -> list[list[_Pending]]:
    """The batch cut into runs: adjacent messages of one key (one object's, in order; see
    :class:`~sinks.transport.RunTransport`), each a list that no request splits."""
    runs: list[list[_Pending]] = []
    key: bytes | None = None
    for i, msg in enumerate(batch):
        pending = _Pending(msg, url(msg), report, i)
        if runs and msg.key == key:
            runs[-1].append(pending)
        else:
            runs.append([pending])
            key = msg.key
    return runs


class WebhookTransport:
    """Posts events to the webhook: one per request, up to ``connections`` at once, or in batch
    mode one object's runs and other objects' events together in one request per destination
    (a batcher task, fed by a queue, lingers for more and cuts batches to ``batch.max_events`` and
    ``batch.max_bytes``). Each answer's status is the outcome of every event of its request."""

    def __init__(self, *, name: str, options: WebhookOptions, clock: Clock,
                 config_error: Callable[[str], SinkConfigError]) -> None:
        self.name = name
        self.options = options
        self._clock = clock
        self._config_error = config_error
        self._session: aiohttp.ClientSession | None = None
        self._secret: bytes | None = None
        self._signer: StandardSigner | None = None
        self._static_headers: dict[str, str] = {}
        self._credentials: list[str] = []
        """The sink's own secrets, masked in a receiver's answer quoted in messages."""
        self._queue: asyncio.Queue[list[_Pending]] | None = None
        """Batch mode: runs of messages (one, or one object's in order) waiting for the batcher."""
        self._batcher: asyncio.Task[None] | None = None
        self._posts: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(options.connections)
        self._ready: collections.deque[list[_Pending]] = collections.deque()
        """One event per request: runs waiting for a poster task."""
        self._posters: set[asyncio.Task[None]] = set()
        self._posting = 0
        """Poster tasks that have not returned yet (the set keeps them until their callback)."""

    # ---- setup ----------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | bool:
        tls = self.options.tls
        if not (tls.ca_file or tls.cert_file or tls.insecure_skip_verify):
            return True
        try:
            ctx = ssl.create_default_context(cafile=tls.ca_file)
            if tls.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if tls.cert_file:
                ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise self._config_error(f"tls: {exc}") from exc
        return ctx

    def _prepare(self) -> None:
        opts = self.options
        try:
            secret = _read_secret(opts.hmac_secret, opts.hmac_secret_file, "hmac_secret_file")
            auth = opts.auth
            headers = dict(opts.headers)
            token = _read_secret(auth.bearer_token, auth.bearer_token_file, "auth.bearer_token_file")
            password = None
            if token:
                headers["Authorization"] = f"Bearer {token}"
            elif auth.username:
                password = _read_secret(auth.password, auth.password_file, "auth.password_file") or ""
                cred = base64.b64encode(f"{auth.username}:{password}".encode()).decode()
                headers["Authorization"] = f"Basic {cred}"
            scheme = opts.signature
            if secret and scheme != "hmac-sha256":
                try:
                    self._signer = StandardSigner(secret)
                except ValueError as exc:
                    raise ValueError(f"hmac_secret: {exc}") from exc
        except ValueError as exc:
            raise self._config_error(str(exc)) from exc
        self._secret = secret.encode() if secret and scheme != "standard-webhooks" else None
        self._static_headers = headers
        auth_header = headers.get("Authorization", "")
        self._credentials = sorted(
            {c for c in (secret, token, password, auth_header, auth_header.partition(" ")[2]) if c},
            key=len, reverse=True)

    async def start(self) -> None:
        if self._session is not None:
            return
        self._prepare()
        connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=self.options.connections)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.options.timeout)
        )
        if self.options.batch.max_events > 1:
            # Unbounded: it never holds more than the in-flight window.
            self._queue = asyncio.Queue()
            self._batcher = asyncio.get_running_loop().create_task(
                self._batch_loop(), name=f"sink:{self.name}:webhook-batcher"
            )
            self._batcher.add_done_callback(self._batcher_done)

    def _batcher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        log.error("webhook batcher stopped", exc_info=exc, extra={"sink": self.name})
        # Fail what is queued so lanes retry (one event per request) instead of waiting forever.
        queue = self._queue
        while queue is not None and not queue.empty():
            for pending in queue.get_nowait():
                pending.resolve(SinkTransientError(f"webhook batcher stopped: {exc!r}"))

    def _url(self, msg: EncodedMessage) -> str:
        base = self.options.url
        if not msg.destination:
            return base
        return base.rstrip("/") + "/" + msg.destination.lstrip("/")

    # ---- sending --------------------------------------------------------------------------------

    def _batching(self) -> bool:
        """True while the batcher runs (if it died, events are posted one by one instead)."""
        return self._session is not None and self._batcher is not None and not self._batcher.done()

    def run_limit(self) -> int:
        """In batch mode an object's waiting events go together in one batch (see the module
        docstring); one at a time otherwise."""
        return self.options.batch.max_events if self._batching() else 1

    def run_max_bytes(self) -> int:
        return self.options.batch.max_bytes  # a run is never split, so it must fit a batch

    def submit(self, batch: Sequence[EncodedMessage], report: Report) -> None:
        """In batch mode, each run straight into the batcher's queue (no task per event);
        otherwise to the poster tasks, one event per request."""
        runs = _runs(batch, self._url, report)
        queue = self._queue
        if queue is not None and self._batching():
            for run in runs:
                queue.put_nowait(run)
            return
        self._ready.extend(runs)
        wanted = min(len(self._ready), self.options.connections - self._posting)
        loop = asyncio.get_running_loop()
        for _ in range(wanted):
            self._posting += 1
            task = loop.create_task(self._poster(), name=f"sink:{self.name}:webhook-post")
            self._posters.add(task)
            task.add_done_callback(self._posters.discard)

    async def _poster(self) -> None:
        """Posts waiting events one per request until none is left; the events of a run (only left
        by a batcher that stopped) in order, the rest of it failing with the first failure."""
        try:
            ready = self._ready
            if self._session is None:  # used before start: the first event starts it
                await self.start()
                queue = self._queue
                if queue is not None and self._batching():
                    while ready:
                        queue.put_nowait(ready.popleft())
                    return
            while ready:
                run = ready.popleft()
                error: BaseException | None = None
                for pending in run:
                    if error is None:
                        msg = pending.msg
                        try:
                            async with self._slots:
                                await self._post(pending.url, msg.headers, msg.body, msg.event_id)
                        except asyncio.CancelledError:
                            raise  # the sink is closing: the event stays unacked
                        except Exception as exc:
                            error = exc
                    pending.resolve(error)
        finally:
            self._posting -= 1  # at once: a submit right after this must start a poster

    async def _post(self, url: str, headers: Mapping[str, str], body: bytes, msg_id: str) -> None:
        session = self._session
        assert session is not None
        all_headers: Mapping[str, str]
        if self._static_headers or self._secret is not None or self._signer is not None:
            signed = {**self._static_headers, **headers}
            if self._secret is not None:
                signed[SIGNATURE_HEADER] = sign(self._secret, body)
            if self._signer is not None:
                # Signed per attempt: a retry carries a fresh timestamp (receivers check it is recent).
                signed.update(self._signer.headers(msg_id, self._clock.wall(), body))
            all_headers = signed
        else:
            all_headers = headers  # the message's own (aiohttp copies them, never changes them)
        shown = display_url(url, keep_path=not self.options.url_path_secret)
        try:
            async with session.request(
                self.options.method, url, data=body, headers=all_headers, allow_redirects=False
            ) as resp:
                if 200 <= resp.status < 300:
                    drain_buffered(resp, _OK_DRAINED)
                    return
                raise self._answer_error(resp, shown, *await read_prefix(resp, _ANSWER_READ))
        except TimeoutError as exc:
            raise SinkTransientError(f"timed out after {self.options.timeout}s posting to "
                                     f"{shown}") from exc
        except aiohttp.ClientError as exc:
            raise SinkTransientError(f"posting to {shown} failed: {type(exc).__name__}: "
                                     f"{exc}") from exc

    def _answer_error(self, resp: aiohttp.ClientResponse, shown: str, head: bytes,
                      cut: bool) -> Exception:
        """The error a non-2xx answer stands for, quoting the start of its body."""
        text = head.decode(errors="replace")
        for secret in self._credentials:  # a receiver that echoes the request's headers
            text = text.replace(secret, "***")
        text = text[:_ANSWER_SHOWN]
        if cut:
            log.warning("the answer from %s is longer than %d bytes: read that much, connection closed",
                        shown, _ANSWER_READ, extra={"sink": self.name, "status": resp.status})
        reason = f"HTTP {resp.status} from {shown}: {text}".rstrip(": ")
        if resp.status == 413:  # Content Too Large: the oversize policy decides
            return SinkMessageTooLargeError(reason)
        if resp.status in _TRANSIENT_STATUS or resp.status >= 500:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            return SinkTransientError(reason, retry_after=retry_after)
        return SinkPermanentError(reason)

    async def _batch_loop(self) -> None:
        queue = self._queue
        assert queue is not None
        opts = self.options.batch
        loop = asyncio.get_running_loop()
        carried: list[_Pending] | None = None
        while True:
            # A run (one object's events in order) is never split: one that does not fit in this
            # batch starts the next one.
            batch = carried if carried is not None else await queue.get()
            carried = None
            size = sum(len(p.msg.body) for p in batch)
            deadline = loop.time() + opts.linger
            while len(batch) < opts.max_events and size < opts.max_bytes:
                try:
                    run = queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        run = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        break
                run_size = sum(len(p.msg.body) for p in run)
                if len(batch) + len(run) > opts.max_events or size + run_size > opts.max_bytes:
                    carried = run
                    break
                batch.extend(run)
                size += run_size
            groups: dict[str, list[_Pending]] = {}
            for pending in batch:
                groups.setdefault(pending.url, []).append(pending)
            for url, items in groups.items():
                await self._slots.acquire()
                task = loop.create_task(self._post_batch(url, items), name=f"sink:{self.name}:webhook-post")
                self._posts.add(task)
                task.add_done_callback(self._posts.discard)

    async def _post_batch(self, url: str, items: list[_Pending]) -> None:
        try:
            body = b"[" + b",".join(p.msg.body for p in items) + b"]"
            batch_format = self.options.batch.format
            ctype = BATCH_CONTENT_TYPE if batch_format == "cloudevents-batch" else "application/json"
            error: BaseException | None = None
            # One id per batch, the same on every retry: a digest of the events' ids.
            batch_id = hashlib.sha256("\0".join(p.msg.event_id for p in items).encode()).hexdigest()[:32]
            try:
                await self._post(url, {"content-type": ctype}, body, batch_id)
            except Exception as exc:
                error = exc
            for p in items:
                p.resolve(error)
        finally:
            self._slots.release()

    async def close(self) -> None:
        tasks = [t for t in (self._batcher, *self._posts, *self._posters) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._batcher = None
        self._ready.clear()
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class WebhookSink(TransportSink[WebhookOptions]):
    """The ``webhook`` sink: a :class:`WebhookTransport` under the transport sink."""

    kind = "webhook"
    options_model = WebhookOptions
    default_destination = ""
    header_prefix = HTTP_PREFIX

    def __init__(self, *, name: str, options: WebhookOptions, clock: Clock | None = None) -> None:
        super().__init__(name=name, options=options, clock=clock)

    def _make_transport(self) -> Transport:
        return WebhookTransport(name=self.name, options=self.options, clock=self._clock,
                                config_error=self._config_error)

    def _sanitize(self, value: str) -> str:
        return sanitize_url_segment(value)
