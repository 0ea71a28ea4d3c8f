"""Test helpers for the pipeline tests: the kit's recording sink (:mod:`bridge.testing.sink`), the
watched resource, an informer builder over a fake source, and polling on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bridge.clock import RealClock
from bridge.contracts import DeliveryObserver
from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.sim import Simulator
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.sink import RecordingBatchSink, RecordingSink
from sinks.contract import ResourceRef

CONFIGMAPS = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")
CONFIGMAPS_API = APIResource(group="", version="v1", resource="configmaps", kind="ConfigMap", namespaced=True,
                             verbs=("list", "watch"))
WATCHED = WatchedResource(key=InformerKey("configmaps"), api=CONFIGMAPS_API, ref=CONFIGMAPS)

__all__ = ["CONFIGMAPS", "CONFIGMAPS_API", "WATCHED", "BatchSink", "RecordingSink", "cm", "fake_builder",
           "simulated_cluster", "until", "watched_over_http"]


BatchSink = RecordingBatchSink
"""The kit's recording sink with ``deliver_batch`` (the name these tests use)."""


def fake_builder(source: FakeControllerSource, clock: Any) -> Callable[
    [WatchedResource, DeliveryObserver], SharedIndexInformer
]:
    def build(watched: WatchedResource, observer: DeliveryObserver) -> SharedIndexInformer:
        return SharedIndexInformer(lister_watcher=source, clock=clock, observer=observer,
                                   name=watched.informer_id)

    return build


async def until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Polls ``predicate`` on the event loop until it holds (fails the test after ``timeout``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def cm(name: str, ns: str = "default", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
            "data": dict(data)}


@contextlib.asynccontextmanager
async def simulated_cluster(tmp_path: Path, *namespaces: str, bookmark_interval: float | None = None
                            ) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    """A simulator over real HTTP holding the namespaces ``default`` and ``namespaces`` (the
    simulator's own bookmark interval unless given), and a client reaching it through the
    kubeconfig it writes."""
    simulator = (Simulator(namespaces=("default", *namespaces)) if bookmark_interval is None else
                 Simulator(namespaces=("default", *namespaces), bookmark_interval=bookmark_interval))
    await simulator.start()
    client = ApiClient.from_kubeconfig(str(simulator.write_kubeconfig(tmp_path / "kc")))
    try:
        yield simulator, client
    finally:
        await client.close()
        await simulator.stop()


async def watched_over_http(client: ApiClient, resource: str, kind: str, namespace: str
                            ) -> tuple[SharedInformerFactory, WatchedResource]:
    """An informer factory listing and watching the core ``resource`` over real HTTP, as the service
    runs by default (objects kept as the server's bytes, managedFields dropped, a compact cache),
    and ``resource`` in ``namespace`` as the pipeline's watched resource."""
    api = await Discovery(client=client).resolve(resource)
    ref = ResourceRef(group="", version="v1", resource=resource, kind=kind)
    factory = SharedInformerFactory(
        lister_watcher_factory=lambda k: HttpListerWatcher(client=client, resource=api, namespace=k.namespace,
                                                           raw_objects=True, drop_managed_fields=True),
        clock=RealClock(), compact_cache=True)
    return factory, WatchedResource(key=InformerKey(resource, namespace=namespace), api=api, ref=ref)
