"""Checkpoints moved from the release namespace to the dedicated checkpoint namespace (the chart's
default since the bridge's Role no longer reaches every ConfigMap of the release namespace), against
the API-server simulator over real HTTP.

The move is safe under a crash anywhere: the old checkpoint is deleted only after the new one is
written and read back; a start that finds both keeps the new one and removes the old."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.errors import ApiError
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.sim import Simulator
from bridge.storage.checkpoint import Checkpoint
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from sinks.contract import ResourceRef
from tests.checkpoint.helpers import RecordingSink, simulated_cluster, until

WATCHED = "apps"
OLD = "release"
NEW = "release-keb-checkpoints"
PREFIX = "keb-checkpoint"
IDENT = "pods.all.0123456789ab"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, WATCHED, OLD, NEW, bookmark_interval=0.5) as world:
        yield world


async def names(client: ApiClient, namespace: str) -> list[str]:
    listed = await client.get(f"/api/v1/namespaces/{namespace}/configmaps")
    return sorted(i["metadata"]["name"] for i in listed["items"])


def store(client: ApiClient, *, moving: bool = True) -> ConfigMapCheckpointStore:
    if not moving:
        return ConfigMapCheckpointStore(client=client, namespace=OLD, name_prefix=PREFIX)
    return ConfigMapCheckpointStore(client=client, namespace=NEW, name_prefix=PREFIX, migrate_from=OLD)


CHECKPOINT = Checkpoint(informer_id=IDENT, resource_version="120",
                        objects={"apps/a": ("uid-a", "100"), "apps/b": ("uid-b", "110")}, written_at=5.0)
JOURNAL = b"journal records of the old location\n"


async def seed_old(client: ApiClient) -> None:
    old = store(client, moving=False)
    await old.save(CHECKPOINT)
    await old.journal_backend(IDENT).rewrite(JOURNAL)
    assert await names(client, OLD) == [f"{PREFIX}-{IDENT}", f"{PREFIX}-{IDENT}-journal"]


async def test_a_checkpoint_of_the_old_namespace_is_moved_on_first_load(
        sim: tuple[Simulator, ApiClient]) -> None:
    _, client = sim
    await seed_old(client)
    new = store(client)
    assert await new.load(IDENT) == CHECKPOINT
    assert await names(client, NEW) == [f"{PREFIX}-{IDENT}", f"{PREFIX}-{IDENT}-journal"]
    assert await names(client, OLD) == []
    assert await new.journal_backend(IDENT).read() == JOURNAL
    # A fresh start reads it from the new namespace alone.
    assert await store(client).load(IDENT) == CHECKPOINT


async def test_nothing_to_move_is_no_checkpoint(sim: tuple[Simulator, ApiClient]) -> None:
    _, client = sim
    assert await store(client).load(IDENT) is None
    assert await names(client, NEW) == []


class CrashingClient(ApiClient):
    """A client whose deletes in the old namespace fail: a crash right after the new copy was
    written (the failure is injected; every other request goes to the simulator)."""

    async def delete(self, path: str, **kwargs: Any) -> Any:
        if f"/namespaces/{OLD}/" in path:
            raise ApiError("injected: the bridge died before deleting the old checkpoint")
        return await super().delete(path, **kwargs)


async def test_a_crash_between_the_new_write_and_the_old_delete(
        sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    _server, client = sim
    await seed_old(client)
    crashing = CrashingClient.from_kubeconfig(str(tmp_path / "kc"))
    try:
        assert await store(crashing).load(IDENT) == CHECKPOINT  # the moved copy, confirmed
    finally:
        await crashing.close()
    # Both copies exist now; the next start keeps the new one and removes the old.
    assert await names(client, OLD) == [f"{PREFIX}-{IDENT}", f"{PREFIX}-{IDENT}-journal"]
    assert await names(client, NEW) == [f"{PREFIX}-{IDENT}", f"{PREFIX}-{IDENT}-journal"]
    newer = Checkpoint(informer_id=IDENT, resource_version="130", objects=dict(CHECKPOINT.objects),
                       written_at=6.0)
    await store(client).save(newer)  # written in the new namespace meanwhile: it must win
    assert await store(client).load(IDENT) == newer
    assert await names(client, OLD) == []


async def test_a_crash_before_the_new_checkpoint_is_written_moves_it_again(
        sim: tuple[Simulator, ApiClient]) -> None:
    _, client = sim
    await seed_old(client)
    # Only the journal reached the new namespace before the crash.
    await store(client).journal_backend(IDENT).rewrite(b"partial")
    assert await store(client).load(IDENT) == CHECKPOINT
    assert await store(client).journal_backend(IDENT).read() == JOURNAL
    assert await names(client, OLD) == []


# --- through the pipeline: the bridge resumes from the moved checkpoint ----------------------------

PATH = f"/api/v1/namespaces/{WATCHED}/configmaps"


async def pipeline(client: ApiClient, sink: RecordingSink, checkpoints: ConfigMapCheckpointStore
                   ) -> BridgePipeline:
    api = await Discovery(client=client).resolve("configmaps")
    ref = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
    factory = SharedInformerFactory(
        lister_watcher_factory=lambda k: HttpListerWatcher(client=client, resource=api,
                                                           namespace=k.namespace, raw_objects=True),
        clock=RealClock())
    return BridgePipeline(factory=factory,
                          resources=[WatchedResource(key=InformerKey("configmaps", namespace=WATCHED),
                                                     api=api, ref=ref)],
                          sinks=[sink], checkpoint_store=checkpoints, checkpoint_interval=0.05,
                          cluster="sim")


async def test_the_bridge_resumes_from_the_moved_checkpoint(sim: tuple[Simulator, ApiClient]) -> None:
    _, client = sim
    for name in ("a", "b"):
        await client.create(PATH, {"metadata": {"name": name}, "data": {"v": "0"}})
    first = RecordingSink("rec")
    p = await pipeline(client, first, store(client, moving=False))  # as installed before
    await p.start()
    assert await p.wait_for_sync(10)
    ident = next(iter(p.informers))
    list_rv = (await client.get(PATH))["metadata"]["resourceVersion"]
    tracker = p.tracker(ident)
    await until(lambda: int(tracker.resource_version or 0) >= int(list_rv) and not tracker.pending,
                what="everything acknowledged")
    await p.shutdown(5)
    assert len(first.changes()) == 2
    old_names = await names(client, OLD)
    assert f"{PREFIX}-{ident}" in old_names

    created = await client.create(PATH, {"metadata": {"name": "c"}, "data": {"v": "0"}})
    second = RecordingSink("rec")
    p = await pipeline(client, second, store(client))  # the upgraded chart's configuration
    await p.start()
    assert p.resumed(ident)
    await until(lambda: len(second.changes()) == 1, what="the one change since")
    assert second.changes() == [("added", f"{WATCHED}/c", created["metadata"]["resourceVersion"], False)]
    await until(lambda: not p.tracker(ident).pending, what="acknowledged")
    await p.shutdown(5)
    assert f"{PREFIX}-{ident}" in await names(client, NEW)
    assert await names(client, OLD) == []


async def test_a_checkpoint_split_over_shard_configmaps_is_moved_whole(
        sim: tuple[Simulator, ApiClient]) -> None:
    _, client = sim
    big = Checkpoint(informer_id=IDENT, resource_version="500", written_at=1.0,
                     objects={f"apps/o-{i:05d}": (f"uid-{i:032d}", str(100 + i)) for i in range(400)})
    old = ConfigMapCheckpointStore(client=client, namespace=OLD, name_prefix=PREFIX, shard_bytes=4096)
    await old.save(big)
    assert old.last_chunk_count > 1
    new = ConfigMapCheckpointStore(client=client, namespace=NEW, name_prefix=PREFIX, shard_bytes=4096,
                                   migrate_from=OLD)
    assert await new.load(IDENT) == big
    assert await names(client, OLD) == []
    assert len(await names(client, NEW)) == new.last_chunk_count + 1
