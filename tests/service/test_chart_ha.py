"""The chart's active/standby mode, rendered by the real Helm engine (helm-python-sdk)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helm_python import Chart, HelmError

from tests.service.test_chart import CHART, find, render

HA = {"replicaCount": 2, "leaderElection": {"enabled": True}}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def test_ha_spreads_the_replicas_and_limits_disruption(chart: Any) -> None:
    docs = render(chart, HA)
    (dep,) = find(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    # A new pod (the standby-to-be) is up before an old one goes: never both down.
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = spec["template"]["spec"]
    selector = {"matchLabels": {"app.kubernetes.io/name": "kube-event-bridge",
                                "app.kubernetes.io/instance": "keb"}}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
    spread = pod["topologySpreadConstraints"]
    assert [(s["topologyKey"], s["maxSkew"], s["whenUnsatisfiable"]) for s in spread] == [
        ("topology.kubernetes.io/zone", 1, "ScheduleAnyway"),
        ("kubernetes.io/hostname", 1, "ScheduleAnyway"),
    ]
    assert all(s["labelSelector"] == selector for s in spread)
    (pdb,) = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == selector


def test_a_given_affinity_replaces_the_default_one(chart: Any) -> None:
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}]}}}
    (dep,) = find(render(chart, {**HA, "affinity": mine}), "Deployment")
    assert dep["spec"]["template"]["spec"]["affinity"] == mine


def test_single_replica_has_no_spread_and_no_pdb(chart: Any) -> None:
    docs = render(chart)
    (dep,) = find(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert "affinity" not in pod
    assert "topologySpreadConstraints" not in pod
    assert find(docs, "PodDisruptionBudget") == []


def test_ha_refuses_a_per_pod_file_checkpoint(chart: Any) -> None:
    with pytest.raises(HelmError, match="checkpoint"):
        render(chart, {**HA, "config": {"resources": [{"resource": "pods"}],
                                         "sinks": [{"name": "s", "kind": "stdout"}],
                                         "checkpoint": {"store": "file"}}})


def test_shutdown_must_fit_in_the_grace_period(chart: Any) -> None:
    with pytest.raises(HelmError, match="terminationGracePeriodSeconds"):
        render(chart, {"terminationGracePeriodSeconds": 20})  # config.shutdown_deadline is 25


def test_notes_explain_active_standby(chart: Any) -> None:
    notes = chart.render(values=HA, name="keb", namespace="ops")
    text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
    assert "active/standby" in text
    assert "kubectl -n ops get lease keb-kube-event-bridge" in text
