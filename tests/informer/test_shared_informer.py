"""SharedIndexInformer against FakeControllerSource: exact handler-call sequences for every rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    KubeObject,
    ListenerOptions,
    ListOptions,
    ListPage,
    Notification,
    ObjectKey,
    OverflowPolicy,
    WatchEventType,
)
from bridge.errors import ServerError
from bridge.informer.shared_informer import CacheSeed, InformerStartedError, SeedStart, SharedIndexInformer
from bridge.testing.fake_source import FakeControllerSource
from bridge.testing.loop import spin_until
from bridge.testing.recorder import RecordingHandler
from tests.informer.observer import RecordingObserver


def cm(name: str, ns: str = "ns", **data: str) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": ns, "name": name, "managedFields": [{"manager": "kubectl"}]},
        "data": data,
    }


async def until(cond: Callable[[], bool], what: str = "condition") -> None:
    """Lets the loop run until ``cond`` holds (no wall-clock sleeping), for 2,000 turns at most."""
    await spin_until(cond, what, turns=2000)


class Env:
    def __init__(self) -> None:
        self.source = FakeControllerSource()
        self.clock = FakeClock()
        self.observer = RecordingObserver()
        self._running: list[tuple[SharedIndexInformer, asyncio.Task[None]]] = []

    def informer(self, **kwargs: Any) -> SharedIndexInformer:
        kwargs.setdefault("observer", self.observer)
        return SharedIndexInformer(lister_watcher=self.source, clock=self.clock, name="cm", **kwargs)

    async def start(self, informer: SharedIndexInformer, sync: bool = True) -> None:
        task = asyncio.create_task(informer.run(), name="test-informer-run")
        self._running.append((informer, task))
        if sync:
            assert await informer.wait_for_cache_sync(5)

    async def watch_down_then(self, changes: Callable[[], None]) -> None:
        """Ends the watch with ERROR 410, applies ``changes`` while the reflector backs off, compacts
        the history, and lets the reflector relist."""
        self.source.inject_error(410)
        await until(lambda: self.clock.next_deadline() is not None, "reflector backoff")
        changes()
        self.source.compact()
        await self.clock.advance(60)

    async def close(self) -> None:
        for informer, task in self._running:
            await informer.shutdown(2)
            await task


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    yield e
    await e.close()


async def test_initial_list_then_watch_events(env: Env) -> None:
    env.source.add(cm("a"))
    env.source.add(cm("b"))
    informer = env.informer()
    rec = RecordingHandler()
    reg = informer.add_event_handler(rec)
    assert not reg.has_synced()
    await env.start(informer)
    await rec.wait_for(2)
    await until(reg.has_synced, "registration synced")
    env.source.modify(cm("a", k="v"))
    env.source.delete(cm("b"))
    env.source.add(cm("c"))
    assert await rec.wait_for(5) == [
        ("add", "ns/a", "1", True),
        ("add", "ns/b", "2", True),
        ("update", "ns/a", "1", "3"),
        ("delete", "ns/b", "4", False),
        ("add", "ns/c", "5", False),
    ]
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/c"]
    assert informer.last_sync_resource_version() == "5"
    assert informer.lister().get("ns", "a") is not None
    assert informer.has_synced()


async def test_a_backlog_reaches_handlers_in_the_order_of_the_changes_across_objects(env: Env) -> None:
    """client-go 1.36 (the_real_fifo.go: "every notification from the Reflector is passed in order";
    TestRealFIFO_detectLineJumpers): changes that wait in the queue together are not grouped by
    object; the per-key DeltaFIFO handed over a's two updates, then b's add."""
    env.source.add(cm("a"))
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    await rec.wait_for(1)
    env.source.modify(cm("a", k="1"))  # the three reach the queue before the informer pops
    env.source.add(cm("b"))
    env.source.modify(cm("a", k="2"))
    assert await rec.wait_for(4) == [
        ("add", "ns/a", "1", True),
        ("update", "ns/a", "1", "2"),
        ("add", "ns/b", "3", False),
        ("update", "ns/a", "2", "4"),
    ]


class HoldContinuations(FakeControllerSource):
    """Serves continuation pages only once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def list(self, options: ListOptions) -> ListPage:
        if options.continue_token:
            await self.release.wait()
        return await super().list(options)


