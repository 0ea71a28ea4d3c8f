"""RealFIFO: exact delta sequences for every rule of the in-order queue, plus progress markers.

Each table row applies a sequence of operations to a fresh queue and asserts the exact pop order, one
entry per delta: ``"ns/name: Type(rv)"``, ``"~rv"`` for a tombstone's object, ``"@rv"`` for a marker.
Rows cite the client-go 1.36 test (``tools/cache/the_real_fifo_test.go``, ``controller_test.go``) or
source line they follow; rows marked *bridge* are the project's own rules (docs/client-go-semantics.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.contracts import DeletedFinalStateUnknown, KubeObject, ObjectKey
from bridge.informer.delta_fifo import (
    Delta,
    DeltaType,
    FIFOClosedError,
    ResourceVersionMarker,
)
from bridge.informer.real_fifo import RealFIFO
from bridge.informer.store import IndexedCache

Op = tuple[Any, ...]


def pod(name: str, rv: str, ns: str = "default") -> KubeObject:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


def parse(spec: str) -> KubeObject:
    """``"a@3"`` → pod a at resourceVersion 3."""
    name, _, rv = spec.partition("@")
    return pod(name, rv)


def tombstone(name: str, rv: str) -> DeletedFinalStateUnknown:
    return DeletedFinalStateUnknown(ObjectKey(f"default/{name}"), pod(name, rv))


def rv_of(obj: KubeObject | DeletedFinalStateUnknown) -> str:
    if isinstance(obj, DeletedFinalStateUnknown):
        return "~" + str(obj.obj["metadata"]["resourceVersion"])
    return str(obj["metadata"]["resourceVersion"])


def render(item: Delta | ResourceVersionMarker) -> str:
    if isinstance(item, ResourceVersionMarker):
        return "@" + item.resource_version
    obj = item.object
    key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else ObjectKey(
        f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
    )
    return f"{key}: {item.type}({rv_of(obj)})"


async def drain(fifo: RealFIFO) -> list[str]:
    """Pops everything queued (deltas and markers) and renders it in pop order."""
    out: list[str] = []

    async def record(item: Delta | ResourceVersionMarker, _initial: bool) -> None:
        out.append(render(item))

    while len(fifo) or fifo.pending_markers:
        await fifo.pop(record)
    return out


def apply(fifo: RealFIFO, ops: Sequence[Op]) -> None:
    for op in ops:
        match op:
            case ("add", spec):
                fifo.add(parse(spec))
            case ("update", spec):
                fifo.update(parse(spec))
            case ("delete", spec):
                fifo.delete(parse(spec))
            case ("tombstone", spec):
                name, _, rv = spec.partition("@")
                fifo.delete(tombstone(name, rv))
            case ("replace", specs, rv):
                fifo.replace([parse(s) for s in specs], rv)
            case ("pages", pages, rv):
                fifo.replace_begin()
                for page in pages:
                    fifo.replace_page([parse(s) for s in page])
                fifo.replace_end(rv)
            case ("resync",):
                fifo.resync()
            case ("rv", rv):
                fifo.update_resource_version(rv)
            case _:
                raise AssertionError(f"unknown op {op!r}")


def cache_of(*specs: str) -> IndexedCache:
    cache = IndexedCache()
    for s in specs:
        cache.add(parse(s))
    return cache


# (id, known objects or None, operations, expected pop order)
SCENARIOS: list[tuple[str, tuple[str, ...] | None, list[Op], list[str]]] = [
    (
        # TestRealFIFO_detectLineJumpers: every delta is delivered in order, none jumps the line.
        "every delta is its own entry, in arrival order across keys",
        None,
        [("add", "a@1"), ("add", "b@1"), ("update", "a@2"), ("update", "b@2"), ("update", "a@3")],
        ["default/a: Added(1)", "default/b: Added(1)", "default/a: Updated(2)", "default/b: Updated(2)",
         "default/a: Updated(3)"],
    ),
    (
        # TestRealFIFO_addUpdate (add, update, delete of one key: three entries).
        "add, update and delete of one key stay three entries",
        None,
        [("add", "a@1"), ("update", "a@2"), ("delete", "a@3")],
        ["default/a: Added(1)", "default/a: Updated(2)", "default/a: Deleted(3)"],
    ),
    (
        # bridge: a delete of a key that is already gone once the queue is applied is dropped
        # (client-go queues it and handlers get a second delete).
        "a delete after a queued delete is dropped",
        None,
        [("add", "a@1"), ("delete", "a@2"), ("delete", "a@3"), ("tombstone", "a@1")],
        ["default/a: Added(1)", "default/a: Deleted(2)"],
    ),
    (
        # TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue, "Added and deleted and added
        # object should be deleted" (without the relist): deletes separated by an add both count.
        "deletes separated by another delta are both kept",
        None,
        [("add", "a@1"), ("delete", "a@2"), ("add", "a@3"), ("delete", "a@4")],
        ["default/a: Added(1)", "default/a: Deleted(2)", "default/a: Added(3)", "default/a: Deleted(4)"],
    ),
    (
        # bridge: client-go's TestRealFIFO_enqueueingNoLister queues a delete of an unknown key
        # ("RealFIFO queues everything"); the bridge drops it: nobody was told the object existed.
        "delete of a key neither queued nor known (no known objects) is dropped",
        None,
        [("delete", "a@2"), ("tombstone", "b@1")],
        [],
    ),
    (
        # bridge (as above), with known objects.
        "delete of a key neither queued nor known (with known objects) is dropped",
        ("x@1",),
        [("delete", "a@2")],
        [],
    ),
    (
        # TestRealFIFO_enqueueingWithLister: "baz" is known, its delete is queued.
        "delete of a known key that is not queued is queued",
        ("a@1",),
        [("delete", "a@2")],
        ["default/a: Deleted(2)"],
    ),
    (
        # TestRealFIFO_ReplaceMakesDeletions, last case (no known objects): the queued key gone from
        # the list is deleted before the list's items are queued.
        "replace without known objects: deletes of queued keys first, then Replaced items",
        None,
        [("add", "a@1"), ("add", "b@1"), ("update", "a@2"), ("replace", ["b@3", "c@3"], "10")],
        [
            "default/a: Added(1)", "default/b: Added(1)", "default/a: Updated(2)",
            "default/a: Deleted(~2)",
            "default/b: Replaced(3)", "default/c: Replaced(3)",
            "@10",
        ],
    ),
    (
        # TestRealFIFO_HasSyncedCorrectOnDeletion: known keys gone from the list get tombstones with
        # the cached object, before the list's items.
        "replace: known keys gone from the list are deleted first, with the cached object",
        ("x@1", "y@1", "z@4"),
        [("replace", ["y@2"], "10")],
        ["default/x: Deleted(~1)", "default/z: Deleted(~4)", "default/y: Replaced(2)", "@10"],
    ),
    (
        # TestRealFIFO_ReplaceMakesDeletions, second case: a queued key's tombstone carries its newest
        # queued object, not the cached one.
        "replace: a known key that is queued uses the newest queued object",
        ("x@1",),
        [("update", "x@2"), ("replace", [], "10")],
        ["default/x: Updated(2)", "default/x: Deleted(~2)", "@10"],
    ),
    (
        # TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue, "Added objects should have a
        # single delete on multiple Replaces".
        "replace twice: one delete, the markers coalesce",
        ("x@1",),
        [("replace", [], "10"), ("replace", [], "11")],
        ["default/x: Deleted(~1)", "@11"],
    ),
    (
        # TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue, "Deleted object should have only
        # a single Delete".
        "replace: a key whose newest delta is a delete gets no second delete",
        None,
        [("add", "a@1"), ("delete", "a@2"), ("replace", [], "10")],
        ["default/a: Added(1)", "default/a: Deleted(2)", "@10"],
    ),
    (
        # TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue, "Added and deleted and added
        # object should be deleted".
        "replace: deleted and re-added in the queue, then gone: deleted with the newest object",
        None,
        [("add", "a@1"), ("delete", "a@2"), ("add", "a@3"), ("replace", [], "10")],
        ["default/a: Added(1)", "default/a: Deleted(2)", "default/a: Added(3)", "default/a: Deleted(~3)",
         "@10"],
    ),
    (
        # TestRealFIFO_replaceWithDeleteDeltaIn: a queued delete, then the list has the key again.
        "replace: a queued delete followed by the listed object",
        ("a@1",),
        [("delete", "a@1"), ("replace", ["a@2"], "10")],
        ["default/a: Deleted(1)", "default/a: Replaced(2)", "@10"],
    ),
    (
        # TestRealFIFO_ReplaceMakesDeletions, "syncing it first": the second replace's delete
        # follows the first replace's items, in order across keys.
        "two replaces in a row keep their order",
        ("foo@5", "bar@6", "baz@7"),
        [("replace", ["bar@100", "foo@5"], "10"), ("replace", ["foo@5"], "11")],
        ["default/baz: Deleted(~7)", "default/bar: Replaced(100)", "default/foo: Replaced(5)", "@10",
         "default/bar: Deleted(~100)", "default/foo: Replaced(5)", "@11"],
    ),
    (
        # bridge: a relist streamed page by page has the order of one replace (the_real_fifo.go
        # reconcileReplacement: deletes first, then the new items).
        "a streamed relist: deletes first, then every page's items",
        ("x@1", "y@1"),
        [("pages", [["y@2"], ["w@3"]], "10")],
        ["default/x: Deleted(~1)", "default/y: Replaced(2)", "default/w: Replaced(3)", "@10"],
    ),
    (
        # TestRealFIFO_ReplaceMakesDeletionsReplaced: a known key present in the list gets Replaced.
        "replace: a known key present in the list gets only Replaced",
        ("a@1",),
        [("replace", ["a@1"], "10")],
        ["default/a: Replaced(1)", "@10"],
    ),
    (
        "replace with an empty list and nothing known queues only the marker",
        (),
        [("replace", [], "7")],
        ["@7"],
    ),
    (
        # TestRealFIFO_UpdateResyncRace and TestRealFIFO_Resync: Sync for known keys with nothing
        # queued, after what is queued.
        "resync queues Sync with the cached object only for known keys with nothing queued",
        ("a@1", "b@1", "c@1"),
        [("update", "b@2"), ("resync",)],
        ["default/b: Updated(2)", "default/a: Sync(1)", "default/c: Sync(1)"],
    ),
    (
        # TestRealFIFO_ResyncNonExisting: a queued delete is not followed by a Sync.
        "resync after a queued delete of a known key queues nothing more for it",
        ("a@1",),
        [("delete", "a@2"), ("resync",)],
        ["default/a: Deleted(2)"],
    ),
    (
        "resync without known objects does nothing",
        None,
        [("add", "a@1"), ("resync",)],
        ["default/a: Added(1)"],
    ),
    (
        "resync twice queues one Sync per key (the first is still queued)",
        ("a@1",),
        [("resync",), ("resync",)],
        ["default/a: Sync(1)"],
    ),
    (
        # bridge: progress markers (client-go 1.36 queues Bookmark deltas likewise, RealFIFO.Bookmark).
        "consecutive markers coalesce into the newest",
        None,
        [("rv", "5"), ("rv", "6"), ("rv", "7")],
        ["@7"],
    ),
    (
        "markers keep their place between deltas",
        None,
        [("add", "a@1"), ("rv", "1"), ("add", "b@2"), ("rv", "2"), ("add", "c@3")],
        ["default/a: Added(1)", "@1", "default/b: Added(2)", "@2", "default/c: Added(3)"],
    ),
    (
        "a later delta of the same key stays after the marker that came before it",
        None,
        [("add", "a@1"), ("rv", "1"), ("update", "a@2"), ("rv", "2")],
        ["default/a: Added(1)", "@1", "default/a: Updated(2)", "@2"],
    ),
    (
        "the marker queued by replace coalesces with a following update_resource_version",
        None,
        [("replace", ["a@1"], "10"), ("rv", "11")],
        ["default/a: Replaced(1)", "@11"],
    ),
]


@pytest.mark.parametrize(
    ("known", "ops", "expected"),
    [pytest.param(k, o, e, id=i) for i, k, o, e in SCENARIOS],
)
async def test_delta_sequences(
    known: tuple[str, ...] | None, ops: list[Op], expected: list[str]
) -> None:
    cache = cache_of(*known) if known is not None else None
    fifo = RealFIFO(known_objects=cache)
    apply(fifo, ops)
    assert await drain(fifo) == expected
    assert len(fifo) == 0
    assert fifo.pending_markers == 0


def test_delete_keeps_exact_objects_and_tombstone_contents() -> None:
    cache = cache_of("x@1")
    fifo = RealFIFO(known_objects=cache)
    cached = cache.get_by_key(ObjectKey("default/x"))
    fifo.replace([], "9")
    assert fifo.get_by_key(ObjectKey("default/x")) == [
        Delta(DeltaType.DELETED, DeletedFinalStateUnknown(ObjectKey("default/x"), pod("x", "1")))
    ]
    deltas = fifo.get_by_key(ObjectKey("default/x"))
    assert deltas is not None
    tomb = deltas[0].object
    assert isinstance(tomb, DeletedFinalStateUnknown)
    assert tomb.obj is cached  # the cached object itself, not a copy


def test_get_by_key_returns_a_copy_and_inspection_helpers() -> None:
    fifo = RealFIFO()
    fifo.add(pod("a", "1"))
    fifo.update_resource_version("1")
    fifo.add(pod("b", "2", ns=""))
    got = fifo.get_by_key(ObjectKey("default/a"))
    assert got == [Delta(DeltaType.ADDED, pod("a", "1"))]
    assert got is not None
    got.append(Delta(DeltaType.UPDATED, pod("a", "9")))
    assert fifo.get_by_key(ObjectKey("default/a")) == [Delta(DeltaType.ADDED, pod("a", "1"))]
    assert fifo.get_by_key(ObjectKey("default/zzz")) is None
    fifo.update(pod("a", "3"))
    assert fifo.get_by_key(ObjectKey("default/a")) == [Delta(DeltaType.ADDED, pod("a", "1")),
                                                       Delta(DeltaType.UPDATED, pod("a", "3"))]
    assert fifo.list_keys() == ["default/a", "b", "default/a"]
    assert fifo.entries() == ["default/a", ResourceVersionMarker("1"), "b", "default/a"]
    assert len(fifo) == 3
    assert fifo.pending_markers == 1


def test_delta_type_values() -> None:
    assert [t.value for t in DeltaType] == ["Added", "Updated", "Deleted", "Replaced", "Sync"]
    assert isinstance(DeltaType.SYNC, str)
    assert f"{DeltaType.SYNC}" == "Sync"


# -------------------------------------------------------------------------- initial population


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    async def __call__(self, item: Delta | ResourceVersionMarker, initial: bool) -> None:
        self.calls.append((render(item), initial))


async def test_has_synced_and_is_in_initial_list_follow_the_first_replace() -> None:
    fifo = RealFIFO(known_objects=IndexedCache())
    rec = Recorder()
    assert not fifo.has_synced()
    fifo.replace([pod("a", "1"), pod("b", "1")], "5")
    assert not fifo.has_synced()
    fifo.add(pod("c", "6"))

    await fifo.pop(rec)
    assert not fifo.has_synced()
    await fifo.pop(rec)
    assert fifo.has_synced()
    await fifo.pop(rec)  # the marker
    await fifo.pop(rec)
    assert rec.calls == [
        ("default/a: Replaced(1)", True),
        ("default/b: Replaced(1)", True),
        ("@5", False),
        ("default/c: Added(6)", False),
    ]
    assert fifo.has_synced()


async def test_a_streamed_first_relist_is_initial_until_its_end_and_syncs_after_it() -> None:
    fifo = RealFIFO(known_objects=IndexedCache())
    rec = Recorder()
    fifo.replace_begin()
    fifo.replace_page([pod("a", "1"), pod("b", "1")])
    await fifo.pop(rec)  # popped while the list goes on: part of the initial list
    assert not fifo.has_synced()
    fifo.replace_page([pod("c", "1")])
    await fifo.pop(rec)
    assert not fifo.has_synced()  # nothing left queued, but the list is not complete
    fifo.replace_end("5")
    assert not fifo.has_synced()
    await fifo.pop(rec)
    assert fifo.has_synced()
    await fifo.pop(rec)
    assert rec.calls == [
        ("default/a: Replaced(1)", True),
        ("default/b: Replaced(1)", True),
        ("default/c: Replaced(1)", True),
        ("@5", False),
    ]


async def test_a_streamed_relist_holds_its_items_until_its_deletions_are_known() -> None:
    """the_real_fifo.go, reconcileReplacement: "We cannot add the items until after the synthetic
    deletes have been created". A relist streamed while the consumer knows objects (or has deltas
    queued) keeps its pages back until its end, then queues the deletions first."""
    cache = cache_of("a@1", "gone@1")
    fifo = RealFIFO(known_objects=cache)
    fifo.mark_populated()
    fifo.update(pod("queued-gone", "2"))
    fifo.replace_begin()
    fifo.replace_page([pod("a", "3")])
    applied: list[str] = []

    async def apply_to_cache(item: Delta | ResourceVersionMarker, _initial: bool) -> None:
        applied.append(render(item))
        if not isinstance(item, ResourceVersionMarker) and not isinstance(item.object,
                                                                          DeletedFinalStateUnknown):
            cache.update(item.object)

    # What was queued before the relist is popped while it goes on; its pages are held.
    assert await fifo.pop_ready(apply_to_cache) == 1
    assert applied == ["default/queued-gone: Updated(2)"]
    assert len(fifo) == 0
    assert fifo.queued_deltas == 1  # the held page counts in the backlog
    fifo.replace_page([pod("new", "3")])
    fifo.replace_end("3")
    assert await drain(fifo) == [
        "default/gone: Deleted(~1)",
        "default/queued-gone: Deleted(~2)",  # applied meanwhile: known, in the cache's order
        "default/a: Replaced(3)",
        "default/new: Replaced(3)",
        "@3",
    ]


async def test_an_aborted_first_list_keeps_what_it_queued_and_infers_no_deletion() -> None:
    fifo = RealFIFO(known_objects=IndexedCache())
    fifo.replace_begin()
    fifo.replace_page([pod("a", "2")])
    fifo.replace_abort()
    assert await drain(fifo) == ["default/a: Replaced(2)"]  # poppable at once: may have been seen


async def test_an_aborted_held_relist_is_dropped_and_the_next_one_infers_its_deletions() -> None:
    """reflector.go list(): a list that fails is dropped whole (nothing reaches the store); so are
    the pages a relist held back, which nobody saw."""
    fifo = RealFIFO(known_objects=cache_of("gone@1"))
    fifo.mark_populated()
    fifo.replace_begin()
    fifo.replace_page([pod("a", "2")])
    assert len(fifo) == 0  # held: "gone" may be deleted by this list
    assert fifo.queued_deltas == 1
    fifo.replace_abort()
    assert fifo.queued_deltas == 0
    assert fifo.queued_bytes == 0
    assert await drain(fifo) == []
    # A restarted list (replace_begin again) drops the held pages of the attempt before it.
    fifo.replace_begin()
    fifo.replace_page([pod("b", "3")])
    fifo.replace_begin()
    fifo.replace_page([pod("a", "2")])
    fifo.replace_end("4")
    assert await drain(fifo) == ["default/gone: Deleted(~1)", "default/a: Replaced(2)", "@4"]


def test_streamed_relist_calls_out_of_order_are_errors() -> None:
    fifo = RealFIFO()
    with pytest.raises(RuntimeError, match="replace_page"):
        fifo.replace_page([pod("a", "1")])
    with pytest.raises(RuntimeError, match="replace_end"):
        fifo.replace_end("1")


async def test_initial_population_counts_deletions_and_previously_queued_keys() -> None:
    cache = cache_of("gone@1")
    fifo = RealFIFO(known_objects=cache)
    # Nothing populates the queue before the first replace except add/update/delete; a resync does not.
    fifo.resync()
    assert not fifo.has_synced()
    fifo.replace([pod("a", "2")], "5")
    rec = Recorder()
    for _ in range(4):
        await fifo.pop(rec)
    assert rec.calls == [
        ("default/gone: Sync(1)", True),
        ("default/gone: Deleted(~1)", True),
        ("default/a: Replaced(2)", True),
        ("@5", False),
    ]
    assert fifo.has_synced()


async def test_a_later_replace_does_not_reset_the_initial_population() -> None:
    fifo = RealFIFO()
    fifo.replace([pod("a", "1")], "1")
    rec = Recorder()
    await fifo.pop(rec)
    assert fifo.has_synced()
    fifo.replace([pod("a", "2"), pod("b", "2")], "2")
    assert fifo.has_synced()
    for _ in range(4):
        await fifo.pop(rec)
    assert rec.calls == [("default/a: Replaced(1)", True), ("@1", False), ("default/a: Replaced(2)", False),
                         ("default/b: Replaced(2)", False), ("@2", False)]


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(lambda f: f.add(pod("x", "1")), id="add"),
        pytest.param(lambda f: f.update(pod("x", "1")), id="update"),
        pytest.param(lambda f: f.delete(pod("x", "1")), id="delete-even-when-dropped"),
        pytest.param(lambda f: f.mark_populated(), id="mark_populated"),
    ],
)
async def test_add_update_delete_or_mark_populated_before_replace_populate_with_no_initial_items(
    first: Any,
) -> None:
    fifo = RealFIFO()
    first(fifo)
    assert fifo.has_synced()
    fifo.replace([pod("a", "1")], "5")
    assert fifo.has_synced()
    rec = Recorder()
    while len(fifo) or fifo.pending_markers:
        await fifo.pop(rec)
    assert [initial for _, initial in rec.calls] == [False] * len(rec.calls)
    assert ("default/a: Replaced(1)", False) in rec.calls


def test_mark_populated_after_replace_changes_nothing() -> None:
    fifo = RealFIFO()
    fifo.replace([pod("a", "1")], "5")
    fifo.mark_populated()
    assert not fifo.has_synced()


async def test_markers_never_count_as_initial_items() -> None:
    fifo = RealFIFO()
    fifo.update_resource_version("3")
    fifo.replace([pod("a", "4")], "5")
    rec = Recorder()
    await fifo.pop(rec)
    assert rec.calls == [("@3", False)]
    assert not fifo.has_synced()
    await fifo.pop(rec)
    assert rec.calls[-1] == ("default/a: Replaced(4)", True)
    assert fifo.has_synced()


# -------------------------------------------------------------------------- transform


class CountingTransform:
    """Adds a marker field and counts calls; idempotent."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, obj: KubeObject) -> KubeObject:
        self.seen.append(obj["metadata"]["name"] + "@" + obj["metadata"]["resourceVersion"])
        return {**obj, "transformed": True}


