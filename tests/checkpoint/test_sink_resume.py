"""The per-sink filter after a restart (:class:`bridge.delivery.progress.SinkResume`): table tests of
what one sink receives for each notification, given its own resume point and knowledge, and of the
invariant it keeps (a key leaves ``known`` once the sink and the informer agree on it)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind, ObjectKey
from bridge.delivery.progress import Knowledge, SinkResume

ADD, UPDATE, DELETE = NotificationKind.ADD, NotificationKind.UPDATE, NotificationKind.DELETE


def obj(uid: str, rv: int, name: str = "a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": str(rv)}}


def note(kind: NotificationKind, uid: str, rv: int, *, tombstone: bool = False) -> Notification:
    o = obj(uid, rv)
    target: Any = DeletedFinalStateUnknown(ObjectKey("ns/a"), o) if tombstone else o
    return Notification(kind=kind, obj=target, key=ObjectKey("ns/a"), seq=1)


def resume(rv: int, mine: Knowledge | None) -> SinkResume:
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
def test_admit(sink_rv: int, mine: Knowledge | None, n: Notification, inferred: bool,
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


def test_markers_and_snapshots_pass() -> None:
    r = resume(10, ("", -1, True))
    snap = Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[], seq=3)
    assert r.admit(snap, False) == [snap]
    assert r.known  # untouched