async def test_the_first_pages_of_a_list_reach_handlers_before_the_list_ends(env: Env) -> None:
    env.source = HoldContinuations()
    for name in "abc":
        env.source.add(cm(name))
    informer = env.informer(page_size=2)
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer, sync=False)
    # Page one is delivered, as initial-list adds, while page two is still being fetched.
    assert await rec.wait_for(2) == [("add", "ns/a", "1", True), ("add", "ns/b", "2", True)]
    assert not informer.has_synced()
    env.source.release.set()
    assert await informer.wait_for_cache_sync(5)
    assert await rec.wait_for(3) == [
        ("add", "ns/a", "1", True), ("add", "ns/b", "2", True), ("add", "ns/c", "3", True)]


async def test_cache_is_updated_before_handlers_are_notified(env: Env) -> None:
    informer = env.informer()
    seen: list[tuple[str, str | None]] = []

    class Probe:
        def _cached_rv(self, obj: KubeObject | DeletedFinalStateUnknown) -> str | None:
            key = "ns/" + (obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj)["metadata"]["name"]
            cached = informer.get_indexer().get_by_key(key)
            return None if cached is None else cached["metadata"]["resourceVersion"]

        async def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
            seen.append(("add", self._cached_rv(obj)))

        async def on_update(self, old: KubeObject, new: KubeObject) -> None:
            seen.append(("update", self._cached_rv(new)))

        async def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
            seen.append(("delete", self._cached_rv(obj)))

    informer.add_event_handler(Probe())
    await env.start(informer)
    # One change at a time: a handler runs after the informer moved on, so each is awaited.
    env.source.add(cm("a"))
    await until(lambda: len(seen) == 1, "add")
    env.source.modify(cm("a", k="1"))
    await until(lambda: len(seen) == 2, "update")
    env.source.delete(cm("a"))
    await until(lambda: len(seen) == 3, "delete")
    assert seen == [("add", "1"), ("update", "2"), ("delete", None)]


async def test_relist_after_410_reports_only_differences_with_tombstones(env: Env) -> None:
    for name in ("a", "b", "c"):
        env.source.add(cm(name))
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    await rec.wait_for(3)
    rec.clear()

    def changes() -> None:
        env.source.modify(cm("a", k="v"))  # rv 4
        env.source.delete(cm("b"))  # rv 5
        env.source.add(cm("d"))  # rv 6

    await env.watch_down_then(changes)
    # client-go 1.36 (controller_test.go TestReplaceEvents, "Create, update, delete"; the_real_fifo.go
    # reconcileReplacement): the relist's inferred deletes first, then its items in list order.
    assert await rec.wait_for(3) == [
        ("delete", "ns/b", "2", True),
        ("update", "ns/a", "1", "4"),
        ("add", "ns/d", "6", False),
    ]
    await env.clock.advance(0)
    assert len(rec.calls) == 3  # "c" is unchanged: a same-RV update nobody is due for
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/c", "ns/d"]


