"""Sinks: the destinations the bridge forwards change events to (Kafka, NATS, webhooks, files)."""

from __future__ import annotations

from sinks.contract import (
    SINK_ENTRY_POINT_GROUP,
    AckCallback,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    ResourceRef,
    Sink,
    SinkConfigError,
    SinkError,
    SinkPermanentError,
    SinkTransientError,
    SnapshotInfo,
)

__all__ = [
    "SINK_ENTRY_POINT_GROUP",
    "AckCallback",
    "ChangeEvent",
    "DeliveryOutcome",
    "EventType",
    "ResourceRef",
    "Sink",
    "SinkConfigError",
    "SinkError",
    "SinkPermanentError",
    "SinkTransientError",
    "SnapshotInfo",
]
