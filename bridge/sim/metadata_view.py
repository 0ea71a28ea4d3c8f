"""``meta.k8s.io/v1`` PartialObjectMetadata answers: objects reduced to their ``metadata``.

A metadata-only client (client-go's metadata informer, the bridge's enrichment caches) asks with
``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` for a list and
``…;as=PartialObjectMetadata;…`` for a get or a watch; kube-apiserver then answers every object as
``{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": …}`` (a list as a
``PartialObjectMetadataList``), so the client neither receives nor decodes specs and statuses. The
simulator answers the same, for every resource it serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["accepts_partial", "partial", "partial_list"]

_KIND = "PartialObjectMetadata"
_API_VERSION = "meta.k8s.io/v1"


def accepts_partial(accept: str, *, list_: bool) -> bool:
    """Whether the Accept header asks for metadata only (``PartialObjectMetadataList`` for a list,
    ``PartialObjectMetadata`` for a get or a watch), in its first acceptable form."""
    wanted = _KIND + "List" if list_ else _KIND
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip()
                  for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == wanted and params.get("g") == "meta.k8s.io" and params.get("v") == "v1":
            return True
    return False


def partial(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": _KIND, "apiVersion": _API_VERSION, "metadata": dict(obj.get("metadata") or {})}


def partial_list(objects: Sequence[Mapping[str, Any]], list_meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": _KIND + "List", "apiVersion": _API_VERSION, "metadata": dict(list_meta),
            "items": [partial(o) for o in objects]}
