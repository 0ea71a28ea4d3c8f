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
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, overload

import msgspec
import orjson

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


_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
"""What msgspec raises for bytes that are not JSON: invalid UTF-8 in a key surfaces as a
UnicodeDecodeError rather than a DecodeError (found by fuzzing)."""


class RawObjectError(ValueError):
    """Bytes that are not a JSON object with a ``metadata`` mapping."""


class _Head(msgspec.Struct):
    apiVersion: str | None = None  # None: absent (filled in for List items), "" is kept as sent
    kind: str | None = None
    metadata: msgspec.Raw = msgspec.Raw(b"")


class _EventHead(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    object: _Head


class _Ident(msgspec.Struct):
    """What the bridge needs of every object's metadata; the rest is decoded on demand."""

    name: str | None = ""
    namespace: str | None = ""
    uid: str | None = ""
    resourceVersion: str | None = ""
    managedFields: msgspec.Raw = msgspec.Raw(b"")


class _MetaOnly(msgspec.Struct):
    metadata: dict[str, Any] = {}


class _ManagedFieldsEntry(msgspec.Struct):
    """What attribution needs of one ``metadata.managedFields`` entry (``fieldsV1`` is skipped)."""

    manager: str | None = ""
    operation: str | None = ""
    subresource: str | None = ""
    time: str | None = ""


class Change(NamedTuple):
    """The newest ``metadata.managedFields`` entry: who last wrote the object, and when.

    ``time`` is the RFC 3339 timestamp the API server recorded (whole seconds, e.g.
    ``2024-05-01T12:00:00Z``); ``subresource`` is ``""`` for the main resource."""

    manager: str
    operation: str
    subresource: str
    time: str


def _newest(entries: Iterable[Any]) -> Change | None:
    """The entry with the greatest ``time`` (the last one listed among equals); None without any
    timed entry. RFC 3339 UTC timestamps of one precision compare as strings."""
    best: tuple[Any, Any, Any, str] | None = None
    typed = False
    for e in entries:
        if type(e) is _ManagedFieldsEntry:
            manager, operation, subresource, when = e.manager, e.operation, e.subresource, e.time
        elif isinstance(e, Mapping):
            manager, operation = e.get("manager"), e.get("operation")
            subresource, when = e.get("subresource"), e.get("time")
        else:
            continue
        if type(when) is not str and not isinstance(when, str):
            continue
        if when and (best is None or when >= best[3]):
            best = (manager, operation, subresource, when)
            typed = type(e) is _ManagedFieldsEntry
    if best is None:
        return None
    # One Change per distinct (writer, second), shared by the objects it wrote then (a look-up per
    # object instead of three interns and a tuple; a busy writer writes many objects a second).
    # Only for decoded entries, whose values are str or None (a plain mapping's could be anything).
    change = _changes.get(best) if typed else None
    if change is None:
        manager, operation, subresource, when = best
        change = Change(_intern(str(manager or "")), _intern(str(operation or "")),
                        _intern(str(subresource or "")), when)
        if typed:
            if len(_changes) >= _MAX_CHANGES:
                _changes.clear()
            _changes[best] = change
    return change


_changes: dict[tuple[Any, Any, Any, str], Change] = {}
"""The Change of each (manager, operation, subresource, time) decoded lately."""
_MAX_CHANGES = 4096


_head_decoder = msgspec.json.Decoder(_Head)
_ident_decoder = msgspec.json.Decoder(_Ident)
_event_head_decoder = msgspec.json.Decoder(_EventHead)
_meta_only_decoder = msgspec.json.Decoder(_MetaOnly)
_managed_fields_decoder = msgspec.json.Decoder(list[_ManagedFieldsEntry])
_object_decoder = msgspec.json.Decoder(dict[str, Any])
_MF_KEY = b'"managedFields":'
_MF_KEY_LEN = len(_MF_KEY)
_META_KEY = b'"metadata":'
_META_KEY_LEN = len(_META_KEY)
_EVENT_PREFIXES: dict[str, tuple[bytes, int]] = {
    t: (p, len(p)) for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
    for p in (b'{"type":"' + t.encode() + b'","object":',)
}
"""The start of a watch line of each event type, as API servers write it, and its length."""
_intern = sys.intern
_new_raw_object = object.__new__


class RawObject(Mapping[str, Any]):
    """One Kubernetes object as JSON bytes (see the module docstring).

    ``raw`` is the object's JSON. ``name``, ``namespace``, ``uid`` and ``resource_version`` are its
    metadata's (``""`` when absent), read when the object is decoded from the wire; ``metadata`` and
    the rest of the tree are decoded when first read.
    """

    __slots__ = (
        "_meta", "_obj", "change", "key", "malformed", "managed_fields", "name", "namespace", "quarantined",
        "raw", "resource_version", "uid",
    )

    raw: bytes
    name: str
    namespace: str
    uid: str
    resource_version: str
    managed_fields: bool
    """Whether ``raw`` still holds ``metadata.managedFields``."""
    change: Change | None
    """The newest managedFields entry, read before they were cut (None: the object had none)."""
    key: str
    """``namespace/name`` (``name`` when cluster-scoped), derived once when the object is built: the
    queue, the cache, the tracker and the sinks all read it (docs/performance.md, "Facts derived
    once")."""
    malformed: str
    """``""``, or why the object as the API server sent it was not decoded (``depth``, ``size``:
    :mod:`bridge.kube.bounded`): ``raw`` is then its identity alone."""
    quarantined: bytes
    """The bytes of a malformed object as they came (``b""`` otherwise). Only the instance the decode
    made holds them, for the sinks' dead letters: :meth:`fresh` (what a cache keeps) leaves them out."""

    def __init__(
        self,
        raw: bytes,
        metadata: dict[str, Any] | None = None,
        *,
        identity: tuple[str, str, str, str, bool] | None = None,
        change: Change | None = None,
    ) -> None:
        """``identity``: ``(name, namespace, uid, resourceVersion, has managedFields)`` when the caller
        knows them; otherwise they are read from ``metadata`` (decoded from ``raw`` if not given),
        and so is ``change`` when not given."""
        self.raw = raw
        self._obj: dict[str, Any] | None = None
        self._meta = metadata
        if identity is None:
            meta = self.metadata
            identity = (
                str(meta.get("name") or ""), str(meta.get("namespace") or ""), str(meta.get("uid") or ""),
                str(meta.get("resourceVersion") or ""), "managedFields" in meta,
            )
            if change is None:
                entries = meta.get("managedFields")
                change = _newest(entries) if isinstance(entries, list) else None
        name, namespace, self.uid, self.resource_version, self.managed_fields = identity
        self.name = name
        self.namespace = namespace
        self.key = f"{namespace}/{name}" if namespace else name
        self.change = change
        self.malformed = ""
        self.quarantined = b""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], change: Change | None = None) -> RawObject:
        """The RawObject of a decoded object (encodes it once); ``change`` when its managedFields
        were already dropped (else read from them)."""
        if type(obj) is RawObject:
            return obj
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            raise RawObjectError("a Kubernetes object needs a metadata mapping")
        return cls(bytes(memoryview(dumps(obj))), dict(meta), change=change)

    @property
    def identity(self) -> tuple[str, str, str, str, bool]:
        return self.name, self.namespace, self.uid, self.resource_version, self.managed_fields

    # ---- identity and body ----------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The decoded ``metadata`` (shared: do not modify)."""
        meta = self._meta
        if meta is None:
            obj = self._obj
            try:
                if obj is not None:
                    found = obj.get("metadata")
                    meta = found if isinstance(found, dict) else {}
                else:
                    meta = _meta_only_decoder.decode(self.raw).metadata
            except _DECODE_ERRORS as e:
                raise RawObjectError(f"not a Kubernetes object: {e}") from e
            self._meta = meta
        return meta

    def to_dict(self) -> dict[str, Any]:
        """The whole object decoded (once per instance; shared: do not modify)."""
        obj = self._obj
        if obj is None:
            obj = self._obj = self.copy_dict()
        return obj

    def copy_dict(self) -> dict[str, Any]:
        """A freshly decoded copy of the object, the caller's to change. msgspec, not ``orjson.loads``
        (as fast on objects of 4.5 to 20 KB): an integer beyond 64 bits stays the exact integer, where
        orjson rounds it to a float; :func:`dumps` writes it back as it came."""
        try:
            decoded: dict[str, Any] = _object_decoder.decode(self.raw)
        except (*_DECODE_ERRORS, RecursionError) as e:
            raise RawObjectError(f"not a Kubernetes object: {e}") from e
        return decoded

    def fresh(self) -> RawObject:
        """Another instance over the same bytes with nothing decoded yet (what a cache hands out, so
        that no reader's decoding stays attached to the cached object). Copies the derived facts
        as they are: nothing is derived again."""
        new = _new_raw_object(RawObject)
        new.raw = self.raw
        new._obj = None
        new._meta = None
        new.name = self.name
        new.namespace = self.namespace
        new.uid = self.uid
        new.resource_version = self.resource_version
        new.managed_fields = self.managed_fields
        new.key = self.key
        new.change = self.change
        new.malformed = self.malformed
        new.quarantined = b""
        return new

    def without_managed_fields(self) -> RawObject:
        """The object without ``metadata.managedFields`` (``self`` when it has none)."""
        if not self.managed_fields:
            return self
        cut = _cut_managed_fields(self.raw)
        if cut is not None:
            return cut
        return RawObject.from_dict(dict_without_managed_fields(self.to_dict()), self.change)

    # ---- Mapping --------------------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        if key == "metadata":
            return self.metadata
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        if key == "metadata":
            return self.metadata
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        if key == "metadata":
            return True
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if type(other) is RawObject:
            return self.raw == other.raw or self.to_dict() == other.to_dict()
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> RawObject:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RawObject:
        return self  # immutable

    def __reduce__(self) -> tuple[Any, ...]:
        if self.malformed:
            return (_rebuild, (self.raw, self.change, self.malformed))
        return (_rebuild, (self.raw, self.change))

    def __repr__(self) -> str:
        meta = self.metadata
        ns = meta.get("namespace")
        name = f"{ns}/{meta.get('name')}" if ns else meta.get("name")
        return f"RawObject({name!r}, rv={self.resource_version!r}, {len(self.raw)} bytes)"


