"""Discovery: the names users write resolve to the right group/version/resource, against the
simulator over HTTP (core, apps, coordination, CRDs incl. one registered at run time) and against
canned discovery documents (preferred versions, broken aggregated APIs); unknown, forbidden and
unwatchable resources give errors naming them."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bridge.contracts import ListOptions, WatchOptions
from bridge.errors import ApiUnavailableError, ConfigurationError, ForbiddenError, NotFoundError, ServerError
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import (
    ACCEPT_DISCOVERY,
    APIResource,
    Discovery,
    UnknownResourceError,
    UnsupportedResourceError,
)
from bridge.kube.listwatch import HttpListerWatcher, lister_watcher_for
from bridge.sim import Simulator

from .conftest import ScriptedServer

POD = ("", "v1", "pods", "Pod", True)
DEPLOY = ("apps", "v1", "deployments", "Deployment", True)
LEASE = ("coordination.k8s.io", "v1", "leases", "Lease", True)
WIDGET = ("example.com", "v1", "widgets", "Widget", True)
NAMESPACE = ("", "v1", "namespaces", "Namespace", False)


def gvr(r: APIResource) -> tuple[str, str, str, str, bool]:
    return (r.group, r.version, r.resource, r.kind, r.namespaced)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pods", POD), ("pod", POD), ("po", POD), ("Pod", POD), ("pods/v1", POD),
        ("deployments", DEPLOY), ("deploy", DEPLOY), ("deployments.apps", DEPLOY),
        ("deployments.apps/v1", DEPLOY), ("deployments.v1.apps", DEPLOY), ("Deployment", DEPLOY),
        ("leases", LEASE), ("leases.coordination.k8s.io", LEASE), ("Lease", LEASE),
        ("widgets", WIDGET), ("widgets.example.com", WIDGET), ("widgets.example.com/v1", WIDGET),
        ("Widget", WIDGET), ("wd", WIDGET), ("widget", WIDGET),
        ("namespaces", NAMESPACE), ("ns", NAMESPACE),
    ],
)
async def test_resolve_names_against_the_simulator(
    sim_client: ApiClient, name: str, expected: tuple[str, str, str, str, bool]
) -> None:
    discovery = Discovery(client=sim_client)
    assert gvr(await discovery.resolve(name)) == expected


async def test_the_simulators_aggregated_discovery_takes_two_requests(
    sim: Simulator, sim_client: ApiClient,
) -> None:
    before = sim.requests["discovery"]
    discovery = Discovery(client=sim_client)
    assert gvr(await discovery.resolve("deployments")) == ("apps", "v1", "deployments", "Deployment", True)
    assert gvr(await discovery.resolve("widgets")) == ("example.com", "v1", "widgets", "Widget", True)
    assert sim.requests["discovery"] - before == 2


async def test_paths_and_attributes(sim_client: ApiClient) -> None:
    d = Discovery(client=sim_client)
    pods, deploy, ns, lease = [await d.resolve(n) for n in ("pods", "deploy", "ns", "leases")]
    assert pods.path("kube-system") == "/api/v1/namespaces/kube-system/pods"
    assert pods.path(None) == "/api/v1/pods"
    assert pods.api_version == "v1"
    assert pods.qualified == "pods"
    assert pods.short_names == ("po",)
    assert {"list", "watch", "get"} <= set(pods.verbs)
    assert deploy.path("x") == "/apis/apps/v1/namespaces/x/deployments"
    assert deploy.path() == "/apis/apps/v1/deployments"
    assert deploy.api_version == "apps/v1"
    assert deploy.qualified == "deployments.apps"
    assert ns.path("ignored") == "/api/v1/namespaces"
    assert lease.object_path("leader", "ns") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/leader"
    assert d.loads == 1  # one discovery pass served every name


async def test_crd_registered_at_run_time(sim: Simulator, sim_client: ApiClient) -> None:
    d = Discovery(client=sim_client)
    assert gvr(await d.resolve("pods")) == POD
    with pytest.raises(UnknownResourceError):
        await d.resolve("gadgets.example.com")
    assert d.loads == 2  # the miss re-read discovery once
    async with aiohttp.ClientSession() as http:
        crd = {"group": "example.com", "version": "v1", "plural": "gadgets", "kind": "Gadget",
               "namespaced": False}
        async with http.post(f"{sim.url}/_sim/crds", json=crd) as resp:
            assert resp.status < 300
    gadget = await d.resolve("gadgets.example.com/v1")
    assert gvr(gadget) == ("example.com", "v1", "gadgets", "Gadget", False)
    assert gadget.path("ns") == "/apis/example.com/v1/gadgets"
    assert d.loads == 3
    d.invalidate()
    assert gvr(await d.resolve("Gadget")) == ("example.com", "v1", "gadgets", "Gadget", False)
    assert d.loads == 4


async def test_unknown_resource_suggests_close_names(sim_client: ApiClient) -> None:
    d = Discovery(client=sim_client)
    with pytest.raises(UnknownResourceError) as info:
        await d.resolve("pdos")
    assert isinstance(info.value, ConfigurationError)
    assert str(info.value) == (
        "unknown resource 'pdos': the API server serves no such resource (check the name, or install "
        "its CRD); did you mean pods, po?"
    )
    assert info.value.suggestions == ("pods", "po")
    with pytest.raises(UnknownResourceError, match=r"^unknown resource 'frobnicators\.example\.com/v9'"):
        await d.resolve("frobnicators.example.com/v9")
    with pytest.raises(UnknownResourceError, match=r"deployments\.apps"):
        await d.resolve("deployment.app")


async def test_forbidden_resource_names_it_and_the_fix(sim: Simulator, sim_client: ApiClient) -> None:
    d = Discovery(client=sim_client)
    lw = await lister_watcher_for(sim_client, d, "secrets", "team-a")
    with pytest.raises(ForbiddenError) as info:
        await lw.list(ListOptions())
    message = str(info.value)
    assert message.startswith(
        "forbidden: list secrets in namespace team-a — check the ClusterRole/Role bound to the bridge's "
        "service account grants list and watch on secrets"
    )
    assert info.value.code == 403
    with pytest.raises(ForbiddenError, match=r"^forbidden: watch secrets in namespace team-a"):
        await lw.watch(WatchOptions())
    # Other resources keep working on the same client.
    pods = await lister_watcher_for(sim_client, d, "pods", "team-a")
    assert (await pods.list(ListOptions())).items == []


async def test_resource_that_vanished_is_not_found(sim_client: ApiClient) -> None:
    ghost = APIResource(group="example.com", version="v1", resource="ghosts", kind="Ghost", namespaced=True,
                        verbs=("list", "watch"))
    lw = HttpListerWatcher(client=sim_client, resource=ghost, namespace="ns")
    with pytest.raises(NotFoundError, match=r"^not found: list ghosts.example.com in namespace ns "):
        await lw.list(ListOptions())


async def test_unreachable_server_during_discovery() -> None:
    async with ApiClient(server="http://127.0.0.1:9") as client:
        pattern = r"^resolving resource 'pods': discovery /api: cannot reach"
        with pytest.raises(ApiUnavailableError, match=pattern):
            await Discovery(client=client).resolve("pods")


# --------------------------------------------------------------------------------------------------
# canned discovery documents


class CannedClient:
    def __init__(self, docs: dict[str, dict[str, Any] | Exception]) -> None:
        self.docs = docs
        self.paths: list[str] = []

    async def get_json(self, path: str, params: Any = None, *, context: str = "") -> dict[str, Any]:
        self.paths.append(path)
        doc = self.docs[path]
        if isinstance(doc, Exception):
            raise doc
        return doc


def res(name: str, kind: str, verbs: list[str], *, namespaced: bool = True, short: list[str] | None = None
        ) -> dict[str, Any]:
    return {"name": name, "kind": kind, "namespaced": namespaced, "verbs": verbs, "shortNames": short or [],
            "singularName": kind.lower()}


ALL = ["create", "delete", "get", "list", "patch", "update", "watch"]

DOCS: dict[str, dict[str, Any] | Exception] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {"groupVersion": "v1", "resources": [
        res("pods", "Pod", ALL, short=["po"]), res("pods/status", "Pod", ["get", "patch"]),
        res("bindings", "Binding", ["create"]), res("events", "Event", ALL, short=["ev"]),
    ]},
    "/apis": {"kind": "APIGroupList", "groups": [
        {"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"},
                                             {"groupVersion": "example.com/v2", "version": "v2"}],
         "preferredVersion": {"groupVersion": "example.com/v2", "version": "v2"}},
        {"name": "metrics.k8s.io", "versions": [{"groupVersion": "metrics.k8s.io/v1beta1",
                                                 "version": "v1beta1"}]},
        {"name": "events.k8s.io", "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}]},
    ]},
    "/apis/example.com/v1": {"resources": [res("widgets", "Widget", ALL), res("oldthings", "OldThing", ALL)]},
    "/apis/example.com/v2": {"resources": [res("widgets", "Widget", ALL)]},
    "/apis/metrics.k8s.io/v1beta1": ServerError("service unavailable", code=503),
    "/apis/events.k8s.io/v1": {"resources": [res("events", "Event", ALL)]},
}


@pytest.mark.parametrize(
    ("name", "group", "version"),
    [
        ("widgets", "example.com", "v2"),
        ("widgets.example.com", "example.com", "v2"),
        ("widgets.example.com/v1", "example.com", "v1"),
        ("widgets.v1.example.com", "example.com", "v1"),
        ("oldthings", "example.com", "v1"),
        ("events", "", "v1"),
        ("events.events.k8s.io", "events.k8s.io", "v1"),
    ],
)
async def test_preferred_versions_and_groups(name: str, group: str, version: str) -> None:
    client = CannedClient(DOCS)
    r = await Discovery(client=client).resolve(name)
    assert (r.group, r.version) == (group, version)


async def test_subresources_are_not_resources_and_a_broken_group_is_skipped() -> None:
    client = CannedClient(DOCS)
    d = Discovery(client=client)
    names = sorted(r.qualified + "/" + r.version for r in await d.resources())
    assert names == [
        "bindings/v1", "events.events.k8s.io/v1", "events/v1", "oldthings.example.com/v1", "pods/v1",
        "widgets.example.com/v1", "widgets.example.com/v2",
    ]
    assert "/apis/metrics.k8s.io/v1beta1" in client.paths


async def test_resource_without_list_and_watch_is_refused() -> None:
    d = Discovery(client=CannedClient(DOCS))
    binding = await d.resolve("bindings")
    assert binding.verbs == ("create",)
    with pytest.raises(UnsupportedResourceError) as info:
        await lister_watcher_for(None, d, "bindings")  # type: ignore[arg-type]
    assert str(info.value) == (
        "resource bindings (v1) cannot be watched: it supports only create, and the bridge needs "
        "list and watch"
    )
    assert isinstance(info.value, ConfigurationError)


# --------------------------------------------------------------------------------------------------
# aggregated discovery (apidiscovery.k8s.io/v2) against a real HTTP server

AGGREGATED_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def agg_res(resource: str, kind: str, group: str, version: str, *, scope: str = "Namespaced",
            verbs: list[str] | None = None, short: list[str] | None = None) -> dict[str, Any]:
    """One APIResourceDiscovery as kube-apiserver 1.30 writes it (subresources included)."""
    return {
        "resource": resource,
        "responseKind": {"group": group, "version": version, "kind": kind},
        "scope": scope,
        "singularResource": kind.lower(),
        "verbs": verbs if verbs is not None else ALL,
        **({"shortNames": short} if short else {}),
        "categories": ["all"],
        "subresources": [{"subresource": "status", "responseKind": {"group": group, "version": version,
                                                                   "kind": kind},
                          "verbs": ["get", "patch", "update"]}],
    }


AGG_API = {
    "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
    "items": [{"metadata": {"creationTimestamp": None}, "versions": [{"version": "v1", "freshness": "Current",
        "resources": [agg_res("pods", "Pod", "", "v1", short=["po"]),
                      agg_res("nodes", "Node", "", "v1", scope="Cluster", short=["no"]),
                      agg_res("bindings", "Binding", "", "v1", verbs=["create"]),
                      agg_res("events", "Event", "", "v1", short=["ev"])]}]}],
}
AGG_APIS = {
    "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
    "items": [
        {"metadata": {"name": "apps", "creationTimestamp": None}, "versions": [
            {"version": "v1", "freshness": "Current",
             "resources": [agg_res("deployments", "Deployment", "apps", "v1", short=["deploy"])]}]},
        {"metadata": {"name": "example.com", "creationTimestamp": None}, "versions": [
            {"version": "v2", "freshness": "Current",
             "resources": [agg_res("widgets", "Widget", "example.com", "v2")]},
            {"version": "v1", "freshness": "Current",
             "resources": [agg_res("widgets", "Widget", "example.com", "v1"),
                           agg_res("oldthings", "OldThing", "example.com", "v1")]}]},
        {"metadata": {"name": "metrics.k8s.io", "creationTimestamp": None}, "versions": [
            {"version": "v1beta1", "freshness": "Stale"}]},
        {"metadata": {"name": "events.k8s.io", "creationTimestamp": None}, "versions": [
            {"version": "v1", "freshness": "Current",
             "resources": [agg_res("events", "Event", "events.k8s.io", "v1", short=["ev"])]}]},
    ],
}


def _serve(docs: dict[str, tuple[dict[str, Any], str]]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        doc = docs.get(request.path)
        if doc is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                      "message": "the server could not find the requested resource"},
                                     status=404)
        body, content_type = doc
        return web.Response(body=orjson.dumps(body), headers={"Content-Type": content_type})
    return handler


async def test_aggregated_discovery_reads_the_cluster_in_two_requests(server: ScriptedServer) -> None:
    server.handler = _serve({"/api": (AGG_API, AGGREGATED_TYPE), "/apis": (AGG_APIS, AGGREGATED_TYPE)})
    url = await server.start()
    async with ApiClient(server=url) as client:
        d = Discovery(client=client)
        resolved = {n: await d.resolve(n) for n in (
            "po", "nodes", "deploy", "deployments.apps/v1", "widgets", "widgets.example.com/v1", "oldthings",
            "events", "events.events.k8s.io")}
        names = sorted(r.qualified + "/" + r.version for r in await d.resources())
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/api"), ("GET", "/apis")]
    assert {r.accept for r in server.requests} == {ACCEPT_DISCOVERY}
    assert ACCEPT_DISCOVERY.startswith(AGGREGATED_TYPE + ",")
    assert {n: (r.group, r.version, r.kind, r.namespaced) for n, r in resolved.items()} == {
        "po": ("", "v1", "Pod", True),
        "nodes": ("", "v1", "Node", False),
        "deploy": ("apps", "v1", "Deployment", True),
        "deployments.apps/v1": ("apps", "v1", "Deployment", True),
        "widgets": ("example.com", "v2", "Widget", True),  # the first version listed is preferred
        "widgets.example.com/v1": ("example.com", "v1", "Widget", True),
        "oldthings": ("example.com", "v1", "OldThing", True),
        "events": ("", "v1", "Event", True),
        "events.events.k8s.io": ("events.k8s.io", "v1", "Event", True),
    }
    assert resolved["po"].verbs == tuple(ALL)
    assert resolved["po"].short_names == ("po",)
    # Subresources are not resources; the stale metrics.k8s.io is skipped.
    assert names == [
        "bindings/v1", "deployments.apps/v1", "events.events.k8s.io/v1", "events/v1", "nodes/v1",
        "oldthings.example.com/v1", "pods/v1", "widgets.example.com/v1", "widgets.example.com/v2",
    ]


async def test_a_server_without_aggregated_discovery_gets_the_per_group_documents(
    server: ScriptedServer,
) -> None:
    legacy = {path: (doc, "application/json") for path, doc in DOCS.items() if isinstance(doc, dict)}
    server.handler = _serve(legacy)
    url = await server.start()
    async with ApiClient(server=url) as client:
        d = Discovery(client=client)
        widgets = await d.resolve("widgets")
        names = sorted(r.qualified + "/" + r.version for r in await d.resources())
    assert (widgets.group, widgets.version) == ("example.com", "v2")
    assert names == [
        "bindings/v1", "events.events.k8s.io/v1", "events/v1", "oldthings.example.com/v1", "pods/v1",
        "widgets.example.com/v1", "widgets.example.com/v2",
    ]
    paths = [r.path for r in server.requests]
    assert paths[:2] == ["/api", "/apis"]
    assert sorted(paths[2:]) == ["/api/v1", "/apis/events.k8s.io/v1", "/apis/example.com/v1",
                                 "/apis/example.com/v2", "/apis/metrics.k8s.io/v1beta1"]


async def test_mixed_answers_are_judged_document_by_document(server: ScriptedServer) -> None:
    """A server whose /api is aggregated but whose /apis is not (or the reverse) is read each way."""
    docs = {"/api": (AGG_API, AGGREGATED_TYPE)}
    docs |= {p: (d, "application/json") for p, d in DOCS.items()
             if isinstance(d, dict) and p.startswith("/apis")}
    server.handler = _serve(docs)
    url = await server.start()
    async with ApiClient(server=url) as client:
        d = Discovery(client=client)
        assert (await d.resolve("no")).kind == "Node"
        assert (await d.resolve("widgets")).version == "v2"
    assert "/api/v1" not in [r.path for r in server.requests]
