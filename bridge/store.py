"""The informer's local cache: a keyed store with named secondary indices.

This is the bridge's version of client-go's ``store.go`` + ``thread_safe_store.go`` + ``index.go``.
The informer writes to it (always before notifying anyone), the DeltaFIFO consults it as its
``known_objects`` to detect deletions missed while the watch was down, and the listers read it so the
bridge and its users query local state instead of the API server.

Everything runs on one asyncio loop, so no locking is needed: every method here is synchronous and
therefore atomic with respect to other coroutines.

Objects are stored by reference, never copied: the informer replaces objects, it never mutates them in
place, and neither may readers.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bridge.contracts import DeletedFinalStateUnknown, IndexFunc, KeyFunc, KubeObject, ObjectKey

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
    if isinstance(obj, DeletedFinalStateUnknown):
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
    meta = _metadata(obj)
    return [str(meta.get("namespace") or "")]


class IndexedCache:
    """A keyed object cache with named indices (client-go's ``cache.NewIndexer``).

    ``add`` and ``update`` are the same operation: the object replaces whatever was stored under its
    key, and every index is updated (values the old object had and the new one has not are removed;
    a value left with no keys is dropped). Deleting a missing key is a no-op. ``replace`` swaps the
    whole content and rebuilds the indices.
    """

    __slots__ = ("_indexers", "_indices", "_items", "_key_func")

    def __init__(
        self,
        *,
        key_func: KeyFunc = meta_namespace_key_func,
        indexers: dict[str, IndexFunc] | None = None,
    ) -> None:
        self._key_func = key_func
        self._items: dict[ObjectKey, KubeObject] = {}
        self._indexers: dict[str, IndexFunc] = (
            {NAMESPACE_INDEX: meta_namespace_index_func} if indexers is None else dict(indexers)
        )
        # index name -> index value -> keys of the objects having that value.
        self._indices: dict[str, dict[str, set[ObjectKey]]] = {name: {} for name in self._indexers}

    # ------------------------------------------------------------------ Store

    def add(self, obj: KubeObject) -> None:
        """Stores ``obj`` under its key, replacing any previous object, and updates every index.

        An index function that raises leaves the cache unchanged.
        """
        key = self._key_func(obj)
        old = self._items.get(key)
        changes = self._index_changes(old, obj)
        self._items[key] = obj
        self._apply_index_changes(changes, key)

    def update(self, obj: KubeObject) -> None:
        self.add(obj)

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        """Removes the object's key (a tombstone's ``key``); a missing key is a no-op."""
        self.delete_key(self._key_func(obj))

    def delete_key(self, key: ObjectKey) -> None:
        """Removes ``key`` if present (for callers that hold only the key)."""
        old = self._items.get(key)
        if old is None:
            return
        changes = self._index_changes(old, None)
        del self._items[key]
        self._apply_index_changes(changes, key)

    def list(self) -> builtins.list[KubeObject]:
        return builtins.list(self._items.values())

    def list_keys(self) -> builtins.list[ObjectKey]:
        return builtins.list(self._items)

    def get(self, obj: KubeObject) -> KubeObject | None:
        return self._items.get(self._key_func(obj))

    def get_by_key(self, key: ObjectKey) -> KubeObject | None:
        return self._items.get(key)

    def replace(self, items: Sequence[KubeObject], resource_version: str = "") -> None:
        """Swaps the whole content for ``items``; later duplicates of a key win."""
        del resource_version  # a cache has no use for it; the DeltaFIFO does
        new_items: dict[ObjectKey, KubeObject] = {}
        for obj in items:
            new_items[self._key_func(obj)] = obj
        new_indices: dict[str, dict[str, set[ObjectKey]]] = {}
        for name, func in self._indexers.items():
            new_indices[name] = _build_index(func, new_items)
        self._items = new_items
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
        return [self._items[k] for k in sorted(keys)]

    def index_keys(self, index_name: str, indexed_value: str) -> builtins.list[ObjectKey]:
        self._index_func(index_name)
        return sorted(self._indices[index_name].get(indexed_value, ()))

    def by_index(self, index_name: str, indexed_value: str) -> builtins.list[KubeObject]:
        """Objects whose index value is ``indexed_value``, in key order."""
        return [self._items[k] for k in self.index_keys(index_name, indexed_value)]

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
        # Compute the new indices completely before installing them, so that an index function that
        # raises leaves the cache unchanged.
        built = {name: _build_index(func, self._items) for name, func in indexers.items()}
        self._indexers.update(indexers)
        self._indices.update(built)

    # ------------------------------------------------------------------ internals

    def _index_func(self, index_name: str) -> IndexFunc:
        try:
            return self._indexers[index_name]
        except KeyError:
            known = ", ".join(sorted(self._indexers)) or "none"
            raise UnknownIndexError(
                f"index {index_name!r} does not exist (known indices: {known}); add it with add_indexers"
            ) from None

    def _index_changes(
        self, old: KubeObject | None, new: KubeObject | None
    ) -> builtins.list[tuple[str, frozenset[str], frozenset[str]]]:
        """Per index whose values differ: (name, values to drop, values to add). Computed before
        anything changes, so that an index function that raises leaves the cache consistent."""
        changes = []
        for name, func in self._indexers.items():
            old_values = _values(func, old)
            new_values = _values(func, new)
            if old_values != new_values:
                changes.append((name, old_values - new_values, new_values - old_values))
        return changes

    def _apply_index_changes(
        self, changes: builtins.list[tuple[str, frozenset[str], frozenset[str]]], key: ObjectKey
    ) -> None:
        for name, removed, added in changes:
            index = self._indices[name]
            for value in removed:
                keys = index.get(value)
                if keys is None:
                    continue
                keys.discard(key)
                if not keys:
                    del index[value]  # no empty sets: list_index_func_values shows live values only
            for value in added:
                index.setdefault(value, set()).add(key)


def _build_index(func: IndexFunc, items: Mapping[ObjectKey, KubeObject]) -> dict[str, set[ObjectKey]]:
    index: dict[str, set[ObjectKey]] = {}
    for key, obj in items.items():
        for value in func(obj):
            index.setdefault(value, set()).add(key)
    return index


def _values(func: IndexFunc, obj: KubeObject | None) -> frozenset[str]:
    if obj is None:
        return frozenset()
    values: Iterable[str] = func(obj)
    return frozenset(values)
