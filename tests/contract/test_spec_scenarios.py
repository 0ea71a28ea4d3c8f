"""Hand-written schedules through the stateful test's adapter (:mod:`tests.contract.spec_driver`),
judged by the contract's specification: each one a defect the random schedules (or a fault
schedule) found, kept as the shortest story that shows it.

Every story runs on one skeleton (:func:`play`): a bridge with its sinks and first objects starts,
every sink acknowledges the first list and a checkpoint covers it (unless the story starts before
any checkpoint), the story's steps run, then every sink acknowledges everything until the bridge has
passed a marker object, and the specification judges each sink's log; a story may add what it checks
of one sink's events after a crash. The stories are the rows of :data:`STORIES`, each a schedule of
steps (:class:`Run` and the step builders below), on the deterministic event loop of the driver
(:class:`~tests.contract.spec_driver.VirtualTimeLoop`, at the story's ``tick``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest

from bridge.testing.spec import Crashed, Received, check_sink
from tests.contract.spec_driver import Bridge, SinkShape, VirtualTimeLoop
from tests.contract.test_spec_stateful import _show


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)  # each crash logs the cancellations of its tasks
    yield
    logging.disable(logging.NOTSET)


def verdict(bridge: Bridge) -> str:
    """Every finding of every sink, with the sinks' logs ("" when the contract held)."""
    found = [str(f) for log in bridge.logs.values() for f in check_sink(bridge.history, log)]
    if not found:
        return ""
    lines = [*found, *(f"  {c.rv} {c.kind.value} {c.key} {c.uid}" for c in bridge.history.changes)]
    for name, log in bridge.logs.items():
        lines += [f"sink {name}:", *(f"  {_show(e)}" for e in log.entries if _show(e) != "Acked")]
    return "\n".join(lines)


# -- the skeleton --------------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """A story under way: the bridge, the sinks' acknowledgement order, and what steps noted
    (``marks``: uids and events a later step or the final check refers to)."""

    bridge: Bridge
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    marks: dict[str, object] = field(default_factory=dict)

    def events(self, sink: str) -> list[Received]:
        return self.bridge.logs[sink].received()

    def after_crash(self, sink: str, key: str, *, last: bool = False) -> list[Received]:
        """The events of ``key`` the sink received after the first (``last``: the last) crash."""
        log = self.bridge.logs[sink].entries
        at = len(log) - 1 - log[::-1].index(Crashed()) if last else log.index(Crashed())
        return [e for e in log[at:] if isinstance(e, Received) and e.key == f"default/{key}"]


Step = Callable[[Run], Awaitable[None] | None]
Which = Callable[[Run, list[Received], int], bool]
"""Selects pending events to acknowledge: (the run, the sink's events so far, an event's index)."""


def create(name: str) -> Step:
    return lambda run: run.bridge.create(name)


def update(name: str, value: int = 100) -> Step:
    return lambda run: run.bridge.update(name, value)


def delete(name: str) -> Step:
    return lambda run: run.bridge.delete(name)


def recreate(name: str) -> Step:
    def step(run: Run) -> None:
        run.bridge.delete(name)
        run.bridge.create(name)

    return step


def expire() -> Step:
    """A 410 into the open watch: the informer relists (changes made before it lists are coalesced)."""
    return lambda run: run.bridge.expire_watch()


def settle() -> Step:
    return lambda run: run.bridge.settle()


def compact() -> Step:
    """The server forgets its history: a resume from before now gets 410 and relists."""
    return lambda run: run.bridge.compact()


def checkpoint() -> Step:
    return lambda run: run.bridge.checkpoint()


def crash() -> Step:
    return lambda run: run.bridge.crash()


def start() -> Step:
    return lambda run: run.bridge.start()


RESTART = (crash(), start())


def ack_all(*sinks: str) -> Step:
    """The sinks acknowledge everything pending."""

    def step(run: Run) -> None:
        for sink in sinks or tuple(run.bridge.sinks):
            run.bridge.sinks[sink].ack_some(run.rng, 1.0)

    return step


def ack(sink: str, which: Which) -> Step:
    """``sink`` acknowledges the pending events ``which`` selects (its events read now)."""

    def step(run: Run) -> None:
        events = run.events(sink)
        run.bridge.sinks[sink].ack_where(lambda i: which(run, events, i))

    return step


def keen(*sinks: str) -> Step:
    """The sinks acknowledge everything at once from now on."""

    def step(run: Run) -> None:
        for sink in sinks or tuple(run.bridge.sinks):
            run.bridge.sinks[sink].keen = True
            run.bridge.sinks[sink].ack_some(random.Random(0), 1.0)

    return step


def mark(label: str, what: Callable[[Run], object]) -> Step:
    def step(run: Run) -> None:
        run.marks[label] = what(run)

    return step


def uid_of(name: str) -> Callable[[Run], object]:
    return lambda run: run.bridge.uids[name]


@dataclass(frozen=True, slots=True)
class Story:
    name: str
    why: str
    steps: tuple[Step, ...]
    objects: tuple[str, ...] = ("x",)
    first_checkpoint: bool = True
    sinks: tuple[str, ...] = ("a", "b")
    shapes: Mapping[str, SinkShape] = field(default_factory=dict)
    tick: float = 0.0
    then: Callable[[Run], None] | None = None
    """What the story checks beyond the specification's verdict."""
    open_defect: bool = False
    """A defect not fixed yet: the story must fail (strict xfail) until it is."""


