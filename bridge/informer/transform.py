"""The informer's default transform: what the bridge keeps of each object it caches.

``metadata.managedFields`` (server-side-apply bookkeeping) is about a fifth of a typical object's JSON
and of no use to the bridge's consumers, so the informer drops it before an object reaches the cache
(client-go users do the same with ``SetTransform``). Pass ``transform=None`` to an informer to keep
objects whole.
"""

from __future__ import annotations

from bridge.contracts import KubeObject
from bridge.rawobject import RawObject, dict_without_managed_fields

__all__ = ["drop_managed_fields"]


def drop_managed_fields(obj: KubeObject) -> KubeObject:
    """``obj`` without ``metadata.managedFields``.

    Idempotent. The input is never mutated (the same dict may be held elsewhere, e.g. by a fake
    source); an object without managedFields is returned as is, otherwise a shallow copy with a copied
    ``metadata`` is returned and the rest of the tree is shared. A :class:`RawObject` loses the member
    from its bytes (usually already cut when it was decoded, and then returned as is).
    """
    if type(obj) is RawObject:
        return obj.without_managed_fields()
    return dict_without_managed_fields(obj)
