"""The small contracts the informer machinery is built from.

Every piece of ``bridge`` talks to its neighbours through one of these protocols, in the spirit of
client-go's ``tools/cache`` interfaces: the API source (:class:`ListerWatcher`), the cache
(:class:`Store`, :class:`Indexer`), the consumers (:class:`EventHandler`,
:class:`NotificationHandler`), and the hooks that let the bridge checkpoint only what every
consumer has acknowledged (:class:`DeliveryObserver`).

Objects travel as JSON, never as typed models: a :data:`KubeObject` is a read-only mapping, either the
``dict`` decoded from the API server's bytes or a :class:`bridge.rawobject.RawObject` (the bytes
themselves, decoded on demand). This module imports nothing from the rest of the package, so every
layer may depend on it.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NewType, Protocol, runtime_checkable

__all__ = [
    "OVERFLOW_GAP_PREFIX",
    "AckFunc",
    "BatchInterrupted",
    "BatchNotificationHandler",
    "BatchedWatchStream",
    "DeletedFinalStateUnknown",
    "DeliveryObserver",
    "EventHandler",
    "Gap",
    "IndexFunc",
    "Indexer",
    "KeyFunc",
    "KubeObject",
    "ListOptions",
    "ListPage",
    "ListenerOptions",
    "ListerWatcher",
    "Notification",
    "NotificationHandler",
    "NotificationKind",
    "NotificationSpill",
    "ObjectKey",
    "OverflowPolicy",
    "ReadyNotificationHandler",
    "Store",
    "TransformFunc",
    "UnconfirmedGone",
    "WatchEvent",
    "WatchEventType",
    "WatchOptions",
    "WatchStream",
]

KubeObject = Mapping[str, Any]
"""A Kubernetes object as JSON: ``apiVersion``, ``kind``, ``metadata``, ``spec``, … Read-only: objects
are shared by the cache and every handler, and nobody changes one in place."""

ObjectKey = NewType("ObjectKey", str)
"""``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A delete whose final state was not observed (client-go's ``DeletedFinalStateUnknown``).

    Produced by ``RealFIFO.replace`` for keys that a relist no longer returns: the object was deleted
    while the watch was down, ``obj`` is the last state the bridge knew, possibly stale.
    """

    key: ObjectKey
    obj: KubeObject


@dataclass(frozen=True, slots=True)
class UnconfirmedGone(DeletedFinalStateUnknown):
    """An object only the bridge's known-object journal knew (an *unconfirmed* seed of a resumed
    informer) that a relist did not return under its uid: that object is gone, but the key may live
    on under another uid (the relist's own notification of the key follows). Unlike a plain
    tombstone it says nothing about whatever else the key holds."""


KeyFunc = Callable[[Any], ObjectKey]
"""Computes an object's store key; must accept :class:`DeletedFinalStateUnknown` too."""

IndexFunc = Callable[[KubeObject], list[str]]
"""Computes the index values of an object for one named index (e.g. its namespace)."""

TransformFunc = Callable[[KubeObject], KubeObject]
"""Applied to every object as it is queued (never to tombstones). Must be idempotent."""


# --------------------------------------------------------------------------------------------------
# API source


class WatchEventType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream. For ``ERROR`` the object is a ``Status``."""

    type: WatchEventType
    object: KubeObject


@dataclass(frozen=True, slots=True)
class ListOptions:
    """One list request. Selectors and namespace scope belong to the ListerWatcher, not here."""

    resource_version: str = ""
    """"" = consistent read from etcd; "0" = any (watch cache); "N" = not older than N."""
    resource_version_match: str | None = None
    """None, "NotOlderThan" or "Exact"."""
    limit: int | None = None
    continue_token: str | None = None


@dataclass(frozen=True, slots=True)
class ListPage:
    items: list[KubeObject]
    resource_version: str
    """The list's resourceVersion (``metadata.resourceVersion`` of the List object)."""
    continue_token: str | None = None
    """Set when more pages follow."""
    remaining_item_count: int | None = None


@dataclass(frozen=True, slots=True)
class WatchOptions:
    resource_version: str = ""
    timeout_seconds: int | None = None
    allow_watch_bookmarks: bool = True
    send_initial_events: bool = False
    """WatchList: the server first sends the current state as ADDED, then the initial-events-end
    bookmark. Requires ``resource_version_match="NotOlderThan"``."""
    resource_version_match: str | None = None


class WatchStream(Protocol):
    """An open watch. Iterating yields events until the server closes the stream."""

    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    async def close(self) -> None:
        """Stops the watch and releases its connection. Idempotent."""


@runtime_checkable
class BatchedWatchStream(WatchStream, Protocol):
    """An open watch that can also hand out its events a read at a time (the HTTP watch does).

    ``batches()`` replaces ``__aiter__`` (a stream is read once, one way or the other): each item
    is every event ready now, in stream order, never empty, never held back to wait for more. The
    reflector applies a batch in one loop; streams without it are read one event at a time."""

    def batches(self) -> AsyncIterator[list[WatchEvent]]: ...


class ListerWatcher(Protocol):
    """The API source for one resource in one scope (namespace, label/field selectors bound in).

    Errors are raised as :mod:`bridge.errors` exceptions so the reflector can apply its policy
    (410 → relist, 429 → back off and retry, …) without knowing the transport.
    """

    async def list(self, options: ListOptions) -> ListPage:
        """Lists one page. Raises ``ResourceExpiredError`` when a continue token or an exact RV
        is no longer available, ``TooLargeResourceVersionError`` when the RV is in the future."""

    async def watch(self, options: WatchOptions) -> WatchStream:
        """Opens a watch from ``options.resource_version``. Opening errors (429, connection refused)
        raise here; an expired RV arrives as an ``ERROR`` event carrying a 410 Status."""


# --------------------------------------------------------------------------------------------------
# Cache


class Store(Protocol):
    """A keyed collection of objects (client-go's ``Store``). Single-threaded: asyncio only."""

    def add(self, obj: KubeObject) -> None:
        """Inserts or replaces the object under its key."""

    def update(self, obj: KubeObject) -> None:
        """Same as :meth:`add`."""

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        """Removes the object's key; a missing key is a no-op."""

    def list(self) -> list[KubeObject]:
        """Every object, in no particular order."""

    def list_keys(self) -> builtins.list[ObjectKey]:
        """Every key, in no particular order."""

    def get(self, obj: KubeObject) -> KubeObject | None:
        """The stored object with the same key as ``obj``, or None."""

    def get_by_key(self, key: ObjectKey) -> KubeObject | None:
        """The stored object under ``key``, or None."""

    def replace(self, items: Sequence[KubeObject], resource_version: str) -> None:
        """Swaps the whole content for ``items`` (rebuilding indices)."""

    def resync(self) -> None:
        """Meaningful for queues only; a cache does nothing."""


class Indexer(Store, Protocol):
    """A :class:`Store` with named secondary indices."""

    def index(self, index_name: str, obj: KubeObject) -> builtins.list[KubeObject]:
        """Objects sharing any of ``obj``'s values for the index. Unknown index → KeyError."""

    def index_keys(self, index_name: str, indexed_value: str) -> builtins.list[ObjectKey]:
        """Sorted keys of objects whose index value is ``indexed_value``. Unknown index → KeyError."""

    def by_index(self, index_name: str, indexed_value: str) -> builtins.list[KubeObject]:
        """Objects whose index value is ``indexed_value``. Unknown index → KeyError."""

    def list_index_func_values(self, index_name: str) -> builtins.list[str]:
        """Every value currently present in the index."""

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Adds indices, backfilling them from the current content. A name in use → ValueError."""


# --------------------------------------------------------------------------------------------------
# Consumers


class EventHandler(Protocol):
    """client-go's ``ResourceEventHandler``, async. Acknowledged when the call returns.

    The cache is already updated when a method is called. An exception is logged and counted, and
    the listener carries on with the next notification.
    """

    async def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None: ...

    async def on_update(self, old: KubeObject, new: KubeObject) -> None:
        """``old`` and ``new`` carry the same resourceVersion for a resync notification."""

    async def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None: ...


class NotificationKind(enum.Enum):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"
    SNAPSHOT = "snapshot"
    """The whole cache as of this point in the change order (see ``Notification.snapshot``),
    requested for one listener; plain ``EventHandler``s receive it as one resync update per object."""
    GAP = "gap"
    """A relist after listeners had received changes begins or ends here (see ``Notification.gap``):
    the changes between the two are the list's differences, and what happened between the window's
    resourceVersions was not observed. Plain ``EventHandler``s do not receive it."""


@dataclass(frozen=True, slots=True)
class Gap:
    """The window of a relist: changes after ``from_resource_version`` (the last one the informer
    processed) up to ``to_resource_version`` (the list's, known at the end) were not observed one by
    one; the relist reports only the resulting differences."""

    id: str
    from_resource_version: str
    to_resource_version: str = ""
    end: bool = False
    """False on the notification that opens the gap, True on the one that closes it."""


OVERFLOW_GAP_PREFIX = "overflow:"
"""How the id of a degraded listener's own window begins (``overflow:<listener>:…``, the same
:class:`Gap` as a relist's): it covers what that listener coalesced, nothing a relist did."""


@dataclass(slots=True)
class Notification:
    """One change as the processor distributes it to listeners.

    ``seq`` increases strictly in the order the informer processed the changes; it is what
    listeners acknowledge. Notifications replayed to a handler added after start carry ``seq = -1``
    and are not tracked.
    """

    kind: NotificationKind
    obj: KubeObject | DeletedFinalStateUnknown
    """The new object (add/update) or the deleted one, possibly a tombstone (delete)."""
    old: KubeObject | None = None
    """The previous cached object, for updates."""
    is_in_initial_list: bool = False
    is_resync: bool = False
    """An update whose old and new resourceVersion are equal: a periodic resync."""
    seq: int = -1
    key: ObjectKey = field(default=ObjectKey(""))
    snapshot: Sequence[KubeObject] | None = None
    """For ``SNAPSHOT``: every cached object at the moment the snapshot was taken (shared
    references; objects are never mutated in place)."""
    resource_version: str = ""
    """For ``SNAPSHOT``: the resourceVersion the snapshot reflects (the informer's last progress
    marker)."""
    gap: Gap | None = None
    """For ``GAP``: which relist window begins or ends."""
    time: float = 0.0
    """Wall-clock seconds when the processor first distributed it (0: not yet): one value for
    every listener, so every sink stamps a change it cannot date otherwise the same way."""


AckFunc = Callable[[], None]
"""Called once when a notification has been durably delivered (or deliberately discarded)."""


@runtime_checkable
class NotificationHandler(Protocol):
    """A consumer that acknowledges asynchronously (a sink): it is handed each notification with
    the function to call once the notification is delivered. ``handle`` may return before that
    (the sink keeps its own bounded in-flight window) and should block when that window is full."""

    async def handle(self, notification: Notification, ack: AckFunc) -> None: ...


@runtime_checkable
class BatchNotificationHandler(NotificationHandler, Protocol):
    """A :class:`NotificationHandler` that also takes several notifications in one call (a sink's
    listener does). Its listener hands it everything ready in its buffer at once (bounded, never
    held back to wait for more); handlers without ``handle_batch`` get one ``handle`` call each."""

    async def handle_batch(self, notifications: Sequence[Notification], acks: Sequence[AckFunc]) -> None:
        """Handles ``notifications[i]`` with ``acks[i]`` for every i, in order: what awaiting
        ``handle(notifications[i], acks[i])`` for each i in turn does, only cheaper per notification.

        When handling ``notifications[i]`` fails, it raises :class:`BatchInterrupted` with
        ``index=i`` (the cause chained): the ones before were handled (their acks are the
        handler's), the ones after were not begun, and the listener carries on with them as it
        would after a failing ``handle``. Any other exception leaves the listener nothing to go
        on: it acknowledges every notification of the batch whose ack has not been called."""


@runtime_checkable
class ReadyNotificationHandler(BatchNotificationHandler, Protocol):
    """A batch handler that can tell, without waiting, whether a batch would be handled to its end
    without waiting (nothing held back, room downstream). Its listener, idle, then has the informer
    hand it what one run of the informer produced in the informer's own task, without waking its
    worker (the fast path, :meth:`~bridge.informer.listener.ProcessorListener.deliver_deferred`)."""

    def ready_for(self, notifications: Sequence[Notification]) -> bool:
        """True when ``handle_batch(notifications, ...)`` now would return without waiting."""


class BatchInterrupted(Exception):
    """``handle_batch`` failed on ``notifications[index]`` (``__cause__`` says why)."""

    def __init__(self, index: int) -> None:
        super().__init__(f"handling notification {index} of the batch failed")
        self.index = index


class OverflowPolicy(enum.Enum):
    """What a listener does when its in-memory buffer is full.

    Under every policy but ``BLOCK`` the informer never waits for the listener: one slow sink holds
    back only itself. When a listener cannot keep a change as it is (no spill, or the spill is full,
    or a change that cannot be merged under ``COALESCE``), it **degrades**: it keeps the latest state
    per object in memory (bounded by the number of objects) and later delivers those states framed
    by a gap marker (begin … end) of its own, exactly as after a relist.
    """

    SPILL = "spill"
    """Append to the listener's durable spill on disk (every change kept, in order); degrade when
    the spill is full or there is none. The default."""
    BLOCK = "block"
    """Wait for room: backpressure up to the informer, which then stalls for *every* listener.
    Only for embedding the informer where that is wanted; never the bridge's default."""
    COALESCE = "coalesce"
    """Keep only the newest pending notification per key (add+update → add, update+update →
    update(first old, last new), add/update+delete → delete); nothing final is lost. A change that
    cannot merge goes to the spill, then degrades."""
    DROP = "drop"
    """Discard the new notification, count it, and acknowledge it as discarded."""


class NotificationSpill(Protocol):
    """A listener's overflow on disk: an ordered, bounded queue of notifications (see
    :class:`bridge.delivery.spill.SegmentSpill`)."""

    def append(self, notification: Notification) -> bool:
        """Queues one notification at the end; False (nothing written) when the spill is full."""

    def read(self, limit: int) -> list[Notification]:
        """Takes up to ``limit`` notifications from the front, in order."""

    def __len__(self) -> int:
        """Notifications queued."""

    @property
    def size_bytes(self) -> int:
        """Bytes the spill occupies on disk now."""

    @property
    def corrupt(self) -> int:
        """Notifications lost so far to damage on disk: queued, and never given back by ``read``."""

    def clear(self) -> None:
        """Discards everything queued (and its files)."""


@dataclass(frozen=True, slots=True)
class ListenerOptions:
    """Per-listener settings (one listener per handler / sink)."""

    resync_period: float = 0.0
    """Seconds; 0 = never. Clamped as client-go does (minimum 1 s, not below the informer's check
    period once started)."""
    buffer_capacity: int = 1024
    """Notifications kept in memory (the listener's in-memory budget)."""
    overflow_policy: OverflowPolicy = OverflowPolicy.SPILL
    name: str = ""
    """Used in logs and metrics; defaults to the handler's class name."""
    spill: NotificationSpill | None = field(default=None, compare=False)
    """Where the backlog beyond ``buffer_capacity`` goes (``SPILL``/``COALESCE``); None: degrade
    in memory at once."""


class DeliveryObserver(Protocol):
    """Sees every tracked notification go out and come back, so the bridge can compute the
    resourceVersion up to which every listener has acknowledged (the checkpoint low-watermark)."""

    def dispatched(self, notification: Notification, listeners: Sequence[str]) -> None:
        """``notification`` (with its ``seq``) was handed to these listeners, in ``seq`` order."""

    def acked(self, listener: str, seq: int) -> None:
        """``listener`` has delivered (or deliberately discarded) notification ``seq``."""

    def progress(self, seq: int, resource_version: str) -> None:
        """Every change the informer processed before ``seq`` is reflected up to
        ``resource_version``: once all notifications with a smaller seq are acknowledged, a watch
        may safely resume from this resourceVersion."""

    def listener_removed(self, listener: str) -> None:
        """The listener is gone; its pending acknowledgements no longer count."""