async def play(story: Story) -> Run:
    """The skeleton (module docs)."""
    bridge = Bridge(story.sinks, story.shapes)
    run = Run(bridge)
    for name in story.objects:
        bridge.create(name)
    await bridge.start()
    try:
        if story.first_checkpoint:
            for sink in bridge.sinks.values():
                sink.ack_some(run.rng, 1.0)
            await bridge.checkpoint()
        for step in story.steps:
            done = step(run)
            if done is not None:
                await done
        assert await bridge.drain()
    finally:
        await bridge.close()
    return run


# -- the stories ---------------------------------------------------------------------------------


def _is(kind: str, key: str = "") -> Which:
    return lambda run, events, i: events[i].kind == kind and (not key or events[i].key == f"default/{key}")


def _not(which: Which) -> Which:
    return lambda run, events, i: not which(run, events, i)


def _nothing_after_crash(sink: str, key: str, *, last: bool = False) -> Callable[[Run], None]:
    def then(run: Run) -> None:
        assert run.after_crash(sink, key, last=last) == []

    return then


def _after_crash_is(sink: str, key: str, expected: Callable[[Run], list[tuple[str, str]]]
                    ) -> Callable[[Run], None]:
    def then(run: Run) -> None:
        assert [(e.kind, e.uid) for e in run.after_crash(sink, key)] == expected(run)

    return then


def _holds(check: Callable[[Run], bool]) -> Callable[[Run], None]:
    def then(run: Run) -> None:
        assert check(run), "\n".join(f"  {_show(e)}" for e in run.bridge.logs["a"].entries)

    return then


def _owed(run: Run) -> list[tuple[str, str]]:
    owed: list[tuple[str, str]] = run.marks["owed"]  # type: ignore[assignment]
    return owed


def _owed_of_two_earlier_objects(run: Run) -> None:
    events = run.events("a")
    run.marks["owed"] = [(e.kind, e.uid) for e in events[-4:-1]]
    run.bridge.sinks["a"].ack_where(lambda i: events[i].uid == run.marks["last"])


def _acks_around_two_earlier_objects(run: Run) -> None:
    events = run.events("a")
    assert [e.kind for e in events[-5:]] == ["deleted", "added", "deleted", "added", "updated"]
    run.marks["owed"] = [(e.kind, e.uid) for e in events[-5:] if e.kind == "deleted"]
    run.bridge.sinks["a"].ack_where(lambda i: events[i].kind != "deleted")


def _ack_only_the_middle_delete(run: Run) -> None:
    events = run.events("a")
    gone = events[-2]
    run.marks["deleted"], run.marks["added"] = events[-4].uid, events[-1].uid
    run.bridge.sinks["a"].ack_where(lambda i: events[i] == gone)


def _ack_the_re_framed_state_with_its_end(run: Run) -> None:
    events = run.events("a")
    framed = [i for i, e in enumerate(events) if "relisted" in e.gap_id and e.kind != "gap.begin"]
    assert [events[i].kind for i in framed] == ["updated", "gap.end"]
    run.bridge.sinks["a"].ack_where(lambda i: i in framed)


