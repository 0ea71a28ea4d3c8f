"""One informer's run in the pipeline: its parts, and the observer that tells each of them what the
informer dispatched.

The informer reports every dispatched notification, every acknowledgement and every progress
marker to one :class:`~bridge.contracts.DeliveryObserver`. :class:`InformerObserver` is that
observer and hands each report to the part whose job it is, each one job:

* the :class:`~bridge.delivery.progress.AckTracker` (the checkpoint state; acknowledgements go to it
  straight, without a call in between);
* :class:`InformerCounts` (what the informer processed, by kind, read by the telemetry at scrape
  time);
* the known-object journal (a record before the sinks may receive a new object or a delete; the
  first list of a start without a checkpoint);
* the :class:`~bridge.delivery.bootstrap.ProgressThresholds` (callbacks once the informer's
  progress reaches a resourceVersion: a sink's own resume point, the point a bootstrap snapshot
  waits for).
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from bridge.contracts import Notification, NotificationKind
from bridge.delivery.assembly import WatchedResource
from bridge.delivery.bootstrap import Bootstrap, ProgressThresholds
from bridge.delivery.journal import KnownObjectJournal
from bridge.delivery.progress import AckTracker
from bridge.delivery.replay import delete_is_inferred
from bridge.delivery.resume_plan import ResumePlan
from bridge.delivery.sink_listener import SinkListener
from bridge.informer.reflector import Reflector, default_watch_error_handler
from bridge.informer.shared_informer import HandlerRegistration, SharedIndexInformer

__all__ = ["InformerCounts", "InformerObserver", "InformerRun"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InformerCounts:
    """What one informer processed. A plain ``Counter`` update per change (a fraction of a
    microsecond); the telemetry reads it at scrape time instead of calling an SDK counter per change."""

    resource: str
    on_event: Callable[[str, str], None] | None = None
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    """Notification kind → count."""
    synced: int = 0
    """Objects of the snapshots dispatched (each becomes one ``sync`` event per sink)."""
    progress: int = 0
    """Progress markers seen: the informer listed, or its watch moved, this many times."""


class InformerObserver:
    """The informer's delivery observer (module docs)."""

    def __init__(self, *, tracker: AckTracker, counts: InformerCounts,
                 journal: KnownObjectJournal | None = None,
                 inferred: Callable[[Notification], bool] | None = None) -> None:
        """``inferred(n)``: whether a delete goes out marked ``finalstateunknown`` (after a restart,
        the restart stage's :meth:`~bridge.delivery.restart.RestartStage.delete_is_inferred`), what
        the journal records of it."""
        self.tracker = tracker
        self.counts = counts
        self.journal = journal
        self.inferred: Callable[[Notification], bool] = (
            inferred if inferred is not None
            else functools.partial(delete_is_inferred, tracker=tracker, sent={}))
        self.thresholds = ProgressThresholds()
        self.acked = tracker.acked
        self.listener_removed = tracker.listener_removed

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        counts = self.counts
        if notification.seq >= 0:
            kind = notification.kind._value_  # the value as a plain attribute, not the property
            counts.received[kind] += 1
            if notification.snapshot is not None:
                counts.synced += len(notification.snapshot)
            if counts.on_event is not None:
                try:
                    counts.on_event(counts.resource, kind)
                except Exception:
                    log.exception("on_event callback failed")
        tracker = self.tracker
        tracker.dispatched(notification, listeners)
        if self.journal is not None and listeners:
            inferred = notification.kind is NotificationKind.DELETE and self.inferred(notification)
            self.journal.note(notification, inferred=inferred)

    def progress(self, seq: int, resource_version: str) -> None:
        self.counts.progress += 1
        if self.counts.progress == 1 and self.journal is not None and not self.tracker.resource_version:
            self.journal.listed(seq, resource_version)  # the first list of a start without checkpoint
        self.tracker.progress(seq, resource_version)
        self.thresholds.reached(seq, resource_version)


@dataclass(slots=True)
class InformerRun:
    """One informer of the pipeline, and everything the pipeline keeps about it."""

    watched: WatchedResource
    informer: SharedIndexInformer
    observer: InformerObserver
    plan: ResumePlan
    """What its start did (:mod:`bridge.delivery.resume_plan`)."""
    registrations: dict[str, HandlerRegistration] = field(default_factory=dict)
    listeners: dict[str, SinkListener] = field(default_factory=dict)
    saved_generation: int = -1
    """The tracker's generation at the last save (-1: save at the next interval whatever it is)."""
    saved_acks: int = -1
    saved_rv: str = ""
    last_saved: float | None = None
    failing: str = ""
    """Why the last list/watch cycle failed, while no progress was made since ("" = none)."""
    failing_progress: int = -1
    """The progress count when that failure was reported."""
    stale: list[str] = field(default_factory=list)
    """Checkpoint ids of other shard totals, removed once every current shard has passed them."""
    bootstrap: Bootstrap | None = None
    """Its sinks without progress of their own, until they have their snapshot."""

    @property
    def tracker(self) -> AckTracker:
        return self.observer.tracker

    @property
    def journal(self) -> KnownObjectJournal | None:
        return self.observer.journal

    @property
    def counts(self) -> InformerCounts:
        return self.observer.counts

    @property
    def bootstrapping(self) -> AbstractSet[str]:
        """Sinks the checkpoint does not cover yet (until they acknowledged their snapshot)."""
        return self.bootstrap.waiting if self.bootstrap is not None else frozenset()

    def watch_failed(self, reflector: Reflector, err: BaseException) -> None:
        """The informer's watch-error handler: logs as the default one does, and keeps the reason for
        readiness until the informer makes progress again (a list, a watch event, a bookmark)."""
        default_watch_error_handler(reflector, err)
        self.failing = f"{type(err).__name__}: {err}"
        self.failing_progress = self.counts.progress

    def save_soon(self) -> None:
        """Has the checkpoint written at the next interval (a sink bootstrapped)."""
        self.saved_generation = -1

    def failing_now(self) -> str:
        """Why the informer cannot list or watch: its last list/watch cycle failed and it has made
        no progress since ("" when it is fine)."""
        if self.failing and self.counts.progress == self.failing_progress:
            return self.failing
        return ""
