"""Schedules the stateful specification's long mode found, shrunk and replayed in seconds
(:mod:`tests.contract.spec_replay`): each one a defect of the recovery model, judged as the
stateful test judges (every sink in full). One still open would be a strict expected failure, so
that the suite says so the day it passes."""

from __future__ import annotations

from tests.contract.spec_replay import replay

SEED_8702533_2010 = """\
state = DeliverySpec()
state.begin(shapes=[SinkShape(window=None, buffer=1024, spill_limit=0, lands=True),
 SinkShape(window=1, buffer=1, spill_limit=1048576, lands=True),
 SinkShape(window=None, buffer=1024, spill_limit=0, lands=True)], tick=0.0003, first_checkpoint=True)
state.burst(changes=4, turns=3)
state.expire_watch_amid_changes(changes=1, gone=True, name='n2')
state.burst(changes=1, turns=0)
state.dead_letter(order=58, share=1.0, sink='b')
state.settle_down()
state.crash_and_restart()
state.delete(name='n0', turns=3)
state.create(name='n2', turns=30)
state.dead_letter(order=6, share=1.0, sink='b')
state.checkpoint()
state.burst(changes=3, turns=0)
state.burst(changes=1, turns=30)
state.acknowledge(order=95, share=0.7, sink='a')
state.crash()
state.teardown()
"""
"""Seed 8702533 (PYTHONHASHSEED=0), schedule 2,010 of the long mode, shrunk from 60 steps: after the
last restart sink ``a`` gets ``n0``'s replayed update at 3 as an *add* (a new id), after the delete
at 13 it received before the crash; that delete comes again framed (``replayed:<uid>:10``, the same
id, dropped by a consumer dropping repeated ids), which keeps ``n0``: order and a phantom. The
cause: no checkpoint had been written, the start resumed from the point the journal's first list
implied, and that point left out the objects a later relist had sent a state of (the journal keeps
one fact per uid: the relisted state stood in place of the listed one), so ``a``'s own progress
said it held nothing of ``n0``. A relisted state after the list hides the listed one as a delete
after it does: the start lists again."""


def test_seed_8702533_schedule_2010() -> None:
    replay(SEED_8702533_2010)


SEED_8702533_2314 = """\
state = DeliverySpec()
state.begin(tick=0.0003, first_checkpoint=True,
 shapes=[SinkShape(window=2, buffer=2, spill_limit=0, lands=False),
 SinkShape(window=2, buffer=2, spill_limit=0, lands=False),
 SinkShape(window=2, buffer=2, spill_limit=0, lands=False)])
state.burst(changes=1, turns=3)
state.acknowledge(order=30, share=0.7, sink='a')
state.burst(changes=1, turns=3)
state.expire_watch_amid_changes(changes=3, gone=False, name='n1')
state.checkpoint()
state.burst(changes=3, turns=30)
state.crash_and_restart()
state.acknowledge(order=10, share=1.0, sink='c')
state.checkpoint()
state.acknowledge(order=65, share=0.7, sink='c')
state.crash_and_restart()
state.teardown()
"""
"""The same seed, schedule 2,314, shrunk from 60 steps, found on this session's tree with the
overflow-window records: every sink degrades (a window and a buffer of two, no spill). ``c``'s
overflow window from 4 sends ``n1`` at 15, a crash; after the restart a relist's window of ``n1``
(its state at 9) and ``c``'s own overflow window (its state at 15) both hold 9, and the relist's,
looked at first, re-sent ``n1`` at 9 after the 15 ``c`` may hold (order). When both hold a change,
the window whose state is newer decides."""


def test_seed_8702533_schedule_2314() -> None:
    replay(SEED_8702533_2314)
