"""The chart's DaemonSet mode (nodeSharding.enabled), rendered by the real Helm engine
(helm-python-sdk): a DaemonSet whose pods watch the Pods of their node ($NODE_NAME from the downward
API), the Deployment as the owner of unscheduled Pods and the other resources, each configuration
accepted by the bridge itself, least-privilege RBAC for the node pods, and what the schema and the
templates refuse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError, lint

from bridge.service.config import load_config
from bridge.storage.checkpoint import informer_id
from tests.service.test_chart import CHART, as_mounted, find, render

FULLNAME = "keb-kube-event-bridge"
CONFIG: dict[str, Any] = {
    "cluster": "c",
    "resources": [{"resource": "pods"}, {"resource": "deployments.apps", "namespace": "web"}],
    "sinks": [{"name": "s", "kind": "stdout"}],
    "checkpoint": {"store": "configmap"},
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def values(**extra: Any) -> dict[str, Any]:
    return {"nodeSharding": {"enabled": True}, "config": CONFIG, **extra}


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in find(docs, kind) if d["metadata"]["name"] == name]
    return doc


def test_daemonset_mode_runs_a_bridge_per_node_and_the_unscheduled_owner(
        chart: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, values(nodeSharding={"enabled": True, "tolerations": [{"operator": "Exists"}],
                                              "nodeSelector": {"kubernetes.io/os": "linux"}}))
    (ds,) = find(docs, "DaemonSet")
    assert ds["metadata"]["name"] == f"{FULLNAME}-node"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "node"
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in container["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert pod["serviceAccountName"] == f"{FULLNAME}-node"
    assert {"name": "config", "configMap": {"name": f"{FULLNAME}-node"}} in pod["volumes"]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "affinity" not in pod
    assert "topologySpreadConstraints" not in pod
    # The Deployment stays: the designated replica.
    (deploy,) = find(docs, "Deployment")
    assert "NODE_NAME" not in {e["name"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}

    # Both configurations are ones the bridge accepts, and say what each replica does.
    node_text = named(docs, "ConfigMap", f"{FULLNAME}-node")["data"]["config.yaml"]
    owner_text = named(docs, "ConfigMap", FULLNAME)["data"]["config.yaml"]
    monkeypatch.setenv("NODE_NAME", "worker-1")
    (tmp_path / "node.yaml").write_text(as_mounted(node_text, tmp_path))
    (tmp_path / "owner.yaml").write_text(as_mounted(owner_text, tmp_path))
    node = load_config(tmp_path / "node.yaml")
    owner = load_config(tmp_path / "owner.yaml")
    assert [r.resource for r in node.resources] == ["pods"]
    assert (node.sharding.strategy, node.sharding.node_name, node.sharding.unscheduled) == (
        "node", "worker-1", False)
    assert not node.leader_election.enabled
    assert [r.resource for r in owner.resources] == ["pods", "deployments.apps"]
    assert (owner.sharding.strategy, owner.sharding.unscheduled) == ("node", True)


def test_node_pods_get_least_privilege_rbac(chart: Any) -> None:
    docs = render(chart, values())
    node_roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")
                  and d["metadata"]["name"] == f"{FULLNAME}-node"]
    # Pods only (get for the selector exits), cluster-wide as configured; no Deployment, no Lease.
    (cluster_role,) = [d for d in node_roles if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                      "verbs": ["get", "list", "watch"]}]
    (role,) = [d for d in node_roles if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "ops-keb-checkpoints"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": ["create", "get", "list", "update", "patch", "delete"]}]
    for binding in [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
                    and d["metadata"]["name"] == f"{FULLNAME}-node"]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULLNAME}-node",
                                        "namespace": "ops"}]
    assert named(docs, "ServiceAccount", f"{FULLNAME}-node")
    # The unscheduled owner reads Pods through spec.nodeName= (get for its exits) and names its
    # checkpoint, whose id carries that selector.
    owner_cluster = named(docs, "ClusterRole", FULLNAME)
    pods_rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    assert pods_rule in owner_cluster["rules"]
    owner_role = next(d for d in find(docs, "Role", "ops") if d["metadata"]["name"] == FULLNAME)
    names = [n for rule in owner_role["rules"] for n in rule.get("resourceNames", [])]
    assert f"{FULLNAME}-checkpoint-{informer_id('pods', '', '', 'spec.nodeName=')}" in names
    # Namespaced Pods: a Role in that namespace instead of a ClusterRole.
    docs = render(chart, values(config={**CONFIG, "resources": [{"resource": "po", "namespace": "apps"}]}))
    assert [d for d in find(docs, "ClusterRole") if d["metadata"]["name"] == f"{FULLNAME}-node"] == []
    (apps_role,) = [d for d in find(docs, "Role", "apps") if d["metadata"]["name"] == f"{FULLNAME}-node"]
    assert apps_role["rules"] == [pods_rule]


def test_leader_election_gives_the_unscheduled_owner_its_own_lease(chart: Any) -> None:
    docs = render(chart, values(replicaCount=2, leaderElection={"enabled": True}))
    role = next(d for d in find(docs, "Role", "ops") if d["metadata"]["name"] == FULLNAME)
    leases = [r for r in role["rules"] if r.get("resourceNames") and r["resources"] == ["leases"]]
    assert leases[0]["resourceNames"] == [f"{FULLNAME}-unscheduled"]
    node_cfg = yaml.safe_load(named(docs, "ConfigMap", f"{FULLNAME}-node")["data"]["config.yaml"])
    assert node_cfg["leader_election"]["enabled"] is False


@pytest.mark.parametrize(("extra", "message"), [
    ({"sharding": {"enabled": True}}, "nodeSharding.enabled with sharding.enabled"),
    ({"config": {**CONFIG, "checkpoint": {"store": "file"}}}, "needs a checkpoint store that outlives a pod"),
    ({"config": {**CONFIG, "sharding": {"strategy": "node"}}}, r"config\.sharding is written by the chart"),
    ({"config": {**CONFIG, "resources": [{"resource": "configmaps"}]}}, "has no Pods entry"),
])
def test_refuses_what_cannot_work(chart: Any, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(chart, values(**extra))


def test_values_schema_checks_the_node_sharding_values(chart: Any) -> None:
    bads: list[dict[str, Any]] = [{"enabled": "yes"}, {"maxUnavailable": 0}, {"tolerations": {}},
                                  {"nodes": 3}]
    for bad in bads:
        with pytest.raises(HelmError, match="nodeSharding"):
            render(chart, {"config": CONFIG, "nodeSharding": {"enabled": True, **bad}})
    # The bridge's own options, in config: the node strategy and its fields are known to the schema.
    with pytest.raises(HelmError, match="sharding"):
        render(chart, {"config": {**CONFIG, "sharding": {"strategy": "nodes"}}})
    with pytest.raises(HelmError, match="kubernetes"):
        render(chart, {"config": {**CONFIG, "kubernetes": {"burst": "many"}}})
    docs = render(chart, {"config": {**CONFIG, "kubernetes": {"qps": 20, "burst": 40},
                                     "sharding": {"strategy": "node", "node_name": "n1"}}})
    cfg = yaml.safe_load(find(docs, "ConfigMap")[0]["data"]["config.yaml"])
    assert cfg["kubernetes"] == {"qps": 20, "burst": 40}


def test_the_leader_alert_counts_the_designated_replica_only(chart: Any) -> None:
    docs = render(chart, values(metrics={"prometheusRule": {"enabled": True}}))
    (rule,) = find(docs, "PrometheusRule")
    (no_leader,) = [r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "KubeEventBridgeNoLeader"]
    assert no_leader["expr"] == (f'(sum by (shard) (keb_leader{{namespace="ops",pod!~"{FULLNAME}-node-.*"}}) '
                                 "or on() vector(0)) != 1")


def test_lint_is_clean_in_daemonset_mode() -> None:
    report = lint(str(CHART), values(), strict=False)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_a_namespace_selector_gets_the_namespace_watch_and_its_checkpoint_named(chart: Any) -> None:
    cfg = {**CONFIG, "checkpoint": {"store": "configmap", "shards": False},
           "resources": [{"resource": "configmaps", "namespace_selector": "team=pay"}]}
    docs = render(chart, {"config": cfg})
    (cluster_role,) = find(docs, "ClusterRole")
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]} in (
        cluster_role["rules"])
    namespaces_rule = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    assert namespaces_rule in cluster_role["rules"]
    role = next(d for d in find(docs, "Role", "ops") if d["metadata"]["name"] == FULLNAME)
    names = [n for rule in role["rules"] for n in rule.get("resourceNames", [])]
    ident = informer_id("configmaps", "", "", "", "team=pay")
    assert f"{FULLNAME}-checkpoint-{ident}" in names
    # Two namespace selectors on one resource are two scopes, not a duplicate.
    two = {**cfg, "resources": [{"resource": "configmaps", "namespace_selector": "team=pay"},
                                {"resource": "configmaps", "namespace_selector": "team=web"}]}
    assert find(render(chart, {"config": two}), "ConfigMap")
    with pytest.raises(HelmError, match="name the same resource in the same scope"):
        render(chart, {"config": {**two, "resources": [two["resources"][0], two["resources"][0]]}})
    # By node, the DaemonSet's pods watch the namespaces too when their Pods entry has a selector.
    docs = render(chart, values(config={**CONFIG, "resources": [{"resource": "pods",
                                                                  "namespace_selector": "team=pay"}]}))
    node_role = next(d for d in find(docs, "ClusterRole") if d["metadata"]["name"] == f"{FULLNAME}-node")
    assert namespaces_rule in node_role["rules"]
