"""NKEY authentication of the NATS sinks against a real nats-server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats
import nkeys
import orjson
import pytest
from nats.aio.msg import Msg

from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.nats import NatsSink
from tests.brokers import running_nats, subscribed
from tests.sinks import Acks, event, obj


def new_user_seed() -> bytes:
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())


def server_config(tmp_path: Path, *users: bytes) -> str:
    entries = ", ".join(f'{{nkey: "{public_key(s)}"}}' for s in users)
    conf = tmp_path / "nats.conf"
    conf.write_text(f"authorization {{ users = [ {entries} ] }}\n")
    return str(conf)


async def test_nkey_seed_file_authenticates_and_a_wrong_seed_is_refused(tmp_path: Path) -> None:
    bridge_seed, reader_seed = new_user_seed(), new_user_seed()
    seed_file = tmp_path / "bridge.nk"
    seed_file.write_bytes(bridge_seed + b"\n")
    reader_file = tmp_path / "reader.nk"
    reader_file.write_bytes(reader_seed)
    with running_nats("-c", server_config(tmp_path, bridge_seed, reader_seed)) as server:
        reader = await nats.connect(server.url, nkeys_seed=str(reader_file))
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            await got.put(msg.data)

        await subscribed(reader, "k8s.>", cb=on_msg)
        sink = NatsSink.from_options("nats", {"servers": [server.url], "nkey_seed_file": str(seed_file)})
        await sink.start()
        acks = Acks()
        await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
        assert await sink.flush(5)
        assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
        body = orjson.loads(await asyncio.wait_for(got.get(), 5))
        assert body["subject"].endswith("a")
        await sink.close()
        await reader.close()

        stranger = tmp_path / "stranger.nk"
        stranger.write_bytes(new_user_seed())
        bad = NatsSink.from_options("bad", {"servers": [server.url], "nkey_seed_file": str(stranger)})
        with pytest.raises(SinkConfigError, match="sink 'bad'"):
            await bad.start()
        await bad.close()