STORIES = (
    Story("a_second_restart_holds_back_what_the_first_held_back", """A 410 while ``o`` is updated
    and deleted: the relist infers ``o``'s delete from its state at 2 (``finalstateunknown``). A
    crash before a checkpoint covers it: the restarted bridge's watch replays ``o``'s history; it
    sends the add again (at 2, up to the inferred delete's state), holds the update at 3 back and
    frames the delete at 4 (``replayed:<uid>:2``). A second crash, again before a checkpoint covers
    it: the next restart must hold the update back the same way. Sent, it follows the delete every
    sink already has — a new id after the uid's delete — and a consumer that drops repeated ids keeps
    ``o`` for good (the delete after it repeats an id it has seen).""",
          (create("o"), settle(), ack_all("a"),  # b lags from here on: the base stays where it is
           expire(), update("o", 1), delete("o"), settle(), ack_all("a"),
           *RESTART, settle(), ack_all("a"), *RESTART)),
    Story("what_a_sink_acknowledged_beyond_its_resume_point_is_not_sent_again", """Section 3: after
    a crash each sink's listener skips a change at or below what that sink acknowledged of its
    object, so a crash re-sends at most what was unacknowledged and the acknowledgements of the last
    checkpoint interval. ``a`` acknowledges ``y``'s update, not ``x``'s earlier one (its own resume
    point stays before both); a checkpoint is written after that acknowledgement; after the crash
    ``y``'s update must not reach ``a`` again.""",
          (update("x", 1), update("y", 1), settle(),
           ack("a", lambda run, events, i: events[i].key == "default/y"), checkpoint(), *RESTART),
          objects=("x", "y")),
    Story("a_delete_acknowledged_before_the_objects_add_is_not_sent_again", """Found by the random
    schedules (seed 244932331, PYTHONHASHSEED=25): ``a`` acknowledges ``o``'s delete but not its
    add (a sink may acknowledge out of order); a checkpoint is written after that. After a crash the
    delete must not reach ``a`` again (section 3: skipped at or below what it acknowledged of that
    object) — nor the add, older than what its destination has.""",
          (create("o"), delete("o"), settle(), ack("a", _is("deleted")), checkpoint(), *RESTART),
          then=_nothing_after_crash("a", "o")),
    Story("a_re_creation_acknowledged_before_the_earlier_objects_delete_is_not_sent_again", """Found
    by the random schedules (seed 2631919706, PYTHONHASHSEED=98): ``n0`` is deleted and created
    again under a new uid; ``a`` acknowledges the new object's add, not the old one's delete; a
    checkpoint is written after that. After a crash ``a`` gets the delete it owes again
    (unacknowledged), and not the add it acknowledged (section 3, per object).""",
          (recreate("n0"), settle(), ack("a", _is("added")), checkpoint(), *RESTART),
          objects=("n0",),
          then=_holds(lambda run: [e.kind for e in run.after_crash("a", "n0")] == ["deleted"])),
    Story("a_crash_before_the_first_checkpoint_loses_no_change_unannounced", """Issue 24's second
    defect: the bridge crashes before its first checkpoint write, the cluster changes while it is
    down (the server still has the whole history), and the restarted bridge finds no checkpoint.
    Every change since the sinks' first list must reach them one by one (section 4: the history was
    available), or at the least inside a gap window that tells them they did not (section 9).""",
          (update("x", 1), settle(), ack_all("a"), crash(), update("x", 2), update("x", 3),
           recreate("y"), create("z"), delete("z"), start()),
          objects=("x", "y"), first_checkpoint=False),
    Story("a_replayed_update_of_an_object_only_the_journal_knows_keeps_its_type", """Found by the
    random schedules (seed 304722373, PYTHONHASHSEED=14): no checkpoint; a 410 and an update of
    ``n0`` (at 3) before the relist; a crash at once. The restart lists again at the first list's
    resourceVersion (2) and watches from it: the update at 3, then ``n0``'s delete at 4, reach every
    sink, which acknowledge everything (the journal's first list is acknowledged at 2). A second
    crash: the journal's newest fact of ``n0`` is its delete, so the first list's implied checkpoint
    does not hold it and its stub is unconfirmed; the replayed update at 3 must go out as the update
    it was (the same id) — not as an add, a new id after the delete every sink has, which a consumer
    dropping repeated ids applies (and the delete after it is a repeat: a phantom).""",
          (expire(), update("n0", 100), *RESTART, delete("n0"), keen(), settle(), *RESTART),
          objects=("x", "n0"), first_checkpoint=False),
    Story("a_delete_acknowledged_between_two_re_creations_is_not_sent_again", """Found by the random
    schedules (seed 2299424624, PYTHONHASHSEED=66): ``n0`` re-created twice (uids 1, 4, 6); ``a``
    acknowledges only uid 4's delete. After a crash it gets uid 1's delete and uid 6's add (both
    unacknowledged) and nothing of uid 4, whose delete it acknowledged before a checkpoint (section
    3, per object: its add is older than what its destination has).""",
          (recreate("n0"), recreate("n0"), settle(), _ack_only_the_middle_delete, checkpoint(),
           *RESTART),
          objects=("n0",),
          then=_after_crash_is("a", "n0", lambda run: [("deleted", str(run.marks["deleted"])),
                                                       ("added", str(run.marks["added"]))])),
    Story("a_re_creation_acknowledged_after_the_earlier_objects_delete_is_not_sent_again", """Found
    by the random schedules (seed 4111857356): a 410 while ``n0`` is updated (the relist sends the
    update inside its gap), then ``n0`` re-created. ``a`` acknowledges the old object's delete and
    the new one's add but not the relist's update before them; a checkpoint is written. After a
    crash ``a`` must not get the new object's add again: what it owes of the old object is older
    than the delete it acknowledged (section 3, per object).""",
          (expire(), update("n0", 100), settle(), recreate("n0"), settle(),
           ack("a", _not(_is("updated"))), checkpoint(), *RESTART),
          objects=("n0",)),
    Story("a_re_creation_acknowledged_before_a_relists_tombstone_of_the_earlier_object", """Found by
    the random schedules (seed 35383717, PYTHONHASHSEED=2): a 410 while ``n0`` is updated and
    deleted (the relist infers the delete: a tombstone inside its gap), then ``n0`` created again.
    ``a`` acknowledges the new object's add only; a checkpoint is written. After a crash ``a`` gets
    the earlier object's delete it owes (framed) and not the add it acknowledged.""",
          (expire(), update("n0", 100), delete("n0"), settle(), create("n0"), settle(),
           ack("a", lambda run, events, i: events[i].kind == "added"
               and events[i].uid == run.bridge.uids["n0"]), checkpoint(), *RESTART),
          objects=("n0",)),
    Story("a_state_acknowledged_before_a_relists_unacknowledged_tombstone_is_not_sent_again", """Found
    by the long mode (seed 1696942961, PYTHONHASHSEED=0): ``a`` acknowledges ``n0``'s update at 2
    (``b`` lags: the base stays at 1); a 410 and ``n0`` deleted before the relist, which infers the
    delete from ``n0`` at 2 (a tombstone inside its gap); ``n0`` created again. ``a`` acknowledges the
    new object's add, not the tombstone; a checkpoint is written. After a crash the watch replays
    ``n0``'s update at 2: ``a`` owes the earlier object's delete, not that update, which it
    acknowledged (its own resume point covers it): what a sink owes after a tombstone starts after
    the state the tombstone was inferred from, not at it (section 3, per object).""",
          (update("n0", 1), settle(), ack_all("a"), expire(), delete("n0"), settle(), create("n0"),
           settle(), ack("a", lambda run, events, i: events[i].kind == "added"
                         and events[i].uid == run.bridge.uids["n0"]), checkpoint(), *RESTART),
          objects=("n0",),
          then=_holds(lambda run: "updated" not in [e.kind for e in run.after_crash("a", "n0")])),
    Story("a_later_objects_delete_acknowledged_past_an_earlier_objects_delete_is_not_sent_again",
          """Found by the random schedules (seed 1221311417, PYTHONHASHSEED=82): ``n0``'s first
    object is gone in a relist (a tombstone), then ``n0`` is created again and deleted under a new
    uid. ``a`` acknowledges the first object's delete and the new one's delete, not the new one's
    add; a checkpoint is written. After a crash the watch replays the first object's delete, which
    ``a``'s own resume point covers: skipping it must not make ``a``'s filter forget what it
    acknowledged of the new object: neither its delete nor its add (older than what its destination
    has) reach ``a`` again (section 3, per object).""",
          (expire(), update("n0", 100), delete("n0"), settle(), create("n0"),
           mark("later", uid_of("n0")), delete("n0"), settle(),
           ack("a", lambda run, events, i: not (events[i].kind == "added"
                                                and events[i].uid == run.marks["later"])),
           checkpoint(), *RESTART),
          objects=("n0",), then=_nothing_after_crash("a", "n0")),
    Story("an_earlier_objects_delete_does_not_erase_what_a_sink_acknowledged_of_a_later_one", """Found
    by the random schedules (seed 1221311417, PYTHONHASHSEED=82): ``n0`` re-created twice (uids 1,
    6, 8); ``a`` acknowledges only the two deletes. After a crash the replayed delete of uid 1 (older
    than what ``a`` acknowledged of uid 6) must not make its filter forget uid 6's delete: uid 6's
    add and delete do not reach ``a`` again (section 3, per object).""",
          (update("n0", 1), recreate("n0"), mark("middle", uid_of("n0")), recreate("n0"), settle(),
           ack("a", _is("deleted")), checkpoint(), *RESTART),
          objects=("n0",),
          then=_holds(lambda run: run.marks["middle"] not in {e.uid for e in run.after_crash("a", "n0")})),
    Story("what_a_sink_owes_of_several_earlier_objects_is_sent_and_nothing_it_acknowledged", """Found
    by the random schedules (seed 2248531104, PYTHONHASHSEED=85): ``n0`` re-created twice (uids 1,
    4, 6); ``a`` acknowledges only uid 6's add, owing the changes of two earlier objects. After a
    crash it gets uid 1's delete and uid 4's add and delete again (unacknowledged), and not uid 6's
    add (section 3, per object).""",
          (recreate("n0"), recreate("n0"), mark("last", uid_of("n0")), settle(),
           _owed_of_two_earlier_objects, checkpoint(), *RESTART),
          objects=("n0",), then=_after_crash_is("a", "n0", _owed)),
    Story("out_of_order_acknowledgements_around_two_earlier_objects_send_only_what_is_owed", """Found
    by the random schedules (seed 19968978, PYTHONHASHSEED=98): ``n0`` re-created twice (uids 1, 2,
    3); ``a`` acknowledges uid 2's add and uid 3's add and update, owing the deletes of uids 1 and 2
    around them; a checkpoint is written. After a crash it gets exactly those two deletes again: not
    uid 2's add nor uid 3's changes (section 3, per object: what it owes is kept per earlier object,
    not as one range of the name).""",
          (recreate("n0"), recreate("n0"), update("n0", 1), settle(), _acks_around_two_earlier_objects,
           checkpoint(), *RESTART),
          objects=("n0",), then=_after_crash_is("a", "n0", _owed)),
    Story("an_object_handed_to_a_sink_after_its_point_gets_its_delete_after_a_relist", """What
    ``tests/checkpoint/test_per_sink_crash.py``'s fast sink saw once under load: ``a`` is ahead of the
    base (``b`` lags) and its own point is at ``x``'s update (2); ``n5`` is created (3) and its add is
    handed to ``a`` — journalled first, as every new object is —, then the bridge is killed before
    ``a`` acknowledges it. While it is down ``n5`` is deleted and the history compacted: the restart
    relists, which no longer returns ``n5``. Only the journal knows it, created after ``a``'s own
    point: ``a`` may hold it, so it gets ``n5``'s delete (section 9) — without it, a consumer of
    ``a`` that has the add keeps ``n5`` for good (a phantom).""",
          (update("x", 1), settle(), ack_all("a"), checkpoint(), create("n5"), settle(), crash(),
           delete("n5"), compact(), start()),
          then=_holds(lambda run: [e.kind for e in run.events("a") if e.key == "default/n5"]
                      == ["added", "deleted"])),
    Story("an_object_in_flight_to_a_frozen_sink_at_a_crash_gets_its_delete_after_a_relist", """The
    same schedule with ``a`` frozen (what it is handed lands only once it acknowledges it): the add of
    ``n5`` never arrived, and after the relist ``a`` gets a delete of an object it never had. The
    bridge cannot tell this run from the one above — in both the journal made ``n5`` durable before
    the add was handed over, and no acknowledgement of it was durable —, so it sends the delete here
    too: a delete too many is harmless (a uid is deleted once), one too few is a phantom. What a sink
    never had and still gets a delete of is therefore only an object created after its own point in
    the last checkpoint written (the journal's union, section 9), never one at or before it.""",
          (update("x", 1), settle(), ack_all("a"), checkpoint(), create("n5"), settle(), crash(),
           delete("n5"), compact(), start()),
          shapes={"a": SinkShape(lands=True)},
          then=_holds(lambda run: [e.kind for e in run.events("a") if e.key == "default/n5"]
                      == ["deleted"])),
    Story("a_relists_tombstone_acknowledged_past_a_sinks_point_is_not_sent_again", """Found by the
    random schedules (seed 2248531104, PYTHONHASHSEED=85): a 410 and ``n0`` deleted before the
    relist, which infers the delete (a tombstone inside its gap). ``a`` acknowledges the tombstone
    and the gap's end, not its beginning; a checkpoint is written. After a crash the watch replays
    ``n0``'s delete: ``a`` acknowledged that object's delete, so it is not sent again.""",
          (expire(), delete("n0"), settle(), ack("a", _not(_is("gap.begin"))), checkpoint(), *RESTART),
          objects=("n0",), then=_nothing_after_crash("a", "n0")),
    Story("a_relists_tombstone_acknowledged_stays_known_across_two_restarts", """Found by the random
    schedules (seed 339114185, PYTHONHASHSEED=9): ``n0`` updated and deleted before a relist, which
    infers the delete; ``a`` acknowledges the tombstone and the gap's end, not its beginning; a
    checkpoint. After a crash the replayed update of ``n0`` must not make ``a``'s progress say it
    holds ``n0`` again (it acknowledged that uid's delete): after a second crash the replayed delete
    must not reach it again unframed.""",
          (expire(), update("n0", 100), delete("n0"), settle(), ack("a", _not(_is("gap.begin"))),
           checkpoint(), *RESTART, checkpoint(), *RESTART),
          objects=("n0",)),
    Story("a_first_list_acknowledged_is_listed_again_when_an_object_of_it_was_deleted_since", """Found
    by the random schedules (seed 1221311417, PYTHONHASHSEED=82; seed 19968978, PYTHONHASHSEED=98):
    no checkpoint; every sink acknowledges the first list (``n1`` at 2), then ``n1`` is updated (3),
    deleted (4) and created again (5); a crash before any checkpoint. The journal keeps only ``n1``'s
    delete, so the checkpoint its first list implies cannot hold ``n1``'s state at 2: a restart
    resuming the watch from there would turn the replayed update into an add after the delete every
    sink has (a phantom for a consumer that drops repeated ids). It lists at exactly the first
    list's resourceVersion instead (invariant 6): the same events again.""",
          (ack_all("b"), update("n1", 0), recreate("n1"), settle(),
           ack("a", lambda run, events, i: i in (0, 1, 3)), *RESTART),
          objects=("n0", "n1"), first_checkpoint=False),
    Story("a_re_framed_relisted_state_acknowledged_with_its_windows_end_is_not_sent_again", """Found
    by the random schedules (seed 1864223130, PYTHONHASHSEED=62): two 410s while ``n0`` is updated
    (4, 5): the relist sends ``n0`` at 5 inside its gap. A crash before a checkpoint covers it: the
    restart replays ``n0``'s history and sends the state at 5 again framed by a window of its own
    (``relisted:<uid>:3:5``). ``a`` acknowledges that state and the window's end, not its beginning;
    a checkpoint is written. The state and its window are one delivery whose acknowledgement counts
    once the window's end is acknowledged (section 3): after the next crash ``n0`` at 5 must not
    reach ``a`` again.""",
          (create("n2"), expire(), update("n0", 100), expire(), update("n0", 100), checkpoint(),
           *RESTART, _ack_the_re_framed_state_with_its_end, checkpoint(), *RESTART),
          objects=("n0", "n1"), then=_nothing_after_crash("a", "n0", last=True)),
    Story("a_relisted_state_re_sent_inside_a_degraded_sinks_own_window_is_framed", """Found by the
    random schedules once they could fill a sink's window and buffer (issue 33's ``lost``, a defect
    whose timing the machine's load decided: it shows when the listener degrades before the replay
    reaches the relisted state, tick 0, not when it yields after every item): no checkpoint; a 410
    and ``n0`` updated (3) before the relist, which sends ``n0`` at 6 and ``n1`` at 7 inside its gap
    (2, 7] after every object changed twice more; a crash. After the restart ``c`` (a window of two
    events, a buffer of two, no spill) is stuck on the first list's adds; the replayed changes fill
    its buffer (``n0`` at 3 and 4, which the replay holds back: the relist coalesced them) and the
    rest degrades into the listener's own window, opened at 4 — the last change handed over, though
    held back. The relisted state ``n0`` at 6 must still be framed by its own window from 2 (the
    listener's window does not cover 3 and 4): sent bare, ``n0`` at 3 and 4 are lost without a
    marker.""",
          (expire(), update("n0", 100), update("n0", 10), update("n1", 10), update("n0", 11),
           update("n1", 11), settle(), *RESTART),
          objects=("n0", "n1"), first_checkpoint=False, sinks=("a", "c"),
          shapes={"c": SinkShape(window=2, buffer=2)}),
    Story("a_change_between_two_relists_reaches_a_sink_frozen_across_them_and_a_crash", """Issue 34:
    a sink frozen (its broker accepts nothing: what was in flight at the crash never arrives, ``k``)
    across two relists and a crash, the same object changed behind both relists (coalesced) and once
    on the watch between them (``x`` at 4, after the first relist's window (2, 3]). No checkpoint
    covers the first relist (``k`` holds the base back). After the restart the replay holds back
    what each relist coalesced and re-frames ``x``'s relisted state; ``x`` at 4 was observed one by
    one, not coalesced, so it must reach ``k`` as its own event — held back inside one window from
    the first relist's start to the second relist's state, it was lost: the window names it, but
    the only relist that covers it ended at 3 (the resume plan's invariant: a replay holds back
    exactly what each relist coalesced).""",
          (keen("a"), expire(), update("x", 1), settle(), update("x", 2), settle(), expire(),
           update("x", 3), settle(), checkpoint(), *RESTART),
          objects=("x", "y"), sinks=("a", "k"), shapes={"k": SinkShape(lands=True)}),
    Story("a_relisted_state_re_sent_after_a_second_crash_stays_framed", """Found by the random
    schedules once a frozen sink's in-flight events never arrived (seed 3375393998): a 410 and ``n0``
    updated twice (3, 4) before the relist lists: it sends ``n0`` at 4 inside (2, 4]. ``c`` is frozen
    (nothing it is handed arrives). A crash; the restart holds back ``n0`` at 3 (acknowledged without
    delivery) and re-frames ``n0`` at 4 (``relisted:<uid>:2:4``), in flight to ``c``; a checkpoint
    moves the base to 3. A second crash: the watch resumes from 3 and no longer replays ``n0`` at 3,
    so nothing is held back in that run — but ``n0`` at 4 must still be framed from 2: ``c`` never got
    3 one by one nor a window naming it.""",
          (expire(), update("n0", 100), update("n0", 101), checkpoint(), *RESTART, checkpoint(),
           *RESTART),
          objects=("n0", "n1"), sinks=("a", "b", "c"), shapes={"c": SinkShape(lands=True)}),
    Story("changes_a_relist_coalesced_stay_announced_to_a_frozen_sink_once_the_history_expired", """Found
    by the long mode (seed 3935555551, PYTHONHASHSEED=0): a 410 and ``n0`` updated three times (3, 4,
    5) before the relist lists: it sends ``n0`` at 5 inside (2, 5]. ``k`` is frozen (nothing it is
    handed arrives). A crash; the restart holds back ``n0`` at 3 and 4 (acknowledged without
    delivery: nothing of ``n0`` is in flight then) and re-frames ``n0`` at 5, in flight to ``k``; a
    checkpoint moves the base to 4. A crash, the history is compacted, the restart relists from 4:
    its window (4, …] does not name 3 and 4, which ``k`` never got one by one nor inside a window it
    received — the base must not pass them before ``k`` acknowledged the window that announces
    them.""",
          (keen("a"), expire(), update("n0", 100), update("n0", 101), update("n0", 102), settle(),
           *RESTART, checkpoint(), crash(), compact(), start()),
          objects=("n0", "n1"), sinks=("a", "k"), shapes={"k": SinkShape(lands=True)}),
    Story("changes_held_back_after_an_inferred_delete_stay_announced_to_a_frozen_sink", """Found by
    the random schedules (seed 12345): a 410 while ``n0`` is updated (3) and deleted (4): the relist
    infers the delete from ``n0`` at 1. ``c`` is frozen (nothing it is handed arrives). A crash; the
    restart holds the update at 3 back and frames the replayed delete (``replayed:<uid>:1``), in
    flight to ``c``; a checkpoint. Acknowledged at once, the held update let the base pass 3 before
    ``c`` acknowledged the window naming it: after the next crash the watch resumed past it and the
    delete went out bare — 3 lost without a marker.""",
          (expire(), update("n0", 100), delete("n0"), checkpoint(), *RESTART, checkpoint(), *RESTART),
          objects=("n0", "n1"), sinks=("a", "b", "c"), shapes={"c": SinkShape(lands=True)}),
    Story("changes_a_degraded_sink_coalesced_are_not_skipped_after_a_crash", """A sink frozen (``k``'s
    window of two unacknowledged events is full, then its listener's buffer of two, and it has no
    spill) while the objects keep changing, across a relist (a 410; its window (6, 6]) and a crash:
    its listener degrades, keeping the latest state per object. ``k`` acknowledges what it holds
    after the relist (changes before it), a checkpoint is written, the bridge crashes. The changes
    the listener coalesced (``n0`` at 7, ``n1`` at 8) must reach ``k`` after the restart, one by one
    or inside a window it is told of: the listener acknowledged them when it merged them into their
    object's latest state, so the checkpoint took ``k`` past them and its overflow window died with
    the process — skipped as if delivered, without a marker (issue 34's class: the overflow window is one
    delivery, and what it coalesced is acknowledged with it).""",
          (keen("a"), *(update(name, 10 + i) for i in range(2) for name in ("n0", "n1")), settle(),
           expire(), settle(), *(update(name, 20 + i) for i in range(2) for name in ("n0", "n1")),
           settle(), ack_all("k"), settle(), checkpoint(), *RESTART),
          objects=("n0", "n1"), sinks=("a", "k"), shapes={"k": SinkShape(window=2, buffer=2)},
          tick=0.003),
    Story("a_degraded_sinks_window_unacknowledged_at_a_crash_is_not_followed_by_the_history_it_coalesced",
          """Found by the random schedules judging degraded sinks in full (seed 8604223, where it
    ended in a phantom): ``k`` (a window of two unacknowledged events, a buffer of two, no spill) falls
    behind while ``n0`` and ``n1`` change five more times each and ``n0`` is deleted; its listener
    degrades and its overflow window (7, 15] hands over the latest state per object, ``n1`` at 14 and
    ``n0``'s delete at 15. ``k`` acknowledges everything but the window's end, a checkpoint (its base
    stays at 7: the window is one delivery), a crash. The replay then sends ``k`` the changes the
    window coalesced (8 to 12), one by one, after the newer states it holds: an order break, and a
    consumer dropping repeated ids ends with ``n1`` at 12 (stale; with an ``added`` among them, a
    deleted object kept: a phantom), since the states of the window come again with their ids.
    What the window sent is recorded for ``k`` before it goes out (resume plan invariant 8): after the
    restart ``k`` gets ``n1`` at 14 framed ``…:overflowed:<uid>:7:14`` and ``n0``'s delete framed
    ``…:replayed:<uid>:7``, the coalesced changes held back.""",
          (keen("a"), *(update(name, 10 + i) for i in range(6) for name in ("n0", "n1")), delete("n0"),
           settle(), *(step for _ in range(6) for step in (
               ack("k", lambda run, events, i: events[i].kind != "gap.end"), settle())),
           checkpoint(), *RESTART),
          objects=("n0", "n1"), sinks=("a", "k"), shapes={"k": SinkShape(window=2, buffer=2)},
          tick=0.003),
    Story("a_delete_a_relist_inferred_reaches_a_sink_that_got_nothing_of_two_restarts",
          """Found by the random schedules (seed 8702533, schedule 655, shrunk from 61 steps to these):
    every sink holds ``n0`` (uid 1) and ``n1``; ``b`` acknowledges at once from now on, ``a`` and
    ``c`` never. A crash; ``n0`` is deleted and created again (uid 4) while the bridge is down and
    the history compacted, so the restart relists and infers ``n0``'s delete; a crash, a restart
    (``a`` and ``b`` get that delete, ``c`` nothing before the crash), a checkpoint, a crash and a
    restart. No checkpoint was written before it, and the point the journal's first list implied
    left uid 1 out (its inferred delete, recorded at its last state, read as deleted before that
    list): the last run sent no delete of uid 1 to any sink, and a consumer of ``c`` kept ``n0``
    uid 1 for good (a phantom). An inferred delete hides the object's state at that list.""",
          (keen("b"), crash(), recreate("n0"), compact(), start(), crash(), start(), keen("b"), checkpoint(),
           *RESTART),
          objects=("n0", "n1"), sinks=("a", "b", "c"),
          shapes={"a": SinkShape(window=2, buffer=2, spill_limit=0, lands=False),
                  "b": SinkShape(window=1, buffer=1, spill_limit=1 << 20, lands=True),
                  "c": SinkShape(window=None, buffer=1024, spill_limit=0, lands=True)},
          tick=0.003),
    Story("an_overflow_windows_end_covers_every_change_it_coalesced", """A sink frozen (``k``: a
    window of two unacknowledged events, a buffer of two, no spill) while ``n0`` and ``n1`` change:
    its listener degrades, keeping the latest state per object, in the order the objects first
    degraded — ``n0`` (at 10, ``n0`` at 9 coalesced into it), then ``n1`` (at 8). The window's
    ``gapto`` must be its newest change (10), not the last one handed over (8): ending at 8 it
    announced less than it coalesced, and ``n0`` at 9 was lost without a marker.""",
          (keen("a"), update("n0", 10), update("n1", 10), update("n0", 11), update("n1", 11), settle(),
           update("n0", 12), update("n1", 12), update("n0", 13), update("n0", 14), settle()),
          objects=("n0", "n1"), sinks=("a", "k"), shapes={"k": SinkShape(window=2, buffer=2)}),
    Story("a_relisted_state_coalesced_by_a_degraded_sinks_window_still_names_what_was_held_back",
          """Found by the random schedules (seed 3380206007): no checkpoint; every object updated
    three times (3 to 8), a 410 and ``n1`` updated (9) before the relist lists, then both objects
    updated once more: the relist sends ``n0`` at 10 and ``n1`` at 11 inside its gap (8, 11]; a
    checkpoint, a crash, ``n1`` updated (12). After the restart ``c`` (a window of two events, a
    buffer of two, a small spill) replays the history: the replay holds back ``n1`` at 9 (the relist
    coalesced it), and ``c``'s listener degrades, its own window (10, 12] starting at ``n0`` at 10,
    the last change handed over, and merging ``n1`` at 11 — the relisted state the replay re-frames
    as ``relisted:<uid>:8:11`` — into 12. What goes out in the relisted state's place must be framed
    from the relist's start, 8: sent bare inside the overflow window, which starts after 9, no window
    naming ``n1`` at 9 ever reached ``c``.""",
          (*(update(name, 10 + i) for i in (0, 1, 0) for name in ("n0", "n1")), expire(),
           update("n1", 100), update("n0", 10), update("n1", 10), checkpoint(), crash(),
           update("n1", 0)),
          objects=("n0", "n1"), first_checkpoint=False, sinks=("a", "b", "c"),
          shapes={"c": SinkShape(window=2, buffer=2, spill_limit=1500)}),
    Story("a_delete_that_coalesced_a_relisted_state_in_a_degraded_sinks_window_names_what_was_held_back",
          """The previous story with ``n1`` deleted after the crash instead of updated: ``c``'s
    overflow window merges the relisted state at 11 into the delete, which must go out in its place
    framed from the relist's start, 8 (``relisted:<uid>:8:12``); sent bare, ``n1`` at 9 was lost.""",
          (*(update(name, 10 + i) for i in (0, 1, 0) for name in ("n0", "n1")), expire(),
           update("n1", 100), update("n0", 10), update("n1", 10), checkpoint(), crash(),
           delete("n1")),
          objects=("n0", "n1"), first_checkpoint=False, sinks=("a", "b", "c"),
          shapes={"c": SinkShape(window=2, buffer=2, spill_limit=1500)}),
    Story("a_state_acknowledged_inside_a_relists_open_window_is_framed_again_after_a_crash",
          """Found by the random schedules in CI (seed 2021702075): a 410, then ``n0`` updated (3)
    before the relist lists, then both objects updated (4, 5): the relist's window (2, 5] coalesces
    3. ``b`` (a window of two unacknowledged events, a buffer of two, no spill) is handed the
    window's begin and ``n0`` at 4, acknowledges ``n0`` at 4, and its listener degrades before the
    window's end reaches it: its own overflow window starts at 4 and holds the relist's end. A
    checkpoint, a crash. ``b``'s own progress said it held ``n0`` at 4, so its replay skipped 3 and
    4, and its new overflow window started at 4: the relist's window that names 3 never closed for
    ``b`` — 3 lost without a marker. A state acknowledged inside a window whose end the sink has not
    acknowledged is not yet its own progress (docs/delivery-contract.md, section 2).""",
          (expire(), update("n0", 100), update("n0", 10), update("n1", 10), checkpoint(),
           ack("b", lambda run, events, i: events[i].kind == "updated" and events[i].key == "default/n0"),
           checkpoint(), *RESTART),
          objects=("n0", "n1"), sinks=("a", "b", "c"), shapes={"b": SinkShape(window=2, buffer=2)}),
)


@pytest.mark.parametrize("story", [
    pytest.param(s, id=s.name, marks=[pytest.mark.xfail(strict=True, reason="open defect")] if s.open_defect
                 else []) for s in STORIES])
def test_story(story: Story) -> None:
    loop = VirtualTimeLoop(story.tick)
    try:
        run = loop.run_until_complete(play(story))
    finally:
        loop.close()
    assert verdict(run.bridge) == ""
    if story.then is not None:
        story.then(run)
