"""The resume plan's invariants (:mod:`bridge.delivery.resume_plan`), one test each, on the pure
function that builds it: what a restart does is decided there, from the checkpoint and the journal."""

from __future__ import annotations

from bridge.delivery.journal import Deleted, Exists, JournalEntry, ListStart, Relisted
from bridge.delivery.progress import HOLDS_NOTHING, Known
from bridge.delivery.resume_plan import (
    ResumePlan,
    SentDelete,
    SinkStartKind,
    build_plan,
    owes_change,
    parse_rv,
    rv_at_most,
)
from bridge.storage.checkpoint import Checkpoint, SinkProgress
from tests.checkpoint.helpers import CONFIGMAPS


def plan(checkpoint: Checkpoint | None, journal: dict[str, JournalEntry] | None = None, *,
         start: ListStart | None = None, routed: tuple[str, ...] = ("a", "b"),
         unreadable: bool = False) -> ResumePlan:
    return build_plan(informer_id="cm", ref=CONFIGMAPS, checkpoint=checkpoint, journal=journal or {},
                      start=start, routed=routed, journal_unreadable=unreadable)


def seeded(p: ResumePlan) -> dict[str, tuple[str, str]]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}":
            (o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for o in p.seeds}


def unconfirmed(p: ResumePlan) -> set[str]:
    return {o["metadata"]["uid"] for o in p.unconfirmed}


def test_resource_versions_compare_as_revisions_and_text_that_is_not_one_never_compares() -> None:
    assert parse_rv("42") == 42
    assert parse_rv("") is None
    assert parse_rv("4a") is None
    assert parse_rv("٣") is None  # a digit, but not an etcd revision
    assert rv_at_most("9", "10")  # as integers, not as text
    assert not rv_at_most("11", "10")
    assert not rv_at_most("x", "10")
    assert not rv_at_most("10", "")


def test_1_the_resume_point_is_the_checkpoint_else_the_acknowledged_first_list_else_a_framed_list() -> None:
    cp = Checkpoint(informer_id="cm", resource_version="20", objects={"ns/x": ("u-x", "15")})
    assert plan(cp).checkpoint is cp
    assert plan(cp).frame_from == ""
    journal: dict[str, JournalEntry] = {"u-x": Exists("ns/x", "12"), "u-y": Exists("ns/y", "25"),
                                        "u-z": Deleted("ns/z", "8")}
    acked = plan(None, journal, start=ListStart("20", acknowledged=True))
    assert acked.checkpoint is not None
    assert acked.checkpoint.resource_version == "20"
    assert acked.checkpoint.objects == {"ns/x": ("u-x", "12")}  # what a checkpoint would have held
    assert acked.rewrite  # written at the first interval: the store has none
    assert unconfirmed(acked) == {"u-y", "u-z"}  # after the point: the journal's word only
    again = plan(None, journal, start=ListStart("20"))
    assert (again.checkpoint, again.frame_from, again.list_at) == (None, "", "20")  # invariant 6
    deleted_since = plan(None, {**journal, "u-x": Deleted("ns/x", "21")},
                         start=ListStart("20", acknowledged=True))
    assert (deleted_since.checkpoint, deleted_since.list_at) == (None, "20")  # u-x's state at 20: lost
    # A relist inferred u-x's delete: the record carries u-x's last state (12), the delete itself came
    # at some point up to that relist's list (25, or unknown while it had not ended): u-x's state at
    # 20 is hidden just the same (it was hidden as "deleted at 12": the journal-implied checkpoint left
    # u-x out, and a sink holding u-x never got its delete again, seed 8702533 of the specification).
    for before in ("25", ""):
        inferred = plan(None, {**journal, "u-x": Deleted("ns/x", "12", inferred=True, sent_before=before)},
                        start=ListStart("20", acknowledged=True))
        assert (inferred.checkpoint, inferred.list_at) == (None, "20")
        assert "u-x" in unconfirmed(inferred)
    # A relist's state of u-x after the list stands in its place too (seed 8702533, schedule 2,010).
    relisted_since = plan(None, {**journal, "u-x": Relisted("ns/x", "22", "19", added=False)},
                          start=ListStart("20", acknowledged=True))
    assert (relisted_since.checkpoint, relisted_since.list_at) == (None, "20")
    inferred_before = plan(None, {**journal, "u-x": Deleted("ns/x", "12", inferred=True, sent_before="18")},
                           start=ListStart("20", acknowledged=True))
    assert inferred_before.checkpoint is not None  # gone before the list at 20: nothing is hidden
    assert inferred_before.checkpoint.objects == {}
    assert plan(None, {}, unreadable=True).frame_from == "0"
    fresh = plan(None)
    assert (fresh.checkpoint, fresh.frame_from, fresh.seeds, fresh.unconfirmed) == (None, "", (), ())


