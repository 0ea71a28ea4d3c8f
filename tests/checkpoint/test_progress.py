"""AckTracker: the checkpoint low-watermark under out-of-order acks, markers and removals."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.contracts import DeletedFinalStateUnknown, Gap, Notification, NotificationKind, ObjectKey
from bridge.delivery.progress import AckTracker, object_key


def obj(name: str, rv: str, uid: str = "", ns: str = "default") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "resourceVersion": rv}}


def n(kind: NotificationKind, o: dict[str, object], seq: int) -> Notification:
    return Notification(kind=kind, obj=o, seq=seq, key=object_key(o))


ADD, UPDATE, DELETE = NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE


def test_in_order_acks_advance_rv_and_index() -> None:
    t = AckTracker()
    t.dispatched(n(ADD, obj("a", "10"), 0), ["k", "w"])
    t.progress(1, "10")
    assert t.checkpoint_state() == ("", {})
    assert (t.pending, t.lag) == (1, 1)
    t.acked("k", 0)
    assert t.checkpoint_state() == ("", {})
    t.acked("w", 0)
    assert t.checkpoint_state() == ("10", {"default/a": ("uid-a", "10")})
    assert (t.pending, t.lag) == (0, 0)


def test_out_of_order_acks_wait_for_the_prefix() -> None:
    t = AckTracker(resource_version="5", index={"default/z": ("uid-z", "5")})
    t.dispatched(n(ADD, obj("a", "10"), 0), ["k"])
    t.progress(1, "10")
    t.dispatched(n(UPDATE, obj("a", "11"), 1), ["k"])
    t.progress(2, "11")
    t.dispatched(n(DELETE, obj("z", "12"), 2), ["k"])
    t.progress(3, "12")
    t.acked("k", 2)
    t.acked("k", 1)
    assert t.checkpoint_state() == ("5", {"default/z": ("uid-z", "5")})
    assert (t.pending, t.lag) == (1, 3)
    t.acked("k", 0)
    assert t.checkpoint_state() == ("12", {"default/a": ("uid-a", "11")})
    assert (t.pending, t.lag) == (0, 0)


def test_marker_passes_only_when_everything_before_it_is_acked() -> None:
    t = AckTracker()
    t.dispatched(n(ADD, obj("a", "10"), 0), ["k"])
    t.dispatched(n(ADD, obj("b", "11"), 1), ["k"])
    t.progress(1, "10")  # a bookmark-like marker between the two
    t.progress(2, "11")
    t.acked("k", 0)
    assert t.checkpoint_state() == ("10", {"default/a": ("uid-a", "10")})
    t.acked("k", 1)
    assert t.checkpoint_state()[0] == "11"
    # A marker with nothing in flight (a bookmark) passes at once.
    t.progress(2, "20")
    assert t.checkpoint_state()[0] == "20"


def test_listener_removal_releases_its_pending_acks() -> None:
    t = AckTracker()
    t.dispatched(n(ADD, obj("a", "10"), 0), ["k", "dead"])
    t.dispatched(n(ADD, obj("b", "11"), 1), ["k", "dead"])
    t.progress(2, "11")
    t.acked("k", 0)
    t.acked("k", 1)
    assert t.pending == 2
    assert t.pending_by_listener() == {"dead": 2}
    t.listener_removed("dead")
    assert t.checkpoint_state() == ("11", {"default/a": ("uid-a", "10"), "default/b": ("uid-b", "11")})
    assert t.pending == 0


def test_tombstone_delete_and_duplicate_acks() -> None:
    t = AckTracker(resource_version="1", index={"default/a": ("uid-a", "1")})
    tomb = DeletedFinalStateUnknown(key=ObjectKey("default/a"), obj=obj("a", "1"))
    t.dispatched(Notification(kind=DELETE, obj=tomb, seq=3), ["k"])
    t.progress(4, "9")
    t.acked("k", 3)
    t.acked("k", 3)
    t.acked("k", 99)
    t.acked("k", -1)
    assert t.checkpoint_state() == ("9", {})
    assert t.duplicate_acks == 2


def test_untracked_and_listenerless_notifications() -> None:
    t = AckTracker()
    t.dispatched(n(ADD, obj("late", "3"), -1), ["k"])  # replay to a late handler: not tracked
    t.dispatched(n(ADD, obj("a", "4"), 0), [])  # nobody listens: applied at once
    t.progress(1, "4")
    assert t.checkpoint_state() == ("4", {"default/a": ("uid-a", "4")})
    assert t.lag == 0


def test_snapshot_notification_is_tracked_but_leaves_the_index() -> None:
    t = AckTracker()
    t.dispatched(n(ADD, obj("a", "10"), 0), ["k", "w"])
    t.dispatched(n(ADD, obj("b", "11"), 1), ["k", "w"])
    t.progress(2, "11")
    snap = Notification(
        kind=NotificationKind.SNAPSHOT,
        obj={},
        seq=2,
        snapshot=[obj("a", "10"), obj("b", "11"), obj("c", "7", ns="")],
        resource_version="11",
    )
    t.dispatched(snap, ["w"])
    t.progress(3, "11")
    t.acked("k", 0)
    t.acked("k", 1)
    t.acked("w", 0)
    t.acked("w", 1)
    assert t.pending == 1
    assert t.checkpoint_state() == ("11", {"default/a": ("uid-a", "10"), "default/b": ("uid-b", "11")})
    t.acked("w", 2)
    # The snapshot restates the cache; the index is built from changes only.
    assert t.checkpoint_state() == ("11", {"default/a": ("uid-a", "10"), "default/b": ("uid-b", "11")})
    assert (t.pending, t.lag, t.last_applied_seq) == (0, 0, 2)


def test_recreated_object_index_holds_the_new_uid() -> None:
    t = AckTracker()
    t.dispatched(n(DELETE, obj("a", "20", uid="old"), 0), ["k"])
    t.dispatched(n(ADD, obj("a", "21", uid="new"), 1), ["k"])
    t.progress(2, "21")
    t.acked("k", 1)
    t.acked("k", 0)
    assert t.checkpoint_state() == ("21", {"default/a": ("new", "21")})


def test_changes_newer_than_the_resume_point_wait_for_their_marker() -> None:
    # The FIFO keeps key "a" at its place: its update at RV 13 is processed before the marker for
    # RV 12. The index must still describe RV 12 exactly, or a resume from 12 would replay 13
    # against a cache that already has it.
    t = AckTracker(resource_version="10", index={"default/a": ("uid-a", "10"), "default/gone": ("g", "9")})
    t.dispatched(n(UPDATE, obj("a", "11"), 0), ["k"])
    t.dispatched(n(UPDATE, obj("a", "13"), 1), ["k"])
    t.dispatched(n(DELETE, obj("gone", "14"), 2), ["k"])
    t.dispatched(n(ADD, obj("b", "12"), 3), ["k"])
    t.progress(4, "12")
    for seq in range(4):
        t.acked("k", seq)
    assert t.checkpoint_state() == (
        "12", {"default/a": ("uid-a", "11"), "default/gone": ("g", "9"), "default/b": ("uid-b", "12")})
    t.progress(4, "13")  # a bookmark-like marker
    assert t.checkpoint_state() == (
        "13", {"default/a": ("uid-a", "13"), "default/gone": ("g", "9"), "default/b": ("uid-b", "12")})
    t.progress(4, "14")
    assert t.checkpoint_state() == ("14", {"default/a": ("uid-a", "13"), "default/b": ("uid-b", "12")})


def test_relist_tombstone_is_covered_by_the_next_marker() -> None:
    t = AckTracker(resource_version="20", index={"default/a": ("uid-a", "5"), "default/b": ("uid-b", "6")})
    tomb = DeletedFinalStateUnknown(key=ObjectKey("default/a"), obj=obj("a", "5"))
    t.dispatched(Notification(kind=DELETE, obj=tomb, seq=0), ["k"])
    t.dispatched(n(UPDATE, obj("b", "40"), 1), ["k"])
    t.progress(2, "40")  # the relist's resourceVersion
    t.acked("k", 1)
    t.acked("k", 0)
    assert t.checkpoint_state() == ("40", {"default/b": ("uid-b", "40")})


def test_non_integer_resource_versions_are_applied_at_once() -> None:
    t = AckTracker(resource_version="abc")
    t.dispatched(n(ADD, obj("a", "xyz"), 0), ["k"])
    t.acked("k", 0)
    assert t.checkpoint_state() == ("abc", {"default/a": ("uid-a", "xyz")})


def test_inferred_deletes_are_recognised() -> None:
    t = AckTracker(resource_version="5", index={"default/r": ("old", "3"), "default/w": ("uid-w", "4")})
    # A relist found "r" re-created: the informer deletes the state it knew (the checkpoint's).
    t.dispatched(n(DELETE, obj("r", "3", uid="old"), 0), ["k"])
    t.dispatched(n(ADD, obj("r", "9", uid="new"), 1), ["k"])
    # A delete seen on the watch carries its own resourceVersion.
    t.dispatched(n(DELETE, obj("w", "10"), 2), ["k"])
    t.dispatched(n(ADD, obj("x", "11"), 3), ["k"])
    t.dispatched(n(UPDATE, obj("x", "12"), 4), ["k"])
    t.dispatched(n(DELETE, obj("x", "12"), 5), ["k"])  # the state last dispatched: inferred
    tomb = DeletedFinalStateUnknown(key=ObjectKey("default/y"), obj=obj("y", "1"))
    t.dispatched(Notification(kind=DELETE, obj=tomb, seq=6), ["k"])
    assert [t.is_unobserved_delete(s) for s in range(7)] == [True, False, False, False, False, True, True]
    for seq in range(7):
        t.acked("k", seq)
    assert not t.is_unobserved_delete(0)  # forgotten once acknowledged


def test_delivered_ahead_names_acked_changes_beyond_the_resume_point() -> None:
    t = AckTracker(resource_version="5", index={"default/a": ("uid-a", "5"), "default/b": ("uid-b", "4")})
    t.dispatched(n(UPDATE, obj("a", "7"), 0), ["k"])
    t.dispatched(n(DELETE, obj("b", "8"), 1), ["k"])
    t.progress(2, "6")  # an older marker: the key of a is ahead of it
    t.acked("k", 0)
    t.acked("k", 1)
    assert t.checkpoint_state() == ("6", {"default/a": ("uid-a", "5"), "default/b": ("uid-b", "4")})
    assert t.delivered_ahead() == {"default/a": ("uid-a", "7", False), "default/b": ("", "8", True)}
    t.progress(3, "8")
    assert t.checkpoint_state() == ("8", {"default/a": ("uid-a", "7")})
    assert t.delivered_ahead() == {}


def test_seeded_ahead_entries_fold_in_when_a_marker_covers_them() -> None:
    t = AckTracker(resource_version="5", index={"default/a": ("uid-a", "5")},
                   ahead={"default/a": ("uid-a", "9", False)})
    assert t.delivered_ahead() == {"default/a": ("uid-a", "9", False)}
    t.progress(0, "9")
    assert t.checkpoint_state() == ("9", {"default/a": ("uid-a", "9")})
    assert t.delivered_ahead() == {}


def test_a_relist_tombstone_after_changes_held_ahead_folds_after_them() -> None:
    t = AckTracker(resource_version="5", index={"default/a": ("uid-a", "5")})
    t.dispatched(n(UPDATE, obj("a", "9"), 0), ["k"])
    tombstone = DeletedFinalStateUnknown(ObjectKey("default/a"), obj("a", "9"))
    t.dispatched(Notification(kind=DELETE, obj=tombstone, seq=1, key=ObjectKey("default/a")), ["k"])
    t.acked("k", 0)
    t.acked("k", 1)
    assert t.delivered_ahead() == {"default/a": ("", "9", True)}
    t.progress(2, "9")
    assert t.checkpoint_state() == ("9", {})


def test_folding_many_keys_is_by_resource_version() -> None:
    t = AckTracker(resource_version="1")
    for i in range(200):
        t.dispatched(n(UPDATE, obj(f"o{i}", str(100 + i)), i), ["k"])
        t.acked("k", i)
    t.progress(200, "149")
    rv, index = t.checkpoint_state()
    assert rv == "149"
    assert sorted(index) == sorted(f"default/o{i}" for i in range(50))
    assert len(t.delivered_ahead()) == 150
    t.progress(201, "299")
    assert len(t.checkpoint_state()[1]) == 200
    assert t.delivered_ahead() == {}


# -------------------------------------------------------------------------- property: the resume point

_KEYS = ["a", "b", "c"]
_LISTENERS = ["k", "w"]
_op = st.one_of(
    st.tuples(st.just("change"), st.sampled_from(_KEYS), st.booleans(), st.booleans()),
    st.tuples(st.just("ack"), st.sampled_from(_LISTENERS), st.integers(min_value=0, max_value=50)),
)


class _AckWorld:
    """Changes dispatched in resourceVersion order, in reads (a progress marker after the last change
    of each, as the reflector queues one per read of the watch), acked by two listeners in any order;
    the tracker's resume point must only ever cover acknowledged changes, and what it records beyond
    it only changes every listener acknowledged."""

    def __init__(self) -> None:
        self.tracker = AckTracker(name="prop")
        self.rv = 0
        self.state: dict[str, tuple[str, str]] = {}
        self.history: dict[int, dict[str, tuple[str, str]]] = {0: {}}
        self.rv_of_seq: list[int] = []
        self.pending: dict[str, list[int]] = {name: [] for name in _LISTENERS}
        self.generation = 0
        self.resume = 0

    def change(self, key: str, delete: bool, ends_read: bool = True) -> None:
        self.rv += 1
        rv = str(self.rv)
        seq = len(self.rv_of_seq)
        full = f"default/{key}"
        if delete and full in self.state:
            uid = self.state.pop(full)[0]
            notification = n(DELETE, obj(key, rv, uid), seq)
        else:
            kind = UPDATE if full in self.state else ADD
            uid = self.state[full][0] if full in self.state else f"uid-{key}-{rv}"
            self.state[full] = (uid, rv)
            notification = n(kind, obj(key, rv, uid), seq)
        self.history[self.rv] = dict(self.state)
        self.rv_of_seq.append(self.rv)
        self.tracker.dispatched(notification, _LISTENERS)
        if ends_read:
            self.tracker.progress(seq + 1, rv)
        for name in _LISTENERS:
            self.pending[name].append(seq)

    def ack(self, listener: str, pick: int) -> None:
        owed = self.pending[listener]
        if owed:
            self.tracker.acked(listener, owed.pop(pick % len(owed)))

    def check(self) -> None:
        rv_text, index = self.tracker.checkpoint_state()
        resume = int(rv_text) if rv_text else 0
        assert resume >= self.resume, "the resume point went back"
        self.resume = resume
        unacked = {seq for owed in self.pending.values() for seq in owed}
        # Safety: a watch resumed at this point replays every change after it; every change at or
        # before it has been acknowledged by every listener.
        assert all(self.rv_of_seq[seq] > resume for seq in unacked), (resume, sorted(unacked))
        # The index is exactly the world as of the resume point.
        assert index == self.history[resume]
        # Beyond it, only the newest change of an object acknowledged by every listener, and every
        # change acknowledged without a hole from the resume point on (a read acknowledged in part).
        acked_rvs = {rv for seq, rv in enumerate(self.rv_of_seq) if seq not in unacked}
        ahead = self.tracker.delivered_ahead()
        for key, (_uid, rv, _deleted) in ahead.items():
            assert int(rv) > resume, (key, rv, resume)
            assert int(rv) in acked_rvs, (key, rv, resume)
        prefix = next((seq for seq, rv in enumerate(self.rv_of_seq) if rv > resume and seq in unacked),
                      len(self.rv_of_seq))
        newest = {rv: key for key in _KEYS for rv in [self._newest_rv(key, resume, prefix)] if rv}
        assert {rv: key.removeprefix("default/") for key, (_u, rv, _d) in ahead.items()} == {
            str(rv): key for rv, key in newest.items()}

    def _newest_rv(self, key: str, resume: int, prefix: int) -> int:
        """The newest change of ``key`` after ``resume`` among the first ``prefix`` seqs (0: none)."""
        full = f"default/{key}"
        found = 0
        for seq in range(prefix):
            rv = self.rv_of_seq[seq]
            if rv > resume and self.history[rv].get(full) != self.history[rv - 1].get(full):
                found = rv
        return found


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=60), st.randoms(use_true_random=False))
def test_the_resume_point_covers_only_acknowledged_changes_and_catches_up(
    ops: list[tuple[Any, ...]], rng: random.Random,
) -> None:
    world = _AckWorld()
    for op in ops:
        if op[0] == "change":
            world.change(op[1], op[2], op[3])
        else:
            world.ack(op[1], op[2])
        world.check()
    # Everything acknowledged, in any order: the resume point reaches the newest change.
    owed = [(name, seq) for name, seqs in world.pending.items() for seq in seqs]
    rng.shuffle(owed)
    for name, seq in owed:
        world.pending[name].remove(seq)
        world.tracker.acked(name, seq)
        world.check()
    if world.rv:
        world.tracker.progress(len(world.rv_of_seq), str(world.rv))  # the last read's marker
        world.check()
    assert world.tracker.checkpoint_state() == (str(world.rv) if world.rv else "", world.state)


def _gap(begin: bool, seq: int) -> Notification:
    gap = Gap(id="relist", from_resource_version="2", to_resource_version="" if begin else "5", end=not begin)
    return Notification(kind=NotificationKind.GAP, obj={}, seq=seq, gap=gap)


def test_a_state_acknowledged_inside_a_relist_window_is_own_progress_once_its_end_is() -> None:
    """The window (2, 5] coalesced a change of ``a`` at 3; ``k`` acknowledges the window's begin and
    the state at 4 while ``w`` lags. Until ``k`` acknowledges the end its own progress does not hold
    the state (after a crash its filter would skip 3 and 4 with no window naming 3 closed for it),
    whatever order it acknowledges in; once it does, the state is its own."""
    for order in ([0, 1, 3, 2], [0, 1, 2, 3]):
        t = AckTracker(resource_version="2", index={"default/a": ("uid-a", "2"), "default/b": ("uid-b", "2")})
        t.dispatched(_gap(True, 0), ["k", "w"])
        t.dispatched(n(UPDATE, obj("a", "4"), 1), ["k", "w"])
        t.dispatched(n(UPDATE, obj("b", "5"), 2), ["k", "w"])
        t.dispatched(_gap(False, 3), ["k", "w"])
        t.progress(4, "5")
        states = []
        for seq in order:
            t.acked("k", seq)
            states.append(t.listener_state("k", 2, {}))
        *before, last = states
        assert all(s[1].get("default/a") is None for s in before[:order.index(3)]), (order, states)
        assert last == (5, {"default/a": ("uid-a", 4, False), "default/b": ("uid-b", 5, False)}), order
