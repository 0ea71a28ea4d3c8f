"""The real delivery layer driven through random schedules, judged by the contract's executable
specification (:mod:`bridge.testing.spec`).

A Hypothesis ``RuleBasedStateMachine`` plays the cluster (creates, updates, deletes, names re-used
by new uids, bursts of changes to every object), the faults (crashes — :meth:`BridgePipeline.abort`,
then a new pipeline from the same store —, compactions of the server's history, 410s sent into the
open watch) and three sinks that acknowledge at their own pace (one may stall for a long while and
recover, acknowledging in any order, or set events aside as dead letters), with checkpoint writes at
random points; a schedule starts with a first checkpoint or without one. Each sink has a shape
(:data:`SHAPES`): it takes any backlog, or — as a frozen broker — a window of unacknowledged events,
beyond which its listener's small buffer fills, then its spill on disk (the real segment spill),
then it degrades (latest state per object inside a gap window of its own). In-process: the fake
source, a fake clock, the checkpoint store and its known-object journal in memory, written on the
event loop, and an event loop whose own clock is virtual (the machine's "load" is part of the
schedule, :data:`TICKS`), so that a seed is one schedule (:mod:`tests.contract.spec_driver`, over
the pipeline's public entry points only). At the end every
sink acknowledges everything until the bridge has passed a marker object, and the model judges each
sink's log: lost changes, invented states, per-object order, needless gaps, repeats of durably
acknowledged events, and what a consumer that drops repeated ids ends with.

Modes (environment):

* CI (default): ``KEB_SPEC_EXAMPLES`` schedules (default 1,000: about 1,100 run, 45 to 85 s on a
  loaded two-core machine, no more than the tree before sink shapes: 44 to 102 s) of up to
  ``KEB_SPEC_STEPS`` steps (default 25), from one seed: ``KEB_SPEC_SEED`` when set (``random``:
  a fresh one), else :data:`CI_SEED`, so that CI judges the same schedules on every run
  (``scripts/test`` fixes ``PYTHONHASHSEED`` too: the bridge iterates sets of uids, so string
  hashing is part of a schedule). The seed is printed with the test's output and every failure is
  replayed with ``KEB_SPEC_SEED=<seed>`` and the run's ``PYTHONHASHSEED`` (the failure message
  says how). Neither the wall clock nor the machine's load is part of a schedule: a failure replays
  on any machine.
* long: ``KEB_SPEC_LONG=1`` (``scripts/spec-soak``): 5,000 schedules of up to 60 steps per seed,
  not shrunk; a failing schedule, as Hypothesis prints it, replays in seconds with
  ``scripts/spec-soak --schedule <the output>`` (:mod:`tests.contract.spec_replay`).
* ``KEB_SPEC_ALLOW=kind,kind``: findings of those kinds (:data:`bridge.testing.spec.FINDING_KINDS`)
  do not fail a schedule (the CI mode's default: :data:`KNOWN_OPEN`), to see the state with and
  without a known defect's findings, e.g. ``KEB_SPEC_ALLOW=lost,order,phantom,excess_repeat``.

Hypothesis's example database is off (a replay is a seed, not a file), and so is shrinking's
deadline: each step runs the bridge's event loop until it settles.
"""

from __future__ import annotations

import logging
import os
import random

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bridge.testing.spec import Finding, Received, by_kind, check_sink
from sinks.contract import DeliveryOutcome
from tests.contract.spec_driver import Bridge, SinkShape, VirtualTimeLoop

SINKS = ("a", "b", "c")
NAMES = ("n0", "n1", "n2", "n3")
LONG = os.environ.get("KEB_SPEC_LONG", "") == "1"
EXAMPLES = int(os.environ.get("KEB_SPEC_EXAMPLES", "5000" if LONG else "1000"))
STEPS = int(os.environ.get("KEB_SPEC_STEPS", "60" if LONG else "25"))
CI_SEED = 20261202
"""The CI mode's seed: a CI run judges the same schedules every time (a fresh seed in CI turned each
run into a draw: seed 2021702075 found a defect on a tree whose change touched nothing near it, and
the finished work of that run did not land). Fresh seeds are explored by ``scripts/spec-soak`` and
``scripts/flake-hunt``; ``KEB_SPEC_SEED=random`` draws one here."""
_SEED_TEXT = os.environ.get("KEB_SPEC_SEED", "")
SEED = (random.SystemRandom().randrange(2**32) if _SEED_TEXT == "random"
        else int(_SEED_TEXT) if _SEED_TEXT else CI_SEED)
