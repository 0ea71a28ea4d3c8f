"""Bootstrapping the sinks a checkpoint does not cover: nothing until a snapshot of whole objects.

A sink with no progress of its own in the checkpoint (new, or its progress lost) receives nothing
until a snapshot of the informer's cache, then the live stream (the listener's gate, see
:class:`~bridge.delivery.sink_listener.SinkListener`). A resumed cache holds the checkpoint's
metadata-only stubs, so the snapshot waits until it holds whole objects. :class:`Bootstrap` is that
wait, as a state machine (:class:`BootstrapState`):

* ``LISTING``: no whole objects yet (the start-up list failed): listed again, with the reflector's
  backoff, until a list answers (a healthy resumed watch never relists by itself);
* ``WAITING``: listed; a stub without its listed twin changed or went after the checkpoint, so the
  snapshot waits until the informer has processed up to the list's resourceVersion;
* ``READY``: the cache holds whole objects: each bootstrapping sink's snapshot is requested.

Once a sink acknowledged its whole snapshot the checkpoint covers it (a crash before that
bootstraps it again).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping

from bridge.clock import Clock
from bridge.contracts import KubeObject
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.resume_plan import parse_rv
from bridge.delivery.sink_listener import SinkListener
from bridge.informer.backoff import Backoff
from bridge.informer.shared_informer import HandlerRegistration, SharedIndexInformer
from bridge.rawobject import object_identity

__all__ = ["Bootstrap", "BootstrapState", "ProgressThresholds"]

log = logging.getLogger(__name__)


class ProgressThresholds:
    """Callbacks run once, with the marker's seq, when the informer's progress reaches a
    resourceVersion."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, Callable[[int], None]]] = []

    def add(self, resource_version: int, callback: Callable[[int], None]) -> None:
        self._waiting.append((resource_version, callback))

    def reached(self, seq: int, resource_version: str) -> None:
        """Runs the callbacks whose resourceVersion the progress marker reached. Called per marker
        (about one per watch event) and nearly always with nothing waiting: that returns at once."""
        if not self._waiting:
            return
        at = parse_rv(resource_version)
        if at is None:
            return
        for threshold in [t for t in self._waiting if t[0] <= at]:
            self._waiting.remove(threshold)
            threshold[1](seq)


class BootstrapState(enum.Enum):
    LISTING = "listing"
    """No whole objects yet: listing again until a list answers."""
    WAITING = "waiting"
    """Listed: waiting for the informer to reach the list's resourceVersion."""
    READY = "ready"
    """The cache holds whole objects: snapshots go out."""


class Bootstrap:
    """The bootstrap of one informer's sinks (module docs)."""

    def __init__(self, *, informer: SharedIndexInformer, thresholds: ProgressThresholds,
                 watched: WatchedResource, sinks: Iterable[str], clock: Clock,
                 covered: Callable[[], None]) -> None:
        """``covered`` runs when a sink acknowledged its snapshot (the checkpoint covers it now)."""
        self._informer = informer
        self._thresholds = thresholds
        self._watched = watched
        self.waiting = set(sinks)
        """The sinks that have not acknowledged their snapshot yet."""
        self._clock = clock
        self._covered = covered
        self.state = BootstrapState.LISTING
        self._ready = asyncio.Event()
        self._extra = {"informer": watched.informer_id, "resource": watched.ref.qualified}

    def _wait_for(self, resource_version: str) -> None:
        at = parse_rv(resource_version)
        self.state = BootstrapState.WAITING
        self._thresholds.add(at if at is not None else 0, lambda _seq: self._reach())

    def _reach(self) -> None:
        self.state = BootstrapState.READY
        self._ready.set()

    async def hydrate(self, seeds: list[KubeObject], unconfirmed: list[KubeObject]
                      ) -> tuple[list[KubeObject], list[KubeObject]]:
        """Replaces the plan's stubs by whole objects from one list of the scope now (a listed
        object with the stub's uid and resourceVersion is that very state). Before the informer
        starts."""
        sinks = ", ".join(sorted(self.waiting))
        try:
            listed, list_rv = await self._informer.list_current()
        except Exception as exc:
            log.warning("listing %s for the bootstrap snapshot of %s failed (%s); the snapshot waits "
                        "until a list answers", self._watched.ref.qualified, sinks, exc, extra=self._extra)
            return seeds, unconfirmed
        current = {object_identity(obj): obj for obj in listed}
        left = [stub for stub in (*seeds, *unconfirmed) if object_identity(stub) not in current]
        seeds = [current.get(object_identity(s), s) for s in seeds]
        unconfirmed = [current.get(object_identity(s), s) for s in unconfirmed]
        if not left:
            self._reach()
        elif parse_rv(list_rv) is not None:
            self._wait_for(list_rv)
        log.info("bootstrapping sinks %s with a snapshot of %d objects (%d changed since the checkpoint "
                 "and wait for the watch to replay them)", sinks, len(listed), len(left), extra=self._extra)
        return seeds, unconfirmed

    async def run(self, listeners: Mapping[str, SinkListener],
                  registrations: Mapping[str, HandlerRegistration]) -> None:
        """Sends each bootstrapping sink its snapshot once the cache holds whole objects."""
        if self.state is BootstrapState.LISTING:
            await self._list_again()
        await self._ready.wait()
        for name in sorted(self.waiting):
            listeners[name].bootstrap_ready()
            self._informer.request_snapshot(registrations[name])

    async def _list_again(self) -> None:
        """The start-up list failed, so the running cache holds the checkpoint's stubs: lists again
        until a list answers; its whole objects replace the stubs of the same state
        (:meth:`SharedIndexInformer.fill_in`). Should the reflector relist on its own first (a 410),
        that relist brings whole objects: the snapshot waits for it instead."""
        informer = self._informer
        sinks = ", ".join(sorted(self.waiting))
        backoff = Backoff(clock=self._clock)
        delay, failed = backoff.next_delay(), 1
        while True:
            await self._clock.sleep(delay)
            reflector = informer.reflector
            if reflector is not None and reflector.list_count > 0:
                self._wait_for(reflector.last_sync_resource_version)
                return
            try:
                listed, list_rv = await informer.list_current()
            except Exception as exc:
                failed += 1
                delay = backoff.next_delay()
                log.warning("listing %s for the bootstrap snapshot of %s failed again (%s); retrying "
                            "in %.1fs", self._watched.ref.qualified, sinks, exc, delay, extra=self._extra)
                continue
            processed = parse_rv(await informer.fill_in(listed))
            at = parse_rv(list_rv)
            if processed is not None and at is not None and processed >= at:
                self._reach()
            else:
                self._wait_for(list_rv)
            log.info("bootstrapping sinks %s with a snapshot of %d objects (listed after %d failed "
                     "lists)", sinks, len(listed), failed, extra=self._extra)
            return

    def done(self, name: str) -> None:
        """``name`` acknowledged its whole snapshot: from now on the checkpoint covers it."""
        self.waiting.discard(name)
        self._covered()
        log.info("sink %s bootstrapped: it has the snapshot and follows the live stream", name,
                 extra={"sink": name, **self._extra})