def test_transform_runs_on_add_update_delete_and_replace_items() -> None:
    t = CountingTransform()
    fifo = RealFIFO(known_objects=cache_of("k@1"), transform=t)
    fifo.add(pod("a", "1"))
    fifo.update(pod("a", "2"))
    fifo.delete(pod("k", "2"))
    fifo.replace([pod("a", "3"), pod("b", "3")], "3")  # k is deleted already: no tombstone
    assert t.seen == ["a@1", "a@2", "k@2", "a@3", "b@3"]
    for key in ("default/a", "default/k", "default/b"):
        deltas = fifo.get_by_key(ObjectKey(key))
        assert deltas is not None
        assert all(isinstance(d.object, dict) and d.object["transformed"] for d in deltas)


def test_transform_never_runs_on_tombstones_or_sync() -> None:
    t = CountingTransform()
    cache = cache_of("x@1", "y@1")
    fifo = RealFIFO(known_objects=cache, transform=t)
    fifo.resync()
    fifo.delete(tombstone("y", "1"))
    fifo.replace([], "2")
    assert t.seen == []
    assert fifo.get_by_key(ObjectKey("default/x")) == [
        Delta(DeltaType.SYNC, pod("x", "1")),
        Delta(DeltaType.DELETED, DeletedFinalStateUnknown(ObjectKey("default/x"), pod("x", "1"))),
    ]
    assert fifo.get_by_key(ObjectKey("default/y")) == [
        Delta(DeltaType.SYNC, pod("y", "1")),
        Delta(DeltaType.DELETED, tombstone("y", "1")),
    ]


