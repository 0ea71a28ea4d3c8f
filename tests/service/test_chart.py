"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError, lint

CHART = Path(__file__).resolve().parents[2] / "charts" / "kube-event-bridge"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def render(chart: Any, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out = chart.render(values=values or {}, name="keb", namespace="ops")
    docs: list[dict[str, Any]] = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


ADMIN_TOKEN_FILE = "/var/run/secrets/kube-event-bridge/admin-token/token"


def as_mounted(text: str, tmp_path: Path) -> str:
    """A rendered config.yaml as the pod reads it: the admin token file the chart mounts from its
    Secret stands at a temporary path holding a token."""
    token = tmp_path / "admin-token"
    token.write_text("t" * 48)
    assert ADMIN_TOKEN_FILE in text
    return text.replace(ADMIN_TOKEN_FILE, str(token))


def find(docs: list[dict[str, Any]], kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind
            and (namespace is None or d["metadata"].get("namespace") == namespace)]


def test_lint_is_clean() -> None:
    report = lint(str(CHART), strict=False)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_defaults_render_hardened_single_replica(chart: Any) -> None:
    docs = render(chart)
    (dep,) = find(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert len(spec["template"]["metadata"]["annotations"]["checksum/config"]) == 64
    assert find(docs, "PodDisruptionBudget") == []  # pointless with one replica
    assert find(docs, "ServiceMonitor") == []
    (policy,) = find(docs, "NetworkPolicy")  # only the public port is reachable
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]


def test_config_checksum_changes_with_config(chart: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        (dep,) = find(render(chart, values), "Deployment")
        return str(dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    base = checksum({})
    other = checksum({"config": {"resources": [{"resource": "configmaps"}],
                                 "sinks": [{"name": "s", "kind": "stdout"}]}})
    assert base != other


def test_rbac_is_derived_from_resources(chart: Any) -> None:
    docs = render(chart, {"config": {
        "resources": [
            {"resource": "pods"},
            {"resource": "deployments.apps", "namespace": "web"},
            {"resource": "widgets.example.com/v1"},
        ],
        "sinks": [{"name": "k", "kind": "kafka", "brokers": "kafka:9092"}],
        "checkpoint": {"store": "file"},
    }})
    (cr,) = find(docs, "ClusterRole")
    assert cr["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["list", "watch"]},
    ]
    (web_role,) = find(docs, "Role", "web")
    assert web_role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch"]},
    ]
    # Only list/watch anywhere: no get, no write verbs on watched resources.
    roles = find(docs, "ClusterRole") + find(docs, "Role")
    verbs = {v for d in roles for r in d["rules"] for v in r["verbs"]}
    assert verbs == {"list", "watch"}
    assert find(docs, "Role", "ops") == []  # no leases or configmaps needed


def test_a_selector_adds_get_to_tell_a_selector_exit_from_a_delete(chart: Any) -> None:
    """A delete of an object that left a label or field selector is told from a real delete by
    reading the object (docs/event-format.md, selector exits): such resources also get ``get``."""
    docs = render(chart, {"config": {
        "resources": [
            {"resource": "pods", "label_selector": "tier=gold"},
            {"resource": "pods", "namespace": "web"},
            {"resource": "deployments.apps", "namespace": "web", "field_selector": "metadata.name=x"},
            {"resource": "nodes"},
        ],
        "sinks": [{"name": "s", "kind": "stdout"}],
        "checkpoint": {"store": "file"},
    }})
    (cr,) = find(docs, "ClusterRole")
    assert cr["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    ]
    (web_role,) = find(docs, "Role", "web")
    assert web_role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
    ]


def test_leader_election_and_configmap_store_add_their_rules(chart: Any) -> None:
    docs = render(chart, {
        "replicaCount": 2,
        "leaderElection": {"enabled": True},
        "config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}],
                   "checkpoint": {"store": "configmap"}},
    })
    (dep,) = find(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    (pdb,) = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    (role,) = find(docs, "Role", "ops")
    rules = role["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": ["keb-kube-event-bridge"], "verbs": ["get", "update"]} in rules
    # Checkpoints live in a namespace of their own (tests/service/test_chart_checkpoint_namespace.py).
    (cp_role,) = find(docs, "Role", "ops-keb-checkpoints")
    assert any(r["resources"] == ["configmaps"] for r in cp_role["rules"])
    (cm,) = find(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["leader_election"]["enabled"] is True
    assert cfg["leader_election"]["namespace"] == "ops"
    assert cfg["checkpoint"]["namespace"] == "ops-keb-checkpoints"
    assert cfg["server"]["port"] == 8080


def test_rendered_config_is_valid_for_the_bridge(chart: Any, tmp_path: Path) -> None:
    from bridge.service.config import load_config

    docs = render(chart, {"leaderElection": {"enabled": True}, "replicaCount": 2})
    (cm,) = find(docs, "ConfigMap")
    path = tmp_path / "config.yaml"
    path.write_text(as_mounted(cm["data"]["config.yaml"], tmp_path))
    cfg = load_config(path)
    assert cfg.leader_election.enabled
    assert cfg.checkpoint.store == "configmap"


def test_several_replicas_without_leader_election_fail(chart: Any) -> None:
    with pytest.raises(HelmError, match="requires leaderElection"):
        render(chart, {"replicaCount": 3})


def test_optional_objects(chart: Any) -> None:
    docs = render(chart, {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {}}]},
        "secretMounts": [{"name": "kafka", "secretName": "kafka-creds"}],
    })
    (sm,) = find(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    (np,) = find(docs, "NetworkPolicy")
    assert np["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {}}]
    (dep,) = find(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "secret-kafka", "secret": {"secretName": "kafka-creds"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "secret-kafka", "mountPath": "/var/run/secrets/kube-event-bridge/kafka",
            "readOnly": True} in mounts


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": "two"},
        {"image": {"repository": ""}},
        {"unknownKey": 1},
        {"config": {"resources": [], "sinks": [{"name": "s", "kind": "stdout"}]}},
        {"config": {"resources": [{"resource": "Pods!"}], "sinks": [{"name": "s", "kind": "stdout"}]}},
        {"config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s"}]}},
        {"config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "x"}],
                    "checkpoint": {"store": "redis"}}},
        {"metrics": {"port": 70000}},
        {"secretMounts": [{"name": "x"}]},
    ],
)
def test_schema_rejects_bad_values(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(HelmError):
        chart.render(values=values, name="keb", namespace="ops")
