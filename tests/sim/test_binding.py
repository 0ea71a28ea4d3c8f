"""The simulator's ``pods/binding`` subresource, as the scheduler binds a Pod: ``spec.nodeName`` is
set once and a watch scoped by ``spec.nodeName`` sees the Pod leave the unscheduled scope and enter
the node's at the binding's resourceVersion."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from bridge.errors import ApiStatusError, ConflictError, NotFoundError
from bridge.kube.apiclient import ApiClient
from bridge.sim import Simulator

PODS = "/api/v1/namespaces/default/pods"


async def _watch(client: ApiClient, selector: str, rv: str) -> list[tuple[str, str, str]]:
    stream = await client.open_stream("/api/v1/pods", {"watch": True, "fieldSelector": selector,
                                                       "resourceVersion": rv, "timeoutSeconds": 1})
    out = []
    async for line in stream:
        event = orjson.loads(line)
        meta = event["object"]["metadata"]
        out.append((event["type"], meta.get("name", ""), meta["resourceVersion"]))
    return out


async def test_binding_sets_the_node_once_and_moves_the_pod_between_field_scopes() -> None:
    async with Simulator() as sim, ApiClient(server=sim.url) as client:
        pod = await client.create(PODS, {"metadata": {"name": "p"},
                                         "spec": {"containers": [{"name": "c", "image": "x"}]}})
        rv = pod["metadata"]["resourceVersion"]
        unscheduled = asyncio.create_task(_watch(client, "spec.nodeName=", rv))
        on_node = asyncio.create_task(_watch(client, "spec.nodeName=n1", rv))
        await asyncio.sleep(0.2)
        status = await client.create(f"{PODS}/p/binding", {"apiVersion": "v1", "kind": "Binding",
                                                          "metadata": {"name": "p"},
                                                          "target": {"kind": "Node", "name": "n1"}})
        assert (status["kind"], status["code"]) == ("Status", 201)
        bound = await client.get(f"{PODS}/p")
        assert bound["spec"]["nodeName"] == "n1"
        assert bound["metadata"]["managedFields"][-1]["subresource"] == "binding"
        brv = bound["metadata"]["resourceVersion"]
        assert await unscheduled == [("DELETED", "p", brv)]
        assert await on_node == [("ADDED", "p", brv)]
        with pytest.raises(ConflictError, match='pod p is already assigned to node "n1"'):
            await client.create(f"{PODS}/p/binding", {"target": {"kind": "Node", "name": "n2"}})
        with pytest.raises(ApiStatusError, match=r"target\.name: Required value"):
            await client.create(f"{PODS}/p/binding", {"target": {}})
        with pytest.raises(NotFoundError):
            await client.create(f"{PODS}/nope/binding", {"target": {"name": "n1"}})
        with pytest.raises(NotFoundError):
            await client.create("/api/v1/namespaces/default/configmaps/x/binding", {"target": {"name": "n1"}})