def test_replace_tombstone_carries_the_already_transformed_queued_object() -> None:
    t = CountingTransform()
    fifo = RealFIFO(transform=t)
    fifo.add(pod("a", "1"))
    fifo.replace([], "2")
    assert t.seen == ["a@1"]
    deltas = fifo.get_by_key(ObjectKey("default/a"))
    assert deltas is not None
    tomb = deltas[1].object
    assert isinstance(tomb, DeletedFinalStateUnknown)
    assert tomb.obj == {**pod("a", "1"), "transformed": True}


def test_a_transform_error_propagates_and_queues_nothing() -> None:
    def boom(obj: KubeObject) -> KubeObject:
        raise RuntimeError("bad object")

    fifo = RealFIFO(transform=boom)
    with pytest.raises(RuntimeError, match="bad object"):
        fifo.add(pod("a", "1"))
    assert len(fifo) == 0


def test_custom_key_func_is_used() -> None:
    def by_uid(obj: Any) -> ObjectKey:
        if isinstance(obj, DeletedFinalStateUnknown):
            return obj.key
        return ObjectKey(obj["metadata"]["uid"])

    fifo = RealFIFO(key_func=by_uid)
    fifo.add({"metadata": {"name": "a", "uid": "u1"}})
    fifo.add({"metadata": {"name": "a", "uid": "u2"}})
    assert fifo.list_keys() == ["u1", "u2"]
    u2 = {"metadata": {"name": "a", "uid": "u2"}}
    assert fifo.get_by_key(ObjectKey("u2")) == [Delta(DeltaType.ADDED, u2)]


