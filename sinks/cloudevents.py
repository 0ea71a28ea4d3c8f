"""The CloudEvents 1.0 envelope every sink sends, in structured or binary content mode.

One change event becomes one CloudEvent (see docs/event-format.md for examples):

- ``id``: deterministic, so consumers (and JetStream's ``Nats-Msg-Id`` window) can drop duplicates of
  an at-least-once redelivery: the first 32 hex digits of the SHA-256 of
  ``uid \\0 resourceVersion \\0 type \\0 snapshotId`` (snapshot markers have no uid; their snapshot id
  and resourceVersion make them unique; ``sync`` events include the snapshot id so two resyncs of an
  unchanged object are distinct events). A ``deleted`` event: ``cluster \\0 uid \\0 deleted`` (one
  delete per uid, whether seen on the watch or inferred by a relist).
- ``source``: ``/clusters/{cluster}/api/v1/{resource}`` for the core group,
  ``/clusters/{cluster}/apis/{group}/{version}/{resource}`` otherwise.
- ``type``: ``io.kube-event-bridge.{added|updated|deleted|sync|snapshot.begin|snapshot.end|``
  ``gap.begin|gap.end}``.
- ``subject``: ``namespace/name`` (``name`` for cluster-scoped objects; absent for markers).
- ``time``: RFC 3339 UTC of the event's ``time`` (see ``docs/event-format.md``: derived from the
  object's newest managedFields entry when there is one, so identical in every sink and redelivery).
- extensions (strings): ``cluster``, ``kind``, ``apiversion``, ``namespace``, ``name``, ``uid``,
  ``resourceversion``, ``manager`` / ``operation`` / ``subresource`` (who changed it: the newest
  managedFields entry, on added / updated / deleted events), ``finalstateunknown`` (only when
  true), ``snapshotid``, ``snapshotrv``, ``snapshotcount``, ``gapid`` / ``gapfrom`` / ``gapto`` (gap
  markers, and the events of a relist between them: ``gapto`` once known), plus the event's own
  extensions.

Knative compatibility mode (``compat="knative"``) emits what Knative's ApiServerSource adapter
emits (``pkg/adapter/apiserver/events``), so its consumers can switch without changes. ``Resource``
mode (``knative_mode="resource"``): ``type`` ``dev.knative.apiserver.resource.add|update|delete``
(``sync`` maps to ``update``), ``data`` the object. ``Reference`` mode (``"reference"``): ``type``
``dev.knative.apiserver.ref.add|update|delete``, ``data`` the object reference ``{kind, namespace,
name, apiVersion}`` (``namespace`` omitted when empty, as Go's ``omitempty`` does). Both: ``source``
the API server URL, ``subject`` Knative's self link
``/apis/{apiVersion}/namespaces/{namespace}/{guessed resource}/{name}`` — ``namespaces//`` for a
cluster-scoped object and the resource guessed from the kind as ``meta.UnsafeGuessKindToResource``
does, exactly as Knative writes it — and the ``kind``, ``apiversion``, ``name`` and ``namespace``
(empty for cluster-scoped objects) extensions. Snapshot markers have no Knative counterpart: sinks
in Knative mode do not send them (see ``sinks.base``).

Binary content mode puts every attribute but ``data`` into headers named ``{prefix}{attribute}``
(``ce_`` for Kafka, ``ce-`` for HTTP and NATS) with ``content-type`` carrying ``datacontenttype``.
HTTP (and NATS, whose headers follow HTTP's rules) header values are percent-encoded outside
printable ASCII as the HTTP binding requires; Kafka header values are bytes, written as UTF-8
without percent-encoding, as the Kafka binding says (percent-encoding is an HTTP-only rule).
"""

from __future__ import annotations

import hashlib
import math
import re
import time as _time
import urllib.parse
from collections.abc import Container, Mapping
from typing import Any, Final, Literal

import msgspec
import orjson

