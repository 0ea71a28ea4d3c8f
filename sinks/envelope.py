"""One event encoded as the message a sink sends: payload, CloudEvent envelope, encoding, key and
destination.

:class:`Envelope` turns a :class:`~sinks.contract.ChangeEvent` into an :class:`OutgoingMessage`:
redaction, the ``fields`` projection (:class:`~sinks.cel.Projection`), payload (object / object and
old / merge patch), CloudEvent envelope, encoding (structured or binary with the sink's header
prefix), key (the uid, or ``namespace/name``; ``snapshot/<id>`` / ``gap/<id>`` for markers) and the
rendered destination template. Invariants:

- a template reads labels from the *redacted* object, so a redacted label stays redacted; the
  projection applies after the template (the destination and the envelope's identity stay whole);
- an event that cannot be encoded is never raised: it becomes a message with ``error`` set, which the
  sink sends straight to the dead letter (a permanent failure of that event alone);
- a malformed object (:mod:`sinks.malformed`) carries its quarantine record when the sink has a dead
  letter, written before the event is sent;
- :meth:`Envelope.batch_builder` builds exactly the message :meth:`Envelope.build` builds, with what
  is the same for every event of a batch looked up once, and an object kept as bytes
  (:class:`~bridge.rawobject.RawObject`) spliced into the envelope without a metadata mapping built.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import time as wall_time
from typing import Any

from orjson import Fragment
from orjson import dumps as orjson_dumps

from bridge.rawobject import RawObject, identity_metadata
from sinks.cel import Projection
from sinks.cloudevents import (
    HTTP_PREFIX,
    STRUCTURED_CONTENT_TYPE,
    cloudevent_of,
    decode_binary,
    decode_structured,
    encode_binary,
    encode_structured,
    event_id,
    event_source,
    rfc3339,
    to_cloudevent,
)
from sinks.contract import AckCallback, ChangeEvent
from sinks.malformed import malformed_reason, quarantine_record_body
from sinks.options import SinkOptions
from sinks.payload import JSON_CONTENT_TYPE, PayloadMode, build_payload
from sinks.redaction import Redactor
from sinks.templates import Template

__all__ = ["Envelope", "OutgoingMessage", "metadata_of", "subject_of"]

log = logging.getLogger("sinks.base")  # the sink's own log: what it could not encode

_EMPTY: Mapping[str, Any] = {}
_SANITIZED_MAX = 16_384



def metadata_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's name, namespace, uid and resourceVersion as a metadata mapping (hot path; for a
    RawObject nothing else of its metadata)."""
    if obj is None:
        return _EMPTY
    if type(obj) is RawObject:
        return identity_metadata(obj)  # what sinks need, without decoding the whole metadata
    meta = obj.get("metadata")
    if type(meta) is dict or isinstance(meta, Mapping):
        return meta
    return _EMPTY