def test_object_without_name_is_rejected_with_a_clear_message() -> None:
    fifo = RealFIFO()
    with pytest.raises(KeyError, match=r"metadata\.name"):
        fifo.add({"kind": "Pod", "metadata": {"generateName": "web-"}})
    assert len(fifo) == 0


# -------------------------------------------------------------------------- pop, close


async def test_pop_waits_for_an_item() -> None:
    fifo = RealFIFO()
    rec = Recorder()
    task = asyncio.create_task(fifo.pop(rec), name="test-pop")
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    fifo.add(pod("a", "1"))
    await asyncio.wait_for(task, timeout=5)
    assert rec.calls == [("default/a: Added(1)", False)]


async def test_pop_is_woken_by_a_marker() -> None:
    fifo = RealFIFO()
    rec = Recorder()
    task = asyncio.create_task(fifo.pop(rec), name="test-pop")
    await asyncio.sleep(0)
    fifo.update_resource_version("42")
    await asyncio.wait_for(task, timeout=5)
    assert rec.calls == [("@42", False)]


async def test_close_wakes_a_waiting_pop_with_fifo_closed_error() -> None:
    fifo = RealFIFO()
    task = asyncio.create_task(fifo.pop(Recorder()), name="test-pop")
    await asyncio.sleep(0)
    assert not fifo.is_closed
    fifo.close()
    assert fifo.is_closed
    with pytest.raises(FIFOClosedError):
        await asyncio.wait_for(task, timeout=5)


