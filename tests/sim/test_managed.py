"""Field ownership and server-side apply in the store: what each manager owns after each write."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.sim import ObjectStore
from bridge.sim.managed import FieldOwner, from_fields_v1, to_fields_v1
from bridge.sim.status import Conflict

ME = FieldOwner(manager="me", api_version="apps/v1")
YOU = FieldOwner(manager="you", api_version="apps/v1")


def deployment(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}}}
    base.update(spec)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": base}


def owned(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["manager"], m["operation"]): m["fieldsV1"] for m in obj["metadata"].get("managedFields", [])}


def test_fields_v1_round_trip() -> None:
    paths = {("f:spec", "f:replicas"), ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}'),
             ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}', "f:image"),
             ("f:metadata", "f:finalizers", 'v:"x"')}
    tree = to_fields_v1(paths)
    item = tree["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"web"}']
    assert item == {".": {}, "f:image": {}}
    assert tree["f:metadata"] == {"f:finalizers": {'v:"x"': {}}}
    assert from_fields_v1(tree) == paths


def test_apply_creates_then_owns_list_items_by_key() -> None:
    store = ObjectStore()
    created = store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME)
    fields = owned(created)[("me", "Apply")]
    assert fields["f:spec"]["f:replicas"] == {}
    assert fields["f:spec"]["f:selector"] == {}  # a LabelSelector is atomic
    assert fields["f:spec"]["f:template"]["f:spec"]["f:containers"] == {
        'k:{"name":"web"}': {".": {}, "f:name": {}, "f:image": {}}}
    assert created["metadata"]["generation"] == 1


def test_update_takes_the_fields_it_changes_from_the_appliers() -> None:
    store = ObjectStore()
    store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME)
    changed = store.patch("deployments.apps", "web", {"spec": {"replicas": 3}}, namespace="default",
                          owner=YOU)
    assert owned(changed)[("you", "Update")] == {"f:spec": {"f:replicas": {}}}
    assert "f:replicas" not in owned(changed)[("me", "Apply")]["f:spec"]
    # the applier may now take it back only by force
    with pytest.raises(Conflict) as clash:
        store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME)
    assert clash.value.message == \
        'Apply failed with 1 conflict: conflict with "you" using apps/v1: .spec.replicas'
    back = store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME, force=True)
    assert back["spec"]["replicas"] == 1
    assert ("you", "Update") not in owned(back)


def test_apply_merges_items_and_removes_what_it_no_longer_applies() -> None:
    store = ObjectStore()
    two = deployment()
    two["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "busybox"})
    store.apply("deployments.apps", "web", two, namespace="default", owner=ME)
    # another manager adds an env entry to the first container
    store.patch("deployments.apps", "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "web", "env": [{"name": "A", "value": "1"}]}]}}}}, namespace="default",
                patch_type="application/strategic-merge-patch+json", owner=YOU)
    # the applier drops the sidecar: it goes; the other manager's env entry stays
    after = store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME)
    assert after["spec"]["template"]["spec"]["containers"] == [
        {"name": "web", "image": "nginx:1", "env": [{"name": "A", "value": "1"}]}]


def test_dry_run_apply_stores_nothing() -> None:
    store = ObjectStore()
    rv = store.resource_version
    result = store.apply("deployments.apps", "web", deployment(), namespace="default", owner=ME, dry_run=True)
    assert result["metadata"]["name"] == "web"
    assert store.resource_version == rv
    assert store.list("deployments.apps") == []
