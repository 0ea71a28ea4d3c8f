"""A degraded listener's overflow window is one delivery (docs/delivery-contract.md, section 7a):
what it coalesced, and what it hands over inside it, is acknowledged only once the handler
acknowledged every notification of the window, its end marker included; its ``to`` is the newest
change inside it."""

from __future__ import annotations

import asyncio
from typing import Any

from bridge.clock import FakeClock
from bridge.contracts import AckFunc, ListenerOptions, Notification, NotificationKind, ObjectKey
from bridge.informer.buffer_mode import BufferMode
from bridge.informer.listener import ProcessorListener


def change(seq: int, name: str, rv: int) -> Notification:
    obj: dict[str, Any] = {"metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}",
                                        "resourceVersion": str(rv)}}
    return Notification(kind=NotificationKind.UPDATE, obj=obj, old=obj, key=ObjectKey(f"ns/{name}"), seq=seq)


class Held:
    """A handler that keeps every notification's ack until the test calls it."""

    def __init__(self) -> None:
        self.seen: list[tuple[Notification, AckFunc]] = []

    async def handle(self, n: Notification, ack: AckFunc) -> None:
        self.seen.append((n, ack))


class Acks:
    """The delivery observer's acknowledgements, in order."""

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def acked(self, listener: str, seq: int) -> None:
        self.seqs.append(seq)

    def dispatched(self, notification: Notification, listeners: object) -> None:
        pass

    def progress(self, seq: int, resource_version: str) -> None:
        pass


async def settled(listener: ProcessorListener, handler: Held, count: int) -> None:
    for _ in range(1000):
        if len(handler.seen) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the handler got {len(handler.seen)} notifications, not {count}")


async def test_what_a_window_coalesced_is_acknowledged_only_with_the_whole_window() -> None:
    handler, acks = Held(), Acks()
    listener = ProcessorListener(handler=handler, options=ListenerOptions(name="l", buffer_capacity=1),
                                 clock=FakeClock(), name="l", observer=acks)  # type: ignore[arg-type]
    # In memory: a@1; then degraded, in the order the objects first degraded: a (2, 4, 5), b (3).
    for seq, (name, rv) in enumerate([("a", 1), ("a", 2), ("b", 3), ("a", 4), ("a", 5)]):
        await listener.add(change(seq, name, rv))
    assert listener.mode is BufferMode.DEGRADED
    assert acks.seqs == []  # nothing coalesced is acknowledged at the merge
    listener.start()
    await settled(listener, handler, 5)  # a@1, the window's begin, a@5, b@3, its end
    kinds = [(n.kind, n.seq) for n, _ in handler.seen]
    assert kinds == [(NotificationKind.UPDATE, 0), (NotificationKind.GAP, -1), (NotificationKind.UPDATE, 4),
                     (NotificationKind.UPDATE, 2), (NotificationKind.GAP, -1)]
    end = handler.seen[-1][0].gap
    assert end is not None
    assert end.end
    assert (end.from_resource_version, end.to_resource_version) == ("1", "5")  # not b's 3
    first, *window = handler.seen
    first[1]()
    assert acks.seqs == [0]
    for _, ack in window[:-1]:  # the states and the begin, not the end
        ack()
    assert acks.seqs == [0]
    window[-1][1]()
    assert sorted(acks.seqs) == [0, 1, 2, 3, 4]  # a@2 and a@4 with the window that replaced them
    listener.close()
