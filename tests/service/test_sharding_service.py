"""Sharding through the service (docs/sharding.md): two replicas, shard 0 and 1 of 2, in-process
against the simulator. Resources sharded by resource run on one replica only (round-robin over their
sorted informer ids); a resource sharded by object is watched by both, each delivering the objects
whose uid hashes to it; snapshot markers say which shard of how many they cover. Bad sharding
settings exit 2 naming the field."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.kube.sharding import shard_of
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.service.sharding import assign
from bridge.sim import Simulator
from bridge.storage.checkpoint import informer_id
from tests.checkpoint.helpers import CONFIGMAPS, CONFIGMAPS_API
from tests.service.test_cli import run_cli
from tests.service.test_cli_errors import assert_config_error
from tests.service.test_service import eventually, lines

pytestmark = pytest.mark.usefixtures("own_cwd")


def config(sim: Simulator, tmp_path: Path, ordinal: int, **extra: Any) -> BridgeConfig:
    return BridgeConfig.model_validate({
        **extra,
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                       "in_cluster": "false"},
        "resources": [{"resource": "configmaps", "namespace": "default"},
                      {"resource": "services", "namespace": "default"},
                      {"resource": "secrets", "namespace": "default"},
                      {"resource": "pods", "namespace": "default", "sharding": "object"}],
        "sinks": [{"name": "file", "kind": "file", "path": str(tmp_path / f"events-{ordinal}.jsonl")}],
        "checkpoint": {"store": "file", "directory": str(tmp_path / "ckpt"), "interval": 0.1,
                       "spill_directory": ""},
        "snapshot": {"on_first_start": True},
        "sharding": {"shards": 2, "ordinal": ordinal, "strategy": "resource"},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


async def test_two_replicas_share_resources_and_objects(tmp_path: Path) -> None:
    async with Simulator() as sim:
        services = [BridgeService(config=config(sim, tmp_path, o)) for o in range(2)]
        client = ApiClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
        made: dict[str, list[dict[str, Any]]] = {"configmaps": [], "services": [], "secrets": [], "pods": []}
        for i in range(12, 20):  # there at the first start: in the first snapshot
            made["pods"].append(await client.create("/api/v1/namespaces/default/pods", {
                "metadata": {"name": f"p{i}"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        tasks = [asyncio.create_task(s.run(), name=f"shard-{i}") for i, s in enumerate(services)]
        try:
            await eventually(lambda: all(s.readiness().ready for s in services), what="readiness")
            for i in range(12):
                made["pods"].append(await client.create("/api/v1/namespaces/default/pods", {
                    "metadata": {"name": f"p{i}"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}))
            for i in range(3):
                made["configmaps"].append(await client.create(
                    "/api/v1/namespaces/default/configmaps", {"metadata": {"name": f"c{i}"}}))
                made["secrets"].append(await client.create(
                    "/api/v1/namespaces/default/secrets", {"metadata": {"name": f"s{i}"}}))
                made["services"].append(await client.create(
                    "/api/v1/namespaces/default/services",
                    {"metadata": {"name": f"v{i}"}, "spec": {"ports": [{"port": 80}]}}))
            wanted = sum(len(v) for v in made.values())

            def added() -> list[dict[str, Any]]:
                return [e for o in range(2) for e in lines(tmp_path / f"events-{o}.jsonl")
                        if e["type"].endswith(".added")]

            await eventually(lambda: len(added()) >= wanted, what="every add")
        finally:
            for s in services:
                s.stop_event.set()
            await asyncio.gather(*tasks)
            await client.close()
    assert [s.shard for s in services] == [(0, 2), (1, 2)]
    events = [[e for e in lines(tmp_path / f"events-{o}.jsonl")] for o in range(2)]
    kinds = [{e["kind"] for e in evs if e["type"].endswith(".added")} for evs in events]
    # By resource: round-robin over the sorted informer ids of configmaps, secrets, services.
    whole = sorted(("configmaps", "secrets", "services"), key=lambda r: informer_id(r, "default"))
    kind = {"configmaps": "ConfigMap", "secrets": "Secret", "services": "Service"}
    for i, resource in enumerate(whole):
        assert kind[resource] in kinds[i % 2]
        assert kind[resource] not in kinds[1 - i % 2]
    # By object: both watch pods, each delivers exactly its own.
    for o in range(2):
        pods = {e["uid"] for e in events[o] if e["kind"] == "Pod" and e["type"].endswith(".added")}
        assert pods == {p["metadata"]["uid"] for p in made["pods"] if shard_of(p["metadata"]["uid"], 2) == o}
    # Snapshot markers of a sharded resource say which shard of how many; a resource watched whole
    # by one replica is shard 0 of 1.
    for o in range(2):
        markers = [e for e in events[o] if e["type"].endswith(("snapshot.begin", "snapshot.end"))]
        pod_markers = [m for m in markers if m["kind"] == "Pod"]
        assert pod_markers
        assert {(m["shard"], m["totalshards"]) for m in pod_markers} == {(str(o), "2")}
        assert {(m["shard"], m["totalshards"]) for m in markers if m["kind"] != "Pod"} <= {("0", "1")}
        syncs = [e for e in events[o] if e["type"].endswith(".sync") and e["kind"] == "Pod"]
        assert {(e["shard"], e["totalshards"]) for e in syncs} == {(str(o), "2")}
        assert {e["uid"] for e in syncs} <= {p["metadata"]["uid"] for p in made["pods"]
                                             if shard_of(p["metadata"]["uid"], 2) == o}
    # Changes are no snapshot: they carry no shard attribute.
    assert not [e for evs in events for e in evs if e["type"].endswith(".added") and "shard" in e]


async def test_with_leader_election_each_shard_has_its_own_lease(tmp_path: Path) -> None:
    """One Lease per shard: shard 0 and shard 1 both lead (each would have its own standbys), and
    neither waits for the other's Lease."""
    le = {"leader_election": {"enabled": True, "namespace": "default", "name": "keb", "identity": "x",
                              "lease_duration": 3, "renew_deadline": 2, "retry_period": 0.5}}
    async with Simulator() as sim:
        services = [BridgeService(config=config(sim, tmp_path, o, **le)) for o in range(2)]
        tasks = [asyncio.create_task(s.run(), name=f"shard-{i}") for i, s in enumerate(services)]
        client = ApiClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
        try:
            await eventually(lambda: all(s.readiness().ready and s.readiness().role == "leader"
                                         for s in services), what="both lead")
            path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
            holders = [(await client.get(f"{path}/keb-shard-{o}"))["spec"]["holderIdentity"]
                       for o in range(2)]
        finally:
            for s in services:
                s.stop_event.set()
            await asyncio.gather(*tasks)
            await client.close()
    assert holders == ["x", "x"]