KNOWN_OPEN = ""
"""Findings of a defect still open, tolerated by the CI mode so that it judges every other kind on
every run (none); ``KEB_SPEC_ALLOW`` overrides it."""
DEGRADED_OPEN = frozenset(os.environ.get("KEB_SPEC_DEGRADED_ALLOW", "").split(",")) - {""}
"""Findings tolerated of a sink whose listener degraded in the schedule (none: every sink is judged
in full). Until the resume plan's invariant 8 (what a sink's overflow window sent is that sink's own
relist), a crash while the window was being handed over replayed its coalesced changes after the
newer states the window had delivered (``order``, ``stale``, ``phantom``), and these three were
tolerated here; ``KEB_SPEC_DEGRADED_ALLOW=order,stale,phantom`` brings that back to bisect."""
ALLOWED = frozenset(k for k in os.environ.get("KEB_SPEC_ALLOW", KNOWN_OPEN).split(",") if k)
TURNS = st.sampled_from((0, 3, 30))
"""Turns of the event loop the bridge gets after a step (0: the next step comes at once)."""
TICKS = (0.0, 0.0003, 0.001, 0.003)
"""Seconds the event loop's virtual clock moves per reading (:class:`~tests.contract.spec_driver.
VirtualTimeLoop`): where the informer and the listeners yield amid a backlog. 0: never (an
infinitely fast machine); 0.003, more than a ``TIME_SLICE``: after every item (a loaded machine)."""
SHAPES = (SinkShape(), SinkShape(lands=True), SinkShape(window=2, buffer=2),
          SinkShape(window=2, buffer=2, spill_limit=1500),
          SinkShape(window=1, buffer=1, spill_limit=1 << 20, lands=True))
"""How a sink takes its backlog while it stalls: at any length, what it was handed in its
destination (the first), or only once acknowledged — a frozen broker: what was in flight at a crash
never arrives (the second); or, like a frozen broker's client, a window of unacknowledged events and
then its listener's memory, and beyond it nothing (it degrades at once: latest state per object
inside a gap window of its own), a spill on disk of a few records (then it degrades) or one that
never fills."""
HASH_SEED = os.environ.get("PYTHONHASHSEED", "")
REPLAY = (f"PYTHONHASHSEED={HASH_SEED or 0} KEB_SPEC_SEED={SEED} pytest tests/contract/test_spec_stateful.py"
          + ("" if HASH_SEED else "; this run's string hashing was random (the bridge iterates sets "
             "of uids): if the replay passes, run the seed under a few PYTHONHASHSEED values")
          + ("; or, in seconds, the failing schedule Hypothesis prints below: PYTHONHASHSEED="
             f"{HASH_SEED or 0} scripts/spec-soak --schedule <this output>" if LONG else ""))
"""How to replay this run: the seed, and the string-hash seed the bridge's set iteration order
depends on (``scripts/spec-soak`` sets ``PYTHONHASHSEED=0``)."""
RUNS: list[int] = []
"""One entry per schedule run (the count is reported)."""


