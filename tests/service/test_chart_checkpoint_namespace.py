"""The ConfigMap checkpoint store's RBAC, as rendered by the real chart engine (helm-python-sdk).

Shard ConfigMaps get a new name on every save and resourceNames cannot match prefixes, so the store
needs get/list/delete on every ConfigMap of its namespace. By default that namespace is one of the
chart's own (``<release namespace>-<release>-checkpoints``): in the release namespace, beside
other workloads, the bridge can read and delete only its own earlier checkpoints, named one by
one, which it moves on first start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from helm_python import Chart

from bridge.storage.checkpoint import informer_id
from tests.service.test_chart import CHART, find, render

CP_NS = "ops-keb-checkpoints"
PREFIX = "keb-kube-event-bridge-checkpoint"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def configmap_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if "configmaps" in r["resources"]]


def reaches_every_configmap(role: dict[str, Any], verb: str) -> bool:
    return any(verb in r["verbs"] and not r.get("resourceNames") for r in configmap_rules(role))


def checkpoint_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = find(docs, "ConfigMap")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])["checkpoint"]
    return cfg


def test_by_default_no_role_reads_or_deletes_other_configmaps_of_the_release_namespace(chart: Any) -> None:
    docs = render(chart)  # config.checkpoint: store configmap, shards true
    for verb in ("get", "list", "delete", "update", "patch"):
        assert not any(reaches_every_configmap(r, verb) for r in find(docs, "Role", "ops")), verb
    (ns,) = find(docs, "Namespace")
    assert ns["metadata"]["name"] == CP_NS
    (cp_role,) = find(docs, "Role", CP_NS)
    assert reaches_every_configmap(cp_role, "get")
    assert reaches_every_configmap(cp_role, "delete")
    (binding,) = find(docs, "RoleBinding", CP_NS)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "keb-kube-event-bridge",
                                    "namespace": "ops"}]
    cfg = checkpoint_config(docs)
    assert (cfg["namespace"], cfg["migrate_from_namespace"]) == (CP_NS, "ops")


def test_the_release_namespace_role_names_only_the_checkpoints_to_move(chart: Any) -> None:
    docs = render(chart, {"config": {"resources": [{"resource": "pods"}, {"resource": "nodes"}],
                                     "sinks": [{"name": "s", "kind": "stdout"}],
                                     "checkpoint": {"store": "configmap"}}})
    (role,) = find(docs, "Role", "ops")
    names = [f"{PREFIX}-{informer_id(r)}{suffix}" for r in ("pods", "nodes") for suffix in ("", "-journal")]
    assert configmap_rules(role) == [{"apiGroups": [""], "resources": ["configmaps"],
                                      "resourceNames": names, "verbs": ["get", "delete"]}]


def test_migrate_all_grants_the_release_namespace_for_one_upgrade(chart: Any) -> None:
    docs = render(chart, {"checkpointNamespace": {"migrateAll": True}})
    (role,) = find(docs, "Role", "ops")
    assert reaches_every_configmap(role, "get")
    assert reaches_every_configmap(role, "delete")
    assert not reaches_every_configmap(role, "update")


def test_no_move_no_release_namespace_grant(chart: Any) -> None:
    docs = render(chart, {"checkpointNamespace": {"migrate": False}})
    assert find(docs, "Role", "ops") == []
    assert "migrate_from_namespace" not in checkpoint_config(docs)


def test_an_existing_namespace_of_ones_own(chart: Any) -> None:
    docs = render(chart, {"checkpointNamespace": {"name": "bridge-state", "create": False}})
    assert find(docs, "Namespace") == []
    assert find(docs, "Role", "bridge-state")
    assert checkpoint_config(docs)["namespace"] == "bridge-state"


def test_the_old_layout_stays_available_explicitly(chart: Any) -> None:
    docs = render(chart, {"checkpointNamespace": {"enabled": False}})
    assert find(docs, "Namespace") == []
    (role,) = find(docs, "Role", "ops")
    assert reaches_every_configmap(role, "get")  # checkpoint.shards: true in the release namespace
    cfg = checkpoint_config(docs)
    assert cfg["namespace"] == "ops"
    assert "migrate_from_namespace" not in cfg


def test_a_file_store_needs_no_namespace(chart: Any) -> None:
    docs = render(chart, {"config": {"resources": [{"resource": "pods"}],
                                     "sinks": [{"name": "s", "kind": "stdout"}],
                                     "checkpoint": {"store": "file"}}})
    assert find(docs, "Namespace") == []
    assert find(docs, "Role") == []


@pytest.mark.parametrize(("values", "shards"), [
    ({"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}, [(0, 2), (1, 2)]),
    ({"sharding": {"enabled": True, "shards": 2}}, [(0, 2), (1, 2)]),
])
def test_sharded_processes_name_each_shards_checkpoint(chart: Any, values: dict[str, Any],
                                                       shards: list[tuple[int, int]]) -> None:
    from bridge.delivery.sharding import shard_id

    (role,) = find(render(chart, values), "Role", "ops")
    base = f"{PREFIX}-{informer_id('pods')}"
    (rule,) = configmap_rules(role)
    assert rule["resourceNames"] == [name for o, t in shards
                                     for name in (shard_id(base, o, t), f"{shard_id(base, o, t)}-journal")]