def _rebuild(raw: bytes, change: Change | None, malformed: str = "") -> RawObject:
    obj = RawObject(raw)
    if change is not None:
        obj.change = change
    obj.malformed = malformed
    return obj


def last_change(obj: Mapping[str, Any]) -> Change | None:
    """The newest ``metadata.managedFields`` entry of ``obj``: a RawObject's recorded one (read
    before its managedFields were cut), else read from the object's metadata; None without any."""
    if type(obj) is RawObject:
        return obj.change
    meta = obj.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    return _newest(entries) if isinstance(entries, list) else None


@overload
def dict_without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]: ...


@overload
def dict_without_managed_fields(obj: Mapping[str, Any]) -> Mapping[str, Any]: ...


def dict_without_managed_fields(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A decoded object without ``metadata.managedFields``: ``obj`` itself when it has none, else a
    shallow copy with a copied ``metadata`` (the input is never mutated)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    out = dict(obj)
    out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


def _metadata_span(raw: bytes, meta_raw: bytes) -> int:
    """Where the top-level metadata value starts in ``raw`` (-1 if it cannot be located exactly)."""
    start = 0
    while True:
        i = raw.find(_META_KEY, start)
        if i < 0:
            return -1
        j = i + _META_KEY_LEN
        while raw[j : j + 1] in (b" ", b"\n", b"\t", b"\r"):
            j += 1
        if raw.startswith(meta_raw, j):
            return j
        start = i + 1


def _cut_managed_fields(raw: bytes) -> RawObject | None:
    """``raw`` without ``metadata.managedFields``, by cutting that member out of the bytes; None when
    the bytes are not laid out as expected (the caller then decodes and re-encodes)."""
    try:
        head = _head_decoder.decode(raw)
    except _DECODE_ERRORS:
        return None
    return _build(raw, head, drop_managed_fields=True, api_version="", kind="")


def _build(
    raw: bytes, head: _Head, *, drop_managed_fields: bool, api_version: str, kind: str
) -> RawObject | None:
    """The RawObject of ``raw`` whose top level ``head`` decoded, working on the bytes; None when they
    are not laid out so that this is exact (the caller then decodes and re-encodes)."""
    meta_raw = bytes(head.metadata)
    if not (meta_raw[:1] == b"{" and raw[:1] == b"{"):
        return None
    try:
        ident = _ident_decoder.decode(meta_raw)
    except _DECODE_ERRORS:
        return None
    mf = ident.managedFields
    has_mf = True if mf else False  # noqa: SIM210 - not bool(): one call less per object
    change: Change | None = None
    if has_mf:
        try:
            change = _newest(_managed_fields_decoder.decode(mf))
        except msgspec.DecodeError:
            change = None  # not a list of entries: no attribution, the object itself is kept
    if drop_managed_fields and has_mf:
        cut = _cut_member(meta_raw, _MF_KEY, bytes(mf))
        # Another managedFields member left (a duplicate key, or one nested deeper): not exact.
        if cut is None or _MF_KEY in cut:
            return None
        at = _metadata_span(raw, meta_raw)
        if at < 0:
            return None
        # Only objects (no nesting) before it: it is the top-level metadata. Otherwise the same
        # bytes could also sit nested in an earlier member: then they must occur once only.
        if raw.find(b"{", 1, at) >= 0 and raw.find(meta_raw, at + 1) >= 0:
            return None
        parts = [raw[:at], cut, raw[at + len(meta_raw) :]]
        has_mf = False
    else:
        parts = [raw]
    prefix = b""
    if api_version and head.apiVersion is None:
        prefix += b'"apiVersion":' + orjson.dumps(api_version) + b","
    if kind and head.kind is None:
        prefix += b'"kind":' + orjson.dumps(kind) + b","
    if prefix:
        parts[0] = b"{" + prefix + parts[0][1:]
    raw = b"".join(parts) if parts[1:] else parts[0]
    # RawObject(raw, identity=…, change=…) without the call: every watch event comes this way.
    obj = _new_raw_object(RawObject)
    obj.raw = raw
    obj._obj = None
    obj._meta = None
    obj.name = name = ident.name or ""
    namespace = ident.namespace or ""
    # A table rather than sys.intern: no call for a namespace seen before.
    namespace = _namespaces[namespace] if namespace in _namespaces else _new_namespace(namespace)
    obj.namespace = namespace
    obj.uid = ident.uid or ""
    obj.resource_version = ident.resourceVersion or ""
    obj.managed_fields = has_mf
    obj.key = f"{namespace}/{name}" if namespace else name
    obj.change = change
    obj.malformed = ""
    obj.quarantined = b""
    return obj


_namespaces: dict[str, str] = {}
"""Each namespace decoded lately, interned: the objects of one namespace share its string."""


def _new_namespace(namespace: str) -> str:
    if len(_namespaces) >= _MAX_CHANGES:
        _namespaces.clear()
    interned = _namespaces[namespace] = _intern(namespace)
    return interned


def _cut_member(obj_raw: bytes, key: bytes, value: bytes) -> bytes | None:
    """``obj_raw`` (a compact JSON object) without the member ``key`` whose value is ``value``."""
    start = 0
    key_len = _MF_KEY_LEN if key is _MF_KEY else len(key)
    value_len = len(value)
    while True:
        i = obj_raw.find(key, start)
        if i < 0:
            return None
        j = i + key_len
        end = j + value_len
        if (obj_raw[j:end] == value and obj_raw[i - 1 : i] in (b"{", b",")
                and obj_raw[end : end + 1] in (b",", b"}")):
            if obj_raw[end : end + 1] == b",":
                return obj_raw[:i] + obj_raw[end + 1 :]
            if obj_raw[i - 1 : i] == b",":
                return obj_raw[: i - 1] + obj_raw[end:]
            return obj_raw[:i] + obj_raw[end:]
        start = i + 1


def decode_object(
    raw: bytes | msgspec.Raw,
    *,
    api_version: str = "",
    kind: str = "",
    drop_managed_fields: bool = False,
) -> RawObject:
    """A :class:`RawObject` from an object's JSON as the API server sent it.

    ``api_version`` / ``kind`` are filled in when the object lacks them (items of a List carry
    neither on the wire); ``drop_managed_fields`` cuts ``metadata.managedFields`` out of the bytes.
    Raises :class:`RawObjectError` for anything but a JSON object with a ``metadata`` mapping.
    """
    data = raw if type(raw) is bytes else bytes(raw)
    if not data.isascii():
        # Kept as they came, the bytes must be JSON, hence UTF-8 (msgspec skips what it does not read).
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RawObjectError(f"not a Kubernetes object: not UTF-8 (byte {e.start})") from e
    try:
        head = _head_decoder.decode(data)
    except _DECODE_ERRORS as e:
        raise RawObjectError(f"not a Kubernetes object: {e}") from e
    built = _build(data, head, drop_managed_fields=drop_managed_fields, api_version=api_version, kind=kind)
    if built is not None:
        return built
    if not len(head.metadata):
        raise RawObjectError("a Kubernetes object needs a metadata mapping")
    # Laid out unlike the API server's compact JSON (whitespace, duplicate keys …): decode and
    # re-encode once, with msgspec both ways: it keeps every number as it was (orjson would turn
    # an integer beyond 64 bits into a float, and refuse to encode it back).
    try:
        obj = _object_decoder.decode(data)
    except _DECODE_ERRORS as e:
        raise RawObjectError(f"not a Kubernetes object: {e}") from e
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise RawObjectError("a Kubernetes object needs a metadata mapping")
    change = last_change(obj)
    if drop_managed_fields:
        obj = dict_without_managed_fields(obj)
        meta = obj["metadata"]
    if api_version and "apiVersion" not in obj:
        obj["apiVersion"] = api_version
    if kind and "kind" not in obj:
        obj["kind"] = kind
    return RawObject(msgspec.json.encode(obj), dict(meta), change=change)


def decode_watch_object(line: bytes, *, drop_managed_fields: bool = False) -> tuple[str, RawObject] | None:
    """``(type, object)`` of a watch event line laid out as API servers write them,
    ``{"type":"…","object":{…}}``, in one pass over the line; None for anything else (another
    layout, an object without metadata, not JSON …), which the caller then decodes the long way."""
    try:
        head = _event_head_decoder.decode(line)
    except _DECODE_ERRORS:
        return None
    # (Slices and subscripts rather than method calls: this runs for every watch event.)
    body = line if line[-1:] == b"}" else line.rstrip()
    try:
        prefix, n = _EVENT_PREFIXES[head.type]
    except KeyError:
        prefix = b'{"type":' + orjson.dumps(head.type) + b',"object":'
        n = len(prefix)
    if not (body[:n] == prefix and body[-1:] == b"}"):
        return None
    # The line is valid JSON with exactly the members type and object, starting with type: what
    # lies between the prefix and the final brace is the object.
    raw = body[n:-1]
    built = _build(raw, head.object, drop_managed_fields=drop_managed_fields, api_version="", kind="")
    return None if built is None else (head.type, built)


def _default(value: Any) -> Any:
    if type(value) is RawObject:
        return orjson.Fragment(value.raw)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def dumps(value: Any, option: int | None = None) -> bytes:
    """``orjson.dumps`` that writes a :class:`RawObject` (anywhere in ``value``) as its bytes,
    without decoding it. An integer beyond 64 bits (which orjson refuses) is written exactly, by
    msgspec (:func:`_exact_dumps`)."""
    try:
        if option is None:
            return orjson.dumps(value, default=_default)
        return orjson.dumps(value, default=_default, option=option)
    except TypeError as e:
        if "64-bit" not in str(e):
            raise
        return _exact_dumps(value, option or 0)


_EXACT_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def _exact_hook(value: Any) -> Any:
    if type(value) is RawObject:
        return msgspec.Raw(value.raw)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _exact_dumps(value: Any, option: int) -> bytes:
    """What :func:`dumps` writes for a value holding an integer beyond 64 bits: msgspec keeps Python's
    integers exact. Of orjson's options it honours the two the bridge uses (sorted keys, a newline)."""
    if option & ~_EXACT_OPTIONS:
        raise TypeError(f"an integer beyond 64 bits cannot be written with orjson options {option:#x}")
    encoder = _sorted_encoder if option & orjson.OPT_SORT_KEYS else _exact_encoder
    out = encoder.encode(value)
    return out + b"\n" if option & orjson.OPT_APPEND_NEWLINE else out


_exact_encoder = msgspec.json.Encoder(enc_hook=_exact_hook)
_sorted_encoder = msgspec.json.Encoder(enc_hook=_exact_hook, order="sorted")


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
