"""The CloudEvent envelope written from byte templates: what a sink's reference builder writes, with
what is constant for one resource, cluster and event type encoded once.

The reference builder (:meth:`sinks.envelope.Envelope.reference_build`:
:func:`~sinks.cloudevents.to_cloudevent`, then :func:`~sinks.cloudevents.encode_structured` or
:func:`~sinks.cloudevents.encode_binary`) makes a dict per event and encodes it. An
:class:`EventTemplate` holds the attributes that are the same for every event of one (sink,
resource, cluster, event type) — ``specversion``, ``source``, ``type``, ``datacontenttype``,
``cluster``, ``kind``, ``apiversion``, native or Knative — already written as JSON text (structured
mode) or as header values (binary mode: percent-encoded for HTTP and NATS, as they are for Kafka).
Per event only the variable parts are written in: ``id``, ``subject`` (Knative: its self link),
``time``, the object's ``namespace`` / ``name`` / ``uid`` / ``resourceversion``, who changed it
(``manager``, ``operation``, ``subresource``), the event's context attributes (final state unknown,
gap, snapshot, and its extensions, the Events profile's among them:
:func:`~sinks.cloudevents.context_attributes`, shared with the reference), and ``data``: the
object's bytes as its :class:`~bridge.rawobject.RawObject` keeps them, ``{"object": …,
"oldObject": …}`` spliced from both objects' bytes (``object_and_old``), an update's merge patch
(``merge_patch``: computed from both objects, as the reference does), or Knative's object reference.

Invariants:

- the message is the reference builder's, byte for byte: key, destination, lane, id, headers in the
  same order, body (``tests/sinks/test_envelope_template.py``, a randomized differential test, holds
  it);
- whatever the templates do not cover goes to the reference builder, whole: an object not kept as
  bytes (a decoded dict), kept with its ``managedFields``, or malformed (its quarantine record is the
  reference's business); a resource whose redaction is not the identity (Secrets, ``redact``,
  ``drop``); a sink with a ``fields`` projection (CEL: :func:`covers`); ``object_and_old``
  or ``merge_patch`` with an old state that is not bytes without ``managedFields``; markers and
  heartbeats (no object); an extension named ``data`` (the reference writes ``data`` in that
  extension's place); a string that cannot be encoded (a lone surrogate: the reference makes the
  dead-letter message). Oversize truncation (:mod:`sinks.oversize`) works on the message built here
  as on the reference's, after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from hashlib import sha256
from time import time as wall_time
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

from orjson import dumps as orjson_dumps

from bridge.rawobject import RawObject, dumps, plain
from sinks.cloudevents import (
    _HEADER_SAFE,
    CE_SPEC_VERSION,
    KAFKA_PREFIX,
    LEFT_SELECTOR,
    STRUCTURED_CONTENT_TYPE,
    context_attributes,
    event_source,
    event_type,
    guess_resource,
    knative_reference,
    rfc3339,
)
from sinks.contract import AckCallback, ChangeEvent, EventType, ResourceRef
from sinks.message import Builder, OutgoingMessage
from sinks.payload import JSON_CONTENT_TYPE, MERGE_PATCH_CONTENT_TYPE, PayloadMode, merge_patch

if TYPE_CHECKING:
    from sinks.options import SinkOptions

__all__ = ["EventTemplate", "TemplatedBuilder", "covers"]

Destination = Callable[[ChangeEvent, str, str, str], str]
"""``(event, namespace, name, uid) → destination`` (see ``Template.identity_renderer``)."""

_JSON_UNSAFE: Final = re.compile(r'[\x00-\x1f"\\]')
"""What JSON (and orjson) escapes in a string; everything else, non-ASCII included, is written as
its UTF-8 bytes."""
_HEADER_UNSAFE: Final = re.compile(r'[^\x20-\x7e]|["%]')
"""What ``quote(value, safe=_HEADER_SAFE)`` changes: HTTP and NATS header values."""
_OBJECT_TYPES: Final = (EventType.ADDED, EventType.UPDATED, EventType.DELETED, EventType.SYNC)
_ATTRIBUTED: Final = frozenset({EventType.ADDED, EventType.UPDATED, EventType.DELETED})
_BASE_TAKEN: Final = frozenset({
    "specversion", "id", "source", "type", "subject", "time", "datacontenttype", "cluster", "kind",
    "apiversion", "name", "uid", "resourceversion",
})
"""The attributes every object's envelope has before its context (:func:`context_attributes`)."""
_KEPT_MAX = 4096
"""Entries of each of a builder's memos (times, writers) before it is emptied."""