from bridge.rawobject import RawObject, dumps, last_change, to_json
from sinks.contract import ChangeEvent, EventType

__all__ = [
    "BATCH_CONTENT_TYPE",
    "CE_SPEC_VERSION",
    "DEFAULT_KNATIVE_SOURCE",
    "HTTP_PREFIX",
    "KAFKA_PREFIX",
    "NATIVE_TYPE_PREFIX",
    "STRUCTURED_CONTENT_TYPE",
    "Compat",
    "KnativeMode",
    "cloudevent_of",
    "context_attributes",
    "decode_binary",
    "decode_structured",
    "encode_binary",
    "encode_structured",
    "event_id",
    "event_source",
    "event_type",
    "guess_resource",
    "knative_reference",
    "object_event_id",
    "rfc3339",
    "to_cloudevent",
]

CE_SPEC_VERSION: Final = "1.0"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"
BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json"
NATIVE_TYPE_PREFIX: Final = "io.kube-event-bridge."
KNATIVE_TYPE_PREFIX: Final = "dev.knative.apiserver.resource."
KNATIVE_REF_TYPE_PREFIX: Final = "dev.knative.apiserver.ref."
DEFAULT_KNATIVE_SOURCE: Final = "https://kubernetes.default.svc"
KAFKA_PREFIX: Final = "ce_"
HTTP_PREFIX: Final = "ce-"

Compat = Literal["native", "knative"]
KnativeMode = Literal["resource", "reference"]

_KNATIVE_TYPES: Final = {
    EventType.ADDED: "add",
    EventType.UPDATED: "update",
    EventType.SYNC: "update",
    EventType.DELETED: "delete",
}
_EXT_NAME = re.compile(r"[^a-z0-9]")
_ATTRIBUTED: Final = frozenset({EventType.ADDED, EventType.UPDATED, EventType.DELETED})
_MISSING: Any = object()


LEFT_SELECTOR = "leftselector"
"""The extension the sink listeners set on a delete that is a selector exit (the object lives on)."""


def event_id(event: ChangeEvent, metadata: Mapping[str, Any] | None = None) -> str:
    """Deterministic id: 32 hex digits of SHA-256 over uid, resourceVersion, type and snapshot id.
    ``metadata``: the object's metadata when the caller already has it (saves looking it up).

    A ``deleted`` event's id depends on the cluster and the uid alone: Kubernetes deletes a uid
    once, so the delete seen on the watch and one inferred by a relist (final state unknown, an
    older resourceVersion) are one event to a consumer that drops repeated ids. A selector exit
    (``leftselector``) is not the uid's delete — the object lives on, and may come back and leave
    again — so it keeps the id of a change (uid, resourceVersion, type)."""
    if event.type is EventType.HEARTBEAT:
        # Unique per heartbeat: its resource and time (one heartbeat per resource at a time).
        raw = f"{event.cluster}\0{event.resource.qualified}\0heartbeat\0{event.time!r}".encode()
        return hashlib.sha256(raw).hexdigest()[:32]
    if event.obj is None:
        snap = event.snapshot.id if event.snapshot is not None else ""
        if event.gap is not None:
            snap = event.gap.id
        raw = f"\0{event.resource_version}\0{event.type.value}\0{snap}".encode()
        return hashlib.sha256(raw).hexdigest()[:32]
    meta = event.metadata if metadata is None else metadata
    return object_event_id(event, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))


def object_event_id(event: ChangeEvent, uid: str, resource_version: str) -> str:
    """:func:`event_id` of an event with an object whose uid and resourceVersion the caller has."""
    if uid and event.type is EventType.DELETED and event.extensions.get(LEFT_SELECTOR) != "true":
        return _sha256(f"{event.cluster}\0{uid}\0deleted".encode()).hexdigest()[:32]
    snap = event.snapshot
    raw = f"{uid}\0{resource_version}\0{_TYPE_VALUES[event.type]}\0{snap.id if snap is not None else ''}"
    return _sha256(raw.encode()).hexdigest()[:32]


