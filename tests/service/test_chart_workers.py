"""The chart and ``workers`` (docs/sharding.md, "Workers"), rendered by the real Helm engine
(helm-python-sdk): the count from ``resources.limits.cpu`` or ``config.workers``, the checkpoint
and Lease rules each worker's shard needs, and what the values schema refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError

from bridge.service.config import load_config
from tests.service.test_chart import CHART, as_mounted, find, render

CFG: dict[str, Any] = {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}]}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = find(docs, "ConfigMap")
    loaded: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return loaded


def limits(cpu: Any) -> dict[str, Any]:
    return {"resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}


@pytest.mark.parametrize(("cpu", "workers"), [
    ("2", 2), (4, 4), (1.5, 1), ("2500m", 2), ("500m", 1), ("16", 16)])
def test_workers_follow_the_cpu_limit_rounded_down(chart: Any, cpu: Any, workers: int,
                                                   tmp_path: Path) -> None:
    docs = render(chart, limits(cpu))
    assert config_of(docs)["workers"] == workers
    # The rendered configuration is one the bridge accepts.
    path = tmp_path / "config.yaml"
    path.write_text(as_mounted(yaml.safe_dump(config_of(docs)), tmp_path))
    assert load_config(path).workers == workers


def test_without_a_cpu_limit_the_configuration_is_todays(chart: Any) -> None:
    assert "workers" not in config_of(render(chart))


def test_config_workers_wins_over_the_cpu_limit(chart: Any) -> None:
    assert config_of(render(chart, {**limits("8"), "config": {**CFG, "workers": 3}}))["workers"] == 3
    assert config_of(render(chart, {"config": {**CFG, "workers": "auto"}}))["workers"] == "auto"


def test_workers_read_other_shards_checkpoints_with_the_configmap_store(chart: Any) -> None:
    cfg = {**CFG, "checkpoint": {"store": "configmap"}}
    broad = {"apiGroups": [""], "resources": ["configmaps"],
             "verbs": ["create", "get", "list", "update", "delete"]}
    (role,) = find(render(chart, {**limits("2"), "config": cfg}), "Role", "ops-keb-checkpoints")
    assert broad in role["rules"]
    # Without a CPU limit nor config.workers: today's rules, the store's ConfigMaps named one by one.
    (role,) = find(render(chart, {"config": cfg}), "Role", "ops-keb-checkpoints")
    assert broad not in role["rules"]
    assert any(r.get("resourceNames") for r in role["rules"] if r["resources"] == ["configmaps"])


def test_each_worker_campaigns_for_a_lease_the_role_names(chart: Any) -> None:
    docs = render(chart, {**limits("3"), "leaderElection": {"enabled": True}, "replicaCount": 2})
    (role,) = find(docs, "Role", "ops")
    (named,) = [r for r in role["rules"] if r["resources"] == ["leases"] and "resourceNames" in r]
    assert named["resourceNames"] == [f"keb-kube-event-bridge-shard-{w}" for w in range(3)]
    # A fixed ordinal (one release per shard): worker w of shard 1 of N is shard 1*3 + w.
    docs = render(chart, {**limits("3"), "leaderElection": {"enabled": True}, "replicaCount": 2,
                          "config": {**CFG, "checkpoint": {"store": "configmap"},
                                     "sharding": {"shards": 2, "ordinal": 1}}})
    (role,) = find(docs, "Role", "ops")
    (named,) = [r for r in role["rules"] if r["resources"] == ["leases"] and "resourceNames" in r]
    assert named["resourceNames"] == [f"keb-kube-event-bridge-shard-{s}" for s in (3, 4, 5)]


def test_refuses_bad_workers(chart: Any) -> None:
    for bad in (0, -1, "many"):
        with pytest.raises(HelmError, match="workers"):
            render(chart, {"config": {**CFG, "workers": bad}})
    with pytest.raises(HelmError, match=r"config\.workers: auto cannot be used with leaderElection"):
        render(chart, {"config": {**CFG, "workers": "auto"}, "leaderElection": {"enabled": True},
                       "replicaCount": 2})


def test_no_leader_alert_counts_per_worker_shard(chart: Any) -> None:
    # Every worker runs a pipeline (keb_leader 1 on each, with its shard label): the alert sums per
    # shard, and an empty scrape (nothing at all) still counts as none.
    docs = render(chart, {**limits("4"), "metrics": {"prometheusRule": {"enabled": True}}})
    (rule,) = find(docs, "PrometheusRule")
    (alert,) = [r for g in rule["spec"]["groups"] for r in g["rules"]
                if r["alert"] == "KubeEventBridgeNoLeader"]
    assert alert["expr"] == '(sum by (shard) (keb_leader{namespace="ops"}) or on() vector(0)) != 1'
