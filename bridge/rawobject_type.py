"""The :class:`RawObject` type: one Kubernetes object as its JSON bytes, its facts read once.

A RawObject holds the object's JSON as the API server sent it (minus ``metadata.managedFields`` when
the informer drops them) and the facts every stage needs, derived once when it is built: ``name``,
``namespace``, ``uid``, ``resource_version``, ``key`` and the last writer (:attr:`RawObject.change`).
``metadata`` and the rest of the tree are decoded on first read, and only then. It is a read-only
``Mapping``, so code written for decoded dicts works on it unchanged (:mod:`bridge.rawobject`).

Here too are what must know the type's slots, and so live with it: the build of an instance from
its bytes and metadata facts (:func:`assemble`, where every watch event and List item ends), the
plain path's build from bytes laid out as API servers write them (:func:`build_from_bytes`;
:mod:`bridge.rawobject_decode` reads the wire around it; :mod:`bridge.watchline` is the one pass
taken before it), and its writing back as its bytes (:func:`dumps`, which splices them in with
``orjson.Fragment``).

Invariants: a RawObject is immutable (informer caches share it with every handler): no setters, and
the dict :meth:`RawObject.to_dict` returns is shared by every reader of that instance
(:meth:`RawObject.copy_dict` gives a private copy). Its bytes are always one JSON object; the
derived facts always agree with them. The build makes no call per object it can avoid: it fills the
slots itself rather than calling ``__init__``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import orjson

from bridge.managed_fields import (
    Change,
    decode_entries,
    dict_without_managed_fields,
    newest_change,
    splice_out_managed_fields,
)

__all__ = [
    "DECODE_ERRORS",
    "NAMESPACES",
    "Head",
    "Ident",
    "RawObject",
    "RawObjectError",
    "assemble",
    "build_from_bytes",
    "dumps",
    "head_decoder",
    "new_namespace",
    "object_decoder",
]


DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
"""What msgspec raises for bytes that are not JSON: invalid UTF-8 in a key surfaces as a
UnicodeDecodeError rather than a DecodeError (found by fuzzing)."""


class RawObjectError(ValueError):
    """Bytes that are not a JSON object with a ``metadata`` mapping."""


class Head(msgspec.Struct):
    """An object's top level as the build reads it: its type, and its metadata's bytes."""

    apiVersion: str | None = None  # None: absent (filled in for List items), "" is kept as sent
    kind: str | None = None
    metadata: msgspec.Raw = msgspec.Raw(b"")


class Ident(msgspec.Struct):
    """What the bridge needs of every object's metadata (``managedFields`` as their bytes); the rest
    is decoded on demand."""

    name: str | None = ""
    namespace: str | None = ""
    uid: str | None = ""
    resourceVersion: str | None = ""
    managedFields: msgspec.Raw = msgspec.Raw(b"")


class _MetaOnly(msgspec.Struct):
    metadata: dict[str, Any] = {}


head_decoder = msgspec.json.Decoder(Head)
_ident_decoder = msgspec.json.Decoder(Ident)
_meta_only_decoder = msgspec.json.Decoder(_MetaOnly)
object_decoder = msgspec.json.Decoder(dict[str, Any])
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
                change = newest_change(entries) if isinstance(entries, list) else None
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
            except DECODE_ERRORS as e:
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
            decoded: dict[str, Any] = object_decoder.decode(self.raw)
        except (*DECODE_ERRORS, RecursionError) as e:
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


def _cut_managed_fields(raw: bytes) -> RawObject | None:
    """``raw`` without ``metadata.managedFields``, by cutting that member out of the bytes; None when
    the bytes are not laid out as expected (the caller then decodes and re-encodes)."""
    try:
        head = head_decoder.decode(raw)
    except DECODE_ERRORS:
        return None
    return build_from_bytes(raw, head, drop_managed_fields=True, api_version="", kind="")


def build_from_bytes(
    raw: bytes, head: Head, *, drop_managed_fields: bool, api_version: str, kind: str
) -> RawObject | None:
    """The RawObject of ``raw`` whose top level ``head`` decoded, working on the bytes; None when they
    are not laid out so that this is exact (the caller then decodes and re-encodes). ``api_version``
    and ``kind`` are written in when the object lacks them; ``drop_managed_fields`` cuts
    ``metadata.managedFields`` out, once their newest entry is read."""
    meta_raw = bytes(head.metadata)
    if not (meta_raw[:1] == b"{" and raw[:1] == b"{"):
        return None
    try:
        ident = _ident_decoder.decode(meta_raw)
    except DECODE_ERRORS:
        return None
    mf = ident.managedFields
    has_mf = True if mf else False  # noqa: SIM210 - not bool(): one call less per object
    change: Change | None = None
    if has_mf:
        try:
            change = newest_change(decode_entries(mf))
        except msgspec.DecodeError:
            change = None  # not a list of entries: no attribution, the object itself is kept
    if drop_managed_fields and has_mf:
        parts = splice_out_managed_fields(raw, meta_raw, bytes(mf))
        if parts is None:
            return None
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
    return assemble(raw, ident, has_mf, change)


def assemble(raw: bytes, ident: Ident, has_mf: bool, change: Change | None) -> RawObject:
    """The RawObject of the bytes ``raw`` whose metadata facts are ``ident`` (``has_mf``: ``raw``
    still holds managedFields; ``change``: their newest entry), every slot filled without calling
    ``__init__``: every watch event and List item is built here."""
    obj = _new_raw_object(RawObject)
    obj.raw = raw
    obj._obj = None
    obj._meta = None
    obj.name = name = ident.name or ""
    namespace = ident.namespace or ""
    # A table rather than sys.intern: no call for a namespace seen before.
    namespace = NAMESPACES[namespace] if namespace in NAMESPACES else new_namespace(namespace)
    obj.namespace = namespace
    obj.uid = ident.uid or ""
    obj.resource_version = ident.resourceVersion or ""
    obj.managed_fields = has_mf
    obj.key = f"{namespace}/{name}" if namespace else name
    obj.change = change
    obj.malformed = ""
    obj.quarantined = b""
    return obj


NAMESPACES: dict[str, str] = {}
"""Each namespace decoded lately, interned: the objects of one namespace share its string (read
directly by the builds, :func:`new_namespace` only for a namespace not in it)."""
_MAX_NAMESPACES = 4096


def new_namespace(namespace: str) -> str:
    """``namespace`` interned and entered in :data:`NAMESPACES` (emptied when full)."""
    if len(NAMESPACES) >= _MAX_NAMESPACES:
        NAMESPACES.clear()
    interned = NAMESPACES[namespace] = _intern(namespace)
    return interned


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