def _leader_samples(service: BridgeService) -> list[str]:
    text = service.telemetry.render_prometheus().decode()
    return [line for line in text.splitlines() if line.startswith("keb_leader{")]


async def test_a_standby_per_shard_waits_for_its_shards_lease_and_is_labelled(tmp_path: Path) -> None:
    """Two replicas of shard 1 (a standby per shard, docs/sharding.md): one leads on keb-shard-1,
    the other stands by, and both expose their shard's labels, so that summing keb_leader by shard
    gives 1 per shard; shard 0's leader does not wait for it."""
    def le(identity: str) -> dict[str, Any]:
        return {"leader_election": {"enabled": True, "namespace": "default", "name": "keb",
                                    "identity": identity, "lease_duration": 3, "renew_deadline": 2,
                                    "retry_period": 0.5}}
    async with Simulator() as sim:
        services = [BridgeService(config=config(sim, tmp_path, o, **le(who)))
                    for o, who in ((0, "a"), (1, "b"), (1, "c"))]
        tasks = [asyncio.create_task(s.run(), name=f"replica-{i}") for i, s in enumerate(services)]
        client = ApiClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
        try:
            await eventually(lambda: all(s.readiness().ready for s in services)
                             and sorted(s.readiness().role for s in services[1:]) == ["leader", "standby"]
                             and services[0].readiness().role == "leader", what="a leader per shard")
            path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
            holder = (await client.get(f"{path}/keb-shard-1"))["spec"]["holderIdentity"]
            leader = next(s for s in services[1:] if s.readiness().role == "leader")
            standby = next(s for s in services[1:] if s.readiness().role == "standby")
            samples = {id(s): _leader_samples(s) for s in services}
        finally:
            for s in services:
                s.stop_event.set()
            await asyncio.gather(*tasks)
            await client.close()
    assert holder == leader.config.leader_election.identity
    assert samples[id(services[0])] == ['keb_leader{shard="0",total_shards="2"} 1.0']
    assert samples[id(leader)] == ['keb_leader{shard="1",total_shards="2"} 1.0']
    assert samples[id(standby)] == ['keb_leader{shard="1",total_shards="2"} 0.0']
    assert standby.shard == (1, 2)


