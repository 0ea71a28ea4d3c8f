"""Property: for any sequence of changes, every past snapshot the history still covers is exact, and
replaying the history from any such resourceVersion onto that snapshot gives the current state."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.sim import ObjectStore, WatchFilter
from bridge.sim.status import Expired

_NAMES = ["a", "b", "c", "d"]
_OPS = st.lists(
    st.tuples(st.sampled_from(["create", "update", "delete", "compact"]), st.sampled_from(_NAMES),
              st.sampled_from(["default", "other"]), st.integers(0, 3)),
    max_size=40,
)


def _state(store: ObjectStore) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in store.list("configmaps")}


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, history=st.integers(1, 12))
def test_snapshots_and_replay_are_exact(ops: list[tuple[str, str, str, int]], history: int) -> None:
    store = ObjectStore(history_size=history, initial_namespaces=())
    rt = store.resolve("configmaps")
    states: dict[int, dict[tuple[str, str], dict[str, Any]]] = {store.resource_version: {}}
    for op, name, ns, value in ops:
        present = (ns, name) in _state(store)
        if op == "create" and not present:
            store.create("configmaps", {"metadata": {"name": name, "labels": {"v": str(value)}}},
                         namespace=ns)
        elif op == "update" and present:
            store.patch("configmaps", name, {"data": {"v": str(value)}}, namespace=ns)
        elif op == "delete" and present:
            store.delete("configmaps", name, namespace=ns)
        elif op == "compact":
            store.compact()
        states[store.resource_version] = _state(store)
    current = _state(store)
    compacted = store.compacted_rv(rt)
    for rv, expected in states.items():
        if rv < compacted:
            try:
                store.snapshot(rt, at_rv=rv)
            except Expired:
                continue
            raise AssertionError(f"snapshot at {rv} < compacted {compacted} did not expire")
        snap = {k: o for k, o in store.snapshot(rt, at_rv=rv)}
        assert snap == expected
        # replay: watch from rv, apply its backlog to the snapshot → the current state
        watcher = store.watch(rt, from_rv=rv, scope=WatchFilter())
        rebuilt = dict(snap)
        for change in watcher.take(10_000):
            key = (change.obj["metadata"]["namespace"], change.obj["metadata"]["name"])
            if change.type == "DELETED":
                del rebuilt[key]
            else:
                rebuilt[key] = change.obj
        watcher.close()
        assert rebuilt == current
    rvs = [int(o["metadata"]["resourceVersion"]) for o in current.values()]
    assert all(rv <= store.resource_version for rv in rvs)
