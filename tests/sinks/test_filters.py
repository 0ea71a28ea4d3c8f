"""Routing (resources, namespaces, labels, event types) and the change filter."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.labels import parse_label_selector
from sinks.contract import EventType, SnapshotInfo
from sinks.filters import ChangeFilter, RoutingFilter, changed_paths, parse_path
from tests.sinks import DEPLOYMENTS, NODES, PODS, event, marker, obj


def test_parse_path() -> None:
    assert parse_path("spec.template.spec") == ("spec", "template", "spec")
    assert parse_path('metadata.annotations["kubectl.kubernetes.io/last-applied"]') == (
        "metadata",
        "annotations",
        "kubectl.kubernetes.io/last-applied",
    )
    assert parse_path("data.*") == ("data", "*")
    assert parse_path("a['b.c'].d") == ("a", "b.c", "d")
    for bad in ("", "a.", "a..b", 'a["b'):
        with pytest.raises(ValueError, match="path"):
            parse_path(bad)


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("app in (web, api)", {"app": "api"}, True),
        ("app in (web,api)", {"app": "db"}, False),
        ("app notin (web)", {"app": "db"}, True),
        ("app notin (web)", {}, True),
        ("tier", {"tier": ""}, True),
        ("tier", {}, False),
        ("!tier", {}, True),
        ("app=web,tier in (fe),!canary", {"app": "web", "tier": "fe"}, True),
        ("app=web,tier in (fe),!canary", {"app": "web", "tier": "fe", "canary": "1"}, False),
        ("app=", {"app": ""}, True),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["app in web", "a=b=c", "=x", "app in (a", ","])
def test_label_selector_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="found "):
        parse_label_selector(bad)


def test_routing_matches_labels_as_the_api_server_does() -> None:
    """The sinks' routing uses the project's one label-selector implementation (bridge.labels):
    apimachinery's operators, key validation and messages."""
    f = RoutingFilter(label_selector="tier in (web),generation>2")
    assert f.accepts(event(EventType.ADDED, obj("a", labels={"tier": "web", "generation": "3"})))
    assert not f.accepts(event(EventType.ADDED, obj("b", labels={"tier": "web", "generation": "2"})))
    with pytest.raises(ValueError, match=r"name part must consist of alphanumeric characters"):
        RoutingFilter(label_selector="-team=payments")


def test_routing_resources_namespaces_types() -> None:
    f = RoutingFilter(resources=["pods", "deployments.apps"], exclude_namespaces=["kube-system"])
    assert f.accepts(event(EventType.ADDED, obj("a")))
    assert f.accepts(event(EventType.ADDED, obj("d"), resource=DEPLOYMENTS))
    assert not f.accepts(event(EventType.ADDED, obj("n", namespace=None), resource=NODES))
    assert not f.accepts(event(EventType.ADDED, obj("a", namespace="kube-system")))
    only = RoutingFilter(namespaces=["shop"], event_types=["added", "deleted"])
    assert only.accepts(event(EventType.DELETED, obj("a", namespace="shop")))
    assert not only.accepts(event(EventType.UPDATED, obj("a", namespace="shop")))
    assert not only.accepts(event(EventType.ADDED, obj("a", namespace="other")))
    assert not only.accepts(event(EventType.ADDED, obj("n", namespace=None), resource=NODES))
    wrong_group = RoutingFilter(resources=["deployments.extensions"])
    assert not wrong_group.accepts(event(EventType.ADDED, resource=DEPLOYMENTS))


def test_markers_ignore_object_rules() -> None:
    f = RoutingFilter(resources=["pods"], namespaces=["shop"], label_selector="app=web")
    snap = SnapshotInfo(id="s", resource_version="1")
    assert f.accepts(marker(EventType.SNAPSHOT_BEGIN, snap, PODS))
    assert not f.accepts(marker(EventType.SNAPSHOT_BEGIN, snap, NODES))
    assert not RoutingFilter(event_types=["added"]).accepts(marker(EventType.SNAPSHOT_END, snap))


def _pod(rv: str, **changes: Any) -> dict[str, Any]:
    base = obj("a", rv=rv, labels={"app": "web"}, spec={"replicas": 1}, status={"phase": "Running"})
    base["metadata"]["managedFields"] = [{"manager": "kubectl", "time": rv}]
    base.update(changes)
    return base


def test_changed_paths() -> None:
    old = _pod("1")
    new = _pod("2", status={"phase": "Failed"})
    assert sorted(changed_paths(old, new)) == [
        ("metadata", "managedFields"),
        ("metadata", "resourceVersion"),
        ("status", "phase"),
    ]
    assert list(changed_paths({"a": 1}, {"b": 1})) == [("b",), ("a",)]


def test_change_filter_default_ignores_bookkeeping_only() -> None:
    default = ChangeFilter(ignore_paths=["metadata.resourceVersion", "metadata.managedFields"])
    assert not default.interesting(_pod("1"), _pod("2"))
    assert default.interesting(_pod("1"), _pod("2", status={"phase": "Failed"}))
    assert default.interesting(None, _pod("2"))


def test_change_filter_ignore_status_and_only_paths() -> None:
    no_status = ChangeFilter(ignore_paths=["metadata.resourceVersion", "metadata.managedFields", "status"])
    assert not no_status.interesting(_pod("1"), _pod("2", status={"phase": "Failed"}))
    assert no_status.interesting(_pod("1"), _pod("2", spec={"replicas": 3}))
    labels_only = ChangeFilter(only_paths=["metadata.labels", "spec.*"])
    assert not labels_only.interesting(_pod("1"), _pod("2", status={"phase": "Failed"}))
    assert labels_only.interesting(_pod("1"), _pod("2", spec={"replicas": 2}))
    relabelled = _pod("2")
    relabelled["metadata"]["labels"] = {"app": "api"}
    assert labels_only.interesting(_pod("1"), relabelled)
    # A whole subtree appearing counts as touching the paths below it.
    assert labels_only.interesting({"metadata": {}}, {"metadata": {"labels": {"x": "y"}}})
    assert ChangeFilter(only_paths=["spec.replicas"]).interesting({"a": 1}, {"a": 1, "spec": {"replicas": 2}})
