"""The acknowledgement helpers shared by the listener and the sink adapter: only the first call counts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bridge.informer.ack import ack_once, batch_acks


@pytest.mark.parametrize(("calls", "expected"), [
    ([()], [(7,)]),  # one call: passed on with what it is of
    ([(), ()], [(7,)]),  # a second call does nothing
    ([("delivered",), ("failed",)], [(7, "delivered")]),  # the first call's report wins
])
def test_only_the_first_call_is_passed_on(calls: list[tuple[str, ...]],
                                          expected: list[tuple[object, ...]]) -> None:
    seen: list[tuple[object, ...]] = []

    def record(bound: int, *args: str) -> None:
        seen.append((bound, *args))

    ack = ack_once(record, 7)
    for args in calls:
        ack(*args)
    assert seen == expected


def test_each_acknowledgement_counts_once_on_its_own() -> None:
    seen: list[int] = []
    acks = [ack_once(seen.append, seq) for seq in range(3)]
    acks[2]()
    acks[0]()
    acks[2]()
    acks[1]()
    acks[0]()
    assert seen == [2, 0, 1]


def test_a_batchs_acks_each_reach_their_item_with_what_the_caller_reports() -> None:
    seen: list[tuple[str, str]] = []
    calls: list[int] = []

    def acked(items: Sequence[str], called: bytearray, i: int, outcome: str) -> None:
        calls.append(i)
        if called[i]:
            return
        called[i] = 1
        seen.append((items[i], outcome))

    acks = batch_acks(acked, ["a", "b", "c"])
    acks[2]("delivered")
    acks[0]("failed")
    acks[2]("failed")  # a second call: the function is told, and does nothing
    acks[1]("delivered")
    assert seen == [("c", "delivered"), ("a", "failed"), ("b", "delivered")]
    assert calls == [2, 0, 2, 1]