def test_2_every_object_a_sink_may_hold_is_seeded_or_unconfirmed() -> None:
    cp = Checkpoint(
        informer_id="cm", resource_version="20", objects={"ns/x": ("u-x", "15")},
        ahead={"ns/w": ("u-w", "22", False)},
        sinks={"a": SinkProgress(), "b": SinkProgress(resource_version="24",
                                                      ahead={"ns/v": ("u-v", "23", False)})})
    p = plan(cp, {"u-y": Exists("ns/y", "30")})
    assert seeded(p) == {"ns/x": ("u-x", "15"), "ns/w": ("u-w", "22"), "ns/v": ("u-v", "23")}
    assert unconfirmed(p) == {"u-y"}
    assert p.last_seen == {"ns/v": "23"}  # only b knows it
    assert "ns/v" in p.diverging


def test_3_a_delete_already_sent_is_seeded_at_its_own_resource_version_and_recorded_as_sent() -> None:
    cp = Checkpoint(informer_id="cm", resource_version="20", objects={"ns/x": ("u-x", "15")})
    p = plan(cp, {"u-x": Deleted("ns/x", "15", inferred=True),
                  "u-q": Deleted("ns/q", "26", held_after="21")})
    assert seeded(p)["ns/x"] == ("u-x", "15")
    assert p.sent_deletes["u-x"] == SentDelete("ns/x", "15", inferred=True)
    assert p.sent_deletes["u-x"].hold_after() == "15"  # an inferred delete: after its state
    assert p.sent_deletes["u-q"].hold_after() == "21"  # a replay held the window before
    assert SentDelete("ns/r", "30", inferred=False).hold_after() is None  # observed: nothing held
    held_earlier = SentDelete("ns/s", "18", inferred=True, held_after="12")
    assert held_earlier.hold_after() == "12"  # the older of the two windows


def test_4_a_sink_ahead_of_the_base_resumes_from_its_own_progress() -> None:
    cp = Checkpoint(
        informer_id="cm", resource_version="20", objects={"ns/x": ("u-x", "15")},
        sinks={"a": SinkProgress(), "b": SinkProgress(resource_version="24", objects={"ns/x": None},
                                                      ahead={"ns/v": ("u-v", "23", False)})})
    p = plan(cp, {"u-y": Exists("ns/y", "30"), "u-o": Exists("ns/o", "22")})
    a, b = p.sinks["a"], p.sinks["b"]
    assert b.kind is SinkStartKind.OWN_PROGRESS
    assert b.resource_version == 24
    assert b.section == {"ns/x": Known("u-x", 24, True), "ns/v": Known("u-v", 23, False)}
    assert b.maybe == frozenset({"u-y"})  # past its own point: it may hold it
    assert b.known["ns/o"] == HOLDS_NOTHING  # covered by its point and absent from its knowledge
    # a is at the base, yet the cache holds ns/v, which only b knows: a holds nothing there.
    assert a.kind is SinkStartKind.OWN_PROGRESS
    assert a.resource_version == 20
    assert a.known["ns/v"] == HOLDS_NOTHING
    same = plan(Checkpoint(informer_id="cm", resource_version="20", sinks={"a": SinkProgress(),
                                                                         "b": SinkProgress()}))
    assert {s.kind for s in same.sinks.values()} == {SinkStartKind.AT_BASE}


