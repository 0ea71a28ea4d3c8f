"""One encoded event on its way to the destination: :class:`OutgoingMessage`, what the envelope
(:mod:`sinks.envelope`, :mod:`sinks.envelope_template`) builds and every stage above the transport
(ordering, window, breaker, settlement, oversize) carries.

Invariant: ``body`` and ``headers`` are what goes on the wire; the CloudEvent is read back from them
on demand (:attr:`OutgoingMessage.cloudevent`), never kept beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sinks.cloudevents import HTTP_PREFIX, STRUCTURED_CONTENT_TYPE, decode_binary, decode_structured
from sinks.contract import AckCallback, ChangeEvent

__all__ = ["Builder", "OutgoingMessage"]


@dataclass(slots=True, eq=False)
class OutgoingMessage:
    """One encoded event on its way to the destination."""

    key: bytes
    """Partition / ordering key: the uid (or ``namespace/name``; ``snapshot/<id>`` for markers)."""
    destination: str
    """The rendered destination template (topic, subject or URL path)."""
    headers: dict[str, str]
    """``content-type`` plus, in binary mode, the CloudEvent attributes with the sink's prefix."""
    body: bytes
    event_id: str
    event: ChangeEvent
    ack: AckCallback
    header_prefix: str = HTTP_PREFIX
    """The prefix of CloudEvent attribute headers in binary mode (``ce_`` for Kafka)."""
    lane: str = ""
    attempts: int = 0
    barrier: bool = False
    error: str | None = None
    """Set when the event could not be encoded: the message goes straight to the dead letter."""
    started: float = 0.0
    """Clock time of the first attempt (the give-up deadline counts from it)."""
    pending: bool = False
    """An attempt (or the dead-letter write) is under way and its outcome not yet settled."""
    cut: bool = False
    """The body is the ``oversize`` policy's cut event (the whole one went to the dead letter)."""
    quarantine: bytes = b""
    """For a malformed object (:mod:`sinks.malformed`): what its dead letter gets before the event
    is sent (the bytes as they came, or its identity alone); emptied once written."""

    @property
    def cloudevent(self) -> dict[str, Any]:
        """The envelope as sent, decoded from ``body`` (and ``headers`` in binary mode); empty for a
        message that could not be encoded. Decoded on demand rather than kept from encoding: a
        window of kept envelopes (each holding its object) is work for the garbage collector on
        every event."""
        if self.error is not None or not self.body:
            return {}
        if self.headers.get("content-type") == STRUCTURED_CONTENT_TYPE:
            return decode_structured(self.body)
        return decode_binary(self.headers, self.body, self.header_prefix)


Builder = Callable[[ChangeEvent, AckCallback], OutgoingMessage]
"""Builds one event's message (``Envelope.build`` or what ``Envelope.batch_builder`` returns)."""
