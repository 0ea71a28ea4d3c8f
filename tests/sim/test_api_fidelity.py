"""The parts of kube-apiserver's contract kubectl and other clients lean on, over raw HTTP.

Aggregated discovery, OpenAPI v2/v3, Table responses, the scale subresource, SelfSubjectAccessReview,
dry runs, namespace existence, field-selector and field validation, server-side apply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.sim import Simulator
from bridge.sim.openapi_proto import PROTOBUF_V2, encode_document

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
AGGREGATED = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
              "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json")
WIDGETS = {"group": "example.com", "version": "v1", "plural": "widgets", "kind": "Widget",
           "schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
               "size": {"type": "integer"}}}}}}
DEPLOY: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment",
          "metadata": {"name": "web", "labels": {"app": "web"}},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                   "template": {"metadata": {"labels": {"app": "web"}},
                                "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}


@pytest.fixture
async def env() -> AsyncIterator[tuple[Simulator, aiohttp.ClientSession]]:
    async with Simulator(crds=[WIDGETS], forbidden=[("", "secrets")]) as sim, aiohttp.ClientSession(
            base_url=sim.url) as http:
        yield sim, http


async def _json(resp: aiohttp.ClientResponse) -> Any:
    return await resp.json(content_type=None)


async def test_aggregated_discovery(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _, http = env
    resp = await http.get("/apis", headers={"Accept": AGGREGATED})
    assert resp.headers["Content-Type"] == \
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    body = await _json(resp)
    assert body["kind"] == "APIGroupDiscoveryList"
    assert body["apiVersion"] == "apidiscovery.k8s.io/v2"
    groups = {g["metadata"]["name"]: g for g in body["items"]}
    apps = {r["resource"]: r for r in groups["apps"]["versions"][0]["resources"]}
    assert apps["deployments"]["categories"] == ["all"]
    assert apps["deployments"]["scope"] == "Namespaced"
    assert apps["deployments"]["responseKind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert apps["deployments"]["subresources"] == [
        {"subresource": "scale", "verbs": ["get", "patch", "update"],
         "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}},
        {"subresource": "status", "verbs": ["get", "patch", "update"],
         "responseKind": {"group": "apps", "version": "v1", "kind": "Deployment"}}]
    assert "widgets" in {r["resource"] for r in groups["example.com"]["versions"][0]["resources"]}
    core = await _json(await http.get("/api", headers={"Accept": AGGREGATED}))
    pods = {r["resource"]: r for r in core["items"][0]["versions"][0]["resources"]}["pods"]
    assert pods["shortNames"] == ["po"]
    assert pods["categories"] == ["all"]
    assert (await _json(await http.get("/apis")))["kind"] == "APIGroupList"  # without the Accept


async def test_openapi_v2_and_v3(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _, http = env
    v2 = await _json(await http.get("/openapi/v2"))
    defs = v2["definitions"]
    containers = defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert containers["x-kubernetes-patch-strategy"] == "merge"
    assert containers["items"] == {"$ref": "#/definitions/io.k8s.api.core.v1.Container"}
    assert defs["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "kind": "Deployment", "version": "v1"}]
    assert defs["com.example.v1.Widget"]["properties"]["spec"]["properties"]["size"] == {"type": "integer"}
    patch_op = v2["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert "fieldValidation" in {p["name"] for p in patch_op["parameters"]}

    index = await _json(await http.get("/openapi/v3"))
    url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/apps/v1?hash=")
    doc = await _json(await http.get(url))
    schemas = doc["components"]["schemas"]
    assert schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["template"]["$ref"] == \
        "#/components/schemas/io.k8s.api.core.v1.PodTemplateSpec"
    assert "io.k8s.api.autoscaling.v1.Scale" in schemas
    assert "io.k8s.api.core.v1.ConfigMap" not in schemas  # only what apps/v1 reaches
    assert (await http.get("/openapi/v3/apis/nope/v1")).status == 404


async def test_tables_for_get_list_and_watch(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    sim, http = env
    sim.store.create("configmaps", {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}},
                     namespace="default")
    listed = await _json(await http.get("/api/v1/namespaces/default/configmaps", headers={"Accept": TABLE}))
    assert listed["kind"] == "Table"
    assert listed["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in listed["columnDefinitions"]] == ["Name", "Data", "Age"]
    assert listed["rows"][0]["cells"][:2] == ["c", 2]
    assert listed["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert listed["metadata"]["resourceVersion"] == str(sim.store.resource_version)
    full = await _json(await http.get("/api/v1/namespaces/default/configmaps/c", headers={"Accept": TABLE},
                                      params={"includeObject": "Object"}))
    assert full["rows"][0]["object"]["data"] == {"a": "1", "b": "2"}
    plain = await _json(await http.get("/api/v1/namespaces/default/configmaps/c"))
    assert plain["kind"] == "ConfigMap"
    async with http.get("/api/v1/namespaces/default/configmaps", headers={"Accept": TABLE},
                        params={"watch": "1", "timeoutSeconds": "1"}) as watch:
        line = await watch.content.readline()
    event = orjson.loads(line)
    assert event["type"] == "ADDED"
    assert event["object"]["kind"] == "Table"
    assert event["object"]["rows"][0]["cells"][0] == "c"


async def test_scale_subresource(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    sim, http = env
    sim.store.create("deployments.apps", DEPLOY, namespace="default")
    path = "/apis/apps/v1/namespaces/default/deployments/web/scale"
    scale = await _json(await http.get(path))
    assert scale["kind"] == "Scale"
    assert scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 0, "selector": "app=web"}
    scale["spec"]["replicas"] = 7
    resp = await http.put(path, json=scale)
    assert resp.status == 200
    assert (await _json(resp))["spec"]["replicas"] == 7
    assert sim.store.get("deployments.apps", "web", namespace="default")["spec"]["replicas"] == 7
    stale = await http.put(path, json=scale)  # the resourceVersion it carries is now old
    assert stale.status == 409
    negative = await http.patch(path, json={"spec": {"replicas": -1}},
                                headers={"Content-Type": "application/merge-patch+json"})
    assert negative.status == 422
    assert (await http.get("/api/v1/namespaces/default/configmaps/x/scale")).status == 404


async def test_self_subject_access_review(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _, http = env

    async def allowed(resource: str, group: str = "") -> bool:
        resp = await http.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": resource, "group": group,
                                            "namespace": "default"}}})
        assert resp.status == 201
        return bool((await _json(resp))["status"]["allowed"])

    assert await allowed("pods")
    assert await allowed("deployments", "apps")
    assert not await allowed("secrets")


async def test_dry_run_persists_nothing(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    sim, http = env
    store = sim.store
    rv = store.resource_version
    resp = await http.post("/apis/apps/v1/namespaces/default/deployments", json=DEPLOY,
                           params={"dryRun": "All"})
    assert resp.status == 201
    body = await _json(resp)
    assert body["metadata"]["name"] == "web"
    assert "resourceVersion" not in body["metadata"]
    assert store.resource_version == rv
    assert store.list("deployments.apps") == []
    store.create("deployments.apps", DEPLOY, namespace="default")
    rv = store.resource_version
    item = "/apis/apps/v1/namespaces/default/deployments/web"
    patched = await http.patch(item, json={"spec": {"replicas": 9}}, params={"dryRun": "All"},
                               headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status == 200
    assert (await _json(patched))["spec"]["replicas"] == 9
    deleted = await http.delete(item, params={"dryRun": "All"})
    assert deleted.status == 200
    assert store.resource_version == rv
    assert store.get("deployments.apps", "web", namespace="default")["spec"]["replicas"] == 2
    bad = await http.delete("/apis/apps/v1/namespaces/default/deployments/web", params={"dryRun": "Some"})
    assert bad.status == 422


async def test_namespace_must_exist_and_generation_only_with_a_spec(
        env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _sim, http = env
    resp = await http.post("/api/v1/namespaces/ghost/configmaps", json={"metadata": {"name": "c"}})
    assert resp.status == 404
    body = await _json(resp)
    assert body["reason"] == "NotFound"
    assert body["message"] == 'namespaces "ghost" not found'
    assert body["details"] == {"name": "ghost", "kind": "namespaces"}
    created = await _json(await http.post("/api/v1/namespaces/default/configmaps",
                                          json={"metadata": {"name": "c"}, "data": {"a": "1"}}))
    assert "generation" not in created["metadata"]
    deployed = await _json(await http.post("/apis/apps/v1/namespaces/default/deployments", json=DEPLOY))
    assert deployed["metadata"]["generation"] == 1
    assert deployed["metadata"]["managedFields"][0]["manager"] == "Python"  # the user agent, to its "/"


async def test_field_selectors_are_validated_per_kind(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _, http = env
    ok = await http.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1,status.phase=Running"})
    assert ok.status == 200
    bad = await http.get("/api/v1/pods", params={"fieldSelector": "spec.image=nginx"})
    assert bad.status == 400
    assert (await _json(bad))["message"] == "field label not supported: spec.image"
    cm = await http.get("/api/v1/configmaps", params={"fieldSelector": "status.phase=Running", "watch": "1"})
    assert cm.status == 400
    crd = await http.get("/apis/example.com/v1/widgets", params={"fieldSelector": "spec.size=1"})
    assert (await _json(crd))["message"] == \
        '"spec.size" is not a known field selector: only "metadata.name", "metadata.namespace"'
    by_name = await http.get("/apis/example.com/v1/widgets", params={"fieldSelector": "metadata.name=w"})
    assert by_name.status == 200


async def test_field_validation_and_server_side_apply(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    sim, http = env
    bad = {**DEPLOY, "spec": {**DEPLOY["spec"], "replicaz": 1}}
    strict = await http.post("/apis/apps/v1/namespaces/default/deployments", json=bad,
                             params={"fieldValidation": "Strict"})
    assert strict.status == 400
    assert (await _json(strict))["message"] == (
        'Deployment in version "v1" cannot be handled as a Deployment: '
        'strict decoding error: unknown field "spec.replicaz"')
    warned = await http.post("/apis/apps/v1/namespaces/default/deployments", json=bad)
    assert warned.status == 201
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.replicaz\\""'

    path = "/api/v1/namespaces/default/configmaps/applied"
    apply = {"Content-Type": "application/apply-patch+yaml"}
    body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  a: '1'\n"
    missing_manager = await http.patch(path, data=body, headers=apply)
    assert missing_manager.status == 400
    first = await http.patch(path, data=body, headers=apply, params={"fieldManager": "me"})
    assert first.status == 201
    again = await http.patch(path, data=body.replace("'1'", "'2'"), headers=apply,
                             params={"fieldManager": "me"})
    assert again.status == 200
    stored = sim.store.get("configmaps", "applied", namespace="default")
    assert stored["data"] == {"a": "2"}
    assert [(m["manager"], m["operation"], m["fieldsV1"]) for m in stored["metadata"]["managedFields"]] == [
        ("me", "Apply", {"f:data": {"f:a": {}}})]
    clash = await http.patch(path, data=body, headers=apply, params={"fieldManager": "you"})
    assert clash.status == 409
    status = await _json(clash)
    assert status["reason"] == "Conflict"
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "me" using v1', "field": ".data.a"}]
    ghost = await http.patch("/api/v1/namespaces/ghost/configmaps/x", data=body.replace("applied", "x"),
                             headers=apply, params={"fieldManager": "me"})
    assert ghost.status == 404


async def test_openapi_v2_protobuf_encoding(env: tuple[Simulator, aiohttp.ClientSession]) -> None:
    _, http = env
    resp = await http.get("/openapi/v2", headers={"Accept": PROTOBUF_V2})
    assert resp.headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    body = await resp.read()
    assert body.startswith(b"\x0a\x032.0")  # field 1 (swagger), length 3, "2.0"
    assert b"io.k8s.api.core.v1.PodSpec" in body
    assert b"x-kubernetes-patch-merge-key" in body
    assert b"#/definitions/io.k8s.api.core.v1.Container" in body


def test_protobuf_encoder_writes_the_fields_by_number() -> None:
    doc = {"swagger": "2.0", "info": {"title": "T", "version": "v"}, "definitions": {
        "d": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "x.Y"}},
              "x-kubernetes-patch-strategy": "merge"}}}
    encoded = encode_document(doc)
    # swagger (1) "2.0", then info (2) = Info{title (1) "T", version (2) "v"}
    assert encoded.startswith(b"\x0a\x032.0\x12\x06\x0a\x01T\x12\x01v")
    assert b"\xb2\x01\x08\x0a\x06object" in encoded  # Schema.type (22) = TypeItem{value (1)}
    assert b"\x9a\x01\x01a" in encoded  # Schema.required (19)
    assert b"\x0a\x11#/definitions/x.Y" in encoded  # the property's Schema._ref (1)
    # vendor_extension (31) = NamedAny{name (1), value (2) = Any{yaml (2): the value as JSON text}}
    assert b"\x0a\x1bx-kubernetes-patch-strategy\x12\x09\x12\x07\"merge\"" in encoded
