"""The informer's local cache: a keyed store with named secondary indices.

This is the bridge's version of client-go's ``store.go`` + ``thread_safe_store.go`` + ``index.go``.
The informer writes to it (always before notifying anyone), the RealFIFO consults it as its
``known_objects`` to detect deletions missed while the watch was down, and the listers read it so the
bridge and its users query local state instead of the API server.

Everything runs on one asyncio loop, so no locking is needed: every method here is synchronous and
therefore atomic with respect to other coroutines.

Objects are stored by reference, never copied: the informer replaces objects, it never mutates them in
place, and neither may readers. In compact mode objects are stored as their JSON bytes instead
(:class:`~bridge.rawobject.RawObject`), and every read hands out a fresh RawObject over those bytes,
decoded only as far as the reader looks into it.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from bridge.contracts import DeletedFinalStateUnknown, IndexFunc, KeyFunc, KubeObject, ObjectKey
from bridge.rawobject import RawObject

__all__ = [
    "NAMESPACE_INDEX",
    "IndexConflictError",
    "IndexedCache",
    "ObjectKeyError",
    "UnknownIndexError",
    "meta_namespace_index_func",
    "meta_namespace_key_func",
    "split_meta_namespace_key",
]

NAMESPACE_INDEX = "namespace"
"""The name of the index every cache has by default: objects by ``metadata.namespace``."""


class ObjectKeyError(KeyError, ValueError):
    """An object has no key: it is not a mapping, or lacks ``metadata.name``.

    A ``KeyError`` (the key is missing) and a ``ValueError`` (the argument is malformed), so callers
    may catch either.
    """

    def __str__(self) -> str:
        # KeyError's own __str__ shows the repr of its argument; show the plain message instead.
        return str(self.args[0]) if self.args else ""


class UnknownIndexError(KeyError):
    """A query named an index the cache does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IndexConflictError(ValueError):
    """``add_indexers`` was given a name that is already in use."""


def _metadata(obj: Any) -> Mapping[str, Any]:
    # Objects are dicts or RawObjects: check those first (an ABC isinstance check costs ~10x more).
    kind = type(obj)
    if kind is RawObject:
        return obj.metadata  # type: ignore[no-any-return]
    if kind is dict:
        meta = obj.get("metadata")
        if type(meta) is dict:
            return meta
    if not isinstance(obj, Mapping):
        raise ObjectKeyError(
            f"cannot compute a key for a {type(obj).__name__}: expected a Kubernetes object (a dict "
            "with metadata.name) or a DeletedFinalStateUnknown"
        )
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ObjectKeyError(
            f"object of kind {obj.get('kind', '?')!r} has no metadata; every cached object needs "
            "metadata.name"
        )
    return meta


def meta_namespace_key_func(obj: Any) -> ObjectKey:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones.

    A :class:`DeletedFinalStateUnknown` yields its own ``key``. Raises :class:`ObjectKeyError` for an
    object without ``metadata.name``.
    """
    if type(obj) is RawObject:
        if obj.name:
            return ObjectKey(obj.key)
    elif isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    meta = _metadata(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectKeyError(
            f"object of kind {obj.get('kind', '?')!r} has no metadata.name (generateName objects "
            "must be created on the server before they can be cached)"
        )
    namespace = meta.get("namespace")
    if namespace:
        return ObjectKey(f"{namespace}/{name}")
    return ObjectKey(name)


def split_meta_namespace_key(key: str) -> tuple[str, str]:
    """Splits a key made by :func:`meta_namespace_key_func` into ``(namespace, name)``.

    A cluster-scoped key gives ``("", name)``; a key with more than one ``/`` is a ValueError.
    """
    parts = key.split("/")
    if len(parts) == 1:
        return "", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"unexpected object key format {key!r}: expected 'namespace/name' or 'name'")


def meta_namespace_index_func(obj: KubeObject) -> list[str]:
    """The default index function: the object's namespace (``""`` for cluster-scoped objects)."""
    if type(obj) is RawObject:
        return [obj.namespace]
    meta = _metadata(obj)
    return [str(meta.get("namespace") or "")]


