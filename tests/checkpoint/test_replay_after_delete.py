"""After a restart, the watch may replay changes of an object whose delete was already sent (the
checkpoint predates a relist that inferred the delete, and the crash came before the checkpoint moved
past it). A uid is deleted once: such a replayed change is older than the delete consumers hold, and
sending it would bring the object back for them — for good where the broker drops the real delete as
a duplicate of the inferred one (same id). Found by the fault schedule (seed 3002)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.clock import FakeClock
from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind, ObjectKey
from bridge.delivery.pipeline import SinkListener
from bridge.delivery.replay import ReplayStage
from bridge.delivery.resume_plan import SentDelete
from bridge.delivery.selector_exit import SelectorExits, mark_exits
from bridge.errors import NotFoundError
from tests.checkpoint.helpers import CONFIGMAPS, RecordingSink


def obj(name: str, rv: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}


def listener(resent: Mapping[str, tuple[str, bool]], *, selector: bool = False) -> SinkListener:
    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        raise AssertionError("not asked")

    exits = SelectorExits(fetch=fetch) if selector else None
    return SinkListener(sink=RecordingSink("x"), resource=CONFIGMAPS, cluster="c", clock=FakeClock(),
                        replay=ReplayStage(sent=sent_deletes(resent), exits=exits), exits=exits)


def sent_deletes(resent: Mapping[str, tuple[str, bool]]) -> dict[str, SentDelete]:
    """uid → (resourceVersion, inferred) as the plan's records (the key plays no part here)."""
    return {uid: SentDelete("", rv, inferred) for uid, (rv, inferred) in resent.items()}


def events(resent: Mapping[str, tuple[str, bool]], n: Notification, *,
           selector: bool = False) -> list[tuple[str, str, bool]]:
    lst = listener(resent, selector=selector)
    return [(e.type.value, e.resource_version, e.final_state_unknown) for e in lst.events_for(n)]


def test_a_replayed_change_of_an_object_whose_delete_was_sent_is_not_sent_again() -> None:
    resent = {"u-x": ("1402", True)}  # the relist inferred x deleted, with its last known state
    upd = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1419"), old=obj("x", "1402"), seq=1)
    add = Notification(kind=NotificationKind.ADD, obj=obj("x", "1419"), seq=2)
    assert events(resent, upd) == []
    assert events(resent, add) == []
    # The delete itself goes out again as it was sent (consumers deduplicate it by id) ...
    again = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1402"), seq=3)
    assert events(resent, again) == [("deleted", "1402", True)]
    # ... and other objects are untouched.
    other = Notification(kind=NotificationKind.UPDATE, obj=obj("y", "1420"), old=obj("y", "1400"), seq=4)
    assert events(resent, other) == [("updated", "1420", False)]


def test_changes_before_a_delete_the_watch_showed_are_replayed_in_order() -> None:
    """The watch showed x's delete (not inferred): resumed from an older checkpoint it replays x's
    changes and then that delete, in order — at-least-once, nothing held back (a sink may not have
    had them before the crash)."""
    resent = {"u-x": ("1425", False)}
    add = Notification(kind=NotificationKind.ADD, obj=obj("x", "1410"), seq=1)
    upd = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1419"), old=obj("x", "1410"), seq=2)
    dele = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1425"), seq=3)
    assert events(resent, add) == [("added", "1410", False)]
    assert events(resent, upd) == [("updated", "1419", False)]
    assert events(resent, dele) == [("deleted", "1425", False)]


async def replay(lst: SinkListener, n: Notification) -> list[tuple[str, str, bool, bool]]:
    """What ``n`` becomes, asked as :meth:`SinkListener.handle` asks first, with exits marked."""
    assert lst.replay is not None
    await lst.replay.ask_fate(n)
    got = lst.events_for(n)
    assert lst._exits is not None
    await mark_exits(got, lst._exits, lst.replay.replayed_exit)
    return [(e.type.value, e.resource_version, e.final_state_unknown, "leftselector" in e.extensions)
            for e in got]


def selector_listener(resent: Mapping[str, tuple[str, bool]], now: dict[str, Any] | None,
                      asked: list[str]) -> SinkListener:
    """A selector-scoped listener whose API server has ``now`` under every name (None: nothing)."""
    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        if at:  # every delete here is a real one: the name was gone at its resourceVersion
            raise NotFoundError("not found", code=404)
        asked.append(name)
        if now is None:
            raise NotFoundError("not found", code=404)
        return now

    exits = SelectorExits(fetch=fetch)
    return SinkListener(sink=RecordingSink("x"), resource=CONFIGMAPS, cluster="c", clock=FakeClock(),
                        replay=ReplayStage(sent=sent_deletes(resent), exits=exits), exits=exits)