_sha256 = hashlib.sha256
_TYPE_VALUES: Final = {t: t.value for t in EventType}


_sources: dict[tuple[str, str, str, str], str] = {}
_SOURCES_MAX = 4096
"""Rendered ``source`` values by (cluster, group, version, resource): a handful in practice."""


def event_source(event: ChangeEvent) -> str:
    res = event.resource
    key = (event.cluster, res.group, res.version, res.resource)
    source = _sources.get(key)
    if source is None:
        if res.group:
            source = f"/clusters/{event.cluster}/apis/{res.group}/{res.version}/{res.resource}"
        else:
            source = f"/clusters/{event.cluster}/api/{res.version}/{res.resource}"
        if len(_sources) >= _SOURCES_MAX:
            _sources.clear()
        _sources[key] = source
    return source


_NATIVE_TYPES: Final = {t: NATIVE_TYPE_PREFIX + t.value for t in EventType}


def event_type(event: ChangeEvent, compat: Compat = "native", knative_mode: KnativeMode = "resource") -> str:
    if compat == "knative" and event.type in _KNATIVE_TYPES:
        prefix = KNATIVE_REF_TYPE_PREFIX if knative_mode == "reference" else KNATIVE_TYPE_PREFIX
        return prefix + _KNATIVE_TYPES[event.type]
    return _NATIVE_TYPES[event.type]


_second_cache: tuple[int, str] = (-1, "")


def rfc3339(seconds: float) -> str:
    """``2024-05-01T12:00:00.123456Z`` (microseconds kept so order within a second survives)."""
    global _second_cache
    whole = math.floor(seconds)
    micros = round((seconds - whole) * 1_000_000)
    if micros == 1_000_000:
        whole, micros = whole + 1, 0
    cached_second, prefix = _second_cache
    if cached_second != whole:  # events come in bursts: format each second once
        prefix = _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(whole))
        _second_cache = (whole, prefix)
    return f"{prefix}.{micros:06d}Z"


def guess_resource(kind: str) -> str:
    """The plural resource Knative writes in subjects: apimachinery's ``UnsafeGuessKindToResource``
    (lowercased kind; ``…endpoints`` unchanged, ``…s`` → ``…ses``, ``…y`` → ``…ies``, else ``…s``)."""
    singular = kind.lower()
    if not singular or singular.endswith("endpoints"):
        return singular
    if singular.endswith("s"):
        return singular + "es"
    if singular.endswith("y"):
        return singular[:-1] + "ies"
    return singular + "s"


def _knative_subject(event: ChangeEvent, namespace: str, name: str) -> str:
    res = event.resource
    version = res.api_version
    if "." in version and "/" not in version:  # as Knative's createSelfLink does
        version += "/versionUnknown"
    return f"/apis/{version}/namespaces/{namespace}/{guess_resource(res.kind)}/{name}"


def knative_reference(event: ChangeEvent, namespace: str, name: str) -> dict[str, str]:
    """Knative's ``Reference`` mode ``data``: a ``corev1.ObjectReference`` as Go encodes it (fields
    in declaration order, empty ones omitted)."""
    res = event.resource
    ref = {"kind": res.kind, "namespace": namespace, "name": name, "apiVersion": res.api_version}
    return {k: v for k, v in ref.items() if v}


