"""The per-sink filter after a restart (:class:`bridge.delivery.replay.SinkResume`): table tests of
what one sink receives for each notification, given its own resume point and knowledge, and of the
invariant it keeps (a key leaves ``known`` once the sink and the informer agree on it)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.contracts import (
    DeletedFinalStateUnknown,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.delivery.progress import Known
from bridge.delivery.replay import SinkResume

ADD, UPDATE, DELETE = NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE


def obj(uid: str, rv: int, name: str = "a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": str(rv)}}


def note(kind: NotificationKind, uid: str, rv: int, *, tombstone: bool = False) -> Notification:
    o = obj(uid, rv)
    target: Any = DeletedFinalStateUnknown(ObjectKey("ns/a"), o) if tombstone else o
    return Notification(kind=kind, obj=target, key=ObjectKey("ns/a"), seq=1)


def resume(rv: int, mine: Known | None) -> SinkResume:
    return SinkResume(resource_version=rv, known={} if mine is None else {"ns/a": mine},
                      api_version="v1", kind="ConfigMap")


@pytest.mark.parametrize(
    ("sink_rv", "mine", "n", "inferred", "expect", "still_known"),
    [
        # At or below the sink's own resume point: it has it.
        (10, None, note(UPDATE, "u1", 9), False, [], False),
        (10, None, note(DELETE, "u1", 10), False, [], False),
        # Newer, the sink agrees with the informer on the key: passes unchanged.
        (10, None, note(UPDATE, "u1", 11), False, [(UPDATE, "u1", "11")], False),
        # Covered by what it acknowledged of that object beyond its resume point.
        (10, ("u1", 15, False), note(UPDATE, "u1", 12), False, [], True),
        (10, ("u1", 15, False), note(UPDATE, "u1", 15), False, [], False),
        (10, ("u1", 15, False), note(UPDATE, "u1", 16), False, [(UPDATE, "u1", "16")], False),
        # An object it never knew: an update becomes an add; a delete is dropped.
        (10, ("", -1, True), note(UPDATE, "u1", 12), False, [(ADD, "u1", "12")], False),
        (10, ("", -1, True), note(DELETE, "u1", 0, tombstone=True), True, [], False),
        (10, ("", -1, True), note(DELETE, "u1", 12), True, [], False),
        # Known to it, unknown to the informer: an add becomes an update (dropped at the same RV).
        (10, ("u1", 12, False), note(ADD, "u1", 13), False, [(UPDATE, "u1", "13")], False),
        (10, ("u1", 12, False), note(ADD, "u1", 12), False, [], False),
        # It saw the delete already.
        (10, ("u1", 14, True), note(DELETE, "u1", 14), False, [], False),
        (10, ("u1", 14, True), note(UPDATE, "u1", 13), False, [], True),
        # A relist's tombstone of the informer's object while the sink knows another uid: the
        # delete of the sink's own object.
        (10, ("u2", 14, False), note(DELETE, "u1", 8, tombstone=True), True, [(DELETE, "u2", "14")], False),
        # The old object of a re-creation the sink never had: dropped; the add follows.
        (10, ("u2", 14, False), note(DELETE, "u1", 8), True, [], True),
        # A third incarnation: the sink's own object is deleted first.
        (10, ("u2", 14, False), note(UPDATE, "u3", 20), False, [(DELETE, "u2", "14"), (ADD, "u3", "20")],
         False),
        # A delete of the uid it knows: delivered.
        (10, ("u1", 12, False), note(DELETE, "u1", 0, tombstone=True), True, [(DELETE, "u1", "0")], False),
    ],
)
def test_admit(sink_rv: int, mine: Known | None, n: Notification, inferred: bool,
               expect: list[tuple[NotificationKind, str, str]], still_known: bool) -> None:
    r = resume(sink_rv, mine)
    got = r.admit(n, inferred)
    seen = []
    for g in got:
        o = g.obj.obj if isinstance(g.obj, DeletedFinalStateUnknown) else g.obj
        meta = o["metadata"]
        seen.append((g.kind, meta["uid"], meta["resourceVersion"]))
        assert g.seq == n.seq  # acknowledged as the informer's notification
    assert seen == expect
    assert ("ns/a" in r.known) is still_known
    assert r.skipped == (1 if not expect else 0)


@pytest.mark.parametrize(
    ("mine", "n", "inferred", "expect", "still_known"),
    [
        # Its section says it saw the key deleted (or never knew it), yet the journal says u1 may
        # have reached it after the write: the delete goes out, observed or inferred.
        (("", 10, True), note(DELETE, "u1", 0, tombstone=True), True, [(DELETE, "u1", "0")], False),
        (("", -1, True), note(DELETE, "u1", 12), False, [(DELETE, "u1", "12")], False),
        (("", -1, True), note(DELETE, "u1", 12), True, [(DELETE, "u1", "12")], False),
        # It knows another uid: a relist's tombstone deletes both; otherwise its own stays known.
        (("u2", 14, False), note(DELETE, "u1", 8, tombstone=True), True,
         [(DELETE, "u1", "8"), (DELETE, "u2", "14")], False),
        (("u2", 14, False), note(DELETE, "u1", 8), True, [(DELETE, "u1", "8")], True),
        (("u2", 14, False), note(DELETE, "u1", 12), False, [(DELETE, "u1", "12")], True),
        # Its own resume point covers the delete: it has it.
        (("", -1, True), note(DELETE, "u1", 9), False, [], False),
    ],
)
def test_a_delete_of_a_uid_the_sink_may_hold_goes_out(
        mine: Known, n: Notification, inferred: bool,
        expect: list[tuple[NotificationKind, str, str]], still_known: bool) -> None:
    r = SinkResume(resource_version=10, known={"ns/a": mine}, maybe={"u1"}, api_version="v1",
                   kind="ConfigMap")
    got = r.admit(n, inferred)
    seen = []
    for g in got:
        o = g.obj.obj if isinstance(g.obj, DeletedFinalStateUnknown) else g.obj
        seen.append((g.kind, o["metadata"]["uid"], o["metadata"]["resourceVersion"]))
    assert seen == expect
    assert ("ns/a" in r.known) is still_known
    assert not r.maybe  # its delete was decided: no longer a question
    # Without the journal's word the same deletes were dropped (what the fault schedule found).
    if expect:
        assert n not in resume(10, mine).admit(n, inferred)


def gone_stub(uid: str, rv: int) -> Notification:
    """A relist's notice that a journal-only object of ns/a is gone (the key may live on)."""
    return Notification(kind=DELETE, obj=UnconfirmedGone(ObjectKey("ns/a"), obj(uid, rv)),
                        key=ObjectKey("ns/a"), seq=1)


