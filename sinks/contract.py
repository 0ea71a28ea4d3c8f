"""The sink contract: what the bridge hands a sink and what a sink promises back.

A sink receives :class:`ChangeEvent` values, one per object change (or snapshot marker), delivers
them to its destination, and calls the event's acknowledgement exactly once per event when the event
is durably delivered, dead-lettered, or deliberately filtered out. The bridge checkpoints a
resourceVersion only when every sink has acknowledged every event up to it, so a sink that acks
early can lose data on a crash, and one that never acks stalls the checkpoint (not the others).

Third-party sinks import this module (and :mod:`sinks.cloudevents` for the envelope) and register
under the entry-point group ``kube_event_bridge.sinks``. An event's objects are read-only mappings:
with the default compact cache a :class:`bridge.rawobject.RawObject` (the API server's JSON bytes,
decoded as far as it is read), so encode them with :func:`sinks.cloudevents.encode_structured` or
:func:`bridge.rawobject.dumps` (the standard library's ``json`` does not know them), and call
:func:`bridge.rawobject.plain` for a dict to walk. Its only import outside the standard library is
that small module.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from bridge.contracts import OverflowPolicy
from bridge.rawobject import RawObject

__all__ = [
    "SINK_ENTRY_POINT_GROUP",
    "AckCallback",
    "Admits",
    "BatchSink",
    "Batched",
    "ChangeEvent",
    "DeliveryOptions",
    "DeliveryOutcome",
    "EventType",
    "GapInfo",
    "ResourceRef",
    "Sink",
    "SinkConfigError",
    "SinkError",
    "SinkFactory",
    "SinkMessageTooLargeError",
    "SinkPermanentError",
    "SinkTransientError",
    "SnapshotInfo",
    "takes_batches",
]

SINK_ENTRY_POINT_GROUP = "kube_event_bridge.sinks"


class SinkError(Exception):
    """Base of the errors sinks raise."""


class SinkConfigError(SinkError):
    """The sink's configuration is invalid; raised at construction or start, never mid-stream."""


