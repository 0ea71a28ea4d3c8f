"""ConfigMapCheckpointStore against the API-server simulator (real HTTP)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator
from bridge.storage.blobstore import utf8_pieces
from bridge.storage.checkpoint import Checkpoint, CheckpointCorruptError, CheckpointStoreError
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from tests.checkpoint.helpers import simulated_cluster

NS = "bridge-system"


@pytest.fixture
async def sim_client(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS) as world:
        yield world


def big_checkpoint(ident: str, n: int, rv: str = "100") -> Checkpoint:
    objects = {f"ns-{i % 7}/objet-é-{i:06d}": (f"uid-{i:032d}", str(1000 + i)) for i in range(n)}
    return Checkpoint(informer_id=ident, resource_version=rv, objects=objects, written_at=3.25)


async def configmap_names(client: ApiClient) -> list[str]:
    listed = await client.get(f"/api/v1/namespaces/{NS}/configmaps")
    return sorted(i["metadata"]["name"] for i in listed["items"])


async def test_inline_then_sharded_then_inline(sim_client: tuple[Simulator, ApiClient]) -> None:
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", shard_bytes=8192)
    ident = "pods.all.0123456789ab"
    assert await store.load(ident) is None

    small = big_checkpoint(ident, 2)
    await store.save(small)
    assert store.last_chunk_count == 0
    assert await store.load(ident) == small
    assert await configmap_names(client) == [f"keb-{ident}"]

    big = big_checkpoint(ident, 600, rv="200")  # ~45 KB → 6 shards
    await store.save(big)
    assert store.last_chunk_count >= 5
    assert await store.load(ident) == big
    first_shards = [n for n in await configmap_names(client) if n != f"keb-{ident}"]
    assert len(first_shards) == store.last_chunk_count

    bigger = big_checkpoint(ident, 700, rv="300")
    await store.save(bigger)
    assert await store.load(ident) == bigger
    shards = [n for n in await configmap_names(client) if n != f"keb-{ident}"]
    assert len(shards) == store.last_chunk_count
    assert not set(shards) & set(first_shards)  # the previous generation was deleted

    await store.save(small)
    assert await store.load(ident) == small
    assert await configmap_names(client) == [f"keb-{ident}"]
    await store.close()


async def test_default_shard_size_above_one_mib(sim_client: tuple[Simulator, ApiClient]) -> None:
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS)
    cp = big_checkpoint("pods.default.feedfacecafe", 22_000)  # ~1.6 MB
    await store.save(cp)
    assert store.last_chunk_count == 2
    assert await store.load("pods.default.feedfacecafe") == cp


async def test_orphan_shards_from_a_crashed_save_are_cleaned(sim_client: tuple[Simulator, ApiClient]) -> None:
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", shard_bytes=4096)
    ident = "svc.all.aaaaaaaaaaaa"
    cp = big_checkpoint(ident, 200)
    await store.save(cp)
    # A crash after writing shards but before the manifest: shards of an unreferenced generation.
    orphan = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": f"keb-{ident}-sdead-0", "labels": store.manifests.labels(ident, "shard")},
              "data": {"chunk": "partial"}}
    await client.create(f"/api/v1/namespaces/{NS}/configmaps", orphan)
    assert await store.load(ident) == cp  # the manifest still points at the complete shards
    await store.save(cp)
    assert f"keb-{ident}-sdead-0" not in await configmap_names(client)


async def test_corrupt_manifest_and_missing_shard(sim_client: tuple[Simulator, ApiClient]) -> None:
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", shard_bytes=4096)
    ident = "cm.all.bbbbbbbbbbbb"
    await store.save(big_checkpoint(ident, 200))
    path = f"/api/v1/namespaces/{NS}/configmaps"
    shard = next(n for n in await configmap_names(client) if "-s" in n.removeprefix(f"keb-{ident}"))
    await client.patch(f"{path}/{shard}", {"data": {"chunk": "tampered"}})
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        await store.load(ident)
    await client.delete(f"{path}/{shard}")
    with pytest.raises(CheckpointCorruptError, match="is missing"):
        await store.load(ident)
    await client.patch(f"{path}/keb-{ident}", {"data": {"checkpoint": "garbage", "shards": None}})
    with pytest.raises(CheckpointCorruptError, match="bad header"):
        await store.load(ident)
    await client.patch(f"{path}/keb-{ident}", {"data": {"checkpoint": None}})
    with pytest.raises(CheckpointCorruptError, match="malformed manifest"):
        await store.load(ident)


async def test_api_down_is_a_store_error(tmp_path: Path) -> None:
    sim = Simulator()
    await sim.start()
    client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")))
    await sim.stop()
    store = ConfigMapCheckpointStore(client=client, namespace=NS)
    try:
        with pytest.raises(CheckpointStoreError, match="cannot read checkpoint ConfigMap"):
            await store.load("x.all.y")
        with pytest.raises(CheckpointStoreError, match="cannot write checkpoint ConfigMap"):
            await store.save(big_checkpoint("x.all.y", 1))
    finally:
        await client.close()


def test_utf8_chunks_never_split_a_character() -> None:
    data = ("aé" * 1000).encode()
    chunks = [c.decode() for c in utf8_pieces(data, 7)]
    assert "".join(chunks).encode() == data
    assert all(len(c.encode()) <= 7 for c in chunks)


async def test_without_shards_only_the_manifest_is_touched(sim_client: tuple[Simulator, ApiClient]) -> None:
    # The chart's narrowed Role names only manifests: a checkpoint that would need shards fails to
    # save, visibly, and leaves the previous checkpoint as it was.
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", shard_bytes=8192,
                                     allow_shards=False)
    ident = "pods.all.0123456789ab"
    small = big_checkpoint(ident, 2)
    await store.save(small)
    with pytest.raises(CheckpointStoreError, match="sharding is off"):
        await store.save(big_checkpoint(ident, 600, rv="200"))
    assert await configmap_names(client) == [f"keb-{ident}"]
    assert await store.load(ident) == small


async def test_listing_and_removing_shard_checkpoints(sim_client: tuple[Simulator, ApiClient]) -> None:
    """What resharding needs (bridge/delivery/sharding.py): the checkpoints of one informer's shards
    listed by prefix (manifests only), one removed with its shard ConfigMaps and journal."""
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", shard_bytes=4096)
    assert await store.informer_ids("pods.all.x") == []
    for ident in ("pods.all.x", "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2", "pods.all.y"):
        await store.save(big_checkpoint(ident, 300))  # sharded over several ConfigMaps
    await client.create(f"/api/v1/namespaces/{NS}/configmaps",
                        {"metadata": {"name": store.journal_name("pods.all.x.shard-0-of-2")}})
    assert await store.informer_ids("pods.all.x") == [
        "pods.all.x", "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2"]
    assert await store.peek("pods.all.x.shard-1-of-2") == big_checkpoint("pods.all.x.shard-1-of-2", 300)
    await store.remove("pods.all.x.shard-0-of-2")
    assert await store.informer_ids("pods.all.x") == ["pods.all.x", "pods.all.x.shard-1-of-2"]
    assert not [n for n in await configmap_names(client) if n.startswith("keb-pods.all.x.shard-0-of-2")]
    assert await store.load("pods.all.x.shard-1-of-2") == big_checkpoint("pods.all.x.shard-1-of-2", 300)


async def test_removing_a_shard_checkpoint_removes_its_journal_chunks(
        sim_client: tuple[Simulator, ApiClient]) -> None:
    """An earlier total's checkpoint removed by the clean-up after a reshard takes its whole journal
    with it: the head and its sealed chunks (a journal that outgrew one ConfigMap)."""
    _, client = sim_client
    store = ConfigMapCheckpointStore(client=client, namespace=NS, name_prefix="keb", journal_bytes=2048)
    ident, other = "pods.all.x.shard-0-of-2", "pods.all.x.shard-1-of-2"
    for i in (ident, other):
        await store.save(big_checkpoint(i, 3))
        backend = store.journal_backend(i)
        await backend.rewrite(b"".join(b'["a","ns/o-%d","uid-%032d","%d"]\n' % (n, n, 200 + n)
                                       for n in range(200)))  # ~9 KB: sealed chunks
        assert backend.chunk_writes > 0
    await store.remove(ident)
    assert not [n for n in await configmap_names(client) if n.startswith(f"keb-{ident}")]
    assert len(await store.journal_backend(other).read() or b"") > 8000  # the other shard's intact
