"""The NATS sinks: core NATS publish and JetStream publish, acked once the server has the message.

Why two sinks:

- :class:`NatsSink` publishes with core NATS and acks an event once a ``PING``/``PONG`` round trip
  that followed the publish succeeded, i.e. once the server has *received* it. Core NATS is
  at-most-once on the server side: a message nobody is subscribed to at that moment is gone, and a
  server that dies before forwarding it loses it. Use it for live feeds; use JetStream when the
  stream itself must not lose events.
- :class:`JetStreamSink` publishes to a stream and acks on the stream's ``PubAck``: the message is
  stored (replicated if the stream is). The ``Nats-Msg-Id`` header is the event's CloudEvent id, so a
  message re-sent after a timeout or a reconnect is dropped by JetStream's duplicate window instead of
  being stored twice.

Throughput and latency: each sink has one publisher task. Submitted messages queue for it (bounded
by the sink's in-flight window) and it publishes them back to back, then hands them to the socket at
once (not on nats-py's flusher task's next turn). Core publishes of a connected client are encoded
by the sink (the ``HPUB`` command nats-py's ``publish`` would buffer, with its checks and
statistics) and appended to nats-py's buffer in one loop, without a coroutine per message
(JetStream publishes too, once the connection's PubAck inbox exists). Core
publishes of one pass share one PING, written behind them, so its PONG proves the server read
them; PINGs are pipelined (one per pass, without waiting for the previous PONG), so a message waits
for one round trip, and the PONG settles its messages from nats-py's read loop directly. A PONG
that does not come within ``publish_timeout`` fails its messages as transient (retried). JetStream
publishes carry a reply subject on one inbox subscription per connection, so many wait for their
``PubAck`` at once (one that does not come within ``publish_timeout`` fails as transient and is
re-sent with the same ``Nats-Msg-Id``).

Those internals are private to nats-py, so the sinks accept only the nats-py releases they were
tested with (:data:`NATS_PY_TESTED`, the range ``pyproject.toml`` asks for), and
``tests/sinks/test_nats_client_internals.py`` checks each internal used against a real server;
through the public API alone the core sink costs about 1.3 times the CPU per event (docs/performance.md).

Subjects come from the destination template; each field value is sanitised into one subject token
(dots, spaces and the ``*`` / ``>`` wildcards become ``_``), so a name with dots cannot add tokens or
turn into a wildcard. The default subject ``k8s.{resource}.{namespace}.{name}`` is one subject per
object, which keeps each object's events in order for consumers too.

Connection handling: nats-py reconnects by itself (forever by default). While it is disconnected
nothing is acked: a publish waits for the connection to come back (bounded by ``publish_timeout``)
and otherwise fails as transient, so :class:`~sinks.base.BaseSink` retries it — nothing is lost, and
JetStream deduplicates the retries. A server that is down when the sink starts does not fail start:
a named background task keeps trying to connect and the sink reports itself unhealthy meanwhile.

Authentication: user/password, token, NKEY seed file, credentials file (NKEY and creds need the
``nkeys`` package: ``pip install nats-py[nkeys]``); TLS with a custom CA and client certificate.
Secrets are read from files. Dead letters go to a file or to a NATS subject (``dead_letter:
{kind: nats, target: SUBJECT}``): published through JetStream when a stream captures the subject,
otherwise with core NATS.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import importlib.util
import logging
import re
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.transport import Transport
from nats.js.api import StorageType, StreamConfig
from nats.js.client import JetStreamContext
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sinks.addresses import check_nats_url
from sinks.base import BaseSink, OutgoingMessage
from sinks.cloudevents import HTTP_PREFIX
from sinks.contract import SinkConfigError, SinkMessageTooLargeError, SinkPermanentError, SinkTransientError
from sinks.deadletter import DeadLetterRecord, DeadLetterWriter, dead_letter_json
from sinks.options import DeadLetterOptions, SinkOptions
from sinks.templates import sanitize_nats_token
from sinks.transport_security import InsecureSetting, all_loopback

__all__ = [
    "DEFAULT_SUBJECT",
    "JetStreamSink",
    "JetStreamSinkOptions",
    "NatsConnection",
    "NatsDeadLetter",
    "NatsSink",
    "NatsSinkOptions",
    "StreamOptions",
    "stream_subjects_for",
]

log = logging.getLogger(__name__)

DEFAULT_SUBJECT = "k8s.{resource}.{namespace}.{name}"
MSG_ID_HEADER = "Nats-Msg-Id"
_DLQ_MARGIN = 2048
_TEMPLATE_FIELD = re.compile(r"\{[^{}]*\}")
_BAD_TOKEN = re.compile(r"[\s*>]")

_TRANSIENT_NATS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    OSError,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Model):
    """The JetStream stream to create when it does not exist (``create: true``)."""

    name: str = Field(min_length=1, pattern=r"^[^.*>\s]+$")
    create: bool = False
    subjects: list[str] = Field(default_factory=list)
    """Empty = derived from the destination template (each templated token becomes ``*``)."""
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    duplicate_window: float = Field(default=120.0, gt=0)
    """Seconds during which a re-sent ``Nats-Msg-Id`` is recognised as a duplicate."""
    max_age: float = Field(default=0.0, ge=0)
    """Seconds; 0 = unlimited."""
    max_bytes: int = Field(default=-1, ge=-1)
    max_msg_size: int = Field(default=-1, ge=-1)


class _ConnectionOptions(SinkOptions):
    """Connection settings shared by both NATS sinks."""

    servers: list[str] = Field(min_length=1)
    """``nats://host:port`` (``tls://`` for TLS)."""

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        for i, url in enumerate(value):
            try:
                check_nats_url(url)
            except ValueError as exc:
                raise ValueError(f"servers[{i}]: {exc}") from None
        return value
    connection_name: str = "kube-event-bridge"
    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    connect_timeout: float = Field(default=5.0, gt=0)
    reconnect_wait: float = Field(default=1.0, gt=0)
    max_reconnect_attempts: int = Field(default=-1, ge=-1)
    """-1 = forever."""
    reconnect_buffer_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    """Bytes nats-py buffers while reconnecting; past it a publish fails (and is retried)."""
    publish_timeout: float = Field(default=5.0, gt=0)
    """Seconds to wait for the server's confirmation (PONG or PubAck) before retrying."""

    def insecure_settings(self) -> list[InsecureSetting]:
        plaintext = [u for u in self.servers
                     if urllib.parse.urlsplit(u if "://" in u else f"nats://{u}").scheme in ("nats", "ws")]
        userinfo = any(urllib.parse.urlsplit(u).username for u in self.servers if "://" in u)
        credentials = [name for name, on in (
            ("user/password_file", self.user is not None), ("token_file", self.token_file is not None),
            ("creds_file", self.creds_file is not None), ("servers", userinfo)) if on]
        tls = self.tls_ca_file is not None or self.tls_cert_file is not None
        if credentials and plaintext and not tls and not all_loopback(plaintext, "nats"):
            return [("servers", f"credentials ({', '.join(credentials)}) sent in plaintext (nats://, "
                                "ws://) to a host other than loopback: use tls:// or tls_ca_file")]
        return []

    @model_validator(mode="after")
    def _auth(self) -> Self:
        methods = [
            m for m, on in (
                ("user/password_file", self.user is not None or self.password_file is not None),
                ("token_file", self.token_file is not None),
                ("nkey_seed_file", self.nkey_seed_file is not None),
                ("creds_file", self.creds_file is not None),
            ) if on
        ]
        if len(methods) > 1:
            raise ValueError(f"choose one authentication method, not {' and '.join(methods)}")
        if (self.user is None) != (self.password_file is None):
            raise ValueError("user and password_file go together")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.destination is not None:
            # Field values are sanitised into tokens; the literal text must be a subject already.
            shape = _TEMPLATE_FIELD.sub("x", self.destination)
            if any(not t or _BAD_TOKEN.search(t) for t in shape.split(".")):
                raise ValueError(f"destination: {self.destination!r} is not a NATS subject (dot-separated "
                                 "non-empty tokens without spaces, '*' or '>')")
        return self