async def test_with_a_selector_a_uid_that_lives_on_gets_its_whole_replayed_history() -> None:
    """Under a selector the inferred delete may have been an exit. The uid still exists: every delete
    of it was an exit, so nothing is held — the changes up to the inferred delete's state (a lagging
    sink may lack them), those the relist coalesced (observed one by one now), the exit (marked,
    without asking again) and the return into scope go out in order."""
    asked: list[str] = []
    lst = selector_listener({"u-x": ("1402", True)}, obj("x", "1600"), asked)
    seen = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1390"), old=obj("x", "1380"), seq=1)
    coalesced = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1405"), old=obj("x", "1390"), seq=2)
    exit_ = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1410"), seq=3)
    back = Notification(kind=NotificationKind.ADD, obj=obj("x", "1500"), seq=4)
    assert await replay(lst, seen) == [("updated", "1390", False, False)]
    assert asked == []  # sent again whatever the answer
    assert await replay(lst, coalesced) == [("updated", "1405", False, False)]
    assert await replay(lst, exit_) == [("deleted", "1410", False, True)]
    assert await replay(lst, back) == [("added", "1500", False, False)]
    assert asked == ["x"]  # once per uid


async def test_with_a_selector_a_uid_that_is_gone_keeps_the_rule_without_selector_and_ends_at_its_delete(
) -> None:
    """The uid is gone: the changes up to the inferred delete's state go out again, the coalesced ones
    are held, the replayed delete is framed; after it nothing of the uid goes out (a return into scope
    after an exit would revive it, and its closing delete has the uid's delete id, which a broker that
    drops repeated ids drops as the inferred delete's)."""
    asked: list[str] = []
    lst = selector_listener({"u-x": ("1402", True)}, None, asked)
    seen = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1390"), old=obj("x", "1380"), seq=1)
    coalesced = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1405"), old=obj("x", "1390"), seq=2)
    exit_ = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1410"), seq=3)
    back = Notification(kind=NotificationKind.ADD, obj=obj("x", "1500"), seq=4)
    gone = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1510"), seq=5)
    assert await replay(lst, seen) == [("updated", "1390", False, False)]
    assert await replay(lst, coalesced) == []
    assert [t for t, *_ in await replay(lst, exit_)] == ["gap.begin", "deleted", "gap.end"]
    assert await replay(lst, back) == []
    assert await replay(lst, gone) == []
    assert asked == ["x"]
    # The same name holding another uid is the same answer: this uid is gone.
    other = selector_listener({"u-x": ("1402", True)}, {"metadata": {"name": "x", "uid": "another"}}, [])
    assert await replay(other, coalesced) == []


def test_replayed_changes_up_to_the_inferred_deletes_state_go_out_again() -> None:
    """The changes up to the state an inferred delete carries were observed one by one before the
    relist: a sink that lagged across the crash may lack them, so they are sent again (the same ids
    for a sink that had them), before the delete; only the changes the relist coalesced are held."""
    resent = {"u-x": ("1402", True)}
    seen = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1390"), old=obj("x", "1380"), seq=1)
    last = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1402"), old=obj("x", "1390"), seq=2)
    coalesced = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1405"), old=obj("x", "1402"), seq=3)
    assert events(resent, seen) == [("updated", "1390", False)]
    assert events(resent, last) == [("updated", "1402", False)]
    assert events(resent, coalesced) == []


def test_the_replayed_delete_after_held_back_changes_is_framed_as_a_gap() -> None:
    """A sink that lagged across the crash never got the relist (nor its gap markers) that coalesced
    the held-back changes: the replayed delete tells it, framed from the state the inferred delete
    carried to the delete."""
    lst = listener({"u-x": ("1402", True)})
    coalesced = Notification(kind=NotificationKind.UPDATE, obj=obj("x", "1405"), old=obj("x", "1402"), seq=1)
    assert lst.events_for(coalesced) == []
    dele = Notification(kind=NotificationKind.DELETE, obj=obj("x", "1410"), seq=2)
    got = lst.events_for(dele)
    assert [e.type.value for e in got] == ["gap.begin", "deleted", "gap.end"]
    assert [(e.gap.from_resource_version, e.gap.to_resource_version) for e in got if e.gap is not None] == [
        ("1402", ""), ("1402", ""), ("1402", "1410")]
    assert len({e.gap.id for e in got if e.gap is not None}) == 1
    assert got[1].resource_version == "1410"
    # Nothing was held back for y: its delete is not framed.
    other = Notification(kind=NotificationKind.DELETE, obj=obj("y", "1411"), seq=3)
    assert [e.type.value for e in lst.events_for(other)] == ["deleted"]


async def test_with_a_selector_a_relists_delete_is_marked_as_an_exit_while_the_object_lives_on() -> None:
    """A delete a relist infers (the object is not listed) is asked like one the watch showed: alive,
    it left the selector. Re-sent after a restart (the same uid, the same resourceVersion), it is asked
    again: an exit whose object was deleted since goes out as the uid's delete."""
    stub = obj("x", "1402")
    tombstone = Notification(kind=NotificationKind.DELETE,
                             obj=DeletedFinalStateUnknown(key=ObjectKey("ns/x"), obj=stub), seq=1)
    lives = selector_listener({}, obj("x", "1600"), [])
    assert await replay(lives, tombstone) == [("deleted", "1402", True, True)]
    resent = {"u-x": ("1402", True)}
    assert await replay(selector_listener(resent, obj("x", "1600"), []), tombstone) == [
        ("deleted", "1402", True, True)]
    assert await replay(selector_listener(resent, None, []), tombstone) == [("deleted", "1402", True, False)]
