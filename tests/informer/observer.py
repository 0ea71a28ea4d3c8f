"""A :class:`~bridge.contracts.DeliveryObserver` for the informer's and the processor's tests: it
records every hook call, in order, as a tuple an exact-sequence assertion reads::

    ("dispatched", seq, kind, listeners)    # a notification handed to these listeners
    ("acked", listener, seq)                # one listener acknowledged it
    ("progress", seq, resource_version)     # every listener has acknowledged up to seq
    ("removed", listener)                   # a listener was removed
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge.contracts import Notification


class RecordingObserver:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        self.events.append(("dispatched", notification.seq, notification.kind.value, tuple(listeners)))

    def acked(self, listener: str, seq: int) -> None:
        self.events.append(("acked", listener, seq))

    def progress(self, seq: int, resource_version: str) -> None:
        self.events.append(("progress", seq, resource_version))

    def listener_removed(self, listener: str) -> None:
        self.events.append(("removed", listener))

    def without_acks(self) -> list[tuple[Any, ...]]:
        """Every event but the acknowledgements."""
        return [e for e in self.events if e[0] != "acked"]

    def acks(self, listener: str) -> list[int]:
        """The seqs ``listener`` acknowledged, in order."""
        return [e[2] for e in self.events if e[0] == "acked" and e[1] == listener]
