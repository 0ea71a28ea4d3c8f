"""Enrichment's parts: the simulator's metadata-only answers (as kube-apiserver's), the metadata
store's memory of deleted and re-created objects, the enricher over real HTTP, and the bounded
Events counter."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from bridge.clock import RealClock
from bridge.contracts import ListOptions, WatchOptions
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import METADATA_ACCEPT, HttpListerWatcher
from bridge.service.events.config import EventMetricsConfig
from bridge.service.events.enrichment import Enricher, MetadataStore
from bridge.service.events.metrics import EventCounter
from bridge.service.telemetry import ScrapedCounter
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from sinks.eventfacts import InvolvedObject, event_facts
from tests.events.helpers import core_event


async def test_the_simulator_answers_metadata_only_lists_watches_and_gets(tmp_path: Path) -> None:
    async with Simulator() as sim:
        sim.store.create("pods", make_pod("p0", "default"))
        client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")), clock=RealClock())
        try:
            api = await Discovery(client=client).resolve("pods")
            lw = HttpListerWatcher(client=client, resource=api, accept=METADATA_ACCEPT)
            page = await lw.list(ListOptions())
            (item,) = page.items
            assert set(item) == {"kind", "apiVersion", "metadata"}
            assert item["kind"] == "PartialObjectMetadata"
            assert item["metadata"]["labels"]
            stream = await lw.watch(WatchOptions(resource_version=page.resource_version, timeout_seconds=5))
            sim.store.create("pods", make_pod("p1", "default"))
            async for event in stream:
                assert event.type.value == "ADDED"
                assert set(event.object) == {"kind", "apiVersion", "metadata"}
                assert event.object["metadata"]["name"] == "p1"
                break
            await stream.close()
            async with aiohttp.ClientSession() as http, http.get(
                    f"{sim.url}/api/v1/namespaces/default/pods/p0",
                    headers={"Accept": METADATA_ACCEPT[1]}) as r:
                body = await r.json()
            assert body["kind"] == "PartialObjectMetadata"
            assert "spec" not in body
        finally:
            await client.close()


def pod(name: str, uid: str, rv: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv,
                         "labels": labels, "annotations": {"keep": "yes", "drop": "x" * 1000},
                         "ownerReferences": [{"kind": "ReplicaSet", "apiVersion": "apps/v1", "name": "rs",
                                              "uid": "rs-uid", "controller": True}]}}


def test_the_store_remembers_deletions_and_tells_re_created_objects_apart() -> None:
    store = MetadataStore(annotation_keys=["keep"], max_objects=3, max_gone=2)
    store.replace([pod("a", "a1", "1", app="web")], "1")
    status, entry = store.find("ns", "a", "a1")
    assert status == "ok"
    assert entry is not None
    assert (entry.labels, entry.annotations, entry.controller) == (
        {"app": "web"}, {"keep": "yes"}, ("ReplicaSet", "apps/v1", "rs", "rs-uid"))
    # Re-created under the same name: the old uid is gone (with its labels), the new one is ok.
    store.update(pod("a", "a2", "2", app="web", v="2"))
    assert store.find("ns", "a", "a1")[0] == "gone"
    assert store.find("ns", "a", "a2")[0] == "ok"
    store.delete(pod("a", "a2", "3", app="web", v="2"))
    status, entry = store.find("ns", "a", "a2")
    assert status == "gone"
    assert entry is not None
    assert entry.labels == {"app": "web", "v": "2"}
    # A relist that no longer has an object remembers it too; the memory keeps the last max_gone.
    store.replace([pod("b", "b1", "4")], "4")
    store.replace([], "5")
    assert store.find("ns", "b", "b1")[0] == "gone"
    assert store.find("ns", "a", "a1")[0] == "unknown"  # forgotten: only the last 2 deletions
    assert store.find("ns", "zz", "nope")[0] == "unknown"
    # Bounded: beyond max_objects, new objects are not cached (and counted).
    store.replace([pod(f"p{i}", f"u{i}", "6") for i in range(5)], "6")
    assert len(store.live) == 3
    assert store.overflow == 2


def test_an_entry_costs_a_few_hundred_bytes() -> None:
    store = MetadataStore(annotation_keys=[], max_objects=10, max_gone=0)
    store.add(pod("a", "7d6f3c1e-1111-4a4a-9b9b-0123456789ab", "1", app="web", team="shop", tier="front"))
    entry = store.live["ns/a"]
    size = sys.getsizeof(entry) + sys.getsizeof(entry.labels) + sys.getsizeof(entry.uid) \
        + sys.getsizeof(entry.controller) + sum(sys.getsizeof(x) for x in entry.controller or ())
    assert size < 800


async def test_the_enricher_follows_the_owner_chain_over_http_and_skips_unconfigured_kinds(
        tmp_path: Path) -> None:
    async with Simulator() as sim:
        dep = sim.store.create("deployments.apps", {"metadata": {"name": "web", "namespace": "default"},
                                                    "spec": {"replicas": 1}})
        rs = sim.store.create("replicasets.apps", {"metadata": {
            "name": "web-x", "namespace": "default", "ownerReferences": [
                {"kind": "Deployment", "apiVersion": "apps/v1", "name": "web",
                 "uid": dep["metadata"]["uid"], "controller": True}]}, "spec": {"replicas": 1}})
        body = make_pod("web-x-1", "default")
        body["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "apiVersion": "apps/v1",
                                                "name": "web-x", "uid": rs["metadata"]["uid"],
                                                "controller": True}]
        p = sim.store.create("pods", body)
        client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")), clock=RealClock())
        enricher = Enricher(client=client, discovery=Discovery(client=client), clock=RealClock(),
                            kinds=["pods", "replicasets.apps", "deployments.apps"], wait=2.0)
        try:
            involved = InvolvedObject(kind="Pod", api_version="v1", namespace="default", name="web-x-1",
                                      uid=p["metadata"]["uid"])
            assert enricher.lookup_now(involved) is None  # nothing started yet: started lazily
            got = await enricher.lookup(involved)
            assert got.status == "ok"
            assert got.labels == p["metadata"]["labels"]
            assert [(o.kind, o.name) for o in got.owners] == [("ReplicaSet", "web-x"), ("Deployment", "web")]
            assert enricher.lookup_now(involved) == got  # now answered from the caches at once
            node = InvolvedObject(kind="Node", api_version="v1", name="n1")
            assert (await enricher.lookup(node)).status == "skipped"
            # An object created after the Event was watched: waited for while the cache is behind.
            later = make_pod("late", "default")
            task = asyncio.create_task(enricher.lookup(
                InvolvedObject(kind="Pod", api_version="v1", namespace="default", name="late"),
                event_rv=str(sim.store.resource_version + 1), wait=True))
            await asyncio.sleep(0.2)
            sim.store.create("pods", later)
            assert (await task).status == "ok"
            assert set(enricher.caches) == {("", "Pod"), ("apps", "ReplicaSet"), ("apps", "Deployment")}
        finally:
            await enricher.close()
            await client.close()


def test_the_counter_bounds_its_labels() -> None:
    counter = ScrapedCounter(("reason", "type", "namespace", "involved_kind"))
    config = EventMetricsConfig(namespaces=["shop"], max_values=2, max_series=3)
    c = EventCounter(config=config, counter=counter)
    for reason in ("A", "B", "C"):
        c.count(event_facts(core_event(reason=reason, message=reason)))
    c.count(event_facts(core_event(reason="A", type_="Odd", message="A")))
    totals = counter.totals()
    assert totals == {("A", "Warning", "shop", "Pod"): 1, ("B", "Warning", "shop", "Pod"): 1,
                      ("other", "Warning", "shop", "Pod"): 1, ("other", "other", "other", "other"): 1}
    assert c.series == 3


async def test_a_starting_cache_reads_the_deletions_the_server_still_has(tmp_path: Path) -> None:
    # A short history: a watch from resourceVersion 1 is refused (410) naming the oldest version
    # kept; deletions older than the history are lost to a starting cache, newer ones are known.
    async with Simulator(history_size=40) as sim:
        early = sim.store.create("pods", make_pod("early", "default"))
        sim.store.delete("pods", "early", namespace="default")
        for i in range(30):  # 60 changes of Pods: "early" leaves the history of 40
            sim.store.create("pods", make_pod(f"filler-{i}", "default"))
            sim.store.delete("pods", f"filler-{i}", namespace="default")
        checkpoint_rv = sim.store.resource_version
        late = sim.store.create("pods", make_pod("late", "default"))
        sim.store.delete("pods", "late", namespace="default")
        client = ApiClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kc")), clock=RealClock())
        enricher = Enricher(client=client, discovery=Discovery(client=client), clock=RealClock(),
                            kinds=["pods"])
        enricher.replay_since = str(checkpoint_rv)
        try:
            def pod(obj: dict[str, object]) -> InvolvedObject:
                meta = obj["metadata"]
                assert isinstance(meta, dict)
                return InvolvedObject(kind="Pod", api_version="v1", namespace="default", name=meta["name"],
                                      uid=meta["uid"])

            got = await enricher.lookup(pod(late))
            assert got.status == "gone"
            assert got.labels == late["metadata"]["labels"]
            assert (await enricher.lookup(pod(early))).status == "unknown"  # before the history kept
            # Replayed from the oldest version the server keeps (named in its 410, as kube-apiserver
            # does): the last fillers' deletions and "late"'s.
            assert 1 < enricher.replayed_deletions <= 21
        finally:
            await enricher.close()
            await client.close()


def test_kube_apiservers_oldest_kept_version_is_read_from_its_410() -> None:
    from bridge.service.events.enrichment import _OLDEST

    found = _OLDEST.search("too old resource version: 1 (3345612)")
    assert found is not None
    assert found.group(1) == "3345612"