@pytest.mark.parametrize(
    ("mine", "maybe", "expect", "known_after"),
    [
        # It holds another uid: the journal-only object's end says nothing about it (it stays).
        (("u2", 14, False), False, [], ("u2", 14, False)),
        (("u2", 14, False), True, [(DELETE, "u1", "5")], ("u2", 14, False)),
        # It holds that very object: the delete goes out, and the key's object is news to it.
        (("u1", 12, False), False, [(DELETE, "u1", "5")], ("", -1, True)),
        # It saw the key deleted: nothing, unless it may hold the object.
        (("", 12, True), False, [], ("", 12, True)),
        (("", 12, True), True, [(DELETE, "u1", "5")], ("", -1, True)),
        (None, False, [(DELETE, "u1", "5")], None),
    ],
)
def test_a_journal_only_object_gone_is_not_the_keys_end(
        mine: Known | None, maybe: bool, expect: list[tuple[NotificationKind, str, str]],
        known_after: Known | None) -> None:
    r = SinkResume(resource_version=10, known={} if mine is None else {"ns/a": mine},
                   maybe={"u1"} if maybe else (), api_version="v1", kind="ConfigMap")
    got = r.admit(gone_stub("u1", 5), True)
    seen = []
    for g in got:
        o = g.obj.obj if isinstance(g.obj, DeletedFinalStateUnknown) else g.obj
        seen.append((g.kind, o["metadata"]["uid"], o["metadata"]["resourceVersion"]))
    assert seen == expect
    assert r.known.get("ns/a") == known_after


def test_own_progress_takes_the_changes_applied_before_the_first_checkpoint_write() -> None:
    """A resumed sink's section is computed from every change since the resume, not from the
    first checkpoint write on: one that saw ns/a deleted and then received its re-creation agrees
    with the base in the next write (it does not still claim to have seen ns/a deleted)."""
    from bridge.delivery.progress import AckTracker

    own: dict[str, Known] = {"ns/a": Known("", 10, True)}  # fast saw u1 deleted; the base has u1
    t = AckTracker(name="x", resource_version="5", index={"ns/a": ("u1", "5")})
    t.follow_listener("fast", 10, own)
    for seq, change in enumerate([note(DELETE, "u1", 8), note(ADD, "u2", 12)]):
        t.dispatched(Notification(kind=change.kind, obj=change.obj, key=change.key, seq=seq),
                     ["fast", "slow"])
        t.acked("fast", seq)
        t.acked("slow", seq)
    t.progress(2, "12")
    assert t.checkpoint_state() == ("12", {"ns/a": ("u2", "12")})
    assert t.listener_state("fast", 10, own) == (12, {})
    # A scan begun only now (as before) would say fast saw ns/a deleted, although it has u2.
    late = AckTracker(name="y", resource_version="12", index={"ns/a": ("u2", "12")})
    assert late.listener_state("fast", 10, own) == (12, {"ns/a": None})