async def test_recreated_object_is_split_into_delete_and_add(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    await rec.wait_for(1)

    def recreate() -> None:
        env.source.delete(cm("a"))  # rv 2
        env.source.add(cm("a"))  # rv 3, new uid

    await env.watch_down_then(recreate)
    calls = await rec.wait_for(3)
    assert calls[1:] == [("delete", "ns/a", "1", False), ("add", "ns/a", "3", False)]
    old, new = rec.objects[1][2], rec.objects[2][2]
    assert old["metadata"]["uid"] != new["metadata"]["uid"]


async def test_recreated_object_is_an_update_without_split(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer(split_uid_changes=False)
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    await rec.wait_for(1)

    def recreate() -> None:
        env.source.delete(cm("a"))
        env.source.add(cm("a"))

    await env.watch_down_then(recreate)
    assert (await rec.wait_for(2))[1:] == [("update", "ns/a", "1", "3")]


async def test_resync_only_to_due_listeners_with_per_listener_periods(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer(resync_check_period=5.0)
    every5, every10, never = RecordingHandler(), RecordingHandler(), RecordingHandler()
    r5 = informer.add_event_handler(every5, ListenerOptions(name="every5", resync_period=5.0))
    r10 = informer.add_event_handler(every10, ListenerOptions(name="every10", resync_period=10.0))
    r0 = informer.add_event_handler(never, ListenerOptions(name="never"))
    assert (r5.resync_period, r10.resync_period, r0.resync_period) == (5.0, 10.0, 0.0)
    await env.start(informer)
    for h in (every5, every10, never):
        await h.wait_for(1)
    await env.clock.advance(5)
    assert await every5.wait_for(2) == [("add", "ns/a", "1", True), ("update", "ns/a", "1", "1")]
    await env.clock.advance(5)
    assert await every5.wait_for(3) == [
        ("add", "ns/a", "1", True), ("update", "ns/a", "1", "1"), ("update", "ns/a", "1", "1")
    ]
    assert await every10.wait_for(2) == [("add", "ns/a", "1", True), ("update", "ns/a", "1", "1")]
    env.source.modify(cm("a", k="v"))  # a real update reaches everyone, then nothing more
    await never.wait_for(2)
    assert never.calls == [("add", "ns/a", "1", True), ("update", "ns/a", "1", "2")]
    resyncs = [e for e in env.observer.without_acks() if e[0] == "dispatched" and e[2] == "update"]
    assert resyncs == [
        ("dispatched", 1, "update", ("every5",)),
        ("dispatched", 2, "update", ("every5", "every10")),
        ("dispatched", 3, "update", ("every5", "every10", "never")),
    ]


@pytest.mark.parametrize("event_type", [WatchEventType.MODIFIED, WatchEventType.ADDED])
async def test_an_update_at_the_same_rv_from_the_watch_reaches_every_listener(
    env: Env, event_type: WatchEventType,
) -> None:
    """Only Sync and Replaced deltas are resyncs (sent to the listeners due for one); an Added or
    Updated delta is a change the server sent, for every listener, whatever its resourceVersion."""
    a = env.source.add(cm("a"))
    informer = env.informer(resync_check_period=5.0)
    due, never = RecordingHandler(), RecordingHandler()
    informer.add_event_handler(due, ListenerOptions(name="due", resync_period=5.0))
    informer.add_event_handler(never, ListenerOptions(name="never"))
    await env.start(informer)
    for h in (due, never):
        await h.wait_for(1)
    changed = {**a, "data": {"k": "v"}}  # same resourceVersion "1"
    env.source.send_event(event_type, changed)
    for h in (due, never):
        assert await h.wait_for(2) == [("add", "ns/a", "1", True), ("update", "ns/a", "1", "1")]
    cached = informer.get_indexer().get_by_key(ObjectKey("ns/a"))
    assert cached is not None
    assert cached["data"] == {"k": "v"}
    dispatched = [e for e in env.observer.without_acks() if e[0] == "dispatched" and e[2] == "update"]
    assert dispatched == [("dispatched", 1, "update", ("due", "never"))]


async def test_resync_period_clamping_before_and_after_start(env: Env) -> None:
    informer = env.informer(resync_check_period=10.0)
    fast = informer.add_event_handler(RecordingHandler(), ListenerOptions(resync_period=0.2))
    assert fast.resync_period == 1.0  # raised to the 1 s minimum, which lowers the check period
    assert informer.resync_check_period == 1.0
    slow = informer.add_event_handler(RecordingHandler(), ListenerOptions(resync_period=30.0))
    assert slow.resync_period == 30.0
    await env.start(informer)
    late = informer.add_event_handler(RecordingHandler(), ListenerOptions(resync_period=0.5))
    assert late.resync_period == 1.0
    informer2 = SharedIndexInformer(lister_watcher=env.source, clock=env.clock, name="cm2",
                                    resync_check_period=10.0)
    await env.start(informer2)
    after = informer2.add_event_handler(RecordingHandler(), ListenerOptions(resync_period=3.0))
    assert after.resync_period == 10.0  # after start: raised to the check period
    assert informer2.resync_check_period == 10.0
    no_check = env.informer()  # check period 0 disables every handler's resync
    reg = no_check.add_event_handler(RecordingHandler(), ListenerOptions(resync_period=30.0))
    assert reg.resync_period == 0.0
    assert names_unique([fast.name, slow.name, late.name])


def names_unique(names: list[str]) -> bool:
    return len(set(names)) == len(names) and names[0] == "RecordingHandler"


async def test_late_handler_gets_cache_replayed_and_its_own_has_synced(env: Env) -> None:
    env.source.add(cm("a"))
    env.source.add(cm("b"))
    informer = env.informer()
    first = RecordingHandler()
    informer.add_event_handler(first)
    await env.start(informer)
    await first.wait_for(2)
    gate = asyncio.Event()
    late = RecordingHandler(gate=gate)
    reg = informer.add_event_handler(late, ListenerOptions(name="late"))
    env.source.modify(cm("a", k="v"))
    await first.wait_for(3)
    assert informer.has_synced()
    assert not reg.has_synced()
    gate.set()
    calls = await late.wait_for(3)
    assert sorted(calls[:2]) == [("add", "ns/a", "1", True), ("add", "ns/b", "2", True)]
    assert calls[2] == ("update", "ns/a", "1", "3")
    await until(reg.has_synced, "late registration synced")
    # The replay is untracked: the observer saw seq 0,1 (initial list) and 2 (the update) only.
    dispatched = [e for e in env.observer.events if e[0] == "dispatched"]
    assert dispatched[-1] == ("dispatched", 2, "update", ("RecordingHandler", "late"))
    await until(lambda: env.observer.acks("late") == [2], "late acks seq 2")


async def test_remove_event_handler_is_idempotent(env: Env) -> None:
    informer = env.informer()
    kept, removed = RecordingHandler(), RecordingHandler()
    informer.add_event_handler(kept, ListenerOptions(name="kept"))
    reg = informer.add_event_handler(removed, ListenerOptions(name="removed"))
    await env.start(informer)
    env.source.add(cm("a"))
    await removed.wait_for(1)
    informer.remove_event_handler(reg)
    informer.remove_event_handler(reg)
    env.source.add(cm("b"))
    assert await kept.wait_for(2) == [("add", "ns/a", "1", False), ("add", "ns/b", "2", False)]
    assert removed.calls == [("add", "ns/a", "1", False)]
    assert env.observer.events.count(("removed", "removed")) == 1


async def test_raising_handler_does_not_stop_its_listener(env: Env) -> None:
    informer = env.informer()
    rec = RecordingHandler(fail_on=lambda call: call[0] == "add")
    reg = informer.add_event_handler(rec, ListenerOptions(name="flaky"))
    await env.start(informer)
    env.source.add(cm("a"))
    env.source.modify(cm("a", k="v"))
    assert await rec.wait_for(2) == [("add", "ns/a", "1", False), ("update", "ns/a", "1", "2")]
    await until(lambda: env.observer.acks("flaky") == [0, 1], "both acked")
    assert reg.stats().handler_errors == 1
    assert reg.stats().delivered == 1


async def test_default_transform_drops_managed_fields(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    await rec.wait_for(1)
    cached = informer.get_indexer().get_by_key("ns/a")  # type: ignore[arg-type]
    assert cached is not None
    assert "managedFields" not in cached["metadata"]
    assert "managedFields" not in rec.objects[0][2]["metadata"]
    assert env.source.items()[0]["metadata"]["managedFields"] == [{"manager": "kubectl"}]
    with pytest.raises(InformerStartedError):
        informer.set_transform(None)
    with pytest.raises(InformerStartedError):
        informer.set_watch_error_handler(lambda r, e: None)


async def test_transform_none_keeps_objects_whole(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer()
    informer.set_transform(None)
    await env.start(informer)
    cached = informer.get_indexer().get_by_key("ns/a")  # type: ignore[arg-type]
    assert cached is not None
    assert cached["metadata"]["managedFields"] == [{"manager": "kubectl"}]


async def test_observer_sees_seq_acks_and_progress(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec, ListenerOptions(name="rec"))
    await env.start(informer)
    env.source.add(cm("b"))
    env.source.delete(cm("a"))
    await rec.wait_for(3)
    await until(lambda: env.observer.acks("rec") == [0, 1, 2], "acks")
    await until(lambda: ("progress", 3, "3") in env.observer.events, "progress 3")
    assert env.observer.without_acks() == [
        ("dispatched", 0, "add", ("rec",)),
        ("progress", 1, "1"),
        ("dispatched", 1, "add", ("rec",)),
        ("progress", 2, "2"),
        ("dispatched", 2, "delete", ("rec",)),
        ("progress", 3, "3"),
    ]


async def test_slow_listener_does_not_delay_another(env: Env) -> None:
    informer = env.informer()
    gate = asyncio.Event()
    slow, fast = RecordingHandler(gate=gate), RecordingHandler()
    informer.add_event_handler(slow, ListenerOptions(name="slow"))
    informer.add_event_handler(fast, ListenerOptions(name="fast"))
    await env.start(informer)
    for i in range(20):
        env.source.add(cm(f"o{i}"))
    assert len(await fast.wait_for(20)) == 20
    assert slow.calls == []
    gate.set()
    assert len(await slow.wait_for(20)) == 20


@pytest.mark.parametrize("policy", [OverflowPolicy.DROP, OverflowPolicy.COALESCE])
async def test_full_lossy_listener_does_not_block_the_informer(env: Env, policy: OverflowPolicy) -> None:
    informer = env.informer()
    gate = asyncio.Event()
    lossy, fast = RecordingHandler(gate=gate), RecordingHandler()
    reg = informer.add_event_handler(lossy, ListenerOptions(name="lossy", buffer_capacity=2,
                                                            overflow_policy=policy))
    informer.add_event_handler(fast, ListenerOptions(name="fast"))
    await env.start(informer)
    env.source.add(cm("a"))
    await until(lambda: reg.stats().depth == 0 and reg.stats().received == 1, "a taken")
    env.source.add(cm("b"))
    env.source.add(cm("c"))
    for i in range(5):
        env.source.modify(cm("c", k=str(i)))
    assert len(await fast.wait_for(8)) == 8
    stats = reg.stats()
    if policy is OverflowPolicy.DROP:
        assert (stats.dropped, stats.coalesced) == (5, 0)
    else:
        assert (stats.dropped, stats.coalesced) == (0, 5)
    gate.set()
    expected = [("add", "ns/a", "1", False), ("add", "ns/b", "2", False)]
    expected.append(("add", "ns/c", "3", False) if policy is OverflowPolicy.DROP
                    else ("add", "ns/c", "8", False))
    assert await lossy.wait_for(3) == expected
    await until(lambda: sorted(env.observer.acks("lossy")) == list(range(8)), "all acked")


async def test_snapshot_for_one_registration_and_for_all(env: Env) -> None:
    env.source.add(cm("a"))
    env.source.add(cm("b"))
    informer = env.informer()
    one, other = RecordingHandler(), RecordingHandler()
    reg = informer.add_event_handler(one, ListenerOptions(name="one"))
    informer.add_event_handler(other, ListenerOptions(name="other"))
    await env.start(informer)
    await one.wait_for(2)
    await other.wait_for(2)
    informer.request_snapshot(reg)
    calls = await one.wait_for(4)
    assert sorted(calls[2:]) == [("update", "ns/a", "1", "1"), ("update", "ns/b", "2", "2")]
    snapshots = [e for e in env.observer.events if e[0] == "dispatched" and e[2] == "snapshot"]
    assert snapshots == [("dispatched", 2, "snapshot", ("one",))]
    await until(lambda: env.observer.acks("one") == [0, 1, 2], "snapshot acked")
    assert other.calls == [("add", "ns/a", "1", True), ("add", "ns/b", "2", True)]
    informer.request_snapshot()
    assert len(await other.wait_for(4)) == 4
    snapshots = [e for e in env.observer.events if e[0] == "dispatched" and e[2] == "snapshot"]
    assert snapshots[-1] == ("dispatched", 3, "snapshot", ("one", "other"))


async def test_snapshot_carries_cache_and_last_progress_rv(env: Env) -> None:
    env.source.add(cm("a"))
    informer = env.informer()
    received: list[Notification] = []

    class Sink:
        async def handle(self, notification: Notification, ack: Callable[[], None]) -> None:
            received.append(notification)
            ack()

    reg = informer.add_event_handler(Sink(), ListenerOptions(name="sink"))
    await env.start(informer)
    env.source.add(cm("b"))
    await until(lambda: len(received) == 2, "two adds")
    await until(lambda: ("progress", 2, "2") in env.observer.events, "progress")
    informer.request_snapshot(reg)
    await until(lambda: len(received) == 3, "snapshot")
    snap = received[2]
    assert snap.snapshot is not None
    assert sorted(o["metadata"]["name"] for o in snap.snapshot) == ["a", "b"]
    assert (snap.resource_version, snap.seq) == ("2", 2)


async def test_resume_from_checkpoint_watches_without_listing(env: Env) -> None:
    a = env.source.add(cm("a"))
    b = env.source.add(cm("b"))
    stubs = [{"metadata": {k: o["metadata"][k] for k in ("namespace", "name", "uid", "resourceVersion")}}
             for o in (a, b)]
    env.source.modify(cm("a", k="v"))  # rv 3, after the checkpoint
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    informer.seed(CacheSeed(objects=stubs, resource_version="2"))
    await env.start(informer)
    assert await rec.wait_for(1) == [("update", "ns/a", "1", "3")]
    assert env.source.list_calls() == []
    assert env.source.watch_calls()[0].resource_version == "2"
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/b"]


async def test_fill_in_puts_listed_objects_in_place_of_stubs_of_the_same_state(env: Env) -> None:
    """A list taken after a resumed start (the bridge bootstrapping a sink whose start-up list
    failed): each listed object replaces the cached stub of that very state (uid and
    resourceVersion), without a notification; a cached state newer or older than the listed one is
    left alone; the caller learns how far the informer had processed."""
    a = env.source.add(cm("a", k="1"))  # 1
    b = env.source.add(cm("b", k="2"))  # 2
    c = env.source.add(cm("c", k="3"))  # 3
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    informer.seed(CacheSeed(objects=[_stub(a), _stub(b), _stub(c)], resource_version="3"))
    await env.start(informer)
    listed, list_rv = await informer.list_current()
    env.source.modify(cm("b", k="4"))  # 4: newer than the list
    env.source.modify(cm("c", k="5"))  # 5
    await rec.wait_for(2)
    await until(lambda: ("progress", 2, "5") in env.observer.events, "the watch processed to 5")
    stale_c = _stub(c)  # as an older list would have it: not the state the cache holds
    assert await informer.fill_in([*listed, stale_c]) == "5"
    cache = {key: cached for key in ("ns/a", "ns/b", "ns/c")
             if (cached := informer.get_indexer().get_by_key(ObjectKey(key))) is not None}
    assert list_rv == "3"
    assert cache["ns/a"] == {**a, "metadata": {k: v for k, v in a["metadata"].items()
                                               if k != "managedFields"}}  # whole now
    assert cache["ns/b"]["data"] == {"k": "4"}  # the watch's newer state stays
    assert cache["ns/c"]["data"] == {"k": "5"}
    assert len(rec.calls) == 2  # no notification from fill_in


async def test_resume_from_expired_checkpoint_relists_only_differences(env: Env) -> None:
    objs = [env.source.add(cm(name)) for name in ("a", "b", "c")]
    stubs = [{"metadata": {k: o["metadata"][k] for k in ("namespace", "name", "uid", "resourceVersion")}}
             for o in objs]
    env.source.modify(cm("a", k="v"))  # rv 4
    env.source.delete(cm("b"))  # rv 5
    env.source.compact()
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    informer.seed(CacheSeed(objects=stubs, resource_version="3"))
    await env.start(informer, sync=False)
    # Deletes first (controller_test.go TestReplaceEvents), then the items that changed.
    assert await rec.wait_for(2) == [("delete", "ns/b", "2", True), ("update", "ns/a", "1", "4")]
    await until(lambda: informer.last_sync_resource_version() == "5", "relisted")
    assert len(rec.calls) == 2
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/c"]


async def test_a_list_seed_frames_the_first_list_from_its_resource_version(env: Env) -> None:
    """SeedStart.LIST with a resourceVersion: the informer lists as on a first start, against the
    seeded cache (a seeded object the list does not return is a tombstone, one it returns unchanged
    a resync), and the list is framed as a gap from that resourceVersion. No restart rule applies:
    the informer alone notifies what client-go would."""
    a = env.source.add(cm("a"))            # 1
    b = env.source.add(cm("b"))            # 2
    env.source.delete(cm("b"))             # 3
    informer = env.informer()
    frames = _Frames()
    informer.add_event_handler(frames)
    with pytest.raises(ValueError, match="needs a resourceVersion"):
        informer.seed(CacheSeed(objects=[_stub(a)], start=SeedStart.WATCH))
    informer.seed(CacheSeed(objects=[_stub(a), _stub(b)], resource_version="1", start=SeedStart.LIST))
    await env.start(informer)
    await until(lambda: ("gap.end", "1", "3") in frames.seen, "the gap's end")
    assert frames.seen == [("gap.begin", "1", ""), ("delete", "ns/b"), ("gap.end", "1", "3")]
    assert [c.resource_version for c in env.source.list_calls()] == ["0"]


async def test_run_twice_and_shutdown_idempotent(env: Env) -> None:
    informer = env.informer()
    await env.start(informer)
    with pytest.raises(InformerStartedError):
        await informer.run()
    with pytest.raises(InformerStartedError):
        informer.seed(CacheSeed(resource_version="1"))
    await informer.shutdown(1)
    await informer.shutdown(1)


async def test_shutdown_before_run_and_cancellation(env: Env) -> None:
    informer = env.informer()
    await informer.shutdown(1)
    await informer.run()  # returns at once
    other = env.informer()
    task = asyncio.create_task(other.run(), name="cancelled-informer")
    await until(other.has_synced, "synced")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_item_that_fails_processing_is_skipped_and_counted(env: Env) -> None:
    def picky_index(obj: KubeObject) -> list[str]:
        if obj["metadata"]["name"] == "poison":
            raise ValueError("cannot index this object")
        return [obj["metadata"]["name"][0]]

    informer = env.informer(indexers={"initial": picky_index})
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    await env.start(informer)
    env.source.add(cm("poison"))
    env.source.add(cm("fine"))
    assert await rec.wait_for(1) == [("add", "ns/fine", "2", False)]
    assert informer.process_errors == 1
    assert informer.get_indexer().by_index("initial", "f")[0]["metadata"]["name"] == "fine"


async def test_wait_for_cache_sync_gives_up_on_shutdown_and_timeout(env: Env) -> None:
    env.source.fail_next_list(ServerError("boom", code=500))
    informer = env.informer()
    await env.start(informer, sync=False)
    assert await informer.wait_for_cache_sync(0.01) is False  # the list failed; backing off
    waiter = asyncio.create_task(informer.wait_for_cache_sync(30), name="sync-waiter")
    await spin_until_pending(env.clock)
    await informer.shutdown(1)
    assert await waiter is False


async def spin_until_pending(clock: FakeClock) -> None:
    await until(lambda: clock.next_deadline() is not None, "reflector backing off")


def test_drop_managed_fields_is_idempotent_and_copies_only_when_needed() -> None:
    from bridge.informer.transform import drop_managed_fields

    plain = {"metadata": {"name": "a"}, "data": {"k": "v"}}
    assert drop_managed_fields(plain) is plain
    full = cm("a")
    stripped = drop_managed_fields(full)
    assert stripped is not full
    assert stripped["metadata"] == {"namespace": "ns", "name": "a"}
    assert full["metadata"]["managedFields"] == [{"manager": "kubectl"}]  # input untouched
    assert stripped["data"] is full["data"]  # the rest of the tree is shared
    assert drop_managed_fields(stripped) is stripped


async def test_stopping_the_watch_keeps_the_informer_draining(env: Env) -> None:
    """Intake stops before a drain (the service's SIGTERM path): the informer must not treat the
    reflector's return as a failure, and queued notifications still reach the handlers."""
    env.source.add(cm("a"))
    informer = env.informer()
    gate = asyncio.Event()
    rec = RecordingHandler(gate=gate)
    informer.add_event_handler(rec)
    task = asyncio.create_task(informer.run(), name="test-informer-run")
    await until(lambda: informer.reflector is not None and informer.last_sync_resource_version() == "1",
                "initial list")
    env.source.modify(cm("a", k="v"))
    await until(lambda: informer.last_sync_resource_version() == "2", "watch event")
    reflector = informer.reflector
    assert reflector is not None
    reflector.stop()
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done(), "the informer ended when its watch was stopped on purpose"
    gate.set()
    assert [c[0] for c in await rec.wait_for(2)] == ["add", "update"]
    await informer.shutdown(2)
    await task  # no InformerError


def _stub(obj: KubeObject) -> KubeObject:
    return {"metadata": {k: obj["metadata"][k] for k in ("namespace", "name", "uid", "resourceVersion")}}


class _Frames:
    """A NotificationHandler recording changes and gap edges in order, acking at once."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    async def handle(self, notification: Notification, ack: Any) -> None:
        n = notification
        if n.gap is not None:
            self.seen.append(("gap.end" if n.gap.end else "gap.begin", n.gap.from_resource_version,
                              n.gap.to_resource_version))
        else:
            self.seen.append((n.kind.value, str(n.key)))
        ack()


class _CompactAfterFirstPage(FakeControllerSource):
    """Compacts (after one more change) right after serving a first page of a paged list, once."""

    armed = True

    async def list(self, options: ListOptions) -> ListPage:
        page = await super().list(options)
        if self.armed and options.continue_token is None and page.continue_token:
            self.armed = False
            self.add(cm("late"))
            self.compact()
        return page


async def test_an_expired_continuation_on_a_resumed_relist_is_inside_one_gap() -> None:
    """The resume point expired (410) and, while the relist pages, its continuation expires too: one
    gap from the checkpoint's resourceVersion to the full list's frames every event of the relist,
    including those of the first page forwarded before the continuation expired."""
    source = _CompactAfterFirstPage()
    a = source.add(cm("a"))                  # 1  in the checkpoint
    source.add(cm("b"))                      # 2
    source.add(cm("c"))                      # 3
    source.compact()
    informer = SharedIndexInformer(lister_watcher=source, clock=FakeClock(), name="cm", page_size=2)
    rec = _Frames()
    informer.add_event_handler(rec)
    informer.seed(CacheSeed(objects=[_stub(a)], resource_version="1"))
    task = asyncio.create_task(informer.run(), name="test-informer-run")
    try:
        await until(lambda: bool(rec.seen) and rec.seen[-1][0] == "gap.end", "the gap's end")
        assert rec.seen[0] == ("gap.begin", "1", "")
        assert rec.seen[-1] == ("gap.end", "1", "4")
        assert [s for s in rec.seen if s[0].startswith("gap")] == [rec.seen[0], rec.seen[-1]]
        assert sorted(rec.seen[1:-1]) == [("add", "ns/b"), ("add", "ns/c"), ("add", "ns/late")]
    finally:
        await informer.shutdown(1)
        await asyncio.gather(task, return_exceptions=True)


async def test_a_relist_without_differences_still_sends_both_gap_markers(env: Env) -> None:
    """Something may have come and gone inside the window: the markers say so even when the list
    shows no difference. The first list of a fresh informer is no gap."""
    env.source.add(cm("a"))                  # 1
    informer = env.informer()
    rec = _Frames()
    informer.add_event_handler(rec)
    await env.start(informer)
    await until(lambda: rec.seen == [("add", "ns/a")], "the first list")

    def come_and_go() -> None:
        env.source.add(cm("b"))              # 2
        env.source.delete(cm("b"))           # 3

    await env.watch_down_then(come_and_go)
    await until(lambda: len(rec.seen) == 3, "the gap")
    assert rec.seen == [("add", "ns/a"), ("gap.begin", "1", ""), ("gap.end", "1", "3")]

