"""Read-only queries over an informer's cache (client-go's generated listers, for plain JSON).

The bridge and its users read local state through a :class:`Lister` instead of calling the API
server: get one object by namespace and name, list by namespace and label selector, or look objects
up by any named index. The returned objects are the cached ones, shared, not copies: never mutate
them.
"""

from __future__ import annotations

import builtins

from bridge.contracts import Indexer, KubeObject, ObjectKey
from bridge.informer.store import NAMESPACE_INDEX
from bridge.kube.labels import LabelSelector, parse_label_selector
from bridge.rawobject import RawObject

__all__ = ["NAMESPACE_ALL", "Lister"]

NAMESPACE_ALL = ""
"""``list_namespace(NAMESPACE_ALL)`` lists every namespace (client-go's ``metav1.NamespaceAll``)."""


def _selector(selector: LabelSelector | str | None) -> LabelSelector | None:
    """A parsed selector, or None when it matches everything (so callers can skip filtering)."""
    if selector is None:
        return None
    parsed = parse_label_selector(selector) if isinstance(selector, str) else selector
    return None if parsed.empty else parsed


def _namespace_of(obj: KubeObject) -> str:
    if type(obj) is RawObject:
        return obj.namespace
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "")


class Lister:
    """Queries over one informer's :class:`~bridge.contracts.Indexer`."""

    __slots__ = ("_indexer",)

    def __init__(self, *, indexer: Indexer) -> None:
        self._indexer = indexer

    def get(self, namespace: str, name: str) -> KubeObject | None:
        """The cached object, or None. ``namespace=""`` for cluster-scoped objects."""
        key = ObjectKey(f"{namespace}/{name}" if namespace else name)
        return self._indexer.get_by_key(key)

    def list(self, selector: LabelSelector | str | None = None) -> builtins.list[KubeObject]:
        """Every cached object matching the label selector (all of them for None or ""), in no
        particular order. A malformed selector string raises ``bridge.labels.SelectorError``."""
        sel = _selector(selector)
        items = self._indexer.list()
        if sel is None:
            return items
        return [obj for obj in items if sel.matches_object(obj)]

    def list_namespace(
        self, namespace: str, selector: LabelSelector | str | None = None
    ) -> builtins.list[KubeObject]:
        """Cached objects in ``namespace`` matching the selector.

        ``NAMESPACE_ALL`` ("") means every namespace. Uses the namespace index when the cache has
        one, and scans otherwise.
        """
        if namespace == NAMESPACE_ALL:
            return self.list(selector)
        sel = _selector(selector)
        try:
            items = self._indexer.by_index(NAMESPACE_INDEX, namespace)
        except KeyError:  # the Indexer contract: unknown index → KeyError
            items = [obj for obj in self._indexer.list() if _namespace_of(obj) == namespace]
        if sel is None:
            return items
        return [obj for obj in items if sel.matches_object(obj)]

    def by_index(self, index_name: str, value: str) -> builtins.list[KubeObject]:
        """Cached objects whose ``index_name`` value is ``value``. Unknown index → KeyError."""
        return self._indexer.by_index(index_name, value)

    def index_keys(self, index_name: str, value: str) -> builtins.list[ObjectKey]:
        """Sorted keys of the objects whose ``index_name`` value is ``value``."""
        return self._indexer.index_keys(index_name, value)
