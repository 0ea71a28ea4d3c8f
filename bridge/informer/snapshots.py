"""Snapshots on request: the whole cache handed to listeners as one ``SNAPSHOT`` notification.

A bridge extension of the shared informer (:meth:`SharedIndexInformer.request_snapshot`): each
snapshot is taken under the informer's processing lock, so it sits between two processed changes,
consistent with the change order every listener sees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bridge.contracts import Notification, NotificationKind
from bridge.informer.processor import ProcessorListener, SharedProcessor
from bridge.informer.store import IndexedCache

__all__ = ["SnapshotRequests"]

log = logging.getLogger(__name__)


class SnapshotRequests:
    """The snapshot requests of one informer, and the task that emits them (:meth:`run`)."""

    def __init__(self, *, processor: SharedProcessor, cache: IndexedCache, lock: asyncio.Lock,
                 progress: Callable[[], str], name: str) -> None:
        """``lock``: the informer's processing lock; ``progress()``: its last progress
        resourceVersion (what a snapshot reflects)."""
        self._processor = processor
        self._cache = cache
        self._lock = lock
        self._progress = progress
        self._name = name
        self._requests: list[ProcessorListener | None] = []
        self._wakeup = asyncio.Event()

    def request(self, listener: ProcessorListener | None) -> None:
        """Queues a snapshot for ``listener`` (None: every listener); see
        :meth:`SharedIndexInformer.request_snapshot`."""
        self._requests.append(listener)
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            async with self._lock:
                requests, self._requests = self._requests, []
                current = self._processor.listeners
                wanted = current if None in requests else [t for t in dict.fromkeys(requests)
                                                            if t is not None and t in current]
                targets = [t for t in wanted if not t.snapshots_pending]
                if len(targets) < len(wanted):
                    log.info("a snapshot is already pending for %d listener(s): the request joins it",
                             len(wanted) - len(targets), extra={"informer": self._name})
                if not targets:
                    continue
                for t in targets:
                    t.snapshots_pending += 1
                await self._processor.send(
                    Notification(
                        kind=NotificationKind.SNAPSHOT,
                        obj={},
                        snapshot=self._cache.snapshot(),
                        resource_version=self._progress(),
                    ),
                    targets,
                )