def covers(options: SinkOptions, *, projected: bool) -> bool:
    """Whether templates build this sink's envelopes (each event may still go to the reference)."""
    return not projected


def _json(text: str) -> str:
    """``text`` as a JSON string, exactly as orjson writes it."""
    return orjson_dumps(text).decode()


def _json_inner(*texts: str) -> tuple[str, ...]:
    """Each of ``texts`` escaped as in a JSON string, without its quotes."""
    return tuple(orjson_dumps(t).decode()[1:-1] for t in texts)


class EventTemplate:
    """The constant parts of the envelopes of one (sink, resource, cluster, event type)."""

    __slots__ = ("after_id", "after_time", "attributed", "cluster", "deletes", "header_prefix", "headers",
                 "id_infix", "knative", "patch", "plain_data", "reference", "subject_head", "subject_mid")

    def __init__(self, event: ChangeEvent, *, options: SinkOptions, header_prefix: str) -> None:
        res, etype = event.resource, event.type
        self.knative = options.compat == "knative"
        source = options.knative_source if self.knative else event_source(event)
        ce_type = event_type(event, options.compat, options.knative_mode)
        api_version = f"{res.group}/{res.version}" if res.group else res.version
        self.cluster = event.cluster
        self.deletes = etype is EventType.DELETED
        self.attributed = etype in _ATTRIBUTED
        self.id_infix = f"\0{etype.value}\0"
        """What the change id's input has between the resourceVersion and the snapshot id."""
        self.reference = self.knative and options.knative_mode == "reference"
        """``data`` is Knative's object reference."""
        self.patch = options.payload is PayloadMode.MERGE_PATCH and etype is EventType.UPDATED
        """``data`` is the merge patch from the old object to the new one."""
        self.plain_data = not (self.reference or self.patch or options.payload is PayloadMode.OBJECT_AND_OLD)
        content_type = MERGE_PATCH_CONTENT_TYPE if self.patch else JSON_CONTENT_TYPE
        """``data`` is the object's bytes (else :meth:`data`)."""
        self.subject_head: str | None = None
        """Knative: the ``subject`` (its self link) up to the namespace (None: ``namespace/name``)."""
        self.subject_mid = ""
        if self.knative:
            version = res.api_version
            if "." in version and "/" not in version:  # as Knative's createSelfLink does
                version += "/versionUnknown"
            self.subject_head = f"/apis/{version}/namespaces/"
            self.subject_mid = f"/{guess_resource(res.kind)}/"
        # structured: '{"specversion":"1.0","id":"' id after_id subject '","time":"' time after_time …
        self.after_id = f'","source":{_json(source)},"type":{_json(ce_type)},"subject":"'
        self.after_time = (f'","datacontenttype":{_json(content_type)},"cluster":{_json(event.cluster)}'
                           f',"kind":{_json(res.kind)},"apiversion":{_json(api_version)}')
        # binary: the attribute headers in the reference's order, with the constant values
        self.header_prefix = header_prefix
        value = _header_value(header_prefix)
        p = header_prefix
        self.headers = {
            f"{p}specversion": value(CE_SPEC_VERSION), f"{p}id": "", f"{p}source": value(source),
            f"{p}type": value(ce_type), f"{p}subject": "", f"{p}time": "", "content-type": content_type,
            f"{p}cluster": value(event.cluster), f"{p}kind": value(res.kind),
            f"{p}apiversion": value(api_version),
        }
        """A copy per event has its id, subject and time set (in place: the order stays)."""

    def data(self, event: ChangeEvent, obj: RawObject) -> bytes:
        """``data`` when it is not the object's bytes alone (an old state is bytes, or None)."""
        if self.reference:
            return orjson_dumps(knative_reference(event, obj.namespace, obj.name))
        old = event.old
        if self.patch:  # an integer beyond 64 bits: dumps writes it as the reference does (msgspec)
            return dumps(merge_patch(plain(old) if old is not None else None, plain(obj)))
        old_raw = old.raw if type(old) is RawObject and event.type is EventType.UPDATED else b"null"
        return b'{"object":%b,"oldObject":%b}' % (obj.raw, old_raw)