class DeliverySpec(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.bridge = Bridge(SINKS)
        self.rng = random.Random(0)
        self.steps: list[str] = []
        for name in NAMES[:2]:
            self.bridge.create(name)
        RUNS.append(1)

    @initialize(first_checkpoint=st.booleans(), tick=st.sampled_from(TICKS),
                shapes=st.lists(st.sampled_from(SHAPES), min_size=len(SINKS), max_size=len(SINKS)))
    def begin(self, first_checkpoint: bool, tick: float, shapes: list[SinkShape]) -> None:
        """The bridge starts; with ``first_checkpoint`` every sink acknowledges the first list and a
        checkpoint covers it, so restarts resume the watch from there; without, the schedule starts
        before any checkpoint (a crash then finds none). ``tick``: how loaded the machine is (see
        :data:`TICKS`); ``shapes``: each sink's window, buffer and spill (:data:`SHAPES`)."""
        self.loop.tick = tick
        self.bridge.shapes = dict(zip(SINKS, shapes, strict=True))
        self.run(self.bridge.start())
        if first_checkpoint:
            for sink in self.bridge.sinks.values():
                sink.ack_some(self.rng, 1.0)
            self.run(self.bridge.checkpoint())

    def run(self, coro: object) -> None:
        self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    @property
    def up(self) -> bool:
        return self.bridge.pipeline is not None

    def settle(self) -> None:
        self.run(self.bridge.settle())

    def nudge(self, turns: int) -> None:
        if self.up:
            self.run(self.bridge.nudge(turns))

    # -- the cluster --------------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), turns=TURNS)
    def create(self, name: str, turns: int) -> None:
        self.bridge.create(name)
        self.nudge(turns)

    @rule(name=st.sampled_from(NAMES), value=st.integers(0, 9), turns=TURNS)
    def update(self, name: str, value: int, turns: int) -> None:
        self.bridge.update(name, value)
        self.nudge(turns)

    @rule(name=st.sampled_from(NAMES), turns=TURNS)
    def delete(self, name: str, turns: int) -> None:
        self.bridge.delete(name)
        self.nudge(turns)

    @rule(changes=st.integers(1, 4), turns=TURNS)
    def burst(self, changes: int, turns: int) -> None:
        """Every object updated ``changes`` times in a row: a backlog that outgrows a stalled sink's
        window and buffer (its listener spills, then degrades)."""
        for i in range(changes):
            for name in NAMES:
                self.bridge.update(name, 10 + i)
        self.nudge(turns)

    @rule(name=st.sampled_from(NAMES), turns=TURNS)
    def recreate(self, name: str, turns: int) -> None:
        """The name deleted and created again at once: a new uid under it."""
        self.bridge.delete(name)
        self.bridge.create(name)
        self.nudge(turns)

    @precondition(lambda self: self.up)
    @rule()
    def settle_down(self) -> None:
        """The bridge runs until nothing moves (every change handed to every sink that takes it)."""
        self.settle()

    # -- the faults ---------------------------------------------------------------------------------

    @precondition(lambda self: self.up)
    @rule()
    def crash(self) -> None:
        self.run(self.bridge.crash())

    @precondition(lambda self: not self.up)
    @rule()
    def restart(self) -> None:
        self.run(self.bridge.start())

    @precondition(lambda self: self.up)
    @rule()
    def crash_and_restart(self) -> None:
        """A crash and an immediate restart that runs until it settles (restarts in a row replay
        the same history again: what one restart held back, the next must too)."""
        self.run(self.bridge.crash())
        self.run(self.bridge.start())

    @rule()
    def compact(self) -> None:
        self.bridge.compact()

    @precondition(lambda self: self.up)
    @rule(turns=TURNS)
    def expire_watch(self, turns: int) -> None:
        self.bridge.expire_watch()
        self.nudge(turns)

    @precondition(lambda self: self.up)
    @rule(name=st.sampled_from(NAMES), changes=st.integers(1, 3), gone=st.booleans())
    def expire_watch_amid_changes(self, name: str, changes: int, gone: bool) -> None:
        """A 410 into the watch, then changes of one object before the relist lists: the relist
        coalesces them (its state of the object is newer than the watch's last), and a later crash
        replays them from an older checkpoint — the held-back window of docs/delivery-contract.md,
        section 2."""
        self.bridge.expire_watch()
        for i in range(changes):
            self.bridge.update(name, 100 + i)
        if gone:
            self.bridge.delete(name)

    @precondition(lambda self: self.up)
    @rule()
    def checkpoint(self) -> None:
        self.run(self.bridge.checkpoint())

    # -- the sinks ----------------------------------------------------------------------------------

    @precondition(lambda self: self.up)
    @rule(sink=st.sampled_from(SINKS), share=st.sampled_from((0.3, 0.7, 1.0)), order=st.integers(0, 99))
    def acknowledge(self, sink: str, share: float, order: int) -> None:
        self.bridge.sinks[sink].ack_some(random.Random(order), share)

    @precondition(lambda self: self.up)
    @rule(sink=st.sampled_from(SINKS), share=st.sampled_from((0.5, 1.0)), order=st.integers(0, 99))
    def dead_letter(self, sink: str, share: float, order: int) -> None:
        """The sink sets about ``share`` of what is pending aside in its dead-letter destination
        (acknowledged as dead-lettered, docs/delivery-contract.md, section 1)."""
        self.bridge.sinks[sink].ack_some(random.Random(order), share, DeliveryOutcome.DEAD_LETTERED)

    @precondition(lambda self: self.up)
    @rule(sink=st.sampled_from(SINKS), keen=st.booleans())
    def pace(self, sink: str, keen: bool) -> None:
        """A sink keeps up (acknowledges at once) or stalls (acknowledges only when told)."""
        self.bridge.sinks[sink].keen = keen
        if keen:
            self.bridge.sinks[sink].ack_some(self.rng, 1.0)

    # -- the verdict --------------------------------------------------------------------------------

    @invariant()
    def nothing_invented_or_out_of_order_so_far(self) -> None:
        """Checked after every step on what the sinks hold so far (no end state yet)."""
        everything = [e for log in self.bridge.logs.values() for e in log.received()
                      if e.kind.startswith("gap.")]
        for log in self.bridge.logs.values():
            found = [f for f in check_sink(self.bridge.history, log, all_windows=everything,
                                           check_end_state=False)
                     if f.kind in ("invented", "order", "excess_repeat") and not self.allowed(f)]
            assert not found, self.explain(found)

    def teardown(self) -> None:
        try:
            drained = True
            try:
                drained = self.loop.run_until_complete(self.bridge.drain())
            finally:
                self.loop.run_until_complete(self.bridge.close())
            assert drained, "the bridge never acknowledged past the final marker"
            everything = [e for log in self.bridge.logs.values() for e in log.received()
                          if e.kind.startswith("gap.")]
            found = [f for log in self.bridge.logs.values()
                     for f in check_sink(self.bridge.history, log, all_windows=everything)]
            failing = [f for f in found if not self.allowed(f)]
            assert not failing, self.explain(failing)
        finally:
            self.loop.close()

    def allowed(self, finding: Finding) -> bool:
        degraded = finding.sink in self.bridge.degraded
        return finding.kind in ALLOWED or (degraded and finding.kind in DEGRADED_OPEN)

    def explain(self, found: list) -> str:  # type: ignore[type-arg]
        lines = [f"seed {SEED} (replay: {REPLAY})",
                 f"findings {dict(by_kind(found))}:", *map(str, found[:30]), "history:",
                 f"  origin {self.bridge.history.origin}",
                 *(f"  {c.rv} {c.kind.value} {c.key} {c.uid}" for c in self.bridge.history.changes),
                 f"  relist causes {self.bridge.history.relist_causes}"]
        for name, log in self.bridge.logs.items():
            lines.append(f"sink {name}:")
            lines += [f"  {_show(e)}" for e in log.entries]
        return "\n".join(lines)


def _show(entry: object) -> str:
    if isinstance(entry, Received):
        if entry.is_change:
            return (f"{entry.kind} {entry.key} {entry.uid} @{entry.rv}" + (" fsu" if entry.inferred else "")
                    + (f" [{entry.gap_id}]" if entry.gap_id else ""))
        return f"{entry.kind} {entry.gap_id} ({entry.gap_from}, {entry.gap_to}]"
    return type(entry).__name__


@pytest.mark.timeout(86400 if LONG else 1200)  # a hang guard, not a speed limit
def test_the_delivery_layer_keeps_the_contract_under_random_schedules() -> None:
    print(f"KEB_SPEC_SEED={SEED} PYTHONHASHSEED={HASH_SEED or 'random'} examples={EXAMPLES} steps={STEPS}")
    RUNS.clear()
    machine = seed(SEED)(DeliverySpec)
    logging.disable(logging.WARNING)  # every crash logs its cancellations; thousands of them
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, database=None, deadline=None,
            phases=(Phase.generate, Phase.shrink) if not LONG else (Phase.generate,),
            suppress_health_check=list(HealthCheck), print_blob=False))
    finally:
        logging.disable(logging.NOTSET)
        print(f"KEB_SPEC_SEED={SEED}: {len(RUNS)} schedules run")