def test_own_progress_keeps_what_a_sink_acknowledged_past_its_prefix() -> None:
    """docs/delivery-contract.md, section 3: a sink that acknowledged ns/b's update but not ns/a's
    earlier one keeps its resume point (the prefix stops at ns/a) and records ns/b's update as
    delivered ahead, so its filter skips it after a crash; of ns/c it acknowledged the later update
    only: that one is recorded (the earlier one is older than what its destination has). Of ns/d it
    owes the delete of the first uid and acknowledged the re-creation: the re-creation is recorded,
    and the delete it owes is named (:meth:`AckTracker.owed_deletes`), so that a restart sends it."""
    from bridge.delivery.progress import AckTracker

    t = AckTracker(name="x", resource_version="5",
                   index={"ns/a": ("ua", "3"), "ns/b": ("ub", "4"), "ns/c": ("uc", "5"), "ns/d": ("ud", "1")})
    changes = [(UPDATE, "a", "ua", 6), (UPDATE, "b", "ub", 7), (UPDATE, "c", "uc", 8), (UPDATE, "c", "uc", 9),
               (DELETE, "d", "ud", 10), (ADD, "d", "ud2", 11)]
    for seq, (kind, name, uid, rv) in enumerate(changes):
        t.dispatched(Notification(kind=kind, obj=obj(uid, rv, name), key=ObjectKey(f"ns/{name}"), seq=seq),
                     ["fast", "slow"])
        t.progress(seq + 1, str(rv))
    for seq in (1, 3, 5):
        t.acked("fast", seq)
    b, c, d = Known("ub", 7, False), Known("uc", 9, False), Known("ud2", 11, False)
    assert t.listener_state("fast", 0, {}) == (5, {"ns/b": b, "ns/c": c, "ns/d": d})
    assert t.owed_deletes("fast") == {"ns/d": {"ud": 10}}
    t.acked("fast", 0)  # the prefix now reaches ns/b's update and stops at ns/c's first one
    assert t.listener_state("fast", 0, {}) == (7, {"ns/a": Known("ua", 6, False), "ns/b": b, "ns/c": c,
                                                   "ns/d": d})
    t.acked("fast", 2)
    t.acked("fast", 4)  # the delete it owed: nothing owed any more
    assert t.listener_state("fast", 0, {}) == (11, {"ns/a": Known("ua", 6, False), "ns/b": b, "ns/c": c,
                                                    "ns/d": d})
    assert t.owed_deletes("fast") == {}


def test_an_owed_delete_of_an_earlier_object_keeps_what_it_knows_of_a_later_one() -> None:
    """The sink owes u1's delete (``maybe``) and saw u3, a later object of the key, deleted at 4: u1's
    delete goes out, and u3's replayed add and delete, which it acknowledged, are still skipped."""
    r = SinkResume(resource_version=1, known={"ns/a": Known("u3", 4, True)}, maybe={"u1"},
                   api_version="v1", kind="ConfigMap")
    first = note(DELETE, "u1", 2)
    assert r.admit(first, False) == [first]
    assert r.known == {"ns/a": Known("u3", 4, True)}
    assert r.admit(note(ADD, "u3", 3), False) == []
    assert r.admit(note(DELETE, "u3", 4), False) == []
    later = note(ADD, "u5", 5)
    assert r.admit(later, False) == [later]


def test_markers_and_snapshots_pass() -> None:
    r = resume(10, Known("", -1, True))
    snap = Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[], seq=3)
    assert r.admit(snap, False) == [snap]
    assert r.known  # untouched


@pytest.mark.parametrize("seed", range(5))
def test_incremental_own_progress_matches_a_full_scan(seed: int) -> None:
    """The per-sink state the checkpoint writer reads (:meth:`AckTracker.listener_state`) is kept
    incrementally; at any point it equals a scan of the whole window from scratch."""
    import random

    from bridge.delivery.progress import AckTracker

    rng = random.Random(seed)
    t = AckTracker(name="x", resource_version="1")
    owed: dict[str, list[int]] = {"fast": [], "slow": []}
    uids: dict[str, str] = {}
    rv = 1
    for seq in range(3000):
        rv += 1
        name = f"o{rng.randrange(40)}"
        if name in uids and rng.random() < 0.2:
            o = obj(uids.pop(name), rv, name)
            n = Notification(kind=DELETE, obj=o, key=ObjectKey(f"ns/{name}"), seq=seq)
        else:
            uids.setdefault(name, f"u{seq}")
            o = obj(uids[name], rv, name)
            n = Notification(kind=UPDATE, obj=o, key=ObjectKey(f"ns/{name}"), seq=seq)
        t.dispatched(n, ["fast", "slow"])
        for listener, lag in (("fast", 3), ("slow", 400)):
            owed[listener].append(seq)
            while len(owed[listener]) > rng.randrange(lag + 1):
                t.acked(listener, owed[listener].pop(rng.randrange(min(len(owed[listener]), 4))))
        if rng.random() < 0.3:
            t.progress(seq + 1, str(rv))
        if rng.random() < 0.05:
            incremental = t.listener_state("fast", 0, {})
            kept = t._scans.pop("fast")
            assert t.listener_state("fast", 0, {}) == incremental
            t._scans["fast"] = kept
    assert t.lag > 0  # the slow sink kept a window all along
