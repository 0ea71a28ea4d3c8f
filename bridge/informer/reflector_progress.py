"""Where a reflector stands: the state its list, watch and WatchList phases share.

:class:`ReflectorProgress` declares what every phase of a :class:`~bridge.informer.reflector.Reflector`
reads and writes (the source, the store, the clock and the backoff; the resourceVersions that say how
far the store reflects the server; the counters), so that each phase, a module of its own
(:mod:`~bridge.informer.reflector_list`, :mod:`~bridge.informer.reflector_watch`,
:mod:`~bridge.informer.reflector_watch_list`), is a plain base class of the reflector working on one
object: a call from one phase into another, the per-event ones included, stays a plain method call.
The reflector's constructor sets every attribute declared here, in one place.

Invariants:

* ``_last_sync_rv`` is the resourceVersion the store reflects: the last list's, or the last watch
  event's (bookmarks included); it only moves once the store has taken what it stands for.
* ``_rv_unavailable`` is true from an expired / too-large resourceVersion met by a list, a WatchList
  or the watch from a checkpoint until a list or WatchList succeeds; while it is, the next list (or
  WatchList) is a consistent read (RV ``""``).
* ``_streamed_rv`` is non-empty while pages of an unfinished list may have reached consumers: no
  later list may ask for an older state.

Every phase logs to the reflector's logger (``bridge.informer.reflector``), as before the phases had
modules of their own: operators filter on that name.
"""

from __future__ import annotations

import logging

from bridge.clock import Clock
from bridge.contracts import ListerWatcher, WatchStream
from bridge.informer.backoff import Backoff
from bridge.informer.reflector_store import ReflectorStore, ResourceVersionUpdater

__all__ = ["ReflectorProgress", "log"]

log = logging.getLogger("bridge.informer.reflector")


class ReflectorProgress:
    """The state the phases of one reflector share (module docs); never built on its own."""

    name: str
    _lw: ListerWatcher
    _store: ReflectorStore
    _updater: ResourceVersionUpdater | None
    """The store's optional capability, checked once."""
    _clock: Clock
    _backoff: Backoff

    _last_sync_rv: str
    """The resourceVersion the store reflects (module docs)."""
    _rv_unavailable: bool
    """The last RV is known to be unavailable: the next list is a consistent read."""
    _streamed_rv: str
    """The resourceVersion of pages an unfinished list already streamed into the store: the next
    list must not be older (its items reached consumers), see ``ListPhase._list``."""
    _resume_rv: str
    """Non-empty until the first cycle has started from the checkpoint."""
    _exact_rv: str
    """Non-empty until the first list, at exactly this resourceVersion
    (``resourceVersionMatch=Exact``), succeeded or met an expired resourceVersion; the watch
    then starts from it. ``on_exact_list_expired(rv)`` is called before the consistent list
    that replaces an expired one."""

    _current_stream: WatchStream | None
    """The watch being read (the resync timer closes it when the resync fails)."""
    _resync_error: BaseException | None
    """Set by a resync that failed during the current watch: the cycle ends (backoff, relist)."""
    _last_retry_after: float | None
    """retryAfterSeconds of the last 429 ERROR event."""

    list_count: int
    """Completed lists (or WatchList initial states) so far; for metrics and tests."""
    watch_count: int
    """Watches opened (the first one and every re-watch)."""
    expired_count: int
    """410 Gone / Expired (and too-large resourceVersion) answers, on lists and watches."""
