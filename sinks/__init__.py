"""Sinks: the destinations the bridge forwards change events to (Kafka, NATS, webhooks, files)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

_LAZY: dict[str, str] = {
    "BaseSink": "sinks.base",
    "OutgoingMessage": "sinks.base",
    "SinkOptions": "sinks.options",
    "DurableTransport": "sinks.transport",
    "Report": "sinks.transport",
    "RunTransport": "sinks.transport",
    "Transport": "sinks.transport",
    "TransportSink": "sinks.transport",
    "create_sink": "sinks.registry",
    "known_kinds": "sinks.registry",
    "register": "sinks.registry",
    "to_cloudevent": "sinks.cloudevents",
    "event_id": "sinks.cloudevents",
    "encode_structured": "sinks.cloudevents",
    "encode_binary": "sinks.cloudevents",
}

if TYPE_CHECKING:
    from sinks.base import BaseSink, OutgoingMessage
    from sinks.cloudevents import encode_binary, encode_structured, event_id, to_cloudevent
    from sinks.options import SinkOptions
    from sinks.registry import create_sink, known_kinds, register
    from sinks.transport import DurableTransport, Report, RunTransport, Transport, TransportSink


def __getattr__(name: str) -> Any:
    # The contract loads eagerly (it is tiny); the rest on first use, so a third-party sink that
    # imports only the contract does not pay for pydantic and the envelope code.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sinks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "SINK_ENTRY_POINT_GROUP",
    "AckCallback",
    "BaseSink",
    "ChangeEvent",
    "DeliveryOutcome",
    "DurableTransport",
    "EventType",
    "OutgoingMessage",
    "Report",
    "ResourceRef",
    "RunTransport",
    "Sink",
    "SinkConfigError",
    "SinkError",
    "SinkOptions",
    "SinkPermanentError",
    "SinkTransientError",
    "SnapshotInfo",
    "Transport",
    "TransportSink",
    "create_sink",
    "encode_binary",
    "encode_structured",
    "event_id",
    "known_kinds",
    "register",
    "to_cloudevent",
]
