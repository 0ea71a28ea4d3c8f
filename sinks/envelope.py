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
- :meth:`Envelope.reference_build` builds the CloudEvent as a dict and encodes it: the reference.
  :attr:`Envelope.build` (and :meth:`Envelope.batch_builder`) writes the same bytes from byte
  templates (:mod:`sinks.envelope_template`), an object kept as bytes
  (:class:`~bridge.rawobject.RawObject`) spliced in without a metadata mapping built, and hands
  whatever the templates do not cover to the reference. :class:`OutgoingMessage` itself lives in
  :mod:`sinks.message` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from bridge.rawobject import RawObject, identity_metadata
from sinks.cel import Projection
from sinks.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    encode_binary,
    encode_structured,
    event_id,
    to_cloudevent,
)
from sinks.contract import AckCallback, ChangeEvent
from sinks.envelope_template import TemplatedBuilder, covers
from sinks.malformed import malformed_reason, quarantine_record_body
from sinks.message import Builder, OutgoingMessage
from sinks.options import SinkOptions
from sinks.payload import PayloadMode, build_payload
from sinks.redaction import Redactor
from sinks.templates import Template

__all__ = ["Envelope", "OutgoingMessage", "metadata_of", "subject_of"]

log = logging.getLogger("sinks.base")  # the sink's own log: what it could not encode

_EMPTY: Mapping[str, Any] = {}
_SANITIZED_MAX = 16_384


class _Sanitized(dict[str, str]):
    """Template field value → its sanitised form, emptied when a value beyond
    :data:`_SANITIZED_MAX` is added (a look-up makes no call; only a new value does)."""

    def __setitem__(self, value: str, clean: str) -> None:
        if len(self) >= _SANITIZED_MAX:
            self.clear()
        super().__setitem__(value, clean)



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
        self._sanitized = _Sanitized()
        self.build: Builder = self.reference_build
        """The event's message; one that cannot be encoded has ``error`` set (never raises): from
        byte templates (:mod:`sinks.envelope_template`) where they cover the sink's options, each
        event they do not cover (and every event otherwise) by :meth:`reference_build`."""
        if covers(options, projected=projection is not None):
            self.build = TemplatedBuilder(
                options=options, header_prefix=header_prefix, leaves_raw=redactor.leaves_raw,
                static=template.text if template.static else None, destination=self._identity_destination(),
                fallback=self.reference_build).build

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

    def reference_build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        """The event's message, built as a CloudEvent dict and encoded: the reference the byte
        templates are held to, and what builds whatever they do not cover. One that cannot be
        encoded has ``error`` set (never raises)."""
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

    def _identity_destination(self) -> _Destination:
        """The destination of an object from its identity: ``(event, namespace, name, uid) →
        destination`` (the whole event rendered when the template reads labels)."""
        rendered = self._template.identity_renderer(self._sanitize, self._sanitized)
        if rendered is not None:
            return rendered
        render, sanitize = self._template.render, self._sanitize
        return lambda event, _namespace, _name, _uid: render(event, sanitize)

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

    def batch_builder(self) -> Builder:
        """:attr:`build`, for the events of one batch (kept for the callers that ask per batch: the
        templates keep what is constant across batches)."""
        return self.build
