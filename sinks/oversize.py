"""The cut event the ``oversize`` policy sends in place of an event its destination refused for its
size (docs/event-format.md, *Oversized objects*).

A sink whose destination refuses a message for its size raises
:class:`~sinks.contract.SinkMessageTooLargeError` (Kafka above ``max_message_bytes`` once compressed,
NATS above ``max_payload``, a webhook's 413). Unless ``oversize`` is ``dead_letter``, the whole event
is written to the dead letter and the same message is sent again with a cut body in its place
(``reference``: the object's identity; ``truncate``: the object's top-level fields that fit), carrying
the ``oversize*`` extension attributes, so that the stream never loses the object. Invariants: the cut
event keeps the envelope's attributes (its id, time, subject) so consumers deduplicate it with the
whole one; a cut event is sent alone (never in a run) and is never cut again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sinks.cloudevents import STRUCTURED_CONTENT_TYPE, encode_binary, encode_structured
from sinks.envelope import OutgoingMessage, metadata_of
from sinks.options import DeadLetterOptions
from sinks.payload import JSON_CONTENT_TYPE

__all__ = ["cut_event", "dead_letter_address"]

_Encoded = tuple[dict[str, str], bytes]


def dead_letter_address(options: DeadLetterOptions) -> str:
    """Where the dead letter keeps whole events: ``kafka:<topic>``, ``nats:<subject>``,
    ``file:<path>``; empty without a dead letter."""
    return "" if options.kind == "none" else f"{options.kind}:{options.target}"


def cut_event(msg: OutgoingMessage, *, policy: str, limit: int | None, size: int, structured: bool,
              address: str) -> _Encoded:
    """The cut event's headers and body: the envelope of ``msg`` with its data replaced by the
    object's identity (``reference``) or by its top-level fields that fit ``limit`` (``truncate``).
    ``size`` is the whole event's, ``address`` the dead letter's (:func:`dead_letter_address`)."""
    ce = dict(msg.cloudevent)
    data = ce.get("data")
    res = msg.event.resource
    meta = metadata_of(msg.event.obj)
    identity_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if meta.get(k)}
    identity: dict[str, Any] = {"apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
                                "kind": res.kind, "metadata": identity_meta}
    ce["datacontenttype"] = JSON_CONTENT_TYPE
    ce["oversize"] = policy
    ce["oversizebytes"] = str(size)
    if address:
        ce["oversizeref"] = address

    def encode(candidate: Mapping[str, Any]) -> _Encoded:
        if structured:
            return {"content-type": STRUCTURED_CONTENT_TYPE}, encode_structured(candidate)
        return encode_binary(dict(candidate), msg.header_prefix)

    def fits(candidate: Mapping[str, Any]) -> bool:
        headers, body = encode(candidate)
        overhead = sum(len(k) + len(v) + 4 for k, v in headers.items()) + len(msg.key) + 512
        return limit is not None and len(body) + overhead <= limit

    kept: dict[str, Any] = identity
    if policy == "truncate" and isinstance(data, Mapping) and isinstance(data.get("metadata"), Mapping):
        kept, dropped = _truncated(ce, data, identity, fits)
        ce["oversizedropped"] = ",".join(dropped)
    ce["data"] = kept
    return encode(ce)


def _truncated(ce: Mapping[str, Any], data: Mapping[str, Any], identity: dict[str, Any],
               fits: Callable[[Mapping[str, Any]], bool]) -> tuple[dict[str, Any], list[str]]:
    """The object's top-level fields in order, each kept when the event still fits; and the names
    of those dropped."""
    dropped: list[str] = []
    kept = identity
    full_meta = {k: v for k, v in data["metadata"].items() if k != "managedFields"}
    trial = {**identity, "metadata": full_meta}
    if fits({**ce, "data": trial}):
        kept = trial
    else:
        dropped.append("metadata")
    for key, value in data.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        trial = {**kept, key: value}
        if fits({**ce, "data": trial}):
            kept = trial
        else:
            dropped.append(key)
    return kept, dropped
