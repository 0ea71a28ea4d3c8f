"""What a sink sends for a malformed object: one the bridge's decoders quarantined (nested deeper
than they take, larger, not UTF-8 or not JSON; :mod:`bridge.kube.bounded`).

Such an object reaches the sink as its identity alone (apiVersion, kind, name, namespace, uid,
resourceVersion), marked by ``RawObject.malformed``. Its event goes to the stream as any other, its
``data`` that identity and its ``malformed`` extension attribute saying why (``depth``, ``size``,
``encoding``, ``syntax``), so a consumer never takes it for the whole object (docs/event-format.md,
*Malformed objects*). Before it is sent, the sink's dead letter gets the object's bytes as they came
(base64 when they are not UTF-8: :mod:`sinks.deadletter`), with the reason; except for a resource the
sink redacts (Secrets, ``redact`` or ``drop`` rules): bytes that could not be decoded
cannot be redacted either, so its dead letter gets the identity alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.rawobject import RawObject
from sinks.contract import ChangeEvent
from sinks.deadletter import DeadLetterRecord

__all__ = ["malformed_reason", "quarantine_record", "quarantine_record_body"]

_WHY = {"depth": "nested deeper than the bridge decodes", "size": "larger than the bridge decodes",
        "encoding": "not UTF-8", "syntax": "not JSON"}


def malformed_reason(obj: Mapping[str, Any] | None) -> str:
    """Why ``obj`` was quarantined (``depth``, ``size``, ``encoding``, ``syntax``); ``""`` for any other
    object."""
    return obj.malformed if type(obj) is RawObject else ""


def quarantine_record_body(event: ChangeEvent, *, keep_bytes: bool) -> bytes:
    """What the dead letter gets of the malformed object of ``event``: its bytes as the API server sent
    them (its identity instead unless ``keep_bytes``); nothing (``b""``) when the object no longer
    holds them: a resync or a delete carries the cached identity, whose bytes went to the dead
    letter with the change that brought them."""
    obj = event.obj
    if type(obj) is not RawObject or not obj.quarantined:
        return b""
    return obj.quarantined if keep_bytes else obj.raw


def quarantine_record(sink: str, event: ChangeEvent, body: bytes, *, event_id: str, key: bytes,
                      destination: str, headers: dict[str, str], now: float) -> DeadLetterRecord:
    """The dead-letter record of the malformed object of ``event``: the reason, and ``body`` (what
    :func:`quarantine_record_body` gave) as its message."""
    obj = event.obj
    reason = malformed_reason(obj)
    kept = "its bytes" if type(obj) is RawObject and body is obj.quarantined \
        else "its identity only (redacted resource)"
    return DeadLetterRecord(
        sink=sink,
        reason=f"malformed object ({reason}): {_WHY.get(reason, reason)}; the stream got its identity, "
               f"marked malformed={reason}; this record holds {kept}",
        attempts=0, time=now, event_id=event_id, key=key, destination=destination, headers=headers,
        body=body,
    )
