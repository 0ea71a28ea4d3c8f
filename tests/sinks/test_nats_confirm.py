"""How the core NATS sink confirms publishes: one PING per publisher pass, written after the pass's
PUBs, several rounds in flight at once, a round whose PONG never comes failed and retried."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

import sinks.nats_base
from sinks.contract import DeliveryOutcome, EventType
from sinks.nats import NatsSink
from tests import brokers
from tests.brokers import NatsServer, subscribed
from tests.sinks import Acks, close_after_test, event, obj

nats_server = brokers.nats_server


def make_sink(url: str, **opts: Any) -> NatsSink:
    sink = NatsSink.from_options("nats", {"servers": [url], **opts})
    close_after_test(sink)
    return sink


class WireLog:
    """Records what the sink's nats-py client hands to its socket, in order."""

    def __init__(self, client: Any) -> None:
        self.wire = bytearray()
        transport = client._transport
        write, writelines = transport.write, transport.writelines

        def logged_write(data: bytes) -> Any:
            self.wire += data
            return write(data)

        def logged_writelines(chunks: list[bytes]) -> Any:
            for chunk in chunks:
                self.wire += chunk
            return writelines(chunks)

        transport.write = logged_write
        transport.writelines = logged_writelines


async def test_an_event_is_acked_only_after_a_ping_written_behind_its_publish(
    nats_server: NatsServer,
) -> None:
    sink = make_sink(nats_server.url, destination="confirm.{name}")
    await sink.start()
    client = sink.nats.conn.client
    assert client is not None
    log = WireLog(client)
    acked_at: dict[str, int] = {}

    def ack_for(name: str) -> Any:
        def ack(outcome: DeliveryOutcome) -> None:
            assert outcome is DeliveryOutcome.DELIVERED
            acked_at[name] = len(log.wire)

        return ack

    names = [f"o{i}" for i in range(300)]
    for i, name in enumerate(names):
        await sink.deliver(event(EventType.ADDED, obj(name, uid=f"u{i}", rv=str(i + 1))), ack_for(name))
        if i % 37 == 0:
            await asyncio.sleep(0)  # several publisher passes, several rounds
    assert await sink.flush(5)
    assert sorted(acked_at) == sorted(names)
    wire = bytes(log.wire)
    for name, seen in acked_at.items():
        pub = wire.find(f"PUB confirm.{name} ".encode())
        if pub < 0:
            pub = wire.find(f"HPUB confirm.{name} ".encode())
        assert 0 <= pub < seen, name
        # A PING follows the publish in what had been written when the event was acked.
        assert wire.find(b"PING\r\n", pub, seen) > pub, name


async def test_rounds_are_pipelined_rather_than_one_at_a_time(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, destination="pipelined.{name}")
    await sink.start()
    client = sink.nats.conn.client
    assert client is not None
    most = 0
    original = client._process_pong

    async def counting_pong() -> None:
        nonlocal most
        most = max(most, len(client._pongs))
        await original()

    client._process_pong = counting_pong  # type: ignore[method-assign]
    acks = Acks()
    for i in range(200):
        await sink.deliver(event(EventType.ADDED, obj(f"p{i}", uid=f"p{i}", rv="1")), acks.cb(str(i)))
        await asyncio.sleep(0)  # one publisher pass (and one PING) per event
    assert await sink.flush(5)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 200
    assert most > 1  # a PING went out while an earlier one still waited for its PONG


async def test_a_pong_that_never_comes_fails_the_round_and_it_is_retried(nats_server: NatsServer) -> None:
    sink = make_sink(nats_server.url, destination="lost.{name}", publish_timeout=0.3,
                     retry={"initial": 0.01, "max": 0.05})
    await sink.start()
    client = sink.nats.conn.client
    assert client is not None
    nc = await nats.connect(nats_server.url)
    got: list[Msg] = []

    twice = asyncio.Event()

    async def cb(msg: Msg) -> None:
        got.append(msg)
        if len(got) >= 2:
            twice.set()

    await subscribed(nc, "lost.>", cb=cb)
    # The first PONG future is dropped, as nats-py does with all of them on a reconnect.
    original = client._process_pong
    dropped = False

    async def dropping_pong() -> None:
        nonlocal dropped
        if not dropped and client._pongs:
            dropped = True
            client._pongs.pop(0)
            return
        await original()

    client._process_pong = dropping_pong  # type: ignore[method-assign]
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("x", uid="ux", rv="1")), acks.cb("x"))
    assert await sink.flush(5)
    assert acks.outcomes == [("x", DeliveryOutcome.DELIVERED)]
    assert dropped
    assert sink.stats.retries >= 1
    async with asyncio.timeout(60):  # a hang guard: the copies are on their way once flush returned
        await twice.wait()
    assert {m.subject for m in got} == {"lost.x"}  # sent again: at least once
    await nc.close()


async def test_without_the_client_internals_publishes_are_confirmed_through_flush(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sinks.nats_base, "_HAS_CLIENT_INTERNALS", False)
    sink = make_sink(nats_server.url, destination="public.{name}")
    await sink.start()
    acks = Acks()
    for i in range(50):
        await sink.deliver(event(EventType.ADDED, obj(f"f{i}", uid=f"f{i}", rv="1")), acks.cb(str(i)))
        if i % 10 == 0:
            await asyncio.sleep(0)
    assert await sink.flush(5)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 50