class SinkTransientError(SinkError):
    """Delivery failed but may succeed if retried (broker down, timeout, 429/5xx)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SinkPermanentError(SinkError):
    """Delivery can never succeed (message too large, 4xx): the event goes to the dead letter."""


class SinkMessageTooLargeError(SinkPermanentError):
    """The destination cannot take a message this large (after compression, where the sink
    compresses): the sink's ``oversize`` policy decides what the stream gets instead."""

    def __init__(self, message: str, *, limit: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        """The largest message the destination takes, in bytes, when known."""


class EventType(enum.StrEnum):
    ADDED = "added"
    UPDATED = "updated"
    DELETED = "deleted"
    SYNC = "sync"
    """One object of a resync snapshot."""
    SNAPSHOT_BEGIN = "snapshot.begin"
    SNAPSHOT_END = "snapshot.end"
    GAP_BEGIN = "gap.begin"
    """A relist starts after the sink had received changes of the resource: until ``gap.end`` the
    events are the list's differences, and changes in the window were not observed one by one."""
    GAP_END = "gap.end"
    HEARTBEAT = "heartbeat"
    """A sink's periodic sign of life for one resource (no object): the resource's current
    resourceVersion and what this sink acknowledged (docs/event-format.md)."""


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """The watched resource: group ("" for core), version, plural resource name, kind."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods``, ``deployments.apps``: the name users write."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """Frames a resync snapshot: markers carry it, and so does every ``sync`` event inside."""

    id: str
    resource_version: str
    count: int | None = None
    """Number of ``sync`` events in the snapshot; set on the end marker."""
    shard: int | None = None
    """With sharding (docs/sharding.md): the shard whose objects the snapshot covers …"""
    total_shards: int | None = None
    """… of how many: a consumer reconciles per (resource, shard)."""


@dataclass(frozen=True, slots=True)
class GapInfo:
    """Frames a relist's differences: the markers carry it, and so does every event between them."""

    id: str
    from_resource_version: str
    """The last resourceVersion the bridge had processed before the relist."""
    to_resource_version: str = ""
    """The list's resourceVersion; set on the end marker (unknown when the relist begins)."""


class DeliveryOutcome(enum.Enum):
    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    FILTERED = "filtered"
    DROPPED = "dropped"


AckCallback = Callable[[DeliveryOutcome], None]


@dataclass(slots=True)
class ChangeEvent:
    """One change of one object, as the bridge hands it to sinks.

    ``obj`` is the new state (added/updated/sync), the last known state (deleted), or None for
    snapshot markers. ``old`` is the previous state for updates. Objects are plain decoded JSON and
    must be treated as read-only: several sinks share them.
    """

    type: EventType
    resource: ResourceRef
    cluster: str
    obj: Mapping[str, Any] | None
    old: Mapping[str, Any] | None = None
    time: float = 0.0
    """Wall-clock seconds of the change: the newest managedFields entry's time for added / updated /
    sync events, else when the informer first distributed it (the same for every sink)."""
    final_state_unknown: bool = False
    """For deletes seen only through a relist: ``obj`` is the last state the bridge knew."""
    snapshot: SnapshotInfo | None = None
    gap: GapInfo | None = None
    """Set on gap markers and on every event a relist produced between them."""
    extensions: dict[str, str] = field(default_factory=dict)

    @property
    def metadata(self) -> Mapping[str, Any]:
        if self.obj is None:
            return {}
        meta = self.obj.get("metadata")
        # Decoded JSON is a dict: test that first (an ABC isinstance check is ~10x slower).
        return meta if type(meta) is dict or isinstance(meta, Mapping) else {}

    @property
    def namespace(self) -> str:
        obj = self.obj
        if type(obj) is RawObject:
            return obj.namespace
        return str(self.metadata.get("namespace") or "")

    @property
    def name(self) -> str:
        obj = self.obj
        if type(obj) is RawObject:
            return obj.name
        return str(self.metadata.get("name") or "")

    @property
    def uid(self) -> str:
        obj = self.obj
        if type(obj) is RawObject:
            return obj.uid
        return str(self.metadata.get("uid") or "")

    @property
    def resource_version(self) -> str:
        obj = self.obj
        if obj is None and self.snapshot is not None:
            return self.snapshot.resource_version
        if obj is None and self.gap is not None:
            return self.gap.to_resource_version or self.gap.from_resource_version
        if type(obj) is RawObject:
            return obj.resource_version
        return str(self.metadata.get("resourceVersion") or "")

    @property
    def subject(self) -> str:
        """``namespace/name``, or ``name`` for cluster-scoped objects."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class DeliveryOptions:
    """What the bridge does for a sink before its ``deliver``: which resources it receives, how many
    changes wait in memory for it in each informer, what happens beyond that, when it gets periodic
    snapshots. The sink's configuration produces them (:func:`sinks.options.delivery_options` reads
    the ``routing``, ``buffer`` and ``resync_period`` keys every sink's options may have) and the
    sink carries them (:attr:`Sink.delivery`), so a sink of any kind gets the same routing, buffering
    and spill."""

    routing: frozenset[str] = frozenset()
    """Resources it receives, as the user wrote them (``pods``, ``deployments.apps``); empty = all."""
    buffer_capacity: int = 1024
    """Notifications kept in memory for it in each informer."""
    overflow_policy: OverflowPolicy = OverflowPolicy.SPILL
    """What its listener does when that buffer is full (see :class:`~bridge.contracts.OverflowPolicy`)."""
    spill_limit: int = 256 << 20
    """Bytes of spill on disk it may use in each informer; 0 = no spill."""
    resync_period: float = 0.0
    """Seconds between the snapshots it receives; 0 = none."""
    heartbeat_interval: float = 0.0
    """Seconds between its heartbeat events, per resource; 0 = none."""
    spill_form: Callable[[Mapping[str, Any], ResourceRef], Mapping[str, Any]] | None = field(
        default=None, compare=False)
    """What its spill keeps of an object of a resource: no more than it would send (its redaction),
    and no less than its own filters compare; None = the object as it is. Not compared: two sinks of
    one configuration get the same delivery, whatever their redaction's key."""


@runtime_checkable
class Sink(Protocol):
    """A destination for change events.

    Lifecycle: ``start`` → any number of ``deliver`` (or ``deliver_batch``, see :class:`BatchSink`)
    → ``flush`` → ``close``. All methods run on the bridge's event loop; blocking client calls must
    run off it.
    """

    name: str
    """Unique among the configured sinks; used in logs, metrics and checkpoints."""

    async def start(self) -> None:
        """Connects and validates the destination. Raises ``SinkConfigError`` for bad settings;
        a destination that is merely down should not fail start (the sink retries)."""

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        """Accepts one event. May return before the event is delivered; ``ack`` is then called
        later, exactly once, from the event loop. Blocks while the sink's bounded in-flight window
        is full (backpressure). Events with the same subject are delivered in call order."""

    async def flush(self, timeout: float) -> bool:
        """Waits until every accepted event is acked or ``timeout`` passes; True if all were."""

    async def close(self) -> None:
        """Releases connections. Events not yet acked stay unacked (they will be re-sent after a
        restart, since the checkpoint did not pass them). Idempotent."""

    def healthy(self) -> bool:
        """True while the destination is reachable (used for readiness)."""

    @property
    def delivery(self) -> DeliveryOptions:
        """The bridge-side delivery options its configuration gave it (routing, buffer, spill,
        resync); read once, when the pipeline is assembled."""

    @property
    def last_error(self) -> str:
        """Why the last attempt to deliver failed ("" before any failure, or once one succeeded):
        outage logs and readiness quote it."""

    @property
    def in_flight(self) -> int:
        """Events accepted and not acknowledged yet (a gauge)."""


@runtime_checkable
class Batched(Protocol):
    """What :class:`BatchSink` adds to a sink (a Protocol of its own so that it can be checked on a
    class, see :func:`takes_batches`)."""

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        """Hands over ``events[i]`` with ``acks[i]`` for every i, in order: exactly what awaiting
        ``deliver(events[i], acks[i])`` for each i in turn does (same filtering, same per-object
        order, same markers-as-barriers, each ack called exactly once with the event's outcome, same
        back-pressure: it may wait for room in the in-flight window between events, and raises
        SinkError when the sink is closed), only cheaper per event. ``len(events) == len(acks)``;
        an empty batch is a no-op."""


@runtime_checkable
class Admits(Protocol):
    """Optional: a sink (or a stage of a delivery chain) that can tell, without waiting, whether it
    takes a batch at once. The bridge then hands the batch over in the informer's own task instead
    of waking the sink's listener (the fast path); a sink without it always gets its batches from
    its listener's worker, as before."""

    def has_room(self, count: int) -> bool:
        """True when ``deliver_batch`` of ``count`` events now would return without waiting (room
        in the in-flight window for all of them, nothing else to wait for)."""


@runtime_checkable
class BatchSink(Sink, Batched, Protocol):
    """A sink that also takes a batch of events in one call. Optional: the bridge calls
    ``deliver_batch`` when :func:`takes_batches` says the sink has it and otherwise loops over
    ``deliver``, so a third-party sink may leave it out; every sink built on
    :class:`sinks.base.BaseSink` has it."""


def takes_batches(sink: Sink) -> TypeGuard[BatchSink]:
    """Whether ``sink``'s class declares :meth:`Batched.deliver_batch`. Checked on the class, not the
    instance: a wrapper that forwards unknown attributes to another sink (``__getattr__``) and has
    only a ``deliver`` of its own is not a batch sink, so its ``deliver`` is never bypassed."""
    return issubclass(type(sink), Batched)


SinkFactory = Callable[[str, Mapping[str, Any]], Sink]
"""How a registered sink kind is built: ``factory(name, options)``. Options are the sink's
configuration mapping (validated by the sink itself, raising ``SinkConfigError``)."""