def test_4_what_a_sink_acknowledged_past_its_point_is_known_and_what_it_owes_is_maybe() -> None:
    """A sink's acknowledgements past its own point (section 3): ns/o's delete it acknowledged is
    its knowledge (the journal's record of it is not ``maybe`` for it: its delete is not re-sent);
    of ns/d it acknowledged the re-creation (u-d2) and owes the first uid's delete (a key in both
    maps under different uids): it knows u-d2, and u-d is ``maybe`` (that delete is sent again)."""
    cp = Checkpoint(
        informer_id="cm", resource_version="20", objects={"ns/d": ("u-d", "15")},
        sinks={"a": SinkProgress(ahead={"ns/o": ("u-o", "23", True), "ns/d": ("u-d2", "25", False)},
                                 objects={"ns/d": ("u-d", "24")}),
               "b": SinkProgress()})
    p = plan(cp, {"u-o": Deleted("ns/o", "23"), "u-d": Deleted("ns/d", "24"), "u-d2": Exists("ns/d", "25")})
    a = p.sinks["a"]
    assert a.known["ns/o"] == Known("u-o", 23, True)
    assert a.known["ns/d"] == Known("u-d2", 25, False)
    assert a.maybe == frozenset({"u-d"})
    assert a.owes == {"ns/d": {"u-d": 24}}
    assert cp.sinks is not None
    assert cp.sinks["a"].owed_deletes() == frozenset({"u-d"})
    assert cp.sinks["b"].owed_deletes() == frozenset()


def test_4_what_a_sink_owes_of_earlier_objects_of_a_re_used_name_is_sent() -> None:
    """Of ns/d the sink acknowledged u-d3 before the changes of the earlier objects it owes from 21
    (u-d's delete, u-d2's add and delete): the same uid in both maps. Its filter sends those changes
    and not u-d3's; u-d2, which only the journal knows, is ``maybe``. Of ns/e it acknowledged u-e2
    owing nothing of u-e: u-e's journalled delete is not ``maybe`` (it is not sent again)."""
    cp = Checkpoint(
        informer_id="cm", resource_version="20", objects={"ns/d": ("u-d", "15"), "ns/e": ("u-e", "16")},
        sinks={"a": SinkProgress(ahead={"ns/d": ("u-d3", "26", False), "ns/e": ("u-e2", "25", False)},
                                 objects={"ns/d": ("u-d3", "21")}),
               "b": SinkProgress()})
    p = plan(cp, {"u-d": Deleted("ns/d", "21"), "u-d2": Deleted("ns/d", "23"), "u-d3": Exists("ns/d", "26"),
                  "u-e": Deleted("ns/e", "24"), "u-e2": Exists("ns/e", "25")})
    a = p.sinks["a"]
    assert a.owes == {"ns/d": {"u-d3": 21}}
    known = a.known["ns/d"]
    assert known == Known("u-d3", 26, False)
    assert owes_change(a.owes["ns/d"], known, "u-d2", 22)
    assert owes_change(a.owes["ns/d"], known, "u-d", 21)
    assert not owes_change(a.owes["ns/d"], known, "u-d3", 26)
    assert not owes_change(a.owes["ns/d"], known, "u-d", 20)
    assert a.maybe == frozenset({"u-d2"})


def test_4_what_a_sink_owes_of_each_earlier_object_is_sent_and_nothing_it_acknowledged() -> None:
    """Of ns/d the sink acknowledged u-d3 and, out of order, u-d2's add at 22, owing u-d's delete at
    21 and u-d2's delete at 23 (``owes``, per earlier object): its filter sends those two and not
    u-d2's add, nor u-d3's changes."""
    cp = Checkpoint(
        informer_id="cm", resource_version="20", objects={"ns/d": ("u-d", "15")},
        sinks={"a": SinkProgress(ahead={"ns/d": ("u-d3", "26", False)},
                                 owes={"ns/d": {"u-d": "21", "u-d2": "23"}}),
               "b": SinkProgress()})
    p = plan(cp, {"u-d": Deleted("ns/d", "21"), "u-d2": Deleted("ns/d", "23"), "u-d3": Exists("ns/d", "26")})
    a = p.sinks["a"]
    assert a.owes == {"ns/d": {"u-d": 21, "u-d2": 23}}
    known = a.known["ns/d"]
    assert known == Known("u-d3", 26, False)
    assert owes_change(a.owes["ns/d"], known, "u-d", 21)
    assert owes_change(a.owes["ns/d"], known, "u-d2", 23)
    assert not owes_change(a.owes["ns/d"], known, "u-d2", 22)
    assert not owes_change(a.owes["ns/d"], known, "u-d3", 26)
    assert a.maybe == frozenset({"u-d", "u-d2"})