class IndexedCache:
    """A keyed object cache with named indices (client-go's ``cache.NewIndexer``).

    ``add`` and ``update`` are the same operation: the object replaces whatever was stored under its
    key, and every index is updated (values the old object had and the new one has not are removed;
    a value left with no keys is dropped). Deleting a missing key is a no-op. ``replace`` swaps the
    whole content and rebuilds the indices.

    ``compact=True`` keeps each object as its JSON bytes (a :class:`~bridge.rawobject.RawObject`
    holding only the bytes, uid and resourceVersion) instead of a dict tree: a Pod as a Python dict
    costs several times its JSON size, as bytes about its JSON size. A RawObject is stored as it
    came (no encoding), a dict is encoded once; reads hand out a fresh RawObject each time, decoded
    only as far as the reader looks. The index values of every key are kept (interned, so objects
    sharing them share one tuple), so updating an index never needs to decode the previous object.
    """

    __slots__ = (
        "_by_namespace", "_compact", "_default_key", "_index_values", "_indexers", "_indices", "_intern",
        "_items", "_key_func",
    )

    def __init__(
        self,
        *,
        key_func: KeyFunc = meta_namespace_key_func,
        indexers: dict[str, IndexFunc] | None = None,
        compact: bool = False,
    ) -> None:
        self._key_func = key_func
        self._compact = compact
        # key -> the object (a dict, or its JSON bytes when compact).
        self._items: dict[ObjectKey, Any] = {}
        self._indexers: dict[str, IndexFunc] = (
            {NAMESPACE_INDEX: meta_namespace_index_func} if indexers is None else dict(indexers)
        )
        # index name -> index value -> keys of the objects having that value.
        self._indices: dict[str, dict[str, set[ObjectKey]]] = {name: {} for name in self._indexers}
        # key -> the object's values for every index, in self._indexers order.
        self._index_values: dict[ObjectKey, _IndexValues] = {}
        self._intern: dict[_IndexValues, _IndexValues] = {}
        self._default_key = key_func is meta_namespace_key_func
        """Whether a RawObject's key is its own ``key`` (derived once when it was decoded)."""
        self._by_namespace: dict[str, _IndexValues] | None = None
        self._namespace_only_index()

    def _namespace_only_index(self) -> None:
        """With the default index alone, a RawObject's index values follow from its namespace: they
        are looked up per namespace (``_by_namespace``) instead of calling the index function."""
        only = len(self._indexers) == 1 and self._indexers.get(NAMESPACE_INDEX) is meta_namespace_index_func
        self._by_namespace = {} if only else None

    @property
    def compact(self) -> bool:
        return self._compact

    def _encode(self, obj: KubeObject) -> Any:
        return _to_raw(obj) if self._compact else obj

    def _decode(self, stored: Any) -> KubeObject:
        if self._compact:
            return stored.fresh()  # type: ignore[no-any-return]
        return stored  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ Store

    def add(self, obj: KubeObject) -> None:
        """Stores ``obj`` under its key, replacing any previous object, and updates every index.

        An index function that raises leaves the cache unchanged.
        """
        if type(obj) is RawObject and self._default_key and obj.name:
            self.store(obj.key, obj)  # type: ignore[arg-type]
        else:
            self.store(self._key_func(obj), obj)

    def store(self, key: ObjectKey, obj: KubeObject) -> KubeObject | None:
        """:meth:`add` with the object's key already derived (by the caller, from the same key
        function): the informer's cache update does not derive it again. Returns the object stored
        under ``key`` before (None if none) as it was kept: no fresh copy of it, since the cache no
        longer holds it (the informer's update hands it on as the change's old state)."""
        by_namespace = self._by_namespace
        if (by_namespace is not None and self._compact and type(obj) is dict
                and type(obj.get("metadata")) is dict):
            # A decoded object (a seed) for a compact cache: encoded once, then kept as a RawObject is.
            obj = RawObject.from_dict(obj)
        index_values = self._index_values
        old_values = index_values[key] if key in index_values else None  # noqa: SIM401 - no call
        if by_namespace is not None and type(obj) is RawObject:
            # With the namespace index alone, the values follow from the namespace; subscripts rather
            # than get(), and a new key entered without _move: no call but the fresh instance's.
            namespace = obj.namespace
            if namespace in by_namespace:
                new_values = by_namespace[namespace]
            else:
                new_values = by_namespace[namespace] = self._values_of(obj)
            stored: Any = obj.fresh() if self._compact else obj
            if old_values is None:
                index = self._indices[NAMESPACE_INDEX]
                if namespace in index:
                    index[namespace].add(key)
                else:
                    index[namespace] = {key}
                index_values[key] = new_values
            elif old_values is not new_values and old_values != new_values:
                self._move(key, old_values, new_values)
        else:
            new_values = self._values_of(obj)
            stored = self._encode(obj)
            if old_values is not new_values and old_values != new_values:
                self._move(key, old_values, new_values)
        items = self._items
        old: KubeObject | None = items[key] if key in items else None  # noqa: SIM401 - no call
        items[key] = stored
        return old

    swap = store
    """:meth:`store`, named for the informer's update, which uses the object it returns."""

    def update(self, obj: KubeObject) -> None:
        self.add(obj)

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        """Removes the object's key (a tombstone's ``key``); a missing key is a no-op."""
        self.delete_key(self._key_func(obj))

    def delete_key(self, key: ObjectKey) -> None:
        """Removes ``key`` if present (for callers that hold only the key)."""
        if key not in self._items:
            return
        self._move(key, self._index_values.get(key), None)
        del self._items[key]

    def list(self) -> builtins.list[KubeObject]:
        if self._compact:
            return [v.fresh() for v in self._items.values()]
        return builtins.list(self._items.values())

    def list_keys(self) -> builtins.list[ObjectKey]:
        return builtins.list(self._items)

    def get(self, obj: KubeObject) -> KubeObject | None:
        return self.get_by_key(self._key_func(obj))

    def get_by_key(self, key: ObjectKey) -> KubeObject | None:
        stored = self._items.get(key)
        if stored is None or not self._compact:
            return stored
        return stored.fresh()  # type: ignore[no-any-return]

    def snapshot(self) -> Sequence[KubeObject]:
        """Every object as of now, decoded lazily: holding the snapshot costs what the cache does
        (the stored values are shared, never copied), and each object is decoded when read."""
        values = builtins.list(self._items.values())
        return _LazyObjects(values) if self._compact else values

    def replace(self, items: Sequence[KubeObject], resource_version: str = "") -> None:
        """Swaps the whole content for ``items``; later duplicates of a key win. One pass over the
        items builds the new content and its indices, installed only once every item is keyed and
        indexed (a key or index function that raises leaves the cache unchanged)."""
        del resource_version  # a cache has no use for it; the RealFIFO does
        names = builtins.list(self._indexers)
        new_items: dict[ObjectKey, Any] = {}
        new_values: dict[ObjectKey, _IndexValues] = {}
        new_indices: dict[str, dict[str, set[ObjectKey]]] = {name: {} for name in names}
        key_func, default_key, compact = self._key_func, self._default_key, self._compact
        by_namespace = self._by_namespace
        encode = False  # a compact cache given other objects than RawObjects: encoded once keyed
        for obj in items:
            raw = type(obj) is RawObject
            key = obj.key if raw and default_key and obj.name else key_func(obj)  # type: ignore[attr-defined]
            if raw and by_namespace is not None:
                namespace = obj.namespace  # type: ignore[attr-defined]
                if namespace in by_namespace:
                    values = by_namespace[namespace]
                else:
                    values = by_namespace[namespace] = self._values_of(obj)
            else:
                values = self._values_of(obj)
            if key in new_values:
                _unindex(new_indices, names, key, new_values[key])
            new_values[key] = values
            for name, vals in zip(names, values, strict=True):
                index = new_indices[name]
                for value in vals:
                    if value in index:
                        index[value].add(key)
                    else:
                        index[value] = {key}
            if compact and raw:
                new_items[key] = obj.fresh()  # type: ignore[attr-defined]
            else:
                new_items[key] = obj
                encode = encode or compact
        if encode:
            new_items = {k: v if type(v) is RawObject else _to_raw(v) for k, v in new_items.items()}
        self._items = new_items
        self._index_values = new_values
        self._indices = new_indices

    def resync(self) -> None:
        """Nothing to do for a cache (only queues resync)."""

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    # ------------------------------------------------------------------ Indexer

    def index(self, index_name: str, obj: KubeObject) -> builtins.list[KubeObject]:
        """Objects sharing at least one of ``obj``'s values for the index, in key order."""
        index_func = self._index_func(index_name)
        index = self._indices[index_name]
        keys: set[ObjectKey] = set()
        for value in index_func(obj):
            keys.update(index.get(value, ()))
        return [self._decode(self._items[k]) for k in sorted(keys)]

    def index_keys(self, index_name: str, indexed_value: str) -> builtins.list[ObjectKey]:
        self._index_func(index_name)
        return sorted(self._indices[index_name].get(indexed_value, ()))

    def by_index(self, index_name: str, indexed_value: str) -> builtins.list[KubeObject]:
        """Objects whose index value is ``indexed_value``, in key order."""
        return [self._decode(self._items[k]) for k in self.index_keys(index_name, indexed_value)]

    def list_index_func_values(self, index_name: str) -> builtins.list[str]:
        """Every value present in the index, sorted."""
        self._index_func(index_name)
        return sorted(self._indices[index_name])

    def get_indexers(self) -> dict[str, IndexFunc]:
        """A copy of the index functions by name."""
        return dict(self._indexers)

    def has_index(self, index_name: str) -> bool:
        return index_name in self._indexers

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Adds indices and backfills them from the current content.

        Raises :class:`IndexConflictError` (a ValueError), changing nothing, when a name is already
        in use.
        """
        clash = sorted(set(indexers) & set(self._indexers))
        if clash:
            raise IndexConflictError(
                f"indexer name(s) already in use: {', '.join(clash)}; choose another name"
            )
        # Compute the new values completely before installing them, so that an index function that
        # raises leaves the cache unchanged.
        added: dict[ObjectKey, _IndexValues] = {}
        built: dict[str, dict[str, set[ObjectKey]]] = {name: {} for name in indexers}
        for key, stored in self._items.items():
            obj = self._decode(stored)
            extra = []
            for name, func in indexers.items():
                vals = _values(func, obj)
                extra.append(vals)
                for value in vals:
                    built[name].setdefault(value, set()).add(key)
            added[key] = self._interned(self._index_values.get(key, ()) + tuple(extra))
        self._indexers.update(indexers)
        self._indices.update(built)
        self._index_values = added
        self._namespace_only_index()

    # ------------------------------------------------------------------ internals

    def _index_func(self, index_name: str) -> IndexFunc:
        try:
            return self._indexers[index_name]
        except KeyError:
            known = ", ".join(sorted(self._indexers)) or "none"
            raise UnknownIndexError(
                f"index {index_name!r} does not exist (known indices: {known}); add it with add_indexers"
            ) from None

    def _interned(self, values: _IndexValues) -> _IndexValues:
        return self._intern.setdefault(values, values)

    def _values_of(self, obj: KubeObject) -> _IndexValues:
        """The object's values for every index, computed before anything changes, so that an index
        function that raises leaves the cache consistent."""
        return self._interned(tuple(_values(func, obj) for func in self._indexers.values()))

    def _move(self, key: ObjectKey, old: _IndexValues | None, new: _IndexValues | None) -> None:
        for i, name in enumerate(self._indexers):
            old_vals = old[i] if old is not None else frozenset()
            new_vals = new[i] if new is not None else frozenset()
            if old_vals == new_vals:
                continue
            index = self._indices[name]
            for value in old_vals - new_vals:
                keys = index.get(value)
                if keys is None:
                    continue
                keys.discard(key)
                if not keys:
                    del index[value]  # no empty sets: list_index_func_values shows live values only
            for value in new_vals - old_vals:
                index.setdefault(value, set()).add(key)
        if new is None:
            self._index_values.pop(key, None)
        else:
            self._index_values[key] = new


_IndexValues = tuple[frozenset[str], ...]


def _unindex(indices: dict[str, dict[str, set[ObjectKey]]], names: builtins.list[str], key: ObjectKey,
             values: _IndexValues) -> None:
    """``key`` out of ``indices`` under each of its ``values`` (no empty sets left)."""
    for name, vals in zip(names, values, strict=True):
        index = indices[name]
        for value in vals:
            keys = index[value]
            keys.discard(key)
            if not keys:
                del index[value]


def _to_raw(obj: KubeObject) -> RawObject:
    """What a compact cache keeps of an object: its bytes and identity, nothing decoded. Always an
    instance of its own: the object handed in travels on to the handlers, and whatever they decode
    of it must not stay attached to the cache."""
    if type(obj) is RawObject:
        return obj.fresh()
    return RawObject.from_dict(obj).fresh()


class _LazyObjects(Sequence[KubeObject]):
    """A read-only sequence over a compact cache's stored objects, handing out fresh RawObjects."""

    __slots__ = ("_values",)

    def __init__(self, values: builtins.list[RawObject]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> KubeObject: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[KubeObject]: ...

    def __getitem__(self, index: int | slice) -> KubeObject | Sequence[KubeObject]:
        if isinstance(index, slice):
            return _LazyObjects(self._values[index])
        return self._values[index].fresh()

    def __iter__(self) -> Iterator[KubeObject]:
        for v in self._values:
            yield v.fresh()


def _values(func: IndexFunc, obj: KubeObject | None) -> frozenset[str]:
    if obj is None:
        return frozenset()
    values: Iterable[str] = func(obj)
    return frozenset(values)
