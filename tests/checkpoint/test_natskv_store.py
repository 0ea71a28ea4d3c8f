"""NatsKvCheckpointStore against a real nats-server with JetStream (started on a free port)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import orjson
import pytest

from bridge.storage.checkpoint import Checkpoint, CheckpointCorruptError, CheckpointStoreError
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore
from tests.brokers import NatsServer, running_nats
from tests.checkpoint.nats_reorder import DeliveriesAfterInfo


@pytest.fixture(scope="module")
def nats_js() -> Iterator[NatsServer]:
    with running_nats() as server:
        yield server


async def live_keys(server: NatsServer, bucket: str) -> list[str]:
    """The bucket's keys that hold a value, read without a consumer: the stream's subjects, less
    those whose last message is a delete or purge marker."""
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=">")
        kv = await js.key_value(bucket)
        keys = []
        for subject in sorted(info.state.subjects or {}):
            key = subject.removeprefix(f"$KV.{bucket}.")
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await kv.get(key)
                keys.append(key)
        return keys
    finally:
        await nc.close()


def big_checkpoint(ident: str, n: int, rv: str = "100") -> Checkpoint:
    objects = {f"ns-{i % 7}/object-{i:06d}": (f"uid-{i:032d}", str(1000 + i)) for i in range(n)}
    return Checkpoint(informer_id=ident, resource_version=rv, objects=objects, written_at=12.5)


async def test_roundtrip_small_and_chunked(nats_js: NatsServer) -> None:
    store = NatsKvCheckpointStore(nats_url=nats_js.url, bucket="ckpt-a", chunk_size=4096)
    try:
        assert await store.load("pods.all.x") is None
        small = big_checkpoint("pods.all.x", 3)
        await store.save(small)
        assert await store.load("pods.all.x") == small
        kv = await store._bucket_kv()
        old = orjson.loads((await kv.get("pods.all.x")).value or b"")
        big = big_checkpoint("pods.all.x", 2000, rv="200")  # ~130 KB → 30+ chunks
        await store.save(big)
        assert await store.load("pods.all.x") == big
        new = orjson.loads((await kv.get("pods.all.x")).value or b"")
        assert new["chunks"] > 30
        assert new["generation"] != old["generation"]
        # The older generation's chunks are purged.
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get(f"pods.all.x.c.{old['generation']}.0")
    finally:
        await store.close()


async def test_default_chunking_above_the_server_max_payload(nats_js: NatsServer) -> None:
    store = NatsKvCheckpointStore(nats_url=nats_js.url, bucket="ckpt-b")
    try:
        cp = big_checkpoint("pods.default.y", 25_000)  # ~1.6 MB encoded, above the 1 MiB max payload
        await store.save(cp)
        assert await store.load("pods.default.y") == cp
    finally:
        await store.close()


async def test_missing_or_damaged_chunks_are_corrupt(nats_js: NatsServer) -> None:
    nc = await nats.connect(nats_js.url)
    store = NatsKvCheckpointStore(nc=nc, bucket="ckpt-c", chunk_size=2048)
    try:
        await store.save(big_checkpoint("svc.all.z", 200))
        kv = await store._bucket_kv()
        chunk = next(k for k in await live_keys(nats_js, "ckpt-c") if ".c." in k)
        await kv.put(chunk, b"tampered")
        with pytest.raises(CheckpointCorruptError, match="checksum"):
            await store.load("svc.all.z")
        await kv.purge(chunk)
        with pytest.raises(CheckpointCorruptError, match="is missing"):
            await store.load("svc.all.z")
        await kv.put("svc.all.z", b"{not json")
        with pytest.raises(CheckpointCorruptError, match="manifest is malformed"):
            await store.load("svc.all.z")
        # A healthy save repairs it.
        cp = big_checkpoint("svc.all.z", 5)
        await store.save(cp)
        assert await store.load("svc.all.z") == cp
    finally:
        await store.close()
        assert nc.is_connected  # a connection passed in is left open
        await nc.close()


async def test_unreachable_server_is_a_store_error() -> None:
    from tests.brokers import free_port

    store = NatsKvCheckpointStore(nats_url=f"nats://127.0.0.1:{free_port()}", connect_timeout=0.5)
    with pytest.raises(CheckpointStoreError, match="cannot open the NATS KV bucket"):
        await store.load("x")
    await store.close()


async def test_listing_and_removing_shard_checkpoints(nats_js: NatsServer) -> None:
    """What resharding needs (bridge/delivery/sharding.py): the checkpoints of one informer's shards
    listed by prefix (not their chunks or journals), one removed with its chunks and journal."""
    store = NatsKvCheckpointStore(nats_url=nats_js.url, bucket="ckpt-shards", chunk_size=2048)
    try:
        assert await store.informer_ids("pods.all.x") == []
        for ident in ("pods.all.x", "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2", "pods.all.y"):
            await store.save(big_checkpoint(ident, 100))  # several chunks each
        kv = await store._bucket_kv()
        await kv.put(store.journal_key("pods.all.x.shard-0-of-2"), b"journal")
        assert await store.informer_ids("pods.all.x") == [
            "pods.all.x", "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2"]
        assert await store.peek("pods.all.x.shard-1-of-2") == big_checkpoint("pods.all.x.shard-1-of-2", 100)
        await store.remove("pods.all.x.shard-0-of-2")
        assert await store.informer_ids("pods.all.x") == ["pods.all.x", "pods.all.x.shard-1-of-2"]
        left = await live_keys(nats_js, "ckpt-shards")
        assert not [k for k in left if k.startswith("pods.all.x.shard-0-of-2")]
        assert await store.load("pods.all.x.shard-1-of-2") == big_checkpoint("pods.all.x.shard-1-of-2", 100)
    finally:
        await store.close()


async def test_removing_a_shard_checkpoint_removes_its_journal_chunks(nats_js: NatsServer) -> None:
    """An earlier total's checkpoint removed by the clean-up after a reshard takes its whole journal
    with it: the head and its sealed chunks (a journal that outgrew one value)."""
    store = NatsKvCheckpointStore(nats_url=nats_js.url, bucket="ckpt-journal-chunks", journal_bytes=2048)
    ident, other = "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2"
    try:
        for i in (ident, other):
            await store.save(big_checkpoint(i, 3))
            backend = store.journal_backend(i)
            await backend.rewrite(b"".join(b'["a","ns/o-%d","uid-%032d","%d"]\n' % (n, n, 200 + n)
                                           for n in range(200)))  # ~9 KB: sealed chunks
            assert backend.chunk_writes > 0
        await store.remove(ident)
        assert not [k for k in await live_keys(nats_js, "ckpt-journal-chunks") if k.startswith(ident)]
        assert len(await store.journal_backend(other).read() or b"") > 8000  # the other's intact
    finally:
        await store.close()


async def test_a_removal_finds_every_chunk_when_the_listing_s_messages_come_after_its_info(
        nats_js: NatsServer) -> None:
    """The server may answer a consumer-info request before it sends messages that info counts as
    delivered (under load it does, now and then): a listing of the bucket must still see every key,
    so that a removed shard's checkpoint takes all its chunks with it (nats-py's ``kv.keys()``
    concluded the bucket was empty and the chunks stayed). The proxy makes that order certain."""
    proxy = DeliveriesAfterInfo(nats_js.port)
    port = await proxy.start()
    bucket = "ckpt-reordered"
    store = NatsKvCheckpointStore(nats_url=f"nats://127.0.0.1:{port}", bucket=bucket, journal_bytes=2048)
    ident, other = "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2"
    try:
        for i in (ident, other):
            await store.save(big_checkpoint(i, 3))
            await store.journal_backend(i).rewrite(b"".join(
                b'["a","ns/o-%d","uid-%032d","%d"]\n' % (n, n, 200 + n) for n in range(200)))
        assert await store.informer_ids("pods.all.x.") == [ident, other]
        await store.remove(ident)
        assert proxy.reordered > 0  # the listings met the order that lost keys
        left = await live_keys(nats_js, bucket)
        assert [k for k in left if k.startswith(ident)] == []
        assert [k for k in left if k.startswith(other)] != []
        assert await store.informer_ids("pods.all.x.") == [other]
    finally:
        await store.close()
        await proxy.stop()


async def test_a_first_save_sizes_its_chunks_by_the_servers_max_payload(tmp_path: Path) -> None:
    """A store that saves before it ever read learns the server's max payload first: with a server
    limited to 64 KiB a 200 KB checkpoint is written in chunks that fit, not in 1 MiB ones."""
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 65536\n")
    with running_nats("-c", str(config)) as server:
        store = NatsKvCheckpointStore(nats_url=server.url, bucket="small-payload")
        reader = NatsKvCheckpointStore(nats_url=server.url, bucket="small-payload")
        try:
            cp = big_checkpoint("pods.all.z", 3000)  # ~200 KB encoded
            await store.save(cp)
            assert store.last_chunk_count >= 4
            assert await reader.load("pods.all.z") == cp
        finally:
            await store.close()
            await reader.close()