def _header_value(prefix: str) -> Callable[[str], str]:
    if prefix == KAFKA_PREFIX:
        return str
    return lambda text: quote(text, safe=_HEADER_SAFE)


class _TimeTexts(dict[float, str]):
    """Event time → its ``time`` text, made on first use (a burst's changes share few managedFields
    times; a lookup that finds it makes no call)."""

    def __missing__(self, seconds: float) -> str:
        if not seconds:
            return rfc3339(wall_time())  # no time of its own: when it is sent, as the reference does
        if len(self) >= _KEPT_MAX:
            self.clear()
        text = self[seconds] = rfc3339(seconds)
        return text


class _WriterTexts(dict[tuple[str, ...], str]):
    """(manager, operation, subresource) → their attributes as the structured envelope writes them,
    made on first use (few writers change a resource's objects)."""

    def __missing__(self, writer: tuple[str, ...]) -> str:
        if len(self) >= _KEPT_MAX:
            self.clear()
        text = self[writer] = "".join(f',"{key}":{_json(value)}' for key, value in zip(
            ("manager", "operation", "subresource"), writer, strict=True) if value)
        return text


class TemplatedBuilder:
    """Builds one sink's messages from :class:`EventTemplate` s, and hands what they do not cover
    (see the module's docstring) to ``fallback``, the reference builder."""

    def __init__(self, *, options: SinkOptions, header_prefix: str, leaves_raw: Callable[[ResourceRef], bool],
                 static: str | None, destination: Destination, fallback: Builder) -> None:
        self._message = OutgoingMessage
        self._options = options
        self._payload = options.payload
        self._structured = options.content_mode == "structured"
        self._by_uid = options.key == "uid"
        self._header_prefix = header_prefix
        self._leaves_raw = leaves_raw
        self._static = static
        self._destination = destination
        self._fallback = fallback
        self._res: ResourceRef | None = None
        self._cluster = ""
        self._lane_prefix = ""
        self._shapes: dict[EventType, EventTemplate | None] = {}
        """The templates of the last resource and cluster seen (None: the reference builds those)."""
        self._known: dict[tuple[ResourceRef, str], dict[EventType, EventTemplate | None]] = {}
        self._times = _TimeTexts()
        self._changes = _WriterTexts()

    def _switch(self, event: ChangeEvent) -> None:
        """Selects (or makes) the templates of the event's resource and cluster."""
        res, cluster = event.resource, event.cluster
        self._res, self._cluster = res, cluster
        self._lane_prefix = f"{res.group}/{res.resource}\0"
        shapes = self._known.get((res, cluster))
        if shapes is None:
            covered = self._leaves_raw(res)
            shapes = {}
            for etype in _OBJECT_TYPES:
                shapes[etype] = None if not covered else EventTemplate(
                    ChangeEvent(type=etype, resource=res, cluster=cluster, obj=None), options=self._options,
                    header_prefix=self._header_prefix)
            self._known[(res, cluster)] = shapes
        self._shapes = shapes

    def build(self, event: ChangeEvent, ack: AckCallback) -> OutgoingMessage:
        """The event's message: from its template, or the reference builder's."""
        obj = event.obj
        if type(obj) is not RawObject or obj.managed_fields or obj.malformed:
            return self._fallback(event, ack)
        old = event.old
        if old is not None and self._payload is not PayloadMode.OBJECT and (
                type(old) is not RawObject or old.managed_fields or old.malformed):
            return self._fallback(event, ack)
        namespace, name, uid, rv = obj.namespace, obj.name, obj.uid, obj.resource_version
        ext, snap = event.extensions, event.snapshot
        try:
            if event.resource is not self._res or event.cluster != self._cluster:
                self._switch(event)
            tpl = self._shapes[event.type]  # KeyError: not an object's type; the reference's
            if tpl is None:
                return self._fallback(event, ack)
            if tpl.deletes and uid and not (ext and ext.get(LEFT_SELECTOR) == "true"):
                eid = sha256(f"{tpl.cluster}\0{uid}\0deleted".encode()).hexdigest()[:32]
            else:
                snap_id = snap.id if snap is not None else ""
                eid = sha256(f"{uid}\0{rv}{tpl.id_infix}{snap_id}".encode()).hexdigest()[:32]
            time_text = self._times[event.time]
            context = None
            if event.final_state_unknown or event.gap is not None or snap is not None or ext:
                context = self._context(event, namespace, tpl)
                if context is None:
                    return self._fallback(event, ack)
            data = obj.raw if tpl.plain_data else tpl.data(event, obj)
            subject = f"{namespace}/{name}" if namespace else name
            head = tpl.subject_head
            ce_subject = subject if head is None else f"{head}{namespace}{tpl.subject_mid}{name}"
            static = self._static  # "" is one too: a file's or a webhook's default
            msg = self._message(
                key=(uid if uid and self._by_uid else subject).encode(),
                destination=static if static is not None else self._destination(event, namespace, name, uid),
                headers={"content-type": STRUCTURED_CONTENT_TYPE}, body=data, event_id=eid, event=event,
                ack=ack, header_prefix=self._header_prefix, lane=self._lane_prefix + subject,
            )
            if not self._structured:
                msg.headers = self._headers(tpl, obj, eid, ce_subject, time_text, context=context)
                return msg
            change = obj.change if tpl.attributed else None
            changed = "" if change is None else self._changes[change[:3]]
            if _JSON_UNSAFE.search(f"{ce_subject}{uid}{rv}") is not None:  # the subject holds the rest
                namespace, name, uid, rv, ce_subject = _json_inner(namespace, name, uid, rv, ce_subject)
            ns = f',"namespace":"{namespace}"' if namespace or tpl.knative else ""
            text = (f'{{"specversion":"1.0","id":"{eid}{tpl.after_id}{ce_subject}","time":"{time_text}'
                    f'{tpl.after_time}{ns},"name":"{name}","uid":"{uid}","resourceversion":"{rv}"{changed}')
            ctx = b"," + orjson_dumps(context)[1:-1] if context else b""
            msg.body = b'%b%b,"data":%b}' % (text.encode(), ctx, data)
            return msg
        except Exception:  # the reference logs it and makes the dead-letter message
            return self._fallback(event, ack)

    @staticmethod
    def _context(event: ChangeEvent, namespace: str, tpl: EventTemplate) -> dict[str, str] | None:
        """The event's context attributes; None when the reference writes them another way (an
        extension named ``data`` takes the place ``data`` is then written in)."""
        taken = set(_BASE_TAKEN)
        if namespace or tpl.knative:
            taken.add("namespace")
        change = event.obj.change if type(event.obj) is RawObject and tpl.attributed else None
        if change is not None:
            taken.update(k for k, v in (("manager", change.manager), ("operation", change.operation),
                                        ("subresource", change.subresource)) if v)
        context = context_attributes(event, taken)
        return None if "data" in context else context

    @staticmethod
    def _headers(tpl: EventTemplate, obj: RawObject, eid: str, subject: str, time_text: str, *,
                 context: dict[str, str] | None) -> dict[str, str]:
        """Binary content mode: every attribute but ``data`` as a header, in the reference's order."""
        p = tpl.header_prefix
        values = [obj.namespace, obj.name, obj.uid, obj.resource_version]
        change = obj.change if tpl.attributed else None
        changed = (("manager", change.manager), ("operation", change.operation),
                   ("subresource", change.subresource)) if change is not None else ()
        names = ["namespace", "name", "uid", "resourceversion"]
        for key, value in changed:
            if value:
                names.append(key)
                values.append(value)
        if context:
            names.extend(context)
            values.extend(context.values())
        if p != KAFKA_PREFIX and _HEADER_UNSAFE.search("".join(values) + subject) is not None:
            values = [quote(v, safe=_HEADER_SAFE) for v in values]
            subject = quote(subject, safe=_HEADER_SAFE)
        headers = tpl.headers.copy()
        headers[f"{p}id"], headers[f"{p}subject"], headers[f"{p}time"] = eid, subject, time_text
        for key, value in zip(names, values, strict=True):
            if key != "namespace" or value or tpl.knative:
                headers[p + key] = value
        return headers