@pytest.mark.parametrize(("sharding", "needle"), [
    ("{shards: 3, ordinal: 3}", "sharding: ordinal: 3 is not a shard of 3"),
    ("{shards: 0}", "sharding.shards"),
    ("{strategy: uid}", "sharding.strategy"),
    ("{shards: two}", "sharding.shards"),
])
def test_bad_sharding_settings_exit_2_naming_the_field(tmp_path: Path, sharding: str, needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: pods}]\nsinks: [{name: f, kind: file, path: /tmp/x}]\n"
                   f"sharding: {sharding}\n")
    assert_config_error(run_cli("check-config", "--config", str(cfg)), needle)


def test_a_bad_per_resource_strategy_names_the_resource(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: pods, sharding: node}]\n"
                   "sinks: [{name: f, kind: file, path: /tmp/x}]\n")
    assert_config_error(run_cli("check-config", "--config", str(cfg)), "resources.0.sharding")


def test_resources_are_dealt_round_robin_and_a_shard_may_have_none() -> None:
    watched = [WatchedResource(key=InformerKey("configmaps", namespace=ns), api=CONFIGMAPS_API,
                               ref=CONFIGMAPS) for ns in ("a", "b", "c")]
    strategies = {w.key: "resource" for w in watched}
    order = sorted(watched, key=lambda w: w.base_informer_id)
    runs = [assign(watched, ordinal=o, total=4, strategies=strategies) for o in range(4)]
    assert [[w.key for w in r] for r in runs] == [[order[0].key], [order[1].key], [order[2].key], []]
    # Watched whole: shard 0 of 1, the plain informer id (it moves with its checkpoint).
    assert all(w.shard is not None and (w.shard.ordinal, w.shard.total) == (0, 1)
               and w.informer_id == w.base_informer_id for r in runs for w in r)
    # By object: every shard runs every resource, each with its own checkpoint id.
    by_object = [assign(watched, ordinal=o, total=2, strategies={}) for o in range(2)]
    assert [len(r) for r in by_object] == [3, 3]
    assert by_object[1][0].informer_id == f"{watched[0].base_informer_id}.shard-1-of-2"


def test_a_sharding_section_of_one_shard_still_takes_over() -> None:
    """Going back to one replica: ``sharding: {shards: 1}`` keeps the take-over of the shards'
    checkpoints; without any sharding section the bridge runs as it always did."""
    base = {"resources": [{"resource": "pods"}], "sinks": [{"name": "f", "kind": "file", "path": "/tmp/x"}]}
    assert BridgeService(config=BridgeConfig.model_validate({**base, "sharding": {"shards": 1}}))._sharded
    assert not BridgeService(config=BridgeConfig.model_validate(base))._sharded
    assert BridgeService(config=BridgeConfig.model_validate({**base, "sharding": {"ordinal": "auto",
                                                                                 "shards": "auto"}}))._sharded
