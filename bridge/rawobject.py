"""Kubernetes objects kept as their JSON bytes and decoded only when something reads their body.

Most objects the bridge handles are never looked into: it needs an object's identity (name,
namespace, uid, resourceVersion) to key, cache and checkpoint it, and its bytes to forward it. A
:class:`RawObject` carries exactly that: the object's JSON as the API server sent it (minus
``metadata.managedFields`` when the informer drops them), its ``metadata`` decoded once (a small
dict), and the rest of the tree decoded on first access and only then. It is a read-only
``Mapping``, so code written for plain decoded dicts (``obj["spec"]["nodeName"]``,
``obj.get("status")``, label selectors, templates, redaction) works on it unchanged.

What this saves per change, against decoding every object into a dict tree: allocating the tree
(and the garbage collector's rescans of it), encoding it again for the compact cache, decoding the
previous state back out of the cache for every update, and encoding it a third time into the
outgoing CloudEvent (:func:`dumps` splices the bytes in with ``orjson.Fragment``). The numbers are
in ``docs/performance.md``.

Before ``managedFields`` are cut, the newest entry (by its ``time``) is read into
:attr:`RawObject.change`, a :class:`Change`: who last wrote the object (field manager, operation,
subresource) and when the API server recorded it. Sinks carry it as the event's attribution and the
pipeline derives the event ``time`` from it, so it survives the cut.

Objects are immutable by contract (informer caches share them with every handler): a RawObject has
no setters, and the dict that :meth:`RawObject.to_dict` returns is shared by every reader of that
instance; :meth:`RawObject.copy_dict` gives a private copy.

This module is where the rest of the bridge imports all of it from, and holds the readers that take
any object, a RawObject or a decoded dict, alike (:func:`object_key`, :func:`object_identity`,
:func:`last_change`, :func:`to_json`, :func:`plain`, :func:`identity_metadata`): each answers a
RawObject from its derived facts, without decoding. The parts, one module each:
:mod:`bridge.rawobject_type` (the type, its one-pass build from bytes, :func:`dumps`),
:mod:`bridge.rawobject_decode` (an object's JSON or a watch line into a RawObject) and
:mod:`bridge.managed_fields` (the last writer read from ``managedFields``, and their cut).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.managed_fields import Change, dict_without_managed_fields, newest_change
from bridge.rawobject_decode import decode_object, decode_watch_object
from bridge.rawobject_type import RawObject, RawObjectError, dumps

__all__ = [
    "Change",
    "RawObject",
    "RawObjectError",
    "decode_object",
    "decode_watch_object",
    "dict_without_managed_fields",
    "dumps",
    "identity_metadata",
    "last_change",
    "object_identity",
    "object_key",
    "plain",
    "to_json",
]


def last_change(obj: Mapping[str, Any]) -> Change | None:
    """The newest ``metadata.managedFields`` entry of ``obj``: a RawObject's recorded one (read
    before its managedFields were cut), else read from the object's metadata; None without any."""
    if type(obj) is RawObject:
        return obj.change
    meta = obj.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    return newest_change(entries) if isinstance(entries, list) else None


def to_json(obj: Mapping[str, Any]) -> bytes:
    """An object's JSON: a RawObject's own bytes, anything else encoded."""
    if type(obj) is RawObject:
        return obj.raw
    return dumps(obj)


def plain(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A plain-dict view of an object for code that walks the whole tree (shared: do not modify)."""
    if type(obj) is RawObject:
        return obj.to_dict()
    return obj


def identity_metadata(obj: RawObject) -> dict[str, str]:
    """A metadata mapping with only the object's name, namespace, uid and resourceVersion."""
    meta = {"name": obj.name, "uid": obj.uid, "resourceVersion": obj.resource_version}
    if obj.namespace:
        meta["namespace"] = obj.namespace
    return meta


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` when cluster-scoped); ``""`` without a name."""
    if type(obj) is RawObject:
        return obj.key
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "")
    return f"{namespace}/{name}" if namespace else name


def object_identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(uid, resourceVersion)`` of an object, ``""`` for what it lacks."""
    if type(obj) is RawObject:
        return obj.uid, obj.resource_version
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "", ""
    return str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
