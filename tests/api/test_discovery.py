"""Discovery: the names users write resolve to the right group/version/resource, against the
simulator over HTTP (core, apps, coordination, CRDs incl. one registered at run time) and against
canned discovery documents (preferred versions, broken aggregated APIs); unknown, forbidden and
unwatchable resources give errors naming them."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bridge.contracts import ListOptions, WatchOptions
from bridge.errors import ApiUnavailableError, ConfigurationError, ForbiddenError, NotFoundError, ServerError
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery, UnknownResourceError, UnsupportedResourceError
from bridge.kube.listwatch import HttpListerWatcher, lister_watcher_for
from bridge.sim import Simulator

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
