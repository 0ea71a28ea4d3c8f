"""The delivery contract's executable specification (:mod:`bridge.testing.spec`) on hand-written
histories: each case is a story whose verdict is known, so the model is checked before it judges
the bridge."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.testing.spec import (
    Acked,
    Change,
    ChangeKind,
    Checkpointed,
    Crashed,
    Entry,
    History,
    Received,
    SinkLog,
    by_kind,
    check_sink,
    dedup_consume,
)

C, U, D = ChangeKind.CREATED, ChangeKind.UPDATED, ChangeKind.DELETED


def add(key: str, uid: str, rv: int, gap: str = "") -> Received:
    return Received("added", key=key, uid=uid, rv=rv, gap_id=gap)


def upd(key: str, uid: str, rv: int, gap: str = "") -> Received:
    return Received("updated", key=key, uid=uid, rv=rv, gap_id=gap)


def dele(key: str, uid: str, rv: int, gap: str = "", inferred: bool = False) -> Received:
    return Received("deleted", key=key, uid=uid, rv=rv, gap_id=gap, inferred=inferred)


def begin(gap: str, frm: int, uid: str = "") -> Received:
    return Received("gap.begin", gap_id=gap, gap_from=frm, scope_uid=uid)


def end(gap: str, frm: int, to: int, uid: str = "") -> Received:
    return Received("gap.end", gap_id=gap, gap_from=frm, gap_to=to, scope_uid=uid)


def story() -> History:
    """a (uid a1) exists at the origin (rv 1); a updated at 2 and 3, b created at 4, a deleted at 5,
    a re-created as uid a2 at 6, b updated at 7."""
    return History(origin={"a": ("a1", 1)}, origin_rv=1, changes=[
        Change(2, U, "a", "a1"), Change(3, U, "a", "a1"), Change(4, C, "b", "b1"),
        Change(5, D, "a", "a1"), Change(6, C, "a", "a2"), Change(7, U, "b", "b1")])


EVERYTHING = [add("a", "a1", 1), upd("a", "a1", 2), upd("a", "a1", 3), add("b", "b1", 4),
              dele("a", "a1", 5), add("a", "a2", 6), upd("b", "b1", 7)]


def kinds(history: History, entries: Sequence[Entry]) -> dict[str, int]:
    return dict(by_kind(check_sink(history, SinkLog("s", list(entries)))))


def test_every_change_in_order_is_clean() -> None:
    assert kinds(story(), EVERYTHING) == {}


def test_a_redelivery_after_a_crash_is_allowed_and_dropped_by_the_consumer() -> None:
    entries: list[Entry] = [
        *EVERYTHING[:5], Crashed(), *EVERYTHING[2:]]
    assert kinds(story(), entries) == {}
    assert dedup_consume(e for e in entries if isinstance(e, Received)).objects == {
        "a2": ("a", 6), "b1": ("b", 7)}


def test_a_change_missing_without_a_gap_is_lost() -> None:
    """The second defect of issue 24: a crash before the first checkpoint, a list from scratch, the
    changes since the first list never delivered and no gap marker announcing them."""
    entries: list[Entry] = [
        add("a", "a1", 1), upd("a", "a1", 2), Crashed(), add("a", "a2", 6), add("b", "b1", 7),
               dele("a", "a1", 2, inferred=True)]
    found = check_sink(story(), SinkLog("s", list(entries)))
    lost = sorted(f.detail for f in found if f.kind == "lost")
    assert lost == ["created b uid b1 @4", "updated a uid a1 @3"]  # b's state at 7 arrived as added
    assert by_kind(found) == {"lost": 2}


def test_a_relist_window_excuses_what_it_frames_when_the_history_was_compacted() -> None:
    h = story()
    h.relist_causes = [5]
    entries: list[Entry] = [
        add("a", "a1", 1), upd("a", "a1", 2), begin("g1", 2), dele("a", "a1", 2, "g1", True),
               add("a", "a2", 6, "g1"), add("b", "b1", 7, "g1"), end("g1", 2, 7)]
    assert kinds(h, entries) == {}


def test_a_relist_window_without_a_cause_is_needless() -> None:
    entries: list[Entry] = [
        add("a", "a1", 1), upd("a", "a1", 2), begin("g1", 2), dele("a", "a1", 2, "g1", True),
               add("a", "a2", 6, "g1"), add("b", "b1", 7, "g1"), end("g1", 2, 7)]
    assert kinds(story(), entries) == {"needless_gap": 1}


def test_a_per_object_window_excuses_only_its_object() -> None:
    h = story()
    h.relist_causes = [3]
    entries: list[Entry] = [
        add("a", "a1", 1), begin("r", 1, "a1"), upd("a", "a1", 3, "r"), end("r", 1, 3, "a1"),
               dele("a", "a1", 5), add("a", "a2", 6), upd("b", "b1", 7)]
    assert kinds(h, entries) == {"lost": 1}  # b's creation at 4 is not a's window's


def test_a_held_back_change_after_a_framed_delete_is_an_order_violation_and_a_phantom() -> None:
    """The first defect of issue 24: a sink resumed from its own point inside a held-back window gets
    the object's framed delete, then a change the window held back (a new id), then the same delete
    again (a repeated id): a consumer that drops repeated ids keeps the object for good."""
    h = History(origin={"p": ("p1", 10)}, origin_rv=10, relist_causes=[20], changes=[
        Change(15, U, "p", "p1"), Change(25, U, "p", "p1"), Change(30, D, "p", "p1")])
    entries: list[Entry] = [
        add("p", "p1", 10), begin("g", 12), dele("p", "p1", 30, "g"), end("g", 12, 30),
               Crashed(), upd("p", "p1", 25), dele("p", "p1", 30)]
    assert kinds(h, entries) == {"order": 1, "phantom": 1}


def test_a_change_older_than_one_held_is_an_order_violation_and_leaves_the_consumer_stale() -> None:
    repeat = [*EVERYTHING[:3], upd("a", "a1", 2), *EVERYTHING[3:]]
    assert kinds(story(), repeat) == {}  # the update at 2 again: the same id, a redelivery
    stale = [add("b", "b1", 4), upd("b", "b1", 7), Received("added", key="b", uid="b1", rv=4)]
    h = History(origin_rv=3, changes=[Change(4, C, "b", "b1"), Change(7, U, "b", "b1")])
    assert kinds(h, stale) == {}  # the same added again: a repeated id, dropped
    h2 = History(origin_rv=3, relist_causes=[5], changes=[Change(4, C, "b", "b1"), Change(7, U, "b", "b1")])
    late = [add("b", "b1", 4), upd("b", "b1", 7), begin("g", 4), add("b", "b1", 4, "g"), end("g", 4, 8)]
    assert kinds(h2, late) == {}  # the added at 4 again, framed: the same id, dropped
    older = [add("b", "b1", 7), upd("b", "b1", 4)]
    assert kinds(h2, older) == {"order": 1, "stale": 1}


def test_states_and_deletes_the_cluster_never_had_are_invented() -> None:
    entries: list[Entry] = [
        *EVERYTHING, upd("b", "b1", 8)]
    assert kinds(story(), entries) == {"invented": 1, "stale": 1}
    assert kinds(story(), [*EVERYTHING, dele("b", "b1", 7)]) == {"invented": 1, "missing": 1}


def test_an_inferred_delete_carries_an_older_state() -> None:
    h = story()
    h.relist_causes = [4]
    entries: list[Entry] = [
        add("a", "a1", 1), upd("a", "a1", 2), upd("a", "a1", 3), begin("g", 3),
               add("b", "b1", 4, "g"), dele("a", "a1", 2, "g", True), add("a", "a2", 6, "g"), end("g", 3, 6),
               upd("b", "b1", 7)]
    assert kinds(h, entries) == {}


def test_a_repeat_of_a_durably_acknowledged_event_after_a_crash_is_excess() -> None:
    entries: list[Entry] = [
        *EVERYTHING[:3], Acked(0), Acked(1), Acked(2), Checkpointed(), Crashed(), EVERYTHING[2],
               *EVERYTHING[3:]]
    assert kinds(story(), entries) == {"excess_repeat": 1}
    not_durable: list[Entry] = [
        *EVERYTHING[:3], Acked(0), Acked(1), Checkpointed(), Acked(2), Crashed(), EVERYTHING[2],
                   *EVERYTHING[3:]]
    assert kinds(story(), not_durable) == {}


def test_a_consumer_missing_an_object_and_an_unclosed_gap() -> None:
    assert kinds(story(), EVERYTHING[:-1]) == {"lost": 1, "stale": 1}
    assert kinds(story(), [*EVERYTHING, begin("g", 7)]) == {"unclosed_gap": 1}
    assert kinds(story(), [*EVERYTHING[:5], *EVERYTHING[6:]]) == {"lost": 1, "missing": 1}


def test_the_deduplicating_consumer_keeps_what_a_repeated_delete_cannot_end() -> None:
    events = [add("p", "p1", 1), dele("p", "p1", 3), upd("p", "p1", 2), dele("p", "p1", 3)]
    assert dedup_consume(events).objects == {"p1": ("p", 2)}


def test_a_window_cut_by_a_crash_is_not_unclosed() -> None:
    h = story()
    h.relist_causes = [3]
    entries: list[Entry] = [*EVERYTHING[:2], begin("g", 2), Crashed(), *EVERYTHING[2:]]
    assert kinds(h, entries) == {}