def subject_of(meta: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` when cluster-scoped), as ``ChangeEvent.subject``."""
    namespace = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{namespace}/{name}" if namespace else name


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
_Destination = Callable[[ChangeEvent, str, str, str], str]


class Envelope:
    """Builds the messages of one sink (its options, template, redaction and projection)."""

    def __init__(self, *, sink: str, options: SinkOptions, template: Template, redactor: Redactor,
                 projection: Projection | None, header_prefix: str, sanitize: Callable[[str], str],
                 quarantines: bool) -> None:
        self._sink = sink
        self._options = options
        self._template = template
        self._redactor = redactor
        self._projection = projection
        self._header_prefix = header_prefix
        self._sanitize = sanitize
        """Applied to every template field value; a function of the value alone (memoised)."""
        self._quarantines = quarantines
        """The sink has a dead letter: a malformed object's record goes there first."""
        self._sanitized: dict[str, str] = {}
        """Template field value → its sanitised form (batches; emptied beyond _SANITIZED_MAX)."""
        self._time_text: tuple[float, str] = (-1.0, "")
        """The last event time formatted (the batches of a burst share their changes' seconds)."""

    def key(self, event: ChangeEvent, meta: Mapping[str, Any] | None = None) -> bytes:
        """The message key: the uid (``key: uid``) or ``namespace/name``; a marker's id."""
        if event.obj is None:
            if event.gap is not None:
                return f"gap/{event.gap.id}".encode()
            snap = event.snapshot
            return f"snapshot/{snap.id if snap else event.resource.qualified}".encode()
        if meta is None:
            meta = metadata_of(event.obj)
        uid = meta.get("uid")
        if uid and self._options.key == "uid":
            return str(uid).encode()
        return subject_of(meta).encode()

    def build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        """The event's message; one that cannot be encoded has ``error`` set (never raises)."""
        res = event.resource
        meta = metadata_of(event.obj)
        eid = event_id(event, meta)
        key = self.key(event, meta)
        lane = f"{res.group}/{res.resource}\0{subject_of(meta)}"
        prefix = self._header_prefix
        try:
            destination, headers, body, malformed = self._encode(event, eid, meta)
        except Exception as exc:  # an object the envelope cannot encode is a permanent failure
            log.warning("cannot encode event %s: %r", eid, exc, extra={"sink": self._sink})
            return OutgoingMessage(
                key=key, destination="", headers={}, body=b"", event_id=eid, event=event, ack=ack,
                header_prefix=prefix, lane=lane, error=f"cannot encode event: {exc!r}",
            )
        msg = OutgoingMessage(
            key=key, destination=destination, headers=headers, body=body, event_id=eid, event=event,
            ack=ack, header_prefix=prefix, lane=lane,
        )
        if malformed and self._quarantines:
            msg.quarantine = quarantine_record_body(event, keep_bytes=self._redactor.leaves_raw(res))
        return msg

    def _encode(self, event: ChangeEvent, eid: str,
                meta: Mapping[str, Any]) -> tuple[str, dict[str, str], bytes, str]:
        """(destination, headers, body, why the object is malformed or "") of ``event``."""
        opts = self._options
        res = event.resource
        redactor = self._redactor
        obj = redactor.apply(event.obj, res)
        # A template reads labels: from the redacted object, so a redacted label stays redacted.
        shown = event if obj is event.obj else dataclasses.replace(event, obj=obj)
        destination = self._template.render(shown, self._sanitize)
        projection = self._projection
        if projection is not None:  # after the template: the envelope and the destination stay whole
            obj = projection.apply(obj)
        old = None
        if event.old is not None and opts.payload is not PayloadMode.OBJECT:
            old = redactor.apply(event.old, res)
            if projection is not None:
                old = projection.apply(old)
        data, content_type = build_payload(opts.payload, event.type, obj, old)
        ce = to_cloudevent(event, data=data, datacontenttype=content_type, compat=opts.compat,
                           knative_source=opts.knative_source, knative_mode=opts.knative_mode,
                           event_id_value=eid, metadata=meta)
        if projection is not None and obj is not None:
            ce["fields"] = projection.attribute  # so a consumer never takes it for the whole object
        malformed = malformed_reason(event.obj)
        if malformed:
            ce["malformed"] = malformed
        if opts.content_mode == "structured":
            return destination, {"content-type": STRUCTURED_CONTENT_TYPE}, encode_structured(ce), malformed
        headers, body = encode_binary(ce, self._header_prefix)
        return destination, headers, body, malformed

    def _destination(self) -> _Destination | None:
        """The destination of an object from its identity, for a batch: ``(event, namespace, name,
        uid) → destination``; None when the template needs the whole event (it reads labels)."""
        template = self._template
        memo = self._sanitized
        if len(memo) > _SANITIZED_MAX:
            memo.clear()
        return template.identity_renderer(self._sanitize, memo)

    def batch_builder(self) -> Builder:
        """:meth:`build` for the events of one batch, with what is constant (see the module's
        docstring) looked up once. An object kept as bytes (RawObject) takes the short path (identity
        fields read directly, the envelope built around its bytes); anything else :meth:`build`'s."""
        opts = self._options
        slow = self.build
        if opts.compat != "native" or opts.payload is not PayloadMode.OBJECT or self._projection is not None:
            return slow
        header_prefix, by_uid = self._header_prefix, opts.key == "uid"
        structured = opts.content_mode == "structured"
        static = self._template.text if self._template.static else None
        identity_destination = None if static is not None else self._destination()
        render, sanitize, leaves_raw = self._template.render, self._sanitize, self._redactor.leaves_raw
        last_res: Any = None
        last_cluster = lane_prefix = source = ""
        last_time, time_text = self._time_text
        untouched = False  # redaction leaves this resource's RawObjects (without managedFields) alone

        def build(event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
            nonlocal last_res, last_cluster, lane_prefix, source, untouched, last_time, time_text
            obj = event.obj
            if type(obj) is not RawObject or obj.managed_fields or obj.malformed:
                return slow(event, ack)
            res = event.resource
            if res is not last_res or event.cluster != last_cluster:
                last_res, last_cluster = res, event.cluster
                lane_prefix = f"{res.group}/{res.resource}\0"
                source = event_source(event)
                untouched = leaves_raw(res)
            if not untouched:
                return slow(event, ack)
            namespace, name, uid = obj.namespace, obj.name, obj.uid
            subject = f"{namespace}/{name}" if namespace else name
            seconds = event.time
            if seconds != last_time or not seconds:  # a burst's changes often share their second
                last_time = seconds
                time_text = rfc3339(seconds or wall_time())
                self._time_text = (seconds, time_text)
            try:
                destination = static if static is not None else (
                    render(event, sanitize) if identity_destination is None
                    else identity_destination(event, namespace, name, uid))
                ce = cloudevent_of(event, None, namespace=namespace, name=name, uid=uid,
                                   resource_version=obj.resource_version,
                                   # structured: the object's bytes spliced in, as encode_structured does
                                   data=Fragment(obj.raw) if structured else obj,
                                   datacontenttype=JSON_CONTENT_TYPE, source=source, time=time_text)
                if structured:
                    headers, body = {"content-type": STRUCTURED_CONTENT_TYPE}, orjson_dumps(ce)
                else:
                    headers, body = encode_binary(ce, header_prefix)
            except Exception:  # the slow path logs it and makes the dead-letter message
                return slow(event, ack)
            return OutgoingMessage(
                key=(uid if uid and by_uid else subject).encode(), destination=destination,
                headers=headers, body=body, event_id=ce["id"], event=event, ack=ack,
                header_prefix=header_prefix, lane=lane_prefix + subject,
            )

        return build
