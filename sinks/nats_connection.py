"""One NATS connection of a sink: :class:`NatsConnection` tracks readiness and (re)connects in the
background."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from sinks.contract import SinkConfigError, SinkTransientError
from sinks.nats_auth import nats_connect_kwargs
from sinks.nats_options import NatsConnectionOptions

__all__ = ["NatsConnection"]

log = logging.getLogger("sinks.nats")
"""The sinks' logger: the connection's lines are the NATS sink's."""


def _read(path: str, what: str, who: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise SinkConfigError(f"{who}: {what}: cannot read {path!r}: {exc.strerror}") from exc


class NatsConnection:
    """One nats-py connection with readiness tracking and a background (re)connect at start."""

    def __init__(self, *, options: NatsConnectionOptions, name: str) -> None:
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
        if (o.nkey_seed_file is not None or o.creds_file is not None) \
                and importlib.util.find_spec("nkeys") is None:
            raise SinkConfigError(
                f"{self._who}: NKEY and credentials-file authentication need the 'nkeys' package "
                "(pip install 'nats-py[nkeys]')"
            )
        kwargs.update(nats_connect_kwargs(o, read=lambda path, what: _read(path, what, self._who),
                                          where=self._who, error=SinkConfigError))
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
