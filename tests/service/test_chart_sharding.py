"""The chart's StatefulSet mode (sharding.enabled), rendered by the real Helm engine (helm-python-sdk):
the StatefulSet and its headless Service, automatic sharding in the configuration, the one RBAC rule
it needs, the shard alerts, and the combinations it refuses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError, lint

from bridge.service.config import load_config
from bridge.service.sharding_auto import pod_ordinal
from tests.service.test_chart import CHART, as_mounted, find, render

SHARDED: dict[str, Any] = {"sharding": {"enabled": True, "shards": 3}}
FULLNAME = "keb-kube-event-bridge"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def values(**extra: Any) -> dict[str, Any]:
    return {**SHARDED, **extra}


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container["env"]}


def test_statefulset_mode_runs_one_pod_per_shard(chart: Any) -> None:
    docs = render(chart, values())
    assert find(docs, "Deployment") == []
    (sts,) = find(docs, "StatefulSet")
    assert sts["metadata"]["name"] == FULLNAME
    spec = sts["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert "volumeClaimTemplates" not in spec
    pod = spec["template"]["spec"]
    env = env_of(pod)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The total is part of the pod template: changing it restarts every shard.
    assert spec["template"]["metadata"]["annotations"]["kube-event-bridge.io/total-shards"] == "3"
    assert {"name": "state", "emptyDir": {}} in pod["volumes"]
    # Shards are spread over nodes and zones, as the active/standby pair is.
    assert [s["topologyKey"] for s in pod["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    assert "podAntiAffinity" in pod["affinity"]
    # The hardened pod of the Deployment, unchanged.
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"

    (headless,) = [s for s in find(docs, "Service") if s["spec"].get("clusterIP") == "None"]
    assert headless["metadata"]["name"] == spec["serviceName"] == f"{FULLNAME}-shards"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == spec["selector"]["matchLabels"]
    (pdb,) = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_total_shards_annotation_follows_the_value(chart: Any) -> None:
    (sts,) = find(render(chart, {"sharding": {"enabled": True, "shards": 5}}), "StatefulSet")
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["template"]["metadata"]["annotations"]["kube-event-bridge.io/total-shards"] == "5"


def test_one_shard_has_no_spread_and_no_pdb(chart: Any) -> None:
    docs = render(chart, {"sharding": {"enabled": True, "shards": 1}})
    (sts,) = find(docs, "StatefulSet")
    assert "topologySpreadConstraints" not in sts["spec"]["template"]["spec"]
    assert find(docs, "PodDisruptionBudget") == []


def test_persistence_gives_each_shard_its_own_volume(chart: Any) -> None:
    docs = render(chart, values(sharding={"enabled": True, "shards": 2, "persistence": {
        "enabled": True, "size": "5Gi", "storageClassName": "fast"}}))
    (sts,) = find(docs, "StatefulSet")
    spec = sts["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "5Gi"}}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    pod = spec["template"]["spec"]
    assert all(v["name"] != "state" for v in pod["volumes"])  # the claim provides it
    (container,) = pod["containers"]
    assert {"name": "state", "mountPath": "/var/lib/kube-event-bridge"} in container["volumeMounts"]


def test_configuration_asks_for_automatic_sharding_of_its_own_statefulset(
        chart: Any, tmp_path: Path) -> None:
    docs = render(chart, values(sharding={"enabled": True, "shards": 3, "strategy": "resource"}))
    (cm,) = find(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    (sts,) = find(docs, "StatefulSet")
    assert cfg["sharding"] == {"shards": "auto", "ordinal": "auto", "strategy": "resource",
                               "statefulset": sts["metadata"]["name"], "namespace": "ops"}
    # The StatefulSet's pods are <statefulset>-<n>: what automatic sharding reads its ordinal from.
    assert pod_ordinal(f"{sts['metadata']['name']}-2") == (sts["metadata"]["name"], 2)
    # The rendered configuration, sharding section included, is valid for the bridge.
    path = tmp_path / "config.yaml"
    path.write_text(as_mounted(yaml.safe_dump(cfg), tmp_path))
    loaded = load_config(path)
    assert loaded.checkpoint.store == "configmap"
    assert (loaded.sharding.shards, loaded.sharding.ordinal) == ("auto", "auto")
    assert loaded.sharding.strategy == "resource"
    assert (loaded.sharding.statefulset, loaded.sharding.namespace) == (sts["metadata"]["name"], "ops")


def test_rbac_reads_only_its_own_statefulset(chart: Any) -> None:
    docs = render(chart, values())
    (role,) = find(docs, "Role", namespace="ops")
    sts_rules = [r for r in role["rules"] if "statefulsets" in r["resources"]]
    assert sts_rules == [{"apiGroups": ["apps"], "resources": ["statefulsets"],
                          "resourceNames": [FULLNAME], "verbs": ["get"]}]
    for cluster_role in find(docs, "ClusterRole"):
        assert all("statefulsets" not in r["resources"] for r in cluster_role["rules"])
    # Checkpoints of every shard, past and present, are read and cleaned up by the shards.
    # Exactly the verbs the ConfigMap store calls (bridge/storage/checkpoint_configmap.py): create
    # (manifests, journals, chunks), get (load, peek), list (the take-over's informer_ids, orphan
    # chunks), update (replace of a manifest or journal), delete (clean-up of earlier totals); no patch.
    (cp_role,) = find(docs, "Role", namespace="ops-keb-checkpoints")
    cm_rules = [r for r in cp_role["rules"] if r["resources"] == ["configmaps"]]
    assert cm_rules == [{"apiGroups": [""], "resources": ["configmaps"],
                         "verbs": ["create", "get", "list", "update", "delete"]}]
    (binding,) = find(docs, "RoleBinding", namespace="ops")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == FULLNAME
    # Without sharding, no such rule.
    unsharded = render(chart)
    assert all("statefulsets" not in r["resources"]
               for d in find(unsharded, "Role") + find(unsharded, "ClusterRole") for r in d["rules"])


def test_rbac_with_the_nats_kv_store_is_the_statefulset_rule_alone(chart: Any) -> None:
    docs = render(chart, values(config={
        "resources": [{"resource": "pods", "namespace": "web"}],
        "sinks": [{"name": "s", "kind": "stdout"}],
        "checkpoint": {"store": "nats-kv", "nats_url": "nats://nats:4222"}}))
    (role,) = find(docs, "Role", namespace="ops")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["statefulsets"],
                              "resourceNames": [FULLNAME], "verbs": ["get"]}]
    (watch,) = find(docs, "Role", namespace="web")
    assert all(r["resources"] != ["statefulsets"] for r in watch["rules"])


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = find(docs, "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_prometheus_rule_alerts_on_mismatched_totals_and_missing_shards(chart: Any) -> None:
    monitoring = {"prometheusRule": {"enabled": True}}
    sharded = alerts(render(chart, values(metrics=monitoring)))
    assert "KubeEventBridgeNoLeader" not in sharded  # N shards run N pipelines, by design
    assert sharded["KubeEventBridgeShardTotalsMismatch"]["expr"] == \
        'stdvar(keb_total_shards{namespace="ops"}) != 0'
    missing = sharded["KubeEventBridgeShardMissing"]["expr"]
    assert missing.splitlines() == [
        '(2 ^ max(keb_total_shards{namespace="ops"}) - 1 - '
        'sum(2 ^ max by (shard) (keb_shard_ordinal{namespace="ops"}))) != 0',
        'or absent(keb_shard_ordinal{namespace="ops"})',
    ]
    assert sharded["KubeEventBridgeShardNotRunning"]["expr"] == \
        'sum by (shard) (keb_leader{namespace="ops"}) != 1'
    assert {"KubeEventBridgeSinkDown", "KubeEventBridgeCheckpointStale"} <= set(sharded)

    single = alerts(render(chart, {"metrics": monitoring}))
    assert "KubeEventBridgeNoLeader" in single
    assert not {a for a in single if "Shard" in a}


def test_missing_shard_expression_counts_every_ordinal() -> None:
    # The arithmetic of KubeEventBridgeShardMissing in Prometheus' float64, in its order of
    # evaluation: zero with every shard present, non-zero with any one missing, up to 53 shards.
    def missing(total: int, ordinals: set[int]) -> float:
        present = 0.0
        for o in sorted(ordinals):
            present += 2.0 ** o
        return float(2.0 ** total - 1.0 - present)

    for total in range(1, 54):
        assert missing(total, set(range(total))) == 0, total
        for gone in range(total):
            assert missing(total, set(range(total)) - {gone}) != 0, (total, gone)
        assert missing(total, set(range(total + 1))) != 0, total  # a shard beyond the total


@pytest.mark.parametrize(("extra", "message"), [
    ({"replicaCount": 2}, "leave replicaCount at 1"),
    ({"leaderElection": {"enabled": True}}, r"no per-shard standby\. A StatefulSet runs one pod per ordinal"),
    ({"config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}],
                 "checkpoint": {"store": "file"}}}, "needs a shared checkpoint store"),
    ({"fullnameOverride": "b" * 53}, "longer than 52 characters"),
])
def test_refuses_what_cannot_work(chart: Any, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(chart, values(**extra))


def test_values_schema_checks_the_sharding_values(chart: Any) -> None:
    for bad in ({"shards": 0}, {"strategy": "random"}, {"shard": 1}):
        with pytest.raises(HelmError, match="sharding"):
            render(chart, {"sharding": {"enabled": True, **bad}})


def test_config_sharding_is_the_charts_in_statefulset_mode(chart: Any) -> None:
    cfg = {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}],
           "checkpoint": {"store": "configmap"}}
    with pytest.raises(HelmError, match=r"config\.sharding is written by the chart"):
        render(chart, values(config={**cfg, "sharding": {"shards": 4}}))
    # A Deployment has no ordinal in its pod names nor a StatefulSet to read.
    with pytest.raises(HelmError, match="a Deployment has neither"):
        render(chart, {"config": {**cfg, "sharding": {"shards": "auto", "ordinal": 0}}})
    with pytest.raises(HelmError, match="a Deployment has neither"):
        render(chart, {"config": {**cfg, "sharding": {"shards": 3, "ordinal": "auto"}}})
    # Fixed numbers (one release per shard) are the user's to choose.
    docs = render(chart, {"config": {**cfg, "sharding": {"shards": 3, "ordinal": 1}}})
    (cm,) = find(docs, "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"])["sharding"] == {"shards": 3, "ordinal": 1}


def test_lint_is_clean_in_statefulset_mode() -> None:
    report = lint(str(CHART), values(metrics={"prometheusRule": {"enabled": True}}), strict=False)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_notes_explain_the_shards(chart: Any) -> None:
    notes = chart.render(values=values(), name="keb", namespace="ops")
    text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
    assert "Sharded: 3 shards (by object)" in text
    assert "scale the\nStatefulSet to 0 first" in text
    assert f"kubectl -n ops port-forward pod/{FULLNAME}-0" in text
    assert "deploy/" not in text


def _documented_shard_alerts() -> dict[str, dict[str, Any]]:
    text = (CHART.parents[1] / "docs" / "operations.md").read_text()
    section = text[text.index("## Sharding across a StatefulSet"):]
    block = re.search(r"```yaml\n(groups:.*?)```", section, re.S)
    assert block
    (group,) = yaml.safe_load(block.group(1))["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_prometheus_rule_carries_the_documented_shard_alerts(chart: Any) -> None:
    rendered = alerts(render(chart, values(metrics={"prometheusRule": {
        "enabled": True, "additionalLabels": {"severity": "page"}}})))
    unsharded = alerts(render(chart, {"metrics": {"prometheusRule": {"enabled": True}}}))
    documented = _documented_shard_alerts()
    # The shard alerts replace KubeEventBridgeNoLeader; the others are unchanged.
    assert rendered.keys() == (unsharded.keys() - {"KubeEventBridgeNoLeader"}) | documented.keys()
    for name, doc in documented.items():
        got = rendered[name]
        expr = got["expr"].replace('{namespace="ops"}', "")
        assert expr == doc["expr"], name
        assert 'namespace="ops"' in got["expr"]
        assert got.get("for") == doc.get("for"), name
        assert got["annotations"] == doc["annotations"], name
        assert got["labels"] == {"severity": "page"}


FIXED_SHARD = {"resources": [{"resource": "pods", "namespace": "web"}],
               "sinks": [{"name": "s", "kind": "stdout"}],
               "checkpoint": {"store": "configmap"}, "sharding": {"shards": 3, "ordinal": 1}}


def test_rbac_of_a_release_per_shard_covers_its_sharded_checkpoints(chart: Any) -> None:
    # One release per shard (fixed numbers, a Deployment): its checkpoint ids are
    # <informer id>.shard-<o>-of-<N> and a take-over lists and reads the other shards' (and earlier
    # totals'): the Role cannot name them, as in the StatefulSet mode.
    (role,) = find(render(chart, {"config": FIXED_SHARD}), "Role", namespace="ops-keb-checkpoints")
    cm_rules = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
    assert cm_rules == [{"apiGroups": [""], "resources": ["configmaps"],
                         "verbs": ["create", "get", "list", "update", "delete"]}]
    assert all("statefulsets" not in r["resources"] for r in role["rules"])  # no automatic sharding


def test_leader_election_of_a_release_per_shard_names_its_shards_lease(chart: Any) -> None:
    # Sharded, shard o campaigns for the Lease <name>-shard-<o> (bridge/service/service.py): the
    # Role must name that one, not the unsharded Lease.
    docs = render(chart, {"config": FIXED_SHARD, "leaderElection": {"enabled": True}})
    (role,) = find(docs, "Role", namespace="ops")
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [f"{FULLNAME}-shard-1"], "verbs": ["get", "update"]} in lease_rules
    (cm,) = find(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["leader_election"]["name"] == FULLNAME  # the bridge appends -shard-<o> itself
