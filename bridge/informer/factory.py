"""One shared informer per watched scope: client-go's ``SharedInformerFactory``.

Every consumer that asks for the same resource in the same scope (namespace, label and field
selectors) gets the same :class:`~bridge.shared_informer.SharedIndexInformer`, so the bridge opens one
watch and holds one cache per scope however many sinks read it. ``start()`` starts the informers
created since the last call (idempotent); ``shutdown()`` stops them all and waits for their tasks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.clock import Clock
from bridge.contracts import ListerWatcher
from bridge.informer.shared_informer import SharedIndexInformer

__all__ = ["InformerKey", "SharedInformerFactory"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InformerKey:
    """What makes two informers the same: the resource and the scope its ListerWatcher is bound to."""

    resource: str
    """e.g. ``"pods"``, ``"deployments.apps"``, ``"widgets.example.com"``."""
    namespace: str = ""
    """"" = all namespaces (or a cluster-scoped resource)."""
    label_selector: str = ""
    field_selector: str = ""
    namespace_selector: str = ""
    """A label selector on the namespaces whose objects a cluster-wide informer keeps
    (:mod:`bridge.informer.namespaces`)."""

    def __str__(self) -> str:
        parts = [self.resource]
        if self.namespace:
            parts.append(f"ns={self.namespace}")
        if self.label_selector:
            parts.append(f"labels={self.label_selector}")
        if self.field_selector:
            parts.append(f"fields={self.field_selector}")
        if self.namespace_selector:
            parts.append(f"namespaces={self.namespace_selector}")
        return ",".join(parts)


class SharedInformerFactory:
    """Creates and runs one :class:`SharedIndexInformer` per :class:`InformerKey`.

    ``informer_options`` given to the factory apply to every informer; those given to
    :meth:`informer_for` apply to that informer when it is created (ignored when it already exists).
    """

    def __init__(
        self,
        *,
        lister_watcher_factory: Callable[[InformerKey], ListerWatcher],
        clock: Clock,
        default_resync: float = 0.0,
        **informer_options: Any,
    ) -> None:
        self._lister_watcher_factory = lister_watcher_factory
        self._clock = clock
        self._default_resync = default_resync
        self._options = informer_options
        self._informers: dict[InformerKey, SharedIndexInformer] = {}
        self._tasks: dict[InformerKey, asyncio.Task[None]] = {}
        self._shutting_down = False

    def informer_for(self, key: InformerKey, **informer_options: Any) -> SharedIndexInformer:
        """The informer for ``key``, created (not started) on first request."""
        informer = self._informers.get(key)
        if informer is not None:
            return informer
        if self._shutting_down:
            raise RuntimeError(f"informer factory is shut down; cannot create an informer for {key}")
        options: dict[str, Any] = {"resync_check_period": self._default_resync, "name": str(key)}
        options.update(self._options)
        options.update(informer_options)
        informer = SharedIndexInformer(
            lister_watcher=self._lister_watcher_factory(key), clock=self._clock, **options
        )
        self._informers[key] = informer
        return informer

    @property
    def informers(self) -> dict[InformerKey, SharedIndexInformer]:
        return dict(self._informers)

    def start(self) -> None:
        """Starts every informer not started yet, each in its own named task. Idempotent."""
        if self._shutting_down:
            raise RuntimeError("informer factory is shut down; cannot start")
        for key, informer in self._informers.items():
            if key in self._tasks:
                continue
            task = asyncio.create_task(informer.run(), name=f"informer-factory:{key}")
            task.add_done_callback(functools.partial(self._task_done, key))
            self._tasks[key] = task

    def _task_done(self, key: InformerKey, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("informer stopped with an error: %r", exc, extra={"informer": str(key)})

    async def wait_for_cache_sync(self, timeout: float) -> dict[InformerKey, bool]:
        """Waits (together, at most ``timeout`` seconds of loop time) for every started informer's
        cache to sync; reports each one."""
        keys = list(self._tasks)
        results = await asyncio.gather(
            *(self._informers[k].wait_for_cache_sync(timeout) for k in keys)
        )
        return dict(zip(keys, results, strict=True))

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Shuts every informer down (in parallel, each with ``timeout``) and waits for their tasks."""
        self._shutting_down = True
        await asyncio.gather(*(inf.shutdown(timeout) for inf in self._informers.values()))
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
