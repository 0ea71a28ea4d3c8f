"""AckTracker after a resume: a re-creation found by the first relist marks the old object's delete
as inferred even when what sinks last acknowledged of it is in the checkpoint's delivered-ahead map
(found by the fault schedule: a delete sent without ``finalstateunknown`` and older than a state the
sinks already had)."""

from __future__ import annotations

from bridge.contracts import Notification, NotificationKind
from bridge.delivery.progress import AckTracker, object_key


def obj(name: str, rv: str, uid: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}}


def test_the_old_object_of_a_recreation_is_an_inferred_delete_when_its_state_is_ahead() -> None:
    # The checkpoint at rv 10 has a@8 in its index and a@12 acknowledged beyond it (ahead). After
    # the restart the relist finds "a" under a new uid: the informer reports the old object, at the
    # state it knew (12, from the ahead map), deleted.
    t = AckTracker(resource_version="10", index={"ns/a": ("u-old", "8")},
                   ahead={"ns/a": ("u-old", "12", False)})
    old = obj("a", "12", "u-old")
    t.dispatched(Notification(kind=NotificationKind.DELETE, obj=old, seq=0, key=object_key(old)), ["s"])
    assert t.is_unobserved_delete(0)


def test_a_delete_seen_on_the_watch_is_not_inferred() -> None:
    t = AckTracker(resource_version="10", index={"ns/a": ("u-a", "8")}, ahead={"ns/a": ("u-a", "12", False)})
    gone = obj("a", "13", "u-a")  # the watch's DELETED carries a resourceVersion of its own
    t.dispatched(Notification(kind=NotificationKind.DELETE, obj=gone, seq=0, key=object_key(gone)), ["s"])
    assert not t.is_unobserved_delete(0)
