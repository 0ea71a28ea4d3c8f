"""The deltas the reflector queues for the informer, and what the queue hands its consumer.

client-go defines its ``Delta`` types next to its legacy per-key ``DeltaFIFO`` (``delta_fifo.go``)
and shares them with the in-order queue every 1.36 informer uses (``the_real_fifo.go``); so does the
bridge: the queue itself is :class:`bridge.informer.real_fifo.RealFIFO`. The per-key queue, which
merged a key's changes into one entry and inferred a relist's deletes after its items, is gone.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bridge.contracts import DeletedFinalStateUnknown, KubeObject

__all__ = [
    "Delta",
    "DeltaType",
    "Deltas",
    "FIFOClosedError",
    "PopProcessFunc",
    "ResourceVersionMarker",
]


class DeltaType(enum.StrEnum):
    ADDED = "Added"
    UPDATED = "Updated"
    DELETED = "Deleted"
    REPLACED = "Replaced"
    """Queued by ``replace`` (a relist), for every listed item."""
    SYNC = "Sync"
    """Queued by ``resync``: the cached object, for a periodic resync notification."""


@dataclass(frozen=True, slots=True)
class Delta:
    """One change to one object. ``object`` is a tombstone only for ``Deleted`` deltas."""

    type: DeltaType
    object: KubeObject | DeletedFinalStateUnknown


Deltas = list[Delta]
"""Several deltas, oldest first (what the queue holds for one key, :meth:`RealFIFO.get_by_key`)."""


@dataclass(frozen=True, slots=True)
class ResourceVersionMarker:
    """Progress marker: every delta queued before it is reflected in ``resource_version``."""

    resource_version: str
    relist_end: bool = False
    """Queued by a completed relist (``replace`` / ``replace_end``): every delta the relist queued
    is before it. A following marker coalescing with it keeps the flag."""


PopProcessFunc = Callable[[Delta | ResourceVersionMarker, bool], Awaitable[None]]
"""``process(item, is_in_initial_list)``: applies one delta (or a marker) to the consumer."""


class FIFOClosedError(Exception):
    """``pop`` on a queue that is closed and empty: the consumer should stop."""
