"""The tests' NATS subscription: ``tests.brokers.subscribed`` returns only once the server has the
subscription, where nats-py's ``subscribe`` + ``flush`` does not prove it (its PING overtakes the
buffered SUB). The client's flusher is held, as a loaded machine holds it, to make the race certain."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import nats
import pytest

from sinks.nats_base import write_pending
from tests import brokers
from tests.brokers import NatsServer, subscribed

nats_server = brokers.nats_server


@contextmanager
def flusher_held(nc: Any) -> Iterator[None]:
    """Commands the client buffers stay in its buffer (its flusher task is never woken) until the
    block ends; then they are written."""
    original = nc._flush_pending

    async def held(force_flush: bool = False) -> None:
        return None

    nc._flush_pending = held
    try:
        yield
    finally:
        nc._flush_pending = original
        write_pending(nc)


async def published(pub: Any, subject: str) -> None:
    """Publishes and returns once the server has read the publish (the PUB written before the PING
    whose PONG is awaited)."""
    await pub.publish(subject, b"x")
    write_pending(pub)
    await pub.flush(timeout=10)


@pytest.fixture
async def clients(nats_server: NatsServer) -> AsyncIterator[tuple[Any, Any]]:
    """A subscribing client and a publishing one, closed when the test ends."""
    nc = await nats.connect(nats_server.url)
    pub = await nats.connect(nats_server.url)
    try:
        yield nc, pub
    finally:
        await nc.close()
        await pub.close()


async def test_flush_after_subscribe_returns_before_the_server_has_the_subscription(
    clients: tuple[Any, Any],
) -> None:
    nc, pub = clients
    with flusher_held(nc):
        sub = await nc.subscribe("early.>")
        await nc.flush(timeout=10)  # its PONG came back
        assert any(cmd.startswith(b"SUB early.>") for cmd in nc._pending)  # the SUB did not leave
        await published(pub, "early.lost")
    await subscribed(nc, "early.ready")  # the held SUB is on the server now
    await published(pub, "early.after")
    assert (await sub.next_msg(timeout=10)).subject == "early.after"  # early.lost never came


async def test_subscribed_returns_with_the_subscription_on_the_server_though_the_flusher_is_late(
    clients: tuple[Any, Any],
) -> None:
    nc, pub = clients
    with flusher_held(nc):
        sub = await subscribed(nc, "late.>")
        await published(pub, "late.x")  # right after: where subscribe + flush loses it
        assert (await sub.next_msg(timeout=10)).subject == "late.x"
