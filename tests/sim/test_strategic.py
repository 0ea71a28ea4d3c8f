"""Strategic merge patch, checked against the behaviour Kubernetes documents for it.

The cases come from "Update API Objects in Place Using kubectl patch" (containers merged by name,
tolerations replaced, ``$retainKeys`` for a Deployment's strategy) and from the strategic-merge-patch
design notes (``$patch`` replace/delete, ``$setElementOrder``, ``$deleteFromPrimitiveList``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bridge.sim.openapi import Schemas
from bridge.sim.resources import BUILTIN_RESOURCES, ResourceRegistry
from bridge.sim.status import BadRequest
from bridge.sim.strategic import strategic_merge_patch

SCHEMAS = Schemas(BUILTIN_RESOURCES)
REGISTRY = ResourceRegistry.with_builtins()


def patch(resource: str, original: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    before = copy.deepcopy(original)
    result = strategic_merge_patch(original, body, SCHEMAS, SCHEMAS.kind(REGISTRY.resolve(resource)))
    assert original == before, "the original must not be changed"
    return result


def pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "web"},
                                                             "finalizers": ["a", "b", "c"]},
            "spec": {"containers": [{"name": "web", "image": "nginx"}], **spec}}


def deployment() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "patch-demo"},
            "spec": {"replicas": 2, "strategy": {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": "25%", "maxUnavailable": "25%"}},
                     "template": {"spec": {"containers": [{"name": "patch-demo-ctr", "image": "nginx"}],
                                           "tolerations": [{"effect": "NoSchedule", "key": "dedicated",
                                                            "value": "test-team"}]}}}}


def test_containers_merge_by_name_and_tolerations_are_replaced() -> None:
    result = patch("deployments.apps", deployment(), {"spec": {"template": {"spec": {
        "containers": [{"name": "patch-demo-ctr-2", "image": "redis"}],
        "tolerations": [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]}}}})
    spec = result["spec"]["template"]["spec"]
    assert spec["containers"] == [{"name": "patch-demo-ctr", "image": "nginx"},
                                  {"name": "patch-demo-ctr-2", "image": "redis"}]
    assert spec["tolerations"] == [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]


def test_an_item_is_merged_field_by_field() -> None:
    original = pod()
    original["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    result = patch("pods", original, {"spec": {"containers": [
        {"name": "web", "env": [{"name": "B", "value": "22"}, {"name": "C", "value": "3"}]}]}})
    assert result["spec"]["containers"] == [{"name": "web", "image": "nginx", "env": [
        {"name": "A", "value": "1"}, {"name": "B", "value": "22"}, {"name": "C", "value": "3"}]}]


def test_retain_keys_drops_the_fields_not_named() -> None:
    result = patch("deployments.apps", deployment(),
                   {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}})
    assert result["spec"]["strategy"] == {"type": "Recreate"}


def test_patch_replace_and_delete_directives() -> None:
    replaced = patch("pods", pod(), {"metadata": {"labels": {"$patch": "replace", "only": "this"}}})
    assert replaced["metadata"]["labels"] == {"only": "this"}
    two = pod()
    two["spec"]["containers"].append({"name": "side", "image": "busybox"})
    deleted = patch("pods", two, {"spec": {"containers": [{"name": "web", "$patch": "delete"}]}})
    assert deleted["spec"]["containers"] == [{"name": "side", "image": "busybox"}]
    whole = patch("pods", two, {"spec": {"containers": [{"name": "only", "image": "x"},
                                                         {"$patch": "replace"}]}})
    assert whole["spec"]["containers"] == [{"name": "only", "image": "x"}]
    emptied = patch("pods", pod(securityContext={"runAsUser": 1}), {"spec": {"securityContext": {
        "$patch": "delete"}}})
    assert emptied["spec"]["securityContext"] == {}


def test_set_element_order_orders_the_merged_list() -> None:
    original = pod()
    original["spec"]["containers"] = [{"name": n, "image": "i"} for n in ("a", "b", "c")]
    result = patch("pods", original, {"spec": {
        "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
        "containers": [{"name": "a", "image": "new"}]}})
    assert result["spec"]["containers"] == [{"name": "c", "image": "i"}, {"name": "a", "image": "new"},
                                            {"name": "b", "image": "i"}]
    # an item the order does not name (the server added it) keeps its place among the others
    original["spec"]["containers"].insert(1, {"name": "server", "image": "s"})
    dropped = patch("pods", original, {"spec": {
        "$setElementOrder/containers": [{"name": "a"}, {"name": "c"}],
        "containers": [{"name": "b", "$patch": "delete"}]}})
    assert [c["name"] for c in dropped["spec"]["containers"]] == ["a", "server", "c"]
    assert "$setElementOrder/containers" not in dropped["spec"]


def test_primitive_lists_merge_as_sets_and_delete_from_primitive_list() -> None:
    merged = patch("pods", pod(), {"metadata": {"finalizers": ["c", "d"]}})
    assert merged["metadata"]["finalizers"] == ["a", "b", "c", "d"]
    removed = patch("pods", pod(), {"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}})
    assert removed["metadata"]["finalizers"] == ["a", "c"]
    # a list of scalars without a merge strategy is replaced whole
    args = pod()
    args["spec"]["containers"][0]["args"] = ["--a", "--b"]
    replaced = patch("pods", args, {"spec": {"containers": [{"name": "web", "args": ["--c"]}]}})
    assert replaced["spec"]["containers"][0]["args"] == ["--c"]


def test_null_removes_and_fields_without_a_schema_replace_lists() -> None:
    result = patch("pods", pod(), {"metadata": {"labels": {"app": None}},
                                   "spec": {"unknownList": [1, 2], "containers": [{"name": "web",
                                                                                   "image": None}]}})
    assert result["metadata"]["labels"] == {}
    assert result["spec"]["containers"] == [{"name": "web"}]
    again = patch("pods", result, {"spec": {"unknownList": [3]}})
    assert again["spec"]["unknownList"] == [3]


def test_new_fields_carry_no_directive() -> None:
    result = patch("pods", pod(), {"spec": {"initContainers": [{"name": "init", "image": "x", "env": [
        {"name": "Z", "value": "1"}], "$setElementOrder/env": [{"name": "Z"}]}]}})
    assert result["spec"]["initContainers"] == [{"name": "init", "image": "x", "env": [{"name": "Z",
                                                                                          "value": "1"}]}]


def test_malformed_patches_are_bad_requests() -> None:
    with pytest.raises(BadRequest, match="merge key: name"):
        patch("pods", pod(), {"spec": {"containers": [{"image": "no-name"}]}})
    with pytest.raises(BadRequest, match="unknown patch type"):
        patch("pods", pod(), {"metadata": {"labels": {"$patch": "explode"}}})