def test_5_a_sink_the_checkpoint_does_not_cover_is_bootstrapped() -> None:
    cp = Checkpoint(informer_id="cm", resource_version="20", sinks={"a": SinkProgress(),
                                                                    "gone": SinkProgress()})
    p = plan(cp)
    assert p.sinks["b"].kind is SinkStartKind.BOOTSTRAP
    assert p.bootstrapping == {"b"}
    assert p.dropped_sinks == ("gone",)
    assert p.rewrite
    legacy = plan(Checkpoint(informer_id="cm", resource_version="20"))  # format 1: covers every sink
    assert legacy.bootstrapping == frozenset()


def test_6_a_first_list_not_yet_acknowledged_is_listed_again_exactly_with_the_journal_unconfirmed() -> None:
    """Without a checkpoint and with the first list not acknowledged by every sink, the informer
    lists at exactly that list's resourceVersion and watches from it (no gap): every change since
    is replayed one by one. Every object of the journal is unconfirmed — the first list's (the
    exact list returns them: vouched for), those created later (replayed by the watch) and the
    deletes already sent (re-sent as they were, invariant 3) — so that a relist after a 410 reports
    each one that is gone."""
    journal: dict[str, JournalEntry] = {"u-x": Exists("ns/x", "12"), "u-y": Exists("ns/y", "25"),
                                        "u-z": Deleted("ns/z", "30", inferred=True)}
    p = plan(None, journal, start=ListStart("20"))
    assert (p.checkpoint, p.list_at, p.frame_from, p.seeds) == (None, "20", "", ())
    assert unconfirmed(p) == {"u-x", "u-y", "u-z"}
    assert p.sent_deletes["u-z"] == SentDelete("ns/z", "30", True)
    assert all(s.kind is SinkStartKind.AT_BASE for s in p.sinks.values())
    kept = {uid: e for uid, e in journal.items() if uid != "u-z"}
    assert plan(None, kept, start=ListStart("20", acknowledged=True)).list_at == ""
    # Acknowledged, but u-z's delete hides its state at 20 (invariant 1): listed again all the same.
    assert plan(None, journal, start=ListStart("20", acknowledged=True)).list_at == "20"
    assert plan(None, journal).list_at == ""


def test_7_only_what_each_relist_coalesced_is_held_back() -> None:
    """Two relists sent states of ``x`` before a checkpoint covered them, the watch showed a change
    of it between them: the plan keeps each relist's own window; a change inside one and older than
    its state is held, its state is that relist's, a change between two windows (or before, or after)
    is in none. A later relist whose window starts before an earlier one's state (after a restart)
    merges with it. A record without earlier windows (as written before) is one window."""
    cp = Checkpoint(informer_id="cm", resource_version="5", objects={"ns/x": ("u-x", "5")})
    first = Relisted("ns/x", "15", "10", added=False)
    journal: dict[str, JournalEntry] = {"u-x": first.after("18", "24", added=False)}
    assert journal["u-x"] == Relisted("ns/x", "24", "18", added=False, earlier=(("10", "15", False),))
    state = plan(cp, journal).relisted["u-x"]
    assert [state.window(rv) for rv in (9, 10, 12, 15, 16, 18, 20, 24, 25)] == [
        None, None, ("10", "15", False), ("10", "15", False), None, None, ("18", "24", False),
        ("18", "24", False), None]
    twice = Relisted("ns/x", "24", "18", added=False, earlier=(("10", "15", False),))
    merged = twice.after("12", "30", added=True)
    assert merged == Relisted("ns/x", "30", "10", added=True)
    assert plan(cp, {"u-x": first}).relisted["u-x"].window(12) == ("10", "15", False)