class NatsSinkOptions(_ConnectionOptions):
    """Options of the ``nats`` sink (core publish)."""


class JetStreamSinkOptions(_ConnectionOptions):
    """Options of the ``jetstream`` sink."""

    stream: StreamOptions | None = None
    """The stream to publish to; when set, publishes are checked against it (``Nats-Expected-Stream``)
    and it can be created at start."""


def _read(path: str, what: str, who: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise SinkConfigError(f"{who}: {what}: cannot read {path!r}: {exc.strerror}") from exc


def stream_subjects_for(template: str) -> list[str]:
    """Subjects capturing everything a destination template can render: each token holding a
    template field becomes ``*`` (``k8s.{resource}.{namespace}.{name}`` → ``k8s.*.*.*``)."""
    return [".".join("*" if "{" in token else token for token in template.split("."))]


class NatsConnection:
    """One nats-py connection with readiness tracking and a background (re)connect at start."""

    def __init__(self, *, options: _ConnectionOptions, name: str) -> None:
        self._options = options
        self.name = name
        self._who = f"sink {name!r}"
        self.client: NatsClient | None = None
        self.connected = asyncio.Event()
        self._connector: asyncio.Task[None] | None = None
        self._last_error: Exception | None = None
        self._closed = False

    @property
    def is_connected(self) -> bool:
        return self.client is not None and self.client.is_connected

    def _connect_kwargs(self) -> dict[str, Any]:
        o = self._options
        kwargs: dict[str, Any] = {
            "servers": list(o.servers),
            "name": o.connection_name,
            "connect_timeout": o.connect_timeout,
            "reconnect_time_wait": o.reconnect_wait,
            "max_reconnect_attempts": o.max_reconnect_attempts,
            "pending_size": o.reconnect_buffer_bytes,
            "allow_reconnect": True,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "error_cb": self._on_error,
            "closed_cb": self._on_closed,
        }
        if o.user is not None and o.password_file is not None:
            kwargs["user"] = o.user
            kwargs["password"] = _read(o.password_file, "password_file", self._who)
        if o.token_file is not None:
            kwargs["token"] = _read(o.token_file, "token_file", self._who)
        if o.nkey_seed_file is not None or o.creds_file is not None:
            if importlib.util.find_spec("nkeys") is None:
                raise SinkConfigError(
                    f"{self._who}: NKEY and credentials-file authentication need the 'nkeys' package "
                    "(pip install 'nats-py[nkeys]')"
                )
            if o.nkey_seed_file is not None:
                _read(o.nkey_seed_file, "nkey_seed_file", self._who)
                kwargs["nkeys_seed"] = o.nkey_seed_file
            if o.creds_file is not None:
                _read(o.creds_file, "creds_file", self._who)
                kwargs["user_credentials"] = o.creds_file
        if o.tls_ca_file is not None or o.tls_cert_file is not None:
            try:
                ctx = ssl.create_default_context(cafile=o.tls_ca_file)
                if o.tls_cert_file is not None and o.tls_key_file is not None:
                    ctx.load_cert_chain(o.tls_cert_file, o.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise SinkConfigError(f"{self._who}: TLS files: {exc}") from exc
            kwargs["tls"] = ctx
            if o.tls_hostname is not None:
                kwargs["tls_hostname"] = o.tls_hostname
        return kwargs

    async def start(self) -> None:
        """Connects; a server that is down leaves a background task retrying. Bad credentials or
        settings raise SinkConfigError."""
        kwargs = self._connect_kwargs()
        try:
            await self._connect_once(kwargs)
        except (nats.errors.NoServersError, nats.errors.TimeoutError, OSError) as exc:
            log.warning("NATS not reachable at start (%r); connecting in the background", exc,
                        extra={"sink": self.name})
            self._connector = asyncio.get_running_loop().create_task(
                self._connect_forever(kwargs), name=f"nats-connect:{self.name}"
            )

    async def _connect_once(self, kwargs: dict[str, Any]) -> None:
        # nats-py retries a failing *first* connect forever when reconnects are unlimited, even for
        # rejected credentials: connect with reconnects off and one attempt per server, then switch
        # the configured reconnect policy on.
        self._last_error = None
        try:
            client = await nats.connect(**{**kwargs, "allow_reconnect": False, "max_reconnect_attempts": 1})
        except (nats.errors.Error, OSError) as exc:
            cause = self._last_error or exc
            text = str(cause).lower()
            if isinstance(cause, nats.errors.AuthorizationError) or "authorization" in text:
                raise SinkConfigError(f"{self._who}: NATS rejected the credentials: {cause}") from exc
            raise
        client.options["allow_reconnect"] = True
        client.options["max_reconnect_attempts"] = self._options.max_reconnect_attempts
        self.client = client
        self.connected.set()

    async def _connect_forever(self, kwargs: dict[str, Any]) -> None:
        delay = self._options.reconnect_wait
        while not self._closed:
            await asyncio.sleep(delay)
            try:
                await self._connect_once(kwargs)
            except SinkConfigError:
                log.error("NATS rejected the credentials; not retrying", extra={"sink": self.name})
                return
            except (nats.errors.Error, OSError) as exc:
                log.info("NATS still not reachable: %r", exc, extra={"sink": self.name})
                delay = min(delay * 2, 30.0)
            else:
                log.info("connected to NATS", extra={"sink": self.name})
                return

    async def _on_disconnected(self) -> None:
        self.connected.clear()
        if self._closed:
            return
        log.warning("disconnected from NATS; unacked events wait for the reconnect",
                    extra={"sink": self.name})

    async def _on_reconnected(self) -> None:
        self.connected.set()
        log.info("reconnected to NATS", extra={"sink": self.name})

    async def _on_closed(self) -> None:
        self.connected.clear()

    async def _on_error(self, exc: Exception) -> None:
        self._last_error = exc
        log.debug("NATS connection error: %r", exc, extra={"sink": self.name})

    async def ready(self, timeout: float) -> NatsClient:
        """The connected client, waiting up to ``timeout`` for a (re)connection."""
        if self._closed:
            raise SinkTransientError(f"{self._who}: closed")
        if not self.is_connected:
            try:
                await asyncio.wait_for(self.connected.wait(), timeout)
            except TimeoutError as exc:
                raise SinkTransientError(f"{self._who}: not connected to NATS") from exc
        client = self.client
        if client is None or not client.is_connected:
            raise SinkTransientError(f"{self._who}: not connected to NATS")
        return client

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._connector is not None:
            self._connector.cancel()
            await asyncio.gather(self._connector, return_exceptions=True)
        client, self.client = self.client, None
        if client is not None and not client.is_closed:
            try:
                await client.close()
            except asyncio.CancelledError:
                # nats-py can surface the cancellation of its own socket close-waiter here; only a
                # cancellation of the caller itself must propagate.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
            except Exception as exc:
                log.debug("error closing the NATS connection: %r", exc, extra={"sink": self.name})


def _permanent_or_transient(exc: Exception, subject: str, max_payload: int | None = None) -> Exception:
    if isinstance(exc, nats.errors.MaxPayloadError):
        return SinkMessageTooLargeError(
            f"nats: message too large for the server's max_payload ({subject}): {exc}", limit=max_payload)
    if isinstance(exc, nats.errors.BadSubjectError):
        return SinkPermanentError(f"nats: invalid subject {subject!r}")
    if isinstance(exc, nats.js.errors.BadRequestError):
        return SinkPermanentError(f"jetstream rejected the message on {subject!r}: {exc.description} "
                                  f"(err_code {exc.err_code})")
    if isinstance(exc, nats.js.errors.APIError) and exc.code not in (None, 503) and exc.code < 500:
        return SinkPermanentError(f"jetstream rejected the message on {subject!r}: {exc.description} "
                                  f"(code {exc.code})")
    return SinkTransientError(f"nats: publish to {subject!r} not confirmed: {exc!r}")


NATS_PY_TESTED = ((2, 16), (2, 17))
"""The nats-py releases the sinks are tested with: ``[lower, upper)`` by (major, minor). The sinks
use private parts of nats-py's client (below) for their speed, so ``pyproject.toml`` accepts exactly
this range and ``tests/sinks/test_nats_client_internals.py`` fails on any other release; widening
it is done by running that file and the NATS sink tests against the new release (docs/sinks.md)."""
CLIENT_INTERNALS = ("_pongs", "_pending", "_pending_data_size", "_transport")
"""What pipelined confirmation uses of nats-py's client: its PONG futures (resolved in order by its
read loop), its buffer of commands not yet written, and the socket's transport."""
PUBLISH_INTERNALS = ("_max_pending_size", "_max_payload", "stats")
"""What :meth:`NatsSink._publish_direct` uses besides (else every publish goes through nats-py's)."""
_PING = b"PING\r\n"
_HAS_CLIENT_INTERNALS = all(hasattr(NatsClient(), a) for a in CLIENT_INTERNALS)
_HAS_PUBLISH_INTERNALS = _HAS_CLIENT_INTERNALS and all(hasattr(NatsClient(), a) for a in PUBLISH_INTERNALS)


def nats_py_version() -> tuple[int, int]:
    """The installed nats-py's (major, minor)."""
    match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("nats-py"))
    return (int(match[1]), int(match[2])) if match is not None else (0, 0)


def nats_py_tested() -> bool:
    """Whether the installed nats-py is one the sinks are tested with (:data:`NATS_PY_TESTED`)."""
    lower, upper = NATS_PY_TESTED
    return lower <= nats_py_version() < upper
_SUBJECT_INVALID = re.compile(r"[ \t\r\n]")
"""What nats-py refuses in a published subject (empty too)."""
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


def _header_block(headers: dict[str, str]) -> bytes:
    """The ``NATS/1.0`` header block of a message, as nats-py's publish encodes it (keys and values
    stripped, empty keys skipped, CR / LF in values turned into spaces); ValueError for a key
    outside the HTTP token alphabet (nats-py's BadHeaderError)."""
    lines = [b"NATS/1.0\r\n"]
    for k, v in headers.items():
        key = k.strip()
        if not key:
            continue
        if not _HEADER_KEY.fullmatch(key):
            raise ValueError(f"invalid header name {key!r}")
        lines.append(f"{key}: {v.strip().translate(_HEADER_NEWLINES)}\r\n".encode())
    lines.append(b"\r\n")
    return b"".join(lines)


def _hpub(subject: str, reply: str, block: bytes, body: bytes) -> bytes:
    """The ``HPUB`` command of one message, byte for byte what nats-py's ``publish`` buffers (an
    empty reply leaves two spaces, as nats-py writes it)."""
    line = f"HPUB {subject} {reply} {len(block)} {len(block) + len(body)}\r\n"
    return b"".join((line.encode(), block, body, b"\r\n"))


def _write_pending(client: NatsClient) -> Transport:
    """Hands the commands nats-py has buffered to the socket now, in order, rather than on its
    flusher task's next turn; returns the transport. (nats-py's flusher also waits for the socket
    to drain; the sink's in-flight window bounds what can be buffered here instead.)"""
    transport = client._transport
    if transport is None:
        raise RuntimeError("no transport")
    if client._pending:
        transport.writelines(client._pending)
        client._pending = []
        client._pending_data_size = 0
    return transport


class _PongRound(asyncio.Future[bool]):
    """The PONG future of one PING, queued in nats-py's ``Client._pongs``.

    nats-py's read loop resolves the oldest PONG future with ``set_result`` when a PONG arrives;
    this one settles its round's messages right there instead of a loop turn later through a
    done-callback (under load a loop turn is several milliseconds)."""

    def __init__(self, sink: _NatsSinkBase, waiters: list[asyncio.Future[None] | OutgoingMessage],
                 deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.sink = sink
        self.waiters = waiters
        self.deadline = deadline
        self.answered = False

    def set_result(self, result: bool, /) -> None:
        super().set_result(result)
        try:
            self.sink._round_answered(self)
        except Exception:  # never break nats-py's read loop
            log.exception("settling a confirmed round failed", extra={"sink": self.sink.name})


class _NatsSinkBase(BaseSink[Any]):
    default_destination: ClassVar[str] = DEFAULT_SUBJECT
    header_prefix: ClassVar[str] = HTTP_PREFIX

    def __init__(self, *, options: _ConnectionOptions, **kwargs: Any) -> None:
        self._conn = NatsConnection(options=options, name=kwargs.get("name", ""))
        self._unconfirmed: list[asyncio.Future[None] | OutgoingMessage] = []
        """Published by the current publisher pass, waiting for the PING that ends the pass."""
        self._rounds: collections.deque[_PongRound] = collections.deque()
        """PINGs written and not yet answered or expired, oldest first."""
        self._round_expirer: asyncio.Task[None] | None = None
        self._outbox: collections.deque[OutgoingMessage] = collections.deque()
        """Submitted messages the publisher task has not published yet (bounded by the window)."""
        self._outbox_ready = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        super().__init__(options=options, **kwargs)

    def _make_dead_letter(self, options: DeadLetterOptions) -> DeadLetterWriter | None:
        if options.kind == "nats":
            if any(c in options.target for c in "*> \t") or not options.target:
                raise self._config_error(f"dead_letter: {options.target!r} is not a valid NATS subject")
            return NatsDeadLetter(sink=self, subject=options.target)
        return super()._make_dead_letter(options)

    def _sanitize(self, value: str) -> str:
        return sanitize_nats_token(value)

    async def _start(self) -> None:
        if not nats_py_tested():
            (lower, upper), found = NATS_PY_TESTED, nats_py_version()
            log.warning("nats-py %d.%d is outside the releases this sink is tested with (>=%d.%d,<%d.%d): "
                        "it relies on the client's private internals (docs/sinks.md)",
                        *found, *lower, *upper, extra={"sink": self.name})
        await self._conn.start()

    async def _close(self) -> None:
        tasks = [t for t in (self._publisher, self._round_expirer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._outbox.clear()
        self._unconfirmed.clear()
        self._rounds.clear()
        await self._conn.close()

    # ---- pipelined publishing ---------------------------------------------------------------------

    def _submit(self, msg: OutgoingMessage) -> None:
        """Queues the message for the publisher task: no task per message, and a whole batch of
        publishes shares one confirmation round trip."""
        self._outbox.append(msg)
        self._outbox_ready.set()
        publisher = self._publisher
        if publisher is None or publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(
                self._publish_loop(), name=f"nats-publish:{self.name}"
            )
            self._publisher.add_done_callback(self._publisher_done)

    def _publisher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        log.error("NATS publisher stopped", exc_info=exc, extra={"sink": self.name})
        # What it held is retried (the next submit starts a new publisher).
        outbox, self._outbox = self._outbox, collections.deque()
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        self._fail_round([*unconfirmed, *outbox], SinkTransientError(f"nats publisher stopped: {exc!r}"))

    async def _publish_loop(self) -> None:
        outbox = self._outbox
        ready = self._outbox_ready
        timeout = self.options.publish_timeout
        while True:
            if not outbox:
                ready.clear()
                await ready.wait()
                continue
            try:
                client = await self._conn.ready(timeout)
            except SinkTransientError as exc:
                while outbox:  # retried with backoff by the base sink
                    self._settle(outbox.popleft(), exc)
                continue
            if self._publish_direct(client, outbox):
                self._end_of_pass(client)
                continue
            while outbox:
                msg = outbox.popleft()
                try:
                    await self._publish_one(client, msg)
                except Exception as exc:  # never strand a message: it is settled either way
                    self._settle(msg, exc)
            self._end_of_pass(client)

    async def _publish_one(self, client: NatsClient, msg: OutgoingMessage) -> None:
        """Publishes one message of the outbox and arranges for its confirmation."""
        raise NotImplementedError

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[OutgoingMessage]) -> bool:
        """Publishes the whole outbox without a coroutine per message when the sink can (True), or
        leaves it to :meth:`_publish_one` (False)."""
        return False

    @staticmethod
    def _can_buffer(client: NatsClient) -> bool:
        """Whether :meth:`_buffer_publish` may write into this client's buffer now."""
        return _HAS_PUBLISH_INTERNALS and client.is_connected and not client.is_draining_pubs

    def _buffer_publish(self, client: NatsClient, msg: OutgoingMessage, headers: dict[str, str],
                        reply: str, blocks: dict[str, bytes]) -> bool:
        """Appends the ``HPUB`` command of ``msg`` to nats-py's pending buffer, as its ``publish``
        would (same checks: a subject that is empty or has whitespace, a body above the server's
        ``max_payload`` and a bad header name are permanent failures, settled here (False); same
        statistics; the buffer handed to the socket when it outgrows the client's
        ``pending_size``). ``blocks`` keeps the header block of messages whose only header is
        their content type (structured mode) for the caller's loop."""
        subject = msg.destination
        body = msg.body
        if not subject or _SUBJECT_INVALID.search(subject) or (reply and _SUBJECT_INVALID.search(reply)):
            self._settle(msg, _permanent_or_transient(nats.errors.BadSubjectError(), subject))
            return False
        if len(body) > client._max_payload:
            self._settle(msg, _permanent_or_transient(nats.errors.MaxPayloadError(), subject,
                                                      client._max_payload))
            return False
        try:
            if len(headers) == 1 and "content-type" in headers:
                ctype = headers["content-type"]
                block = blocks.get(ctype)
                if block is None:
                    block = blocks[ctype] = _header_block(headers)
            else:
                block = _header_block(headers)
        except ValueError as exc:
            self._settle(msg, SinkPermanentError(f"nats: {exc} for {subject!r}"))
            return False
        cmd = _hpub(subject, reply, block, body)
        client._pending.append(cmd)
        client._pending_data_size += len(cmd)
        stats = client.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(body)
        if 0 < client._max_pending_size < client._pending_data_size:
            try:
                _write_pending(client)
            except (OSError, RuntimeError) as exc:  # the confirmation fails the messages: retried
                log.debug("writing publishes failed: %r", exc, extra={"sink": self.name})
        return True

    def _end_of_pass(self, client: NatsClient) -> None:
        """Called once the publisher emptied the outbox: core publishes of the pass share one PING."""
        if self._unconfirmed:
            waiters, self._unconfirmed = self._unconfirmed, []
            self._ping_round(client, waiters)

    def healthy(self) -> bool:
        return super().healthy() and self._conn.is_connected

    def _size_limit(self) -> int | None:
        """The server's ``max_payload`` (headers and body), once connected."""
        client = self._conn.client
        return None if client is None else int(client.max_payload)

    async def _publish_core(self, subject: str, body: bytes, headers: dict[str, str] | None) -> None:
        """Publishes and waits for a PING/PONG round trip proving the server received it."""
        timeout = self.options.publish_timeout
        client = await self._conn.ready(timeout)
        try:
            await client.publish(subject, body, headers=headers)
        except (nats.errors.Error, OSError) as exc:
            raise _permanent_or_transient(exc, subject) from exc
        await self._confirmed(client, subject)

    async def _confirmed(self, client: NatsClient, subject: str) -> None:
        """Waits for a PING/PONG round trip sent after this publish."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ping_round(client, [waiter])
        try:
            await waiter
        except SinkTransientError as exc:
            raise SinkTransientError(f"nats: publish to {subject!r} not confirmed: {exc}") from exc

    def _ping_round(self, client: NatsClient, waiters: list[asyncio.Future[None] | OutgoingMessage]) -> None:
        """Writes what nats-py has buffered, then a PING, and settles ``waiters`` when its PONG comes.

        Rounds are pipelined: a PING is written at the end of every publisher pass without waiting
        for the previous PONG (the server answers PINGs in order, nats-py pops the oldest PONG
        future), so a message waits for one round trip, not for the round in flight and then its
        own. The buffered PUBs are written first, synchronously, so the PING follows them on the
        wire and its PONG proves the server read them (``Client.flush`` writes its PING at once,
        ahead of publishes still in nats-py's buffer)."""
        if not client.is_connected:
            # nats-py keeps publishes made while reconnecting in its buffer, unconfirmed.
            self._fail_round(waiters, SinkTransientError("not connected to NATS"))
            return
        loop = asyncio.get_running_loop()
        if not _HAS_CLIENT_INTERNALS:
            self._spawn(self._flush_then_settle(client, waiters), "nats-flush")
            return
        pong = _PongRound(self, waiters, time.monotonic() + self.options.publish_timeout, loop)
        try:
            transport = _write_pending(client)
            transport.write(_PING)
        except (OSError, RuntimeError) as exc:
            self._fail_round(waiters, SinkTransientError(f"cannot write to NATS: {exc!r}"))
            return
        # Queued only once its PING is written (nothing runs in between): nats-py's PONG futures
        # must stay in the order of the PINGs on the wire.
        client._pongs.append(pong)
        self._rounds.append(pong)
        if self._round_expirer is None or self._round_expirer.done():
            self._round_expirer = loop.create_task(self._expire_rounds(), name=f"nats-pong:{self.name}")

    async def _flush_then_settle(
        self, client: NatsClient, waiters: list[asyncio.Future[None] | OutgoingMessage]
    ) -> None:
        """The confirmation through nats-py's public ``flush`` (a nats-py without the internals
        ``_ping_round`` relies on, hence outside :data:`NATS_PY_TESTED`): one round trip per pass.
        Weaker than ``_ping_round``'s: nats-py 2.16's ``flush`` writes its PING straight to the
        socket, possibly ahead of publishes still in nats-py's buffer, so its PONG does not prove
        the server read them."""
        error: Exception | None = None
        try:
            await client.flush(timeout=self.options.publish_timeout)
        except (nats.errors.Error, OSError) as exc:
            error = SinkTransientError(repr(exc))
        if error is None and not client.is_connected:  # flush returns at once while reconnecting
            error = SinkTransientError("connection lost")
        if error is not None:
            self._fail_round(waiters, error)
            return
        for waiter in waiters:
            if isinstance(waiter, OutgoingMessage):
                self._settle(waiter, None)
            elif not waiter.done():
                waiter.set_result(None)

    def _round_answered(self, pong: _PongRound) -> None:
        """The PONG of ``pong`` came (called from nats-py's read loop): its messages are confirmed."""
        if pong.answered:
            return  # expired before its PONG came (and retried)
        pong.answered = True
        rounds = self._rounds
        while rounds and rounds[0].answered:
            rounds.popleft()
        confirmed: list[tuple[OutgoingMessage, None]] = []
        for waiter in pong.waiters:
            if isinstance(waiter, OutgoingMessage):
                confirmed.append((waiter, None))
            elif not waiter.done():
                waiter.set_result(None)
        if confirmed:
            self._settle_all(confirmed)

    def _fail_round(self, waiters: list[asyncio.Future[None] | OutgoingMessage], error: Exception) -> None:
        for waiter in waiters:
            if isinstance(waiter, OutgoingMessage):
                self._settle(waiter, error)
            elif not waiter.done():
                waiter.set_exception(error)

    async def _expire_rounds(self) -> None:
        """Fails rounds whose PONG did not come within ``publish_timeout`` (a connection lost after
        the PING: nats-py forgets its PONG futures on reconnect); their messages are retried."""
        rounds = self._rounds
        timeout = self.options.publish_timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            while rounds:
                pong = rounds[0]
                if not pong.answered:
                    if pong.deadline > now:
                        break
                    pong.answered = True
                    try:
                        self._fail_round(pong.waiters, SinkTransientError(f"no PONG within {timeout}s"))
                    except Exception:  # keep expiring the others
                        log.exception("failing an unconfirmed round failed", extra={"sink": self.name})
                rounds.popleft()

    async def _publish_js(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        timeout = self.options.publish_timeout
        client = await self._conn.ready(timeout)
        js = self._js(client)
        try:
            ack = await js.publish(subject, body, timeout=timeout, headers=headers)
        except (nats.errors.Error, OSError) as exc:
            raise _permanent_or_transient(exc, subject) from exc
        if ack.duplicate:
            log.debug("%s already stored (seq %s)", headers.get(MSG_ID_HEADER), ack.seq,
                      extra={"sink": self.name})

    def _js(self, client: NatsClient) -> JetStreamContext:
        return client.jetstream(timeout=self.options.publish_timeout)


class NatsSink(_NatsSinkBase):
    """Core NATS publish; acked when the server confirmed receipt (see the module docstring)."""

    kind: ClassVar[str] = "nats"
    options_model: ClassVar[type[SinkOptions]] = NatsSinkOptions

    async def _send(self, msg: OutgoingMessage) -> None:
        await self._publish_core(msg.destination, msg.body, msg.headers)

    async def _publish_one(self, client: NatsClient, msg: OutgoingMessage) -> None:
        try:
            await client.publish(msg.destination, msg.body, headers=msg.headers)
        except (nats.errors.Error, OSError) as exc:
            self._settle(msg, _permanent_or_transient(exc, msg.destination))
            return
        self._unconfirmed.append(msg)

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[OutgoingMessage]) -> bool:
        """The outbox's ``HPUB`` commands appended to nats-py's buffer in one loop (see
        :meth:`_NatsSinkBase._buffer_publish`); only on a connected client: while reconnecting,
        nats-py's own publish decides what it buffers."""
        if not self._can_buffer(client):
            return False
        buffer = self._buffer_publish
        unconfirmed = self._unconfirmed
        blocks: dict[str, bytes] = {}
        while outbox:
            msg = outbox.popleft()
            if buffer(client, msg, msg.headers, "", blocks):
                unconfirmed.append(msg)
        return True


class JetStreamSink(_NatsSinkBase):
    """JetStream publish; acked on the stream's PubAck, deduplicated by ``Nats-Msg-Id``."""

    kind: ClassVar[str] = "jetstream"
    options_model: ClassVar[type[SinkOptions]] = JetStreamSinkOptions

    def __init__(self, *, options: _ConnectionOptions, **kwargs: Any) -> None:
        self._awaiting: dict[str, tuple[OutgoingMessage, float]] = {}
        """Reply subject → the message published with it and its PubAck deadline (in publish
        order, hence deadline order)."""
        self._ack_seq = 0
        self._inbox = ""
        self._inbox_client: NatsClient | None = None
        self._expirer: asyncio.Task[None] | None = None
        super().__init__(options=options, **kwargs)

    async def _start(self) -> None:
        await super()._start()
        stream: StreamOptions | None = self.options.stream
        if stream is not None and stream.create:
            client = await self._conn.ready(self.options.connect_timeout)
            await self._ensure_stream(client, stream)

    def stream_config(self) -> StreamConfig | None:
        stream: StreamOptions | None = self.options.stream
        if stream is None:
            return None
        text = self.options.destination if self.options.destination is not None else DEFAULT_SUBJECT
        return StreamConfig(
            name=stream.name,
            subjects=list(stream.subjects) or stream_subjects_for(text),
            storage=StorageType.FILE if stream.storage == "file" else StorageType.MEMORY,
            num_replicas=stream.replicas,
            duplicate_window=stream.duplicate_window,
            max_age=stream.max_age or None,
            max_bytes=stream.max_bytes,
            max_msg_size=stream.max_msg_size,
        )

    async def _ensure_stream(self, client: NatsClient, stream: StreamOptions) -> None:
        config = self.stream_config()
        assert config is not None
        js = self._js(client)
        try:
            info = await js.stream_info(stream.name)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(config)
            except nats.js.errors.APIError as exc:
                msg = f"stream {stream.name!r}: cannot create it: {exc.description}"
                raise self._config_error(msg) from exc
            log.info("created stream %r for %s", stream.name, config.subjects, extra={"sink": self.name})
            return
        existing = set(info.config.subjects or [])
        if not set(config.subjects or []) <= existing:
            log.warning("stream %r exists with subjects %s (wanted %s); left unchanged",
                        stream.name, sorted(existing), config.subjects, extra={"sink": self.name})

    def _js_headers(self, msg: OutgoingMessage) -> dict[str, str]:
        headers = dict(msg.headers)
        headers[MSG_ID_HEADER] = msg.event_id
        stream: StreamOptions | None = self.options.stream
        if stream is not None:
            headers["Nats-Expected-Stream"] = stream.name
        return headers

    async def _send(self, msg: OutgoingMessage) -> None:
        await self._publish_js(msg.destination, msg.body, self._js_headers(msg))

    # ---- pipelined publishing: many publishes in flight, PubAcks on one inbox subscription --------

    async def _publish_one(self, client: NatsClient, msg: OutgoingMessage) -> None:
        if self._inbox_client is client:
            prefix = self._inbox
        else:
            try:
                prefix = await self._ack_inbox(client)
            except (nats.errors.Error, OSError) as exc:
                self._settle(msg, SinkTransientError(f"jetstream: cannot subscribe to PubAcks: {exc!r}"))
                return
        self._ack_seq += 1
        reply = f"{prefix}.{self._ack_seq}"
        self._awaiting[reply] = (msg, time.monotonic() + self.options.publish_timeout)
        try:
            await client.publish(msg.destination, msg.body, reply=reply, headers=self._js_headers(msg))
        except (nats.errors.Error, OSError) as exc:
            if self._awaiting.pop(reply, None) is not None:
                self._settle(msg, _permanent_or_transient(exc, msg.destination))

    def _publish_direct(self, client: NatsClient, outbox: collections.deque[OutgoingMessage]) -> bool:
        """The outbox's publishes (each with its PubAck reply subject) appended to nats-py's buffer
        in one loop, once this connection's PubAck inbox exists (see
        :meth:`_NatsSinkBase._buffer_publish`)."""
        if self._inbox_client is not client or not self._can_buffer(client):
            return False
        buffer = self._buffer_publish
        awaiting = self._awaiting
        prefix = self._inbox
        deadline = time.monotonic() + self.options.publish_timeout
        blocks: dict[str, bytes] = {}
        while outbox:
            msg = outbox.popleft()
            self._ack_seq += 1
            reply = f"{prefix}.{self._ack_seq}"
            awaiting[reply] = (msg, deadline)
            if not buffer(client, msg, self._js_headers(msg), reply, blocks):
                awaiting.pop(reply, None)
        return True

    def _end_of_pass(self, client: NatsClient) -> None:
        """The pass's publishes go to the socket now rather than on nats-py's flusher task's next
        turn: their PubAcks come a loop turn sooner."""
        if client.is_connected:
            try:
                _write_pending(client)
            except (OSError, RuntimeError) as exc:  # nats-py's flusher sees (and reports) it too
                log.debug("writing publishes failed: %r", exc, extra={"sink": self.name})

    async def _ack_inbox(self, client: NatsClient) -> str:
        """Subscribes (once per connection) to the inbox the stream's PubAcks are sent to."""
        prefix = client.new_inbox()
        await client.subscribe(f"{prefix}.*", cb=self._on_puback)
        self._inbox, self._inbox_client = prefix, client
        if self._expirer is None or self._expirer.done():
            self._expirer = asyncio.get_running_loop().create_task(
                self._expire_loop(), name=f"jetstream-expire:{self.name}"
            )
        return prefix

    async def _on_puback(self, reply: Msg) -> None:
        entry = self._awaiting.pop(reply.subject, None)
        if entry is None:
            return  # already timed out (and retried: the stream drops the duplicate)
        msg = entry[0]
        subject = msg.destination
        if reply.headers and reply.headers.get(nats.js.api.Header.STATUS) == "503":
            self._settle(msg, SinkTransientError(f"jetstream: no stream answered for {subject!r}"))
            return
        try:
            answer = orjson.loads(reply.data)
        except orjson.JSONDecodeError as exc:
            self._settle(msg, SinkTransientError(f"jetstream: unreadable PubAck for {subject!r}: {exc}"))
            return
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is not None:
            try:
                nats.js.errors.APIError.from_error(error)  # raises the error's own class
            except nats.js.errors.APIError as api_error:
                self._settle(msg, _permanent_or_transient(api_error, subject))
            else:
                self._settle(msg, SinkTransientError(f"jetstream: error for {subject!r}: {error!r}"))
            return
        if answer.get("duplicate"):
            log.debug("%s already stored (seq %s)", msg.event_id, answer.get("seq"),
                      extra={"sink": self.name})
        self._settle(msg, None)

    async def _expire_loop(self) -> None:
        """Fails publishes whose PubAck did not come within ``publish_timeout`` (retried with the
        same ``Nats-Msg-Id``, so a PubAck that was merely lost does not store the message twice)."""
        awaiting = self._awaiting
        timeout = self.options.publish_timeout
        while True:
            await asyncio.sleep(min(0.25, timeout / 4))
            now = time.monotonic()
            while awaiting:
                reply = next(iter(awaiting))
                msg, deadline = awaiting[reply]
                if deadline > now:
                    break
                del awaiting[reply]
                try:
                    self._settle(msg, SinkTransientError(
                        f"jetstream: no PubAck for {msg.destination!r} within {timeout}s"))
                except Exception:  # keep expiring the others
                    log.exception("settling an expired publish failed", extra={"sink": self.name})

    async def _close(self) -> None:
        expirer, self._expirer = self._expirer, None
        if expirer is not None:
            expirer.cancel()
            await asyncio.gather(expirer, return_exceptions=True)
        self._awaiting.clear()
        await super()._close()


class NatsDeadLetter:
    """Publishes dead-letter records (JSON, see :mod:`sinks.deadletter`) to a NATS subject through
    the sink's connection: JetStream first (stored and deduplicated by event id) when a stream
    captures the subject, core NATS otherwise. A record too large for the server is sent without the
    message body."""

    def __init__(self, *, sink: _NatsSinkBase, subject: str) -> None:
        self._sink = sink
        self.subject = subject
        self._jetstream: bool | None = None

    async def start(self) -> None:
        """The connection is opened by the sink's own start."""

    async def write(self, record: DeadLetterRecord) -> None:
        sink = self._sink
        client = await sink._conn.ready(sink.options.publish_timeout)
        value = dead_letter_json(record)
        if len(value) + _DLQ_MARGIN > client.max_payload:
            value = orjson.dumps({
                "sink": record.sink, "reason": record.reason, "attempts": record.attempts,
                "event_id": record.event_id, "key": record.key.decode("utf-8", "replace"),
                "destination": record.destination, "headers": record.headers, "message": None,
                "message_bytes": len(record.body),
                "message_omitted": "too large for the dead-letter subject",
            })
        headers = {"reason": record.reason[:1000], MSG_ID_HEADER: f"dlq-{record.event_id}"}
        if isinstance(sink, JetStreamSink) and self._jetstream is not False:
            try:
                await sink._publish_js(self.subject, value, headers)
            except SinkTransientError as exc:
                if self._jetstream or not isinstance(exc.__cause__, nats.js.errors.NoStreamResponseError):
                    raise
                log.info("sink %r: no stream captures %r; dead letters use core NATS",
                         sink.name, self.subject)
                self._jetstream = False
            else:
                self._jetstream = True
                return
        await sink._publish_core(self.subject, value, headers)

    async def close(self) -> None:
        """The connection belongs to the sink, which closes it."""
