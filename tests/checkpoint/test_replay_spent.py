"""A sink's replay stage steps aside once nothing is left to decide (:meth:`ReplayStage.spent`): its
listener then delivers as without a restart, and a change costs it nothing more. Until then every
decision of the stage's table still applies."""

from __future__ import annotations

from typing import Any

from bridge.clock import FakeClock
from bridge.contracts import Notification, NotificationKind, ObjectKey
from bridge.delivery.progress import Known
from bridge.delivery.replay import ReplayStage, SinkResume
from bridge.delivery.resume_plan import RelistedState, SentDelete
from bridge.delivery.selector_exit import SelectorExits
from bridge.delivery.sink_listener import SinkListener
from tests.checkpoint.helpers import CONFIGMAPS, RecordingSink


def obj(name: str, rv: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}


def upd(name: str, rv: str, seq: int) -> Notification:
    return Notification(kind=NotificationKind.UPDATE, obj=obj(name, rv), old=obj(name, "1"), seq=seq,
                        key=ObjectKey(f"ns/{name}"))


def dele(name: str, rv: str, seq: int) -> Notification:
    return Notification(kind=NotificationKind.DELETE, obj=obj(name, rv), seq=seq, key=ObjectKey(f"ns/{name}"))


def listener(stage: ReplayStage) -> tuple[SinkListener, RecordingSink]:
    sink = RecordingSink("s")
    return SinkListener(sink=sink, resource=CONFIGMAPS, cluster="c", clock=FakeClock(), replay=stage), sink


async def feed(lst: SinkListener, *ns: Notification) -> None:
    await lst.handle_batch(ns, [lambda: None] * len(ns))


def sent(rv: str, inferred: bool) -> SentDelete:
    return SentDelete("ns/x", rv, inferred)


async def test_a_delete_the_watch_showed_stays_until_the_informer_passed_it() -> None:
    stage = ReplayStage(sent={"u-x": sent("20", inferred=False)})
    assert stage.horizon == 20
    lst, sink = listener(stage)
    await feed(lst, upd("y", "15", 1), upd("x", "18", 2))
    assert lst.replay is stage  # the horizon is not passed: x's delete may still come
    stage.horizon_passed(4)  # the informer passed resourceVersion 20 before notification 4
    await feed(lst, dele("x", "20", 3))
    assert lst.replay is stage  # notification 3 is before the horizon's seq
    await feed(lst, upd("y", "21", 4))
    assert lst.replay is None
    assert [(e.type.value, e.name, e.resource_version) for e in sink.events] == [
        ("updated", "y", "15"), ("updated", "x", "18"), ("deleted", "x", "20"), ("updated", "y", "21")]


async def test_an_inferred_delete_stays_until_its_uid_was_deleted_and_nothing_is_held() -> None:
    """The relist inferred x deleted at its state 10: a replayed update past it is held back until the
    replayed delete is re-sent (framed), and only then is the stage spent."""
    stage = ReplayStage(sent={"u-x": sent("10", inferred=True)})
    assert stage.horizon is None  # when x's real delete came is unknown
    lst, sink = listener(stage)
    await feed(lst, upd("x", "12", 1))
    assert not sink.events  # held back
    await feed(lst, upd("y", "30", 2))
    assert lst.replay is stage
    await feed(lst, dele("x", "10", 3))
    assert [e.type.value for e in sink.events[1:]] == ["gap.begin", "deleted", "gap.end"]
    assert sink.events[2].final_state_unknown  # re-sent as it was
    await feed(lst, upd("y", "31", 4))
    assert lst.replay is None


def test_a_held_back_change_keeps_the_stage_whatever_the_horizon() -> None:
    stage = ReplayStage(sent={"u-x": SentDelete("ns/x", "20", False, held_after="12")})
    assert stage.held_back(obj("x", "15"))
    stage.horizon_passed(1)
    assert not stage.spent(5)  # the replayed delete still frames what was held


def test_a_relisted_state_stays_until_the_informer_passed_it() -> None:
    stage = ReplayStage(relisted={"u-a": RelistedState("2", "5", added=False)})
    assert stage.horizon == 5
    assert not stage.spent(3)
    stage.horizon_passed(3)
    assert not stage.spent(2)
    assert stage.spent(3)


def test_under_a_selector_a_delete_already_sent_keeps_the_stage() -> None:
    """Whether the uid lives on is the API server's answer: a uid gone holds back its replayed returns
    into scope, whenever they come."""
    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        raise AssertionError("not asked")

    stage = ReplayStage(sent={"u-x": sent("20", inferred=False)}, exits=SelectorExits(fetch=fetch))
    assert stage.horizon is None
    stage.admit(dele("x", "20", 1))
    assert not stage.spent(100)


def test_the_own_progress_filter_keeps_the_stage_until_it_is_dropped() -> None:
    own = SinkResume(resource_version=10, known={"ns/x": Known("u-x", 12, False)})
    stage = ReplayStage(own=own)
    assert stage.horizon is None
    assert not stage.spent(1)
    stage.own_progress_passed(2)
    assert stage.admit(upd("x", "12", 2)) == []  # it has this state: the last difference is gone
    stage.admit(upd("y", "13", 3))
    assert stage.own is None
    assert stage.spent(4)
