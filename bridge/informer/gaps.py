"""Gap markers: where a relist reports differences instead of every change (a bridge extension).

A relist once changes were processed (the informer resumed from a seed, or listed before) reports
only differences. Its first item opens a gap from the last processed resourceVersion, its end marker
closes it at the list's; listeners get both as ``GAP`` notifications, in change order (a relist with
nothing to pop opens and closes it at its end).
"""

from __future__ import annotations

import dataclasses
import uuid

from bridge.contracts import Gap, Notification, NotificationKind
from bridge.informer.seed import Distribute

__all__ = ["RelistGaps"]


class RelistGaps:
    """The gap windows of one informer's relists, opened and closed in change order."""

    def __init__(self, *, name: str, distribute: Distribute) -> None:
        self._name = name or "informer"
        self._distribute = distribute
        self.current: Gap | None = None
        """The relist window open between a relist's begin and end markers, if any."""
        self._count = 0
        self._run = uuid.uuid4().hex[:8]
        """Part of every gap id: two runs relisting from the same resourceVersion (a restart whose
        checkpoint had not moved) send different windows, which must not share an id."""

    async def open(self, from_rv: str) -> None:
        self._count += 1
        gap = self.current = Gap(id=f"{self._name}:{from_rv}:{self._run}-{self._count}",
                                 from_resource_version=from_rv)
        await self._distribute(Notification(kind=NotificationKind.GAP, obj={}, gap=gap), False)

    async def close(self, from_rv: str, list_rv: str) -> None:
        if self.current is None:
            await self.open(from_rv)
        gap, self.current = self.current, None
        assert gap is not None
        end = dataclasses.replace(gap, to_resource_version=list_rv, end=True)
        await self._distribute(Notification(kind=NotificationKind.GAP, obj={}, gap=end), False)
