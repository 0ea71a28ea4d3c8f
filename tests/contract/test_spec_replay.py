"""The replay of a printed schedule (:mod:`tests.contract.spec_replay`): what it reads of a pytest
log, what it refuses, and that a schedule it plays is judged like the stateful test's."""

from __future__ import annotations

import pytest

from tests.contract.spec_driver import SinkShape
from tests.contract.spec_replay import parse_schedule, replay

LOGGED = """\
E           Failing test case: <state machine>
E           state = DeliverySpec()
E           state.begin(first_checkpoint=True, tick=0.001, shapes=[SinkShape(window=None,
E            buffer=1024, spill_limit=0, lands=False),
E            SinkShape(window=2, buffer=2, spill_limit=1500, lands=False),
E            SinkShape(window=2, buffer=2, spill_limit=0, lands=True)])
E           state.nothing_invented_or_out_of_order_so_far()
E           state.update(name='n0', value=3, turns=0)
E           state.nothing_invented_or_out_of_order_so_far()
E           state.expire_watch(turns=3)
E           state.crash()
E           state.delete(name='n1', turns=30)
E           state.restart()
E           state.acknowledge(order=4, share=0.7, sink='b')
E           state.teardown()
E           state.crash()
"""


def test_a_logged_schedule_is_read_step_by_step_up_to_its_teardown() -> None:
    steps = parse_schedule(LOGGED)
    assert [rule for rule, _ in steps] == ["begin", "update", "expire_watch", "crash", "delete", "restart",
                                           "acknowledge"]
    assert steps[0][1]["shapes"][2] == SinkShape(window=2, buffer=2, spill_limit=0, lands=True)
    assert steps[-1][1] == {"order": 4, "share": 0.7, "sink": "b"}


@pytest.mark.parametrize(("text", "why"), [
    ("state.begin(first_checkpoint=True, tick=0.0, shapes=[])", "no schedule"),
    ("state = DeliverySpec()\nstate.update(name='n0', value=1, turns=0)", "starts with state.begin"),
    ("state = DeliverySpec()\nstate.begin(first_checkpoint=True, tick=0.0, shapes=[])\n__import__('os')",
     "not a step"),
    ("state = DeliverySpec()\nstate.begin(first_checkpoint=True, tick=0.0, shapes=[])\n"
     "state.update(name=open('x'), value=1, turns=0)", "malformed node"),
])
def test_anything_but_steps_of_literals_is_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_schedule(text)


def test_only_the_specifications_rules_are_played() -> None:
    with pytest.raises(ValueError, match="not a rule"):
        replay("state = DeliverySpec()\nstate.begin(first_checkpoint=True, tick=0.0, shapes=[])\n"
               "state.explain(found=[])")


def test_a_schedule_is_played_and_judged() -> None:
    shapes = "[SinkShape(), SinkShape(window=2, buffer=2), SinkShape(lands=True)]"
    replay(f"state = DeliverySpec()\nstate.begin(first_checkpoint=True, tick=0.0, shapes={shapes})\n"
           + LOGGED.split("state.nothing_invented_or_out_of_order_so_far()\n", 1)[1])


UNHANDED_RELIST = """\
state = DeliverySpec()
state.begin(first_checkpoint=True, tick=0.003, shapes=[
 SinkShape(window=2, buffer=2, spill_limit=0, lands=False),
 SinkShape(window=2, buffer=2, spill_limit=1500, lands=False),
 SinkShape(window=1, buffer=1, spill_limit=1048576, lands=True)])
state.create(name='n2', turns=30)
state.crash()
state.restart()
state.expire_watch(turns=0)
state.burst(changes=3, turns=30)
state.settle_down()
state.crash_and_restart()
state.expire_watch(turns=30)
state.pace(keen=True, sink='c')
state.settle_down()
state.crash_and_restart()
state.burst(changes=3, turns=3)
state.teardown()
"""


def test_a_relist_whose_markers_no_sink_was_handed_is_known_to_the_model() -> None:
    """Found by a long run (seed 3199989002, shrunk): a relist (3, 12] while every sink was frozen
    and its listener had spilled or degraded, so no sink was handed its markers; a crash. The
    restart re-frames its states (``relisted:<uid>:3:<rv>``) and the model, which learnt relist
    windows from the sinks' hands only, did not know the relist and judged the changes it coalesced
    (4 to 9) lost. The driver notes every relist window the informer distributes."""
    replay(UNHANDED_RELIST)