def to_cloudevent(
    event: ChangeEvent,
    *,
    data: Any = _MISSING,
    datacontenttype: str = "application/json",
    compat: Compat = "native",
    knative_source: str = DEFAULT_KNATIVE_SOURCE,
    knative_mode: KnativeMode = "resource",
    event_id_value: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The CloudEvent (as a dict ready for JSON) for ``event``; ``data`` defaults to the object (in
    Knative reference mode: the object reference). ``metadata``: the object's metadata when the
    caller already has it (saves looking it up)."""
    if event.obj is None:
        namespace = name = uid = rv = ""
    else:
        meta = event.metadata if metadata is None else metadata
        namespace = str(meta.get("namespace") or "")
        name = str(meta.get("name") or "")
        uid = str(meta.get("uid") or "")
        rv = str(meta.get("resourceVersion") or "")
    return cloudevent_of(
        event, event_id_value or event_id(event), namespace=namespace, name=name, uid=uid,
        resource_version=rv, data=data, datacontenttype=datacontenttype, compat=compat,
        knative_source=knative_source, knative_mode=knative_mode,
    )


def cloudevent_of(
    event: ChangeEvent,
    event_id_value: str | None,
    *,
    namespace: str,
    name: str,
    uid: str,
    resource_version: str,
    data: Any = _MISSING,
    datacontenttype: str = "application/json",
    compat: Compat = "native",
    knative_source: str = DEFAULT_KNATIVE_SOURCE,
    knative_mode: KnativeMode = "resource",
    source: str | None = None,
    time: str | None = None,
) -> dict[str, Any]:
    """:func:`to_cloudevent` for a caller that already has the event's id and the object's identity
    (``namespace``, ``name``, ``uid``, ``resource_version``; ignored for markers), e.g. the fields of
    a :class:`~bridge.rawobject.RawObject`: no metadata mapping is looked up or built. ``source``
    and ``time``: :func:`event_source` of the event and :func:`rfc3339` of its time when the caller
    has them. ``event_id_value`` None (an event with an object): :func:`object_event_id` of
    ``uid`` and ``resource_version``, read back from the result's ``id``."""
    etype = event.type
    if event_id_value is None:
        event_id_value = _object_id(event, uid, resource_version)
    knative = compat == "knative" and etype in _KNATIVE_TYPES
    ce: dict[str, Any] = {
        "specversion": CE_SPEC_VERSION,
        "id": event_id_value,
        "source": knative_source if knative else (source or event_source(event)),
        "type": event_type(event, compat, knative_mode) if knative else _NATIVE_TYPES[etype],
    }
    obj = event.obj
    has_obj = obj is not None
    if has_obj:
        if knative:
            ce["subject"] = _knative_subject(event, namespace, name)
        else:
            ce["subject"] = f"{namespace}/{name}" if namespace else name
    ce["time"] = time or rfc3339(event.time or _time.time())
    ce["datacontenttype"] = datacontenttype
    res = event.resource
    ce["cluster"] = event.cluster
    ce["kind"] = res.kind
    ce["apiversion"] = f"{res.group}/{res.version}" if res.group else res.version
    if obj is not None:
        if namespace or knative:  # Knative always sets it, empty for cluster-scoped objects
            ce["namespace"] = namespace
        ce["name"] = name
        ce["uid"] = uid
        ce["resourceversion"] = resource_version
        if etype in _ATTRIBUTED:
            _add_change(ce, obj)
    if event.final_state_unknown or event.gap is not None or event.snapshot is not None or event.extensions:
        _add_context(ce, event)
    if knative and knative_mode == "reference":
        ce["data"] = knative_reference(event, namespace, name)
    else:
        ce["data"] = obj if data is _MISSING else data
    return ce


def _object_id(event: ChangeEvent, uid: str, resource_version: str) -> str:
    """:func:`object_event_id` of an object's event, the change id computed here (without the
    call: a sink builds one per event)."""
    etype = event.type
    if uid and etype is EventType.DELETED:
        return object_event_id(event, uid, resource_version)
    snap = event.snapshot
    return _sha256(
        f"{uid}\0{resource_version}\0{_TYPE_VALUES[etype]}\0{snap.id if snap is not None else ''}"
        .encode()).hexdigest()[:32]


def _add_change(ce: dict[str, Any], obj: Mapping[str, Any]) -> None:
    """The ``manager``, ``operation`` and ``subresource`` of the object's last change, if known."""
    change = obj.change if type(obj) is RawObject else last_change(obj)
    if change is not None:
        if change.manager:
            ce["manager"] = change.manager
        if change.operation:
            ce["operation"] = change.operation
        if change.subresource:
            ce["subresource"] = change.subresource


def _add_context(ce: dict[str, Any], event: ChangeEvent) -> None:
    """The attributes of a final state unknown, a gap, a snapshot, and the event's extensions
    (never replacing an attribute already set)."""
    ce.update(context_attributes(event, ce))


def context_attributes(event: ChangeEvent, taken: Container[str]) -> dict[str, str]:
    """The attributes of a final state unknown, a gap, a snapshot, and the event's extensions, in
    the envelope's order, for an envelope whose attributes so far are ``taken``: an extension whose
    name (lowercased, cut to ``[a-z0-9]``) is taken, or is an earlier extension's, is left out."""
    out: dict[str, str] = {}
    if event.final_state_unknown:
        out["finalstateunknown"] = "true"
    gap = event.gap
    if gap is not None:
        out["gapid"] = gap.id
        out["gapfrom"] = gap.from_resource_version
        if gap.to_resource_version:
            out["gapto"] = gap.to_resource_version
    snap = event.snapshot
    if snap is not None:
        out["snapshotid"] = snap.id
        out["snapshotrv"] = snap.resource_version
        if snap.count is not None:
            out["snapshotcount"] = str(snap.count)
        if snap.total_shards is not None:
            out["shard"] = str(snap.shard)
            out["totalshards"] = str(snap.total_shards)
    if event.extensions:
        for key, value in event.extensions.items():
            ext = _EXT_NAME.sub("", key.lower())
            if ext and ext not in taken and ext not in out:
                out[ext] = str(value)
    return out


def encode_structured(ce: Mapping[str, Any]) -> bytes:
    """Structured content mode: the whole event as one JSON document (an object kept as JSON bytes
    is spliced in as it is, never decoded and re-encoded)."""
    return dumps(ce)


_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%') + " "


def encode_binary(ce: Mapping[str, Any], prefix: str = HTTP_PREFIX) -> tuple[dict[str, str], bytes]:
    """Binary content mode: attributes as headers, ``data`` alone as the body. Header values are
    percent-encoded for HTTP / NATS (``ce-``), left as they are for Kafka (``ce_``)."""
    headers: dict[str, str] = {}
    percent = prefix != KAFKA_PREFIX
    for key, value in ce.items():
        if key == "data":
            continue
        text = value if isinstance(value, str) else str(value)
        if key == "datacontenttype":
            headers["content-type"] = text
        elif percent:
            headers[prefix + key] = urllib.parse.quote(text, safe=_HEADER_SAFE)
        else:
            headers[prefix + key] = text
    data = ce.get("data")
    return headers, (to_json(data) if isinstance(data, Mapping) else orjson.dumps(data))


def decode_structured(body: bytes | str) -> dict[str, Any]:
    """The CloudEvent dict of a structured-mode body (msgspec: integers beyond 64 bits stay exact)."""
    decoded: dict[str, Any] = msgspec.json.decode(body)
    return decoded


def decode_binary(
    headers: Mapping[str, str] | list[tuple[str, str]], body: bytes, prefix: str = HTTP_PREFIX
) -> dict[str, Any]:
    """Rebuilds the CloudEvent dict from binary-mode headers (names case-insensitive) and body;
    values percent-decoded unless ``prefix`` is Kafka's."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    ce: dict[str, Any] = {}
    lower_prefix = prefix.lower()
    percent = prefix != KAFKA_PREFIX
    for name, value in items:
        lname = name.lower()
        if lname.startswith(lower_prefix):
            ce[lname[len(lower_prefix) :]] = urllib.parse.unquote(value) if percent else value
        elif lname == "content-type":
            ce["datacontenttype"] = value
    ce["data"] = msgspec.json.decode(body) if body else None
    return ce
