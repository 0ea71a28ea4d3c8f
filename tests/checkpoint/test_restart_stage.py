"""The restart stage's rows that hold for every sink (:class:`bridge.delivery.restart.InformerRestart`),
driven through a real informer and the fake source: what the informer's handlers are told after a
restart, for changes every sink acknowledged past the checkpoint, objects only the journal knows, keys
some sink knows otherwise, and an exact first list."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bridge.contracts import KubeObject, ObjectKey
from bridge.delivery.restart import InformerRestart
from bridge.informer.seed import SeedStart
from bridge.testing.recorder import RecordingHandler
from tests.informer.test_shared_informer import Env, _Frames, _stub, cm, until


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    yield e
    await e.close()


async def test_resume_does_not_notify_changes_delivered_beyond_the_checkpoint(env: Env) -> None:
    """The checkpoint says RV 2, but the sinks had acknowledged later changes of a (to rv 4) and the
    delete of b (rv 5): the replayed watch updates the cache with them and notifies only what is new."""
    a = env.source.add(cm("a"))            # 1
    b = env.source.add(cm("b"))            # 2
    env.source.modify(cm("a", k="1"))      # 3  delivered before the crash
    env.source.modify(cm("a", k="2"))      # 4  delivered before the crash
    env.source.delete(cm("b"))             # 5  delivered before the crash
    env.source.modify(cm("a", k="3"))      # 6  not delivered (in flight at the crash)
    env.source.add(cm("b", k="again"))     # 7  re-created, not delivered
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    restart = InformerRestart(delivered={"ns/a": (4, False), "ns/b": (5, True)})
    restart.seed(informer, objects=[_stub(a), _stub(b)], resource_version="2")
    await env.start(informer)
    calls = await rec.wait_for(2)
    assert calls == [("update", "ns/a", "4", "6"), ("add", "ns/b", "7", False)]
    assert restart.suppressed_replays == 3
    assert informer.get_indexer().get_by_key(ObjectKey("ns/a"))["data"] == {"k": "3"}  # type: ignore[index]
    assert informer.get_indexer().get_by_key(ObjectKey("ns/b"))["data"] == {"k": "again"}  # type: ignore[index]


async def test_relist_after_resume_skips_what_was_delivered(env: Env) -> None:
    """Resume point expired: the relist's objects at already-delivered versions are not re-sent, a
    delete the sinks already saw is not repeated, and real differences are."""
    a = env.source.add(cm("a"))            # 1
    b = env.source.add(cm("b"))            # 2
    c = env.source.add(cm("c"))            # 3
    env.source.modify(cm("a", k="1"))      # 4  delivered
    env.source.delete(cm("b"))             # 5  delivered
    env.source.modify(cm("c", k="1"))      # 6  not delivered
    env.source.compact()
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    InformerRestart(delivered={"ns/a": (4, False), "ns/b": (5, True)}).seed(
        informer, objects=[_stub(a), _stub(b), _stub(c)], resource_version="3")
    await env.start(informer)
    assert await rec.wait_for(1) == [("update", "ns/c", "3", "6")]
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rec.calls) == 1
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/c"]


def _unconfirmed(name: str, uid: str, rv: str) -> KubeObject:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid, "resourceVersion": rv}}


async def test_relist_reports_unconfirmed_objects_that_are_gone(env: Env) -> None:
    """Objects the journal knows (sinks may have them) but the checkpoint does not: a relist that does
    not return one under its uid reports it deleted (a tombstone); one it returns is an add."""
    a = env.source.add(cm("a"))            # 1  in the checkpoint
    env.source.add(cm("kept"))             # 2  delivered after the checkpoint write, still there
    gone = env.source.add(cm("gone"))      # 3  delivered after the checkpoint write, deleted while down
    env.source.delete(cm("gone"))          # 4
    env.source.add(cm("other"))            # 5  delivered, then re-created under a new uid while down
    env.source.delete(cm("other"))         # 6
    other2 = env.source.add(cm("other"))   # 7
    env.source.compact()
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    InformerRestart(unconfirmed=[_unconfirmed("kept", "uid-ns-kept-2", "2"),
                                 _unconfirmed("gone", gone["metadata"]["uid"], "3"),
                                 _unconfirmed("other", "uid-ns-other-5", "5")]).seed(
        informer, objects=[_stub(a)], resource_version="1")
    await env.start(informer)
    calls = await rec.wait_for(4)
    for _ in range(50):
        await asyncio.sleep(0)
    assert sorted(rec.calls) == sorted([
        ("add", "ns/kept", "2", False),
        ("delete", "ns/gone", "3", True),
        ("delete", "ns/other", "5", True),
        ("add", "ns/other", "7", False),
    ])
    # Per object, the old uid's delete comes before the new one's add.
    assert calls.index(("delete", "ns/other", "5", True)) < calls.index(("add", "ns/other", "7", False))
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a", "ns/kept", "ns/other"]
    assert informer.get_indexer().get_by_key(ObjectKey("ns/other"))["metadata"]["uid"] == (  # type: ignore[index]
        other2["metadata"]["uid"])


@pytest.mark.parametrize("known_from", ["journal", "sink progress"])
async def test_relist_reports_a_later_incarnation_gone_after_an_acknowledged_delete(env: Env,
                                                                                    known_from: str) -> None:
    """Every sink acknowledged the delete of b's first incarnation beyond the checkpoint's resourceVersion
    (delivered ahead: b deleted at 3); then some sink received b's next incarnation (4) before the crash,
    known from the journal (an unconfirmed object) or from that sink's own progress (the cache is
    seeded with what any sink knows). It is deleted while the bridge is down, and the history expires:
    the relist's tombstone is of the later incarnation, a delete no sink has seen — not a repeat of the
    acknowledged one, which is all the delivered-ahead entry vouches for."""
    a = env.source.add(cm("a"))            # 1  in the checkpoint
    env.source.add(cm("b"))                # 2  delivered and acknowledged
    env.source.delete(cm("b"))             # 3  acknowledged too: delivered ahead of the checkpoint (1)
    env.source.add(cm("b", k="2"))         # 4  delivered after the checkpoint write (new uid)
    env.source.delete(cm("b"))             # 5  while down
    env.source.compact()
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    later = _unconfirmed("b", "uid-ns-b-4", "4")
    if known_from == "journal":
        InformerRestart(delivered={"ns/b": (3, True)}, unconfirmed=[later]).seed(
            informer, objects=[_stub(a)], resource_version="1")
    else:
        InformerRestart(delivered={"ns/b": (3, True)}, diverging={"ns/b"}).seed(
            informer, objects=[_stub(a), later], resource_version="1")
    await env.start(informer)
    assert await rec.wait_for(1) == [("delete", "ns/b", "4", True)]
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rec.calls) == 1
    assert informer.get_indexer().list_keys() == ["ns/a"]


async def test_watch_replay_reports_unconfirmed_objects_as_they_happened(env: Env) -> None:
    """The resume point did not expire: the replayed watch shows what happened to each unconfirmed
    object, in order; none of them is mistaken for an update or a delete of another uid."""
    a = env.source.add(cm("a"))            # 1  in the checkpoint
    env.source.add(cm("x"))                # 2  delivered after the checkpoint write
    env.source.delete(cm("x"))             # 3  delivered too
    env.source.add(cm("x", k="2"))         # 4  delivered after the checkpoint write (new uid)
    env.source.delete(cm("x"))             # 5  while down
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    InformerRestart(unconfirmed=[_unconfirmed("x", "uid-ns-x-2", "3"),
                                 _unconfirmed("x", "uid-ns-x-4", "4")]).seed(
        informer, objects=[_stub(a)], resource_version="1")
    await env.start(informer)
    calls = await rec.wait_for(4)
    assert calls == [("add", "ns/x", "2", False), ("delete", "ns/x", "3", False),
                     ("add", "ns/x", "4", False), ("delete", "ns/x", "5", False)]
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rec.calls) == 4
    assert sorted(informer.get_indexer().list_keys()) == ["ns/a"]


async def test_a_replayed_update_of_an_unconfirmed_object_is_an_update(env: Env) -> None:
    """An unconfirmed object (only the journal knows it) whose first replayed change is an update:
    it existed before the watch's start, consumers had its earlier state, so the update goes out as
    the update it was (the same event) — an add would be a new event, possibly after its delete."""
    a = env.source.add(cm("a"))            # 1  in the checkpoint
    env.source.add(cm("x"))                # 2  delivered, the journal's only fact of it later its delete
    env.source.modify(cm("x", k="1"))      # 3
    env.source.delete(cm("x"))             # 4
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    InformerRestart(unconfirmed=[_unconfirmed("x", "uid-ns-x-2", "4")]).seed(
        informer, objects=[_stub(a)], resource_version="2")
    await env.start(informer)
    assert await rec.wait_for(2) == [("update", "ns/x", "4", "3"), ("delete", "ns/x", "4", False)]


async def test_a_list_at_an_exact_resource_version_then_the_watch_from_it(env: Env) -> None:
    """The plan's ``list_at`` (a LIST_EXACT seed): the first list is at exactly that resourceVersion
    (the states a previous run listed, notified as on a first start) and the watch resumes from it,
    replaying every change since one by one; the unconfirmed objects are taken in when that list
    ended, so one created later is not reported gone by it (the watch replays its add, then its
    delete)."""
    env.source.add(cm("a"))                # 1
    env.source.add(cm("b"))                # 2  the previous run's first list
    env.source.modify(cm("a", k="1"))      # 3
    env.source.add(cm("c"))                # 4  delivered by the previous run (journalled)
    env.source.delete(cm("c"))             # 5  while down
    env.source.delete(cm("b"))             # 6  while down
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    InformerRestart(unconfirmed=[_unconfirmed("a", "uid-ns-a-1", "1"),
                                 _unconfirmed("c", "uid-ns-c-4", "4")]).seed(
        informer, resource_version="2", start=SeedStart.LIST_EXACT)
    await env.start(informer)
    calls = await rec.wait_for(6)
    assert calls == [("add", "ns/a", "1", True), ("add", "ns/b", "2", True), ("update", "ns/a", "1", "3"),
                     ("add", "ns/c", "4", False), ("delete", "ns/c", "5", False),
                     ("delete", "ns/b", "6", False)]
    lists = [c.options for c in env.source.calls if c.kind == "list"]
    assert [(o.resource_version, o.resource_version_match) for o in lists] == [("2", "Exact")]
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rec.calls) == 6
    assert informer.get_indexer().list_keys() == ["ns/a"]


async def test_a_list_at_an_expired_resource_version_is_a_list_framed_from_it(env: Env) -> None:
    """The plan's ``list_at`` when the server no longer has that resourceVersion (410): a consistent
    list, framed as a gap from it, reporting the unconfirmed objects it does not return deleted."""
    env.source.add(cm("a"))                # 1
    env.source.add(cm("b"))                # 2  the previous run's first list
    env.source.add(cm("c"))                # 3  delivered by the previous run (journalled)
    env.source.delete(cm("c"))             # 4  while down
    env.source.compact()
    informer = env.informer()
    frames = _Frames()
    informer.add_event_handler(frames)
    InformerRestart(unconfirmed=[_unconfirmed("c", "uid-ns-c-3", "3")]).seed(
        informer, resource_version="2", start=SeedStart.LIST_EXACT)
    await env.start(informer)
    await until(lambda: ("gap.end", "2", "4") in frames.seen, "the gap's end")
    assert (frames.seen[0], frames.seen[-1]) == (("gap.begin", "2", ""), ("gap.end", "2", "4"))
    assert sorted(frames.seen[1:-1]) == [("add", "ns/a"), ("add", "ns/b"), ("delete", "ns/c")]


@pytest.mark.parametrize("cached_rv", ["²", "١٢", "", "4"])
async def test_a_relist_tombstone_of_a_cached_object_without_a_decimal_version(env: Env,
                                                                              cached_rv: str) -> None:
    """As in the test above (sink progress), but the cached later incarnation's resourceVersion may
    not be an etcd revision ("²" passes ``isdigit`` and fails ``int``; "١٢" passes both): such a
    version is unknown, so the acknowledged delete vouches for the tombstone; a decimal one (4)
    newer than that delete is a delete no sink has seen."""
    a = env.source.add(cm("a"))            # 1
    env.source.add(cm("b"))                # 2
    env.source.delete(cm("b"))             # 3  acknowledged
    env.source.add(cm("b", k="2"))         # 4
    env.source.delete(cm("b"))             # 5  while down
    env.source.compact()
    informer = env.informer()
    rec = RecordingHandler()
    informer.add_event_handler(rec)
    later = _unconfirmed("b", "uid-ns-b-4", cached_rv)
    InformerRestart(delivered={"ns/b": (3, True)}, diverging={"ns/b"}).seed(
        informer, objects=[_stub(a), later], resource_version="1")
    await env.start(informer)
    if cached_rv == "4":
        assert await rec.wait_for(1) == [("delete", "ns/b", "4", True)]
    else:
        await until(lambda: informer.has_synced() and informer.get_indexer().list_keys() == ["ns/a"],
                    "the relist")
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rec.calls) == (1 if cached_rv == "4" else 0)
    assert informer.get_indexer().list_keys() == ["ns/a"]
