"""The one restart hook of an informer: a seeded cache at a resourceVersion (:class:`CacheSeed`).

client-go's informer knows its cache and its handlers; a restart is its caller's business: the
caller hands it a store seeded with what consumers already have and a resourceVersion to start
from, and, as client-go's ``Config.Process`` lets a controller do, may put its own processing
around the informer's ``HandleDeltas`` (:class:`SeedProcess`). The informer holds no rule about
what a restart means for a change; the bridge's restart stage (``bridge.delivery.restart``) holds
all of them and reaches the informer through this hook only.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge.contracts import KubeObject, Notification
from bridge.informer.delta_fifo import Delta

__all__ = ["ApplyDelta", "CacheSeed", "Distribute", "SeedProcess", "SeedStart"]

Distribute = Callable[[Notification, bool], Awaitable[None]]
"""Hands a notification to the listeners (``True``: a resync, only to those due for one)."""

ApplyDelta = Callable[[Delta, bool, Distribute], Awaitable[None]]
"""The informer's HandleDeltas for one delta (``delta, is_in_initial_list, distribute``): the cache
updated, then each notification of it handed to ``distribute``."""


class SeedStart(enum.Enum):
    """How a seeded informer starts (:attr:`CacheSeed.start`)."""

    WATCH = "watch"
    """The cache is :attr:`CacheSeed.objects` at the resourceVersion; the first watch starts there,
    without a list (if that resourceVersion expired, the relist emits only real differences, framed
    as a gap from it)."""
    LIST = "list"
    """A list as on a first start, against the cache (a relist's tombstones cover the seeded
    objects it does not return); framed as a gap from the resourceVersion when one is given."""
    LIST_EXACT = "list-exact"
    """The first list is at exactly the resourceVersion (``resourceVersionMatch=Exact``), its states
    notified as on a first start, then the watch from it; when the server no longer has it (410),
    the consistent list that replaces it is framed as a gap from it."""


@dataclass(frozen=True, slots=True)
class CacheSeed:
    """What an informer starts from instead of an empty cache (:meth:`SharedIndexInformer.seed`)."""

    objects: Sequence[KubeObject] = ()
    """The cache (metadata-only stubs will do): objects consumers already have."""
    resource_version: str = ""
    """What the cache reflects (see :attr:`start`; "" with LIST: a first start's list)."""
    start: SeedStart | None = None
    """How the informer starts; None: WATCH with a resourceVersion, else LIST."""
    process: SeedProcess | None = None
    """The caller's processing around each delta, until it has nothing more to decide."""

    @property
    def how(self) -> SeedStart:
        if self.start is not None:
            return self.start
        return SeedStart.WATCH if self.resource_version else SeedStart.LIST


class SeedProcess(Protocol):
    """The caller's part of a seeded start: client-go's ``Config.Process`` around HandleDeltas.

    Called under the informer's processing lock, one delta at a time, in the order of the queue;
    nothing is notified but through it while it is in place."""

    async def process(self, delta: Delta, is_in_initial_list: bool, apply: ApplyDelta,
                      distribute: Distribute) -> bool:
        """Processes ``delta``: typically ``apply(delta, is_in_initial_list, d)`` with ``distribute``
        or a function of its own in front of it. Returns False once it has nothing more to decide:
        the informer then applies every later delta itself."""
        ...

    def first_list(self, listed: bool) -> None:
        """With :attr:`SeedStart.LIST_EXACT`, once: True when that list ended (processed, in the
        order of the queue), False when its resourceVersion expired (before anything of the list
        replacing it is queued)."""
        ...