async def test_a_closed_queue_drains_before_raising() -> None:
    fifo = RealFIFO()
    fifo.add(pod("a", "1"))
    fifo.update_resource_version("1")
    fifo.close()
    rec = Recorder()
    await fifo.pop(rec)
    await fifo.pop(rec)
    assert rec.calls == [("default/a: Added(1)", False), ("@1", False)]
    with pytest.raises(FIFOClosedError):
        await fifo.pop(rec)


async def test_an_error_in_process_propagates_and_the_delta_is_not_requeued() -> None:
    fifo = RealFIFO(known_objects=IndexedCache())
    fifo.add(pod("a", "1"))
    fifo.add(pod("b", "1"))

    async def fail(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        raise ValueError("handler broke")

    with pytest.raises(ValueError, match="handler broke"):
        await fifo.pop(fail)
    assert fifo.list_keys() == ["default/b"]
    # The failed key is no longer in flight: a delete for it is judged by the cache alone (dropped).
    fifo.delete(pod("a", "2"))
    assert fifo.list_keys() == ["default/b"]


async def test_pop_hands_one_delta_at_a_time_and_removes_it_first() -> None:
    fifo = RealFIFO()
    fifo.add(pod("a", "1"))
    fifo.update(pod("a", "2"))
    got: list[Delta | ResourceVersionMarker] = []

    async def keep(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        got.append(item)
        # removed before process runs
        assert fifo.get_by_key(ObjectKey("default/a")) == ([Delta(DeltaType.UPDATED, pod("a", "2"))]
                                                           if len(got) == 1 else None)

    await fifo.pop(keep)
    await fifo.pop(keep)
    assert got == [Delta(DeltaType.ADDED, pod("a", "1")), Delta(DeltaType.UPDATED, pod("a", "2"))]
    assert len(fifo) == 0


# -------------------------------------------------------------------------- while a key is processed


class CacheApplier:
    """A consumer like the informer's HandleDeltas: it pauses before applying a delta (as a listener
    with a full buffer would) so the test can act while the delta is in flight, then applies it."""

    def __init__(self, cache: IndexedCache) -> None:
        self.cache = cache
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def __call__(self, item: Delta | ResourceVersionMarker, initial: bool) -> None:
        if isinstance(item, ResourceVersionMarker):
            return
        self.paused.set()
        await self.resume.wait()
        if item.type is DeltaType.DELETED:
            self.cache.delete(item.object)
        else:
            assert isinstance(item.object, dict)
            self.cache.update(item.object)


async def _start_processing(fifo: RealFIFO, applier: CacheApplier) -> asyncio.Task[None]:
    task = asyncio.create_task(fifo.pop(applier), name="test-pop")
    await asyncio.wait_for(applier.paused.wait(), timeout=5)
    return task


async def _finish(task: asyncio.Task[None], applier: CacheApplier) -> None:
    applier.resume.set()
    await asyncio.wait_for(task, timeout=5)


async def test_resync_during_processing_syncs_the_object_being_applied_not_the_stale_cache() -> None:
    cache = cache_of("a@1")
    fifo = RealFIFO(known_objects=cache)
    fifo.update(pod("a", "2"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)
    fifo.resync()
    await _finish(task, applier)
    assert fifo.get_by_key(ObjectKey("default/a")) == [Delta(DeltaType.SYNC, pod("a", "2"))]


async def test_resync_during_processing_of_a_delete_queues_nothing_for_that_key() -> None:
    cache = cache_of("a@1")
    fifo = RealFIFO(known_objects=cache)
    fifo.delete(pod("a", "2"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)
    fifo.resync()
    assert len(fifo) == 0
    await _finish(task, applier)
    assert cache.list_keys() == []


async def test_replace_during_processing_of_a_delete_reports_no_second_delete() -> None:
    cache = cache_of("a@1", "b@1")
    fifo = RealFIFO(known_objects=cache)
    fifo.delete(pod("a", "2"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)
    fifo.replace([pod("b", "3")], "3")
    await _finish(task, applier)
    assert fifo.entries() == ["default/b", ResourceVersionMarker("3", relist_end=True)]


async def test_replace_during_processing_of_an_add_tombstones_the_object_being_added() -> None:
    cache = IndexedCache()
    fifo = RealFIFO(known_objects=cache)
    fifo.add(pod("a", "1"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)
    fifo.replace([], "3")
    await _finish(task, applier)
    assert fifo.get_by_key(ObjectKey("default/a")) == [
        Delta(DeltaType.DELETED, DeletedFinalStateUnknown(ObjectKey("default/a"), pod("a", "1")))
    ]


async def test_delete_during_processing_is_judged_by_the_state_being_applied() -> None:
    cache = IndexedCache()
    fifo = RealFIFO(known_objects=cache)
    fifo.add(pod("a", "1"))
    fifo.add(pod("b", "1"))
    fifo.delete(pod("b", "2"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)  # a: Added, not yet in the cache
    fifo.delete(pod("a", "2"))
    assert fifo.get_by_key(ObjectKey("default/a")) == [Delta(DeltaType.DELETED, pod("a", "2"))]
    await _finish(task, applier)

    applier2 = CacheApplier(cache)
    task = await _start_processing(fifo, applier2)  # b: Added; its Deleted is still queued
    fifo.delete(pod("b", "3"))  # b will be gone once the queue is applied: a second delete is dropped
    await _finish(task, applier2)
    assert fifo.list_keys() == ["default/b", "default/a"]


async def test_add_during_processing_queues_a_new_entry_at_the_tail() -> None:
    cache = IndexedCache()
    fifo = RealFIFO(known_objects=cache)
    fifo.add(pod("a", "1"))
    fifo.add(pod("b", "1"))
    applier = CacheApplier(cache)
    task = await _start_processing(fifo, applier)
    fifo.update(pod("a", "2"))
    await _finish(task, applier)
    assert fifo.list_keys() == ["default/b", "default/a"]
    assert fifo.get_by_key(ObjectKey("default/a")) == [Delta(DeltaType.UPDATED, pod("a", "2"))]


# -------------------------------------------------------------------------- property: markers and convergence

# A model API server whose changes reach the queue through a watch that may drop; a relist brings it
# back. The consumer applies popped deltas to a cache as the informer does, and may be interrupted
# before applying one by any other operation (the reflector keeps running while a listener blocks).

_NAMES = ["a", "b"]
_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(_NAMES)),
    st.tuples(st.just("remove"), st.sampled_from(_NAMES)),
    st.tuples(st.just("drop"),),
    st.tuples(st.just("relist"),),
    st.tuples(st.just("streamed-relist"), st.integers(min_value=0, max_value=2)),
    st.tuples(st.just("resync"),),
    st.tuples(st.just("pop"),),
    st.tuples(st.just("drain"),),
    st.tuples(st.just("pop-interrupted"), st.sampled_from(["put", "remove", "relist", "resync"]),
              st.sampled_from(_NAMES)),
)


class _World:
    def __init__(self) -> None:
        self.rv = 0
        self.server: dict[str, KubeObject] = {}
        self.history: dict[int, dict[str, KubeObject]] = {0: {}}
        self.watching = False
        self.cache = IndexedCache()
        self.fifo = RealFIFO(known_objects=self.cache)
        self.markers_seen = 0
        self.applied_rv: dict[ObjectKey, int] = {}

    def change(self, kind: str, name: str) -> None:
        key = f"default/{name}"
        if kind == "remove" and key not in self.server:
            return
        self.rv += 1
        obj = pod(name, str(self.rv))
        existed = key in self.server
        if kind == "put":
            self.server[key] = obj
        else:
            del self.server[key]
        self.history[self.rv] = dict(self.server)
        if self.watching:
            if kind == "remove":
                self.fifo.delete(obj)
            elif existed:
                self.fifo.update(obj)
            else:
                self.fifo.add(obj)
            self.fifo.update_resource_version(str(self.rv))

    def relist(self) -> None:
        self.fifo.replace(list(self.server.values()), str(self.rv))
        self.watching = True

    def streamed_relist(self, pops_between_pages: int) -> None:
        """The same relist one item per page, the consumer popping between the pages."""
        self.fifo.replace_begin()
        for obj in list(self.server.values()):
            self.fifo.replace_page([obj])
            for _ in range(pops_between_pages):
                self.pop(None)
        self.fifo.replace_end(str(self.rv))
        self.watching = True

    def run(self, op: tuple[Any, ...]) -> None:
        match op:
            case ("put" | "remove" as kind, name):
                self.change(kind, name)
            case ("drop",):
                self.watching = False
            case ("relist",):
                self.relist()
            case ("streamed-relist", pops):
                self.streamed_relist(pops)
            case ("resync",):
                self.fifo.resync()
            case ("pop",):
                self.pop(None)
            case ("drain",):
                while len(self.fifo) or self.fifo.pending_markers:
                    self.pop(None)
            case ("pop-interrupted", kind, name):
                self.pop((kind, name))

    def pop(self, interruption: tuple[str, str] | None) -> None:
        if not len(self.fifo) and not self.fifo.pending_markers:
            return

        async def process(item: Delta | ResourceVersionMarker, _initial: bool) -> None:
            if isinstance(item, ResourceVersionMarker):
                self.check_marker(int(item.resource_version))
                return
            if interruption is not None:
                kind, name = interruption
                self.run((kind,) if kind in ("relist", "resync") else (kind, name))
            key = ObjectKey(f"default/{name_of(item.object)}")
            if item.type is DeltaType.DELETED:
                # Deletions are reported once: the key is always cached when its delete is applied.
                assert key in self.cache, (key, item)
                self.cache.delete(item.object)
            else:
                assert isinstance(item.object, dict)
                # Never regress: a resync or relist must not re-apply an older state.
                rv = int(item.object["metadata"]["resourceVersion"])
                assert rv >= self.applied_rv.get(key, 0), (key, rv, self.applied_rv)
                self.applied_rv[key] = rv
                self.cache.update(item.object)

        _run_without_suspending(self.fifo.pop(process))

    def check_marker(self, marker_rv: int) -> None:
        """In order across keys: at a marker, the cache is exactly the server's state at the
        marker's resourceVersion (every change up to it applied, none after it)."""
        self.markers_seen += 1
        assert marker_rv <= self.rv
        cached = {k: self.cache.get_by_key(ObjectKey(k)) for k in self.cache.list_keys()}
        assert cached == self.history[marker_rv], (marker_rv, self.rv)


def name_of(obj: KubeObject | DeletedFinalStateUnknown) -> str:
    return str((obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj)["metadata"]["name"])


def _run_without_suspending(coro: Any) -> None:
    """Drives a pop whose queue is non-empty and whose process never waits: it must not suspend."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("pop suspended although the queue was not empty")


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_at_every_marker_the_cache_is_the_servers_state_and_it_converges(
    ops: list[tuple[Any, ...]],
) -> None:
    world = _World()
    world.relist()
    for op in ops:
        world.run(op)
    world.relist()
    while len(world.fifo) or world.fifo.pending_markers:
        world.pop(None)
    assert {k: world.cache.get_by_key(ObjectKey(k)) for k in world.cache.list_keys()} == world.server
    assert world.fifo.has_synced()
    assert world.markers_seen >= 1


async def test_queued_deltas_and_bytes_follow_adds_pops_and_dropped_deletes() -> None:
    """The informer's queue reports its backlog (issue #18: a listener catching up stops at a
    bound on it): deltas and their objects' JSON bytes, RawObjects counted by their bytes."""
    from bridge.rawobject import RawObject

    fifo = RealFIFO()
    a1 = RawObject.from_dict({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1"}})
    a2 = RawObject.from_dict({"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "2",
                                           "labels": {"x": "y"}}})
    fifo.add(a1)
    fifo.update(a2)
    assert fifo.queued_deltas == 2
    assert fifo.queued_bytes == len(a1.raw) + len(a2.raw)
    fifo.delete(a2)
    fifo.delete(DeletedFinalStateUnknown(key=ObjectKey("ns/a"), obj=a2))  # a is deleted already: dropped
    assert fifo.queued_deltas == 3
    assert fifo.queued_bytes == len(a1.raw) + 2 * len(a2.raw)

    async def process(_item: object, _initial: bool) -> None:
        return None

    await fifo.pop(process)
    assert fifo.queued_deltas == 2
    assert fifo.queued_bytes == 2 * len(a2.raw)
    assert await fifo.pop_ready(process) == 2
    assert fifo.queued_deltas == 0
    assert fifo.queued_bytes == 0


async def test_pop_ready_takes_what_is_ready_now_and_what_processing_queues_meanwhile() -> None:
    """One call pops every ready entry in queue order; an entry queued while ``process`` awaits
    joins the run; with the queue empty it returns instead of waiting for more."""
    fifo = RealFIFO()
    fifo.add(pod("a", "1"))
    fifo.update_resource_version("1")
    fifo.add(pod("b", "2"))
    seen: list[object] = []

    async def process(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        if isinstance(item, ResourceVersionMarker):
            seen.append(item.resource_version)
            return
        seen.append([(item.type.value, item.object["metadata"]["name"])])  # type: ignore[index]
        if len(seen) == 1:
            fifo.update(pod("a", "3"))  # a is in flight: queued again, at the end
        await asyncio.sleep(0)

    assert await fifo.pop_ready(process) == 4
    assert seen == [[("Added", "a")], "1", [("Added", "b")], [("Updated", "a")]]
    assert len(fifo) == 0
    waiter = asyncio.create_task(fifo.pop_ready(process))
    await asyncio.sleep(0.01)
    assert not waiter.done()  # nothing ready: waits for the first entry only
    fifo.add(pod("c", "4"))
    assert await waiter == 1


async def test_pop_ready_stops_at_its_limit_its_deadline_or_when_told() -> None:
    fifo = RealFIFO()
    for i in range(6):
        fifo.add(pod(f"p{i}", str(i + 1)))
    popped: list[str] = []

    async def process(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        assert not isinstance(item, ResourceVersionMarker)
        popped.append(item.object["metadata"]["name"])  # type: ignore[index]

    assert await fifo.pop_ready(process, limit=2) == 2
    loop = asyncio.get_running_loop()
    assert await fifo.pop_ready(process, until=loop.time() - 1) == 1  # always one entry first
    assert await fifo.pop_ready(process, stop=lambda: len(popped) >= 4) == 1
    assert fifo.list_keys() == ["default/p4", "default/p5"]
    assert popped == ["p0", "p1", "p2", "p3"]
    fifo.close()
    assert await fifo.pop_ready(process) == 2
    with pytest.raises(FIFOClosedError):
        await fifo.pop_ready(process)


async def test_pop_ready_looks_at_its_deadline_and_stop_after_deltas_only() -> None:
    """A progress marker follows nearly every watch event: the clock and ``stop`` are read after a
    delta, never after a marker (the marker that follows a delta is taken in the same run), while
    ``limit`` counts every entry."""
    fifo = RealFIFO()
    for i in range(3):
        fifo.add(pod(f"p{i}", str(i + 1)))
        fifo.update_resource_version(str(i + 1))
    seen: list[str] = []
    stops = 0

    async def process(item: Delta | ResourceVersionMarker, initial: bool) -> None:
        if isinstance(item, ResourceVersionMarker):
            seen.append(f"rv{item.resource_version}")
        else:
            seen.append(item.object["metadata"]["name"])  # type: ignore[index]

    def stop() -> bool:
        nonlocal stops
        stops += 1
        return True

    loop = asyncio.get_running_loop()
    assert await fifo.pop_ready(process, until=loop.time() - 1) == 1
    assert await fifo.pop_ready(process, stop=stop) == 2  # the marker, then a delta
    assert stops == 1
    assert await fifo.pop_ready(process, limit=1) == 1  # a marker counts for the limit
    assert seen == ["p0", "rv1", "p1", "rv2"]


async def test_a_full_queue_makes_the_watch_wait_until_half_of_it_is_worked_off() -> None:
    """Backpressure where client-go's queue would grow without bound: once more than
    ``max_queued_bytes`` are queued, ``add``/``update``/``delete`` hand the producer (the reflector
    awaits it) something to wait on, released once the queue is down to half."""
    fifo = RealFIFO(max_queued_bytes=4 * 1024)  # four dict objects (counted at 1 KiB each)
    waits = [fifo.add(pod(f"p{i}", str(i + 1))) for i in range(5)]
    assert waits[:4] == [None] * 4
    room = waits[4]
    assert room is not None
    other = fifo.update(pod("p0", "9"))  # every producer call while full gets something to wait on
    assert other is not None
    other.cancel()  # a producer stopped while it waits: the others keep waiting
    await asyncio.sleep(0)
    assert len(fifo) == 6

    async def process(_item: object, _initial: bool) -> None:
        return None

    await fifo.pop_ready(process, limit=3)
    await asyncio.sleep(0)
    assert not room.done()  # 3 KiB still queued
    await fifo.pop_ready(process, limit=1)
    await asyncio.wait_for(room, 30)  # down to half (the deadline only stops a hang)
    assert fifo.add(pod("q", "10")) is None
    fifo.close()
