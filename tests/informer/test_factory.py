"""SharedInformerFactory: one informer per key, idempotent start, per-informer sync, clean shutdown."""

from __future__ import annotations

import asyncio

from bridge.clock import FakeClock
from bridge.contracts import ListerWatcher
from bridge.errors import ServerError
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.recorder import RecordingHandler


def cm(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": name}}


async def test_one_informer_per_key_idempotent_start_and_shutdown() -> None:
    sources: dict[InformerKey, FakeControllerSource] = {}

    def lister_watcher_for(key: InformerKey) -> ListerWatcher:
        src = FakeControllerSource()
        src.add(cm(f"{key.resource}-{key.namespace or 'all'}"))
        sources[key] = src
        return src

    factory = SharedInformerFactory(lister_watcher_factory=lister_watcher_for, clock=FakeClock(),
                                    default_resync=30.0)
    pods = InformerKey("pods")
    pods_ns = InformerKey("pods", namespace="ns")
    first = factory.informer_for(pods)
    assert factory.informer_for(InformerKey("pods")) is first
    assert factory.informer_for(pods_ns) is not first
    assert first.name == "pods"
    assert first.resync_check_period == 30.0
    assert str(InformerKey("pods", "ns", "app=x", "spec.nodeName=n1")) == \
        "pods,ns=ns,labels=app=x,fields=spec.nodeName=n1"
    assert list(sources) == [pods, pods_ns]

    rec = RecordingHandler()
    first.add_event_handler(rec)
    factory.start()
    factory.start()  # idempotent: no second run()
    assert await factory.wait_for_cache_sync(5) == {pods: True, pods_ns: True}
    assert await rec.wait_for(1) == [("add", "ns/pods-all", "1", True)]

    late_key = InformerKey("configmaps", namespace="ns")
    late = factory.informer_for(late_key)
    assert not late.started
    factory.start()  # starts only the new one
    assert await factory.wait_for_cache_sync(5) == {pods: True, pods_ns: True, late_key: True}
    assert len(sources[pods].watch_calls()) == 1

    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("informer-factory:")]
    assert sorted(t.get_name() for t in tasks) == [
        "informer-factory:configmaps,ns=ns", "informer-factory:pods", "informer-factory:pods,ns=ns",
    ]
    await factory.shutdown(2)
    assert all(t.done() for t in tasks)
    assert [inf.started for inf in factory.informers.values()] == [True, True, True]


async def test_wait_for_cache_sync_reports_an_unsynced_informer() -> None:
    failing = FakeControllerSource()
    for _ in range(5):
        failing.fail_next_list(ServerError("boom", code=500))
    ok = FakeControllerSource()
    factory = SharedInformerFactory(
        lister_watcher_factory=lambda key: failing if key.resource == "bad" else ok, clock=FakeClock()
    )
    factory.informer_for(InformerKey("bad"))
    factory.informer_for(InformerKey("good"))
    factory.start()
    assert await factory.wait_for_cache_sync(0.2) == {InformerKey("bad"): False, InformerKey("good"): True}
    await factory.shutdown(1)
